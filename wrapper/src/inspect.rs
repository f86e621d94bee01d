//! Reading runs: `status`, `wait`, `attach`, `logs`, `list`, `gc`, and the helpers the other
//! subcommands share (finding a run, reading its record, waiting for it to be final).
//!
//! Nothing here claims more than it knows: a non-final record whose wrapper is gone is shown as
//! "wrapper gone, not reconciled", a record from an earlier boot as "host rebooted", and a corrupt
//! or unsafe run dir is reported on its own line without stopping `list` or `gc`.

use crate::cli::{fail, AttachArgs, GcArgs, ListArgs, LogsArgs, StatusArgs, WaitArgs};
use crate::human;
use crate::select::{self, Picked};
use crate::stream::{std_sink, Tail};
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::lease::read_lease;
use agent_run_shared::procfs;
use agent_run_shared::record::{read_status, ContainmentMode, State, Status};
use agent_run_shared::root::{files, resolve_root, Root, RunDir};
use agent_run_shared::spec::matches_all;
use agent_run_shared::sys::Inotify;
use agent_run_shared::takeover::{live_wrapper, Wrapper};
use agent_run_shared::time::{epoch_now, parse_rfc3339};
use agent_run_shared::Error;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Find an existing run: 64 for a bad id, 69 when there is no such run, 78 when unsafe.
pub fn open_run(root: Option<&Path>, id: &str) -> anyhow::Result<RunDir> {
    let id = RunId::parse(id)?;
    let root_path = resolve_root(root)?;
    let root = match Root::open(&root_path, false) {
        Err(Error::Missing { .. }) => {
            return fail(
                exit::NO_SUCH_RUN,
                format!("no such run {id} (no run root at {})", root_path.display()),
            )
        }
        r => r?,
    };
    match root.open_run_dir(&id) {
        Err(Error::Missing { .. }) => fail(
            exit::NO_SUCH_RUN,
            format!("no such run {id} under {}", root_path.display()),
        ),
        r => Ok(r?),
    }
}

/// Read a run's record (69 when the run dir holds none).
pub fn read_record(dir: &Path) -> anyhow::Result<Status> {
    match read_status(dir) {
        Err(Error::Missing { path }) => fail(
            exit::NO_SUCH_RUN,
            format!("{} does not exist: the run has no record", path.display()),
        ),
        r => Ok(r?),
    }
}

/// Read a record that may not be written yet (a launch of the same id racing us).
pub fn read_record_waiting(dir: &Path, timeout: Duration) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir, Inotify::CHANGED)?;
    let deadline = Instant::now() + timeout;
    loop {
        match read_status(dir) {
            Err(Error::Missing { .. }) if Instant::now() < deadline => {
                ino.wait(Duration::from_millis(50));
            }
            _ => return read_record(dir),
        }
    }
}

/// Block until the record is final (or `timeout`: exit 75 naming the state).
pub fn wait_final(dir: &Path, timeout: Option<Duration>) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir, Inotify::CHANGED)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let st = read_record(dir)?;
        if st.state.is_final() {
            return Ok(st);
        }
        let step = Duration::from_millis(500);
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return fail(
                        exit::TEMPFAIL,
                        format!(
                            "run {} is still {} ({})",
                            st.run_id,
                            st.state.as_str(),
                            note(dir, &st).unwrap_or("waiting")
                        ),
                    );
                }
                step.min(d - now)
            }
            None => step,
        };
        ino.wait(step);
    }
}

/// What a record cannot say by itself: whether its wrapper still lives, whether the host rebooted.
pub fn note(dir: &Path, st: &Status) -> Option<&'static str> {
    if st.state.is_final() {
        return None;
    }
    if st.boot_id != procfs::boot_id() {
        return Some("host rebooted");
    }
    match live_wrapper(dir, st) {
        Wrapper::Alive(_) => None,
        Wrapper::Gone => Some("wrapper gone, not reconciled"),
        Wrapper::Mismatch(_) => Some("record names a process that is not its wrapper"),
    }
}

