//! [honest-stop]: nothing the workload writes can stop a stop, fake an ending or buy time.
//!
//! Each test plays a workload that attacks its own run (docs/safety.md, section B4, one finding
//! a test), in each place a workload runs from where the finding applies: as root in a cgroup
//! of its own, as `nobody` held by /proc scans, as `nobody` in a cgroup delegated to it. The
//! assertions are on the process table (pidfds) and on the record the kernel must agree with.

use std::fs;
use std::time::{Duration, Instant};

use agent_run_tests::ctx;
use agent_run_tests::hostile_run::{files_of, said_pid, workload, Mode, Run, Side, CMD};
use agent_run_tests::mode_tests;
use agent_run_tests::{ensure, wait_until_dbg, Ctx, Pinned, TestRoot};
use serde_json::{json, Value};

/// The grace every run here gets: short, so a KILL comes soon.
const GRACE: &str = "1s";

fn start(side: &Side<'_>, id: &str, opts: &[&str], damage: &str) -> Run {
    let (go, said) = files_of(side, id);
    let mut all = vec!["--grace", GRACE];
    all.extend(opts);
    side.start(id, &all, &workload(&go, &said, damage))
}

/// [`start`], then the workload let go and waited for until its damage is done: the run and
/// its checks.
fn start_done<'a>(side: &Side<'a>, id: &'a str, opts: &[&str], damage: &str) -> (Run, Ctx<'a>) {
    let run = start(side, id, opts, damage);
    run.go_and_wait("done");
    (run, ctx(side.root, id))
}

/// [`start_done`] with a lease of `secs` seconds: also the lease's deadline, as the test can
/// know it (taken once the start returned).
fn start_leased_done<'a>(
    side: &Side<'a>,
    id: &'a str,
    secs: u32,
    damage: &str,
) -> (Run, Ctx<'a>, f64) {
    let run = start(side, id, &["--lease", &format!("{secs}s")], damage);
    let deadline = agent_run_tests::hostile::epoch_now() + f64::from(secs);
    run.go_and_wait("done");
    (run, ctx(side.root, id), deadline)
}

/// As nobody, in a cgroup delegated to nobody (none where the host cannot delegate one): the
/// run ID whose workload does the damage made from the delegated cgroup's path, waited for
/// until it is done.
fn damage_as_delegated<'a>(
    root: &'a TestRoot,
    tag: &str,
    id: &str,
    damage: impl FnOnce(&str) -> String,
) -> Option<(Side<'a>, Run)> {
    if !Mode::all().contains(&Mode::NobodyDelegated) {
        return None;
    }
    let side = Side::new(root, Mode::NobodyDelegated, tag);
    let parent = side.delegated().expect("delegated").display().to_string();
    let (run, _) = start_done(&side, id, &[], &damage(&parent));
    Some((side, run))
}

/// Every process of the run is gone, and the record is final: `cancelled` where the kernel
/// can prove emptiness, else `unknown` with the reason that says why.
fn stopped_honestly(side: &Side<'_>, run: &Run, extra: &Pinned) -> Value {
    let c = ctx(side.root, &run.id);
    c.wait_gone(&run.leader_pin, "the run's leader");
    c.wait_gone(extra, "the processes the workload started");
    let st = side.root.wait_final(&run.id, CMD);
    let state = st["state"].as_str().unwrap_or_default();
    if state == "cancelled" {
        ensure!(
            c,
            st["proof"] == "cgroup_empty" || st["proof"] == "tree_walk",
            "cancelled without a proof: {st}"
        );
    } else {
        ensure!(
            c,
            state == "unknown" && st["reason"].is_string(),
            "neither cancelled nor an unknown that says why: {st}"
        );
    }
    st
}

// ---------------------------------------------------------------------------------------------
// F1: KILL is never skipped in cgroup mode; zombies are reaped throughout the stop

