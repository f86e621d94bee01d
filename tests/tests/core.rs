//! Black-box tests of agent-run's core: stopping a whole run (its process group, its session,
//! setsid escapees, the groups of a job-control shell, the leftovers of a leader that exited),
//! exit codes, the records and their modes, what the workload inherits, and refusal of bad input.
//!
//! Every test spawns the real `agent-run` binary on a real process tree and asserts on the process
//! table: each pid the fixture reports is pinned with a pidfd right after the handshake, and the
//! run's session is looked up in /proc, so "stopped" means the kernel says so, not agent-run. A
//! zombie counts as dead. Nothing here sleeps to synchronise: waits poll a kernel fact or a file
//! to one generous deadline (CI is two slow cores), and every failure prints the run's
//! diagnostics. Each test has its own run root; every process a test starts is killed by pid
//! when the test ends, whether it passed or not ([`Run`]'s and [`Pinned`]'s `Drop`).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_run_tests::contain::marked;
use agent_run_tests::facts::{geteuid, path_str};
use agent_run_tests::workload::fixture_path;
use agent_run_tests::{
    children_of, describe_output, diagnostics, exit_code, fixture_bin, parse_ready, proc_stat,
    run_with_timeout, session_members, Pinned, Ready, Spawned, TestRoot, FINAL_STATES, RECORD_KEYS,
};
use serde_json::Value;

/// The deadline for anything that normally takes milliseconds.
const LONG: Duration = Duration::from_secs(20);

/// Every state of the contract.
const STATES: [&str; 7] = [
    "starting",
    "running",
    "cancelling",
    "finished",
    "cancelled",
    "launch_failed",
    "unknown",
];

/// The seed article's worker (003, "Test process trees instead of testing one sleepy shell"),
/// verbatim.
const SEED_WORKER_SH: &str = r#"#!/usr/bin/env bash
set -Eeuo pipefail
run_dir=${1:?run directory required}

note() {
  printf '%s pid=%s pgid=%s %s\n' \
    "$(date +%s)" "$$" "$(ps -o pgid= -p $$ | tr -d ' ')" "$1" \
    >>"$run_dir/worker.log"
}

trap 'note TERM; exit 143' TERM
trap 'note INT; exit 130' INT
trap 'note HUP; exit 129' HUP

(
  trap 'note grandchild_TERM; exit 143' TERM
  trap 'note grandchild_HUP; exit 129' HUP
  while :; do
    note grandchild_tick
    sleep 1
  done
) &
grandchild=$!

note "started grandchild=$grandchild"
while :; do
  note parent_tick
  sleep 1
done
"#;

// ---------------------------------------------------------------------------------------------
// A run under test

/// One `agent-run` wrapper started by a test, with its output drained and (optionally) its stdin
/// held open. Dropping it before [`Run::finish`] kills, by pid, the wrapper and every process
/// of the run it can find (the wrapper's descendants, the run's session while its leader is the
/// recorded one), so a failing test leaves nothing behind.
struct Run<'a> {
    root: &'a TestRoot,
    id: String,
    wrapper: Option<Spawned>,
    stdin: Option<ChildStdin>,
    /// The wrapper's outcome, once [`Run::finish`] has it.
    output: Option<Output>,
}

