//! The stop and the lease hold when things around them are degraded: a damaged lease.json or
//! status.json, a wrapper stalled between `mkdir` and `flock` or SIGSTOPped, a wrapper SIGKILLed
//! with a setsid escapee left, a kernel that refuses pidfds.
//!
//! These tests prove the fixes for the gaps the safety review found (`docs/safety.md`, §7, G-1 to
//! G-8; the fixes are commit 757575f); this file was `review.rs`.
//!
//! | gap | what was wrong | tests |
//! |---|---|---|
//! | G-1 | a wrapper stalled between `mkdir` and `flock` ran after `cancel` had declared its launch lost | `a_wrapper_stalled_between_mkdir_and_flock_*`, `a_launch_declared_lost_*` |
//! | G-2 | no pidfd for the leader after the spawn: `launch_failed` while the workload ran on | `a_wrapper_denied_pidfds_*`, `term_to_a_wrapper_denied_pidfds_*` |
//! | G-3 | a takeover found a marked setsid escapee only at the grace: KILL, never TERM | `after_kill_9_of_the_wrapper_cancel_sends_term_*` |
//! | G-4 | a damaged lease.json meant "no lease" (wrapper) or "skip forever" (watchdog) | `a_garbage_lease_json_*`, `a_truncated_lease_json_*`, `an_orphan_whose_lease_json_is_garbage_*` |
//! | G-5 | `cancel` of a SIGSTOPped wrapper without a lease exited 75 and the run lived on | `cancel_continues_a_sigstopped_wrapper_*` |
//! | G-6 | a stale header comment in `tests/tests/watchdog.rs` (now lease_and_watchdog.rs) | none (a comment) |
//! | G-7 | `cancel` of a corrupt non-final record wrote `unknown` and stopped nothing | `a_corrupt_status_json_does_not_stop_a_stop_cancel_goes_by_kernel_facts` |
//! | G-8 | logind detection defaults | none here: unit tests in `shared/src/hostpolicy.rs`; under logind in `tests/tests/systemd.rs` |
//!
//! Every test drives the real binaries on real processes in its own run root and asserts on
//! kernel facts: pids pinned with pidfds, /proc (a zombie is dead), the run dir's files. Waits
//! poll to one generous deadline; nothing sleeps for correctness. Every process a test sees is
//! pinned and SIGKILLed by pid when the test ends, and a [`Reaper`] kills by pid whatever still
//! carries the run's `AGENT_RUN_DIR` marker, pass or fail. Run ids start with `dg-`.
//!
//! Each test was also run against the binaries of the tree before the fixes (e15e3ad, with
//! `AGENT_RUN_BIN` and `AGENT_RUN_WATCHDOG_BIN`), and fails there.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_run_tests::contain::marked;
use agent_run_tests::ctx::{ctx, Ctx, Detached, CMD, T};
use agent_run_tests::facts::*;
use agent_run_tests::workload::*;
use agent_run_tests::{
    describe_output, proc_stat, run_with_timeout, sys, Pinned, Ready, Reaper, Spawned, TestRoot,
    FINAL_STATES, RECORD_KEYS,
};
use serde_json::{json, Value};

/// Whether a signal number is set in a `SigIgn`/`SigCgt` mask of /proc/PID/status.
fn mask_has(pid: i32, field: &str, signo: i32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    mask & (1u64 << (signo - 1)) != 0
}

/// The syscalls a thread blocked in `poll(2)` shows in /proc/PID/syscall (glibc may use either).
#[cfg(target_arch = "x86_64")]
const POLL_SYSCALLS: &[i64] = &[libc::SYS_poll, libc::SYS_ppoll];
#[cfg(not(target_arch = "x86_64"))]
const POLL_SYSCALLS: &[i64] = &[libc::SYS_ppoll];

/// Ok when the main thread of `pid` sleeps in poll: a wrapper does that only in its supervise
/// loop, which it enters after reading lease.json once.
fn sleeping_in_poll(pid: i32) -> Result<(), String> {
    let state = proc_stat(pid).map(|s| s.0);
    let text = fs::read_to_string(format!("/proc/{pid}/syscall")).map_err(|e| e.to_string())?;
    let nr = text.split_whitespace().next().and_then(|n| n.parse().ok());
    match nr {
        Some(nr) if state == Some('S') && POLL_SYSCALLS.contains(&nr) => Ok(()),
        _ => Err(format!("state {state:?}, syscall {text:?}")),
    }
}

