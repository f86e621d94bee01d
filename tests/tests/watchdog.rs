//! The lease and the watchdog on real process trees: leases nobody renews (enforced by the
//! wrapper itself), wrappers that are `kill -9`ed or SIGSTOPped (the `agent-run-watchdog` daemon
//! takes over), records from an earlier boot, corrupt run dirs, a thousand run dirs with two
//! hundred leases expiring at once, and SIGTERM to the daemon in the middle of a stop. The daemon
//! loop is a library function, so the cheapest cases also run in-process through
//! `agent_run_watchdog::run_once`.
//!
//! Runs the watchdog owns without a wrapper are fabricated the way a dead wrapper leaves them: a
//! real workload in its own session carrying `AGENT_RUN_ID`, and a `status.json` / `lease.json`
//! written with the shared library's writers. Every process a test starts is pinned with a pidfd
//! and killed (by pid) and reaped when the test ends, pass or fail.
//!
//! Run ids are unique across this file anyway, although a marker only counts when the process's
//! `AGENT_RUN_DIR` is the very run dir (device and inode), so one id under two roots is safe.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use agent_run_shared::id::RunId;
use agent_run_shared::lease::Lease;
use agent_run_shared::record::{Cleanup, State, Status, SCHEMA};
use agent_run_shared::root::Root;
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::time::{epoch_now, parse_rfc3339, rfc3339_now};
use agent_run_shared::{procfs, sys as shared_sys};
use agent_run_tests::facts::{exclusive_cpu, shared_cpu};
use agent_run_tests::Reaper;
use agent_run_tests::{
    describe_output, diagnostics, exit_code, fixture_bin, proc_stat, run_with_timeout,
    session_members, wait_ready, wait_until, wait_until_dbg, Pinned, Ready, Spawned, TestRoot,
};
use agent_run_watchdog::{run_once, Policy};
use serde_json::Value;

/// The one generous deadline for anything that should happen "soon" (CI has 2 slow cores).
const LONG: Duration = Duration::from_secs(30);

/// A boot id no machine has: the record of a run from "an earlier boot".
const FORGED_BOOT_ID: &str = "00000000-0000-0000-0000-000000000000";

// ---------------------------------------------------------------------------------------------
// CPU sharing: the thousand-run test measures stop durations, so it runs alone; every other
// test of this file may run beside the others.

// (agent_run_tests::facts::{shared_cpu, exclusive_cpu})

// ---------------------------------------------------------------------------------------------
// Processes the test starts itself

/// The fixture with `args` in a new session (setsid in `pre_exec`), stdin and stderr on
/// /dev/null, stdout to `stdout` (or /dev/null), and, with `run`, the run's environment marker.
fn spawn_in_session(args: &[&str], run: Option<(&str, &Path)>, stdout: Option<&Path>) -> Child {
    let mut cmd = Command::new(fixture_bin());
    cmd.args(args)
        .env_remove("AGENT_RUN_ID")
        .env_remove("AGENT_RUN_DIR")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    match stdout {
        Some(path) => {
            let file = fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            cmd.stdout(file);
        }
        None => {
            cmd.stdout(Stdio::null());
        }
    }
    if let Some((id, dir)) = run {
        cmd.env("AGENT_RUN_ID", id).env("AGENT_RUN_DIR", dir);
    }
    // SAFETY: the closure runs between fork and exec and calls only setsid(2), which is
    // async-signal-safe; it fails only for a process group leader, which a fresh child is not.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // spawn() returns once exec succeeded, so setsid has happened and the environment is the
    // fixture's.
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"))
}

/// The fixture's `tree` options for a tree that ignores TERM and HUP everywhere.
const STUBBORN_TREE: [&str; 11] = [
    "tree",
    "--children",
    "1",
    "--leader-term",
    "ignore",
    "--leader-hup",
    "ignore",
    "--member-term",
    "ignore",
    "--member-hup",
    "ignore",
];

/// A pid and start time that belonged to a process of this boot that is now gone (reaped).
fn dead_process() -> (i32, u64) {
    let mut child = spawn_in_session(&["sleep-ms", "600000"], None, None);
    let pid = child.id() as i32;
    let ticks = proc_stat(pid).expect("a fresh child has a /proc entry").4;
    child.kill().expect("cannot kill a fresh child");
    child.wait().expect("cannot reap a fresh child");
    (pid, ticks)
}

// ---------------------------------------------------------------------------------------------
// Fabricated run dirs: what a wrapper that died leaves behind

/// A `running` record for run `id` led by `leader` (pid, pgid, sid and start time read from
/// /proc), of this user, with no wrapper, grace 2 s and HUP at 500 ms.
fn running_record(id: &str, leader: i32, boot_id: &str) -> Status {
    let (_, _, pgid, sid, start_ticks) =
        proc_stat(leader).unwrap_or_else(|| panic!("leader {leader} has no /proc entry"));
    record_with(id, leader, pgid, sid, start_ticks, boot_id)
}

fn record_with(id: &str, pid: i32, pgid: i32, sid: i32, ticks: u64, boot_id: &str) -> Status {
    let uid = shared_sys::geteuid();
    Status {
        schema: SCHEMA,
        run_id: id.to_string(),
        state: State::Running,
        reason: None,
        exit_code: None,
        term_signal: None,
        argv: vec![fixture_bin().display().to_string()],
        cwd: "/".into(),
        pid: Some(pid),
        pgid: Some(pgid),
        sid: Some(sid),
        start_ticks: Some(ticks),
        boot_id: boot_id.to_string(),
        // A wrapper that is gone (no process can have this pid: it is above pid_max), started
        // at boot: the whole identity a record must hold, with the wrapper already dead.
        wrapper_pid: Some(i32::MAX),
        wrapper_start_ticks: Some(0),
        host: shared_sys::hostname(),
        user: agent_run_shared::users::user_name(uid),
        uid,
        created_at: rfc3339_now(),
        started_at: Some(rfc3339_now()),
        ended_at: None,
        cleanup: None,
        error: None,
        version: agent_run_shared::VERSION.into(),
        grace_ms: Some(2000),
        hup_after_ms: Some(500),
        warnings: vec![],
        ..Status::blank(id)
    }
}

/// The run root, created (0700) the way agent-run creates it.
fn open_root(root: &TestRoot) -> Root {
    Root::open(&root.root(), true).unwrap_or_else(|e| panic!("cannot open the run root: {e}"))
}

/// An empty run dir (0700) for `id`.
fn make_run_dir(root: &TestRoot, id: &str) -> PathBuf {
    let dir = root.run_dir(id);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The run dir at `dir`, held as agent-run holds it.
fn run_dir_at(dir: &Path) -> RunDir {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let id = RunId::parse(name).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    RunDir::open(dir, id).unwrap_or_else(|e| panic!("cannot open {}: {e}", dir.display()))
}

fn write_record(dir: &Path, st: &Status) {
    run_dir_at(dir)
        .write_status(st)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.display()));
}

