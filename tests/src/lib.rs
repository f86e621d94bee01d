//! The harness of agent-run's black-box tests (`tests/tests/*.rs`).
//!
//! It finds the binaries under test (built by one step before the tests, [`BUILD_STEP`]) and the `fixture` workload, gives each test its
//! own run root, waits on kernel facts instead of sleeping, and pins every process a test sees
//! with a pidfd so that it can be checked without pid-reuse races and killed, by pid, when the
//! test ends. It never signals a process by name.
//!
//! Every wait has one deadline and reports what it saw last when it runs out; every panic about a
//! run carries [`diagnostics`] (the run dir listing, status.json, events.jsonl and log tails).
//!
//! **The one assertion style:** a check on a run goes through that run's [`Ctx`] (or another
//! [`Diagnosed`]: `ensure!(c, cond, ..)`, `c.eq(left, right, ..)`, `c.fail(..)` and the `Ctx`
//! helpers such as `c.code`, `c.fields`, `c.wait_gone`), so that its failure ends with the run
//! dir's diagnostics, and a check with no run dir to show is a plain `assert!`/`assert_eq!` with
//! a message.

use std::ffi::OsStr;
use std::fmt::Debug;
use std::fs;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod ansible;
pub mod cli;
pub mod contain;
pub mod ctx;
pub mod docs;
pub mod facts;
pub mod foreground;
pub mod fuzz;
pub mod hazards;
pub mod hostile;
pub mod hostile_run;
pub mod mcp;
pub mod mcp_wire;
pub mod modes;
pub mod reaper;
pub mod systemd;
pub mod tmux;
pub mod workload;

pub use ctx::{ctx, Ctx, Detached, Diagnosed, Foreground};

/// One `#[test]` per case of a scenario that takes one argument, each test named:
///
/// ```text
/// cases!(starts_and_says_ready;
///     the_user_unit_starts_and_says_ready => Unit::User,
///     the_system_template_starts_and_says_ready => Unit::Template,
/// );
/// ```
///
/// For containment modes, [`mode_tests!`] also skips a mode the host cannot give.
#[macro_export]
macro_rules! cases {
    ($scenario:expr; $($(#[$attr:meta])* $name:ident => $arg:expr),+ $(,)?) => {
        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                ($scenario)($arg);
            }
        )+
    };
}
pub use reaper::Reaper;

// ---------------------------------------------------------------------------------------------
// Binaries under test

/// The cargo profile directory of the running executable: `…/target/debug/deps/t-123` and
/// `…/target/debug/fixture` both give `…/target/debug`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("cannot find the current executable");
    let dir = exe
        .parent()
        .expect("the current executable has no parent dir");
    match dir.file_name().and_then(OsStr::to_str) {
        Some("deps" | "examples") => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// The lease token the suite's commands carry ([`TestRoot::cmd`], [`hostile::as_nobody`]): the
/// tests start their runs and renew them as one controller.
pub const LEASE_TOKEN: &str = "agent-run-test-suite-lease-token";

/// The variable that carries it.
pub const LEASE_TOKEN_ENV: &str = "AGENT_RUN_LEASE_TOKEN";

/// The one build step the suite needs besides `cargo test`: cargo builds the binaries of the
/// package under test (the `fixture`), not those of the other workspace members, and a test
/// does not run cargo itself. `.ci/test` runs it before `cargo test --workspace`.
pub const BUILD_STEP: &str = "cargo build --workspace --bins";

/// The newest modification time of the files a binary is built from: `Cargo.lock`, and every
/// file below `<crate>/src` and `<crate>/Cargo.toml` of `crates` (paths from the workspace).
fn newest_source(crates: &[&str]) -> Option<(std::time::SystemTime, PathBuf)> {
    fn walk(path: &Path, newest: &mut Option<(std::time::SystemTime, PathBuf)>) {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return;
        };
        if meta.is_dir() {
            for entry in fs::read_dir(path).into_iter().flatten().flatten() {
                walk(&entry.path(), newest);
            }
        } else if let Ok(t) = meta.modified() {
            if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                *newest = Some((t, path.to_path_buf()));
            }
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newest = None;
    walk(&workspace.join("Cargo.lock"), &mut newest);
    for krate in crates {
        walk(&workspace.join(krate).join("src"), &mut newest);
        walk(&workspace.join(krate).join("Cargo.toml"), &mut newest);
    }
    newest
}

/// The newest modification time of the files cargo's dep-info file `d` (`target: dep dep ...`,
/// spaces in a path escaped with a backslash) names, and which one it is; `None` when there is no such
/// file or it names nothing. A listed file that is gone counts as changed now.
fn dep_info_newest(d: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let text = fs::read_to_string(d).ok()?;
    let line = text.lines().next()?;
    let (_, deps) = line.split_once(": ")?;
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    let mut word = String::new();
    let mut chars = deps.chars().peekable();
    let mut paths = Vec::new();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => word.push(chars.next().unwrap_or(' ')),
            ' ' => paths.push(std::mem::take(&mut word)),
            c => word.push(c),
        }
    }
    paths.push(word);
    for p in paths.into_iter().filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        let t = fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| std::time::SystemTime::now());
        if newest.as_ref().is_none_or(|(n, _)| t > *n) {
            newest = Some((t, path));
        }
    }
    newest
}

/// A binary of another workspace member: `$VAR` if set, else `<profile dir>/NAME`, which must
/// exist and be newer than every source file of `crates` (else the test would check an old
/// build). Panics naming [`BUILD_STEP`] when it is missing or stale.
pub fn workspace_bin(var: &str, name: &str, crates: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let profile = profile_dir();
    let path = profile.join(name);
    let release = if profile.file_name() == Some(OsStr::new("release")) {
        " --release"
    } else {
        ""
    };
    let fix = format!(
        "run `{BUILD_STEP}{release}` before the tests (`bash .ci/test` does), or set {var}"
    );
    let built = fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{} is missing ({e}): {fix}", path.display()));
    // Cargo's dep-info file beside the binary lists exactly the sources it was built from (a
    // file of a crate the binary does not use never makes it stale); without one, every file of
    // `crates` counts.
    let newest =
        dep_info_newest(&profile.join(format!("{name}.d"))).or_else(|| newest_source(crates));
    if let Some((newest, source)) = newest {
        if newest > built {
            panic!(
                "{} is older than {}: {fix}",
                path.display(),
                source.display()
            );
        }
    }
    path
}

/// The `agent-run` binary: `$AGENT_RUN_BIN`, else `<profile dir>/agent-run` ([`BUILD_STEP`]).
pub fn agent_run_bin() -> PathBuf {
    workspace_bin("AGENT_RUN_BIN", "agent-run", &["wrapper", "shared"])
}

/// The `agent-run-watchdog` binary: `$AGENT_RUN_WATCHDOG_BIN`, else beside the tests.
pub fn watchdog_bin() -> PathBuf {
    workspace_bin(
        "AGENT_RUN_WATCHDOG_BIN",
        "agent-run-watchdog",
        &["watchdog", "shared"],
    )
}

/// The `fixture` workload: `$AGENT_RUN_FIXTURE_BIN`, else `<profile dir>/fixture` (cargo
/// builds it before it runs this package's tests: it is a binary of this package).
pub fn fixture_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("AGENT_RUN_FIXTURE_BIN") {
        return PathBuf::from(path);
    }
    let beside = profile_dir().join("fixture");
    assert!(
        beside.is_file(),
        "{} is missing: cargo builds it for `cargo test -p agent-run-tests`",
        beside.display()
    );
    beside
}

