//! Relaunch of an id that exists: never runs the command twice.

use super::*;

/// A relaunch must ask for the command the run id already stands for (65 otherwise).
pub(super) fn same_command(id: &RunId, st: &Status, argv: &[OsString]) -> anyhow::Result<()> {
    // A final record with no command is a launch declared lost before anyone knew its command:
    // it stands for no command in particular, and replays its outcome (unknown) for any.
    // Compared byte for byte: two commands that differ only in bytes that are not UTF-8 are
    // two commands.
    if st.same_argv(argv) || (st.state.is_final() && st.argv.is_empty()) {
        return Ok(());
    }
    fail(
        exit::DATA_MISMATCH,
        format!(
            "run {id} exists with a different command: {:?} (asked for {:?}); use another id, \
             or remove this run first: agent-run rm {id}",
            st.argv,
            argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()
        ),
    )
}

/// Relaunch of an existing run id: never runs the command twice. In the foreground: a final run
/// says how it ended in one line on stderr (and with `json` prints its record on stdout) and
/// exits as it did; an active one is attached to. The wrapper
/// that `--detach` started (`detached`) found the id taken by a launch racing it: it leaves the
/// answer to its parent, which reads the record, and returns at once.
pub fn relaunch(
    root: &Root,
    id: &RunId,
    argv: &[OsString],
    quiet: bool,
    detached: bool,
    json: bool,
) -> anyhow::Result<u8> {
    let dir = root.open_run_dir(id)?;
    let st = runs::read_record_waiting(&dir, Duration::from_secs(10))?;
    same_command(id, &st, argv)?;
    if detached {
        return Ok(exit::for_record(&st).unwrap_or(exit::OK));
    }
    if st.state.is_final() {
        // A person sees what happened in one line; a program asks for the record.
        let line = human::final_line(&st, human::colour_for(human::stderr_is_terminal()));
        eprintln!("agent-run: {line}; not running it again");
        if json {
            print!("{}", runs::record_json(&dir, &st));
        }
        return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
    }
    eprintln!(
        "agent-run: run {id} is already {}; attaching",
        st.state.as_str()
    );
    logs::claim_lost_run(&dir);
    if quiet {
        let st = wait_final(&dir, None)?;
        return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
    }
    logs::follow_to_end(&dir, (0, 0))
}