fn a_pid_hopper_on_term_is_killed_through_its_cgroup(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f1");
    // On TERM: fork, the parent exits, the child makes a session of its own, and so on for
    // ever; so at the KILL step every process a look pinned may be gone, and the newest
    // generation not pinned yet.
    let hopper = side.shared.join("hopper.py");
    fs::write(
        &hopper,
        "import os, signal, time\n\
         def hop(sig, frm):\n    while True:\n        if os.fork() > 0:\n            os._exit(0)\n        os.setsid()\n\
         signal.signal(signal.SIGTERM, hop)\nsignal.signal(signal.SIGHUP, hop)\n\
         while True:\n    time.sleep(1)\n",
    )
    .expect("the hopper");
    let damage = format!("python3 {} & say armed", hopper.display());
    let damage = damage.as_str();
    let run = start(&side, "hopper", &[], damage);
    run.go_and_wait("armed");
    let c = ctx(&root, "hopper");
    let t0 = Instant::now();
    // While the cancel runs: the most zombies the wrapper (the hoppers' subreaper) holds.
    let done = std::sync::atomic::AtomicBool::new(false);
    let (code, err, most) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(zombies_of(run.wrapper));
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        });
        let (code, _, err) = side.ctl(&["cancel", "hopper"]);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (code, err, sampler.join().expect("the sampler"))
    });
    c.eq(code, 0, format_args!("cancel: {err}"));
    ensure!(
        c,
        most < 500,
        "{most} zombies piled up under the wrapper during the stop: nothing reaped them"
    );
    ensure!(
        c,
        t0.elapsed() < Duration::from_secs(12),
        "the cancel took {:?}",
        t0.elapsed()
    );
    let st = stopped_honestly(&side, &run, &Pinned::new(&[]));
    c.eq(&st["state"], "cancelled", "the record");
    let cg = st["containment"]["cgroup"].as_str().unwrap_or_default();
    ensure!(
        c,
        !std::path::Path::new(cg).exists(),
        "the run's cgroup {cg} is left: nothing was to live in it"
    );
    let survivors = st["cleanup"]["survivors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    c.eq(survivors.len(), 0, "survivors named");
}

/// How many zombie children `parent` has now.
fn zombies_of(parent: i32) -> usize {
    fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|&p| {
                    agent_run_tests::proc_stat(p).is_some_and(|s| s.0 == 'Z' && s.1 == parent)
                })
                .count()
        })
        .unwrap_or(0)
}

mode_tests!(a_pid_hopper_on_term_is_killed_through_its_cgroup;
    a_pid_hopper_on_term_is_killed_through_its_cgroup_as_root => RootCgroup,
    a_pid_hopper_on_term_is_killed_through_its_cgroup_as_nobody_delegated => NobodyDelegated,
);