/// The fds of `pid` that are pidfds (`anon_inode:[pidfd]`).
fn pidfds_of(pid: i32) -> Vec<String> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target == "anon_inode:[pidfd]")
        .collect()
}

/// Where a [`seccomp`] filter's listener is kept in the process it was installed in: a fixed
/// fd number without close-on-exec, so it survives the exec and the test can take it with
/// pidfd_getfd.
const LISTENER_FD: i32 = 100;

/// Installs, in the process `cmd` starts (between fork and exec, after no_new_privs, so no
/// privilege is needed), a seccomp filter that answers the syscall `nr` with `action` and lets
/// every other syscall through. It matches the syscall number only, and everything the process
/// starts inherits it. For `SECCOMP_RET_USER_NOTIF` the listener is moved to [`LISTENER_FD`].
fn seccomp(cmd: &mut Command, nr: libc::c_long, action: u32) {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let filter = [
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0), // seccomp_data.nr
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1, // another syscall: skip to ALLOW
            k: nr as u32,
        },
        stmt(libc::BPF_RET | libc::BPF_K, action),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let notify = action == libc::SECCOMP_RET_USER_NOTIF;
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2),
    // seccomp(2), dup2(2) and close(2), which are async-signal-safe; `filter`, owned by the
    // closure, outlives the seccomp call that reads it.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let flags = if notify {
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
            } else {
                0
            };
            let set = libc::SECCOMP_SET_MODE_FILTER;
            let fd = libc::syscall(libc::SYS_seccomp, set, flags, &prog as *const _) as i32;
            if fd < 0 || (notify && libc::dup2(fd, LISTENER_FD) < 0) {
                return Err(io::Error::last_os_error());
            }
            if notify {
                libc::close(fd);
            }
            Ok(())
        });
    }
}

/// Makes `pidfd_open(2)` fail with `errno` in the process `cmd` starts and in everything it
/// starts: EMFILE is a full descriptor table, ENOSYS a kernel before 5.3. Every pidfd_open of
/// the wrapper fails, its stop's included. clone3(2) fails with ENOSYS too (a kernel before
/// 5.3 has neither): its CLONE_PIDFD would otherwise hand the wrapper the leader's pidfd with
/// the spawn, and a seccomp filter cannot look into clone3's flags to refuse only that.
fn deny_pidfd_open(cmd: &mut Command, errno: i32) {
    seccomp(
        cmd,
        libc::SYS_pidfd_open,
        libc::SECCOMP_RET_ERRNO | errno as u32,
    );
    seccomp(
        cmd,
        libc::SYS_clone3,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    );
}

/// `agent-run OPTS ID -- fixture TREE` in the foreground with pidfd_open failing with `errno`
/// ([`deny_pidfd_open`]), once launched: the wrapper process, its pid and its pin.
fn start_denied_pidfds(c: Ctx, errno: i32, opts: &str, tree: &str) -> (Spawned, i32, Pinned) {
    let mut cmd = c.root.cmd();
    deny_pidfd_open(&mut cmd, errno);
    c.spawn_start(cmd, opts, &fx(tree))
}

/// Makes every `flock(2)` of the process `cmd` starts wait until the test lets it go (see
/// [`Listener`]).
fn hold_flock(cmd: &mut Command) {
    seccomp(cmd, libc::SYS_flock, libc::SECCOMP_RET_USER_NOTIF);
}

/// `start --detach OPTS ID -- fixture TREE`, running: the run (its wrapper and leader pinned),
/// the fixture's ready line, and the whole tree pinned.
fn start_tree(c: Ctx<'_>, opts: &str, tree: &str) -> (Detached, Ready, Pinned) {
    let run = c.start_running(opts, &fx(tree));
    let (ready, pins) = c.pin_tree();
    (run, ready, pins)
}

/// The run `id` of a test, with a reaper for what the test leaves.
fn reaped<'a>(root: &'a TestRoot, id: &'a str) -> (Ctx<'a>, Reaper) {
    let c = ctx(root, id);
    (c, Reaper::for_run(root, c.id))
}

