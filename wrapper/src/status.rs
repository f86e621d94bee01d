//! `agent-run status`: one run's record (with what it cannot say by itself), as JSON or for a
//! person.

use crate::cli::StatusArgs;
use crate::human;
use crate::runs::{
    note_of, open_run, print_record, read_record, record_value_among, record_value_of, summary_look,
};
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::record::Status;
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::time::{epoch_now, parse_rfc3339};
use agent_run_shared::verdict::Look;
use serde_json::Value;
use std::path::Path;

/// `agent-run status`: one run (its summary, or the record with `--json`), or several (the
/// summaries one after the other, or one JSON array).
pub fn status(root: Option<&Path>, args: StatusArgs) -> anyhow::Result<u8> {
    let colour = human::colour_for(human::stdout_is_terminal());
    let ids = match select::pick(root, &args.select, false)? {
        Picked::One(id) => {
            let dir = open_run(root, &id)?;
            let st = match read_record(&dir) {
                Ok(st) => st,
                Err(e) => return unreadable(&dir, e, args.json),
            };
            if args.json {
                print_record(&dir, &st);
            } else {
                print!("{}", summary(&dir, &st, colour));
            }
            return Ok(exit::OK);
        }
        Picked::Many(ids) => ids,
    };
    let mut batch = match args.json {
        true => select::Batch::streaming(),
        false => select::Batch::default(),
    };
    for (i, id) in ids.iter().enumerate() {
        let got = open_run(root, id).and_then(|dir| Ok((read_record(&dir)?, dir)));
        match got {
            Ok((st, dir)) if args.json => batch.push(record_value_among(&dir, &st)),
            Ok((st, dir)) => {
                if i > 0 {
                    println!();
                }
                print!("{}", summary(&dir, &st, colour));
            }
            Err(e) => batch.failed(id, &e),
        }
    }
    Ok(batch.finish(args.json))
}

/// A run dir whose record cannot be read (removed, or not a record: the workload can do
/// either): what the kernel says of the run instead, and 77 (69 when nothing of a run is
/// there at all).
fn unreadable(dir: &RunDir, err: anyhow::Error, json: bool) -> anyhow::Result<u8> {
    let look = Look::take(dir);
    if let Ok(st) = &look.record {
        // Written meanwhile (a launch of the same id).
        if json {
            print_record(dir, st);
        } else {
            print!(
                "{}",
                summary(dir, st, human::colour_for(human::stdout_is_terminal()))
            );
        }
        return Ok(exit::OK);
    }
    let missing = look
        .record
        .as_ref()
        .err()
        .is_some_and(agent_run_shared::verdict::is_missing);
    if missing && look.nothing_holds_it() && look.cgroup.is_none() {
        return Err(err);
    }
    let wrapper = look.wrapper().map(|w| w.pid().get());
    let cgroup = look.cgroup.as_ref().map(|c| c.path().display().to_string());
    let members = look.cgroup.as_ref().map(|c| c.members().len());
    let why = format!("{err:#}");
    eprintln!("agent-run: {why}");
    let id = dir.id().as_str();
    if json {
        select::print_json(&serde_json::json!({
            "run_id": id, "run_dir": dir.path(), "state": null, "final": false,
            "wrapper_alive": wrapper.is_some(), "wrapper_pid": wrapper,
            "cgroup": cgroup, "cgroup_processes": members,
            "note": format!("no readable record ({why})"),
            "error": why, "error_exit_code": exit::NOPERM,
        }));
    } else {
        println!(
            "run {}: no readable record ({})",
            id,
            human::printable(&why)
        );
        match wrapper {
            Some(p) => println!("  wrapper:    pid {p}, running"),
            None => println!("  wrapper:    gone"),
        }
        if let (Some(c), Some(n)) = (&cgroup, members) {
            println!("  cgroup:     {} ({n} processes)", human::printable(c));
        }
        println!("  stop it:    agent-run cancel {id}");
    }
    Ok(exit::NOPERM)
}

/// The human summary of one record: what ran, where, since when, how it ended.
fn summary(dir: &RunDir, st: &Status, colour: bool) -> String {
    // One look serves the derived fields and the note.
    let look = summary_look(dir, st);
    let v = record_value_of(dir, st, &look);
    // A run whose processes are all stopped (Ctrl-Z, SIGSTOP, a frozen cgroup) says so.
    let word = match v["suspended"].as_bool() {
        Some(true) => "suspended",
        _ => st.state.as_str(),
    };
    let mut line = format!(
        "run {}: {}",
        human::printable(&st.run_id),
        human::paint(st, word, colour)
    );
    if let Some(r) = &st.reason {
        line += &format!(" ({})", human::printable(r));
    }
    if let Some(n) = note_of(&look) {
        line += &format!(", {}", human::printable(&n));
    }
    let mut f = Fields::default();
    what_ran(&mut f, st);
    when(&mut f, st, &v);
    how_it_ended(&mut f, st, &v);
    f.put("dir", dir.path().display().to_string());
    format!("{line}\n{}", f.0)
}

/// The lines of a summary under its first, as `  key:       value`.
#[derive(Default)]
struct Fields(String);

impl Fields {
    fn put(&mut self, k: &str, val: String) {
        use std::fmt::Write;
        let _ = writeln!(
            self.0,
            "  {:<12}{}",
            format!("{k}:"),
            human::printable(&val)
        );
    }
}