fn write_deadline(dir: &Path, deadline_epoch: f64, lease_s: f64) {
    let lease = Lease {
        deadline_epoch,
        lease_s,
    };
    run_dir_at(dir)
        .write_lease(&lease)
        .unwrap_or_else(|e| panic!("cannot write a lease: {e}"));
}

/// A watchdog policy for in-process passes: no orphan grace, the given slack.
fn policy(slack: Duration) -> Policy {
    Policy {
        orphan_grace: Duration::ZERO,
        slack,
    }
}

// ---------------------------------------------------------------------------------------------
// Reading outcomes

/// An RFC 3339 time of the record as epoch seconds; panics with diagnostics if absent.
fn epoch_field(root: &TestRoot, id: &str, st: &Value, key: &str) -> f64 {
    st[key].as_str().and_then(parse_rfc3339).unwrap_or_else(|| {
        panic!(
            "{key} is not a time: {}\n{}",
            st[key],
            diagnostics(root, id)
        )
    })
}

/// lease.json's deadline.
fn lease_deadline(root: &TestRoot, id: &str) -> f64 {
    let path = root.run_dir(id).join("lease.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\n{}",
            path.display(),
            diagnostics(root, id)
        )
    });
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("bad lease.json {text:?}: {e}\n{}", diagnostics(root, id)));
    v["deadline_epoch"]
        .as_f64()
        .unwrap_or_else(|| panic!("no deadline in {text:?}\n{}", diagnostics(root, id)))
}

/// Asserts state and reason of a final record.
fn assert_outcome(root: &TestRoot, id: &str, st: &Value, state: &str, reason: &str) {
    assert_eq!(
        (st["state"].as_str(), st["reason"].as_str()),
        (Some(state), Some(reason)),
        "run {id} should be {state} ({reason})\n{}",
        diagnostics(root, id)
    );
}

/// Waits until every pinned process is gone (zombies count), panicking with the survivors.
fn assert_all_gone(root: &TestRoot, id: &str, pinned: &Pinned, timeout: Duration) -> Duration {
    pinned.wait_all_gone(timeout).unwrap_or_else(|alive| {
        panic!(
            "processes of run {id} still alive after {timeout:?}: {alive:?}\n{}",
            diagnostics(root, id)
        )
    })
}

/// The cleanup of a final record.
fn cleanup_of(root: &TestRoot, id: &str, st: &Value) -> Cleanup {
    serde_json::from_value(st["cleanup"].clone()).unwrap_or_else(|e| {
        panic!(
            "run {id} has no usable cleanup ({e}): {}\n{}",
            st["cleanup"],
            diagnostics(root, id)
        )
    })
}

/// events.jsonl of a run, or nothing when it does not exist yet.
fn events_so_far(root: &TestRoot, id: &str) -> Vec<Value> {
    fs::read_to_string(root.run_dir(id).join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn signal_events(root: &TestRoot, id: &str) -> Vec<Value> {
    events_so_far(root, id)
        .into_iter()
        .filter(|e| e["event"] == "signal")
        .collect()
}

/// Prints how late the run's own lease was enforced: from lease.json's deadline to the
/// `lease_expired` journal line and to `ended_at`. Not asserted beyond "not early".
fn report_lateness(root: &TestRoot, id: &str, what: &str) -> (f64, f64) {
    let st = root.status(id);
    let deadline = lease_deadline(root, id);
    let ended = epoch_field(root, id, &st, "ended_at");
    let noticed = events_so_far(root, id)
        .iter()
        .find(|e| e["event"] == "lease_expired")
        .and_then(|e| e["ts"].as_str().and_then(parse_rfc3339));
    let noticed_ms = noticed.map_or(f64::NAN, |t| (t - deadline) * 1000.0);
    let ended_ms = (ended - deadline) * 1000.0;
    eprintln!(
        "lease lateness [{what}] run {id}: expiry noticed {noticed_ms:+.0} ms, \
         final record {ended_ms:+.0} ms after the deadline"
    );
    // Times are written with millisecond precision (truncated): allow that much.
    assert!(
        ended >= deadline - 0.001,
        "run {id} ended {:.3} s before its lease deadline\n{}",
        deadline - ended,
        diagnostics(root, id)
    );
    (noticed_ms, ended_ms)
}

/// Sleeps until the wall clock reaches `epoch` (the scenario's own timeline, not a wait for a
/// result). Returns false if it had already passed.
fn sleep_until_epoch(epoch: f64) -> bool {
    let left = epoch - epoch_now();
    if left <= 0.0 {
        return false;
    }
    std::thread::sleep(Duration::from_secs_f64(left));
    true
}

// ---------------------------------------------------------------------------------------------
// The wrapper and the daemon

/// `agent-run start -d ARGS... ID -- fixture TREE...`, its `ready` line and its wrapper pid,
/// pinned (the leader, every member and the wrapper) and checked against the record.
struct DetachedRun {
    ready: Ready,
    pinned: Pinned,
    wrapper_pid: i32,
    wrapper: Pinned,
}

fn start_detached(root: &TestRoot, id: &str, opts: &[&str], tree: &[&str]) -> DetachedRun {
    let fixture = fixture_bin();
    let mut cmd = root.cmd();
    cmd.args(["start", "-d"])
        .args(opts)
        .args([id, "--"])
        .arg(&fixture)
        .args(tree);
    let what = format!("{cmd:?}");
    let out = run_with_timeout(&mut cmd, LONG);
    assert_eq!(
        exit_code(&out.status),
        0,
        "{}\n{}",
        describe_output(&what, &out),
        diagnostics(root, id)
    );
    let line: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "start -d printed no JSON line ({e})\n{}",
            describe_output(&what, &out)
        )
    });
    assert_eq!(line["state"], "running", "{}", describe_output(&what, &out));
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), LONG);
    let pinned = Pinned::new(&ready.all_pids());
    let st = root.status(id);
    let wrapper_pid = st["wrapper_pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("no wrapper_pid\n{}", diagnostics(root, id)))
        as i32;
    let wrapper = Pinned::new(&[wrapper_pid]);
    // The pidfd is open: check that it pins the recorded wrapper, not a reused pid.
    let ticks = proc_stat(wrapper_pid).map(|s| s.4);
    assert_eq!(
        ticks,
        st["wrapper_start_ticks"].as_u64(),
        "wrapper {wrapper_pid} is not the recorded one\n{}",
        diagnostics(root, id)
    );
    assert_eq!(ready.pid, st["pid"].as_i64().unwrap_or_default() as i32);
    DetachedRun {
        ready,
        pinned,
        wrapper_pid,
        wrapper,
    }
}

/// The `agent-run-watchdog` daemon, with stderr captured. Killed and reaped on drop if the test
/// did not stop it.
struct Watchdog {
    proc: Option<Spawned>,
}

impl Watchdog {
    /// Starts the daemon on the test's root and waits until it is watching.
    fn start(root: &TestRoot, args: &[&str]) -> Watchdog {
        let proc = Spawned::spawn(root.watchdog_cmd().args(args));
        let dog = Watchdog { proc: Some(proc) };
        wait_until_dbg("the watchdog to start watching", LONG, || {
            let err = dog.stderr();
            if err.contains("watching ") {
                Ok(())
            } else {
                Err(err)
            }
        });
        dog
    }