/// Nothing of `pins`, nothing with the run's marker and nothing in session `sid` is alive.
fn all_gone_now(c: Ctx, pins: &Pinned, sid: i32, when: &str) {
    c.gone_now(pins, when);
    c.nothing_left(sid, when);
}

/// `cancel --json ID` exits 0: right then the run's processes are gone (see [`all_gone_now`]),
/// and both the record it prints and status.json say `cancelled` by `cancel_request`.
fn cancel_stops_all(c: Ctx, pins: &Pinned, sid: i32) {
    let out = c.ctl(&["cancel", "--json", c.id], 0);
    all_gone_now(c, pins, sid, "right after cancel returned");
    let printed = c.parse(&out, "cancel");
    let want = ended("cancelled", "cancel_request");
    c.fields(&printed, "cancel's output", want.clone());
    c.fields(&c.status(), "status.json", want);
}

/// The record `st` ends the run at its lease deadline (`lease_expired`, within 3 s after it),
/// with one complaint of an unreadable lease.json on the way.
fn expired_at(c: Ctx, st: &Value, deadline: f64) {
    c.fields(st, "status.json", ended("cancelled", "lease_expired"));
    let ended = c.epoch(st, "ended_at");
    c.check(
        ended >= deadline - 0.002 && ended <= deadline + 3.0,
        format_args!("ended {:+.3} s from the lease deadline", ended - deadline),
    );
    c.eq(
        c.events("lease_unreadable").len(),
        1,
        "lease_unreadable events",
    );
}

/// The `signal` events `by` sent with `signal` to the single process `pid` (`"pid:N"`).
fn signals_to(events: &[Value], by: &str, signal: &str, pid: i32) -> Vec<Value> {
    let target = format!("pid:{pid}");
    events
        .iter()
        .filter(|e| e["by"] == by && e["signal"] == signal && e["target"] == target.as_str())
        .cloned()
        .collect()
}

// =============================================================================================
// G-3: a takeover's stop finds marked escapees from its start

/// The escapee: a bash that logs its TERM and exits. It writes its pid only once its trap is
/// set. It is started before the leader ignores TERM and HUP: a non-interactive bash cannot trap
/// a signal that was ignored when it started.
const ESCAPEE_SH: &str = r#"trap 'echo "escapee-TERM $$" >> "$LOG"; exit 0' TERM
echo $$ > "$PIDFILE.tmp" && mv "$PIDFILE.tmp" "$PIDFILE"
while :; do sleep 0.05; done
"#;

/// The leader: double-forks the escapee into its own session (`( ... &)`: its parent exits, so
/// it is reparented to the wrapper, a subreaper, and to init once the wrapper is gone), then
/// ignores TERM and HUP and loops, so the rest of the run holds out until KILL at the grace.
const STUBBORN_LEADER_SH: &str =
    r#"(setsid bash "$0" &); trap "" TERM HUP; while :; do sleep 0.05; done"#;