// ---------------------------------------------------------------------------------------------
// Run roots and run records

/// Every key of status.json, null or not: the shared library's one list, which the writer
/// writes and the watchdog's fast scan indexes.
pub const RECORD_KEYS: &[&str] = agent_run_shared::record::KEYS;

/// The final states of status.json.
pub const FINAL_STATES: [&str; 4] = ["finished", "cancelled", "launch_failed", "unknown"];

/// One test's private run root: `<tempdir>/runs`, left for agent-run to create.
pub struct TestRoot {
    /// The temporary directory holding the root; removed when the TestRoot is dropped.
    pub dir: tempfile::TempDir,
}

impl Default for TestRoot {
    fn default() -> Self {
        Self::new()
    }
}

/// The cgroup names agent-run may have given the runs below a test's temporary dir `dir`:
/// `agent-run.<id>.<run dir inode, hex>` for every dir one or two levels down (`runs/<id>`, the
/// run dirs of any other root the test made there, a run dir the test moved), the id being the
/// dir's name or the `run_id` of its status.json (a moved run dir keeps its record).
fn run_cgroup_names(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let dirs = |d: &Path| -> Vec<(PathBuf, u64)> {
        let entries = fs::read_dir(d).into_iter().flatten().flatten();
        entries
            .filter_map(|e| {
                let md = fs::symlink_metadata(e.path()).ok()?;
                md.is_dir().then(|| (e.path(), md.ino()))
            })
            .collect()
    };
    let top = dirs(dir);
    let below = top.iter().flat_map(|(d, _)| dirs(d));
    let mut names = Vec::new();
    for (path, ino) in top.iter().cloned().chain(below) {
        let recorded = read_run_file(&path.join("status.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|st| st["run_id"].as_str().map(String::from));
        let named = path.file_name().map(|n| n.to_string_lossy().into_owned());
        for id in named.into_iter().chain(recorded) {
            names.push(format!("agent-run.{id}.{ino:x}"));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Every dir of the cgroup2 mount named in `names`, deepest first (a cgroup with children
/// cannot be removed).
fn cgroups_named(names: &[String]) -> Vec<PathBuf> {
    let Some(mount) = contain::cgroup2_mount() else {
        return Vec::new();
    };
    let (mut found, mut todo, mut seen) = (Vec::new(), vec![(mount, 0)], 0);
    while let Some((dir, depth)) = todo.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            seen += 1;
            if !is_dir || seen > 100_000 {
                continue;
            }
            if names.iter().any(|n| e.file_name() == OsStr::new(n)) {
                found.push(e.path());
            }
            if depth < 16 {
                todo.push((e.path(), depth + 1));
            }
        }
    }
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Removes the cgroups of the runs below `dir` once their processes are gone, and returns those
/// still there after `wait`, with what is in them.
pub(crate) fn remove_run_cgroups(dir: &Path, wait: Duration) -> Vec<String> {
    remove_run_cgroups_killing(dir, wait, false)
}

/// [`remove_run_cgroups`], with whatever is still in each cgroup killed first (`cgroup.kill`:
/// by the kernel's membership, never by name) when `kill`.
pub(crate) fn remove_run_cgroups_killing(dir: &Path, wait: Duration, kill: bool) -> Vec<String> {
    let names = run_cgroup_names(dir);
    if names.is_empty() {
        return Vec::new();
    }
    let mut left = Vec::new();
    for cg in cgroups_named(&names) {
        if kill {
            let _ = fs::write(cg.join("cgroup.kill"), "1");
        }
        // The tests' pins SIGKILL their processes as they drop, just before: wait for the kernel
        // to say the cgroup is empty (a zombie does not count), then remove it.
        let removed = poll_until(wait, || {
            let events = fs::read_to_string(cg.join("cgroup.events")).unwrap_or_default();
            if events.lines().any(|l| l == "populated 1") {
                return Err(format!("populated: {events:?}"));
            }
            match fs::remove_dir(&cg) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.to_string()),
                _ => Ok(()),
            }
        });
        if let Err((_, why)) = removed {
            let procs = fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
            left.push(format!("{} ({why}; procs {procs:?})", cg.display()));
        }
    }
    left
}

impl Drop for TestRoot {
    /// Removes the cgroups of this test's runs: agent-run removes a run's cgroup when the run
    /// ends, but not that of a run whose record a test forged, or that a test gave up on. Only a
    /// cgroup named for one of the run dirs below this root's temporary dir ([`run_cgroup_names`],
    /// so a test's second root counts too), once it is empty. One that cannot be removed fails
    /// the test (unless it is failing already): a test leaves no cgroup behind.
    ///
    /// A failing test stops where it failed, often before its own cleanup (a wait for a ready
    /// line that timed out leaves the run's tree up): then whatever is left in its runs'
    /// cgroups is killed first, so no process of it outlives the test. A passing test that left
    /// one fails, and its leftovers are killed too.
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        let wait = Duration::from_secs(10);
        let left = remove_run_cgroups_killing(self.dir.path(), wait, failing);
        // A run's keeper ends by EOF once the run's last process is gone, and then writes
        // output.json: one still draining when the directory is removed puts a run dir back
        // with that one file in it, left in /tmp. Wait for them (then kill, by pidfd, what
        // the deadline leaves).
        wait_for_keepers_below(self.dir.path(), wait);
        if !left.is_empty() && !failing {
            remove_run_cgroups_killing(self.dir.path(), wait, true);
            panic!("the test left cgroups of its runs behind: {left:#?}");
        }
    }
}

/// The output keepers of the runs in the run root `root`: (pid, start ticks) from each run's
/// `keeper_started` journal event (the keeper is a run's own helper, in a session of its own:
/// no record names it). Alive or not.
pub fn keepers_in_root(root: &Path) -> Vec<(i64, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(root) else {
        return out;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(text) = read_run_file(&e.path().join("events.jsonl")) else {
            continue;
        };
        for line in String::from_utf8_lossy(&text).lines() {
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if ev["event"] == "keeper_started" {
                if let (Some(pid), Some(ticks)) = (ev["pid"].as_i64(), ev["start_ticks"].as_u64()) {
                    out.push((pid, ticks));
                }
            }
        }
    }
    out
}

/// The keepers of the runs below `dir` (each run root in it) that still live: those of
/// [`keepers_in_root`] whose pid runs with the recorded start ticks.
fn live_keepers_below(dir: &Path) -> Vec<(i32, u64)> {
    let roots = fs::read_dir(dir).into_iter().flatten().flatten();
    roots
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .flat_map(|e| keepers_in_root(&e.path()))
        .map(|(pid, ticks)| (pid as i32, ticks))
        .filter(|&(pid, ticks)| alive_as(pid, ticks))
        .collect()
}

/// Wait, to one deadline, until the live keepers of the runs below `dir` are gone; SIGKILL
/// (by pidfd) those the deadline leaves. Each is pinned, then checked again: a pid that is
/// another process by then is let go unpinned (a pin's drop would kill it).
fn wait_for_keepers_below(dir: &Path, wait: Duration) {
    let deadline = Instant::now() + wait;
    for (pid, ticks) in live_keepers_below(dir) {
        let pin = Pinned::new(&[pid]);
        if !alive_as(pid, ticks) {
            std::mem::forget(pin);
            continue;
        }
        // Still alive at the deadline: the pin's drop kills it.
        let _ = pin.wait_all_gone(deadline.saturating_duration_since(Instant::now()));
    }
}

impl TestRoot {
    /// A fresh temporary directory (mode 0700); the run root inside it does not exist yet.
    pub fn new() -> TestRoot {
        let dir = tempfile::Builder::new()
            .prefix("agent-run-test.")
            .tempdir()
            .expect("cannot create a temporary directory");
        TestRoot { dir }
    }

    /// The run root passed as `--root`.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("runs")
    }

    /// The run dir of `id`.
    pub fn run_dir(&self, id: &str) -> PathBuf {
        self.root().join(id)
    }

    /// status.json of `id`, or why it cannot be had (missing, unreadable, invalid JSON).
    pub fn try_status(&self, id: &str) -> Result<Value, String> {
        let path = self.run_dir(id).join("status.json");
        let text = read_run_file(&path)
            .and_then(|b| String::from_utf8(b).map_err(|e| io::Error::other(e.to_string())))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}: {text:?}", path.display()))
    }

    /// status.json of `id`; panics with [`diagnostics`] if it cannot be read or parsed.
    pub fn status(&self, id: &str) -> Value {
        self.try_status(id)
            .unwrap_or_else(|e| panic!("no valid status.json: {e}\n{}", diagnostics(self, id)))
    }

    /// events.jsonl of `id`, one value per line; panics with [`diagnostics`] on a bad line.
    pub fn events(&self, id: &str) -> Vec<Value> {
        let path = self.run_dir(id).join("events.jsonl");
        let text = read_run_file(&path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| {
                panic!(
                    "cannot read {}: {e}\n{}",
                    path.display(),
                    diagnostics(self, id)
                )
            });
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| {
                    panic!(
                        "bad events.jsonl line {line:?}: {e}\n{}",
                        diagnostics(self, id)
                    )
                })
            })
            .collect()
    }

    /// The `event` names of events.jsonl, in order.
    pub fn event_names(&self, id: &str) -> Vec<String> {
        self.events(id)
            .iter()
            .map(|e| e["event"].as_str().unwrap_or("<no event name>").to_string())
            .collect()
    }

    /// Polls status.json until its state is final, and returns it.
    pub fn wait_final(&self, id: &str, timeout: Duration) -> Value {
        wait_until_dbg(&format!("a final status.json for {id}"), timeout, || {
            let status = self.try_status(id)?;
            match status["state"].as_str() {
                Some(state) if FINAL_STATES.contains(&state) => Ok(status),
                _ => Err(status.to_string()),
            }
        })
    }

    /// `agent-run --root <root>` with `AGENT_RUN_ROOT` removed, the suite's lease token in
    /// `AGENT_RUN_LEASE_TOKEN` (the tests are the runs' starters: `start` takes it, `renew`
    /// gives it) and stdin from /dev/null.
    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new(agent_run_bin());
        cmd.arg("--root")
            .arg(self.root())
            .env_remove("AGENT_RUN_ROOT")
            .env(LEASE_TOKEN_ENV, LEASE_TOKEN)
            .stdin(Stdio::null());
        cmd
    }

    /// `agent-run-watchdog --root <root>` with `AGENT_RUN_ROOT` removed and stdin from /dev/null.
    pub fn watchdog_cmd(&self) -> Command {
        let mut cmd = Command::new(watchdog_bin());
        cmd.arg("--root")
            .arg(self.root())
            .env_remove("AGENT_RUN_ROOT")
            .stdin(Stdio::null());
        cmd
    }
}

