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
use agent_run_shared::verdict::{Look, Shared};
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

/// The run's final record, when the kernel agrees that the run is over ([`Look::believed`]);
/// `None` while it goes on. 69 when the run has no record and nothing of it is held (no
/// wrapper, no process in its cgroup): a run dir without a run.
pub fn believed_final(dir: &RunDir) -> anyhow::Result<Option<Status>> {
    let look = Look::take(dir);
    if let Some(st) = look.believed() {
        return Ok(Some(st.clone()));
    }
    match &look.record {
        Err(Error::Missing { path }) if look.nothing_holds_it() => fail(
            exit::NO_SUCH_RUN,
            format!("{} does not exist: the run has no record", path.display()),
        ),
        _ => Ok(None),
    }
}

/// Block until the run is over by the kernel's account and its record final (or `timeout`:
/// exit 75 naming the state). A final record the kernel contradicts (the workload wrote it) is
/// not the end: the wrapper's own record, or a cancel's or the watchdog's repair, is.
pub fn wait_final(dir: &RunDir, timeout: Option<Duration>) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir.path(), Inotify::CHANGED)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        if let Some(st) = believed_final(dir)? {
            return Ok(st);
        }
        let step = Duration::from_millis(500);
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    let look = Look::take(dir);
                    let state = match &look.record {
                        Ok(st) => st.state.as_str().to_string(),
                        Err(e) => format!("without a readable record ({e})"),
                    };
                    let why = look
                        .doubt()
                        .map(|d| format!(" ({})", d.note()))
                        .unwrap_or_default();
                    let waited = crate::human::duration(timeout.unwrap_or_default().as_secs_f64());
                    return fail(
                        exit::TEMPFAIL,
                        format!(
                            "wait gave up after {waited}; {} is still {state}{why}",
                            dir.id()
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

/// The look behind a human summary: the cgroup walk shared across the runs this process
/// shows, and no table of /proc/locks (the holder is asked of the wrapper the record names,
/// and /proc/locks is read only when someone else holds the run).
pub fn summary_look(dir: &RunDir, st: &Status) -> Look {
    let shared = Shared {
        locks: None,
        cgroups: Some(run_cgroups()),
        cgroup: None,
    };
    Look::take_with(dir, Ok(st.clone()), &shared)
}

/// A look at a run whose record the caller read, sharing /proc/locks and the cgroup walk
/// `cgroups` across every run this process looks at (`list` and `status --all` ask for each).
pub fn look_with(
    dir: &RunDir,
    st: &Status,
    cgroups: &agent_run_shared::cgroup::RunCgroups,
) -> Look {
    let shared = Shared {
        locks: Some(lock_table()),
        cgroups: Some(cgroups),
        cgroup: None,
    };
    Look::take_with(dir, Ok(st.clone()), &shared)
}

/// What a record cannot say by itself, from a look: whether its wrapper still lives, whether
/// the kernel contradicts a final record, whether the host rebooted, whether a live wrapper
/// is stopping.
pub fn note_of(look: &Look) -> Option<String> {
    let st = look.record.as_ref().ok()?;
    if !st.state.is_final() && st.boot_id != procfs::boot_id() {
        // Only where nothing of the run is held here: a live wrapper or a populated cgroup
        // makes it this boot's, whatever the record says.
        return Some(if look.nothing_holds_it() {
            "host rebooted".into()
        } else {
            "the record names another boot, but the run is held here: the record was rewritten"
                .into()
        });
    }
    if let Some(w) = look.wrapper().filter(|_| !st.state.is_final()) {
        // Whether the wrapper is stopping is a kernel fact (its signal mask, which it sets
        // before it writes `cancelling`); the record's word is the run's to write.
        return match (st.state, procfs::marks_stopping(w.pid())) {
            (State::Cancelling, false) => Some(NOT_STOPPING.into()),
            (State::Starting | State::Running, true) => Some(STOPPING.into()),
            _ => None,
        };
    }
    look.doubt().map(|d| d.note())
}

/// The note on a `cancelling` record whose live wrapper is not stopping the run.
pub const NOT_STOPPING: &str = "but its wrapper is not stopping the run: the record was rewritten";
/// The note on a `running` record whose live wrapper is stopping the run.
pub const STOPPING: &str = "its wrapper is stopping the run";

/// The run cgroups on the cgroup2 mount, walked once per process (`list` asks for every run).
fn run_cgroups() -> &'static agent_run_shared::cgroup::RunCgroups {
    static WALK: std::sync::OnceLock<agent_run_shared::cgroup::RunCgroups> =
        std::sync::OnceLock::new();
    WALK.get_or_init(agent_run_shared::cgroup::run_cgroups)
}

/// /proc/locks, read once per process.
fn lock_table() -> &'static procfs::LockTable {
    static LOCKS: std::sync::OnceLock<procfs::LockTable> = std::sync::OnceLock::new();
    LOCKS.get_or_init(procfs::LockTable::read)
}

/// The record plus derived fields, as `status --json` and `cancel` print it.
pub fn record_value(dir: &RunDir, st: &Status) -> Value {
    let look = Look::take_with(dir, Ok(st.clone()), &Shared::default());
    record_value_of(dir, st, &look)
}

/// [`record_value`] for one run among many (`status --all`, `--label`): the look shares
/// /proc/locks and the cgroup walk across them (no walk of the mount per run).
pub fn record_value_among(dir: &RunDir, st: &Status) -> Value {
    record_value_of(dir, st, &look_with(dir, st, run_cgroups()))
}

/// [`record_value`] from a look already taken.
pub fn record_value_of(dir: &RunDir, st: &Status, look: &Look) -> Value {
    let mut v = serde_json::to_value(st).expect("a record serializes");
    let read = dir.read_lease();
    let lease_unreadable = read.as_ref().err().map(|e| lease_damage(e, look));
    let lease = read.ok().flatten();
    if let Value::Object(m) = &mut v {
        m.insert("run_dir".into(), json!(dir.path()));
        m.insert("final".into(), json!(st.state.is_final()));
        m.insert(
            "wrapper_alive".into(),
            json!(look
                .wrapper()
                .is_some_and(|w| !procfs::marks_final(w.pid()))),
        );
        m.insert("note".into(), json!(note_of(look)));
        m.insert(
            "suspended".into(),
            json!(
                !st.state.is_final()
                    && agent_run_shared::suspend::is_suspended(dir, st, look.cgroup.as_ref())
            ),
        );
        m.insert(
            "lease_deadline_epoch".into(),
            json!(lease.as_ref().map(|l| l.deadline_epoch)),
        );
        // A final run has no lease left to count: its deadline is history, not a countdown.
        m.insert(
            "lease_remaining_s".into(),
            json!(lease
                .filter(|_| !st.state.is_final())
                .map(|l| (l.remaining_s() * 1000.0).round() / 1000.0)),
        );
        m.insert("outcome_exit_code".into(), json!(exit::for_record(st)));
        m.insert("lease_unreadable".into(), json!(lease_unreadable));
    }
    v
}

/// What a damaged lease.json means for the run: why it cannot be read, and what goes on
/// instead.
fn lease_damage(e: &Error, look: &Look) -> String {
    let instead = if look.wrapper().is_some() {
        "its wrapper keeps the last lease it took and puts it back"
    } else {
        "the watchdog keeps the last deadline it saw, or stops the run at its orphan grace"
    };
    format!("{e}; {instead}")
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
    let entries = agent_run_shared::root::entries(root.fd())
        .map_err(|e| Error::io("list run root", root.path(), e))?;
    let mut names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
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