#[test]
fn after_kill_9_of_the_wrapper_cancel_sends_term_to_a_marked_setsid_escapee_at_the_start_of_the_stop_not_only_kill_at_the_grace(
) {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-escapee-term");
    let tmp = root.dir.path();
    let (log, pidfile, escapee_sh) = (
        tmp.join("escapee.log"),
        tmp.join("escapee.pid"),
        tmp.join("escapee.sh"),
    );
    fs::write(&escapee_sh, ESCAPEE_SH).expect("cannot write the escapee's script");
    let workload: Vec<String> = ["bash", "-c", STUBBORN_LEADER_SH, path_str(&escapee_sh)]
        .map(str::to_string)
        .to_vec();
    let mut cmd = root.cmd();
    cmd.env("LOG", &log).env("PIDFILE", &pidfile);
    let out = run_with_timeout(
        cmd.args(start_args("--detach --grace 3s", c.id, &workload)),
        CMD,
    );
    c.code(&out, 0, "start --detach");
    let st = c.status();
    let wrapper = st["wrapper_pid"].as_i64().unwrap_or(0) as i32;
    let leader = st["pid"].as_i64().unwrap_or(0) as i32;
    c.check(wrapper > 0 && leader > 0, "no wrapper or leader pid");
    let wrapper_pin = Pinned::new(&[wrapper]);

    let escapee: i32 = c.wait("the escapee's pid file", || {
        let text = fs::read_to_string(&pidfile).map_err(|e| e.to_string())?;
        text.trim().parse().map_err(|e| format!("{text:?}: {e}"))
    });
    let pins = Pinned::new(&[leader, escapee]);
    c.all_alive(&pins, "the leader and the escapee");
    // The premises: the escapee is a marked process in a session of its own, able to run a
    // TERM handler; the leader ignores TERM and HUP, so the stop lasts until the grace.
    let sid_of = |pid: i32| match proc_stat(pid) {
        Some((_, _, _, sid, _)) => sid,
        None => c.fail(format_args!("no /proc/{pid}/stat")),
    };
    let (escapee_sid, leader_sid) = (sid_of(escapee), sid_of(leader));
    c.check(
        escapee_sid == escapee && leader_sid == leader,
        format_args!("escapee sid {escapee_sid}, leader sid {leader_sid}"),
    );
    c.check(
        marked(&root.run_dir(c.id)).contains(&escapee),
        "the escapee does not carry the run's marker",
    );
    c.check(
        mask_has(escapee, "SigCgt:", libc::SIGTERM),
        "the escapee does not catch TERM",
    );
    c.check(
        mask_has(leader, "SigIgn:", libc::SIGTERM) && mask_has(leader, "SigIgn:", libc::SIGHUP),
        "the leader does not ignore TERM and HUP",
    );

    c.kill_wrapper(wrapper, &wrapper_pin);
    let ppid = proc_stat(escapee).map(|s| s.1);
    c.check(
        ppid.is_some_and(|p| p != wrapper && p != leader),
        format_args!("the escapee's parent is {ppid:?}: not reparented away from the run"),
    );

    cancel_stops_all(c, &pins, leader_sid);

    let logged = fs::read_to_string(&log).unwrap_or_default();
    c.check(
        logged.contains(&format!("escapee-TERM {escapee}")),
        format_args!("the escapee's TERM handler never ran; its log: {logged:?}"),
    );
    let events = root.events(c.id);
    let terms = signals_to(&events, "cancel", "TERM", escapee);
    c.check(
        !terms.is_empty(),
        format_args!("no TERM event to the escapee {escapee}"),
    );
    let at_ms = terms[0]["at_ms"].as_u64().unwrap_or(u64::MAX);
    c.check(
        at_ms < 1000,
        format_args!("the escapee's TERM came {at_ms} ms into the stop, not at its start"),
    );
    c.eq(
        signals_to(&events, "cancel", "KILL", escapee).len(),
        0,
        "KILLs sent to the escapee, which exits on TERM",
    );
    c.eq(c.final_state_events(), 1, "final state events");
}

// =============================================================================================
// G-4: a damaged lease.json keeps the last deadline (wrapper) or gets the orphan grace (watchdog)