/// Read a file of a run dir the way a careful reader must (a test plays the hostile workload
/// too): never follow a symlink, never block on a planted FIFO, only a regular file.
pub fn read_run_file(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    // A planted 1 GiB file must not become a 1 GiB failure message.
    let mut buf = Vec::new();
    (&mut f).take(16 << 20).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The last `max` bytes of a file, as lossy text, or why it cannot be read.
fn tail(path: &Path, max: usize) -> String {
    match read_run_file(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max);
            let prefix = if start > 0 { "[…]" } else { "" };
            format!("{prefix}{}", String::from_utf8_lossy(&bytes[start..]))
        }
        Err(e) => format!("<{e}>"),
    }
}

/// A dump of run `id` of `root` for panic messages ([`run_dir_diagnostics`]).
pub fn diagnostics(root: &TestRoot, id: &str) -> String {
    run_dir_diagnostics(&root.run_dir(id))
}

/// A dump of a run dir for panic messages: its listing (mode, size, name), status.json,
/// events.jsonl, lease.json and cancel.json, and the tails of stdout.log and stderr.log.
pub fn run_dir_diagnostics(dir: &Path) -> String {
    let dir = dir.to_path_buf();
    let mut out = format!("--- run dir {}\n", dir.display());
    match fs::read_dir(&dir) {
        Ok(entries) => {
            let mut names: Vec<_> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect();
            names.sort();
            for name in names {
                let path = dir.join(&name);
                match fs::symlink_metadata(&path) {
                    Ok(meta) => out.push_str(&format!(
                        "  {:06o} {:>8} {}\n",
                        meta.mode(),
                        meta.len(),
                        name.to_string_lossy()
                    )),
                    Err(e) => out.push_str(&format!("  {}: {e}\n", name.to_string_lossy())),
                }
            }
        }
        Err(e) => out.push_str(&format!("  <{e}>\n")),
    }
    let files = [
        ("status.json", 8000),
        ("events.jsonl", 8000),
        ("lease.json", 2000),
        ("cancel.json", 2000),
        ("stdout.log", 2000),
        ("stderr.log", 2000),
    ];
    for (name, max) in files {
        let path = dir.join(name);
        if name.ends_with(".log") || path.exists() {
            out.push_str(&format!("--- {name}\n{}\n", tail(&path, max)));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Waiting

/// Polls `probe` every 5 ms until it returns Some, and returns that; panics naming `what` and
/// the time waited once `timeout` has passed.
pub fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    wait_until_dbg(what, timeout, || probe().ok_or("nothing yet"))
}

/// Polls `probe` every 5 ms until it succeeds, to one deadline: Ok(what it returned), or
/// Err((time waited, the last thing it saw)). The one polling loop of the harness.
pub fn poll_until<T, D>(
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, D>,
) -> Result<T, (Duration, D)> {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(value) => return Ok(value),
            Err(seen) if start.elapsed() >= timeout => return Err((start.elapsed(), seen)),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Like [`wait_until`], but the probe says what it saw instead (`Err(seen)`), and the panic on
/// timeout reports the last thing seen.
pub fn wait_until_dbg<T, D: Debug>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<T, D>,
) -> T {
    poll_until(timeout, probe).unwrap_or_else(|(waited, seen)| {
        panic!("timed out after {waited:?} waiting for {what}; last seen: {seen:?}")
    })
}

/// Like [`wait_until_dbg`], and the panic carries the run's [`diagnostics`].
pub fn wait_run<V, D: Debug>(
    root: &TestRoot,
    id: &str,
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<V, D>,
) -> V {
    poll_until(timeout, probe).unwrap_or_else(|(waited, seen)| {
        panic!(
            "timed out after {waited:?} waiting for {what} (run {id}); last seen: {seen:?}\n{}",
            diagnostics(root, id)
        )
    })
}

/// The fixture's handshake: `ready pid=.. pgid=.. sid=.. members=a,b,c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The tree's leader.
    pub pid: i32,
    /// The leader's process group.
    pub pgid: i32,
    /// The leader's session.
    pub sid: i32,
    /// Every descendant (children, grandchildren, escapee), sorted; the leader excluded.
    pub members: Vec<i32>,
}

impl Ready {
    /// The leader and every member.
    pub fn all_pids(&self) -> Vec<i32> {
        let mut pids = vec![self.pid];
        pids.extend(&self.members);
        pids
    }
}

/// Parses a `ready ...` line; None if it is not one. Unknown keys are ignored.
pub fn parse_ready(line: &str) -> Option<Ready> {
    let rest = line.trim_end().strip_prefix("ready ")?;
    let (mut pid, mut pgid, mut sid, mut members) = (None, None, None, None);
    for field in rest.split_whitespace() {
        let (key, value) = field.split_once('=')?;
        match key {
            "pid" => pid = Some(value.parse().ok()?),
            "pgid" => pgid = Some(value.parse().ok()?),
            "sid" => sid = Some(value.parse().ok()?),
            "members" => {
                let pids: Option<Vec<i32>> = value
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse().ok())
                    .collect();
                members = Some(pids?);
            }
            _ => {}
        }
    }
    Some(Ready {
        pid: pid?,
        pgid: pgid?,
        sid: sid?,
        members: members?,
    })
}