/// The record plus derived fields, as `status --json` and `cancel` print it.
pub fn record_value(dir: &Path, st: &Status) -> Value {
    let mut v = serde_json::to_value(st).expect("a record serializes");
    let lease = read_lease(dir).ok().flatten();
    let wrapper_alive = !st.state.is_final() && matches!(live_wrapper(dir, st), Wrapper::Alive(_));
    if let Value::Object(m) = &mut v {
        m.insert("run_dir".into(), json!(dir));
        m.insert("final".into(), json!(st.state.is_final()));
        m.insert("wrapper_alive".into(), json!(wrapper_alive));
        m.insert("note".into(), json!(note(dir, st)));
        m.insert(
            "lease_deadline_epoch".into(),
            json!(lease.map(|l| l.deadline_epoch)),
        );
        // A final run has no lease left to count: its deadline is history, not a countdown.
        m.insert(
            "lease_remaining_s".into(),
            json!(lease
                .filter(|_| !st.state.is_final())
                .map(|l| (l.remaining_s() * 1000.0).round() / 1000.0)),
        );
        m.insert("outcome_exit_code".into(), json!(exit::for_record(st)));
    }
    v
}

/// [`record_value`] as pretty JSON with a trailing newline.
pub fn record_json(dir: &Path, st: &Status) -> String {
    let mut s = serde_json::to_string_pretty(&record_value(dir, st)).expect("json serializes");
    s.push('\n');
    s
}

/// Print the record (with derived fields) on stdout.
pub fn print_record(dir: &Path, st: &Status) {
    print!("{}", record_json(dir, st));
}

/// `agent-run status`: one run (its summary, or the record with `--json`), or several (the
/// summaries one after the other, or one JSON array).
pub fn status(root: Option<&Path>, args: StatusArgs) -> anyhow::Result<u8> {
    let colour = human::colour_for(human::stdout_is_terminal());
    let ids = match select::pick(root, &args.select, false)? {
        Picked::One(id) => {
            let dir = open_run(root, &id)?;
            let st = read_record(&dir.path)?;
            if args.json {
                print_record(&dir.path, &st);
            } else {
                print!("{}", summary(&dir.path, &st, colour));
            }
            return Ok(exit::OK);
        }
        Picked::Many(ids) => ids,
    };
    let mut code = exit::OK;
    let mut docs = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let got = open_run(root, id).and_then(|dir| Ok((read_record(&dir.path)?, dir)));
        match got {
            Ok((st, dir)) if args.json => docs.push(record_value(&dir.path, &st)),
            Ok((st, dir)) => {
                if i > 0 {
                    println!();
                }
                print!("{}", summary(&dir.path, &st, colour));
            }
            Err(e) => {
                let (doc, c) = select::error_entry(id, &e);
                docs.push(doc);
                if code == exit::OK {
                    code = c;
                }
            }
        }
    }
    if args.json {
        select::print_json(&Value::Array(docs));
    }
    Ok(code)
}