/// A tree under a foreground wrapper with a 4 s lease; lease.json is replaced with garbage once
/// the wrapper has read it, then the wrapper is woken (SIGUSR1, as `renew` does) so it reads the
/// garbage well before the deadline. The run still ends at the deadline it had.
#[test]
fn a_garbage_lease_json_keeps_the_last_deadline_and_the_foreground_run_ends_lease_expired_with_124()
{
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-lease-garbage");
    let tree = fx("tree --children 1 --grandchildren");
    let (proc, wrapper, wrapper_pin) = c.spawn_start(root.cmd(), "--quiet --lease 4s", &tree);
    let (ready, pins) = c.pin_tree();
    let deadline = c.lease_deadline();
    c.wait("the wrapper asleep in its supervise loop", || {
        sleeping_in_poll(wrapper)
    });

    c.replace("lease.json", br#"{"deadline_epoch": "x", "lease_s": 4}"#);
    c.signal(&wrapper_pin, wrapper, libc::SIGUSR1);
    let complaint = c.wait_event("lease_unreadable");
    let kept = complaint["keeping_deadline"].as_f64().unwrap_or(f64::NAN);
    c.check(
        (kept - deadline).abs() < 1e-6,
        format_args!("lease_unreadable keeps {kept}, not the deadline {deadline}: {complaint}"),
    );

    let left = (deadline - epoch_now()).max(0.0);
    c.finish_within(proc, Duration::from_secs_f64(left) + T, 124);
    all_gone_now(c, &pins, ready.sid, "after the wrapper exited");
    expired_at(c, &c.status(), deadline);
    let expired = c.events("lease_expired");
    c.check(
        !expired.is_empty() && c.epoch(&expired[0], "ts") >= deadline - 0.002,
        "no lease_expired event at or after the deadline",
    );
    c.wait_gone(&wrapper_pin, "the wrapper");
}

/// The same with a detached wrapper and lease.json cut in half (invalid JSON); nobody wakes the
/// wrapper, so it reads the damaged file at the deadline, and ends the run there.
#[test]
fn a_truncated_lease_json_does_not_disable_the_lease_of_a_detached_run() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-lease-truncated");
    let (run, ready, pins) = start_tree(c, "--lease 3s", "tree --children 1 --grandchildren");
    let deadline = c.lease_deadline();
    c.wait("the wrapper asleep in its supervise loop", || {
        sleeping_in_poll(run.wrapper)
    });
    let lease = c.bytes("lease.json");
    c.replace("lease.json", &lease[..lease.len() / 2]);

    let st = c.wait_state(&FINAL_STATES);
    c.wait_gone(&pins, "the tree");
    c.nothing_left(ready.sid, "after the final record");
    expired_at(c, &st, deadline);
    c.ctl(&["wait", c.id], 124);
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

/// An orphan (its wrapper kill -9ed) whose lease.json is garbage is a run without a lease to the
/// watchdog: left alone within the orphan grace, stopped (`wrapper_lost`) after it. Before the
/// fix the watchdog skipped it on every pass.
#[test]
fn an_orphan_whose_lease_json_is_garbage_is_stopped_by_the_watchdog_after_the_orphan_grace() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-lease-orphan");
    let (run, ready, pins) = start_tree(c, "--lease 1h", "tree --children 2 --grandchildren");
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    c.replace("lease.json", br#"{"deadline_epoch": "x"}"#);

    c.watchdog_once("1h");
    c.all_alive(&pins, "after a watchdog pass within the orphan grace");
    c.record("status.json", json!({"state": "running"}));

    let out = c.watchdog_once("0");
    all_gone_now(
        c,
        &pins,
        ready.sid,
        "right after the watchdog pass past the orphan grace",
    );
    let st = c.status();
    let want = ended("cancelled", "wrapper_lost");
    if st.get("state") != Some(&json!("cancelled")) {
        c.fail(format_args!(
            "the watchdog did not stop the orphan\n{}",
            describe_output("agent-run-watchdog --once", &out)
        ));
    }
    c.fields(&st, "status.json", want);
    let takeovers = c.events("takeover");
    c.check(
        takeovers.iter().any(|e| e["by"] == "watchdog"),
        "no takeover event by the watchdog",
    );
    c.eq(c.final_state_events(), 1, "final state events");
}

// =============================================================================================
// G-5: cancel continues a stopped wrapper

#[test]
fn cancel_continues_a_sigstopped_wrapper_of_a_run_without_lease_and_the_run_ends_cancelled() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-stopped-wrapper");
    let (run, ready, pins) = start_tree(c, "", "tree --children 2 --grandchildren --escapee");
    c.signal(&run.wrapper_pin, run.wrapper, libc::SIGSTOP);
    c.wait("the wrapper to be stopped", || {
        match proc_stat(run.wrapper) {
            Some(s) if s.0 == 'T' => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    cancel_stops_all(c, &pins, ready.sid);
    let events = root.events(c.id);
    c.eq(
        signals_to(&events, "cancel", "TERM", run.wrapper).len(),
        1,
        "TERMs from cancel to the wrapper",
    );
    c.eq(
        signals_to(&events, "cancel", "CONT", run.wrapper).len(),
        1,
        "CONTs from cancel to the wrapper",
    );
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    c.eq(c.final_state_events(), 1, "final state events");
}

// =============================================================================================
// G-7: a corrupt record is refused

#[test]
fn a_corrupt_status_json_does_not_stop_a_stop_cancel_goes_by_kernel_facts() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-corrupt-record");
    let (_run, _, pins) = c.orphan(&fx("tree --children 2 --grandchildren"));
    let record = c.bytes("status.json");
    let half = &record[..record.len() / 2];
    let truncated = fs::OpenOptions::new()
        .write(true)
        .open(c.file("status.json"))
        .and_then(|f| f.set_len(half.len() as u64));
    truncated.unwrap_or_else(|e| c.fail(format_args!("cannot truncate status.json: {e}")));

    // The record cannot be read: the run's cgroup (found by its name) and its marker find its
    // processes, and a whole record is written anew.
    c.ctl(&["cancel", c.id], 0);
    c.wait_gone(&pins, "the run's processes");
    let st = c.status();
    c.check(
        st["state"] == "cancelled" || st["state"] == "unknown",
        format_args!("the record written anew: {st}"),
    );
    c.check(
        !c.events("record_damaged").is_empty(),
        "the damaged record is not journalled",
    );
}

// =============================================================================================
// G-1: a launch declared lost never runs

/// `AGENT_RUN_FAULT=after_run_dir` makes the first wrapper SIGKILL itself right after its
/// `mkdir`: a run dir without a record. `cancel` declares the launch lost (`unknown`,
/// `wrapper_lost`), and from then on the id never runs its command: a later `start` of the id is
/// a relaunch of a final run and exits as the record maps (75, as `wait` does), the command
/// unrun.
///
/// A wrapper that is only slow, not dead, is the next test: the wrapper's own check after it
/// takes the lock (`Launch::new` in `wrapper/src/launch/prepare.rs`: a record already there means
/// "declared lost", exit 70, nothing run) is what covers that race.
#[test]
fn a_launch_declared_lost_by_cancel_is_final_unknown_and_the_id_never_runs_its_command() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-lost-launch");
    let counter = root.dir.path().join("counter");
    let counting = counting(&counter, 0);
    let ran = || fs::read_to_string(&counter).unwrap_or_default();

    let mut cmd = root.cmd();
    cmd.env("AGENT_RUN_FAULT", "after_run_dir")
        .args(start_args("--quiet", c.id, &counting));
    let out = run_with_timeout(&mut cmd, CMD);
    c.code(
        &out,
        128 + libc::SIGKILL,
        "start with AGENT_RUN_FAULT=after_run_dir",
    );
    c.check(
        root.run_dir(c.id).is_dir() && !c.file("status.json").exists(),
        "the fault point left no run dir, or a record",
    );

    let out = c.ctl(&["cancel", "--json", c.id], 0);
    let printed = c.parse(&out, "cancel");
    for key in RECORD_KEYS {
        c.check(
            printed.get(key).is_some(),
            format_args!("cancel's output has no {key:?}"),
        );
    }
    let want = json!({"state": "unknown", "reason": "wrapper_lost", "exit_code": null});
    c.fields(&printed, "cancel's output", want.clone());
    c.check(
        !printed["error"].is_null(),
        "the lost launch names no error",
    );
    c.fields(&c.status(), "status.json", want);
    let record = c.bytes("status.json");

    for opts in ["--quiet", "--detach"] {
        let args = start_args(opts, c.id, &counting);
        let out = run_with_timeout(root.cmd().args(&args), CMD);
        let what = format!("agent-run {}", args.join(" "));
        c.eq(
            ran(),
            "",
            format_args!("the counter after\n{}", describe_output(&what, &out)),
        );
        c.eq(
            c.bytes("status.json"),
            record.as_slice(),
            format_args!("status.json after start {opts}"),
        );
        // A final record maps to one exit code, which `wait`, `attach` and a relaunch share.
        c.code(&out, 75, &what);
    }
    c.ctl(&["wait", c.id], 75);
    c.eq(c.final_state_events(), 1, "final state events");
    c.eq(c.events("launch").len(), 0, "launch events");
}

/// The test's end of a [`hold_flock`] filter.
struct Listener(OwnedFd);

/// What the listener has to say.
enum Heard {
    /// A held flock: its notification id, the caller's pid and the fd it locks.
    Flock { id: u64, pid: u32, fd: u64 },
    /// Nothing within the timeout.
    Quiet,
    /// No process uses the filter any more.
    Closed,
}

impl Listener {
    /// Takes a copy of the listener from the process `pid` (pidfd_getfd).
    fn take(pid: i32) -> io::Result<Listener> {
        let pidfd =
            sys::pidfd_open(pid)?.ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        Ok(Listener(sys::pidfd_getfd(pidfd.as_fd(), LISTENER_FD)?))
    }

    fn next(&self, timeout: Duration) -> Heard {
        let revents = match sys::poll_one(self.0.as_fd(), libc::POLLIN, timeout) {
            Ok(0) | Err(_) => return Heard::Quiet,
            Ok(revents) => revents,
        };
        if revents & libc::POLLIN == 0 {
            return Heard::Closed;
        }
        // SAFETY: seccomp_notif is plain data; the kernel wants it zeroed, and fills it in.
        let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: SECCOMP_IOCTL_NOTIF_RECV writes one seccomp_notif into `notif`.
        let r = unsafe {
            libc::ioctl(
                self.0.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &mut notif,
            )
        };
        if r < 0 {
            // ENOENT: the caller died before we read its notification.
            return Heard::Quiet;
        }
        Heard::Flock {
            id: notif.id,
            pid: notif.pid,
            fd: notif.data.args[0],
        }
    }

    /// Lets a held flock go on (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`: the kernel runs it).
    fn proceed(&self, id: u64) {
        let mut resp = libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        };
        // SAFETY: SECCOMP_IOCTL_NOTIF_SEND reads one seccomp_notif_resp. ENOENT (the caller
        // died meanwhile) needs nothing more.
        unsafe {
            libc::ioctl(
                self.0.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &mut resp,
            )
        };
    }

    /// Lets every later flock go on, from a thread, until `done` or no process uses the filter.
    fn answer_all(self, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                match self.next(Duration::from_millis(50)) {
                    Heard::Flock { id, .. } => self.proceed(id),
                    Heard::Quiet => {}
                    Heard::Closed => return,
                }
            }
        })
    }
}

