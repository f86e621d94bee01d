//! Finding runs and reading their records: the lookups every subcommand shares.
//!
//! Nothing here claims more than it knows: a non-final record whose wrapper is gone is shown as
//! "wrapper gone, not reconciled", a record from an earlier boot as "host rebooted".

use crate::error::fail;
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::procfs;
use agent_run_shared::record::{State, Status};
use agent_run_shared::root::{resolve_root, Root};
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::sys::Inotify;
use agent_run_shared::wrapper::{live_wrapper, Wrapper};
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
pub fn read_record(dir: &RunDir) -> anyhow::Result<Status> {
    match dir.read_status() {
        Err(Error::Missing { path }) => fail(
            exit::NO_SUCH_RUN,
            format!("{} does not exist: the run has no record", path.display()),
        ),
        r => Ok(r?),
    }
}

/// Read a record that may not be written yet (a launch of the same id racing us).
pub fn read_record_waiting(dir: &RunDir, timeout: Duration) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir.path(), Inotify::CHANGED)?;
    let deadline = Instant::now() + timeout;
    loop {
        match dir.read_status() {
            Err(Error::Missing { .. }) if Instant::now() < deadline => {
                ino.wait(Duration::from_millis(50));
            }
            _ => return read_record(dir),
        }
    }
}

/// Block until the record is final (or `timeout`: exit 75 naming the state).
pub fn wait_final(dir: &RunDir, timeout: Option<Duration>) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir.path(), Inotify::CHANGED)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let st = read_record(dir)?;
        // A final record that the run's cgroup contradicts (the workload wrote it) is not the
        // end: the wrapper's own record, or the watchdog's or a cancel's repair, is.
        if st.state.is_final() && dir.contradicting_cgroup(&st, None).is_none() {
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
pub fn note(dir: &RunDir, st: &Status) -> Option<&'static str> {
    if st.state.is_final() {
        return dir
            .contradicting_cgroup(st, Some(run_cgroups()))
            .map(|_| CONTRADICTED);
    }
    if st.boot_id != procfs::boot_id() {
        return Some("host rebooted");
    }
    match live_wrapper(dir, st) {
        // Whether the wrapper is stopping is a kernel fact (its signal mask, which it sets
        // before it writes `cancelling`); the record's word is the run's to write.
        Wrapper::Alive(w) => match (st.state, procfs::marks_stopping(w.pid())) {
            (State::Cancelling, false) => Some(NOT_STOPPING),
            (State::Starting | State::Running, true) => Some(STOPPING),
            _ => None,
        },
        Wrapper::Gone => Some("wrapper gone, not reconciled"),
        Wrapper::Mismatch(_) => Some("record names a process that is not its wrapper"),
    }
}

/// The note on a final record whose run's cgroup still holds processes.
pub const CONTRADICTED: &str = "but its cgroup holds processes: the record was rewritten";
/// The note on a `cancelling` record whose live wrapper is not stopping the run.
pub const NOT_STOPPING: &str = "but its wrapper is not stopping the run: the record was rewritten";
/// The note on a `running` record whose live wrapper is stopping the run.
pub const STOPPING: &str = "its wrapper is stopping the run";

/// The run cgroups on the cgroup2 mount, walked once per process (`list` asks for every run).
fn run_cgroups() -> &'static std::collections::HashMap<String, std::path::PathBuf> {
    static WALK: std::sync::OnceLock<std::collections::HashMap<String, std::path::PathBuf>> =
        std::sync::OnceLock::new();
    WALK.get_or_init(agent_run_shared::cgroup::run_cgroups)
}

/// The record plus derived fields, as `status --json` and `cancel` print it.
pub fn record_value(dir: &RunDir, st: &Status) -> Value {
    let mut v = serde_json::to_value(st).expect("a record serializes");
    let lease = dir.read_lease().ok().flatten();
    let wrapper_alive = !st.state.is_final() && matches!(live_wrapper(dir, st), Wrapper::Alive(_));
    if let Value::Object(m) = &mut v {
        m.insert("run_dir".into(), json!(dir.path()));
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
pub fn record_json(dir: &RunDir, st: &Status) -> String {
    let mut s = serde_json::to_string_pretty(&record_value(dir, st)).expect("json serializes");
    s.push('\n');
    s
}

/// Print the record (with derived fields) on stdout.
pub fn print_record(dir: &RunDir, st: &Status) {
    print!("{}", record_json(dir, st));
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