    fn stderr(&self) -> String {
        self.proc.as_ref().map_or_else(String::new, |p| {
            String::from_utf8_lossy(&p.stderr_so_far()).into_owned()
        })
    }

    fn still_running(&mut self) -> bool {
        self.proc
            .as_mut()
            .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)))
    }

    fn signal(&self, sig: i32) {
        if let Some(p) = &self.proc {
            p.signal(sig);
        }
    }

    /// SIGTERM, then wait for it to exit; panics unless it exits 0.
    fn terminate(self, timeout: Duration) -> Output {
        self.signal(libc::SIGTERM);
        self.wait_exit(timeout)
    }

    /// Waits for the daemon to exit (after a SIGTERM already sent); panics unless it exits 0.
    fn wait_exit(mut self, timeout: Duration) -> Output {
        let proc = self.proc.take().expect("the watchdog was already stopped");
        let what = proc.what.clone();
        let out = proc.finish(timeout);
        assert_eq!(
            exit_code(&out.status),
            0,
            "the watchdog should exit 0 on SIGTERM\n{}",
            describe_output(&what, &out)
        );
        out
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The wrapper's own lease

#[test]
fn a_two_second_lease_without_renewal_cancels_the_run_and_exits_124_with_the_tree_gone() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "wd-lease-unrenewed";
    let fixture = fixture_bin().display().to_string();
    let started = Instant::now();
    let wrapper = Spawned::wrapper(
        &root,
        &[
            "start",
            "--lease",
            "2s",
            id,
            "--",
            &fixture,
            "tree",
            "--children",
            "2",
            "--grandchildren",
        ],
    );
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), LONG);
    let pinned = Pinned::new(&ready.all_pids());
    assert_eq!(ready.members.len(), 4, "{ready:?}");
    let what = wrapper.what.clone();
    let out = wrapper.finish(LONG);
    let elapsed = started.elapsed();
    assert_eq!(
        exit_code(&out.status),
        124,
        "{}\n{}",
        describe_output(&what, &out),
        diagnostics(&root, id)
    );
    let st = root.status(id);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &pinned, Duration::from_secs(10));
    assert_eq!(session_members(ready.sid), Vec::<i32>::new());
    assert!(
        elapsed >= Duration::from_secs(2),
        "the run ended after {elapsed:?}, before its 2 s lease\n{}",
        diagnostics(&root, id)
    );
    report_lateness(&root, id, "foreground, 2 s, no renewal");
}

#[test]
fn renewals_every_700_ms_keep_a_two_second_lease_alive_past_four_seconds_then_it_expires() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "wd-lease-renewed";
    let fixture = fixture_bin().display().to_string();
    let started = Instant::now();
    let wrapper = Spawned::wrapper(
        &root,
        &[
            "start",
            "--lease",
            "2s",
            id,
            "--",
            &fixture,
            "tree",
            "--children",
            "2",
            "--grandchildren",
        ],
    );
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), LONG);
    let pinned = Pinned::new(&ready.all_pids());

    // The scenario: a controller renewing every 0.7 s. Sleeping between renewals is the point.
    let mut renewals = 0;
    while started.elapsed() < Duration::from_millis(4300) {
        std::thread::sleep(Duration::from_millis(700));
        let mut cmd = root.cmd();
        cmd.args(["renew", id]);
        let what = format!("{cmd:?}");
        let out = run_with_timeout(&mut cmd, LONG);
        assert_eq!(
            exit_code(&out.status),
            0,
            "renewal {renewals} failed\n{}\n{}",
            describe_output(&what, &out),
            diagnostics(&root, id)
        );
        renewals += 1;
    }
    let alive_at = started.elapsed();
    let st = root.status(id);
    assert_eq!(
        st["state"],
        "running",
        "after {alive_at:?} and {renewals} renewals the run should still be running\n{}",
        diagnostics(&root, id)
    );
    assert_eq!(
        pinned.alive(),
        ready.all_pids(),
        "after {alive_at:?} and {renewals} renewals every process should be alive\n{}",
        diagnostics(&root, id)
    );
    assert!(alive_at > Duration::from_secs(4));

    // Renewals end: the last deadline holds.
    let renewals_ended = epoch_now();
    let what = wrapper.what.clone();
    let out = wrapper.finish(LONG);
    assert_eq!(
        exit_code(&out.status),
        124,
        "{}\n{}",
        describe_output(&what, &out),
        diagnostics(&root, id)
    );
    let st = root.status(id);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &pinned, Duration::from_secs(10));
    let ended = epoch_field(&root, id, &st, "ended_at");
    assert!(
        ended >= renewals_ended + 1.0,
        "the run ended {:.3} s after the last renewal, well before its 2 s lease\n{}",
        ended - renewals_ended,
        diagnostics(&root, id)
    );
    eprintln!(
        "renewed lease: {renewals} renewals, alive at {alive_at:?}, ended {:.3} s after the last",
        ended - renewals_ended
    );
    report_lateness(&root, id, "foreground, 2 s, after renewals");
}

#[test]
fn the_wrappers_own_lease_is_enforced_on_time_for_several_detached_runs() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let ids = ["wd-lateness-1", "wd-lateness-2", "wd-lateness-3"];
    let runs: Vec<DetachedRun> = ids
        .iter()
        .map(|id| start_detached(&root, id, &["--lease", "1s"], &["tree", "--children", "1"]))
        .collect();
    let mut figures = Vec::new();
    for (id, run) in ids.iter().zip(&runs) {
        let st = root.wait_final(id, LONG);
        assert_outcome(&root, id, &st, "cancelled", "lease_expired");
        assert_all_gone(&root, id, &run.pinned, Duration::from_secs(10));
        assert_all_gone(&root, id, &run.wrapper, Duration::from_secs(10));
        figures.push(report_lateness(&root, id, "detached, 1 s"));
    }
    eprintln!("lease lateness figures (noticed ms, final ms): {figures:?}");
}

// ---------------------------------------------------------------------------------------------
// The daemon takes over from a wrapper that is gone or stuck

