//! `TestRoot`: one test's private run root, and what it leaves behind when dropped.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::run_cgroups::remove_run_cgroups_killing;
use crate::{
    agent_run_bin, alive_as, diagnostics, read_run_file, wait_until_dbg, watchdog_bin, Pinned,
    LEASE_TOKEN, LEASE_TOKEN_ENV,
};

/// Every key of status.json, null or not: the shared library's one list, which the writer
/// writes and the watchdog's fast scan indexes.
pub const RECORD_KEYS: &[&str] = agent_run_shared::record::KEYS;

/// The final states of status.json.
pub const FINAL_STATES: [&str; 4] = ["finished", "cancelled", "launch_failed", "unknown"];

/// One test's private run root: `<tempdir>/runs`, left for agent-run to create.
pub struct TestRoot {
    /// The temporary directory holding the root; removed when the TestRoot is dropped.
    pub dir: tempfile::TempDir,
    /// The test's hold on the CPU ([`crate::facts::shared_cpu`] or
    /// [`crate::facts::exclusive_cpu`]), when it has one.
    _cpu: Option<CpuHold>,
    /// Kill what this root's runs left alive when the test ends ([`crate::cli::sweep`]).
    sweep: bool,
}

/// A test's hold on the CPU of its test binary: a share, or all of it.
enum CpuHold {
    Shared {
        _held: std::sync::RwLockReadGuard<'static, ()>,
    },
    Exclusive {
        _held: std::sync::RwLockWriteGuard<'static, ()>,
    },
}

impl Default for TestRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestRoot {
    /// Removes the cgroups of this test's runs: agent-run removes a run's cgroup when the run
    /// ends, but not that of a run whose record a test forged, or that a test gave up on. Only a
    /// cgroup named for one of the run dirs below this root's temporary dir (`run_cgroup_names`,
    /// so a test's second root counts too), once it is empty. One that cannot be removed fails
    /// the test (unless it is failing already): a test leaves no cgroup behind.
    ///
    /// A failing test stops where it failed, often before its own cleanup (a wait for a ready
    /// line that timed out leaves the run's tree up): then whatever is left in its runs'
    /// cgroups is killed first, so no process of it outlives the test. A passing test that left
    /// one fails, and its leftovers are killed too.
    fn drop(&mut self) {
        if self.sweep {
            crate::cli::sweep(self);
        }
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
        TestRoot {
            dir,
            _cpu: None,
            sweep: false,
        }
    }

    /// [`TestRoot::new`] for a test that shares the CPU with the other tests of its file
    /// ([`crate::facts::shared_cpu`]), held until the root is dropped.
    pub fn sharing_cpu() -> TestRoot {
        let cpu = crate::facts::shared_cpu();
        let mut root = TestRoot::new();
        root._cpu = Some(CpuHold::Shared { _held: cpu });
        root
    }

    /// [`TestRoot::new`] for a test that measures lateness or loads the machine: it has the CPU
    /// to itself ([`crate::facts::exclusive_cpu`]) until the root is dropped.
    pub fn exclusive_cpu() -> TestRoot {
        let cpu = crate::facts::exclusive_cpu();
        let mut root = TestRoot::new();
        root._cpu = Some(CpuHold::Exclusive { _held: cpu });
        root
    }

    /// [`TestRoot::new`] that kills, by pid, whatever of its runs is alive when the test ends,
    /// pass or fail, before the root is removed ([`crate::cli::sweep`]).
    pub fn swept() -> TestRoot {
        let mut root = TestRoot::new();
        root.sweep = true;
        root
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
