//! A record the workload forged or planted (cancel.json, a state, another boot, a pid that now
//! belongs to an unrelated process) lends `cancel` nothing: the run is still stopped, and nothing
//! that is not the run's is signalled.
//!
//! Every test drives the real binaries against real process trees (the `fixture` program) in its
//! own run root, and asserts on kernel facts: pids pinned with pidfds right after the fixture's
//! ready line, sessions and fds read from /proc, the run dir's files. Messages and exit codes are
//! checked too, never alone. Waits poll a probe to one deadline; every process a test sees is
//! pinned, so it is killed by pid when the test ends.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_run_tests::ctx::{ctx, Ctx, Detached};
use agent_run_tests::ensure;
use agent_run_tests::facts::*;
use agent_run_tests::workload::*;
use agent_run_tests::{fixture_bin, proc_stat, Pinned, TestRoot};
use serde_json::{json, Value};

/// A boot id that is no host's: a record that names it is of an earlier boot.
const OTHER_BOOT: &str = "00000000-0000-4000-8000-000000000000";

/// The orphan whose record a test forges: `fixture tree --children 1`, started detached, its
/// wrapper SIGKILLed. The run (it holds the pins of its wrapper and leader) and the tree's pins.
fn orphan_of_one_child(c: Ctx) -> (Detached, Pinned) {
    let (run, _, tree) = c.orphan(&fx("tree --children 1"));
    (run, tree)
}

/// A process of the test's own, unrelated to any run: `fixture sleep-ms 60000`.
struct Unrelated {
    child: std::process::Child,
    pid: i32,
    pin: Pinned,
}

impl Unrelated {
    fn spawn() -> Unrelated {
        let mut cmd = Command::new(fixture_bin());
        let child = cmd.args(["sleep-ms", "60000"]).stdin(Stdio::null()).spawn();
        let child = child.expect("cannot spawn the unrelated process");
        let pid = child.id() as i32;
        let pin = Pinned::new(&[pid]);
        Unrelated { child, pid, pin }
    }

    /// `recorded`, or one tick earlier should it happen to equal this process's start time, so
    /// that a record is certain to disagree with the process now behind the pid.
    fn ticks_unlike(&self, recorded: u64) -> u64 {
        let mine = proc_stat(self.pid)
            .expect("the unrelated process is alive")
            .4;
        if recorded == mine {
            recorded - 1
        } else {
            recorded
        }
    }
}