/// The race itself: the wrapper has made its run dir and is held at its `flock` (a seccomp
/// user-notification filter, released by the test) while `cancel` finds the dir without a
/// record, takes the free lock and declares the launch lost. Let go, the wrapper gets the lock,
/// finds the final record and refuses to run: exit 70, the command unrun, the record untouched.
#[test]
fn a_wrapper_stalled_between_mkdir_and_flock_while_cancel_declares_the_launch_lost_never_runs() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-stalled-launch");
    let counter = root.dir.path().join("counter");
    let mut cmd = root.cmd();
    hold_flock(&mut cmd);
    let proc = Spawned::spawn(cmd.args(start_args("--quiet", c.id, &counting(&counter, 0))));
    let wrapper = proc.child.id() as i32;
    let _wrapper_pin = Pinned::new(&[wrapper]);
    let listener = Listener::take(wrapper)
        .unwrap_or_else(|e| c.fail(format_args!("cannot take the wrapper's listener: {e}")));

    // Every flock but the run's lock goes on at once; the run's lock is held.
    let lock = c.file("lock");
    let start = Instant::now();
    let held = loop {
        match listener.next(T.saturating_sub(start.elapsed())) {
            Heard::Flock { id, pid, fd } => {
                // The run's lock is the dir's flock, taken first (then `lock`'s).
                let target = fs::read_link(format!("/proc/{pid}/fd/{fd}"));
                if target.is_ok_and(|t| t == lock || t == root.run_dir(c.id)) {
                    break id;
                }
                listener.proceed(id);
            }
            Heard::Quiet if start.elapsed() < T => {}
            Heard::Quiet | Heard::Closed => c.fail("the wrapper never flocked its run's lock"),
        }
    };
    c.check(
        root.run_dir(c.id).is_dir() && !c.file("status.json").exists(),
        "the held wrapper has no run dir, or already a record",
    );

    let out = c.ctl(&["cancel", "--json", c.id], 0);
    let printed = c.parse(&out, "cancel");
    let want = ended("unknown", "wrapper_lost");
    c.fields(&printed, "cancel's output", want);
    let record = c.bytes("status.json");

    listener.proceed(held);
    let done = Arc::new(AtomicBool::new(false));
    let answering = listener.answer_all(Arc::clone(&done));
    let out = proc.finish(CMD);
    done.store(true, Ordering::SeqCst);
    let _ = answering.join();
    let what = "the held wrapper, let go";
    c.eq(
        fs::read_to_string(&counter).unwrap_or_default(),
        "",
        format_args!("the counter\n{}", describe_output(what, &out)),
    );
    c.eq(
        c.bytes("status.json"),
        record,
        "status.json after the wrapper",
    );
    c.code(&out, 70, what);
    let stderr = String::from_utf8_lossy(&out.stderr);
    c.check(
        stderr.contains("declared lost"),
        format_args!("the wrapper does not say why it refused: {stderr:?}"),
    );
    c.eq(c.events("launch").len(), 0, "launch events");
    c.eq(c.final_state_events(), 1, "final state events");
}