/// Polls a file (such as a run's stdout.log) for a complete `ready ` line and parses it.
pub fn wait_ready(path: &Path, timeout: Duration) -> Ready {
    wait_until_dbg(
        &format!("a ready line in {}", path.display()),
        timeout,
        || {
            let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
            text.split_inclusive('\n')
                .filter(|line| line.ends_with('\n') && line.starts_with("ready "))
                .find_map(parse_ready)
                .ok_or_else(|| tail(path, 2000))
        },
    )
}

// ---------------------------------------------------------------------------------------------
// pidfds, poll, kill: agent-run-shared's `sys`, with the tests' error conventions

/// The syscalls the harness needs, on top of `agent_run_shared::sys` (the product's one place
/// for unsafe code): no second copy of pidfd_open, pidfd_send_signal, poll or kill here.
pub mod sys {
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

    use agent_run_shared::pid::Pid;
    use agent_run_shared::signal::Sig;
    use agent_run_shared::sys as shared;

    fn pid_of(pid: i32) -> io::Result<Pid> {
        Pid::new(pid.into()).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// pidfd_open(2): Ok(None) when the process is already gone (ESRCH); EINVAL for pid <= 0.
    pub fn pidfd_open(pid: i32) -> io::Result<Option<OwnedFd>> {
        match shared::pidfd_open(pid_of(pid)?) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// pidfd_send_signal(2) to the one process behind `fd`. ESRCH means it has exited.
    pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: i32) -> io::Result<()> {
        shared::pidfd_send_signal(fd, Sig::from_number(sig))
    }

    /// pidfd_getfd(2): a copy of descriptor `target` of the process behind `pidfd`.
    pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: i32) -> io::Result<OwnedFd> {
        let flags = rustix::process::PidfdGetfdFlags::empty();
        Ok(rustix::process::pidfd_getfd(pidfd, target, flags)?)
    }

    /// poll(2) for `events` on one fd: the events that came (empty at the timeout).
    pub fn poll_one(
        fd: BorrowedFd<'_>,
        events: i16,
        timeout: std::time::Duration,
    ) -> io::Result<i16> {
        let mut pollfd = [shared::PollFd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        }];
        shared::poll(&mut pollfd, Some(timeout))?;
        Ok(pollfd[0].revents)
    }

    /// poll(2) for readability; returns, per fd, whether it polled readable (or hung up).
    /// EINTR counts as nothing ready.
    pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<Vec<bool>> {
        let mut pollfds: Vec<shared::PollFd> = fds
            .iter()
            .map(|fd| shared::PollFd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout = u64::try_from(timeout_ms)
            .ok()
            .map(std::time::Duration::from_millis);
        shared::poll(&mut pollfds, timeout)?;
        Ok(pollfds.iter().map(|p| p.revents != 0).collect())
    }

    /// kill(2) to one positive pid (never 0 or -1, which reach many processes).
    pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
        shared::kill_process(pid_of(pid)?, Sig::from_number(sig))
    }

    /// kill(2) to the process group `pgid` (positive: never the caller's own group or every
    /// process), as a terminal sends Ctrl-C to its foreground group.
    pub fn kill_group(pgid: i32, sig: i32) -> io::Result<()> {
        shared::kill_group(pid_of(pgid)?, Sig::from_number(sig))
    }

    /// SIGKILL to `pid` through a pidfd, so that a pid reused meanwhile is never hit. Ok when
    /// the process is already gone. Cleanup only.
    pub fn pidfd_kill(pid: i32) -> io::Result<()> {
        use std::os::fd::AsFd;
        match pidfd_open(pid)? {
            Some(fd) => match pidfd_send_signal(fd.as_fd(), libc::SIGKILL) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
                other => other,
            },
            None => Ok(()),
        }
    }

    /// The effective uid of the test process.
    pub fn geteuid() -> u32 {
        shared::geteuid()
    }
}

// ---------------------------------------------------------------------------------------------
// Pinned processes

/// pidfds for a set of processes, opened right after the handshake, so that later checks and
/// signals reach these processes and never a process that reused a pid. On drop, every pinned
/// process still alive is sent SIGKILL through its pidfd.
pub struct Pinned {
    procs: Vec<(i32, Option<OwnedFd>)>,
}

fn readable(fd: &OwnedFd) -> bool {
    use std::os::fd::AsFd;
    sys::poll_readable(&[fd.as_fd()], 0)
        .map(|r| r[0])
        .unwrap_or_else(|e| panic!("poll on a pidfd: {e}"))
}

impl Pinned {
    /// Opens a pidfd for each pid; a pid already gone is recorded as gone.
    pub fn new(pids: &[i32]) -> Pinned {
        let procs = pids
            .iter()
            .map(|&pid| {
                let fd = sys::pidfd_open(pid)
                    .unwrap_or_else(|e| panic!("pidfd_open({pid}): {e} (Linux >= 5.3 needed)"));
                (pid, fd)
            })
            .collect();
        Pinned { procs }
    }

    /// Every pinned pid, alive or not.
    pub fn pids(&self) -> Vec<i32> {
        self.procs.iter().map(|(pid, _)| *pid).collect()
    }

