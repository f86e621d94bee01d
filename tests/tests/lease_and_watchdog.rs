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
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_run_shared::id::RunId;
use agent_run_shared::record::{Cleanup, State, Status, SCHEMA};
use agent_run_shared::root::Root;
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::time::{epoch_now, rfc3339_now};
use agent_run_shared::{procfs, sys as shared_sys};
use agent_run_tests::ctx::T;
use agent_run_tests::facts::{ended, private_dir};
use agent_run_tests::hostile::{write_lease, Daemon};
use agent_run_tests::workload::{fx, start_args, DEAF};
use agent_run_tests::{
    ctx, describe_output, ensure, fixture_bin, proc_stat, session_members, wait_ready, Ctx,
    Detached, Pinned, Ready, Reaper, Spawned, TestRoot,
};
use agent_run_watchdog::{run_once, Policy};
use serde_json::{json, Value};

/// A boot id no machine has: the record of a run from "an earlier boot".
const FORGED_BOOT_ID: &str = "00000000-0000-0000-0000-000000000000";

// ---------------------------------------------------------------------------------------------
// CPU sharing: the thousand-run test measures stop durations, so it runs alone; every other
// test of this file may run beside the others (agent_run_tests::facts::{shared_cpu,
// exclusive_cpu}).

// ---------------------------------------------------------------------------------------------
// Processes the test starts itself

/// The fixture with `args` in a new session (the product's own spawn: setsid, clean signals, no
/// inherited descriptor), stdin and stderr on /dev/null, stdout to `stdout` (or /dev/null), and,
/// with `run`, the run's environment marker.
fn spawn_in_session(
    args: &[impl AsRef<std::ffi::OsStr>],
    run: Option<(&str, &Path)>,
    stdout: Option<&Path>,
) -> Child {
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
    shared_sys::spawn_in_new_session(&mut cmd);
    // spawn() returns once exec succeeded, so setsid has happened and the environment is the
    // fixture's.
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"))
}

/// The fixture's `tree` options for a tree that ignores TERM and HUP everywhere.
fn stubborn_tree() -> Vec<String> {
    format!("tree --children 1 {DEAF}")
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The run dir of `c` made, and the fixture with `args` in it (see [`spawn_in_session`]) with
/// its stdout to stdout.log: the dir, the reaper of the fixture, its ready line, its tree pinned.
fn run_tree(c: Ctx, args: &[impl AsRef<std::ffi::OsStr>]) -> (PathBuf, Reaper, Ready, Pinned) {
    let dir = make_run_dir(c.root, c.id);
    let mut children = Reaper::default();
    children.push(spawn_in_session(
        args,
        Some((c.id, &dir)),
        Some(&c.file("stdout.log")),
    ));
    let (ready, pinned) = c.pin_tree();
    (dir, children, ready, pinned)
}

/// The record of `c` is final, `unknown` for `reason`, with an `ended_at`, and nothing was
/// signalled.
fn ended_unsignalled(c: Ctx, reason: &str) {
    let st = c.status();
    c.fields(&st, "the record", ended("unknown", reason));
    c.eq(c.events("signal"), Vec::<Value>::new(), "signal events");
    ensure!(c, st["ended_at"].is_string(), "the record has no ended_at");
}

/// A pid and start time that belonged to a process of this boot that is now gone (reaped).
fn dead_process() -> (i32, u64) {
    let mut child = spawn_in_session(&["sleep-ms", "600000"], None, None);
    let pid = child.id() as i32;
    let ticks = proc_stat(pid).expect("a fresh child has a /proc entry").4;
    child.kill().expect("cannot kill a fresh child");
    child.wait().expect("cannot reap a fresh child");
    (pid, ticks)
}

/// What the records of dead runs are made of: this boot's id, and a process of it that is gone.
struct Dead {
    boot: String,
    pid: i32,
    ticks: u64,
}

impl Dead {
    fn new() -> Dead {
        let (pid, ticks) = dead_process();
        Dead {
            boot: procfs::boot_id(),
            pid,
            ticks,
        }
    }

    /// A `running` record of run `id` whose leader, group and session are the dead process.
    fn record(&self, id: &str) -> Status {
        let pid = self.pid;
        record_with(id, pid, pid, pid, self.ticks, &self.boot)
    }
}

/// `st`, finished with exit 0 now.
fn finished_now(mut st: Status) -> Status {
    st.state = State::Finished;
    st.exit_code = Some(0);
    st.ended_at = Some(rfc3339_now());
    st
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
        pid: Some(pid.into()),
        pgid: Some(pgid.into()),
        sid: Some(sid.into()),
        start_ticks: Some(ticks),
        boot_id: boot_id.to_string(),
        // A wrapper that is gone (no process can have this pid: it is above pid_max), started
        // at boot: the whole identity a record must hold, with the wrapper already dead.
        wrapper_pid: Some(i32::MAX.into()),
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

/// The run root opened for in-process passes, and the checks of run `id` in it.
fn in_process<'a>(root: &'a TestRoot, id: &'a str) -> (Root, Ctx<'a>) {
    (open_root(root), ctx(root, id))
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

/// Writes `st` as the record of the run dir at `dir`, with the library's writer.
fn write_record(dir: &Path, st: &Status) {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let id = RunId::parse(name).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let run_dir =
        RunDir::open(dir, id).unwrap_or_else(|e| panic!("cannot open {}: {e}", dir.display()));
    run_dir
        .write_status(st)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.display()));
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

/// The record of a run held by /proc scans alone whose wrapper was lost, once the watchdog
/// stopped it at its lease: what it found is stopped, but nothing can prove that nothing of it
/// is left (a process that left its session and cleared its environment is not to be found).
fn orphan_stopped() -> Value {
    json!({"state": "unknown", "reason": "unprovable", "proof": "unprovable"})
}

/// The cleanup of a final record.
fn cleanup_of(c: Ctx<'_>, st: &Value) -> Cleanup {
    serde_json::from_value(st["cleanup"].clone())
        .unwrap_or_else(|e| c.fail(format_args!("no usable cleanup ({e}): {}", st["cleanup"])))
}

/// The journal's `signal` events sent by the watchdog.
fn watchdog_signals(c: Ctx<'_>) -> Vec<Value> {
    let signals = c.events("signal").into_iter();
    signals.filter(|e| e["by"] == "watchdog").collect()
}

/// Prints how late the run's own lease was enforced: from lease.json's deadline to the
/// `lease_expired` journal line and to `ended_at`. Not asserted beyond "not early".
fn report_lateness(c: Ctx<'_>, what: &str) -> (f64, f64) {
    let st = c.status();
    let deadline = c.lease_deadline();
    let ended = c.epoch(&st, "ended_at");
    let noticed = c.events("lease_expired").first().map(|e| c.epoch(e, "ts"));
    let noticed_ms = noticed.map_or(f64::NAN, |t| (t - deadline) * 1000.0);
    let ended_ms = (ended - deadline) * 1000.0;
    eprintln!(
        "lease lateness [{what}] run {}: expiry noticed {noticed_ms:+.0} ms, \
         final record {ended_ms:+.0} ms after the deadline",
        c.id
    );
    // Times are written with millisecond precision (truncated): allow that much.
    ensure!(
        c,
        ended >= deadline - 0.001,
        "the run ended {:.3} s before its lease deadline",
        deadline - ended
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

/// `start --detach OPTS ID -- fixture TREE`: the run (its wrapper pinned), the fixture's ready
/// line, and the whole tree pinned.
fn start_tree(c: Ctx<'_>, opts: &str, tree: &str) -> (Detached, Ready, Pinned) {
    let run = c.start_running(opts, &fx(tree));
    let (ready, pinned) = c.pin_tree();
    c.eq(
        ready.pid,
        run.leader,
        "the leader of the ready line and the detach line",
    );
    (run, ready, pinned)
}

/// `start --lease 2s ID -- fixture TREE` in the foreground: when it started, the wrapper, the
/// fixture's ready line, and the whole tree pinned.
fn start_two_second_lease(root: &TestRoot, c: Ctx<'_>) -> (Instant, Spawned, Ready, Pinned) {
    let started = Instant::now();
    let wrapper = Spawned::spawn(root.cmd().args(start_args(
        "--lease 2s",
        c.id,
        &fx("tree --children 2 --grandchildren"),
    )));
    let (ready, pinned) = c.pin_tree();
    (started, wrapper, ready, pinned)
}

/// The `agent-run-watchdog` daemon on the test's root, watching.
fn watchdog(root: &TestRoot, args: &[&str]) -> Daemon {
    Daemon::start(root.watchdog_cmd(), args)
}

// ---------------------------------------------------------------------------------------------
// The wrapper's own lease

#[test]
fn a_two_second_lease_without_renewal_cancels_the_run_and_exits_124_with_the_tree_gone() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "wd-lease-unrenewed");
    let (started, wrapper, ready, pinned) = start_two_second_lease(&root, c);
    c.eq(
        ready.members.len(),
        4,
        format_args!("the tree's members: {ready:?}"),
    );
    let out = c.finish_within(wrapper, T, 124);
    let elapsed = started.elapsed();
    c.record("the record", ended("cancelled", "lease_expired"));
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's tree");
    c.eq(
        session_members(ready.sid),
        Vec::<i32>::new(),
        "processes left in the run's session",
    );
    ensure!(
        c,
        elapsed >= Duration::from_secs(2),
        "the run ended after {elapsed:?}, before its 2 s lease\n{}",
        describe_output("the wrapper", &out)
    );
    report_lateness(c, "foreground, 2 s, no renewal");
}

#[test]
fn renewals_every_700_ms_keep_a_two_second_lease_alive_past_four_seconds_then_it_expires() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "wd-lease-renewed");
    let (started, wrapper, ready, pinned) = start_two_second_lease(&root, c);

    // The scenario: a controller renewing every 0.7 s. Sleeping between renewals is the point.
    let mut renewals = 0;
    while started.elapsed() < Duration::from_millis(4300) {
        std::thread::sleep(Duration::from_millis(700));
        c.ctl(&["renew", c.id], 0);
        renewals += 1;
    }
    let alive_at = started.elapsed();
    c.record(
        &format!("the record after {alive_at:?} and {renewals} renewals"),
        json!({"state": "running"}),
    );
    c.eq(
        pinned.alive(),
        ready.all_pids(),
        format_args!("after {alive_at:?} and {renewals} renewals every process should be alive"),
    );
    ensure!(
        c,
        alive_at > Duration::from_secs(4),
        "the renewals ended after {alive_at:?}"
    );

    // Renewals end: the last deadline holds.
    let renewals_ended = epoch_now();
    c.finish_within(wrapper, T, 124);
    let st = c.status();
    c.fields(&st, "the record", ended("cancelled", "lease_expired"));
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's tree");
    let ended = c.epoch(&st, "ended_at");
    ensure!(
        c,
        ended >= renewals_ended + 1.0,
        "the run ended {:.3} s after the last renewal, well before its 2 s lease",
        ended - renewals_ended
    );
    eprintln!(
        "renewed lease: {renewals} renewals, alive at {alive_at:?}, ended {:.3} s after the last",
        ended - renewals_ended
    );
    report_lateness(c, "foreground, 2 s, after renewals");
}