// =============================================================================================
// G-2: no pidfd for the leader is not a launch failure

// A tight RLIMIT_NOFILE cannot fail exactly the pidfd_open after the spawn: the spawn itself
// needs two more descriptors (its exec-error pipe) than pidfd_open does, so at every limit where
// the spawn succeeds pidfd_open does too (tried: limits 4..=15 fail before or at the spawn, 16
// and up run with a pidfd). A seccomp filter fails exactly pidfd_open instead.

/// The leader exits 7 right after its ready line, leaving a child: with every pidfd_open failing
/// (EMFILE), the wrapper still records `running`, notices the exit (SIGCHLD), stops the child
/// (kill(2) after a start-time check) and passes 7 through.
#[test]
fn a_wrapper_denied_pidfds_still_supervises_its_workload_and_passes_its_exit_code_through() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-no-pidfd-exit");
    let tree = "tree --children 1 --leader-exit 7";
    let (proc, _wrapper, wrapper_pin) = start_denied_pidfds(c, libc::EMFILE, "--quiet", tree);
    // The leader exits at once: its tree is pinned, not checked alive.
    let ready = c.ready();
    let pins = Pinned::new(&ready.all_pids());

    c.finish(proc, 7);
    all_gone_now(c, &pins, ready.sid, "after the wrapper exited");
    let st = c.status();
    c.fields(
        &st,
        "status.json",
        json!({"state": "finished", "exit_code": 7, "pid": ready.pid, "error": null}),
    );
    let signalled = st["cleanup"]["signalled"].as_array().cloned();
    let child = json!(ready.members[0]);
    c.check(
        signalled.is_some_and(|s| s.contains(&child)),
        format_args!("cleanup does not list the leftover child {child}"),
    );
    c.wait_gone(&wrapper_pin, "the wrapper");
}