#[test]
fn a_process_moved_into_the_runs_cgroup_from_outside_is_killed_with_the_run() {
    let root = TestRoot::new();
    let side = Side::new(&root, Mode::RootCgroup, "f1m");
    // Started before the run: no look at /proc takes it for the run's; only its cgroup does.
    let mut older = std::process::Command::new(agent_run_tests::fixture_bin())
        .args(["sleep-ms", "600000"])
        .spawn()
        .expect("the older process");
    let pin = Pinned::new(&[older.id() as i32]);
    let run = start(&side, "moved-in", &[], "say ready");
    run.go_and_wait("ready");
    let st = root.status("moved-in");
    let cg = st["containment"]["cgroup"]
        .as_str()
        .expect("a cgroup")
        .to_string();
    fs::write(format!("{cg}/cgroup.procs"), older.id().to_string()).expect("move it in");
    let c = ctx(&root, "moved-in");
    let (code, _, err) = side.ctl(&["cancel", "moved-in"]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    c.wait_gone(&pin, "the process moved into the run's cgroup");
    let _ = older.wait();
    let st = stopped_honestly(&side, &run, &pin);
    c.eq(&st["state"], "cancelled", "the record");
}

// ---------------------------------------------------------------------------------------------
// F2: a damaged run file aborts nothing

/// What the workload does to its own run dir, by name.
const DAMAGE: [(&str, &str); 8] = [
    ("rm-status", "rm -f \"$AGENT_RUN_DIR/status.json\""),
    (
        "events-symlink",
        "rm -f \"$AGENT_RUN_DIR/events.jsonl\"; ln -s /dev/null \"$AGENT_RUN_DIR/events.jsonl\"",
    ),
    (
        "events-dir",
        "rm -f \"$AGENT_RUN_DIR/events.jsonl\"; mkdir \"$AGENT_RUN_DIR/events.jsonl\"",
    ),
    (
        "events-fifo",
        "rm -f \"$AGENT_RUN_DIR/events.jsonl\"; mkfifo \"$AGENT_RUN_DIR/events.jsonl\"",
    ),
    (
        "lock-dir",
        "rm -f \"$AGENT_RUN_DIR/lock\"; mkdir \"$AGENT_RUN_DIR/lock\"",
    ),
    ("lock-000", "chmod 000 \"$AGENT_RUN_DIR/lock\""),
    ("dir-500", "chmod 500 \"$AGENT_RUN_DIR\""),
    (
        "everything",
        "rm -f \"$AGENT_RUN_DIR/status.json\" \"$AGENT_RUN_DIR/lock\"; mkdir \"$AGENT_RUN_DIR/lock\"; \
         chmod 500 \"$AGENT_RUN_DIR\"",
    ),
];

fn a_damaged_run_file_never_stops_a_stop(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f2");
    for (name, damage) in DAMAGE {
        // With its wrapper alive: cancel finds it by the run's lock and asks it.
        let id = format!("{name}-live");
        let (run, c) = start_done(&side, &id, &[], damage);
        let t0 = Instant::now();
        let (code, _, err) = side.ctl(&["cancel", &id]);
        c.eq(
            code,
            0,
            format_args!("cancel after {name} in {mode:?}: {err}"),
        );
        ensure!(
            c,
            t0.elapsed() < Duration::from_secs(11),
            "{name}: the cancel took {:?}",
            t0.elapsed()
        );
        c.wait_gone(&run.wrapper_pin, "the wrapper, after its stop");
        stopped_honestly(&side, &run, &Pinned::new(&[]));

        // With its wrapper SIGKILLed by the workload and a 1 s lease: the watchdog stops it.
        let id = format!("{name}-orphan");
        let damage = format!("{damage}; kill -9 $PPID");
        let (run, c) = start_done(&side, &id, &["--lease", "1s"], &damage);
        c.wait_gone(&run.wrapper_pin, "the wrapper the workload killed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while run.leader_pin.alive().contains(&run.leader) && Instant::now() < deadline {
            let out = agent_run_tests::run_with_timeout(
                side.watchdog().args(["--once", "--orphan-grace", "0"]),
                CMD,
            );
            let err = String::from_utf8_lossy(&out.stderr);
            c.check(
                out.status.success() && !err.contains("failed"),
                format_args!("watchdog --once after {name} in {mode:?}: {err}"),
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        stopped_honestly(&side, &run, &Pinned::new(&[]));
    }
}

mode_tests!(a_damaged_run_file_never_stops_a_stop;
    a_damaged_run_file_never_stops_a_stop_as_root => RootCgroup,
    a_damaged_run_file_never_stops_a_stop_as_nobody_in_procfs_mode => NobodyProcfs,
    a_damaged_run_file_never_stops_a_stop_as_nobody_delegated => NobodyDelegated,
);

// ---------------------------------------------------------------------------------------------
// F3: a forged final record is not believed while the kernel contradicts it

fn a_forged_final_record_is_not_believed(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f3");
    let forge = "sed -e 's/\"state\": *\"running\"/\"state\": \"finished\"/' \
                 -e 's/\"exit_code\": *null/\"exit_code\": 0/' \"$AGENT_RUN_DIR/status.json\" \
                 > \"$AGENT_RUN_DIR/.f\" && mv \"$AGENT_RUN_DIR/.f\" \"$AGENT_RUN_DIR/status.json\"";
    let (run, c) = start_done(&side, "forger", &[], forge);
    c.record("the forged record", json!({"state": "finished"}));
    // wait and attach do not return on it; status says what the kernel says.
    let (code, _, err) = side.ctl(&["wait", "forger", "--timeout", "1s"]);
    c.eq(code, 75, format_args!("wait on a forged record: {err}"));
    let (code, out, err) = side.ctl(&["status", "--json", "forger"]);
    c.eq(code, 0, format_args!("status: {err}"));
    let v: Value = serde_json::from_str(&out).expect("status --json");
    c.eq(
        &v["wrapper_alive"],
        true,
        "wrapper_alive of a forged record",
    );
    ensure!(
        c,
        v["note"].as_str().is_some_and(|n| n.contains("rewritten")),
        "status's note: {v}"
    );
    // gc leaves it, and says why.
    let (code, _, err) = side.ctl(&["gc", "--older-than", "0s"]);
    c.eq(code, 0, format_args!("gc: {err}"));
    ensure!(c, run.dir.is_dir(), "gc removed a live run's dir: {err}");
    // cancel stops it; the wrapper's own record replaces the forged one.
    let (code, _, err) = side.ctl(&["cancel", "forger"]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    let st = stopped_honestly(&side, &run, &Pinned::new(&[]));
    c.eq(&st["state"], "cancelled", "the wrapper's record");
}

mode_tests!(a_forged_final_record_is_not_believed;
    a_forged_final_record_is_not_believed_as_root => RootCgroup,
    a_forged_final_record_is_not_believed_as_nobody_in_procfs_mode => NobodyProcfs,
);

/// Asked to stop, the workload forges a final record and kills its wrapper, which `cancel` had
/// seen alive; a child in a session of its own lives on. `cancel` then scans only the pids
/// newer than that wrapper for the run's marker (the wrapper forked the run): the child is
/// among them, so the record is not believed and the child is stopped. (The child holds no
/// pipe of the run's output: the output keeper then ends at once, and nobody holds the run.)
fn a_record_forged_as_the_wrapper_dies_mid_cancel_is_not_believed(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f3w");
    let forge = "sed -e 's/\"state\": *\"[a-z]*\"/\"state\": \"finished\"/' \
                 \"$AGENT_RUN_DIR/status.json\" > \"$AGENT_RUN_DIR/.f\" \
                 && mv \"$AGENT_RUN_DIR/.f\" \"$AGENT_RUN_DIR/status.json\"";
    let damage = format!(
        "setsid sleep 600 </dev/null >/dev/null 2>&1 & say \"pid child $!\"; \
         forge() {{ {forge}; }}; trap 'forge; kill -9 $PPID; exit 0' TERM"
    );
    let (run, c) = start_done(&side, "forger", &[], &damage);
    let child = said_pid(&run.said(), "child").expect("the child");
    let child_pin = Pinned::new(&[child]);
    let (code, _, err) = side.ctl(&["cancel", "forger"]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    c.wait_gone(&run.wrapper_pin, "the wrapper the workload killed");
    let st = stopped_honestly(&side, &run, &child_pin);
    ensure!(
        c,
        st["state"] != "finished",
        "the forged record stood: {st}"
    );
}

mode_tests!(a_record_forged_as_the_wrapper_dies_mid_cancel_is_not_believed;
    a_record_forged_as_the_wrapper_dies_mid_cancel_is_not_believed_as_root => RootCgroup,
    a_record_forged_as_the_wrapper_dies_mid_cancel_is_not_believed_as_nobody_in_procfs_mode => NobodyProcfs,
);

// ---------------------------------------------------------------------------------------------
// F4: a rewritten `containment` hides nothing: the run's cgroup is found by its name

fn a_rewritten_containment_hides_nothing(mode: Mode, by_watchdog: bool) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f4");
    let id = if by_watchdog {
        "contain-wd"
    } else {
        "contain-cancel"
    };
    // A child that leaves its session and clears its environment, then the wrapper killed;
    // the record's containment rewritten to procfs (and then to null).
    let damage = "setsid env -i sleep 600 & say \"pid child $!\"; kill -9 $PPID";
    let opts: &[&str] = if by_watchdog { &["--lease", "1s"] } else { &[] };
    let (run, c) = start_done(&side, id, opts, damage);
    c.wait_gone(&run.wrapper_pin, "the wrapper the workload killed");
    let child = said_pid(&run.said(), "child").expect("the child's pid");
    let child_pin = Pinned::new(&[child]);
    for forged in [
        serde_json::json!({"mode": "procfs", "cgroup": null}),
        Value::Null,
    ] {
        agent_run_tests::hostile::edit_status(&run.dir, |st| {
            st.insert("containment".into(), forged.clone());
        });
        if mode != Mode::RootCgroup {
            std::os::unix::fs::chown(run.dir.join("status.json"), Some(65534), Some(65534))
                .expect("chown the forged record");
        }
    }
    if by_watchdog {
        wait_until_dbg("the watchdog to stop the run", CMD, || {
            let out = agent_run_tests::run_with_timeout(side.watchdog().arg("--once"), CMD);
            let st = root.status(id);
            if st["state"] == "running" || st["state"] == "cancelling" {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            } else {
                Ok(())
            }
        });
    } else {
        let (code, _, err) = side.ctl(&["cancel", id]);
        c.eq(code, 0, format_args!("cancel: {err}"));
    }
    let st = stopped_honestly(&side, &run, &child_pin);
    c.eq(&st["state"], "cancelled", "the record");
    c.eq(
        &st["containment"]["mode"],
        "cgroup",
        "the record's containment, set right",
    );
}

mode_tests!(|m| a_rewritten_containment_hides_nothing(m, false);
    a_rewritten_containment_hides_nothing_from_cancel_as_root => RootCgroup,
);

mode_tests!(|m| a_rewritten_containment_hides_nothing(m, true);
    a_rewritten_containment_hides_nothing_from_the_watchdog_as_root => RootCgroup,
);

mode_tests!(|m| a_rewritten_containment_hides_nothing(m, false);
    a_rewritten_containment_hides_nothing_as_nobody_delegated => NobodyDelegated,
);

// ---------------------------------------------------------------------------------------------
// F5: an escape is named where the kernel cannot refuse it; never `cancelled` over it

#[test]
fn a_child_moved_out_of_a_delegated_run_cgroup_is_named_and_the_run_is_unknown() {
    let root = TestRoot::new();
    let Some((side, run)) = damage_as_delegated(&root, "f5", "escaper", |parent| {
        format!(
            "setsid env -i sleep 600 & c=$!; echo $c > '{parent}/cgroup.procs' && say \"pid child $c\"; \
             kill -9 $PPID"
        )
    }) else {
        return;
    };
    let c = ctx(&root, "escaper");
    let child = said_pid(&run.said(), "child").expect("the child moved out");
    let child_pin = Pinned::new(&[child]);
    c.wait_gone(&run.wrapper_pin, "the wrapper the workload killed");
    let (code, _, err) = side.ctl(&["cancel", "escaper"]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    c.wait_gone(&run.leader_pin, "the run's leader");
    let st = root.wait_final("escaper", CMD);
    c.eq(
        (st["state"].as_str(), st["reason"].as_str()),
        (Some("unknown"), Some("escaped")),
        format_args!("the record: {st}"),
    );
    let named: Vec<i64> = st["cleanup"]["escapees"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    ensure!(
        c,
        named.contains(&i64::from(child)),
        "the escapee {child} is not named: {st}"
    );
    // Named, never signalled: nothing proves it is the run's.
    c.all_alive(&child_pin, "the escapee");
    let _ = child_pin.signal(child, libc::SIGKILL);
    // Gone before the delegated cgroup it sits in is removed.
    let _ = child_pin.wait_all_gone(CMD);
}

#[test]
fn an_environment_cleared_child_after_a_wrapper_loss_in_procfs_mode_is_never_called_cancelled() {
    let root = TestRoot::new();
    let side = Side::new(&root, Mode::NobodyProcfs, "f5p");
    let damage = "setsid env -i sleep 600 & say \"pid child $!\"; kill -9 $PPID";
    let (run, c) = start_done(&side, "hider", &[], damage);
    let child = said_pid(&run.said(), "child").expect("the child");
    let child_pin = Pinned::new(&[child]);
    c.wait_gone(&run.wrapper_pin, "the wrapper the workload killed");
    let (code, _, err) = side.ctl(&["cancel", "hider"]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    let st = root.wait_final("hider", CMD);
    c.eq(
        (
            st["state"].as_str(),
            st["reason"].as_str(),
            st["proof"].as_str(),
        ),
        (Some("unknown"), Some("unprovable"), Some("unprovable")),
        format_args!("the record: {st}"),
    );
    let _ = child_pin.signal(child, libc::SIGKILL);
    // Gone before the delegated cgroup it sits in is removed.
    let _ = child_pin.wait_all_gone(CMD);
}

// ---------------------------------------------------------------------------------------------
// F6: a stalled wrapper does not stall cancel

/// `cancel` of a run whose wrapper (`wrapper`, in a failure) makes no progress succeeds within
/// the run's grace + 10 s; the wrapper is gone and the run stopped honestly.
fn cancel_stalled(side: &Side<'_>, run: &Run, wrapper: &str) {
    let c = ctx(side.root, &run.id);
    let t0 = Instant::now();
    let (code, _, err) = side.ctl(&["cancel", &run.id]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    ensure!(
        c,
        t0.elapsed() < Duration::from_secs(11),
        "the cancel took {:?}",
        t0.elapsed()
    );
    c.wait_gone(&run.wrapper_pin, wrapper);
    stopped_honestly(side, run, &Pinned::new(&[]));
}

fn a_wrapper_stopped_again_and_again_is_taken_over(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f6");
    // A tight loop: the wrapper gets a few microseconds between two stops.
    let damage = "say looping; (while :; do kill -STOP $PPID 2>/dev/null; done) &";
    let (run, c) = start_done(&side, "stopper", &[], damage);
    cancel_stalled(&side, &run, "the wrapper that made no progress");
    // Between two of the workload's SIGSTOPs the wrapper may get the CPU long enough to stop
    // the run itself (its stop takes ~20 ms here): then no takeover is needed. Either way the
    // stop is journalled, and the cancel ended in time.
    let took_over = !c.events("takeover").is_empty();
    let own_stop = c.events("stop_end").iter().any(|e| e["by"] == "wrapper");
    ensure!(
        c,
        took_over || own_stop,
        "neither a takeover nor the wrapper's own stop journalled"
    );
}

mode_tests!(a_wrapper_stopped_again_and_again_is_taken_over;
    a_wrapper_stopped_again_and_again_is_taken_over_as_root => RootCgroup,
    a_wrapper_stopped_again_and_again_is_taken_over_as_nobody_in_procfs_mode => NobodyProcfs,
);

#[test]
fn a_wrapper_moved_into_a_frozen_cgroup_of_the_workloads_is_thawed_and_taken_over() {
    let root = TestRoot::new();
    let Some((side, run)) = damage_as_delegated(&root, "f6f", "freezer", |parent| {
        format!(
            "mkdir '{parent}/ice' && echo $PPID > '{parent}/ice/cgroup.procs' && \
             echo 1 > '{parent}/ice/cgroup.freeze' && say frozen"
        )
    }) else {
        return;
    };
    let c = ctx(&root, "freezer");
    cancel_stalled(&side, &run, "the frozen wrapper");
    ensure!(c, !c.events("thaw").is_empty(), "no thaw journalled");
}

// ---------------------------------------------------------------------------------------------
// F7: a fake heartbeat only ever brings the orphan's stop earlier

fn a_touched_lock_does_not_keep_an_orphan_alive(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f7");
    let damage = "kill -9 $PPID; (while :; do touch \"$AGENT_RUN_DIR/lock\"; sleep 0.3; done) &";
    let (run, c) = start_done(&side, "beater", &[], damage);
    c.wait_gone(&run.wrapper_pin, "the wrapper the workload killed");
    let first = Instant::now();
    // Passes from a timer, as a host runs them: the grace counts from the first that saw the
    // wrapper gone, whatever the lock's mtime says after.
    let deadline = first + Duration::from_secs(25);
    loop {
        let _ = agent_run_tests::run_with_timeout(
            side.watchdog().args(["--once", "--orphan-grace", "2s"]),
            CMD,
        );
        let st = root.status("beater");
        if st["state"] != "running" && st["state"] != "cancelling" {
            break;
        }
        ensure!(
            c,
            Instant::now() < deadline,
            "the orphan still runs {:?} after the first pass: {st}",
            first.elapsed()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    ensure!(
        c,
        first.elapsed() >= Duration::from_millis(1500),
        "stopped {:?} after the first pass: before its grace",
        first.elapsed()
    );
    stopped_honestly(&side, &run, &Pinned::new(&[]));
}

mode_tests!(a_touched_lock_does_not_keep_an_orphan_alive;
    a_touched_lock_does_not_keep_an_orphan_alive_as_root => RootCgroup,
    a_touched_lock_does_not_keep_an_orphan_alive_as_nobody_in_procfs_mode => NobodyProcfs,
);

// ---------------------------------------------------------------------------------------------
// F8: only the run's starter renews its lease

fn the_workload_cannot_renew_its_own_lease(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f8");
    let bin = agent_run_tests::agent_run_bin().display().to_string();
    let rootdir = root.root().display().to_string();
    // A far deadline written into lease.json, the wrapper woken; then `renew` itself.
    let damage = format!(
        "printf '{{\"deadline_epoch\": 9999999999, \"lease_s\": 3600}}' > \"$AGENT_RUN_DIR/.l\" && \
         mv \"$AGENT_RUN_DIR/.l\" \"$AGENT_RUN_DIR/lease.json\"; kill -USR1 $PPID; \
         '{bin}' --root '{rootdir}' renew \"$AGENT_RUN_ID\" --lease 1h; say \"renew $?\"; \
         tr '\\0' '\\n' < /proc/$$/environ | grep -c AGENT_RUN_LEASE_TOKEN | sed 's/^/token /' >> \"$SAID\"; \
         cat /proc/$PPID/environ > /dev/null 2>&1; say \"environ $?\""
    );
    let (run, c, deadline) = start_leased_done(&side, "renewer", 3, &damage);
    let said = run.said();
    ensure!(c, said.contains("renew 77"), "the workload's renew: {said}");
    ensure!(
        c,
        said.contains("token 0"),
        "the token is in the workload's environment: {said}"
    );
    if mode != Mode::RootCgroup {
        ensure!(
            c,
            !said.contains("environ 0"),
            "the workload read its wrapper's environment: {said}"
        );
    }
    let st = root.wait_final("renewer", CMD);
    let ended = c.epoch(&st, "ended_at");
    ensure!(
        c,
        ended < deadline + 3.0,
        "the run ended {:.1} s after its first lease's deadline: the workload renewed it",
        ended - deadline
    );
    c.eq(&st["reason"], "lease_expired", "the record's reason");
    ensure!(c, !c.events("lease_refused").is_empty(), "no lease_refused");
    ensure!(c, !c.events("renew_refused").is_empty(), "no renew_refused");
}

mode_tests!(the_workload_cannot_renew_its_own_lease;
    the_workload_cannot_renew_its_own_lease_as_root => RootCgroup,
    the_workload_cannot_renew_its_own_lease_as_nobody => NobodyProcfs,
);

/// The workload writes itself a far lease and stops its wrapper, so nothing reads lease.json
/// for it: the watchdog goes by the deadline the wrapper published in its heartbeat thread's
/// name, and stops the run at its true lease.
fn a_stopped_wrapper_behind_a_forged_lease_is_stopped_at_its_true_deadline(mode: Mode) {
    let root = TestRoot::new();
    let side = Side::new(&root, mode, "f8s");
    let damage =
        "printf '{\"deadline_epoch\": 9999999999, \"lease_s\": 3600}' > \"$AGENT_RUN_DIR/.l\" && \
                  mv \"$AGENT_RUN_DIR/.l\" \"$AGENT_RUN_DIR/lease.json\"; kill -STOP $PPID";
    let (run, c, deadline) = start_leased_done(&side, "sleeper", 2, damage);
    wait_until_dbg("the watchdog to stop the run", CMD, || {
        let out = agent_run_tests::run_with_timeout(
            side.watchdog().args(["--once", "--slack", "1s"]),
            CMD,
        );
        let st = root.status("sleeper");
        if st["state"] == "running" || st["state"] == "cancelling" {
            std::thread::sleep(Duration::from_millis(200));
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        } else {
            Ok(())
        }
    });
    let st = stopped_honestly(&side, &run, &Pinned::new(&[]));
    c.eq(&st["reason"], "lease_expired", "the record's reason");
    let ended = c.epoch(&st, "ended_at");
    // The true deadline, then the grace (1 s) and the slack (1 s), a pass's time and the stop.
    ensure!(
        c,
        ended < deadline + 10.0,
        "the run ended {:.1} s after its true deadline: the forged lease held",
        ended - deadline
    );
}

mode_tests!(a_stopped_wrapper_behind_a_forged_lease_is_stopped_at_its_true_deadline;
    a_stopped_wrapper_behind_a_forged_lease_is_stopped_at_its_true_deadline_as_root => RootCgroup,
    a_stopped_wrapper_behind_a_forged_lease_is_stopped_at_its_true_deadline_as_nobody => NobodyProcfs,
);

// ---------------------------------------------------------------------------------------------
// F9, F10, F11: what people read

#[test]
fn a_record_full_of_escape_sequences_reaches_a_terminal_escaped() {
    let root = TestRoot::new();
    let side = Side::new(&root, Mode::RootCgroup, "f9");
    let (run, c) = start_done(&side, "painter", &[], "kill -9 $PPID; say done; exit 0");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    c.wait_gone(&run.leader_pin, "the workload");
    agent_run_tests::hostile::edit_status(&run.dir, |st| {
        st.insert("state".into(), "cancelled".into());
        st.insert("reason".into(), "\u{1b}]0;PWNED\u{7}\u{1b}[2J".into());
        st.insert("error".into(), "\u{1b}[31mred\r".into());
        st.insert("ended_at".into(), "2026-12-06T00:00:00.000Z".into());
    });
    // On a terminal: cancel prints its one line for people.
    let bin = agent_run_tests::agent_run_bin().display().to_string();
    let out = agent_run_tests::run_with_timeout(
        std::process::Command::new("script").args([
            "-qec",
            &format!("'{bin}' --root '{}' cancel painter", root.root().display()),
            "/dev/null",
        ]),
        CMD,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        c,
        text.contains("painter"),
        "cancel printed nothing: {text:?}"
    );
    // Our own colour may be there; none of the record's sequences, raw.
    for raw in ["\u{1b}]", "\u{7}", "\u{1b}[2J", "\u{1b}[31m", "red\r"] {
        ensure!(
            c,
            !text.contains(raw),
            "{raw:?} reached the terminal: {text:?}"
        );
    }
    ensure!(
        c,
        text.contains("\\x1b]0;PWNED\\x07"),
        "the record's reason is not shown escaped: {text:?}"
    );
}

#[test]
fn no_document_offers_the_pgid_file_as_a_kill_recipe() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for doc in ["README.md", "docs/contract.md"] {
        let text = fs::read_to_string(repo.join(doc)).expect("the doc");
        assert!(
            !text.contains("$(cat pgid)") && !text.contains("cat pgid"),
            "{doc} still offers the pgid file as a recipe"
        );
    }
}

#[test]
fn a_damaged_lease_of_an_orphan_is_said_by_the_watchdog_and_by_status() {
    let root = TestRoot::new();
    let side = Side::new(&root, Mode::RootCgroup, "f11");
    let damage = "printf 'garbage' > \"$AGENT_RUN_DIR/.l\"; kill -9 $PPID; \
                  mv \"$AGENT_RUN_DIR/.l\" \"$AGENT_RUN_DIR/lease.json\"";
    let (run, c) = start_done(&side, "leaseless", &["--lease", "1h"], damage);
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    let out = agent_run_tests::run_with_timeout(side.watchdog().arg("--once"), CMD);
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        err.contains("leaseless: lease.json is damaged"),
        "the watchdog did not say it: {err}"
    );
    ensure!(
        c,
        !c.events("lease_unreadable").is_empty(),
        "not journalled"
    );
    let (code, out, err) = side.ctl(&["status", "leaseless"]);
    c.eq(code, 0, format_args!("status: {err}"));
    ensure!(
        c,
        out.contains("lease.json"),
        "status says nothing of it: {out}"
    );
    let (code, out, err) = side.ctl(&["list"]);
    c.eq(code, 0, format_args!("list: {err}"));
    ensure!(
        c,
        out.lines()
            .any(|l| l.starts_with("leaseless") && l.contains("damaged")),
        "list says nothing of it: {out}"
    );
    let (_, out, _) = side.ctl(&["list", "--json"]);
    let rows: Value = serde_json::from_str(&out).expect("list --json");
    ensure!(
        c,
        rows[0]["lease_unreadable"].is_string(),
        "list --json has no lease_unreadable: {rows}"
    );
    let (_, _, _) = side.ctl(&["cancel", "leaseless"]);
    stopped_honestly(&side, &run, &Pinned::new(&[]));
}