/// What ran: the command, its cwd, labels and env names, its leader.
fn what_ran(f: &mut Fields, st: &Status) {
    f.put("command", human::shell_command(&st.argv));
    f.put("cwd", st.cwd.clone());
    if !st.labels.is_empty() {
        let l: Vec<String> = st.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.put("labels", l.join(" "));
    }
    if !st.env.is_empty() {
        f.put("env", format!("{} (values not recorded)", st.env.join(" ")));
    }
    if let Some(pid) = st.pid {
        f.put(
            "pid",
            format!(
                "{pid} (pgid {}, sid {})",
                st.pgid.unwrap_or(pid),
                st.sid.unwrap_or(pid)
            ),
        );
    }
}

/// Since when and until when: created, started, ended, how long, the lease and the timeout.
fn when(f: &mut Fields, st: &Status, v: &Value) {
    let ago = |t: &str| {
        parse_rfc3339(t).map_or(String::new(), |e| {
            format!(" ({} ago)", human::duration(epoch_now() - e))
        })
    };
    f.put(
        "created",
        format!("{}{}", st.created_at, ago(&st.created_at)),
    );
    if let Some(s) = &st.started_at {
        f.put("started", format!("{s}{}", ago(s)));
    }
    if let Some(e) = &st.ended_at {
        f.put("ended", format!("{e}{}", ago(e)));
    }
    if let Some(t) = human::run_time(st).filter(|_| st.started_at.is_some()) {
        f.put(
            if st.state.is_final() {
                "ran"
            } else {
                "elapsed"
            },
            human::duration(t),
        );
    }
    if !st.state.is_final() {
        if let Some(l) = v["lease_remaining_s"].as_f64() {
            f.put("lease", left(l));
        }
        if let Some(e) = v["lease_unreadable"].as_str() {
            f.put("lease", format!("lease.json is damaged: {e}"));
        }
    }
    if let Some(ms) = st.timeout_ms {
        let len = human::duration(ms as f64 / 1000.0);
        match st.timeout_deadline_epoch().filter(|_| !st.state.is_final()) {
            Some(d) => f.put("timeout", format!("{len} ({})", left(d - epoch_now()))),
            None => f.put("timeout", len),
        }
    }
}

/// How it ended or is held: the exit, the containment, the caller, the cleanup, the errors.
fn how_it_ended(f: &mut Fields, st: &Status, v: &Value) {
    use agent_run_shared::record::State;
    // Why a run that did not finish by itself ended, in words: 129 is "caller lost".
    let why = st
        .reason
        .as_deref()
        .filter(|_| !matches!(st.state, State::Finished | State::LaunchFailed))
        .map(|r| human::printable(&r.replace('_', " ")));
    match (&st.term_signal, exit::for_record(st), why) {
        (Some(s), _, _) if st.state == State::Finished => f.put("signal", human::signal_text(s)),
        (Some(s), Some(c), Some(w)) => f.put("exit", format!("{c} ({w}; the leader ended by {s})")),
        (Some(s), Some(c), None) => f.put("exit", format!("{c} (the leader ended by {s})")),
        (None, Some(c), _) if st.state == State::LaunchFailed => {
            f.put("exit", format!("{c} (the launch failed)"))
        }
        (None, Some(c), Some(w)) => f.put("exit", format!("{c} ({w})")),
        (None, Some(c), None) => f.put("exit", c.to_string()),
        (_, None, _) => {}
    }
    if let Some(mode) = v["containment"]["mode"].as_str() {
        let cg = v["containment"]["cgroup"]
            .as_str()
            .map_or(String::new(), |c| format!(" ({c})"));
        f.put("contained", format!("{mode}{cg}"));
    }
    if let Some(p) = st
        .on_disconnect
        .as_ref()
        .filter(|_| !st.state.is_final() || st.caller_lost_at.is_some())
    {
        let lost = st
            .caller_lost_at
            .as_deref()
            .map_or(String::new(), |t| format!("; the caller was lost at {t}"));
        f.put("disconnect", format!("{p}{lost}"));
    }
    if let Some(c) = &st.cleanup {
        f.put("cleanup", cleanup_text(c));
    }
    if let Some(e) = &st.error {
        f.put("error", e.clone());
    }
    for w in &st.warnings {
        f.put("warning", w.clone());
    }
}

/// The cleanup in one line: its signals, how long, how many processes, the survivors.
fn cleanup_text(c: &agent_run_shared::record::Cleanup) -> String {
    let mut pids = c.signalled.clone();
    pids.sort_unstable();
    pids.dedup();
    let survivors = if c.survivors.is_empty() {
        "no survivors".to_string()
    } else {
        format!("survivors {:?}", c.survivors)
    };
    format!(
        "{} in {}; {} process{} stopped; {survivors}",
        if c.signals.is_empty() {
            "no signal".into()
        } else {
            c.signals.join(", ")
        },
        human::duration(c.duration_ms as f64 / 1000.0),
        pids.len(),
        if pids.len() == 1 { "" } else { "es" }
    )
}

/// `1m 55s left`, or `expired 3s ago`.
fn left(secs: f64) -> String {
    if secs >= 0.0 {
        format!("{} left", human::duration(secs))
    } else {
        format!("expired {} ago", human::duration(-secs))
    }
}
