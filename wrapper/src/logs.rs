//! `agent-run logs` and `agent-run attach`: a run's output, copied as it grows, until its record is
//! final (attach, `logs --follow`) or as far as it goes now (`logs`).

use crate::cli::{AttachArgs, LogsArgs};
use crate::runs::{open_run, read_record};
use crate::stream::{std_sink, Tail};
use agent_run_shared::exit;
use agent_run_shared::record::Status;
use agent_run_shared::run_dir::{files, RunDir};
use agent_run_shared::sys::Inotify;
use agent_run_shared::wrapper::live_wrapper;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// `agent-run attach`.
pub fn attach(root: Option<&Path>, args: AttachArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    claim_lost_run(&dir);
    follow_to_end(&dir, (args.stdout_from, args.stderr_from))
}

/// A foreground run whose caller is gone and whose `--on-disconnect DUR` is counting down is
/// kept alive by an attach (or a relaunch, which attaches): tell its wrapper (USR1,
/// journalled) that someone is here.
pub fn claim_lost_run(dir: &RunDir) {
    let Ok(st) = dir.read_status() else {
        return;
    };
    let counting = st.caller_lost_at.is_some()
        && st
            .on_disconnect
            .as_deref()
            .is_some_and(|p| !matches!(p, "keep" | "cancel"));
    if st.state.is_final() || !counting {
        return;
    }
    let journal = dir.journal("attach");
    let _ = journal.event("attach", json!({"claims": "the run whose caller was lost"}));
    // Only a wrapper the kernel confirms (the holder of the run's lock) is woken.
    if let Some(w) = live_wrapper(dir) {
        let _ = agent_run_shared::wrapper::signal_wrapper(
            &w,
            agent_run_shared::stop::Sig::Usr1,
            agent_run_shared::reason::Reason::Attach,
            Some("someone attached within the disconnect grace"),
            &journal,
        );
    }
}

/// Stream both logs from the given offsets until the run is final, then exit as the run did.
pub fn follow_to_end(dir: &RunDir, from: (u64, u64)) -> anyhow::Result<u8> {
    let mut out = Tail::new(dir, files::STDOUT, std_sink(false)).starting_at(from.0);
    let mut err = Tail::new(dir, files::STDERR, std_sink(true)).starting_at(from.1);
    let st = follow(dir, &mut [&mut out, &mut err])?;
    Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE))
}

/// Copy new bytes of each tail until the record is final; then copy the rest once more.
fn follow(dir: &RunDir, tails: &mut [&mut Tail]) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir.path(), Inotify::CHANGED | Inotify::MODIFIED)?;
    loop {
        // Read the record first: once it is final no process of the run writes, so the pump
        // after it reaches the true end of every log.
        let st = read_record(dir)?;
        for t in tails.iter_mut() {
            t.pump();
        }
        if st.state.is_final() {
            return Ok(st);
        }
        ino.wait(Duration::from_millis(250));
    }
}

/// `agent-run logs`.
pub fn logs(root: Option<&Path>, args: LogsArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    if let Some(n) = args.tail {
        // Both logs under a header each (as `tail` shows several files), or the one asked for.
        let both = !args.stdout && !args.stderr;
        let mut out = std::io::stdout().lock();
        for (name, wanted) in [(files::STDOUT, !args.stderr), (files::STDERR, !args.stdout)] {
            if !wanted {
                continue;
            }
            let lines = crate::stream::last_lines(&dir, name, n);
            use std::io::Write;
            if both {
                let _ = writeln!(out, "==> {} <==", dir.file(name).display());
            }
            let _ = out.write_all(&lines);
            if both && !lines.is_empty() && !lines.ends_with(b"\n") {
                let _ = writeln!(out);
            }
        }
        return Ok(exit::OK);
    }
    let (name, sink) = if args.stderr {
        (files::STDERR, std_sink(false))
    } else {
        (files::STDOUT, std_sink(false))
    };
    let mut tail = Tail::new(&dir, name, sink);
    if args.follow {
        follow(&dir, &mut [&mut tail])?;
    } else {
        tail.pump();
    }
    Ok(exit::OK)
}