#[test]
fn after_kill_9_of_the_wrapper_the_watchdog_stops_the_leased_workload_at_the_deadline() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "wd-killed-wrapper-leased";
    let dog = Watchdog::start(&root, &[]);
    let run = start_detached(
        &root,
        id,
        &["--lease", "2s"],
        &["tree", "--children", "2", "--grandchildren"],
    );
    let deadline = lease_deadline(&root, id);
    run.wrapper
        .signal(run.wrapper_pid, libc::SIGKILL)
        .unwrap_or_else(|e| panic!("cannot kill the wrapper: {e}\n{}", diagnostics(&root, id)));
    assert_all_gone(&root, id, &run.wrapper, Duration::from_secs(10));

    // Shortly before the deadline, nothing of the run has been touched.
    if sleep_until_epoch(deadline - 0.3) {
        assert_eq!(
            run.pinned.alive(),
            run.ready.all_pids(),
            "the watchdog stopped the run before its lease deadline\n{}\n--- watchdog\n{}",
            diagnostics(&root, id),
            dog.stderr()
        );
        assert_eq!(root.status(id)["state"], "running");
    } else {
        eprintln!("too slow to check the run before its deadline; checking ended_at only");
    }

    let st = root.wait_final(id, LONG);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &run.pinned, Duration::from_secs(10));
    let ended = epoch_field(&root, id, &st, "ended_at");
    assert!(
        ended >= deadline - 0.001,
        "the watchdog ended the run {:.3} s before its deadline\n{}",
        deadline - ended,
        diagnostics(&root, id)
    );
    assert!(
        signal_events(&root, id)
            .iter()
            .any(|e| e["by"] == "watchdog"),
        "the watchdog journalled no signal\n{}",
        diagnostics(&root, id)
    );
    eprintln!(
        "watchdog lease lateness after kill -9 of the wrapper: final record {:+.0} ms",
        (ended - deadline) * 1000.0
    );
    dog.terminate(LONG);
}

#[test]
fn after_kill_9_of_the_wrapper_of_a_run_without_lease_the_watchdog_stops_it_after_the_orphan_grace()
{
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "wd-killed-wrapper-unleased";
    let dog = Watchdog::start(&root, &["--orphan-grace", "2s"]);
    let run = start_detached(
        &root,
        id,
        &[],
        &["tree", "--children", "2", "--grandchildren"],
    );
    let killed_at = epoch_now();
    run.wrapper
        .signal(run.wrapper_pid, libc::SIGKILL)
        .unwrap_or_else(|e| panic!("cannot kill the wrapper: {e}\n{}", diagnostics(&root, id)));
    assert_all_gone(&root, id, &run.wrapper, Duration::from_secs(10));

    if sleep_until_epoch(killed_at + 1.5) {
        assert_eq!(
            run.pinned.alive(),
            run.ready.all_pids(),
            "the watchdog stopped the run before the orphan grace\n{}\n--- watchdog\n{}",
            diagnostics(&root, id),
            dog.stderr()
        );
    }

    let st = root.wait_final(id, LONG);
    assert_outcome(&root, id, &st, "cancelled", "wrapper_lost");
    assert_all_gone(&root, id, &run.pinned, Duration::from_secs(10));
    let ended = epoch_field(&root, id, &st, "ended_at");
    assert!(
        ended >= killed_at + 2.0 - 0.001,
        "the run was stopped {:.3} s after its wrapper died, before the 2 s orphan grace\n{}",
        ended - killed_at,
        diagnostics(&root, id)
    );
    eprintln!(
        "orphan grace 2 s: final record {:.3} s after kill -9 of the wrapper",
        ended - killed_at
    );
    dog.terminate(LONG);
}

#[test]
fn a_sigstopped_wrapper_past_its_lease_is_taken_over_and_the_run_is_cancelled() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "wd-stopped-wrapper";
    let dog = Watchdog::start(&root, &["--slack", "1s"]);
    let run = start_detached(
        &root,
        id,
        &["--lease", "1s", "--grace", "1s"],
        &["tree", "--children", "1", "--grandchildren"],
    );
    run.wrapper
        .signal(run.wrapper_pid, libc::SIGSTOP)
        .unwrap_or_else(|e| panic!("cannot stop the wrapper: {e}\n{}", diagnostics(&root, id)));
    wait_until("the wrapper to be stopped", LONG, || {
        proc_stat(run.wrapper_pid)
            .filter(|s| s.0 == 'T')
            .map(|_| ())
    });
    let deadline = lease_deadline(&root, id);
    assert_eq!(
        root.status(id)["state"],
        "running",
        "the wrapper acted on its lease before it was stopped: the scenario did not happen\n{}",
        diagnostics(&root, id)
    );

    let st = root.wait_final(id, LONG);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &run.pinned, Duration::from_secs(10));
    // The stuck wrapper was killed by the watchdog (the Pinned drop would kill it otherwise).
    assert_all_gone(&root, id, &run.wrapper, Duration::from_secs(10));
    let ended = epoch_field(&root, id, &st, "ended_at");
    let watchdog_signals: Vec<Value> = signal_events(&root, id)
        .into_iter()
        .filter(|e| e["by"] == "watchdog")
        .collect();
    assert!(
        !watchdog_signals.is_empty(),
        "the watchdog journalled no signal\n{}",
        diagnostics(&root, id)
    );
    eprintln!(
        "stopped wrapper: lease deadline + grace 1 s + slack 1 s; final record {:.3} s after the \
         deadline",
        ended - deadline
    );
    assert!(
        ended >= deadline + 2.0 - 0.001,
        "the watchdog stepped in {:.3} s after the deadline, before grace + slack\n{}",
        ended - deadline,
        diagnostics(&root, id)
    );
    dog.terminate(LONG);
}

#[test]
fn sigterm_to_the_watchdog_mid_stop_lets_the_stop_finish_then_exits_0() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _r = open_root(&root);
    let id = "wd-sigterm-mid-stop";
    let dir = make_run_dir(&root, id);
    let mut children = Reaper::default();
    children.push(spawn_in_session(
        &STUBBORN_TREE,
        Some((id, &dir)),
        Some(&dir.join("stdout.log")),
    ));
    let ready = wait_ready(&dir.join("stdout.log"), LONG);
    let pinned = Pinned::new(&ready.all_pids());
    let mut st = running_record(id, ready.pid, &procfs::boot_id());
    st.grace_ms = Some(3000);
    write_record(&dir, &st);
    write_deadline(&dir, epoch_now() - 0.5, 1.0);

    let mut dog = Watchdog::start(&root, &[]);
    let stop_began = wait_until_dbg("the watchdog's stop_begin", LONG, || {
        let events = events_so_far(&root, id);
        events
            .iter()
            .find(|e| e["event"] == "stop_begin" && e["by"] == "watchdog")
            .cloned()
            .ok_or_else(|| format!("{} events; watchdog: {}", events.len(), dog.stderr()))
    });
    dog.signal(libc::SIGTERM);
    assert!(
        dog.still_running(),
        "the watchdog exited at SIGTERM with a stop in flight\n{}",
        diagnostics(&root, id)
    );
    let out = dog.wait_exit(LONG);
    let exited = epoch_now();
    let err = String::from_utf8_lossy(&out.stderr);

    // The daemon exited after the stop: the record is final now, not later.
    let st = root.status(id);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &pinned, Duration::from_secs(1));
    let cleanup = cleanup_of(&root, id, &st);
    assert!(
        cleanup.signals.contains(&"KILL".to_string()) && cleanup.duration_ms >= 3000,
        "a stubborn run should be killed at its 3 s grace: {cleanup:?}\n{}",
        diagnostics(&root, id)
    );
    let ended = epoch_field(&root, id, &st, "ended_at");
    assert!(
        ended <= exited,
        "the record was finalised after the daemon exited"
    );
    assert!(
        !err.contains("still in flight"),
        "the watchdog gave up on the stop:\n{err}\n{}",
        diagnostics(&root, id)
    );
    eprintln!(
        "SIGTERM mid-stop: stop began {}, record final at {}, daemon exited {:.3} s later",
        stop_began["ts"],
        st["ended_at"],
        exited - ended
    );
}