#[test]
fn the_wrappers_own_lease_is_enforced_on_time_for_several_detached_runs() {
    let root = TestRoot::sharing_cpu();
    let ids = ["wd-lateness-1", "wd-lateness-2", "wd-lateness-3"];
    let runs: Vec<(Detached, Ready, Pinned)> = ids
        .iter()
        .map(|id| start_tree(ctx(&root, id), "--lease 1s", "tree --children 1"))
        .collect();
    let mut figures = Vec::new();
    for (id, (run, _, pinned)) in ids.iter().zip(&runs) {
        let c = ctx(&root, id);
        let st = c.wait_final();
        c.fields(&st, "the record", ended("cancelled", "lease_expired"));
        c.wait_gone_within(pinned, Duration::from_secs(10), "the run's tree");
        c.wait_gone_within(&run.wrapper_pin, Duration::from_secs(10), "the wrapper");
        figures.push(report_lateness(c, "detached, 1 s"));
    }
    eprintln!("lease lateness figures (noticed ms, final ms): {figures:?}");
}

// ---------------------------------------------------------------------------------------------
// The daemon takes over from a wrapper that is gone or stuck

#[test]
fn after_kill_9_of_the_wrapper_the_watchdog_stops_the_leased_workload_at_the_deadline() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "wd-killed-wrapper-leased");
    let dog = watchdog(&root, &[]);
    let (run, ready, pinned) = start_tree(c, "--lease 2s", "tree --children 2 --grandchildren");
    let deadline = c.lease_deadline();
    c.signal(&run.wrapper_pin, run.wrapper, libc::SIGKILL);
    c.wait_gone_within(
        &run.wrapper_pin,
        Duration::from_secs(10),
        "the SIGKILLed wrapper",
    );

    // Shortly before the deadline, nothing of the run has been touched.
    if sleep_until_epoch(deadline - 0.3) {
        c.eq(
            pinned.alive(),
            ready.all_pids(),
            format_args!(
                "the watchdog stopped the run before its lease deadline\n--- watchdog\n{}",
                dog.stderr()
            ),
        );
        c.record("the record", json!({"state": "running"}));
    } else {
        eprintln!("too slow to check the run before its deadline; checking ended_at only");
    }

    let st = c.wait_final();
    c.fields(&st, "the record", ended("cancelled", "lease_expired"));
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's tree");
    let ended = c.epoch(&st, "ended_at");
    ensure!(
        c,
        ended >= deadline - 0.001,
        "the watchdog ended the run {:.3} s before its deadline",
        deadline - ended
    );
    ensure!(
        c,
        !watchdog_signals(c).is_empty(),
        "the watchdog journalled no signal"
    );
    eprintln!(
        "watchdog lease lateness after kill -9 of the wrapper: final record {:+.0} ms",
        (ended - deadline) * 1000.0
    );
    dog.stop_cleanly(c);
}

#[test]
fn after_kill_9_of_the_wrapper_of_a_run_without_lease_the_watchdog_stops_it_after_the_orphan_grace()
{
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "wd-killed-wrapper-unleased");
    let dog = watchdog(&root, &["--orphan-grace", "2s"]);
    let (run, ready, pinned) = start_tree(c, "", "tree --children 2 --grandchildren");
    let killed_at = epoch_now();
    c.signal(&run.wrapper_pin, run.wrapper, libc::SIGKILL);
    c.wait_gone_within(
        &run.wrapper_pin,
        Duration::from_secs(10),
        "the SIGKILLed wrapper",
    );

    if sleep_until_epoch(killed_at + 1.5) {
        c.eq(
            pinned.alive(),
            ready.all_pids(),
            format_args!(
                "the watchdog stopped the run before the orphan grace\n--- watchdog\n{}",
                dog.stderr()
            ),
        );
    }

    let st = c.wait_final();
    c.fields(&st, "the record", ended("cancelled", "wrapper_lost"));
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's tree");
    let ended = c.epoch(&st, "ended_at");
    ensure!(
        c,
        ended >= killed_at + 2.0 - 0.001,
        "the run was stopped {:.3} s after its wrapper died, before the 2 s orphan grace",
        ended - killed_at
    );
    eprintln!(
        "orphan grace 2 s: final record {:.3} s after kill -9 of the wrapper",
        ended - killed_at
    );
    dog.stop_cleanly(c);
}