/// The human summary of one record: what ran, where, since when, how it ended.
fn summary(dir: &Path, st: &Status, colour: bool) -> String {
    use std::fmt::Write;
    let v = record_value(dir, st);
    let mut out = String::new();
    let mut line = format!(
        "run {}: {}",
        human::printable(&st.run_id),
        human::paint(st, st.state.as_str(), colour)
    );
    if let Some(r) = &st.reason {
        line += &format!(" ({})", human::printable(r));
    }
    if let Some(n) = note(dir, st) {
        line += &format!(", {n}");
    }
    let mut put = |k: &str, val: String| {
        let _ = writeln!(out, "  {:<12}{}", format!("{k}:"), human::printable(&val));
    };
    put("command", human::shell_command(&st.argv));
    put("cwd", st.cwd.clone());
    if !st.labels.is_empty() {
        let l: Vec<String> = st.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        put("labels", l.join(" "));
    }
    if !st.env.is_empty() {
        put("env", format!("{} (values not recorded)", st.env.join(" ")));
    }
    if let Some(pid) = st.pid {
        put(
            "pid",
            format!(
                "{pid} (pgid {}, sid {})",
                st.pgid.unwrap_or(pid),
                st.sid.unwrap_or(pid)
            ),
        );
    }
    let ago = |t: &str| {
        parse_rfc3339(t).map_or(String::new(), |e| {
            format!(" ({} ago)", human::duration(epoch_now() - e))
        })
    };
    put(
        "created",
        format!("{}{}", st.created_at, ago(&st.created_at)),
    );
    if let Some(s) = &st.started_at {
        put("started", format!("{s}{}", ago(s)));
    }
    if let Some(e) = &st.ended_at {
        put("ended", format!("{e}{}", ago(e)));
    }
    if let Some(t) = human::run_time(st).filter(|_| st.started_at.is_some()) {
        put(
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
            put("lease", left(l));
        }
    }
    if let Some(ms) = st.timeout_ms {
        let len = human::duration(ms as f64 / 1000.0);
        match st.timeout_deadline_epoch().filter(|_| !st.state.is_final()) {
            Some(d) => put("timeout", format!("{len} ({})", left(d - epoch_now()))),
            None => put("timeout", len),
        }
    }
    match (&st.term_signal, exit::for_record(st)) {
        (Some(s), _) if st.state == agent_run_shared::record::State::Finished => {
            put("signal", human::signal_text(s))
        }
        (Some(s), Some(c)) => put("exit", format!("{c} (the leader ended by {s})")),
        (None, Some(c)) if st.state == agent_run_shared::record::State::LaunchFailed => {
            put("exit", format!("{c} (the launch failed)"))
        }
        (None, Some(c)) => put("exit", c.to_string()),
        (_, None) => {}
    }
    if let Some(mode) = v["containment"]["mode"].as_str() {
        let cg = v["containment"]["cgroup"]
            .as_str()
            .map_or(String::new(), |c| format!(" ({c})"));
        put("contained", format!("{mode}{cg}"));
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
        put("disconnect", format!("{p}{lost}"));
    }
    if let Some(c) = &st.cleanup {
        let mut pids = c.signalled.clone();
        pids.sort_unstable();
        pids.dedup();
        let survivors = if c.survivors.is_empty() {
            "no survivors".to_string()
        } else {
            format!("survivors {:?}", c.survivors)
        };
        put(
            "cleanup",
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
            ),
        );
    }
    if let Some(e) = &st.error {
        put("error", e.clone());
    }
    for w in &st.warnings {
        put("warning", w.clone());
    }
    put("dir", dir.display().to_string());
    format!("{line}\n{out}")
}

/// `1m 55s left`, or `expired 3s ago`.
fn left(secs: f64) -> String {
    if secs >= 0.0 {
        format!("{} left", human::duration(secs))
    } else {
        format!("expired {} ago", human::duration(-secs))
    }
}

/// `agent-run wait`: one run, or several (all of them, or with `--any` the first to end).
pub fn wait(root: Option<&Path>, args: WaitArgs) -> anyhow::Result<u8> {
    let ids = match select::pick(root, &args.select, true)? {
        Picked::One(id) => {
            let dir = open_run(root, &id)?;
            let st = wait_final(&dir.path, args.timeout)?;
            if args.json {
                print_record(&dir.path, &st);
            }
            return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
        }
        Picked::Many(ids) => ids,
    };
    // Every run must exist before the wait begins: a typo must not turn into a long wait.
    let dirs = ids
        .iter()
        .map(|id| open_run(root, id))
        .collect::<anyhow::Result<Vec<RunDir>>>()?;
    let ino = Inotify::new()?;
    for d in &dirs {
        ino.add_watch(&d.path, Inotify::CHANGED)?;
    }
    let deadline = args.timeout.map(|t| Instant::now() + t);
    loop {
        let records = dirs
            .iter()
            .map(|d| read_record(&d.path))
            .collect::<anyhow::Result<Vec<Status>>>()?;
        let done = if args.any {
            dirs.is_empty() || records.iter().any(|st| st.state.is_final())
        } else {
            records.iter().all(|st| st.state.is_final())
        };
        if done {
            if args.json {
                let docs = dirs
                    .iter()
                    .zip(&records)
                    .map(|(d, st)| record_value(&d.path, st))
                    .collect();
                select::print_json(&Value::Array(docs));
            }
            let codes = records.iter().filter_map(exit::for_record);
            let code = if args.any {
                codes.into_iter().next()
            } else {
                codes.into_iter().find(|c| *c != exit::OK)
            };
            return Ok(code.unwrap_or(exit::OK));
        }
        let step = Duration::from_millis(500);
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    let waiting: Vec<String> = records
                        .iter()
                        .filter(|st| !st.state.is_final())
                        .map(|st| format!("{} ({})", st.run_id, st.state.as_str()))
                        .collect();
                    return fail(
                        exit::TEMPFAIL,
                        format!("still waiting for {}", waiting.join(", ")),
                    );
                }
                step.min(d - now)
            }
            None => step,
        };
        ino.wait(step);
    }
}