impl<'a> Run<'a> {
    /// `agent-run --root R OPTS... ID -- ARGV...`, stdin from /dev/null.
    fn start(root: &'a TestRoot, id: &str, opts: &[&str], argv: &[&str]) -> Run<'a> {
        Run::start_with(root, id, opts, argv, |_| {})
    }

    /// Like [`Run::start`], with stdin a pipe that the test holds open until [`Run::close_stdin`]
    /// or the end of the test.
    fn start_holding_stdin(root: &'a TestRoot, id: &str, opts: &[&str], argv: &[&str]) -> Run<'a> {
        Run::start_with(root, id, opts, argv, |cmd| {
            cmd.stdin(Stdio::piped());
        })
    }

    /// Like [`Run::start`], with the command adjusted by `configure` before it is spawned.
    fn start_with(
        root: &'a TestRoot,
        id: &str,
        opts: &[&str],
        argv: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Run<'a> {
        let mut cmd = root.cmd();
        cmd.args(opts).arg(id).arg("--").args(argv);
        configure(&mut cmd);
        let mut wrapper = Spawned::spawn(&mut cmd);
        let stdin = wrapper.child.stdin.take();
        Run {
            root,
            id: id.to_string(),
            wrapper: Some(wrapper),
            stdin,
            output: None,
        }
    }

    /// The run's diagnostics, with the wrapper's command and stderr while it runs.
    fn diag(&self) -> String {
        let mut out = diagnostics(self.root, &self.id);
        if let Some(w) = &self.wrapper {
            out.push_str(&format!(
                "--- wrapper (pid {}) {}\n--- wrapper stderr so far\n{}\n",
                w.child.id(),
                w.what,
                String::from_utf8_lossy(&w.stderr_so_far())
            ));
        }
        if let Some(o) = &self.output {
            out.push_str(&format!(
                "--- wrapper {}\n--- wrapper stderr\n{}\n",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        out
    }

    fn wrapper_pid(&self) -> i32 {
        self.wrapper
            .as_ref()
            .expect("the wrapper has finished")
            .child
            .id() as i32
    }

    /// Sends `sig` to the wrapper (not yet reaped, so its pid is still its own).
    fn signal(&self, sig: i32) {
        self.wrapper
            .as_ref()
            .expect("the wrapper has finished")
            .signal(sig);
    }

    /// Whether the wrapper has exited (it is not reaped before [`Run::finish`]).
    fn wrapper_exited(&self) -> bool {
        match &self.wrapper {
            Some(w) => match proc_stat(w.child.id() as i32) {
                Some(stat) => matches!(stat.0, 'Z' | 'X'),
                None => true,
            },
            None => true,
        }
    }

    /// Polls `probe` to `timeout`; panics with what it saw last and the diagnostics. Gives up
    /// early if the wrapper exits and the probe still fails after that.
    fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> Result<T, String>,
    ) -> T {
        let start = Instant::now();
        loop {
            let exited = self.wrapper_exited();
            let seen = match probe() {
                Ok(value) => return value,
                Err(seen) => seen,
            };
            if exited || start.elapsed() >= timeout {
                let why = if exited {
                    "the wrapper exited"
                } else {
                    "timed out"
                };
                panic!(
                    "{why} after {:?} waiting for {what}; last seen: {seen}\n{}",
                    start.elapsed(),
                    self.diag()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until status.json is in one of `states`, and returns it.
    fn wait_state(&self, states: &[&str]) -> Value {
        self.wait_for(&format!("status.json in state {states:?}"), LONG, || {
            let st = self.root.try_status(&self.id)?;
            match st["state"].as_str() {
                Some(s) if states.contains(&s) => Ok(st),
                _ => Err(st.to_string()),
            }
        })
    }

    /// Waits for the fixture's `ready` line in the run's stdout.log.
    fn ready(&self) -> Ready {
        let path = self.root.run_dir(&self.id).join("stdout.log");
        self.wait_for("the fixture's ready line in stdout.log", LONG, || {
            let text = fs::read_to_string(&path).map_err(|e| e.to_string())?;
            text.split_inclusive('\n')
                .filter(|line| line.ends_with('\n'))
                .find_map(parse_ready)
                .ok_or_else(|| format!("{text:?}"))
        })
    }

    /// Waits until `path` holds a line for which `find` returns Some, and returns that.
    fn wait_line<T>(&self, path: &Path, what: &str, find: impl Fn(&str) -> Option<T>) -> T {
        self.wait_for(what, LONG, || {
            let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            text.lines()
                .find_map(&find)
                .ok_or_else(|| format!("{}: {text:?}", path.display()))
        })
    }

    /// Closes the workload's stdin pipe.
    fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for the wrapper to exit (panicking with the diagnostics after [`LONG`]), reaps it
    /// and returns its output.
    fn finish(&mut self) -> Output {
        let start = Instant::now();
        while !self.wrapper_exited() {
            if start.elapsed() >= LONG {
                panic!(
                    "the wrapper is still running after {:?}\n{}",
                    start.elapsed(),
                    self.diag()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stdin.take();
        let wrapper = self.wrapper.take().expect("the wrapper has finished");
        let out = wrapper.finish(LONG);
        self.output = Some(out.clone());
        out
    }

    /// Asserts the wrapper's exit code, with its output and the diagnostics on failure.
    fn assert_exit(&self, out: &Output, code: i32) {
        assert_eq!(
            exit_code(&out.status),
            code,
            "wrong exit code from agent-run\n{}\n{}",
            describe_output(&self.id, out),
            self.diag()
        );
    }

    /// status.json, which must be final and valid.
    fn final_record(&self) -> Value {
        let st = self.root.status(&self.id);
        let state = st["state"].as_str().unwrap_or_default();
        assert!(
            FINAL_STATES.contains(&state),
            "the wrapper exited but status.json is not final\n{}",
            self.diag()
        );
        if let Err(e) = check_record(&st) {
            panic!("invalid final record: {e}\n{}", self.diag());
        }
        st
    }

    /// Asserts the record's state and reason.
    fn assert_state(&self, st: &Value, state: &str, reason: Option<&str>) {
        assert_eq!(
            (st["state"].as_str(), st["reason"].as_str()),
            (Some(state), reason),
            "wrong state or reason\n{}",
            self.diag()
        );
    }

    /// The invariant users rely on: once the record is final, nothing of the run is alive.
    /// Every pinned process is gone and the run's session has no live member.
    fn assert_nothing_left(&self, pinned: &Pinned, sid: i32) {
        let alive = pinned.alive();
        assert!(
            alive.is_empty(),
            "processes of the run still alive after its final record: {alive:?} (pinned: {:?})\n{}",
            pinned.pids(),
            self.diag()
        );
        let left = session_members(sid);
        assert!(
            left.is_empty(),
            "session {sid} still has live members after the final record: {left:?}\n{}",
            self.diag()
        );
    }

    /// `key` of a record as an i32 (pid, pgid, sid), panicking with the diagnostics otherwise.
    fn int(&self, st: &Value, key: &str) -> i32 {
        st[key]
            .as_i64()
            .and_then(|v| i32::try_from(v).ok())
            .unwrap_or_else(|| panic!("status.json {key} is not an int: {}\n{}", st, self.diag()))
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        self.stdin.take();
        // Not reaped yet (or reaped just now), so its pid is still its own until try_wait.
        let mut wrapper = self.wrapper.take();
        let wrapper_pid = match wrapper.as_mut().map(|w| w.child.try_wait()) {
            Some(Ok(None)) => wrapper.as_ref().map(|w| w.child.id() as i32),
            _ => None,
        };
        let dir = self.root.run_dir(&self.id);
        // What carries this test's run dir in its environment is this test's; while the wrapper
        // lives (a subreaper), so is every descendant of it, and the recorded leader's session.
        // Kill them all, then the wrapper; repeat for processes forked meanwhile.
        for _ in 0..20 {
            let mut pids = marked(&dir);
            if let Some(w) = wrapper_pid {
                pids.extend(descendants(w));
                if let Ok(st) = self.root.try_status(&self.id) {
                    if let (Some(pid), Some(ticks)) =
                        (st["pid"].as_i64(), st["start_ticks"].as_u64())
                    {
                        let pid = pid as i32;
                        if proc_stat(pid).is_some_and(|s| s.4 == ticks && s.0 != 'Z') {
                            pids.extend(session_members(pid));
                        }
                    }
                }
            }
            pids.sort_unstable();
            pids.dedup();
            if pids.is_empty() {
                break;
            }
            let pinned = Pinned::new(&pids);
            for pid in pinned.pids() {
                let _ = pinned.signal(pid, libc::SIGKILL);
            }
            let _ = pinned.wait_all_gone(Duration::from_secs(5));
        }
        if let Some(mut w) = wrapper {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// Whether `pid` is alive and carries `AGENT_RUN_DIR=<dir>` in its environment.
fn carries_marker(pid: i32, dir: &Path) -> bool {
    let needle = format!("AGENT_RUN_DIR={}", dir.display());
    let alive = proc_stat(pid).is_some_and(|s| !matches!(s.0, 'Z' | 'X'));
    alive
        && fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
}

/// Every live descendant of `pid`.
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for child in children_of(p) {
            if !out.contains(&child) {
                out.push(child);
                queue.push(child);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// The `SigIgn`/`SigCgt`/`SigBlk` mask of a process (`field` like "SigIgn").
fn sig_mask(pid: i32, field: &str) -> Result<u64, String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?;
    u64::from_str_radix(line.trim(), 16).map_err(|e| format!("{field} {line:?}: {e}"))
}

/// The bit of signal `sig` in a /proc signal mask.
fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// `cleanup.signals` of a record.
fn cleanup_signals(st: &Value) -> Vec<String> {
    st["cleanup"]["signals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `cleanup.duration_ms` of a record.
fn cleanup_ms(st: &Value) -> Option<u64> {
    st["cleanup"]["duration_ms"].as_u64()
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`: RFC 3339, UTC, with milliseconds.
fn is_utc_millis(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 24
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            23 => c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// Checks one status.json document against the contract: every key present with its type, a
/// known state, times in RFC 3339 UTC with milliseconds, ids once launched, `ended_at` once final.
fn check_record(v: &Value) -> Result<(), String> {
    let obj = v.as_object().ok_or("not a JSON object")?;
    let missing: Vec<&str> = RECORD_KEYS
        .iter()
        .copied()
        .filter(|k| !obj.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(format!("missing keys {missing:?}"));
    }
    if v["schema"] != 1 {
        return Err(format!("schema {}", v["schema"]));
    }
    let state = v["state"].as_str().ok_or("state is not a string")?;
    if !STATES.contains(&state) {
        return Err(format!("unknown state {state:?}"));
    }
    for key in [
        "run_id",
        "cwd",
        "boot_id",
        "host",
        "user",
        "version",
        "created_at",
    ] {
        if !v[key].is_string() {
            return Err(format!("{key} is not a string: {}", v[key]));
        }
    }
    for key in ["reason", "term_signal", "error", "started_at", "ended_at"] {
        if !(v[key].is_null() || v[key].is_string()) {
            return Err(format!("{key} is neither null nor a string: {}", v[key]));
        }
    }
    for key in ["created_at", "started_at", "ended_at"] {
        if let Some(t) = v[key].as_str() {
            if !is_utc_millis(t) {
                return Err(format!("{key} {t:?} is not RFC 3339 UTC with milliseconds"));
            }
        }
    }
    for key in [
        "exit_code",
        "pid",
        "pgid",
        "sid",
        "start_ticks",
        "wrapper_pid",
    ] {
        if !(v[key].is_null() || v[key].is_i64()) {
            return Err(format!("{key} is neither null nor an integer: {}", v[key]));
        }
    }
    if !v["uid"].is_u64() {
        return Err(format!("uid is not an integer: {}", v["uid"]));
    }
    let argv_ok = v["argv"]
        .as_array()
        .is_some_and(|a| a.iter().all(Value::is_string));
    if !argv_ok {
        return Err(format!("argv is not an array of strings: {}", v["argv"]));
    }
    if !v["cleanup"].is_null() {
        let c = &v["cleanup"];
        if !(c["signals"].is_array() && c["duration_ms"].is_u64() && c["survivors"].is_array()) {
            return Err(format!("cleanup lacks signals/duration_ms/survivors: {c}"));
        }
    }
    if ["running", "cancelling", "finished", "cancelled"].contains(&state) {
        for key in ["pid", "pgid", "sid", "start_ticks", "started_at"] {
            if v[key].is_null() {
                return Err(format!("{key} is null in state {state}"));
            }
        }
    }
    if FINAL_STATES.contains(&state) && v["ended_at"].is_null() {
        return Err(format!("ended_at is null in final state {state}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Signals to the wrapper stop the whole tree

/// The fixture's worker tree (a leader, a child and a grandchild that log TERM and exit) under
/// agent-run; `sig` to the wrapper must stop all of it with one TERM each, and the wrapper must
/// exit `code` with a `cancelled` record naming the signal.
fn signal_to_wrapper_stops_the_worker_tree(sig: i32, name: &str, code: i32) {
    let root = TestRoot::new();
    let log = root.dir.path().join("tree.log");
    let id = format!("tree-{}", name.to_lowercase());
    let mut run = Run::start(
        &root,
        &id,
        &[],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--grandchildren",
            "--leader-term",
            "log-exit",
            "--member-term",
            "log-exit",
            "--log",
            path_str(&log),
        ],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    let st = run.wait_state(&["running"]);
    assert_eq!(
        (
            run.int(&st, "pid"),
            run.int(&st, "pgid"),
            run.int(&st, "sid")
        ),
        (ready.pid, ready.pgid, ready.sid),
        "status.json names another leader than the fixture reports\n{}",
        run.diag()
    );
    // Not vacuous: before the cancel, the session holds exactly the tree.
    assert_eq!(
        session_members(ready.sid),
        ready.all_pids(),
        "the run's session before the cancel\n{}",
        run.diag()
    );

    run.signal(sig);
    let out = run.finish();
    run.assert_exit(&out, code);
    let st = run.final_record();
    let reason = format!("signal:{name}");
    run.assert_state(&st, "cancelled", Some(reason.as_str()));
    run.assert_nothing_left(&pinned, ready.sid);
    assert_eq!(
        cleanup_signals(&st),
        strings(&["TERM"]),
        "a tree that exits on TERM needs no HUP or KILL\n{}",
        run.diag()
    );

    let text = fs::read_to_string(&log).unwrap_or_default();
    let mut roles: Vec<&str> = Vec::new();
    for pid in ready.all_pids() {
        let line = text
            .lines()
            .find(|l| l.ends_with(&format!(" {pid} TERM")))
            .unwrap_or_else(|| panic!("pid {pid} never logged TERM: {text:?}\n{}", run.diag()));
        roles.push(line.split(' ').next().unwrap_or_default());
    }
    roles.sort_unstable();
    assert_eq!(
        roles,
        ["child", "grandchild", "leader"],
        "log {text:?}\n{}",
        run.diag()
    );
    assert!(
        !text.contains("HUP"),
        "HUP reached the tree: {text:?}\n{}",
        run.diag()
    );
}

#[test]
fn term_to_the_wrapper_stops_the_worker_tree_and_exits_143() {
    signal_to_wrapper_stops_the_worker_tree(libc::SIGTERM, "TERM", 143);
}

#[test]
fn int_to_the_wrapper_stops_the_worker_tree_and_exits_130() {
    signal_to_wrapper_stops_the_worker_tree(libc::SIGINT, "INT", 130);
}

#[test]
fn hup_to_the_wrapper_stops_the_worker_tree_and_exits_129() {
    signal_to_wrapper_stops_the_worker_tree(libc::SIGHUP, "HUP", 129);
}

#[test]
fn term_to_the_wrapper_stops_the_seed_articles_bash_worker_and_its_grandchild() {
    let root = TestRoot::new();
    let script = root.dir.path().join("worker.sh");
    let work = root.dir.path().join("work");
    fs::write(&script, SEED_WORKER_SH).unwrap();
    fs::create_dir(&work).unwrap();
    // Run through bash rather than exec'ing the fresh file: another test thread forking while
    // the file was open for writing would make exec fail with ETXTBSY.
    let mut run = Run::start(
        &root,
        "seed-worker",
        &[],
        &["bash", path_str(&script), path_str(&work)],
    );
    let log = work.join("worker.log");
    let grandchild: i32 = run.wait_line(&log, "the worker's grandchild pid", |l| {
        l.split("started grandchild=").nth(1)?.trim().parse().ok()
    });
    run.wait_line(&log, "a parent tick", |l| {
        l.ends_with(" parent_tick").then_some(())
    });
    run.wait_line(&log, "a grandchild tick", |l| {
        l.ends_with(" grandchild_tick").then_some(())
    });
    let st = run.wait_state(&["running"]);
    let (leader, sid) = (run.int(&st, "pid"), run.int(&st, "sid"));
    let mut pids = session_members(sid);
    assert!(
        pids.contains(&leader) && pids.contains(&grandchild),
        "session {sid} = {pids:?} lacks the worker {leader} or its grandchild {grandchild}\n{}",
        run.diag()
    );
    pids.sort_unstable();
    let pinned = Pinned::new(&pids);

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, sid);
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.lines().any(|l| l.ends_with(" TERM")),
        "the worker never logged TERM: {text:?}\n{}",
        run.diag()
    );
    assert!(
        text.lines().any(|l| l.ends_with(" grandchild_TERM")),
        "the grandchild never logged TERM: {text:?}\n{}",
        run.diag()
    );
}

// ---------------------------------------------------------------------------------------------
// The ADR's cases: ignorers, hangups, a second TERM

/// An interactive shell with stdin held open ignores TERM. HUP must go at once with TERM, so it
/// is gone within `max_ms` and without KILL. With `--hup-after 3s`, "at once" cannot be confused
/// with "at the HUP step".
fn interactive_shell_is_hung_up_at_once(id: &str, shell: &[&str], timings: &[&str], max_ms: u64) {
    let root = TestRoot::new();
    let home = root.dir.path().to_path_buf();
    let mut run = Run::start_with(&root, id, &[&["--quiet"], timings].concat(), shell, |cmd| {
        // A private HOME and no ENV/BASH_ENV: no rc file of this host runs.
        cmd.stdin(Stdio::piped())
            .env("HOME", &home)
            .env_remove("ENV")
            .env_remove("BASH_ENV");
    });
    let st = run.wait_state(&["running"]);
    let (leader, sid) = (run.int(&st, "pid"), run.int(&st, "sid"));
    let pinned = Pinned::new(&[leader]);
    // The premise: the shell cannot run a TERM handler.
    run.wait_for("the shell to ignore TERM (SigIgn bit 15)", LONG, || {
        let ign = sig_mask(leader, "SigIgn")?;
        if ign & bit(libc::SIGTERM) != 0 {
            Ok(())
        } else {
            Err(format!("SigIgn {ign:016x}"))
        }
    });

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, sid);
    assert_eq!(
        cleanup_signals(&st),
        strings(&["TERM", "HUP"]),
        "a TERM-ignoring shell ends on the HUP sent with TERM, without KILL\n{}",
        run.diag()
    );
    let ms = cleanup_ms(&st).unwrap_or(u64::MAX);
    assert!(
        ms < max_ms,
        "the shell took {ms} ms to go (limit {max_ms}): HUP was not sent at once with TERM\n{}",
        run.diag()
    );
}

#[test]
fn interactive_bash_with_stdin_open_is_hung_up_at_once_instead_of_waiting_out_the_grace() {
    let timings = ["--hup-after", "3s", "--grace", "15s"];
    interactive_shell_is_hung_up_at_once("bash-i", &["bash", "-i"], &timings, 2000);
}

#[test]
fn interactive_sh_with_stdin_open_is_hung_up_at_once_instead_of_waiting_out_the_grace() {
    let timings = ["--hup-after", "3s", "--grace", "15s"];
    interactive_shell_is_hung_up_at_once("sh-i", &["sh", "-i"], &timings, 2000);
}

/// The ADR's own case, at the default timings: gone well under the 5 s grace (the design
/// target is milliseconds; the HUP step alone would take 500).
#[test]
fn interactive_bash_at_the_default_timings_is_gone_well_under_the_grace() {
    interactive_shell_is_hung_up_at_once("bash-i-default", &["bash", "-i"], &[], 2000);
}

#[test]
fn a_child_ignoring_term_and_hup_is_killed_at_the_grace() {
    let root = TestRoot::new();
    let mut run = Run::start(
        &root,
        "ignorer",
        &["--grace", "1s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    let child = ready.members[0];
    let ign = sig_mask(child, "SigIgn").unwrap_or_default();
    assert_eq!(
        ign & (bit(libc::SIGTERM) | bit(libc::SIGHUP)),
        bit(libc::SIGTERM) | bit(libc::SIGHUP),
        "the child {child} should ignore TERM and HUP: SigIgn {ign:016x}\n{}",
        run.diag()
    );

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, ready.sid);
    assert_eq!(
        cleanup_signals(&st),
        strings(&["TERM", "HUP", "KILL"]),
        "\n{}",
        run.diag()
    );
    let ms = cleanup_ms(&st).unwrap_or_default();
    assert!(
        (1000..10_000).contains(&ms),
        "KILL must come at the 1 s grace, not before: cleanup took {ms} ms\n{}",
        run.diag()
    );
}

#[test]
fn a_leader_exiting_on_term_does_not_strand_a_same_group_descendant_ignoring_term_and_hup() {
    let root = TestRoot::new();
    let log = root.dir.path().join("tree.log");
    let mut run = Run::start(
        &root,
        "outlived",
        &["--grace", "2s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--grandchildren",
            "--leader-term",
            "log-exit",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
            "--log",
            path_str(&log),
        ],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    for &m in &ready.members {
        let pgid = proc_stat(m).map(|s| s.2);
        assert_eq!(
            pgid,
            Some(ready.pgid),
            "member {m} should share the leader's group\n{}",
            run.diag()
        );
    }

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, ready.sid);
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains(&format!("leader {} TERM", ready.pid)),
        "the leader never handled TERM: {text:?}\n{}",
        run.diag()
    );
    assert!(
        cleanup_signals(&st).contains(&"KILL".to_string()),
        "the descendants ignore TERM and HUP: only KILL ends them\n{}",
        run.diag()
    );
    let ms = cleanup_ms(&st).unwrap_or_default();
    assert!(
        ms >= 2000,
        "KILL before the 2 s grace: {ms} ms\n{}",
        run.diag()
    );
}

#[test]
fn a_daemon_that_exits_soon_after_term_never_receives_hup() {
    let root = TestRoot::new();
    let log = root.dir.path().join("daemon.log");
    // TERM: an orderly shutdown that takes 0.2 s; HUP would mean "reload" and is logged.
    let script = r#"log=$1
trap 'echo TERM >> "$log"; sleep 0.2; exit 0' TERM
trap 'echo HUP >> "$log"' HUP
echo ready >> "$log"
while :; do sleep 0.05; done"#;
    let mut run = Run::start(
        &root,
        "daemon",
        &[],
        &["bash", "-c", script, "daemon", path_str(&log)],
    );
    run.wait_line(&log, "the daemon's ready line", |l| {
        (l == "ready").then_some(())
    });
    let st = run.wait_state(&["running"]);
    let (leader, sid) = (run.int(&st, "pid"), run.int(&st, "sid"));
    let pinned = Pinned::new(&[leader]);

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, sid);
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.lines().any(|l| l == "TERM"),
        "the daemon never handled TERM: {text:?}\n{}",
        run.diag()
    );
    assert!(
        !text.contains("HUP"),
        "the daemon was hung up during its TERM shutdown: {text:?}\n{}",
        run.diag()
    );
    assert_eq!(cleanup_signals(&st), strings(&["TERM"]), "\n{}", run.diag());
}

#[test]
fn a_second_term_during_the_grace_kills_at_once() {
    let root = TestRoot::new();
    let mut run = Run::start(
        &root,
        "stubborn",
        &["--grace", "30s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--grandchildren",
            "--leader-term",
            "ignore",
            "--leader-hup",
            "ignore",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());

    run.signal(libc::SIGTERM);
    run.wait_state(&["cancelling"]);
    assert_eq!(
        pinned.alive(),
        ready.all_pids(),
        "the tree ignores TERM and HUP: all of it must still be alive while cancelling\n{}",
        run.diag()
    );
    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, ready.sid);
    assert!(
        cleanup_signals(&st).contains(&"KILL".to_string()),
        "\n{}",
        run.diag()
    );
    let ms = cleanup_ms(&st).unwrap_or(u64::MAX);
    assert!(
        ms < 15_000,
        "the second TERM did not cut the 30 s grace short: cleanup took {ms} ms\n{}",
        run.diag()
    );
}

// ---------------------------------------------------------------------------------------------
// Escapees and leftovers

#[test]
fn a_setsid_double_forked_escapee_is_stopped_on_cancel() {
    let root = TestRoot::new();
    let mut run = Run::start(
        &root,
        "escapee",
        &[],
        &[&fixture_path(), "tree", "--children", "1", "--escapee"],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    let escapees: Vec<i32> = ready
        .members
        .iter()
        .copied()
        .filter(|&m| proc_stat(m).is_some_and(|s| s.3 != ready.sid))
        .collect();
    assert_eq!(
        escapees.len(),
        1,
        "exactly one member should have left the run's session {}\n{}",
        ready.sid,
        run.diag()
    );
    let parent = proc_stat(escapees[0]).map(|s| s.1);
    assert_eq!(
        parent,
        Some(run.wrapper_pid()),
        "the orphaned escapee should be reparented to the wrapper, a child subreaper\n{}",
        run.diag()
    );

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, ready.sid);
}

/// A workload that double-forks a setsid escapee with the run's marker scrubbed from its
/// environment, records its pid in `pidfile`, then runs `rest`. Only the wrapper being a child
/// subreaper brings such an escapee back to the run: it is in no group, session or environment
/// of the run.
fn scrubbed_escapee_script(rest: &str) -> String {
    format!("(setsid env -u AGENT_RUN_ID -u AGENT_RUN_DIR sleep 300 & echo $! > \"$1\"); {rest}")
}

/// Waits for the escapee's pid in `pidfile` and checks that it escaped the session and the
/// marker, and came back to the wrapper.
fn scrubbed_escapee(run: &Run<'_>, pidfile: &Path, sid: i32) -> (i32, Pinned) {
    let pid: i32 = run.wait_line(pidfile, "the escapee's pid", |l| l.trim().parse().ok());
    let pinned = Pinned::new(&[pid]);
    run.wait_for("the escapee to exec sleep without the marker", LONG, || {
        let environ = fs::read(format!("/proc/{pid}/environ")).map_err(|e| e.to_string())?;
        let marked = environ
            .split(|&b| b == 0)
            .any(|v| v.starts_with(b"AGENT_RUN_ID="));
        let stat = proc_stat(pid);
        match (comm(pid).as_str(), marked, stat) {
            ("sleep", false, Some(s)) if s.3 != sid && s.1 == run.wrapper_pid() => Ok(()),
            (comm, marked, stat) => Err(format!("comm {comm} marked {marked} stat {stat:?}")),
        }
    });
    (pid, pinned)
}

#[test]
fn a_setsid_escapee_without_the_runs_marker_is_stopped_on_cancel() {
    let root = TestRoot::new();
    let pidfile = root.dir.path().join("escapee.pid");
    let script = scrubbed_escapee_script("exec sleep 600");
    let mut run = Run::start(
        &root,
        "scrubbed",
        &[],
        &["sh", "-c", &script, "sh", path_str(&pidfile)],
    );
    let st = run.wait_state(&["running"]);
    let (leader, sid) = (run.int(&st, "pid"), run.int(&st, "sid"));
    let (_, escapee) = scrubbed_escapee(&run, &pidfile, sid);
    let pinned = Pinned::new(&[leader]);

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, sid);
    run.assert_nothing_left(&escapee, sid);
}

#[test]
fn a_setsid_escapee_without_the_runs_marker_left_by_a_workload_that_exits_0_is_stopped() {
    let root = TestRoot::new();
    let pidfile = root.dir.path().join("escapee.pid");
    let script = scrubbed_escapee_script("exit 0");
    let mut run = Run::start(
        &root,
        "scrubbed-left",
        &[],
        &["sh", "-c", &script, "sh", path_str(&pidfile)],
    );
    let out = run.finish();
    run.assert_exit(&out, 0);
    let st = run.final_record();
    assert_eq!(st["state"], "finished", "\n{}", run.diag());
    let sid = run.int(&st, "sid");
    let text = fs::read_to_string(&pidfile).unwrap_or_default();
    let escapee: i32 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no escapee pid in {text:?}\n{}", run.diag()));
    // Stopped and reaped by the wrapper before its final record, so its pid may in theory be
    // reused: a live process under it counts only if it is a sleep that started after the run.
    let leader_ticks = st["start_ticks"].as_u64().unwrap_or_default();
    let alive = proc_stat(escapee)
        .filter(|s| !matches!(s.0, 'Z' | 'X') && s.4 >= leader_ticks && comm(escapee) == "sleep");
    if alive.is_some() {
        let _kill_on_unwind = Pinned::new(&[escapee]);
        panic!(
            "the escapee {escapee} is alive after the final record: {alive:?}\n{}",
            run.diag()
        );
    }
    assert!(
        session_members(sid).is_empty(),
        "session {sid} still has members\n{}",
        run.diag()
    );
    let signalled = &st["cleanup"]["signalled"];
    assert!(
        signalled
            .as_array()
            .is_some_and(|a| a.contains(&Value::from(escapee))),
        "the escapee {escapee} is not listed in cleanup.signalled\n{}",
        run.diag()
    );
}

#[test]
fn the_background_jobs_of_a_job_control_shell_are_stopped_on_cancel() {
    let root = TestRoot::new();
    let home = root.dir.path().to_path_buf();
    let mut run = Run::start_with(
        &root,
        "jobs",
        &["--quiet"],
        &["bash", "-ic", "set -m; sleep 300 & sleep 300 & wait"],
        |cmd| {
            cmd.stdin(Stdio::piped())
                .env("HOME", &home)
                .env_remove("BASH_ENV");
        },
    );
    let st = run.wait_state(&["running"]);
    let (leader, sid) = (run.int(&st, "pid"), run.int(&st, "sid"));
    let jobs = run.wait_for("the shell's two background sleeps", LONG, || {
        let sleeps: Vec<i32> = children_of(leader)
            .into_iter()
            .filter(|&p| comm(p) == "sleep")
            .collect();
        if sleeps.len() == 2 {
            Ok(sleeps)
        } else {
            Err(format!("sleeps {sleeps:?}"))
        }
    });
    let mut pids = jobs.clone();
    pids.push(leader);
    let pinned = Pinned::new(&pids);
    for &job in &jobs {
        let stat = proc_stat(job);
        assert!(
            stat.is_some_and(|s| s.2 != leader && s.3 == sid),
            "job {job} should be in its own group of the run's session: {stat:?}\n{}",
            run.diag()
        );
    }

    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_state(&st, "cancelled", Some("signal:TERM"));
    run.assert_nothing_left(&pinned, sid);
}

/// A workload whose leader exits 0 and leaves `tree_opts` processes behind: they must be stopped
/// and listed, and the run still `finished` with exit code 0.
fn leftovers_of_a_leader_that_exits_0_are_stopped_and_listed(id: &str, tree_opts: &[&str]) {
    let root = TestRoot::new();
    let fixture = fixture_path();
    let mut argv = vec![fixture.as_str(), "tree"];
    argv.extend(tree_opts);
    argv.extend(["--leader-exit", "0"]);
    let mut run = Run::start(&root, id, &[], &argv);
    let ready = run.ready();
    // Some may already be stopped and reaped by now: pin only what still carries this run's
    // marker (a reused pid would not); the rest counts as gone.
    let dir = root.run_dir(id);
    let ours: Vec<i32> = ready
        .all_pids()
        .into_iter()
        .filter(|&p| carries_marker(p, &dir))
        .collect();
    let pinned = Pinned::new(&ours);

    let out = run.finish();
    run.assert_exit(&out, 0);
    let st = run.final_record();
    // No reason is asserted: the contract leaves open whether a finished run with leftovers
    // names why they were stopped.
    assert_eq!(st["state"], "finished", "\n{}", run.diag());
    assert_eq!(
        (&st["exit_code"], &st["term_signal"]),
        (&Value::from(0), &Value::Null),
        "\n{}",
        run.diag()
    );
    run.assert_nothing_left(&pinned, ready.sid);
    let signalled: Vec<i64> = st["cleanup"]["signalled"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    for &m in &ready.members {
        assert!(
            signalled.contains(&i64::from(m)),
            "leftover {m} is not listed in cleanup.signalled\n{}",
            run.diag()
        );
    }
    assert!(
        cleanup_signals(&st).contains(&"TERM".to_string()),
        "\n{}",
        run.diag()
    );
}

#[test]
fn background_children_left_by_a_workload_that_exits_0_are_stopped_and_listed() {
    leftovers_of_a_leader_that_exits_0_are_stopped_and_listed(
        "leftovers",
        &["--children", "2", "--grandchildren"],
    );
}

#[test]
fn a_setsid_escapee_left_by_a_workload_that_exits_0_is_stopped_and_listed() {
    leftovers_of_a_leader_that_exits_0_are_stopped_and_listed(
        "left-escapee",
        &["--children", "0", "--escapee"],
    );
}

#[test]
fn cancelling_one_run_leaves_another_run_under_the_same_root_running_to_its_finish() {
    let root = TestRoot::new();
    let mut doomed = Run::start(
        &root,
        "doomed",
        &[],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "2",
            "--grandchildren",
        ],
    );
    let mut other = Run::start_holding_stdin(
        &root,
        "other",
        &[],
        &["sh", "-c", "sleep 600 & read line; kill $!"],
    );
    let ready = doomed.ready();
    let doomed_pins = Pinned::new(&ready.all_pids());
    let st = other.wait_state(&["running"]);
    let (leader, sid) = (other.int(&st, "pid"), other.int(&st, "sid"));
    let sleeper = other.wait_for("the other run's sleep", LONG, || {
        children_of(leader)
            .into_iter()
            .find(|&p| comm(p) == "sleep")
            .ok_or_else(|| format!("children of {leader}: {:?}", children_of(leader)))
    });
    let other_pins = Pinned::new(&[leader, sleeper]);

    doomed.signal(libc::SIGTERM);
    let out = doomed.finish();
    doomed.assert_exit(&out, 143);
    let st = doomed.final_record();
    doomed.assert_state(&st, "cancelled", Some("signal:TERM"));
    doomed.assert_nothing_left(&doomed_pins, ready.sid);

    assert_eq!(
        other_pins.alive(),
        vec![leader, sleeper],
        "cancelling another run touched this one\n{}",
        other.diag()
    );
    let st = other.root.status(&other.id);
    other.assert_state(&st, "running", None);

    other.close_stdin();
    let out = other.finish();
    other.assert_exit(&out, 0);
    let st = other.final_record();
    other.assert_state(&st, "finished", None);
    assert_eq!(st["exit_code"], 0, "\n{}", other.diag());
    other.assert_nothing_left(&other_pins, sid);
}

// ---------------------------------------------------------------------------------------------
// Exit codes

#[test]
fn the_workloads_exit_code_passes_through() {
    let root = TestRoot::new();
    for code in [0, 3, 42, 255] {
        let id = format!("exit-{code}");
        let mut run = Run::start(
            &root,
            &id,
            &[],
            &[&fixture_path(), "exit", &code.to_string()],
        );
        let out = run.finish();
        run.assert_exit(&out, code);
        let st = run.final_record();
        run.assert_state(&st, "finished", None);
        assert_eq!(
            (&st["exit_code"], &st["term_signal"]),
            (&Value::from(code), &Value::Null),
            "\n{}",
            run.diag()
        );
        let leader = run.int(&st, "pid");
        let ticks = st["start_ticks"].as_u64();
        let alive = proc_stat(leader).filter(|s| Some(s.4) == ticks && s.0 != 'Z');
        assert!(
            alive.is_none(),
            "leader {leader} still alive\n{}",
            run.diag()
        );
    }
}

#[test]
fn a_workload_killed_by_a_signal_exits_128_plus_n_with_the_signal_named() {
    let root = TestRoot::new();
    for (sig, name) in [(libc::SIGKILL, "KILL"), (libc::SIGTERM, "TERM")] {
        let id = format!("signal-{name}");
        let mut run = Run::start(
            &root,
            &id,
            &[],
            &[&fixture_path(), "signal", &sig.to_string()],
        );
        let out = run.finish();
        run.assert_exit(&out, 128 + sig);
        let st = run.final_record();
        run.assert_state(&st, "finished", None);
        assert_eq!(
            (&st["exit_code"], &st["term_signal"]),
            (&Value::Null, &Value::from(name)),
            "\n{}",
            run.diag()
        );
    }
}

/// A launch that must fail with `code`: exit code, `launch_failed`, a one-line error, and the
/// command never ran.
fn assert_launch_failed(run: &mut Run<'_>, code: i32) {
    let out = run.finish();
    run.assert_exit(&out, code);
    let st = run.final_record();
    run.assert_state(&st, "launch_failed", None);
    // The leader never ran: `exit_code` is null; the launch's code is `launch_exit_code`.
    assert_eq!(st["exit_code"], Value::Null, "\n{}", run.diag());
    assert_eq!(st["launch_exit_code"], code, "\n{}", run.diag());
    let error = st["error"].as_str().unwrap_or_default();
    assert!(
        !error.is_empty() && !error.contains('\n'),
        "error must be one non-empty line: {:?}\n{}",
        st["error"],
        run.diag()
    );
}

#[test]
fn a_command_that_is_not_found_exits_127_as_launch_failed() {
    let root = TestRoot::new();
    let missing = root.dir.path().join("no-such-dir").join("cmd");
    for (id, cmd) in [
        ("not-on-path", "agent-run-test-no-such-command"),
        ("no-such-path", path_str(&missing)),
    ] {
        let mut run = Run::start(&root, id, &[], &[cmd]);
        assert_launch_failed(&mut run, 127);
    }
}

#[test]
fn a_command_that_is_not_executable_exits_126_as_launch_failed() {
    let root = TestRoot::new();
    let script = root.dir.path().join("not-executable.sh");
    let marker = root.dir.path().join("ran");
    fs::write(
        &script,
        format!("#!/bin/sh\necho ran > {}\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let mut run = Run::start(&root, "not-exec", &[], &[path_str(&script)]);
    assert_launch_failed(&mut run, 126);
    assert!(
        !marker.exists(),
        "the non-executable file ran\n{}",
        run.diag()
    );
}

// ---------------------------------------------------------------------------------------------
// Records, modes, what the workload inherits

#[test]
fn a_tight_reader_never_sees_a_partial_status_json_or_a_state_out_of_order() {
    let root = TestRoot::new();
    let path = root.run_dir("polled").join("status.json");
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let saw_running = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop.0);
        let saw_running = Arc::clone(&saw_running);
        std::thread::spawn(move || {
            let (mut states, mut bad, mut reads) = (Vec::<String>::new(), Vec::new(), 0u64);
            // Keeps reading after a bad document (so the test goes on), keeping the first ten.
            let note = |bad: &mut Vec<String>, what: String| {
                if bad.len() < 10 {
                    bad.push(what);
                }
            };
            let mut last_pass = false;
            // One more pass after the stop flag: the final record is in place by then.
            while !last_pass {
                last_pass = stop.load(Ordering::SeqCst);
                let bytes = match fs::read(&path) {
                    Ok(bytes) => bytes,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => {
                        note(&mut bad, format!("read: {e}"));
                        continue;
                    }
                };
                reads += 1;
                let doc: Value = match serde_json::from_slice(&bytes) {
                    Ok(doc) => doc,
                    Err(e) => {
                        note(
                            &mut bad,
                            format!("{e}: {:?}", String::from_utf8_lossy(&bytes)),
                        );
                        continue;
                    }
                };
                if let Err(e) = check_record(&doc) {
                    note(&mut bad, format!("{e}: {doc}"));
                }
                let state = doc["state"].as_str().unwrap_or_default().to_string();
                if state == "running" {
                    saw_running.store(true, Ordering::SeqCst);
                }
                if states.last() != Some(&state) {
                    states.push(state);
                }
            }
            (states, bad, reads)
        })
    };
    let mut run = Run::start(
        &root,
        "polled",
        &["--grace", "1s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    // Cancel only once the reader has seen `running` (it may be starved on a loaded host).
    run.wait_for("the reader to see running", LONG, || {
        if saw_running.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    });
    run.signal(libc::SIGTERM);
    let out = run.finish();
    drop(stop);
    let (states, bad, reads) = reader.join().expect("the reader thread panicked");
    run.assert_exit(&out, 143);
    run.assert_nothing_left(&pinned, ready.sid);
    assert!(
        bad.is_empty(),
        "the reader saw invalid documents ({reads} reads): {bad:#?}\n{}",
        run.diag()
    );
    let order = ["starting", "running", "cancelling", "cancelled"];
    let ranks: Vec<Option<usize>> = states
        .iter()
        .map(|s| order.iter().position(|o| o == s))
        .collect();
    assert!(
        ranks.iter().all(Option::is_some) && ranks.windows(2).all(|w| w[0] < w[1]),
        "states seen out of order or not allowed: {states:?}\n{}",
        run.diag()
    );
    for must in ["running", "cancelling", "cancelled"] {
        assert!(
            states.iter().any(|s| s == must),
            "the reader never saw {must}: {states:?} in {reads} reads\n{}",
            run.diag()
        );
    }
}

/// Sets its flag when dropped, so a failing test also stops the reader thread.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Asserts the root and the run dir are 0700 and every entry of the run dir a regular 0600 file.
fn assert_private_modes(run: &Run<'_>, when: &str) {
    for dir in [run.root.root(), run.root.run_dir(&run.id)] {
        let md = fs::symlink_metadata(&dir).unwrap();
        assert!(
            md.is_dir() && md.mode() & 0o7777 == 0o700,
            "{when}: {} has mode {:o}, not a 0700 dir\n{}",
            dir.display(),
            md.mode(),
            run.diag()
        );
    }
    let entries = fs::read_dir(run.root.run_dir(&run.id)).unwrap();
    for entry in entries {
        let entry = entry.unwrap();
        let md = fs::symlink_metadata(entry.path()).unwrap();
        assert!(
            md.file_type().is_file() && md.mode() & 0o7777 == 0o600,
            "{when}: {} has mode {:o}, not a 0600 regular file\n{}",
            entry.path().display(),
            md.mode(),
            run.diag()
        );
    }
}

#[test]
fn the_root_and_run_dir_are_0700_and_every_run_file_0600_even_with_umask_0() {
    let root = TestRoot::new();
    let mut run = Run::start_with(
        &root,
        "modes",
        &["--lease", "1h"],
        &[&fixture_path(), "tree", "--children", "1"],
        |cmd| {
            // SAFETY: umask(2) is async-signal-safe and cannot fail.
            unsafe {
                cmd.pre_exec(|| {
                    libc::umask(0);
                    Ok(())
                });
            }
        },
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    run.wait_state(&["running"]);
    assert!(
        root.run_dir("modes").join("lease.json").exists(),
        "--lease wrote no lease.json\n{}",
        run.diag()
    );
    assert_private_modes(&run, "while running");
    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    run.assert_nothing_left(&pinned, ready.sid);
    assert_private_modes(&run, "after the final record");
}

/// Starts `cmd` the way a careless parent would: SIGINT, SIGPIPE, SIGHUP and the real-time
/// signals 32 and 33 ignored, SIGUSR1 blocked, and fd 7 open without close-on-exec.
///
/// glibc reserves signals 32 and 33 and refuses to change them through signal(3) or
/// sigaction(3), so they are set with the raw rt_sigaction(2) syscall. (cargo itself starts test
/// binaries with both ignored; setting them here makes the test the same under any runner.)
fn start_leaky(cmd: &mut Command) {
    /// `struct sigaction` as the kernel takes it (x86_64 and aarch64 layout).
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    // SAFETY: signal(2), rt_sigaction(2), sigemptyset/sigaddset(3), sigprocmask(2) and dup2(2)
    // are async-signal-safe; nothing is allocated between fork and exec. SIG_IGN runs no
    // handler, so no restorer is needed.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            let ignore = KernelSigaction {
                handler: libc::SIG_IGN,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            for sig in [32, 33] {
                let none = std::ptr::null_mut::<KernelSigaction>();
                if libc::syscall(libc::SYS_rt_sigaction, sig, &ignore, none, 8) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if libc::dup2(2, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn no_fd_mask_or_ignored_signal_of_the_wrapper_leaks_into_the_workload() {
    // The control: started directly, the fixture does report what it inherited.
    let mut direct = Command::new(fixture_bin());
    direct.arg("env").stdin(Stdio::null());
    start_leaky(&mut direct);
    let control = run_with_timeout(&mut direct, LONG);
    let control_text = String::from_utf8_lossy(&control.stdout);
    let mask = |field: &str| {
        control_text
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_default()
    };
    let ignored = bit(libc::SIGINT) | bit(libc::SIGPIPE) | bit(libc::SIGHUP) | bit(32) | bit(33);
    let fds = control_text
        .lines()
        .find_map(|l| l.strip_prefix("fds: "))
        .unwrap_or_default();
    assert!(
        mask("SigIgn:") & ignored == ignored
            && mask("SigBlk:") & bit(libc::SIGUSR1) != 0
            && fds.split(',').any(|fd| fd == "7"),
        "the leaky start does not leak: the test proves nothing\n{}",
        describe_output("fixture env", &control)
    );

    let root = TestRoot::new();
    let mut run = Run::start_with(&root, "env", &[], &[&fixture_path(), "env"], start_leaky);
    let out = run.finish();
    run.assert_exit(&out, 0);
    let st = run.final_record();
    run.assert_state(&st, "finished", None);
    let dir = root.run_dir("env");
    let report = fs::read_to_string(dir.join("stdout.log")).unwrap_or_default();
    let leader = run.int(&st, "pid");
    let expected = [
        "SigIgn:\t0000000000000000".to_string(),
        "SigBlk:\t0000000000000000".to_string(),
        "fds: 0,1,2".to_string(),
        "AGENT_RUN_ID=env".to_string(),
        format!("AGENT_RUN_DIR={}", dir.display()),
        format!("pid={leader} pgid={leader} sid={leader}"),
    ];
    let missing: Vec<&String> = expected
        .iter()
        .filter(|want| !report.lines().any(|l| l == want.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the workload's report lacks {missing:?}:\n{report}\n{}",
        run.diag()
    );
}

#[test]
fn pid_and_pgid_files_and_status_json_name_the_leader_the_kernel_shows() {
    let root = TestRoot::new();
    let fixture = fixture_path();
    let argv = [fixture.as_str(), "tree", "--children", "1"];
    let mut run = Run::start(&root, "ids", &[], &argv);
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    let st = run.wait_state(&["running"]);
    let dir = root.run_dir("ids");
    for name in ["pid", "pgid"] {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert_eq!(
            text,
            format!("{}\n", ready.pid),
            "{name} file\n{}",
            run.diag()
        );
    }
    if let Err(e) = check_record(&st) {
        panic!("invalid running record: {e}\n{}", run.diag());
    }
    let kernel = proc_stat(ready.pid).expect("the leader is pinned and parked");
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let cwd = std::env::current_dir().unwrap();
    let expected = [
        ("run_id", Value::from("ids")),
        ("pid", Value::from(ready.pid)),
        ("pgid", Value::from(ready.pid)),
        ("sid", Value::from(ready.pid)),
        ("start_ticks", Value::from(kernel.4)),
        ("wrapper_pid", Value::from(run.wrapper_pid())),
        ("argv", Value::from(argv.to_vec())),
        ("cwd", Value::from(path_str(&cwd))),
        ("boot_id", Value::from(boot_id.trim())),
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        ("uid", Value::from(geteuid())),
    ];
    for (key, want) in expected {
        assert_eq!(st[key], want, "status.json {key}\n{}", run.diag());
    }
    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    run.final_record();
    run.assert_nothing_left(&pinned, ready.sid);
}

#[test]
fn the_journal_records_the_launch_every_state_change_and_every_signal_with_target_and_reason() {
    let root = TestRoot::new();
    let mut run = Run::start(
        &root,
        "journal",
        &["--grace", "1s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let ready = run.ready();
    let pinned = Pinned::new(&ready.all_pids());
    run.wait_state(&["running"]);
    run.signal(libc::SIGTERM);
    let out = run.finish();
    run.assert_exit(&out, 143);
    let st = run.final_record();
    run.assert_nothing_left(&pinned, ready.sid);

    let events = root.events("journal");
    for e in &events {
        let ts = e["ts"].as_str().unwrap_or_default();
        assert!(is_utc_millis(ts), "bad ts in {e}\n{}", run.diag());
    }
    assert_eq!(
        named(&events, "launch").count(),
        1,
        "launch events\n{}",
        run.diag()
    );
    let changes: Vec<&str> = named(&events, "state")
        .filter_map(|e| e["to"].as_str())
        .filter(|&to| to != "starting")
        .collect();
    assert_eq!(
        changes,
        ["running", "cancelling", "cancelled"],
        "state changes in the journal\n{}",
        run.diag()
    );
    let mut sent: Vec<String> = Vec::new();
    for e in named(&events, "signal") {
        let target = e["target"].as_str().unwrap_or_default();
        let signal = e["signal"].as_str().unwrap_or_default();
        assert!(
            !target.is_empty() && !signal.is_empty() && e["reason"] == "signal:TERM",
            "a signal event without target, signal or reason: {e}\n{}",
            run.diag()
        );
        if signal != "CONT" && !sent.iter().any(|s| s == signal) {
            sent.push(signal.to_string());
        }
    }
    assert_eq!(
        sent,
        cleanup_signals(&st),
        "the signals journalled and the signals in cleanup differ\n{}",
        run.diag()
    );
    assert_eq!(sent, strings(&["TERM", "HUP", "KILL"]), "\n{}", run.diag());
}

/// The journal events called `name`.
fn named<'a>(events: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events.iter().filter(move |e| e["event"] == name)
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// `agent-run --root R ARGS...` run to completion.
fn agent_run(root: &TestRoot, args: &[&str]) -> Output {
    run_with_timeout(root.cmd().args(args), LONG)
}

/// The names in `dir` (empty if it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A refused command's output, the root's listing and the run's diagnostics.
fn refusal_diag(root: &TestRoot, id: &str, what: &str, out: &Output) -> String {
    format!(
        "{}\n--- root {} holds {:?}\n{}",
        describe_output(what, out),
        root.root().display(),
        entries(&root.root()),
        diagnostics(root, id)
    )
}

#[test]
fn bad_run_ids_exit_64_before_anything_is_created() {
    let root = TestRoot::new();
    let marker = root.dir.path().join("ran");
    let fixture = fixture_path();
    let long = "a".repeat(129);
    for id in [
        "", ".", "..", "../x", "a/b", "-x", ".hidden", &long, "é", "a b",
    ] {
        let args = [id, "--", &fixture, "count", path_str(&marker)];
        let out = agent_run(&root, &args);
        let what = format!("run id {id:?}");
        let diag = || refusal_diag(&root, id, &what, &out);
        assert_eq!(exit_code(&out.status), 64, "{}", diag());
        assert!(
            fs::symlink_metadata(root.root()).is_err(),
            "{what}: the root was created\n{}",
            diag()
        );
        assert!(!marker.exists(), "{what}: the command ran\n{}", diag());
    }
}

#[test]
fn a_run_id_of_128_characters_is_accepted() {
    let root = TestRoot::new();
    let marker = root.dir.path().join("ran");
    let id = format!("A{}", "z-_.9".repeat(26))
        .chars()
        .take(128)
        .collect::<String>();
    assert_eq!(id.len(), 128);
    let out = agent_run(
        &root,
        &[&id, "--", &fixture_path(), "count", path_str(&marker)],
    );
    let diag = || refusal_diag(&root, &id, "a 128-character id", &out);
    assert_eq!(exit_code(&out.status), 0, "{}", diag());
    assert_eq!(
        fs::read_to_string(&marker).unwrap_or_default(),
        "ran\n",
        "{}",
        diag()
    );
    let st = root.status(&id);
    assert_eq!(st["state"], "finished", "{}", diag());
}

#[test]
fn a_missing_command_exits_64_and_runs_nothing() {
    let root = TestRoot::new();
    for args in [&["no-command"][..], &["no-command", "--"][..]] {
        let out = agent_run(&root, args);
        let what = format!("agent-run {args:?}");
        let diag = || refusal_diag(&root, "no-command", &what, &out);
        assert_eq!(exit_code(&out.status), 64, "{}", diag());
        assert!(
            entries(&root.root()).is_empty(),
            "{what} created a run\n{}",
            diag()
        );
    }
}

/// Runs `fixture count` under `root` as `id` and asserts exit 78, stderr naming `named`, and
/// that the command never ran and `untouched` stayed empty.
fn assert_refused_as_unsafe(root: &TestRoot, id: &str, named: &Path, untouched: &Path) {
    let marker = root.dir.path().join("ran");
    let out = agent_run(
        root,
        &[id, "--", &fixture_path(), "count", path_str(&marker)],
    );
    let what = format!("run {id} under {}", root.root().display());
    let diag = || refusal_diag(root, id, &what, &out);
    assert_eq!(exit_code(&out.status), 78, "{}", diag());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(path_str(named)),
        "stderr does not name {}\n{}",
        named.display(),
        diag()
    );
    assert!(!marker.exists(), "{what}: the command ran\n{}", diag());
    assert!(
        entries(untouched).is_empty(),
        "{what}: {} got {:?}\n{}",
        untouched.display(),
        entries(untouched),
        diag()
    );
}

#[test]
fn a_group_or_world_writable_root_exits_78_naming_it() {
    let root = TestRoot::new();
    let dir = root.root();
    fs::create_dir(&dir).unwrap();
    for mode in [0o777, 0o770, 0o720, 0o702, 0o1777] {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
        assert_refused_as_unsafe(&root, "unsafe-root", &dir, &dir);
        let now = fs::metadata(&dir).unwrap().mode() & 0o7777;
        assert_eq!(
            now,
            mode,
            "agent-run changed the unsafe root's mode\n{}",
            diagnostics(&root, "unsafe-root")
        );
    }
}

#[test]
fn a_root_owned_by_another_user_exits_78() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if geteuid() != 0 {
        eprintln!("note: skipped a_root_owned_by_another_user_exits_78: chown needs root");
        return;
    }
    let root = TestRoot::new();
    let dir = root.root();
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    assert_refused_as_unsafe(&root, "foreign-root", &dir, &dir);
}

#[test]
fn a_root_that_is_a_symlink_exits_78() {
    let root = TestRoot::new();
    let real = root.dir.path().join("real-root");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, root.root()).unwrap();
    assert_refused_as_unsafe(&root, "via-link", &root.root(), &real);
}

#[test]
fn a_run_dir_that_is_a_symlink_exits_78() {
    let root = TestRoot::new();
    let elsewhere = root.dir.path().join("elsewhere");
    for dir in [root.root(), elsewhere.clone()] {
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    }
    std::os::unix::fs::symlink(&elsewhere, root.run_dir("linked")).unwrap();
    assert_refused_as_unsafe(&root, "linked", &root.run_dir("linked"), &elsewhere);
}