#[test]
fn a_sigstopped_wrapper_past_its_lease_is_taken_over_and_the_run_is_cancelled() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "wd-stopped-wrapper");
    let dog = watchdog(&root, &["--slack", "1s"]);
    let (run, _, pinned) = start_tree(
        c,
        "--lease 1s --grace 1s",
        "tree --children 1 --grandchildren",
    );
    c.signal(&run.wrapper_pin, run.wrapper, libc::SIGSTOP);
    c.wait("the wrapper to be stopped", || {
        match proc_stat(run.wrapper) {
            Some(s) if s.0 == 'T' => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let deadline = c.lease_deadline();
    c.record(
        "the record once the wrapper is stopped (else the scenario did not happen)",
        json!({"state": "running"}),
    );

    let st = c.wait_final();
    c.fields(&st, "the record", ended("cancelled", "lease_expired"));
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's tree");
    // The stuck wrapper was killed by the watchdog (the Pinned drop would kill it otherwise).
    c.wait_gone_within(
        &run.wrapper_pin,
        Duration::from_secs(10),
        "the stuck wrapper",
    );
    c.wait_cgroup_removed(&st, "after the takeover from the stuck wrapper");
    let ended = c.epoch(&st, "ended_at");
    ensure!(
        c,
        !watchdog_signals(c).is_empty(),
        "the watchdog journalled no signal"
    );
    // The wrapper's descendants are the run's, but for its output keeper: nobody signals it
    // (it ends by EOF). The takeover once sent it TERM, HUP and KILL, losing what it held.
    let keeper = c.events("keeper_started").first().map(|e| e["pid"].clone());
    ensure!(c, keeper.is_some(), "no keeper_started event");
    let keeper = keeper.unwrap();
    let at_keeper: Vec<Value> = watchdog_signals(c)
        .into_iter()
        .filter(|e| e["pid"] == keeper)
        .collect();
    ensure!(
        c,
        at_keeper.is_empty(),
        "the watchdog signalled the keeper {keeper}: {at_keeper:?}"
    );
    eprintln!(
        "stopped wrapper: lease deadline + grace 1 s + slack 1 s; final record {:.3} s after the \
         deadline",
        ended - deadline
    );
    ensure!(
        c,
        ended >= deadline + 2.0 - 0.001,
        "the watchdog stepped in {:.3} s after the deadline, before grace + slack",
        ended - deadline
    );
    dog.stop_cleanly(c);
}

#[test]
fn sigterm_to_the_watchdog_mid_stop_lets_the_stop_finish_then_exits_0() {
    let root = TestRoot::sharing_cpu();
    let _r = open_root(&root);
    let c = ctx(&root, "wd-sigterm-mid-stop");
    let (dir, _children, ready, pinned) = run_tree(c, &stubborn_tree());
    let mut st = running_record(c.id, ready.pid, &procfs::boot_id());
    st.grace_ms = Some(3000);
    write_record(&dir, &st);
    write_lease(&dir, epoch_now() - 0.5, 1.0);

    let mut dog = watchdog(&root, &[]);
    let stop_began = c.wait("the watchdog's stop_begin", || {
        let mut began = c.events_so_far("stop_begin").into_iter();
        began
            .find(|e| e["by"] == "watchdog")
            .ok_or_else(|| format!("watchdog: {}", dog.stderr()))
    });
    dog.signal(libc::SIGTERM);
    ensure!(
        c,
        dog.running(),
        "the watchdog exited at SIGTERM with a stop in flight"
    );
    let out = dog.finish();
    c.code(&out, 0, "the watchdog on SIGTERM");
    let exited = epoch_now();
    let err = String::from_utf8_lossy(&out.stderr);

    // The daemon exited after the stop: the record is final now, not later.
    let st = c.status();
    c.fields(&st, "the record", orphan_stopped());
    c.wait_gone_within(&pinned, Duration::from_secs(1), "the run's tree");
    let cleanup = cleanup_of(c, &st);
    ensure!(
        c,
        cleanup.signals.contains(&"KILL".to_string()) && cleanup.duration_ms >= 3000,
        "a stubborn run should be killed at its 3 s grace: {cleanup:?}"
    );
    let ended = c.epoch(&st, "ended_at");
    ensure!(
        c,
        ended <= exited,
        "the record was finalised after the daemon exited"
    );
    ensure!(
        c,
        !err.contains("still in flight"),
        "the watchdog gave up on the stop:\n{err}"
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

/// A running record of an earlier boot in a new run dir: its leader's pid is now an unrelated
/// process of this boot (the pid was reused) and its wrapper is dead. The reaper of that
/// process, the run dir, its pid, and the process pinned.
fn forge_earlier_boot(root: &TestRoot, id: &str) -> (Reaper, PathBuf, i32, Pinned) {
    let dir = make_run_dir(root, id);
    let mut children = Reaper::default();
    let pid = children.push(spawn_in_session(&["sleep-ms", "60000"], None, None));
    let unrelated = Pinned::new(&[pid]);
    let mut st = running_record(id, pid, FORGED_BOOT_ID);
    st.wrapper_pid = Some(dead_process().0.into());
    write_record(&dir, &st);
    (children, dir, pid, unrelated)
}

#[test]
fn a_record_from_an_earlier_boot_becomes_unknown_and_the_process_it_names_is_not_signalled() {
    let root = TestRoot::sharing_cpu();
    let _r = open_root(&root);
    let c = ctx(&root, "wd-rebooted-binary");
    let (_children, _dir, pid, unrelated) = forge_earlier_boot(&root, c.id);

    let mut cmd = root.watchdog_cmd();
    let out = agent_run_tests::run_with_timeout(cmd.arg("--once"), T);
    c.code(&out, 0, "agent-run-watchdog --once");
    c.record("the record", ended("unknown", "host_rebooted"));
    c.eq(
        unrelated.alive(),
        vec![pid],
        "the watchdog killed a process of this boot named by an old record",
    );
    c.eq(
        c.events("signal"),
        Vec::<Value>::new(),
        "nothing may be signalled for a record of another boot",
    );
}

#[test]
fn in_process_run_once_marks_a_record_from_an_earlier_boot_unknown_without_signalling() {
    let root = TestRoot::sharing_cpu();
    // One old record names a live process of this boot (unrelated: the pid was reused), the
    // other names nothing alive.
    let (r, c) = in_process(&root, "wd-rebooted-inproc");
    let empty_id = "wd-rebooted-inproc-empty";
    let (_children, dir, pid, unrelated) = forge_earlier_boot(&root, c.id);
    let empty_dir = make_run_dir(&root, empty_id);
    write_lease(&dir, epoch_now() - 10.0, 1.0);
    let (dead, ticks) = dead_process();
    write_record(
        &empty_dir,
        &record_with(empty_id, dead, dead, dead, ticks, FORGED_BOOT_ID),
    );

    let mut lines = run_once(&r, &policy(Duration::from_secs(1)));
    lines.sort();
    c.eq(lines.len(), 2, format_args!("the pass's lines: {lines:?}"));
    ensure!(
        c,
        lines.iter().all(|l| l.contains("from an earlier boot")),
        "the pass's lines: {lines:?}"
    );
    for run in [c, ctx(&root, empty_id)] {
        ended_unsignalled(run, "host_rebooted");
    }
    c.eq(unrelated.alive(), vec![pid], "the unrelated process");

    // A second pass finds nothing to do: a final record is never touched again.
    let before = c.bytes("status.json");
    c.eq(
        run_once(&r, &policy(Duration::from_secs(1))),
        Vec::<String>::new(),
        "the lines of a second pass",
    );
    c.eq(
        c.bytes("status.json"),
        before,
        "the record after a second pass",
    );
}

#[test]
fn in_process_run_once_marks_an_orphan_without_processes_unknown_wrapper_lost() {
    let root = TestRoot::sharing_cpu();
    let (r, c) = in_process(&root, "wd-orphan-empty-inproc");
    let dir = make_run_dir(&root, c.id);
    let (pid, ticks) = dead_process();
    let mut st = record_with(c.id, pid, pid, pid, ticks, &procfs::boot_id());
    st.wrapper_pid = Some(dead_process().0.into());
    write_record(&dir, &st);

    let started = Instant::now();
    let lines = run_once(&r, &policy(Duration::from_secs(1)));
    let took = started.elapsed();
    c.eq(lines.len(), 1, format_args!("the pass's lines: {lines:?}"));
    ended_unsignalled(c, "wrapper_lost");
    eprintln!("orphan without processes reconciled in {took:?}");
}

#[test]
fn in_process_run_once_stops_an_orphan_whose_lease_expired_and_cancels_it() {
    let root = TestRoot::sharing_cpu();
    let (r, c) = in_process(&root, "wd-orphan-leased-inproc");
    let (dir, _children, ready, pinned) =
        run_tree(c, &["tree", "--children", "2", "--grandchildren"]);
    write_record(&dir, &running_record(c.id, ready.pid, &procfs::boot_id()));
    write_lease(&dir, epoch_now() - 0.2, 1.0);

    let lines = run_once(&r, &policy(Duration::from_secs(1)));
    c.eq(lines.len(), 1, format_args!("the pass's lines: {lines:?}"));
    // run_once waits for the stops it started: the record is final when it returns.
    let st = c.status();
    c.fields(&st, "the record", orphan_stopped());
    c.wait_gone_within(&pinned, Duration::from_secs(1), "the run's tree");
    let cleanup = cleanup_of(c, &st);
    ensure!(
        c,
        cleanup.signals.first().map(String::as_str) == Some("TERM")
            && !cleanup.signals.contains(&"KILL".to_string()),
        "a cooperative tree goes at TERM: {cleanup:?}"
    );
    let signals = c.events("signal");
    ensure!(
        c,
        signals.iter().all(|e| e["by"] == "watchdog"),
        "signals not by the watchdog: {signals:?}"
    );
}

#[test]
fn in_process_run_once_leaves_a_live_wrapper_alone_until_lease_plus_grace_plus_slack() {
    let root = TestRoot::sharing_cpu();
    let (r, c) = in_process(&root, "wd-live-wrapper-inproc");
    // A real wrapper, alive but doing nothing (SIGSTOPped: stuck). Its deadline is the one it
    // publishes (its heartbeat thread's name), not lease.json: the passes come at real times.
    let (run, ready, _tree) = start_tree(c, "--lease 2s --grace 1s", "tree --children 1");
    let dir = root.run_dir(c.id);
    let deadline = agent_run_tests::hostile::read_lease_deadline(&dir);
    let wrapper = run.wrapper;
    c.signal(&run.wrapper_pin, wrapper, libc::SIGSTOP);
    c.wait("the wrapper to be stopped", || match proc_stat(wrapper) {
        Some(s) if s.0 == 'T' => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let mut everyone = vec![wrapper];
    everyone.extend(ready.all_pids());
    let pinned = Pinned::new(&everyone);
    // Expired, but within grace (1 s) + slack (2 s): the wrapper's business. A lease.json
    // that says otherwise (the workload can write one) changes nothing.
    write_lease(&dir, epoch_now() - 10.0, 1.0);
    sleep_until_epoch(deadline + 0.5);
    let lines = run_once(&r, &policy(Duration::from_secs(2)));
    c.eq(
        lines,
        Vec::<String>::new(),
        "the lines of a pass within grace + slack",
    );
    c.record("the record", json!({"state": "running"}));
    c.all_alive(&pinned, "the wrapper and the tree within grace + slack");

    // Past deadline + grace + slack (the published deadline is rounded up to a second):
    // the watchdog steps in, wrapper and workload.
    sleep_until_epoch(deadline + 4.5);
    let lines = run_once(&r, &policy(Duration::from_secs(2)));
    c.eq(lines.len(), 1, format_args!("the pass's lines: {lines:?}"));
    let st = c.status();
    c.fields(&st, "the record", ended("cancelled", "lease_expired"));
    c.wait_gone_within(&pinned, Duration::from_secs(5), "the wrapper and the tree");
    c.wait_cgroup_removed(&st, "after the pass that took over");
    let target = format!("pid:{wrapper}");
    ensure!(
        c,
        c.events("signal")
            .iter()
            .any(|e| e["target"] == target.as_str()),
        "the wrapper should be signalled, by name, in the journal"
    );
}

// ---------------------------------------------------------------------------------------------
// Corrupt run dirs

/// What the corrupt-dirs tests put in a root beside the valid run: each name the watchdog must
/// skip with one log line, and the records it must not touch.
struct CorruptSet {
    skipped: Vec<String>,
    damaged: Vec<String>,
    truncated: (PathBuf, Vec<u8>),
    untouched_records: Vec<PathBuf>,
}

/// The run root opened, the corrupt dirs of [`populate_corrupt`], and beside them the empty
/// run dir of `due`, a run the watchdog must still act on: the root, the set, the due run's
/// checks and its dir.
fn corrupt_beside_due<'a>(
    root: &'a TestRoot,
    prefix: &str,
    due: &'a str,
) -> (Root, CorruptSet, Ctx<'a>, PathBuf) {
    let r = open_root(root);
    let set = populate_corrupt(root, prefix);
    let c = ctx(root, due);
    (r, set, c, make_run_dir(root, due))
}

fn populate_corrupt(root: &TestRoot, prefix: &str) -> CorruptSet {
    let dead = Dead::new();
    let mut skipped = Vec::new();
    let mut damaged = Vec::new();
    let mut untouched = Vec::new();

    // A status.json cut in half: not a reason to skip the run (the kernel's facts decide),
    // but said once; nothing of it is due, so it is left as it is.
    let trunc_id = format!("{prefix}-truncated");
    let trunc_dir = make_run_dir(root, &trunc_id);
    let text = dead.record(&trunc_id).to_json();
    let half = text.as_bytes()[..text.len() / 2].to_vec();
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(trunc_dir.join("status.json"))
        .and_then(|mut f| io::Write::write_all(&mut f, &half))
        .expect("cannot write a truncated status.json");
    damaged.push(trunc_id);

    // A symlinked run dir, pointing at a valid record of an orphan (which would become
    // `unknown` if the watchdog followed the link).
    let link_id = format!("{prefix}-symlinked");
    let elsewhere = root.dir.path().join("elsewhere");
    private_dir(&elsewhere);
    write_record(&elsewhere, &dead.record(&link_id));
    std::os::unix::fs::symlink(&elsewhere, root.run_dir(&link_id)).unwrap();
    untouched.push(elsewhere);
    skipped.push(link_id);

    // A run dir owned by another user.
    if shared_sys::geteuid() == 0 {
        let foreign_id = format!("{prefix}-foreign");
        let foreign = make_run_dir(root, &foreign_id);
        write_record(&foreign, &dead.record(&foreign_id));
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
        damaged,
        truncated: (trunc_dir.join("status.json"), half),
        untouched_records: untouched,
    }
}

/// Each skipped name is logged exactly once; the corrupt file and the foreign records are
/// exactly as they were (`c`: the due run beside them).
fn assert_skipped_once(c: Ctx<'_>, set: &CorruptSet, stderr: &str) {
    let said = [
        (&set.skipped, "skipped"),
        (&set.damaged, "status.json cannot be read"),
    ];
    for (names, line) in said {
        for name in names {
            let n = stderr
                .lines()
                .filter(|l| l.contains(&format!("{name}: {line}")))
                .count();
            c.eq(
                n,
                1,
                format_args!("'{line}' lines for {name:?}\n--- watchdog\n{stderr}"),
            );
        }
    }
    let (truncated, bytes) = &set.truncated;
    c.eq(
        fs::read(truncated).ok().as_ref(),
        Some(bytes),
        format_args!("{} after the watchdog", truncated.display()),
    );
    for dir in &set.untouched_records {
        let text = fs::read_to_string(dir.join("status.json")).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        c.eq(
            &v["state"],
            "running",
            format_args!(
                "the watchdog acted on {}\n--- watchdog\n{stderr}",
                dir.display()
            ),
        );
        ensure!(
            c,
            !dir.join("events.jsonl").exists(),
            "the watchdog journalled in {}",
            dir.display()
        );
    }
}

#[test]
fn the_daemon_skips_corrupt_symlinked_and_foreign_dirs_with_one_line_each_and_stops_a_due_run() {
    let root = TestRoot::sharing_cpu();
    let (_r, set, c, dir) = corrupt_beside_due(&root, "wd-corrupt-daemon", "wd-corrupt-daemon-due");
    let mut children = Reaper::default();
    let pid = children.push(spawn_in_session(
        &["sleep-ms", "600000"],
        Some((c.id, &dir)),
        None,
    ));
    let pinned = Pinned::new(&[pid]);
    write_record(&dir, &running_record(c.id, pid, &procfs::boot_id()));
    write_lease(&dir, epoch_now() - 1.0, 1.0);

    let mut dog = watchdog(&root, &["--scan-interval", "1s"]);
    let dog_started = Instant::now();
    let st = c.wait_final();
    c.fields(&st, "the record", orphan_stopped());
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's process");
    // Let the daemon rescan the corrupt dirs a few times (1 s apart): it must neither crash
    // nor log them again nor act on them. Waiting for nothing to happen takes time by nature.
    std::thread::sleep(Duration::from_millis(3500).saturating_sub(dog_started.elapsed()));
    ensure!(c, dog.running(), "the watchdog died:\n{}", dog.stderr());
    let out = dog.stop_cleanly(c);
    assert_skipped_once(c, &set, &String::from_utf8_lossy(&out.stderr));
}

#[test]
fn watchdog_once_skips_corrupt_dirs_with_one_line_each_and_reconciles_a_due_run() {
    let root = TestRoot::sharing_cpu();
    let (_r, set, c, dir) = corrupt_beside_due(&root, "wd-corrupt-once", "wd-corrupt-once-due");
    let (pid, ticks) = dead_process();
    write_record(
        &dir,
        &record_with(c.id, pid, pid, pid, ticks, &procfs::boot_id()),
    );

    let mut cmd = root.watchdog_cmd();
    let out = agent_run_tests::run_with_timeout(cmd.arg("--once"), T);
    c.code(&out, 0, "agent-run-watchdog --once");
    c.record("the record", ended("unknown", "wrapper_lost"));
    assert_skipped_once(c, &set, &String::from_utf8_lossy(&out.stderr));
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
    let root = TestRoot::exclusive_cpu();
    let _r = open_root(&root);
    let dead = Dead::new();

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
        let mut st = dead.record(&id);
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
                &stubborn_tree(),
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
        let ready = wait_ready(&root.run_dir(&o.id).join("stdout.log"), T);
        all_pids.extend(ready.members);
    }
    let pinned = Pinned::new(&all_pids);
    assert_eq!(pinned.alive().len(), 205, "every process should be up");
    for (o, &pid) in orphans.iter().zip(&leaders) {
        let dir = root.run_dir(&o.id);
        let mut st = running_record(&o.id, pid, &dead.boot);
        // The default grace: cooperative runs must finish far inside it, whatever the
        // stubborn ones do (2 slow cores, a debug build, 200 stops at once).
        st.grace_ms = Some(5000);
        write_record(&dir, &st);
    }
    let deadline = epoch_now() + 1.5;
    for o in &orphans {
        write_lease(&root.run_dir(&o.id), deadline, 1.5);
    }

    let started = Instant::now();
    let dog = watchdog(&root, &[]);
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
    agent_run_tests::wait_until_dbg("every leased record final", T, || {
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
        let c = ctx(&root, &o.id);
        let st = &records[&o.id];
        // When the watchdog took the run over, relative to the deadline.
        let by_watchdog = c
            .root
            .events(c.id)
            .into_iter()
            .find(|e| e["by"] == "watchdog");
        if let Some(t) = by_watchdog.map(|e| c.epoch(&e, "ts")) {
            acted_ms.push(((t - deadline) * 1000.0) as i64);
        }
        c.fields(st, "the record", orphan_stopped());
        let ended = c.epoch(st, "ended_at");
        ensure!(
            c,
            ended >= deadline - 0.001,
            "the run ended {:.3} s before its deadline",
            deadline - ended
        );
        last_end = last_end.max(ended);
        let cleanup = cleanup_of(c, st);
        if o.stubborn {
            ensure!(
                c,
                cleanup.signals.contains(&"KILL".to_string()) && cleanup.duration_ms >= 5000,
                "a stubborn run should be killed at its 5 s grace: {cleanup:?}"
            );
            stubborn_ms.push(cleanup.duration_ms);
        } else {
            ensure!(
                c,
                !cleanup.signals.contains(&"KILL".to_string()) && cleanup.duration_ms < 2500,
                "a cooperative run waited: {cleanup:?}"
            );
            coop_max = coop_max.max(cleanup.duration_ms);
        }
    }
    for id in &final_ids {
        let c = ctx(&root, id);
        ensure!(
            c,
            !c.file("events.jsonl").exists(),
            "the watchdog acted on a final run"
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
    dog.stop_cleanly(ctx(&root, &orphans[0].id));
}

// ---------------------------------------------------------------------------------------------
// The fast path of a full pass: only a surely final dir is settled without the careful path

/// What the fast path says of `name` in `root`.
fn fast_verdict(root: &TestRoot, name: &str) -> Option<agent_run_watchdog::ledger::Settled> {
    use agent_run_watchdog::pass::{open_root, Pass};
    use std::os::fd::AsFd;
    let fd = open_root(&root.root()).expect("cannot open the root");
    let ents = agent_run_shared::root::entries(fd.as_fd()).expect("cannot list the root");
    let e = ents
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} is not listed"));
    Pass::new(fd).classify(e, &std::cell::OnceCell::new())
}

#[test]
fn the_fast_path_settles_only_surely_final_dirs_and_hands_hostile_ones_to_the_careful_path() {
    use agent_run_watchdog::pass::MAX_READ;
    let root = TestRoot::sharing_cpu();
    let _r = open_root(&root);
    let dead = Dead::new();
    let finished = finished_now(dead.record("fp-final"));
    let final_json = |id: &str| {
        let mut st = finished.clone();
        st.run_id = id.into();
        st.to_json()
    };
    // Each dir a workload could leave, put in place as it could (status.json replaced
    // atomically), and what the fast path must say of it.
    let careful = |id: &str, what: &str| {
        let c = ctx(&root, id);
        let t = Instant::now();
        c.eq(fast_verdict(&root, id), None, what);
        // Never a blocked open or a long read: a FIFO or a huge file costs one failed check.
        ensure!(
            c,
            t.elapsed() < Duration::from_secs(5),
            "{what}: took {:?}",
            t.elapsed()
        );
    };

    // The control: a plain final record of a dead run is final for the fast path.
    make_run_dir(&root, "fp-final");
    let c = ctx(&root, "fp-final");
    c.replace_status(final_json("fp-final").as_bytes());
    ensure!(
        c,
        fast_verdict(&root, "fp-final").is_some(),
        "a plain final record is not final for the fast path"
    );

    // status.json is a FIFO (nobody writes it), a symlink to a final record, a directory.
    let dir = make_run_dir(&root, "fp-fifo");
    agent_run_tests::hostile::plant(
        &dir.join("status.json"),
        agent_run_tests::hostile::Plant::Fifo,
    );
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
    make_run_dir(&root, "fp-big");
    let mut big = final_json("fp-big");
    big.push_str(&" ".repeat(MAX_READ as usize + 1));
    ctx(&root, "fp-big").replace_status(big.as_bytes());
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
    ctx(&root, "fp-open").replace_status(final_json("fp-open").as_bytes());
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    careful("fp-open", "a run dir open to others");

    // A record that claims `finished` while its wrapper lives and holds the lock, and while
    // the run's cgroup holds its processes: the truth is not final.
    let c = ctx(&root, "fp-live");
    let (run, _, pinned) = start_tree(c, "--lease 20s", "tree --children 1");
    let real = c.bytes("status.json");
    let forge = |edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        c.edit_status(|st| {
            st.insert("state".into(), "finished".into());
            st.insert("exit_code".into(), 0.into());
            st.insert("ended_at".into(), rfc3339_now().into());
            edit(st);
        })
    };
    forge(&|_| {});
    careful(
        c.id,
        "a forged `finished` with a live wrapper holding the lock",
    );
    let in_cgroup = c.status()["containment"]["mode"] == "cgroup";
    if in_cgroup {
        // The lock's holder hidden (the record names pid 1 as its wrapper): the live cgroup
        // alone keeps the run from the fast path.
        forge(&|st| {
            st.insert("wrapper_pid".into(), 1.into());
        });
        careful(
            c.id,
            "a forged `finished` with live processes in the run's cgroup",
        );
    } else {
        eprintln!("the run is not held in a cgroup here: no cgroup case");
    }
    // The real record back; the run is then cancelled the ordinary way, tree and all.
    c.replace_status(&real);
    c.ctl(&["cancel", c.id], 0);
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the run's tree");
    c.wait_gone_within(&run.wrapper_pin, Duration::from_secs(10), "the wrapper");
    if in_cgroup {
        // Final for real, wrapper gone, cgroup removed: now the fast path may settle it.
        c.wait(
            "the fast path to settle the cancelled run",
            || match fast_verdict(&root, c.id) {
                Some(_) => Ok(()),
                None => Err("not final for the pass".to_string()),
            },
        );
    }

    // And a whole --once pass over all of it: the careful path names each hostile dir once
    // (a damaged record is said and the run goes by kernel facts; a symlinked dir is skipped;
    // an opened dir is set back to 0700) and leaves the final ones alone.
    let mut cmd = root.watchdog_cmd();
    let out = agent_run_tests::run_with_timeout(cmd.arg("--once"), T);
    c.code(&out, 0, "agent-run-watchdog --once");
    let err = String::from_utf8_lossy(&out.stderr);
    for (name, said) in [
        ("fp-fifo", "status.json cannot be read"),
        ("fp-symlink", "status.json cannot be read"),
        ("fp-dir", "status.json cannot be read"),
        ("fp-huge", "status.json cannot be read"),
        ("fp-linkdir", "skipped"),
        ("fp-open", "the run dir's mode was 0755; set back to 0700"),
    ] {
        let lines = err
            .lines()
            .filter(|l| l.contains(&format!("{name}: {said}")));
        ctx(&root, name).eq(
            lines.count(),
            1,
            format_args!("'{said}' lines for {name}\n{err}"),
        );
    }
    ensure!(
        c,
        !err.contains("fp-final"),
        "the pass named fp-final:\n{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// A full pass works in slices: a deadline that falls due during it is served between two

/// The CPU time (user + system) `pid` has used, from /proc/PID/stat (clock ticks, 100 Hz).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the daemon's stat");
    let rest = &stat[stat.rfind(')').expect("stat has a comm") + 2..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3) here.
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// Waits until the daemon's CPU time stops growing (a full pass is over: an idle daemon sleeps
/// in epoll_wait), and returns how much CPU it used since `from` ticks.
fn wait_for_the_pass_to_end(pid: i32, from: u64) -> Duration {
    let mut last = (cpu_ticks(pid), Instant::now());
    let give_up = Instant::now() + T;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = cpu_ticks(pid);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_millis(300) {
            return Duration::from_millis((now - from) * 10);
        }
        assert!(Instant::now() < give_up, "the daemon never went idle");
    }
}

/// Fillers whose every pass goes the careful way and ends in a skip (their records name a
/// live process that is not agent-run as their wrapper), so that one full pass takes most of
/// a second or more, and a daemon whose passes the test starts with SIGHUP (the periodic one is
/// an hour away). The length of a pass is measured first (the daemon's CPU time over one);
/// then, three times, an orphan's lease is made to fall due in the middle of a pass. Each must
/// be enforced within a quarter of a pass of its deadline, where a pass that served nothing
/// until its end would be late by half a pass.
#[test]
fn a_lease_that_falls_due_during_a_long_rescan_is_enforced_without_waiting_for_its_end() {
    let root = TestRoot::exclusive_cpu();
    let _r = open_root(&root);
    let boot = procfs::boot_id();
    let mut children = Reaper::default();

    let stranger = children.push(spawn_in_session(&["sleep-ms", "600000"], None, None));
    let (_, _, spgid, ssid, sticks) = proc_stat(stranger).expect("the stranger has a /proc entry");
    // The fillers' live wrapper: one process named agent-run (a copy of the fixture) that holds
    // every filler's lock, started before their dirs, as a wrapper is. The watchdog watches
    // them, reading each record at every pass.
    let holder = LockHolder::start(&root);
    // Fillers are added until one pass takes PASS_AT_LEAST of CPU: how many that needs depends
    // on the machine and on how lean a pass is (a leaner pass once made 4,000 too few).
    const FIRST_FILLERS: usize = 4000;
    const MAX_FILLERS: usize = 24_000;
    const PASS_AT_LEAST: Duration = Duration::from_millis(600);
    let add_fillers = |from: usize, to: usize| {
        for i in from..to {
            let id = format!("wd-slice-fill-{i:05}");
            let dir = make_run_dir(&root, &id);
            let mut st = record_with(&id, stranger, spgid, ssid, sticks, &boot);
            st.wrapper_pid = Some(holder.pid.into());
            st.wrapper_start_ticks = Some(holder.ticks);
            // A long command line, as real records have: the pass reads and parses each one.
            st.argv = vec!["x".repeat(16 << 10)];
            write_record(&dir, &st);
        }
        holder.lock((from..to).map(|i| root.run_dir(&format!("wd-slice-fill-{i:05}"))));
    };
    let mut fillers = FIRST_FILLERS;
    add_fillers(0, fillers);
    let mut orphans = Vec::new();
    for i in 0..3 {
        let id = format!("wd-slice-m{i}");
        let dir = make_run_dir(&root, &id);
        let pid = children.push(spawn_in_session(
            &["sleep-ms", "600000"],
            Some((&id, &dir)),
            None,
        ));
        let st = running_record(&id, pid, &boot);
        write_record(&dir, &st);
        write_lease(&dir, epoch_now() + 3600.0, 3600.0);
        orphans.push((id, pid));
    }
    let pinned = Pinned::new(&orphans.iter().map(|o| o.1).collect::<Vec<_>>());

    let dog = watchdog(&root, &["--scan-interval", "1h"]);
    let dpid = dog.pid();
    wait_for_the_pass_to_end(dpid, cpu_ticks(dpid));
    let pass = loop {
        let from = cpu_ticks(dpid);
        dog.signal(libc::SIGHUP);
        let pass = wait_for_the_pass_to_end(dpid, from);
        assert_eq!(pinned.alive().len(), 3, "a pass stopped a run");
        if pass >= PASS_AT_LEAST {
            break pass;
        }
        assert!(
            fillers < MAX_FILLERS,
            "one pass over {fillers} fillers took only {pass:?} of CPU: too short to test that \
             a deadline does not wait for a pass"
        );
        // Enough more for a pass of about 1.5 times the least (a pass costs about as much per
        // filler), and the daemon idle again before the next measure.
        let want = (fillers as f64 * 1.5 * PASS_AT_LEAST.as_secs_f64()
            / pass.as_secs_f64().max(0.05))
        .ceil() as usize;
        let next = want.clamp(fillers + 1000, MAX_FILLERS);
        add_fillers(fillers, next);
        fillers = next;
        wait_for_the_pass_to_end(dpid, cpu_ticks(dpid));
    };

    let mut late = Vec::new();
    for (id, _) in &orphans {
        // The deadline falls in the middle of the pass SIGHUP starts.
        let dl = epoch_now() + 0.5 + pass.as_secs_f64() / 2.0;
        write_lease(&root.run_dir(id), dl, 1.0);
        sleep_until_epoch(dl - pass.as_secs_f64() / 2.0);
        let from = cpu_ticks(dpid);
        dog.signal(libc::SIGHUP);
        let st = agent_run_tests::wait_until_dbg("the orphan's record final", T, || {
            match root.try_status(id) {
                Ok(st) if st["state"] != "running" && st["state"] != "cancelling" => Ok(st),
                other => Err(other.map(|s| s["state"].clone())),
            }
        });
        let c = ctx(&root, id);
        c.fields(&st, "the record", orphan_stopped());
        late.push(c.epoch(&st, "ended_at") - dl);
        wait_for_the_pass_to_end(dpid, from);
    }
    eprintln!(
        "one pass over {fillers} fillers: {pass:?} of CPU; the leases enforced {:?} s after \
         their deadlines",
        late.iter()
            .map(|l| (l * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>()
    );
    let bound = pass.as_secs_f64() / 4.0;
    for (l, (id, _)) in late.iter().zip(&orphans) {
        assert!(
            *l >= -0.001 && *l < bound,
            "run {id} ended {l:.3} s after its deadline, which fell in the middle of a pass of \
             {pass:?}\n--- watchdog\n{}",
            dog.stderr()
        );
    }
    dog.stop_cleanly(ctx(&root, &orphans[0].0));
}

/// A settled run is kept under its status.json's inode and change time, which no call sets to
/// a chosen value: a record rewritten in place with its mtime put back is read again by the
/// next full pass (here the one SIGHUP starts), and the orphan it now describes is stopped.
#[test]
fn a_settled_record_rewritten_in_place_with_its_mtime_put_back_is_read_again_by_the_next_pass() {
    let root = TestRoot::sharing_cpu();
    let _r = open_root(&root);
    let mut children = Reaper::default();
    let id = "wd-settled-rewrite";
    let dir = make_run_dir(&root, id);
    let pid = children.push(spawn_in_session(
        &["sleep-ms", "600000"],
        Some((id, &dir)),
        None,
    ));
    let pinned = Pinned::new(&[pid]);
    let running = running_record(id, pid, &procfs::boot_id());
    let done = finished_now(running.clone());
    write_record(&dir, &done);

    let dog = watchdog(&root, &[]);
    let c = ctx(&root, id);
    let status = dir.join("status.json");
    let before = fs::metadata(&status).expect("status.json");
    // The workload's rewrite, in place: a running record, a lease that expired, mtime as before.
    write_lease(&dir, epoch_now() - 1.0, 1.0);
    let f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&status)
        .expect("open status.json in place");
    io::Write::write_all(&mut &f, running.to_json().as_bytes()).expect("rewrite in place");
    f.set_modified(before.modified().expect("mtime"))
        .expect("put the mtime back");
    drop(f);
    let after = fs::metadata(&status).expect("status.json");
    {
        use std::os::unix::fs::MetadataExt;
        c.eq(
            (after.ino(), after.mtime(), after.mtime_nsec()),
            (before.ino(), before.mtime(), before.mtime_nsec()),
            "status.json's inode and mtime after the rewrite",
        );
    }
    dog.signal(libc::SIGHUP);
    pinned
        .wait_all_gone(Duration::from_secs(30))
        .unwrap_or_else(|alive| {
            panic!(
                "the orphan was not stopped after SIGHUP: {alive:?} alive\n--- watchdog\n{}",
                dog.stderr()
            )
        });
    let st = agent_run_tests::wait_until_dbg("the record final", T, || match root.try_status(id) {
        Ok(st) if st["state"] != "running" && st["state"] != "cancelling" => Ok(st),
        other => Err(other.map(|s| s["state"].clone())),
    });
    c.fields(&st, "the record", orphan_stopped());
    dog.stop_cleanly(c);
}

/// A run held by scanning alone (`--cgroup off`), its wrapper killed -9: a process the workload
/// forks into a session of its own after the watchdog took the orphan in (and with it a look of
/// every pid, the base of its later looks: safety CS-82) is stopped with the rest at the lease.
/// The watchdog follows the pid counter, so the stop's first look is that base's older pids
/// and a fresh read of the pids handed out since: the escapee is one of those. The second the
/// test waits before the gate opens only makes that path the likely one; the verdict holds either
/// way.
#[test]
fn an_escapee_forked_after_the_watchdog_took_the_orphan_in_is_stopped_at_the_lease_in_procfs_mode()
{
    use agent_run_tests::contain::{marked, sweep, SweepOnDrop};
    let root = TestRoot::sharing_cpu();
    let id = "wd-late-escapee";
    let c = ctx(&root, id);
    let dog = watchdog(&root, &[]);
    let gate = root.dir.path().join("gate");
    let esc_file = root.dir.path().join("escapee.pid");
    let made = Command::new("mkfifo").arg(&gate).status().expect("mkfifo");
    ensure!(c, made.success(), "mkfifo {}", gate.display());
    let script = format!(
        "read x < '{}'; setsid sleep 300 & echo $! > '{}'; wait",
        gate.display(),
        esc_file.display()
    );
    let run = agent_run_tests::hostile::Detached::start(
        &root,
        root.cmd(),
        id,
        &["--cgroup", "off", "--lease", "4s"],
        &["sh", "-c", &script],
    );
    let _sweep = SweepOnDrop(run.dir.clone());
    let deadline = c.lease_deadline();
    run.kill_wrapper();
    std::thread::sleep(Duration::from_secs(1));
    fs::write(&gate, "go\n").expect("open the gate");
    // The shell writes `$!` as soon as it has forked, before the child has run setsid(1): wait
    // for the session too, not only for the pid.
    let esc: i32 = agent_run_tests::wait_until_dbg(
        "the escapee's pid and its own session",
        Duration::from_secs(10),
        || {
            let esc: i32 = fs::read_to_string(&esc_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or("no pid yet".to_string())?;
            match proc_stat(esc) {
                Some(st) if st.3 == esc => Ok(esc),
                st => Err(format!("{esc} not yet in its own session: {st:?}")),
            }
        },
    );
    let pin = Pinned::new(&[esc]);
    let st = proc_stat(esc).expect("the escapee lives");
    ensure!(c, st.3 == esc, "the escapee leads its own session: {st:?}");
    ensure!(
        c,
        marked(&run.dir).contains(&esc),
        "the escapee carries the run's marker"
    );
    ensure!(
        c,
        epoch_now() < deadline,
        "too slow: the escapee was forked after the lease's deadline"
    );
    let fin = c.wait_final();
    c.fields(&fin, "the record", orphan_stopped());
    c.wait_gone_within(&pin, Duration::from_secs(10), "the escapee");
    ensure!(
        c,
        marked(&run.dir).is_empty(),
        "cancelled while {:?} of the run live",
        marked(&run.dir)
    );
    sweep(&run.dir, &[]);
    dog.stop_cleanly(c);
}

/// A process named agent-run (a copy of the fixture) holding the locks of run dirs, as their
/// live wrapper would. Killed by pid when dropped.
struct LockHolder {
    child: std::cell::RefCell<std::process::Child>,
    pid: i32,
    ticks: u64,
    out: std::cell::RefCell<std::io::BufReader<std::process::ChildStdout>>,
}

impl LockHolder {
    fn start(root: &TestRoot) -> LockHolder {
        let copy = agent_run_tests::fixture_as_agent_run(&root.dir.path().join("bin"));
        let mut child = std::process::Command::new(&copy)
            .arg("hold-dir-locks")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the lock holder");
        let pid = child.id() as i32;
        let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let ticks = proc_stat(pid).expect("the holder's /proc entry").4;
        LockHolder {
            child: std::cell::RefCell::new(child),
            pid,
            ticks,
            out: std::cell::RefCell::new(out),
        }
    }

    /// Lock each of `dirs`, and wait until the holder has.
    fn lock(&self, dirs: impl Iterator<Item = PathBuf>) {
        use std::io::{BufRead, Write};
        let mut text = String::new();
        for d in dirs {
            text += &format!("{}\n", d.display());
        }
        text.push('\n');
        let mut child = self.child.borrow_mut();
        let stdin = child.stdin.as_mut().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("tell the holder");
        stdin.flush().expect("flush");
        let mut line = String::new();
        self.out
            .borrow_mut()
            .read_line(&mut line)
            .expect("the holder's answer");
        assert!(line.starts_with("locked "), "the holder said {line:?}");
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let mut child = self.child.borrow_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Deadlines do not wait for a pass; stops due together share their looks

/// A run dir that the root's listing (the order a pass works in) puts among its first `within`
/// run dirs, made before `fill` makes the others: the first made, where a directory lists in
/// the order entries were made, else the first of names tried until one is listed there (a
/// directory that lists by a hash of the name).
fn early_run_dir(root: &TestRoot, prefix: &str, within: usize, fill: impl FnOnce()) -> String {
    let listed = |id: &str| {
        let names = fs::read_dir(root.root()).expect("the root lists");
        let names: Vec<String> = names
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names
            .iter()
            .position(|n| n == id)
            .is_some_and(|p| p < within)
    };
    let first = format!("{prefix}-0");
    make_run_dir(root, &first);
    fill();
    if listed(&first) {
        return first;
    }
    for k in 1..2000 {
        let id = format!("{prefix}-{k}");
        let dir = make_run_dir(root, &id);
        if listed(&id) {
            return id;
        }
        fs::remove_dir(&dir).expect("an empty run dir is removed");
    }
    panic!("no run dir {prefix}-N is listed among the first {within} of the root");
}

/// A full pass slowed by the `slow_pass` fault knob (50 ms a run dir: 100 final run dirs make
/// it 5 s), begun by SIGHUP. An orphan that the pass looks at within its first half second
/// gets a lease that falls due a second into the pass: it is enforced, and its stop said in
/// the log, before the log says that pass is done. A loop that served its deadlines only
/// between passes would say the stop after.
#[test]
fn a_lease_due_during_a_pass_slowed_by_a_fault_knob_is_enforced_before_the_pass_ends() {
    let root = TestRoot::sharing_cpu();
    let _r = open_root(&root);
    let dead = Dead::new();
    let id = early_run_dir(&root, "wd-slow-orphan", 10, || {
        for i in 0..100 {
            let id = format!("wd-slow-final-{i:03}");
            let dir = make_run_dir(&root, &id);
            write_record(&dir, &finished_now(dead.record(&id)));
        }
    });
    let id = id.as_str();
    let dir = root.run_dir(id);
    let mut children = Reaper::default();
    let pid = children.push(spawn_in_session(
        &["sleep-ms", "600000"],
        Some((id, &dir)),
        None,
    ));
    write_record(&dir, &running_record(id, pid, &dead.boot));
    write_lease(&dir, epoch_now() + 3600.0, 3600.0);
    let pinned = Pinned::new(&[pid]);
    let c = ctx(&root, id);

    let mut cmd = root.watchdog_cmd();
    cmd.env(
        agent_run_shared::fault::ENV,
        agent_run_shared::fault::SLOW_PASS,
    );
    // The periodic pass an hour away: the only pass after READY is the one SIGHUP begins.
    let dog = Daemon::start(cmd, &["--scan-interval", "1h"]);
    c.eq(pinned.alive(), vec![pid], "the orphan before its lease");
    dog.signal(libc::SIGHUP);
    agent_run_tests::wait_until("the pass SIGHUP begins", T, || {
        dog.stderr().contains("SIGHUP: rescanning").then_some(())
    });
    write_lease(&dir, epoch_now() + 1.0, 1.0);
    let st = c.wait_final();
    c.fields(&st, "the record", orphan_stopped());
    c.wait_gone_within(&pinned, Duration::from_secs(10), "the orphan");
    // The pass's own line, after SIGHUP's: the stop's line must come before it.
    let log = agent_run_tests::wait_until("the pass to end", T, || {
        let log = dog.stderr();
        let after = &log[log.find("SIGHUP: rescanning")?..];
        after
            .contains("run dirs done in")
            .then(|| after.to_string())
    });
    let stop = log.find(&format!("run {id}: "));
    let end = log.find("run dirs done in");
    ensure!(
        c,
        stop.is_some_and(|s| end.is_some_and(|e| s < e)),
        "the stop is not said before the end of the pass it fell due in\n--- watchdog\n{log}"
    );
    dog.stop_cleanly(c);
}

/// Several runs of agent-run held by /proc scans alone (`--cgroup off`), each a tree of five
/// processes, their wrappers SIGKILLed, their leases due at the same moment: the watchdog's
/// stops, which share their looks at /proc, stop every process of every tree, and each record
/// is final, says what was signalled and that nothing survived.
#[test]
fn several_procfs_orphans_due_together_are_all_stopped_with_their_trees() {
    let root = TestRoot::sharing_cpu();
    let dog = watchdog(&root, &[]);
    let ids: Vec<String> = (0..6).map(|i| format!("wd-together-{i}")).collect();
    let mut runs = Vec::new();
    for id in &ids {
        let c = ctx(&root, id);
        let (run, ready, pinned) = start_tree(
            c,
            "--cgroup off --lease 1h",
            "tree --children 2 --grandchildren",
        );
        c.record(
            "the record",
            json!({"containment": {"mode": "procfs", "cgroup": null}}),
        );
        runs.push((run, ready, pinned));
    }
    for (id, (run, _, _)) in ids.iter().zip(&runs) {
        ctx(&root, id).kill_wrapper(run.wrapper, &run.wrapper_pin);
    }
    let dl = epoch_now() + 1.0;
    for id in &ids {
        write_lease(&root.run_dir(id), dl, 1.0);
    }
    for (id, (_, ready, pinned)) in ids.iter().zip(&runs) {
        let c = ctx(&root, id);
        let st = c.wait_final();
        c.fields(&st, "the record", orphan_stopped());
        c.wait_gone_within(pinned, Duration::from_secs(10), "the run's tree");
        let cleanup = cleanup_of(c, &st);
        c.eq(cleanup.survivors.len(), 0, "the record's survivors");
        let signalled: Vec<i32> = cleanup.signalled.iter().map(|p| p.raw()).collect();
        for p in ready.all_pids() {
            ensure!(
                c,
                signalled.contains(&p),
                "process {p} of the tree is not among the signalled {signalled:?}"
            );
        }
        ensure!(
            c,
            c.epoch(&st, "ended_at") >= dl - 0.001,
            "the run ended before its lease deadline"
        );
    }
    dog.stop_cleanly(ctx(&root, &ids[0]));
}