/// `agent-run attach`.
pub fn attach(root: Option<&Path>, args: AttachArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    claim_lost_run(&dir);
    follow_to_end(&dir.path, (args.stdout_from, args.stderr_from))
}

/// A foreground run whose caller is gone and whose `--on-disconnect DUR` is counting down is
/// kept alive by an attach (or a relaunch, which attaches): tell its wrapper (USR1,
/// journalled) that someone is here.
pub fn claim_lost_run(dir: &RunDir) {
    let Ok(st) = read_status(&dir.path) else {
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
    let Ok(journal) = agent_run_shared::journal::Journal::open(&dir.path, "attach") else {
        return;
    };
    let _ = journal.event("attach", json!({"claims": "the run whose caller was lost"}));
    // Only a wrapper the kernel confirms is woken, and only for a record that holds the whole
    // identity.
    if agent_run_shared::takeover::check_record(&st).is_err() {
        return;
    }
    if let Wrapper::Alive(w) = live_wrapper(&dir.path, &st) {
        let _ = agent_run_shared::takeover::signal_wrapper(
            &w,
            agent_run_shared::stop::Sig::Usr1,
            "attach",
            Some("someone attached within the disconnect grace"),
            &journal,
        );
    }
}

/// Stream both logs from the given offsets until the run is final, then exit as the run did.
pub fn follow_to_end(dir: &Path, from: (u64, u64)) -> anyhow::Result<u8> {
    let mut out = Tail::new(dir, files::STDOUT, std_sink(false)).starting_at(from.0);
    let mut err = Tail::new(dir, files::STDERR, std_sink(true)).starting_at(from.1);
    let st = follow(dir, &mut [&mut out, &mut err])?;
    Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE))
}

/// Copy new bytes of each tail until the record is final; then copy the rest once more.
fn follow(dir: &Path, tails: &mut [&mut Tail]) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir, Inotify::CHANGED | Inotify::MODIFIED)?;
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
            let lines = crate::stream::last_lines(&dir.path, name, n);
            use std::io::Write;
            if both {
                let _ = writeln!(out, "==> {} <==", dir.path.join(name).display());
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
    let mut tail = Tail::new(&dir.path, name, sink);
    if args.follow {
        follow(&dir.path, &mut [&mut tail])?;
    } else {
        tail.pump();
    }
    Ok(exit::OK)
}

/// What `list` keeps of one run: the few fields it shows, not the whole record (100,000 runs
/// listed hold 100,000 of these, about 200 bytes each, and no record).
struct Row {
    /// The sort key: `created_at` in epoch seconds (0 when unparsable).
    created: f64,
    run_id: String,
    state: State,
    reason: Option<String>,
    pid: Option<i32>,
    age_s: Option<f64>,
    lease_left: Option<f64>,
    timeout_left: Option<f64>,
    exit_code: Option<i32>,
    launch_exit_code: Option<i32>,
    term_signal: Option<String>,
    note: Option<&'static str>,
    outcome: Option<u8>,
    labels: BTreeMap<String, String>,
    created_at: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    containment: Option<ContainmentMode>,
    /// The state's colour for the human table.
    colour: &'static str,
}

impl Row {
    /// The row's `list --json` object.
    fn value(&self) -> Value {
        let round = |x: f64| (x * 10.0).round() / 10.0;
        json!({
            "run_id": self.run_id, "state": self.state.as_str(), "reason": self.reason,
            "pid": self.pid, "age_s": self.age_s.map(|a| a.round()),
            "lease_remaining_s": self.lease_left.map(round),
            "timeout_remaining_s": self.timeout_left.map(round),
            "exit_code": self.exit_code, "launch_exit_code": self.launch_exit_code,
            "term_signal": self.term_signal, "note": self.note,
            "final": self.state.is_final(), "outcome_exit_code": self.outcome,
            "labels": self.labels, "created_at": self.created_at,
            "started_at": self.started_at, "ended_at": self.ended_at,
            "containment": self.containment,
        })
    }
}