// ---------------------------------------------------------------------------------------------
// Records from an earlier boot and orphans without processes

#[test]
fn a_record_from_an_earlier_boot_becomes_unknown_and_the_process_it_names_is_not_signalled() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _r = open_root(&root);
    let id = "wd-rebooted-binary";
    let dir = make_run_dir(&root, id);
    let mut children = Reaper::default();
    // An unrelated process of this boot that happens to have the pid the old record names.
    let pid = children.push(spawn_in_session(&["sleep-ms", "60000"], None, None));
    let unrelated = Pinned::new(&[pid]);
    let mut st = running_record(id, pid, FORGED_BOOT_ID);
    st.wrapper_pid = Some(dead_process().0);
    write_record(&dir, &st);

    let mut cmd = root.watchdog_cmd();
    cmd.arg("--once");
    let what = format!("{cmd:?}");
    let out = run_with_timeout(&mut cmd, LONG);
    assert_eq!(
        exit_code(&out.status),
        0,
        "{}\n{}",
        describe_output(&what, &out),
        diagnostics(&root, id)
    );
    let st = root.status(id);
    assert_outcome(&root, id, &st, "unknown", "host_rebooted");
    assert_eq!(
        unrelated.alive(),
        vec![pid],
        "the watchdog killed a process of this boot named by an old record\n{}",
        diagnostics(&root, id)
    );
    assert_eq!(
        signal_events(&root, id),
        Vec::<Value>::new(),
        "nothing may be signalled for a record of another boot\n{}",
        diagnostics(&root, id)
    );
}

#[test]
fn in_process_run_once_marks_a_record_from_an_earlier_boot_unknown_without_signalling() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let r = open_root(&root);
    // One old record names a live process of this boot (unrelated: the pid was reused), the
    // other names nothing alive.
    let id = "wd-rebooted-inproc";
    let empty_id = "wd-rebooted-inproc-empty";
    let dir = make_run_dir(&root, id);
    let empty_dir = make_run_dir(&root, empty_id);
    let mut children = Reaper::default();
    let pid = children.push(spawn_in_session(&["sleep-ms", "60000"], None, None));
    let unrelated = Pinned::new(&[pid]);
    let mut st = running_record(id, pid, FORGED_BOOT_ID);
    st.wrapper_pid = Some(dead_process().0);
    write_record(&dir, &st);
    write_deadline(&dir, epoch_now() - 10.0, 1.0);
    let (dead, ticks) = dead_process();
    write_record(
        &empty_dir,
        &record_with(empty_id, dead, dead, dead, ticks, FORGED_BOOT_ID),
    );

    let mut lines = run_once(&r, &policy(Duration::from_secs(1)));
    lines.sort();
    assert_eq!(lines.len(), 2, "{lines:?}\n{}", diagnostics(&root, id));
    assert!(
        lines.iter().all(|l| l.contains("from an earlier boot")),
        "{lines:?}"
    );
    for id in [id, empty_id] {
        let st = root.status(id);
        assert_outcome(&root, id, &st, "unknown", "host_rebooted");
        assert_eq!(signal_events(&root, id), Vec::<Value>::new());
        assert!(st["ended_at"].is_string(), "{}", diagnostics(&root, id));
    }
    assert_eq!(unrelated.alive(), vec![pid], "{}", diagnostics(&root, id));

    // A second pass finds nothing to do: a final record is never touched again.
    let before = fs::read(dir.join("status.json")).unwrap();
    assert_eq!(
        run_once(&r, &policy(Duration::from_secs(1))),
        Vec::<String>::new()
    );
    assert_eq!(fs::read(dir.join("status.json")).unwrap(), before);
}

#[test]
fn in_process_run_once_marks_an_orphan_without_processes_unknown_wrapper_lost() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let r = open_root(&root);
    let id = "wd-orphan-empty-inproc";
    let dir = make_run_dir(&root, id);
    let (pid, ticks) = dead_process();
    let mut st = record_with(id, pid, pid, pid, ticks, &procfs::boot_id());
    st.wrapper_pid = Some(dead_process().0);
    write_record(&dir, &st);

    let started = Instant::now();
    let lines = run_once(&r, &policy(Duration::from_secs(1)));
    let took = started.elapsed();
    assert_eq!(lines.len(), 1, "{lines:?}\n{}", diagnostics(&root, id));
    let st = root.status(id);
    assert_outcome(&root, id, &st, "unknown", "wrapper_lost");
    assert_eq!(signal_events(&root, id), Vec::<Value>::new());
    assert!(st["ended_at"].is_string(), "{}", diagnostics(&root, id));
    eprintln!("orphan without processes reconciled in {took:?}");
}

#[test]
fn in_process_run_once_stops_an_orphan_whose_lease_expired_and_cancels_it() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let r = open_root(&root);
    let id = "wd-orphan-leased-inproc";
    let dir = make_run_dir(&root, id);
    let mut children = Reaper::default();
    children.push(spawn_in_session(
        &["tree", "--children", "2", "--grandchildren"],
        Some((id, &dir)),
        Some(&dir.join("stdout.log")),
    ));
    let ready = wait_ready(&dir.join("stdout.log"), LONG);
    let pinned = Pinned::new(&ready.all_pids());
    write_record(&dir, &running_record(id, ready.pid, &procfs::boot_id()));
    write_deadline(&dir, epoch_now() - 0.2, 1.0);

    let lines = run_once(&r, &policy(Duration::from_secs(1)));
    assert_eq!(lines.len(), 1, "{lines:?}\n{}", diagnostics(&root, id));
    // run_once waits for the stops it started: the record is final when it returns.
    let st = root.status(id);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &pinned, Duration::from_secs(1));
    let cleanup = cleanup_of(&root, id, &st);
    assert!(
        cleanup.signals.first().map(String::as_str) == Some("TERM")
            && !cleanup.signals.contains(&"KILL".to_string()),
        "a cooperative tree goes at TERM: {cleanup:?}\n{}",
        diagnostics(&root, id)
    );
    assert!(
        signal_events(&root, id)
            .iter()
            .all(|e| e["by"] == "watchdog"),
        "{}",
        diagnostics(&root, id)
    );
}