impl Drop for Unrelated {
    fn drop(&mut self) {
        let _ = self.pin.signal(self.pid, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The record's `state` with `from` replaced by `to`, written over status.json as the run
/// could (same user, a plain rewrite).
fn forge_state(c: Ctx, from: &str, to: &str) {
    let path = c.root.run_dir(c.id).join("status.json");
    let text = fs::read_to_string(&path).unwrap();
    let forged = text.replace(
        &format!("\"state\": \"{from}\""),
        &format!("\"state\": \"{to}\""),
    );
    ensure!(c, forged != text, "no {from:?} state in {text}");
    fs::write(&path, forged).unwrap();
}

/// How many TERMs `cancel` sent (its journal lines: `by` cancel, to the wrapper).
fn terms_from_cancel(c: Ctx) -> usize {
    let signals = c.events("signal").into_iter();
    signals
        .filter(|e| e["by"] == "cancel" && e["signal"] == "TERM")
        .count()
}

/// Whether `pid`'s main thread blocks signal `sig` (/proc/PID/status `SigBlk`).
fn blocks(pid: i32, sig: i32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    mask & (1 << (sig - 1)) != 0
}

/// The run plants a cancel.json and rewrites its record to `cancelling`, so that every cancel
/// finds a request (not its own) and a record that says the stop is under way. `cancel` asks
/// the kernel instead (the wrapper's signal mask says whether it is stopping): a second later
/// it signals the wrapper, and the run ends cancelled with nothing left.
#[test]
fn a_run_that_plants_cancel_json_and_forges_cancelling_is_still_stopped_by_cancel() {
    planted_request_and_forged_state_do_not_keep_cancel_from_stopping_the_run(
        "forged-cancelling",
        "cancelling",
    );
}

/// The same with a forged final record (`finished`): its cgroup contradicts it, and the
/// wrapper, which holds the lock, is the one to finish the run; cancel signals it a second
/// later, as the wrapper is not stopping.
#[test]
fn a_run_that_plants_cancel_json_and_forges_a_final_record_is_still_stopped_by_cancel() {
    planted_request_and_forged_state_do_not_keep_cancel_from_stopping_the_run(
        "forged-finished",
        "finished",
    );
}

fn planted_request_and_forged_state_do_not_keep_cancel_from_stopping_the_run(
    id: &str,
    forged: &str,
) {
    let root = TestRoot::new();
    let c = ctx(&root, id);
    let run = c.start_running("", &fx("tree --children 2"));
    let (_, tree) = c.pin_tree();
    fs::write(root.run_dir(c.id).join("cancel.json"), "{}").unwrap();
    forge_state(c, "running", forged);
    if forged == "cancelling" {
        // status says what the kernel says of the record's word.
        let v = c.json(&["status", "--json", c.id]);
        c.eq(
            &v["note"],
            "but its wrapper is not stopping the run: the record was rewritten",
            format_args!("{v}"),
        );
    }
    ensure!(
        c,
        !blocks(run.wrapper, libc::SIGURG),
        "the wrapper says it is stopping before any stop"
    );
    let out = c.ctl(&["cancel", "--json", "--wait", "20s", c.id], 0);
    c.gone_now(&tree, "right after cancel returned");
    let printed = c.parse(&out, "cancel");
    c.fields(&printed, "cancel's output", json!({"state": "cancelled"}));
    c.record("status.json", json!({"state": "cancelled"}));
    let terms = terms_from_cancel(c);
    c.eq(terms, 1, "TERMs from cancel to the wrapper");
    c.wait_gone(&run.wrapper_pin, "the wrapper after cancel");
}

/// The other way round: during a stop's grace the run rewrites its record back to `running`,
/// so that a second cancel would take the first for one whose caller died before signalling,
/// and TERM the wrapper again, which means KILL now. The wrapper's signal mask says it is
/// stopping (URG blocked, TERM not), so the second cancel only waits, and the grace holds.
#[test]
fn a_record_forged_back_to_running_mid_stop_does_not_make_a_second_cancel_cut_the_grace() {
    let root = TestRoot::new();
    let c = ctx(&root, "forged-running");
    let (argv, _log) = c.logged_tree("--children 1 --leader-term ignore --member-term ignore");
    let run = c.start_running("--grace 3s --hup-after 0", &argv);
    let (_, tree) = c.pin_tree();
    ensure!(
        c,
        !blocks(run.wrapper, libc::SIGURG),
        "the wrapper says it is stopping before any stop"
    );
    // The first cancel starts the stop and returns at once (exit 75: still cancelling).
    let t0 = Instant::now();
    c.ctl(&["cancel", "--wait", "0s", c.id], 75);
    c.wait("the wrapper's mask to say it is stopping", || {
        (blocks(run.wrapper, libc::SIGURG) && !blocks(run.wrapper, libc::SIGTERM))
            .then_some(())
            .ok_or("not yet".to_string())
    });
    forge_state(c, "cancelling", "running");
    let v = c.json(&["status", "--json", c.id]);
    c.eq(
        &v["note"],
        "its wrapper is stopping the run",
        format_args!("{v}"),
    );
    let out = c.ctl(&["cancel", "--json", "--wait", "30s", c.id], 0);
    let took = t0.elapsed();
    c.gone_now(&tree, "right after the second cancel returned");
    let printed = c.parse(&out, "cancel");
    c.fields(&printed, "cancel's output", json!({"state": "cancelled"}));
    let terms = terms_from_cancel(c);
    c.eq(terms, 1, "TERMs from the cancels to the wrapper");
    c.eq(
        c.events("stop_escalated").len(),
        0,
        "a second TERM cut the grace short",
    );
    ensure!(
        c,
        took >= Duration::from_millis(2900),
        "the stop ended after {took:?}, within the 3 s grace: it was cut short"
    );
    c.wait_gone(&run.wrapper_pin, "the wrapper after cancel");
}

#[test]
fn a_record_whose_pid_now_belongs_to_an_unrelated_process_lends_it_nothing_and_the_run_is_stopped()
{
    let root = TestRoot::new();
    let c = ctx(&root, "reused");
    let (_run, tree) = orphan_of_one_child(c);

    let unrelated = Unrelated::spawn();
    c.edit_status(|st| {
        let ticks = st["start_ticks"].as_u64().expect("start_ticks");
        for key in ["pid", "pgid", "sid"] {
            st.insert(key.into(), unrelated.pid.into());
        }
        st.insert("start_ticks".into(), unrelated.ticks_unlike(ticks).into());
    });

    // The record's leader is not the run's by any kernel fact: it is not used, and the run is
    // stopped by what the kernel shows of it (its cgroup, its marker).
    c.ctl(&["cancel", c.id], 0);
    c.all_alive(&unrelated.pin, "the unrelated process");
    c.gone_now(&tree, "the run's own processes");
    c.check(
        !c.events("record_unusable").is_empty(),
        "the unusable record is not journalled",
    );
    let targets: Vec<String> = c
        .events("signal")
        .iter()
        .filter_map(|e| e["pid"].as_i64())
        .map(|p| p.to_string())
        .collect();
    c.check(
        !targets.contains(&unrelated.pid.to_string()),
        format_args!(
            "the unrelated pid {} was signalled: {targets:?}",
            unrelated.pid
        ),
    );
}

#[test]
fn a_recorded_wrapper_pid_that_belongs_to_an_unrelated_process_is_not_signalled_the_true_wrapper_is(
) {
    let root = TestRoot::new();
    let c = ctx(&root, "reused-wrapper");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    let unrelated = Unrelated::spawn();
    c.edit_status(|st| {
        let ticks = st["wrapper_start_ticks"]
            .as_u64()
            .expect("wrapper_start_ticks");
        st.insert("wrapper_pid".into(), unrelated.pid.into());
        st.insert(
            "wrapper_start_ticks".into(),
            unrelated.ticks_unlike(ticks).into(),
        );
    });

    // The wrapper is the holder of the run's lock, whatever the record names.
    c.ctl(&["cancel", c.id], 0);
    c.all_alive(&unrelated.pin, "the unrelated process");
    c.gone_now(&tree, "the run's processes");
    let st = c.wait_final();
    c.fields(&st, "the record", ended("cancelled", "cancel_request"));
    let to_wrapper: Vec<Value> =
        c.events_where("signal", |e| e["target"] == format!("pid:{}", run.wrapper));
    c.eq(to_wrapper.len(), 1, "TERMs to the true wrapper");
    c.all_alive(&unrelated.pin, "the unrelated process at the end");
}

#[test]
fn a_record_forged_to_another_boot_over_live_processes_is_rewritten_and_the_run_is_stopped() {
    let root = TestRoot::new();
    let c = ctx(&root, "rebooted");
    let (_run, tree) = orphan_of_one_child(c);
    assert_ne!(
        boot_id(),
        OTHER_BOOT,
        "this host's boot id is the forged one"
    );
    c.edit_status(|st| {
        st.insert("boot_id".into(), OTHER_BOOT.into());
    });

    // The run's cgroup holds its processes: they are this boot's, whatever the record says.
    let note = c.json(&["status", "--json", c.id])["note"].clone();
    c.check(
        note.as_str().is_some_and(|n| n.contains("rewritten")),
        format_args!("status --json's note: {note}"),
    );
    c.cancel_now(&tree, "the run's processes");
    c.record(
        "the record",
        json!({"state": "cancelled", "proof": "cgroup_empty"}),
    );
}

#[test]
fn a_record_of_an_earlier_boot_with_nothing_of_it_held_is_host_rebooted_and_nothing_is_signalled() {
    let root = TestRoot::new();
    let c = ctx(&root, "old-boot");
    let (_run, tree) = orphan_of_one_child(c);
    // The run's processes are not its any more (its cgroup and marker are what find them):
    // take them out of its cgroup and clear the record's cgroup, as after a reboot.
    let cg = c.status()["containment"]["cgroup"]
        .as_str()
        .map(str::to_string);
    let unrelated = Unrelated::spawn();
    c.edit_status(|st| {
        st.insert("boot_id".into(), OTHER_BOOT.into());
        for key in ["pid", "pgid", "sid"] {
            st.insert(key.into(), unrelated.pid.into());
        }
    });
    // Stop the real tree ourselves (cleanup of the scenario), then look.
    for p in tree.pids() {
        let _ = agent_run_tests::sys::pidfd_kill(p);
    }
    c.wait_gone(&tree, "the tree, killed by the test");
    if let Some(cg) = cg {
        let _ = fs::remove_dir(cg);
    }
    let rebooted = json!({"note": "host rebooted"});
    c.fields(
        &c.json(&["status", "--json", c.id]),
        "status --json",
        rebooted.clone(),
    );
    let list = c.json(&["list", "--json"]);
    let entry = list
        .as_array()
        .and_then(|a| a.iter().find(|e| e["run_id"] == c.id));
    c.fields(entry.unwrap_or(&Value::Null), "list --json", rebooted);
    c.ctl(&["cancel", c.id], 0);
    c.all_alive(&unrelated.pin, "the process the old record names");
    c.record("the record", ended("unknown", "host_rebooted"));
}