/// What `list` knows of one run, or why its dir is skipped.
fn list_entry(root: &Root, name: &str) -> Result<Row, String> {
    let id = RunId::parse(name).map_err(|e| e.to_string())?;
    let dir = root.open_run_dir(&id).map_err(|e| e.to_string())?;
    let st = read_status(&dir.path).map_err(|e| e.to_string())?;
    let now = epoch_now();
    let created = parse_rfc3339(&st.created_at);
    let lease_left = if st.state.is_final() {
        None
    } else {
        read_lease(&dir.path)
            .ok()
            .flatten()
            .map(|l| l.remaining_s())
    };
    let timeout_left = st
        .timeout_deadline_epoch()
        .filter(|_| !st.state.is_final())
        .map(|d| d - now);
    let note = note(&dir.path, &st);
    let outcome = exit::for_record(&st);
    let colour = human::state_colour(&st);
    Ok(Row {
        created: created.unwrap_or(0.0),
        age_s: created.map(|c| now - c),
        lease_left,
        timeout_left,
        note,
        outcome,
        colour,
        state: st.state,
        pid: st.pid,
        exit_code: st.exit_code,
        launch_exit_code: st.launch_exit_code,
        containment: st.containment.as_ref().map(|c| c.mode),
        run_id: st.run_id,
        reason: st.reason,
        term_signal: st.term_signal,
        labels: st.labels,
        created_at: st.created_at,
        started_at: st.started_at,
        ended_at: st.ended_at,
    })
}

/// The width `list` keeps to: 80 columns for run ids of up to 37 characters (longer ids are
/// shown whole, and the row grows).
const LIST_WIDTH: usize = 80;

/// One human line of `list`. `id_w` and `state_w` are the column widths.
fn list_line(r: &Row, id_w: usize, state_w: usize, colour: bool) -> String {
    let state = r.state.as_str();
    let detail = match (r.note, r.reason.as_deref()) {
        (Some(n), _) => format!(" ({})", short_note(n)),
        (None, Some(reason)) => format!(" ({})", human::printable(reason)),
        (None, None) => String::new(),
    };
    let mut text = format!("{state}{detail}");
    if text.chars().count() > state_w {
        text = text
            .chars()
            .take(state_w.saturating_sub(1))
            .collect::<String>()
            + "\u{2026}";
    }
    let pad = state_w.saturating_sub(text.chars().count());
    // Colour the state word only, after the padding is computed on the plain text.
    let painted = format!(
        "{}{}{}",
        human::paint_code(r.colour, state, colour),
        &text[state.len()..],
        " ".repeat(pad)
    );
    // The figures the JSON shows, rounded as it rounds them.
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let left = [r.lease_left.map(round), r.timeout_left.map(round)]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp);
    format!(
        "{:<id_w$} {painted} {:>7} {:>7} {:>7} {:>4}",
        human::printable(&r.run_id),
        r.pid.map_or("-".into(), |p| p.to_string()),
        r.age_s
            .map(|a| a.round())
            .map_or("-".into(), human::duration_coarse),
        left.map_or("-".into(), human::duration_coarse),
        r.outcome.map_or("-".into(), |c| c.to_string()),
    )
}

/// The notes in their short form for the STATE column.
fn short_note(n: &str) -> &str {
    n.strip_suffix(", not reconciled").unwrap_or(n)
}

/// The names in the root, sorted, skipping our own temp files.
pub fn root_entries(root: &Root) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(root.path())
        .map_err(|e| Error::io("list run root", root.path(), e))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// The root if it exists (`None` when there is none yet: no runs).
pub fn open_root(root: Option<&Path>) -> anyhow::Result<Option<Root>> {
    let path = resolve_root(root)?;
    match Root::open(&path, false) {
        Err(Error::Missing { .. }) => Ok(None),
        r => Ok(Some(r?)),
    }
}