#[test]
fn in_process_run_once_leaves_a_live_wrapper_alone_until_lease_plus_grace_plus_slack() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let r = open_root(&root);
    let id = "wd-live-wrapper-inproc";
    // A real wrapper, alive but doing nothing (SIGSTOPped: stuck).
    let run = start_detached(
        &root,
        id,
        &["--lease", "1h", "--grace", "1s"],
        &["tree", "--children", "1"],
    );
    let dir = root.run_dir(id);
    let wrapper = run.wrapper_pid;
    run.wrapper
        .signal(wrapper, libc::SIGSTOP)
        .expect("SIGSTOP the wrapper");
    wait_until_dbg("the wrapper to be stopped", LONG, || {
        match proc_stat(wrapper) {
            Some(s) if s.0 == 'T' => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let mut everyone = vec![wrapper];
    everyone.extend(run.ready.all_pids());
    let pinned = Pinned::new(&everyone);
    // Expired, but within grace (1 s) + slack (5 s): the wrapper's business.
    write_deadline(&dir, epoch_now() - 0.5, 1.0);
    let lines = run_once(&r, &policy(Duration::from_secs(5)));
    assert_eq!(lines, Vec::<String>::new(), "{}", diagnostics(&root, id));
    assert_eq!(root.status(id)["state"], "running");
    assert_eq!(
        pinned.alive().len(),
        everyone.len(),
        "{}",
        diagnostics(&root, id)
    );

    // Past deadline + grace + slack: the watchdog steps in, wrapper and workload.
    write_deadline(&dir, epoch_now() - 10.0, 1.0);
    let lines = run_once(&r, &policy(Duration::from_secs(5)));
    assert_eq!(lines.len(), 1, "{lines:?}\n{}", diagnostics(&root, id));
    let st = root.status(id);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &pinned, Duration::from_secs(5));
    assert!(
        signal_events(&root, id)
            .iter()
            .any(|e| e["target"] == format!("pid:{wrapper}").as_str()),
        "the wrapper should be signalled, by name, in the journal\n{}",
        diagnostics(&root, id)
    );
}

// ---------------------------------------------------------------------------------------------
// Corrupt run dirs

/// What the corrupt-dirs tests put in a root beside the valid run: each name the watchdog must
/// skip with one log line, and the records it must not touch.
struct CorruptSet {
    skipped: Vec<String>,
    truncated: (PathBuf, Vec<u8>),
    untouched_records: Vec<PathBuf>,
}

fn populate_corrupt(root: &TestRoot, prefix: &str) -> CorruptSet {
    let boot = procfs::boot_id();
    let (dead, ticks) = dead_process();
    let mut skipped = Vec::new();
    let mut untouched = Vec::new();

    // A status.json cut in half.
    let trunc_id = format!("{prefix}-truncated");
    let trunc_dir = make_run_dir(root, &trunc_id);
    let text = record_with(&trunc_id, dead, dead, dead, ticks, &boot).to_json();
    let half = text.as_bytes()[..text.len() / 2].to_vec();
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(trunc_dir.join("status.json"))
        .and_then(|mut f| io::Write::write_all(&mut f, &half))
        .expect("cannot write a truncated status.json");
    skipped.push(trunc_id);

    // A symlinked run dir, pointing at a valid record of an orphan (which would become
    // `unknown` if the watchdog followed the link).
    let link_id = format!("{prefix}-symlinked");
    let elsewhere = root.dir.path().join("elsewhere");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .unwrap();
    write_record(
        &elsewhere,
        &record_with(&link_id, dead, dead, dead, ticks, &boot),
    );
    std::os::unix::fs::symlink(&elsewhere, root.run_dir(&link_id)).unwrap();
    untouched.push(elsewhere);
    skipped.push(link_id);

    // A run dir owned by another user.
    if shared_sys::geteuid() == 0 {
        let foreign_id = format!("{prefix}-foreign");
        let foreign = make_run_dir(root, &foreign_id);
        write_record(
            &foreign,
            &record_with(&foreign_id, dead, dead, dead, ticks, &boot),
        );
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        untouched.push(foreign);
        skipped.push(foreign_id);
    } else {
        eprintln!("not root: no run dir owned by another uid in this test");
    }

    // Junk in the root: a file with a valid run-id name, and one with an invalid name.
    fs::write(
        root.root().join(format!("{prefix}-junk.bin")),
        b"\x00\xffjunk\x7f{\"state\":",
    )
    .unwrap();
    skipped.push(format!("{prefix}-junk.bin"));
    fs::write(root.root().join("not a run id!"), b"junk").unwrap();
    skipped.push("not a run id!".into());

    CorruptSet {
        skipped,
        truncated: (trunc_dir.join("status.json"), half),
        untouched_records: untouched,
    }
}

/// Each skipped name is logged exactly once; the corrupt file and the foreign records are
/// exactly as they were.
fn assert_skipped_once(root: &TestRoot, id: &str, set: &CorruptSet, stderr: &str) {
    for name in &set.skipped {
        let n = stderr
            .lines()
            .filter(|l| l.contains(&format!("{name}: skipped")))
            .count();
        assert_eq!(
            n,
            1,
            "expected one 'skipped' line for {name:?}, got {n}\n--- watchdog\n{stderr}\n{}",
            diagnostics(root, id)
        );
    }
    assert_eq!(fs::read(&set.truncated.0).unwrap(), set.truncated.1);
    for dir in &set.untouched_records {
        let text = fs::read_to_string(dir.join("status.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["state"],
            "running",
            "the watchdog acted on {}\n--- watchdog\n{stderr}",
            dir.display()
        );
        assert!(!dir.join("events.jsonl").exists(), "{}", dir.display());
    }
}

#[test]
fn the_daemon_skips_corrupt_symlinked_and_foreign_dirs_with_one_line_each_and_stops_a_due_run() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _r = open_root(&root);
    let set = populate_corrupt(&root, "wd-corrupt-daemon");
    let id = "wd-corrupt-daemon-due";
    let dir = make_run_dir(&root, id);
    let mut children = Reaper::default();
    let pid = children.push(spawn_in_session(
        &["sleep-ms", "600000"],
        Some((id, &dir)),
        None,
    ));
    let pinned = Pinned::new(&[pid]);
    write_record(&dir, &running_record(id, pid, &procfs::boot_id()));
    write_deadline(&dir, epoch_now() - 1.0, 1.0);

    let mut dog = Watchdog::start(&root, &["--scan-interval", "1s"]);
    let dog_started = Instant::now();
    let st = root.wait_final(id, LONG);
    assert_outcome(&root, id, &st, "cancelled", "lease_expired");
    assert_all_gone(&root, id, &pinned, Duration::from_secs(10));
    // Let the daemon rescan the corrupt dirs a few times (1 s apart): it must neither crash
    // nor log them again nor act on them. Waiting for nothing to happen takes time by nature.
    std::thread::sleep(Duration::from_millis(3500).saturating_sub(dog_started.elapsed()));
    assert!(dog.still_running(), "the watchdog died:\n{}", dog.stderr());
    let out = dog.terminate(LONG);
    assert_skipped_once(&root, id, &set, &String::from_utf8_lossy(&out.stderr));
}

#[test]
fn watchdog_once_skips_corrupt_dirs_with_one_line_each_and_reconciles_a_due_run() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _r = open_root(&root);
    let set = populate_corrupt(&root, "wd-corrupt-once");
    let id = "wd-corrupt-once-due";
    let dir = make_run_dir(&root, id);
    let (pid, ticks) = dead_process();
    write_record(
        &dir,
        &record_with(id, pid, pid, pid, ticks, &procfs::boot_id()),
    );

    let mut cmd = root.watchdog_cmd();
    cmd.arg("--once");
    let what = format!("{cmd:?}");
    let out = run_with_timeout(&mut cmd, LONG);
    assert_eq!(
        exit_code(&out.status),
        0,
        "{}\n{}",
        describe_output(&what, &out),
        diagnostics(&root, id)
    );
    let st = root.status(id);
    assert_outcome(&root, id, &st, "unknown", "wrapper_lost");
    assert_skipped_once(&root, id, &set, &String::from_utf8_lossy(&out.stderr));
}