/// With pidfd_open failing as on a kernel before 5.3 (ENOSYS), the wrapper runs its workload
/// holding no pidfd, and TERM to it stops the whole tree (escapee included) through kill(2).
#[test]
fn term_to_a_wrapper_denied_pidfds_stops_the_tree_without_them_and_exits_143() {
    let root = TestRoot::new();
    let (c, _reaper) = reaped(&root, "dg-no-pidfd-term");
    let tree = "tree --children 2 --grandchildren --escapee";
    let (proc, wrapper, wrapper_pin) =
        start_denied_pidfds(c, libc::ENOSYS, "--quiet --grace 3s", tree);
    let (ready, pins) = c.pin_tree();
    let seccomp = fs::read_to_string(format!("/proc/{wrapper}/status")).unwrap_or_default();
    c.check(
        seccomp
            .lines()
            .any(|l| l.split_whitespace().eq(["Seccomp:", "2"])),
        "the wrapper runs without its seccomp filter",
    );
    c.eq(
        pidfds_of(wrapper),
        Vec::<String>::new(),
        "pidfds the wrapper holds",
    );
    c.record("status.json", json!({"state": "running", "pid": ready.pid}));

    c.signal(&wrapper_pin, wrapper, libc::SIGTERM);
    c.finish(proc, 143);
    all_gone_now(c, &pins, ready.sid, "after the wrapper exited");
    c.record("status.json", ended("cancelled", "signal:TERM"));
    let failed: Vec<Value> =
        c.events_where("signal", |e| e["by"] == "wrapper" && !e["error"].is_null());
    c.eq(failed, Vec::<Value>::new(), "signals that failed");
}
