//! Reading runs: `status`, `wait`, `attach`, `logs`, `list`, `gc`, and the helpers the other
//! subcommands share (finding a run, reading its record, waiting for it to be final).
//!
//! Nothing here claims more than it knows: a non-final record whose wrapper is gone is shown as
//! "wrapper gone, not reconciled", a record from an earlier boot as "host rebooted", and a corrupt
//! or unsafe run dir is reported on its own line without stopping `list` or `gc`.

use crate::cli::{fail, AttachArgs, GcArgs, ListArgs, LogsArgs, StatusArgs, WaitArgs};
use crate::stream::{std_sink, Tail};
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::lease::read_lease;
use agent_run_shared::procfs;
use agent_run_shared::record::{read_status, Status};
use agent_run_shared::root::{files, resolve_root, Root, RunDir};
use agent_run_shared::sys::Inotify;
use agent_run_shared::takeover::{live_wrapper, Wrapper};
use agent_run_shared::time::{epoch_now, parse_rfc3339};
use agent_run_shared::Error;
use serde_json::{json, Value};
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

/// `agent-run status`.
pub fn status(root: Option<&Path>, args: StatusArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    let st = read_record(&dir.path)?;
    if args.json {
        print_record(&dir.path, &st);
        return Ok(exit::OK);
    }
    let v = record_value(&dir.path, &st);
    let mut line = format!("run {}: {}", st.run_id, st.state.as_str());
    if let Some(r) = &st.reason {
        line += &format!(" ({r})");
    }
    if let Some(n) = note(&dir.path, &st) {
        line += &format!(", {n}");
    }
    println!("{line}");
    println!("  command:  {}", st.argv.join(" "));
    if let Some(pid) = st.pid {
        println!(
            "  pid:      {pid} (pgid {}, sid {})",
            st.pgid.unwrap_or(pid),
            st.sid.unwrap_or(pid)
        );
    }
    println!("  created:  {}", st.created_at);
    if let Some(e) = &st.ended_at {
        println!("  ended:    {e}");
    }
    if let Some(c) = st.exit_code {
        println!("  exit:     {c}");
    }
    if let Some(c) = st.launch_exit_code {
        println!("  exit:     {c} (the launch failed)");
    }
    if let Some(s) = &st.term_signal {
        println!("  signal:   {s}");
    }
    if let Some(l) = v["lease_remaining_s"].as_f64() {
        println!("  lease:    {l:.1}s left");
    }
    if let Some(c) = &st.cleanup {
        println!(
            "  cleanup:  signals {:?}, {} ms, survivors {:?}",
            c.signals, c.duration_ms, c.survivors
        );
    }
    if let Some(e) = &st.error {
        println!("  error:    {e}");
    }
    for w in &st.warnings {
        println!("  warning:  {w}");
    }
    println!("  dir:      {}", dir.path.display());
    Ok(exit::OK)
}

/// `agent-run wait`.
pub fn wait(root: Option<&Path>, args: WaitArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    let st = wait_final(&dir.path, args.timeout)?;
    Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE))
}

/// `agent-run attach`.
pub fn attach(root: Option<&Path>, args: AttachArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    follow_to_end(&dir.path, (args.stdout_from, args.stderr_from))
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

/// One line of `list`.
fn list_entry(root: &Root, name: &str) -> Result<(Value, String), String> {
    let id = RunId::parse(name).map_err(|e| e.to_string())?;
    let dir = root.open_run_dir(&id).map_err(|e| e.to_string())?;
    let st = read_status(&dir.path).map_err(|e| e.to_string())?;
    let now = epoch_now();
    let age = parse_rfc3339(&st.created_at).map(|c| now - c);
    let lease_left = if st.state.is_final() {
        None
    } else {
        read_lease(&dir.path)
            .ok()
            .flatten()
            .map(|l| l.remaining_s())
    };
    let n = note(&dir.path, &st);
    let v = json!({
        "run_id": st.run_id, "state": st.state.as_str(), "reason": st.reason, "pid": st.pid,
        "age_s": age.map(|a| a.round()), "lease_remaining_s": lease_left.map(|l| (l * 10.0).round() / 10.0),
        "exit_code": st.exit_code, "launch_exit_code": st.launch_exit_code,
        "term_signal": st.term_signal, "note": n,
        "created_at": st.created_at, "ended_at": st.ended_at,
    });
    let state = match (&st.reason, n) {
        (_, Some(n)) => format!("{} ({n})", st.state.as_str()),
        (Some(r), None) => format!("{} ({r})", st.state.as_str()),
        (None, None) => st.state.as_str().to_string(),
    };
    let line = format!(
        "{:<24} {:<40} {:>8} {:>8} {:>10} {:>5}",
        st.run_id,
        state,
        st.pid.map_or("-".into(), |p| p.to_string()),
        age.map_or("-".into(), human_secs),
        lease_left.map_or("-".into(), human_secs),
        st.exit_code.or(st.launch_exit_code).map_or_else(
            || st.term_signal.clone().unwrap_or("-".into()),
            |c| c.to_string()
        ),
    );
    Ok((v, line))
}

fn human_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The names in the root, sorted, skipping our own temp files.
fn root_entries(root: &Root) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(root.path())
        .map_err(|e| Error::io("list run root", root.path(), e))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

fn open_root(root: Option<&Path>) -> anyhow::Result<Option<Root>> {
    let path = resolve_root(root)?;
    match Root::open(&path, false) {
        Err(Error::Missing { .. }) => Ok(None),
        r => Ok(Some(r?)),
    }
}

/// `agent-run list`.
pub fn list(root: Option<&Path>, args: ListArgs) -> anyhow::Result<u8> {
    let Some(root) = open_root(root)? else {
        if args.json {
            println!("[]");
        } else {
            eprintln!("agent-run: no runs (no run root yet)");
        }
        return Ok(exit::OK);
    };
    let mut rows = Vec::new();
    if !args.json {
        println!(
            "{:<24} {:<40} {:>8} {:>8} {:>10} {:>5}",
            "RUN_ID", "STATE", "PID", "AGE", "LEASE_LEFT", "EXIT"
        );
    }
    for name in root_entries(&root)? {
        match list_entry(&root, &name) {
            Ok((v, line)) => {
                if args.json {
                    rows.push(v);
                } else {
                    println!("{line}");
                }
            }
            Err(why) => {
                eprintln!("agent-run: {name}: skipped: {why}");
                if args.json {
                    rows.push(json!({"run_id": name, "state": null, "error": why}));
                }
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
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