// ---------------------------------------------------------------------------------------------
// A thousand run dirs, two hundred leases expiring together

/// One of the two hundred leased orphans.
struct LeasedOrphan {
    id: String,
    stubborn: bool,
}

#[test]
fn a_thousand_run_dirs_with_two_hundred_leases_expiring_together_are_all_stopped_in_parallel() {
    let _cpu = exclusive_cpu();
    let root = TestRoot::new();
    let _r = open_root(&root);
    let boot = procfs::boot_id();
    let (dead, ticks) = dead_process();

    // 800 finished runs: the watchdog must read past them and touch none.
    let finals = [
        (State::Finished, None),
        (State::Cancelled, Some("signal:TERM")),
        (State::Unknown, Some("wrapper_lost")),
        (State::LaunchFailed, None),
    ];
    let mut final_ids = Vec::new();
    for i in 0..800 {
        let id = format!("wd-many-final-{i:03}");
        let dir = make_run_dir(&root, &id);
        let mut st = record_with(&id, dead, dead, dead, ticks, &boot);
        let (state, reason) = finals[i % finals.len()];
        st.state = state;
        st.reason = reason.map(str::to_string);
        st.exit_code = (state == State::Finished).then_some(0);
        st.ended_at = Some(rfc3339_now());
        write_record(&dir, &st);
        final_ids.push(id);
    }

    // 200 orphans with real processes; 5 ignore TERM and HUP.
    let mut children = Reaper::default();
    let mut orphans = Vec::new();
    let mut leaders = Vec::new();
    for i in 0..200 {
        let id = format!("wd-many-leased-{i:03}");
        let dir = make_run_dir(&root, &id);
        let stubborn = i % 40 == 13;
        let pid = if stubborn {
            children.push(spawn_in_session(
                &STUBBORN_TREE,
                Some((&id, &dir)),
                Some(&dir.join("stdout.log")),
            ))
        } else {
            children.push(spawn_in_session(
                &["sleep-ms", "600000"],
                Some((&id, &dir)),
                None,
            ))
        };
        leaders.push(pid);
        orphans.push(LeasedOrphan { id, stubborn });
    }
    let mut all_pids = leaders.clone();
    for o in orphans.iter().filter(|o| o.stubborn) {
        let ready = wait_ready(&root.run_dir(&o.id).join("stdout.log"), LONG);
        all_pids.extend(ready.members);
    }
    let pinned = Pinned::new(&all_pids);
    assert_eq!(pinned.alive().len(), 205, "every process should be up");
    for (o, &pid) in orphans.iter().zip(&leaders) {
        let dir = root.run_dir(&o.id);
        let mut st = running_record(&o.id, pid, &boot);
        // The default grace: cooperative runs must finish far inside it, whatever the
        // stubborn ones do (2 slow cores, a debug build, 200 stops at once).
        st.grace_ms = Some(5000);
        write_record(&dir, &st);
    }
    let deadline = epoch_now() + 1.5;
    for o in &orphans {
        write_deadline(&root.run_dir(&o.id), deadline, 1.5);
    }

    let started = Instant::now();
    let dog = Watchdog::start(&root, &[]);
    let scanned_by = epoch_now();
    if scanned_by < deadline - 0.2 {
        assert_eq!(
            pinned.alive().len(),
            205,
            "processes were stopped before the deadline\n--- watchdog\n{}",
            dog.stderr()
        );
    }
    let gone_after = pinned
        .wait_all_gone(Duration::from_secs(60))
        .unwrap_or_else(|alive| {
            panic!(
                "{} processes still alive: {alive:?}\n--- watchdog\n{}",
                alive.len(),
                dog.stderr()
            )
        });
    let mut pending: Vec<&LeasedOrphan> = orphans.iter().collect();
    let mut records = BTreeMap::new();
    wait_until_dbg("every leased record final", LONG, || {
        pending.retain(|o| match root.try_status(&o.id) {
            Ok(st) if st["state"] != "running" && st["state"] != "cancelling" => {
                records.insert(o.id.clone(), st);
                false
            }
            _ => true,
        });
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending.iter().map(|o| o.id.clone()).collect::<Vec<_>>())
        }
    });
    let wall = started.elapsed();

    let (mut coop_max, mut stubborn_ms, mut last_end) = (0u64, Vec::new(), 0f64);
    let mut acted_ms = Vec::new();
    for o in &orphans {
        let st = &records[&o.id];
        // When the watchdog took the run over, relative to the deadline.
        if let Some(t) = events_so_far(&root, &o.id)
            .iter()
            .find(|e| e["by"] == "watchdog")
            .and_then(|e| e["ts"].as_str().and_then(parse_rfc3339))
        {
            acted_ms.push(((t - deadline) * 1000.0) as i64);
        }
        assert_outcome(&root, &o.id, st, "cancelled", "lease_expired");
        let ended = epoch_field(&root, &o.id, st, "ended_at");
        assert!(
            ended >= deadline - 0.001,
            "run {} ended {:.3} s before its deadline\n{}",
            o.id,
            deadline - ended,
            diagnostics(&root, &o.id)
        );
        last_end = last_end.max(ended);
        let cleanup = cleanup_of(&root, &o.id, st);
        if o.stubborn {
            assert!(
                cleanup.signals.contains(&"KILL".to_string()) && cleanup.duration_ms >= 5000,
                "stubborn run {} should be killed at its 2 s grace: {cleanup:?}\n{}",
                o.id,
                diagnostics(&root, &o.id)
            );
            stubborn_ms.push(cleanup.duration_ms);
        } else {
            assert!(
                !cleanup.signals.contains(&"KILL".to_string()) && cleanup.duration_ms < 2500,
                "cooperative run {} waited: {cleanup:?}\n{}",
                o.id,
                diagnostics(&root, &o.id)
            );
            coop_max = coop_max.max(cleanup.duration_ms);
        }
    }
    for id in &final_ids {
        assert!(
            !root.run_dir(id).join("events.jsonl").exists(),
            "the watchdog acted on a final run\n{}",
            diagnostics(&root, id)
        );
    }
    let spread = last_end - deadline;
    acted_ms.sort_unstable();
    if !acted_ms.is_empty() {
        eprintln!(
            "1000 run dirs: the watchdog took the leased runs over at +{} ms (first), +{} ms \
             (median), +{} ms (last) after the deadline",
            acted_ms[0],
            acted_ms[acted_ms.len() / 2],
            acted_ms[acted_ms.len() - 1]
        );
    }
    eprintln!(
        "1000 run dirs: all 205 processes gone {gone_after:?} after the daemon started, records \
         final {wall:?} after; last record {spread:.3} s after the deadline; cooperative \
         cleanup max {coop_max} ms; stubborn cleanups {stubborn_ms:?} ms"
    );
    assert!(
        spread < 20.0,
        "the last record was final {spread:.3} s after the deadline\n--- watchdog\n{}",
        dog.stderr()
    );
    dog.terminate(LONG);
}