    /// The pinned pids still alive: the pidfd does not poll readable (it does once the process
    /// has exited, zombie included) and /proc does not show it as a zombie or dead.
    pub fn alive(&self) -> Vec<i32> {
        self.procs
            .iter()
            .filter(|(pid, fd)| match fd {
                // The pidfd polls readable once every thread has exited; a zombie main
                // thread whose other threads run is alive.
                Some(fd) => {
                    !readable(fd)
                        && proc_stat(*pid)
                            .is_some_and(|s| !matches!(s.0, 'Z' | 'X') || proc_threads(*pid) > 1)
                }
                None => false,
            })
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Waits, to one deadline, until every pinned process has exited (zombies count as gone).
    /// Ok(time waited), or Err(the pids still alive at the deadline).
    pub fn wait_all_gone(&self, timeout: Duration) -> Result<Duration, Vec<i32>> {
        use std::os::fd::AsFd;
        let start = Instant::now();
        let mut pending: Vec<&(i32, Option<OwnedFd>)> =
            self.procs.iter().filter(|(_, fd)| fd.is_some()).collect();
        loop {
            // Before the poll: with nothing pending (every pid gone at the pin) a poll of no
            // descriptors would sleep out the whole timeout.
            if pending.is_empty() {
                return Ok(start.elapsed());
            }
            let remaining = timeout.saturating_sub(start.elapsed());
            let fds: Vec<_> = pending
                .iter()
                .filter_map(|(_, fd)| fd.as_ref().map(|fd| fd.as_fd()))
                .collect();
            let ms = remaining.as_millis().min(i32::MAX as u128) as i32;
            let gone =
                sys::poll_readable(&fds, ms).unwrap_or_else(|e| panic!("poll on pidfds: {e}"));
            let mut gone = gone.into_iter();
            pending.retain(|_| !gone.next().unwrap_or(false));
            if pending.is_empty() {
                continue;
            }
            if remaining.is_zero() {
                return Err(pending.iter().map(|(pid, _)| *pid).collect());
            }
        }
    }

    /// Sends `sig` to one pinned pid through its pidfd. Panics if `pid` is not pinned.
    pub fn signal(&self, pid: i32, sig: i32) -> io::Result<()> {
        use std::os::fd::AsFd;
        let (_, fd) = self
            .procs
            .iter()
            .find(|(p, _)| *p == pid)
            .unwrap_or_else(|| panic!("pid {pid} is not pinned"));
        match fd {
            Some(fd) => sys::pidfd_send_signal(fd.as_fd(), sig),
            None => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        use std::os::fd::AsFd;
        for (_, fd) in &self.procs {
            if let Some(fd) = fd {
                if !readable(fd) {
                    // ESRCH: it exited meanwhile, which is what we want.
                    let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// /proc

/// Fields of /proc/PID/stat: (state, ppid, pgid, sid, start time in clock ticks since boot).
/// None if the process does not exist or the file cannot be parsed.
pub fn proc_stat(pid: i32) -> Option<(char, i32, i32, i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state) of proc(5), so field N is fields[N - 3].
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let pgid = fields.get(2)?.parse().ok()?;
    let sid = fields.get(3)?.parse().ok()?;
    let start_ticks = fields.get(19)?.parse().ok()?;
    Some((state, ppid, pgid, sid, start_ticks))
}

/// Whether the process `pid` that started at `ticks` (a record's pid and start ticks) is alive:
/// not gone, not a zombie, not a process that reused the pid.
pub fn alive_as(pid: i32, ticks: u64) -> bool {
    proc_stat(pid).is_some_and(|s| s.4 == ticks && !matches!(s.0, 'Z' | 'X'))
}

/// The number of threads of a process (field 20 of /proc/PID/stat), 0 when it is gone.
pub fn proc_threads(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| {
            let rest = t[t.rfind(')')? + 1..].to_string();
            rest.split_whitespace().nth(17)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Every live (non-zombie) process with a stat line matching `keep`, sorted by pid.
fn live_processes(keep: impl Fn(&(char, i32, i32, i32, u64)) -> bool) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|s| !matches!(s.0, 'Z' | 'X') && keep(&s)))
        .collect();
    pids.sort_unstable();
    pids
}

/// Every non-zombie process whose session id is `sid`.
pub fn session_members(sid: i32) -> Vec<i32> {
    live_processes(|s| s.3 == sid)
}

/// Every non-zombie process whose parent is `ppid`.
pub fn children_of(ppid: i32) -> Vec<i32> {
    live_processes(|s| s.1 == ppid)
}

/// Every live descendant of `pid`, parents before children.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Spawning and waiting

/// `agent-run --root <root> ARGS...` started with stdout and stderr piped. The caller must drain
/// the pipes if the run writes much (or use [`Spawned`], which does).
pub fn spawn_wrapper<S: AsRef<OsStr>>(root: &TestRoot, args: &[S]) -> Child {
    let mut cmd = root.cmd();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"))
}

/// Waits for `child` until `timeout`; Ok(None) if it is still running then.
fn wait_deadline(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    use std::os::fd::AsFd;
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    // The child is not reaped until we wait for it, so its pid cannot have been reused.
    if let Ok(Some(fd)) = sys::pidfd_open(child.id() as i32) {
        let start = Instant::now();
        loop {
            let remaining = timeout.saturating_sub(start.elapsed());
            let ms = remaining.as_millis().min(i32::MAX as u128) as i32;
            if sys::poll_readable(&[fd.as_fd()], ms)?[0] {
                return child.wait().map(Some);
            }
            if remaining.is_zero() {
                return Ok(None);
            }
        }
    }
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for `child` with a deadline; on timeout SIGKILLs it, reaps it and panics.
pub fn wait_child(child: &mut Child, timeout: Duration) -> ExitStatus {
    match wait_deadline(child, timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "process {} still running after {timeout:?}; killed it",
                child.id()
            )
        }
        Err(e) => panic!("cannot wait for process {}: {e}", child.id()),
    }
}

/// Sends `sig` to a child that has not been waited for (so its pid is still its own).
pub fn send_signal(child: &Child, sig: i32) {
    sys::kill(child.id() as i32, sig)
        .unwrap_or_else(|e| panic!("kill({}, {sig}): {e}", child.id()));
}

/// The exit code a shell would report: the code, or 128 + the signal that killed the process.
pub fn exit_code(st: &ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

type Captured = Arc<Mutex<Vec<u8>>>;

fn drain(pipe: Option<impl Read + Send + 'static>) -> (Captured, Option<JoinHandle<()>>) {
    let buf = Captured::default();
    let handle = pipe.map(|mut pipe| {
        let buf = Arc::clone(&buf);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        })
    });
    (buf, handle)
}

/// A running command whose stdout and stderr are drained by threads, so it never blocks on a
/// full pipe, with a description for failure messages.
pub struct Spawned {
    /// The process. Do not `wait` on it directly; use [`Spawned::finish`].
    pub child: Child,
    /// The command, for messages.
    pub what: String,
    stdout: (Captured, Option<JoinHandle<()>>),
    stderr: (Captured, Option<JoinHandle<()>>),
    /// Python with PYTHONFAULTHANDLER=1: on timeout, SIGABRT first (it prints its stacks).
    python_stacks: bool,
}

impl Spawned {
    /// Spawns `cmd` with stdout and stderr piped and drained.
    pub fn spawn(cmd: &mut Command) -> Spawned {
        let what = format!("{cmd:?}");
        let python_stacks = cmd
            .get_envs()
            .any(|(k, v)| k == "PYTHONFAULTHANDLER" && v.is_some_and(|v| !v.is_empty()));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {what}: {e}"));
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Spawned {
            child,
            what,
            stdout,
            stderr,
            python_stacks,
        }
    }

    /// Spawns `agent-run --root <root> ARGS...`.
    pub fn wrapper<S: AsRef<OsStr>>(root: &TestRoot, args: &[S]) -> Spawned {
        Spawned::spawn(root.cmd().args(args))
    }

    /// The stdout captured so far.
    pub fn stdout_so_far(&self) -> Vec<u8> {
        self.stdout.0.lock().unwrap().clone()
    }

    /// The stderr captured so far.
    pub fn stderr_so_far(&self) -> Vec<u8> {
        self.stderr.0.lock().unwrap().clone()
    }

    /// Sends `sig` to the process (not yet reaped, so the pid is still its own).
    pub fn signal(&self, sig: i32) {
        send_signal(&self.child, sig);
    }

    /// Waits for the process with a deadline, then for its output (a grandchild holding a pipe
    /// open gets at most one more second); on timeout SIGKILLs it and panics with its output.
    pub fn finish(mut self, timeout: Duration) -> Output {
        let status = match wait_deadline(&mut self.child, timeout) {
            Ok(Some(status)) => status,
            Ok(None) => {
                // What it and its descendants were doing, for the failure: state and wchan of
                // each; then, for Python with PYTHONFAULTHANDLER=1, SIGABRT (it prints every
                // thread's stack on stderr); then SIGKILL.
                let tree: Vec<String> = std::iter::once(self.child.id() as i32)
                    .chain(descendants(self.child.id() as i32))
                    .map(|p| {
                        let wchan =
                            fs::read_to_string(format!("/proc/{p}/wchan")).unwrap_or_default();
                        let cmd = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                        format!(
                            "{p} {:?} wchan {wchan}: {}",
                            proc_stat(p),
                            cmd.chars().take(160).collect::<String>()
                        )
                    })
                    .collect();
                if self.python_stacks {
                    let _ = sys::kill(self.child.id() as i32, libc::SIGABRT);
                }
                if !self.python_stacks
                    || !matches!(
                        wait_deadline(&mut self.child, Duration::from_secs(3)),
                        Ok(Some(_))
                    )
                {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                }
                // The stack reaches the drain thread through the pipe (which descendants may
                // still hold open): give it a moment.
                let until = Instant::now() + Duration::from_secs(1);
                while self.stderr.1.as_ref().is_some_and(|h| !h.is_finished())
                    && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                panic!(
                    "{} still running after {timeout:?}; killed it\n--- its processes then\n{}\n--- stdout\n{}\n--- stderr\n{}",
                    self.what,
                    tree.join("\n"),
                    String::from_utf8_lossy(&self.stdout_so_far()),
                    String::from_utf8_lossy(&self.stderr_so_far())
                );
            }
            Err(e) => panic!("cannot wait for {}: {e}", self.what),
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        for handle in [self.stdout.1.take(), self.stderr.1.take()]
            .into_iter()
            .flatten()
        {
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if handle.is_finished() {
                let _ = handle.join();
            }
        }
        Output {
            status,
            stdout: self.stdout_so_far(),
            stderr: self.stderr_so_far(),
        }
    }
}

/// Runs a command that must succeed, and returns its output; panics with its stdout and stderr
/// otherwise (`hint` says what may be missing, or is empty).
pub fn must_succeed(cmd: &mut Command, hint: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}{hint}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Reads `pipe` to its end on a thread of its own, a line at a time, into the buffer returned.
pub fn collect_lines(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let all = Arc::new(Mutex::new(Vec::new()));
    let sink = all.clone();
    std::thread::spawn(move || {
        let mut r = io::BufReader::new(pipe);
        let mut buf = Vec::new();
        while io::BufRead::read_until(&mut r, b'\n', &mut buf).is_ok_and(|n| n > 0) {
            sink.lock().unwrap().append(&mut buf);
        }
    });
    all
}

/// Spawns a command with its stdin, stdout and stderr piped, and takes the pipes.
pub fn spawn_piped(
    cmd: &mut Command,
) -> (
    Child,
    Option<std::process::ChildStdin>,
    std::process::ChildStdout,
    std::process::ChildStderr,
) {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_or_panic(cmd);
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    (child, stdin, stdout, stderr)
}

/// Spawns a command; panics naming it if it cannot be run.
pub fn spawn_or_panic(cmd: &mut Command) -> Child {
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// SIGKILLs, by pid through pidfds, what `find` returns, and again what appeared meanwhile,
/// until `find` returns nothing or `rounds` rounds have passed. For the `Drop` of a test's
/// guards: it never fails.
pub fn kill_until_gone(rounds: usize, mut find: impl FnMut() -> Vec<i32>) {
    for _ in 0..rounds {
        let pids = find();
        if pids.is_empty() {
            return;
        }
        let pins = Pinned::new(&pids);
        for pid in pins.pids() {
            let _ = pins.signal(pid, libc::SIGKILL);
        }
        let _ = pins.wait_all_gone(Duration::from_secs(5));
    }
}

/// Runs `cmd` to completion with a deadline, capturing its output.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    Spawned::spawn(cmd).finish(timeout)
}

/// A command's outcome for failure messages: status, exit code, stdout and stderr.
pub fn describe_output(what: &str, out: &Output) -> String {
    format!(
        "--- command {what}\n--- status {} (exit code {})\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        exit_code(&out.status),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// =============================================================================================
// Generic helpers added for the hazard tests (environment markers in /proc). Kept at the
// end of the library items: clippy wants the unit tests last.

/// The value of `name` in the environment `pid` was started with (`/proc/PID/environ`), or None
/// when the process is gone, unreadable, a zombie (its environ reads empty), or lacks `name`.
pub fn environ_var(pid: i32, name: &str) -> Option<Vec<u8>> {
    let bytes = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    bytes
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()).map(<[u8]>::to_vec))
}

/// Every live (non-zombie) process whose environment carries `name` with a value `keep`
/// accepts, sorted by pid: how a test finds a run's strays by its `AGENT_RUN_ID` or
/// `AGENT_RUN_DIR` marker, whatever session or parent they ended up in.
pub fn processes_with_env(name: &str, keep: impl Fn(&[u8]) -> bool) -> Vec<i32> {
    live_processes(|_| true)
        .into_iter()
        .filter(|&pid| environ_var(pid, name).is_some_and(|v| keep(&v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup2 mount, when this test may make cgroups in it (else it says so: skipped).
    fn writable_cgroup2() -> Option<PathBuf> {
        let mount = contain::cgroup2_mount().filter(|m| agent_run_shared::sys::writable(m));
        if mount.is_none() {
            eprintln!("no writable cgroup2 mount on this host: nothing to check");
        }
        mount
    }

    /// A run dir `dir` for `id` (its record names the id), the cgroup agent-run would name for
    /// it, and a fixture sleeping 60 s moved into that cgroup.
    fn sleeper_in_run_cgroup(mount: &Path, dir: &Path, id: &str) -> (PathBuf, Child) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("status.json"), format!(r#"{{"run_id": "{id}"}}"#)).unwrap();
        let ino = fs::metadata(dir).unwrap().ino();
        let cg = mount.join(format!("agent-run.{id}.{ino:x}"));
        fs::create_dir(&cg).unwrap();
        let child = Command::new(fixture_bin())
            .args(["sleep-ms", "60000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        fs::write(cg.join("cgroup.procs"), child.id().to_string()).unwrap();
        (cg, child)
    }

    #[test]
    fn waiting_for_pids_gone_before_the_pin_returns_at_once() {
        let mut child = Command::new(fixture_bin())
            .args(["sleep-ms", "0"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        // Reaped: nothing to pin (its pid could be anyone's by now, never ours to wait on).
        let pin = Pinned::new(&[pid]);
        let took = pin.wait_all_gone(Duration::from_secs(60)).unwrap();
        assert!(took < Duration::from_secs(5), "waited {took:?} for nothing");
    }

    #[test]
    fn the_cgroup_of_a_run_below_a_test_root_is_removed_once_empty_and_reported_while_not() {
        let Some(mount) = writable_cgroup2() else {
            return;
        };
        let root = TestRoot::new();
        // A run dir moved out of the run root, as a test that swaps a run dir leaves it: found
        // by the run_id of its record.
        let (cg, mut child) =
            sleeper_in_run_cgroup(&mount, &root.dir.path().join("moved"), "cg-left");
        let pin = Pinned::new(&[child.id() as i32]);

        let left = remove_run_cgroups(root.dir.path(), Duration::from_millis(200));
        let _ = pin.signal(child.id() as i32, libc::SIGKILL);
        let _ = child.wait();
        assert_eq!(left.len(), 1, "a populated cgroup is reported: {left:?}");
        assert!(left[0].contains(&child.id().to_string()), "{left:?}");
        assert!(cg.exists(), "a populated cgroup is left alone");

        let left = remove_run_cgroups(root.dir.path(), Duration::from_secs(10));
        assert_eq!(left, Vec::<String>::new(), "an empty cgroup is removed");
        assert!(!cg.exists(), "{} is still there", cg.display());
    }

    #[test]
    fn a_failing_test_kills_what_is_left_in_its_runs_cgroups() {
        use std::os::unix::process::ExitStatusExt;
        let Some(mount) = writable_cgroup2() else {
            return;
        };
        let root = TestRoot::new();
        let (cg, mut child) =
            sleeper_in_run_cgroup(&mount, &root.root().join("cg-fail"), "cg-fail");
        let pid = child.id() as i32;
        let ticks = proc_stat(pid).expect("the sleeper's stat").4;
        // The root drops while the test fails: the sleeper dies with it, by its cgroup.
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _root = root;
            // An unwind as a failing assertion's, without the panic message.
            std::panic::resume_unwind(Box::new("a failing test"));
        }));
        assert!(failed.is_err());
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert!(!alive_as(pid, ticks));
        assert!(!cg.exists(), "{} is still there", cg.display());
    }

    #[test]
    fn parse_ready_reads_every_field() {
        let ready = parse_ready("ready pid=10 pgid=10 sid=9 members=11,12,13\n").unwrap();
        assert_eq!(
            ready,
            Ready {
                pid: 10,
                pgid: 10,
                sid: 9,
                members: vec![11, 12, 13]
            }
        );
        assert_eq!(ready.all_pids(), vec![10, 11, 12, 13]);
    }

    #[test]
    fn parse_ready_accepts_no_members() {
        let ready = parse_ready("ready pid=10 pgid=10 sid=10 members=").unwrap();
        assert!(ready.members.is_empty());
    }

    #[test]
    fn parse_ready_refuses_other_lines() {
        assert_eq!(parse_ready("hello"), None);
        assert_eq!(parse_ready("ready pid=10 pgid=10 sid=10"), None);
        assert_eq!(parse_ready("ready pid=x pgid=10 sid=10 members="), None);
        assert_eq!(
            parse_ready("ready pid=10 pgid=10 sid=10 members=1,,x"),
            None
        );
    }

    #[test]
    fn proc_stat_of_self_matches_the_kernel() {
        let me = std::process::id() as i32;
        let (state, ppid, pgid, sid, start) = proc_stat(me).unwrap();
        // The main thread (whose state /proc/PID/stat shows) waits for this test's thread.
        assert!(matches!(state, 'R' | 'S'), "state {state}");
        assert_eq!(ppid, std::os::unix::process::parent_id() as i32);
        // SAFETY: getpgrp(2) and getsid(2) have no preconditions.
        let (kernel_pgid, kernel_sid) = unsafe { (libc::getpgrp(), libc::getsid(0)) };
        assert_eq!((pgid, sid), (kernel_pgid, kernel_sid));
        assert!(start > 0);
    }

    #[test]
    fn proc_stat_of_a_missing_pid_is_none() {
        assert_eq!(proc_stat(i32::MAX), None);
    }

    #[test]
    fn session_members_include_self() {
        let me = std::process::id() as i32;
        let sid = proc_stat(me).unwrap().3;
        assert!(session_members(sid).contains(&me));
    }

    #[test]
    fn pinned_sees_a_child_exit() {
        let mut child = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id() as i32;
        let pinned = Pinned::new(&[pid]);
        assert_eq!(pinned.alive(), vec![pid]);
        assert!(pinned.wait_all_gone(Duration::from_millis(20)).is_err());
        pinned.signal(pid, libc::SIGTERM).unwrap();
        // Not yet reaped: a zombie counts as gone.
        pinned.wait_all_gone(Duration::from_secs(10)).unwrap();
        assert!(pinned.alive().is_empty());
        assert_eq!(
            exit_code(&wait_child(&mut child, Duration::from_secs(10))),
            143
        );
    }

    #[test]
    fn wait_until_returns_the_probed_value() {
        let mut n = 0;
        let got = wait_until("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            (n >= 3).then_some(n)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "last seen: 7")]
    fn wait_until_dbg_reports_the_last_thing_seen() {
        wait_until_dbg("never", Duration::from_millis(20), || Err::<(), _>(7));
    }
}

// =============================================================================================
// BEGIN remote harness (owned by the `agent-run remote` work; used by tests/tests/remote.rs)
//
// A real OpenSSH server started by the test itself (`/usr/sbin/sshd -D -e -f <generated config>`)
// with a generated host key and a generated user key in a temporary authorized_keys, optionally
// inside a network namespace joined to a client namespace by a veth pair whose link the test can
// cut (`ip link set DEV down`: this kernel has no netem). Addresses are 192.0.2.0/24 (TEST-NET-1),
// inside namespaces the test made: nothing leaves the machine. Everything a test starts is
// stopped by pid and every namespace deleted on drop, whatever happened.

pub mod remote {
    use super::{proc_stat, wait_until_dbg, Pinned};
    use std::ffi::OsString;
    use std::fs;
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    /// The server's address inside a [`Netns`] pair.
    pub const SERVER_ADDR: &str = "192.0.2.1";
    const CLIENT_ADDR: &str = "192.0.2.2";

    /// Runs a command that must succeed; panics with its output otherwise.
    fn must(cmd: &mut Command) {
        crate::must_succeed(cmd, "");
    }

    /// Two network namespaces joined by a veth pair: `server` holds 192.0.2.1, `client`
    /// 192.0.2.2. Deleted on drop.
    pub struct Netns {
        pub server: String,
        pub client: String,
        client_dev: String,
        server_dev: String,
    }

    impl Netns {
        /// Names are unique per process and call (`ar<pid>n<k>s` / `...c`).
        pub fn new() -> Netns {
            static N: AtomicU32 = AtomicU32::new(0);
            let tag = format!(
                "ar{}n{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            );
            let net = Netns {
                server: format!("{tag}s"),
                client: format!("{tag}c"),
                client_dev: format!("{tag}c"),
                server_dev: format!("{tag}s"),
            };
            let server_dev = &net.server_dev;
            let ip = |args: &[&str]| must(Command::new("ip").args(args));
            ip(&["netns", "add", &net.server]);
            ip(&["netns", "add", &net.client]);
            ip(&[
                "link",
                "add",
                &net.client_dev,
                "type",
                "veth",
                "peer",
                "name",
                server_dev,
            ]);
            ip(&["link", "set", server_dev, "netns", &net.server]);
            ip(&["link", "set", &net.client_dev, "netns", &net.client]);
            for (ns, dev, addr) in [
                (&net.server, server_dev, SERVER_ADDR),
                (&net.client, &net.client_dev, CLIENT_ADDR),
            ] {
                ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
                ip(&["-n", ns, "link", "set", "lo", "up"]);
                ip(&["-n", ns, "link", "set", dev, "up"]);
            }
            net
        }

        /// Cut the link (the client's end goes down; its route to the server goes with it).
        pub fn cut(&self) {
            must(Command::new("ip").args([
                "-n",
                &self.client,
                "link",
                "set",
                &self.client_dev,
                "down",
            ]));
        }

        /// Restore the link cut by [`Netns::cut`].
        pub fn restore(&self) {
            must(Command::new("ip").args([
                "-n",
                &self.client,
                "link",
                "set",
                &self.client_dev,
                "up",
            ]));
        }

        /// Cut the link at the server's end: the client keeps its route, so its packets vanish
        /// and new connections hang until their timeout (a black hole, not "unreachable").
        pub fn blackhole(&self) {
            must(Command::new("ip").args([
                "-n",
                &self.server,
                "link",
                "set",
                &self.server_dev,
                "down",
            ]));
        }

        /// Restore the link cut by [`Netns::blackhole`].
        pub fn restore_server(&self) {
            must(Command::new("ip").args([
                "-n",
                &self.server,
                "link",
                "set",
                &self.server_dev,
                "up",
            ]));
        }

        /// `ip netns exec <ns> <program>`: ip execs the program, so the pid is the program's.
        pub fn exec(ns: &str, program: impl Into<OsString>) -> Command {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns]).arg(program.into());
            cmd
        }
    }

    impl Default for Netns {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            for ns in [&self.server, &self.client] {
                let _ = Command::new("ip").args(["netns", "del", ns]).output();
            }
        }
    }

    /// An sshd of our own, for root, with keys made for it. Stopped (with every process it
    /// forked) on drop.
    pub struct SshServer {
        pub dir: tempfile::TempDir,
        pub addr: String,
        pub port: u16,
        sshd: Child,
    }

    impl SshServer {
        /// A server on loopback, for a test that must run as root (it says so and fails
        /// otherwise): the remote tests' usual start.
        pub fn start_as_root() -> SshServer {
            crate::facts::require_root();
            SshServer::start(None)
        }

        /// Start sshd on 127.0.0.1 (a free port), or on 192.0.2.1:2222 inside namespace `ns`.
        pub fn start(ns: Option<&str>) -> SshServer {
            let dir = tempfile::Builder::new()
                .prefix("agent-run-sshd.")
                .tempdir()
                .expect("cannot create a temporary directory");
            let d = dir.path();
            for key in ["host_key", "user_key"] {
                must(
                    Command::new("ssh-keygen")
                        .args([
                            "-q",
                            "-t",
                            "ed25519",
                            "-N",
                            "",
                            "-C",
                            "agent-run-test",
                            "-f",
                        ])
                        .arg(d.join(key)),
                );
            }
            fs::copy(d.join("user_key.pub"), d.join("authorized_keys")).unwrap();
            let (addr, port) = match ns {
                Some(_) => (SERVER_ADDR.to_string(), 2222),
                None => {
                    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    ("127.0.0.1".to_string(), l.local_addr().unwrap().port())
                }
            };
            let config = format!(
                "ListenAddress {addr}:{port}\nHostKey {d}/host_key\n\
                 AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 PermitRootLogin prohibit-password\nPidFile none\nMaxSessions 50\n\
                 MaxStartups 50\nClientAliveInterval 2\nClientAliveCountMax 3\nSetEnv SHLVL=1\n",
                d = d.display()
            );
            // `SetEnv SHLVL=1`: the sessions' shells are not the first level, so bash does not
            // source this machine's ~/.bashrc (and /etc/bash.bashrc) for every ssh command, as
            // Debian's bash does for a command run by sshd (SSH_CLIENT set, SHLVL below 2). The
            // hosts are all this machine: a developer's rc (root's runs `pyenv init`, 0.2 s of
            // CPU) cost every command that much, ten hosts at once on shared cores, and made
            // Ansible's Ctrl-C reach the hosts 1-4 s late. Nothing here needs the rc: commands
            // are run by absolute path.
            fs::write(d.join("sshd_config"), config).unwrap();
            // sshd refuses to start without its privilege separation directory.
            if !Path::new("/run/sshd").is_dir() {
                fs::create_dir_all("/run/sshd").unwrap();
                fs::set_permissions("/run/sshd", fs::Permissions::from_mode(0o755)).unwrap();
            }
            let sshd = sshd_path();
            let mut cmd = match ns {
                Some(ns) => Netns::exec(ns, sshd),
                None => Command::new(sshd),
            };
            cmd.args(["-D", "-e", "-f"])
                .arg(d.join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = crate::spawn_or_panic(&mut cmd);
            // sshd -e logs to stderr; "Server listening" means it accepts connections.
            let (tx, rx) = mpsc::channel();
            let stderr = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let mut seen = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(20)) {
                    Ok(line) if line.contains("Server listening") => break,
                    Ok(line) => seen.push(line),
                    Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("sshd did not start: {seen:?}");
                    }
                }
            }
            SshServer {
                dir,
                addr,
                port,
                sshd: child,
            }
        }

        /// `root@ADDR`.
        /// The listening sshd's pid: every session forks from it.
        pub fn pid(&self) -> u32 {
            self.sshd.id()
        }

        pub fn host(&self) -> String {
            format!("root@{}", self.addr)
        }

        /// The client's ssh options: no user config, our key, a private known_hosts.
        pub fn ssh_options(&self) -> Vec<String> {
            let d = self.dir.path().display();
            vec![
                "-F".into(),
                "/dev/null".into(),
                "-o".into(),
                format!("UserKnownHostsFile={d}/known_hosts"),
                "-o".into(),
                "StrictHostKeyChecking=accept-new".into(),
                "-o".into(),
                "IdentitiesOnly=yes".into(),
                "-o".into(),
                "LogLevel=ERROR".into(),
                "-i".into(),
                format!("{d}/user_key"),
                "-p".into(),
                self.port.to_string(),
            ]
        }

        /// [`SshServer::ssh_options`] as `--ssh-option=...` arguments of `agent-run remote`.
        pub fn remote_args(&self) -> Vec<String> {
            self.ssh_options()
                .into_iter()
                .map(|o| format!("--ssh-option={o}"))
                .collect()
        }
    }

    impl Drop for SshServer {
        fn drop(&mut self) {
            // Every process sshd forked (sessions and what they ran), then sshd itself.
            // Pinned with pidfds first; dropping the pins SIGKILLs whatever is still alive.
            drop(Pinned::new(&descendants(self.sshd.id() as i32)));
            let _ = self.sshd.kill();
            let _ = self.sshd.wait();
        }
    }

    fn sshd_path() -> PathBuf {
        ["/usr/sbin/sshd", "/usr/bin/sshd", "/sbin/sshd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .expect("sshd is not installed (Debian: apt-get install openssh-server)")
    }

    pub use super::descendants;

    /// Every live process whose command line contains `needle` (e.g. a control socket path).
    pub fn processes_mentioning(needle: &str) -> Vec<i32> {
        let mut pids: Vec<i32> = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|pid: &i32| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
                    && proc_stat(*pid).is_some_and(|s| !matches!(s.0, 'Z' | 'X'))
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Remove every `agent-run: ...\n` message of ours from a captured stderr, leaving the
    /// workload's bytes (each message is written with one write, so it is contiguous).
    pub fn strip_messages(stderr: &[u8]) -> Vec<u8> {
        let tag = b"agent-run: ";
        let mut out = Vec::with_capacity(stderr.len());
        let mut i = 0;
        while i < stderr.len() {
            if stderr[i..].starts_with(tag) {
                match stderr[i..].iter().position(|&b| b == b'\n') {
                    Some(n) => i += n + 1,
                    None => i = stderr.len(),
                }
            } else {
                out.push(stderr[i]);
                i += 1;
            }
        }
        out
    }

    /// Wait until `probe` sees `what` in a growing buffer.
    pub fn wait_for_text(what: &str, timeout: Duration, mut buf: impl FnMut() -> Vec<u8>) {
        wait_until_dbg(&format!("{what:?} in the output"), timeout, || {
            let b = buf();
            let text = String::from_utf8_lossy(&b);
            if text.contains(what) {
                Ok(())
            } else {
                Err(text
                    .chars()
                    .rev()
                    .take(400)
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect::<String>())
            }
        })
    }
}
// END remote harness
// =============================================================================================