/// `agent-run list`: newest first; `--state`, `--label`, `-n`.
pub fn list(root: Option<&Path>, args: ListArgs) -> anyhow::Result<u8> {
    let Some(root) = open_root(root)? else {
        if args.json {
            println!("[]");
        } else {
            eprintln!("agent-run: no runs (no run root yet)");
        }
        return Ok(exit::OK);
    };
    let filtered = !args.states.is_empty() || !args.labels.is_empty();
    let wanted = |r: &Row| {
        let state_ok = args.states.is_empty()
            || args.states.iter().any(|want| match want.as_str() {
                "active" => !r.state.is_final(),
                "final" => r.state.is_final(),
                w => r.state.as_str() == w,
            });
        state_ok && matches_all(&args.labels, &r.labels)
    };
    let mut runs = Vec::new();
    let mut broken = Vec::new();
    for name in root_entries(&root)? {
        match list_entry(&root, &name) {
            Ok(row) if wanted(&row) => runs.push(row),
            Ok(_) => {}
            Err(why) => {
                eprintln!("agent-run: {name}: skipped: {why}");
                broken.push(json!({"run_id": name, "state": null, "error": why}));
            }
        }
    }
    // Newest first (by created_at; the id breaks ties).
    runs.sort_by(|a, b| {
        b.created
            .total_cmp(&a.created)
            .then_with(|| a.run_id.cmp(&b.run_id))
    });
    if let Some(n) = args.limit {
        runs.truncate(n);
    }
    // Rows go out as they are rendered, through one buffer (not one write per line).
    let mut out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
    if args.json {
        // Unreadable run dirs match no filter; unfiltered, they are listed (last) as errors.
        if filtered || args.limit.is_some() {
            broken.clear();
        }
        // The bytes of `serde_json::to_string_pretty` of the whole array, one row at a time.
        let rows = runs.iter().map(Row::value).chain(broken);
        let mut first = true;
        for v in rows {
            let text = serde_json::to_string_pretty(&v)?;
            out.write_all(if first { b"[\n" } else { b",\n" })?;
            first = false;
            for (i, line) in text.lines().enumerate() {
                if i > 0 {
                    out.write_all(b"\n")?;
                }
                out.write_all(b"  ")?;
                out.write_all(line.as_bytes())?;
            }
        }
        out.write_all(if first { b"[]\n" } else { b"\n]\n" })?;
        out.flush()?;
        return Ok(exit::OK);
    }
    let colour = human::colour_for(human::stdout_is_terminal());
    // Run ids are shown whole (they are what you type next); the STATE column gives way to a
    // long one, down to the width of the longest state word.
    let id_w = runs
        .iter()
        .map(|r| r.run_id.len())
        .max()
        .unwrap_or(0)
        .max(6);
    // The fixed columns: PID, AGE, LEFT (7 each), EXIT (4), and the five gaps.
    let fixed = 7 * 3 + 4 + 5;
    let state_w = LIST_WIDTH.saturating_sub(fixed + id_w).clamp(13, 26);
    writeln!(
        out,
        "{:<id_w$} {:<state_w$} {:>7} {:>7} {:>7} {:>4}",
        "RUN_ID", "STATE", "PID", "AGE", "LEFT", "EXIT"
    )?;
    for r in &runs {
        writeln!(out, "{}", list_line(r, id_w, state_w, colour))?;
    }
    out.flush()?;
    Ok(exit::OK)
}

/// `agent-run gc`.
pub fn gc(root: Option<&Path>, args: GcArgs) -> anyhow::Result<u8> {
    let Some(root) = open_root(root)? else {
        return Ok(exit::OK);
    };
    let now = epoch_now();
    for name in root_entries(&root)? {
        let checked = RunId::parse(&name)
            .map_err(|e| e.to_string())
            .and_then(|id| root.open_run_dir(&id).map_err(|e| e.to_string()))
            .and_then(|dir| {
                read_status(&dir.path)
                    .map(|st| (dir, st))
                    .map_err(|e| e.to_string())
            });
        let (dir, st) = match checked {
            Ok(x) => x,
            Err(why) => {
                eprintln!("agent-run: {name}: skipped: {why}");
                continue;
            }
        };
        if !st.state.is_final() {
            continue;
        }
        let ended = st.ended_at.as_deref().and_then(parse_rfc3339);
        if ended.is_none_or(|e| now - e < args.older_than.as_secs_f64()) {
            continue;
        }
        if args.dry_run {
            println!("would remove {}", dir.path.display());
            continue;
        }
        // remove_dir_all never follows symlinks inside the tree (std, since CVE-2022-21658).
        match std::fs::remove_dir_all(&dir.path) {
            Ok(()) => println!("removed {}", dir.path.display()),
            Err(e) => eprintln!("agent-run: cannot remove {}: {e}", dir.path.display()),
        }
    }
    Ok(exit::OK)
}