// ---------------------------------------------------------------------------------------------
// The fast path of a full pass: only a surely final dir is settled without the careful path

/// What the fast path says of `name` in `root`.
fn fast_verdict(root: &TestRoot, name: &str) -> agent_run_watchdog::fast::Fast {
    use agent_run_watchdog::fast::{entries, open_root, Pass};
    let fd = open_root(&root.root()).expect("cannot open the root");
    let ents = entries(&fd).expect("cannot list the root");
    let e = ents
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} is not listed"));
    Pass::new(&fd).classify(e)
}

/// Replace a run's status.json (atomically, as a workload can) with `bytes`.
fn forge_status(dir: &Path, bytes: &[u8]) {
    let tmp = dir.join(".forged.tmp");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, dir.join("status.json")).unwrap();
}

#[test]
fn the_fast_path_settles_only_surely_final_dirs_and_hands_hostile_ones_to_the_careful_path() {
    use agent_run_watchdog::fast::{Fast, MAX_FAST};
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _r = open_root(&root);
    let boot = procfs::boot_id();
    let (dead, ticks) = dead_process();
    let mut finished = record_with("fp-final", dead, dead, dead, ticks, &boot);
    finished.state = State::Finished;
    finished.exit_code = Some(0);
    finished.ended_at = Some(rfc3339_now());
    let final_json = |id: &str| {
        let mut st = finished.clone();
        st.run_id = id.into();
        st.to_json()
    };
    let careful = |id: &str, what: &str| {
        let t = Instant::now();
        assert_eq!(fast_verdict(&root, id), Fast::Careful, "{what}");
        // Never a blocked open or a long read: a FIFO or a huge file costs one failed check.
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: took {:?}",
            t.elapsed()
        );
    };

    // The control: a plain final record of a dead run is final for the fast path.
    let dir = make_run_dir(&root, "fp-final");
    forge_status(&dir, final_json("fp-final").as_bytes());
    assert!(matches!(
        fast_verdict(&root, "fp-final"),
        Fast::Final { .. }
    ));

    // status.json is a FIFO (nobody writes it), a symlink to a final record, a directory.
    let dir = make_run_dir(&root, "fp-fifo");
    assert!(Command::new("mkfifo")
        .arg(dir.join("status.json"))
        .status()
        .unwrap()
        .success());
    careful("fp-fifo", "a FIFO as status.json");
    let dir = make_run_dir(&root, "fp-symlink");
    let elsewhere = root.dir.path().join("fp-elsewhere.json");
    fs::write(&elsewhere, final_json("fp-symlink")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join("status.json")).unwrap();
    careful("fp-symlink", "a symlink as status.json");
    let dir = make_run_dir(&root, "fp-dir");
    fs::create_dir(dir.join("status.json")).unwrap();
    careful("fp-dir", "a directory as status.json");

    // Oversized: a valid final record padded past what the fast path reads; and a 1 GiB file.
    let dir = make_run_dir(&root, "fp-big");
    let mut big = final_json("fp-big");
    big.push_str(&" ".repeat(MAX_FAST as usize + 1));
    forge_status(&dir, big.as_bytes());
    careful("fp-big", "a record larger than the fast path reads");
    let dir = make_run_dir(&root, "fp-huge");
    fs::File::create(dir.join("status.json"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    careful("fp-huge", "a 1 GiB status.json");

    // The run dir itself: a symlink to a final run, a dir open to others.
    std::os::unix::fs::symlink(root.run_dir("fp-final"), root.run_dir("fp-linkdir")).unwrap();
    careful("fp-linkdir", "a symlinked run dir");
    let dir = make_run_dir(&root, "fp-open");
    forge_status(&dir, final_json("fp-open").as_bytes());
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    careful("fp-open", "a run dir open to others");

    // A record that claims `finished` while its wrapper lives and holds the lock, and while
    // the run's cgroup holds its processes: the truth is not final.
    let id = "fp-live";
    let run = start_detached(&root, id, &["--lease", "20s"], &["tree", "--children", "1"]);
    let dir = root.run_dir(id);
    let real = fs::read(dir.join("status.json")).unwrap();
    let mut forged: Value = serde_json::from_slice(&real).unwrap();
    forged["state"] = "finished".into();
    forged["exit_code"] = 0.into();
    forged["ended_at"] = rfc3339_now().into();
    forge_status(
        &dir,
        serde_json::to_string_pretty(&forged).unwrap().as_bytes(),
    );
    careful(
        id,
        "a forged `finished` with a live wrapper holding the lock",
    );
    let in_cgroup = forged["containment"]["mode"] == "cgroup";
    if in_cgroup {
        // The lock's holder hidden (the record names pid 1 as its wrapper): the live cgroup
        // alone keeps the run from the fast path.
        forged["wrapper_pid"] = 1.into();
        forge_status(
            &dir,
            serde_json::to_string_pretty(&forged).unwrap().as_bytes(),
        );
        careful(
            id,
            "a forged `finished` with live processes in the run's cgroup",
        );
    } else {
        eprintln!("the run is not held in a cgroup here: no cgroup case");
    }
    // The real record back; the run is then cancelled the ordinary way, tree and all.
    forge_status(&dir, &real);
    let mut cmd = root.cmd();
    cmd.args(["cancel", id]);
    let out = run_with_timeout(&mut cmd, LONG);
    assert_eq!(exit_code(&out.status), 0, "{}", diagnostics(&root, id));
    assert_all_gone(&root, id, &run.pinned, Duration::from_secs(10));
    assert_all_gone(&root, id, &run.wrapper, Duration::from_secs(10));
    if in_cgroup {
        // Final for real, wrapper gone, cgroup removed: now the fast path may settle it.
        let gone_by = Instant::now() + LONG;
        while fast_verdict(&root, id) == Fast::Careful && Instant::now() < gone_by {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(matches!(fast_verdict(&root, id), Fast::Final { .. }));
    }

    // And a whole --once pass over all of it: the careful path still skips the hostile dirs
    // (one line each) and leaves the final ones alone.
    let mut cmd = root.watchdog_cmd();
    cmd.arg("--once");
    let out = run_with_timeout(&mut cmd, LONG);
    assert_eq!(
        exit_code(&out.status),
        0,
        "{}",
        describe_output("--once", &out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    for name in [
        "fp-fifo",
        "fp-symlink",
        "fp-dir",
        "fp-huge",
        "fp-linkdir",
        "fp-open",
    ] {
        assert_eq!(
            err.lines()
                .filter(|l| l.contains(&format!("{name}: skipped")))
                .count(),
            1,
            "{name}\n{err}"
        );
    }
    assert!(!err.contains("fp-final"), "{err}");
}
