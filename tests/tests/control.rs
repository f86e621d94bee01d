//! Black-box tests of agent-run's second control channel: `cancel`, `renew`, `status`, `wait`,
//! `attach`, `logs`, `list`, `gc`, `start --detach` and relaunch by run id.
//!
//! Every test drives the real binaries against real process trees (the `fixture` program) in its
//! own run root, and asserts on kernel facts: pids pinned with pidfds right after the fixture's
//! ready line, sessions and fds read from /proc, the run dir's files. Messages and exit codes are
//! checked too, never alone. Nothing sleeps to synchronise: waits poll a probe to one generous
//! deadline (two slow cores in CI), and every process a test sees is pinned, so it is killed by
//! pid when the test ends, whatever happened.
//!
//! The seed article's failure paths (`docs/references.md`) appear as far as they happen on
//! one host: TERM to the wrapper (1), TERM to the leader alone (2), a `cancelling` record whose
//! wrapper died mid-stop (4), two runs of one user of which one is cancelled (5). Path 3 (the
//! controller's connection dies) is the lease's business: here only `renew` moving the deadline
//! (lease expiry itself is core's and the watchdog's). The gateway report (`docs/references.md`) gives the
//! rule that follows every `cancel`: assert on the pids, not on the absence of an error.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use agent_run_tests::ctx::{ctx, Ctx, CMD};
use agent_run_tests::ensure;
use agent_run_tests::facts::*;
use agent_run_tests::workload::*;
use agent_run_tests::{
    describe_output, exit_code, fixture_bin, proc_stat, Pinned, Spawned, TestRoot,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Facts of this file's tests

/// The number in a signal event's target (`"group:123"`, `"pid:123"` or `123`).
fn target_number(event: &Value) -> Option<i64> {
    match &event["target"] {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok(),
        _ => None,
    }
}

/// How many lines the fixture's handlers logged for `pid` and `signal` (`"<role> <pid> TERM"`).
fn logged(log: &Path, pid: i32, signal: &str) -> usize {
    let text = fs::read_to_string(log).unwrap_or_default();
    let pid = pid.to_string();
    let matches = |l: &&str| l.split_whitespace().skip(1).eq([pid.as_str(), signal]);
    text.lines().filter(matches).count()
}

/// The value of the first key of an object whose name starts with `prefix` (the contract names
/// list's columns, "age", "lease left", "exit", not its keys).
fn key_starting<'a>(entry: &'a Value, prefix: &str) -> Option<&'a Value> {
    let mut keys = entry.as_object()?.iter();
    keys.find(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v)
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

/// Spawns `agent-run cancel ID` `n` times at once and returns their outputs.
fn concurrent_cancels(c: Ctx, n: usize) -> Vec<Output> {
    let cancels: Vec<Spawned> = (0..n)
        .map(|_| Spawned::wrapper(c.root, &["cancel", c.id]))
        .collect();
    let pids: Vec<i32> = cancels.iter().map(|s| s.child.id() as i32).collect();
    let _pins = Pinned::new(&pids);
    cancels.into_iter().map(|s| s.finish(CMD)).collect()
}

/// Every output exited 0 and printed the record status.json holds now.
fn all_print_the_final_record(c: Ctx, outs: &[Output]) {
    let st = c.status();
    for (i, out) in outs.iter().enumerate() {
        c.code(out, 0, &format!("cancel #{i}"));
        let printed = c.parse(out, &format!("cancel #{i}"));
        for key in ["state", "reason", "ended_at", "exit_code", "term_signal"] {
            c.eq(&printed[key], &st[key], format_args!("cancel #{i}: {key}"));
        }
    }
}

// =============================================================================================
// cancel

#[test]
fn cancel_stops_the_worker_tree_and_nothing_is_left_when_it_returns() {
    let root = TestRoot::new();
    let c = ctx(&root, "worker");
    let log = root.dir.path().join("worker.log");
    let tree_opts = "--children 2 --grandchildren --leader-term log-exit --member-term log-exit";
    let run = c.start_detached("", &logged_tree(tree_opts, &log));
    let (ready, tree) = c.pin_tree();

    let t0 = Instant::now();
    let out = c.ctl(&["cancel", c.id], 0);
    let took = t0.elapsed();
    eprintln!("cancel of a cooperative tree returned in {took:?} (target < 50 ms)");

    // The gateway report's lesson: the pids, not the absence of an error.
    c.gone_now(&tree, "right after cancel returned");
    c.session_empty(ready.sid);
    for pid in ready.all_pids() {
        c.eq(
            logged(&log, pid, "TERM"),
            1,
            format_args!("TERMs logged by {pid}"),
        );
    }
    let printed = c.parse(&out, "cancel");
    c.record_keys(&printed, "cancel's output");
    c.fields(
        &printed,
        "cancel's output",
        json!({"state": "cancelled", "reason": "cancel_request"}),
    );
    let st = c.status();
    c.eq(
        &printed["ended_at"],
        &st["ended_at"],
        "ended_at printed vs status.json",
    );
    c.check(
        took < Duration::from_secs(5),
        format_args!("cancel took {took:?}"),
    );
    // cancel prints the record as `status --json` does.
    let status = c.json(&["status", "--json", c.id]);
    let keys = |v: &Value| v.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>());
    c.eq(
        keys(&printed),
        keys(&status),
        "cancel's keys vs status --json's",
    );
    // wait and attach agree with the wrapper: cancelled by `cancel` is 143.
    c.ctl(&["wait", c.id], 143);
    c.ctl(&["attach", c.id], 143);
    c.wait_gone(&run.wrapper_pin, "the wrapper after cancel");
}

#[test]
fn cancel_of_a_foreground_run_writes_cancel_json_and_the_wrapper_exits_143() {
    let root = TestRoot::new();
    let c = ctx(&root, "fg");
    let fg = c.start_foreground(
        "--quiet",
        &fx("tree --children 1 --grandchildren"),
        Stdio::null(),
    );
    let (ready, tree) = c.pin_tree();
    c.eq(
        ready.pid,
        fg.leader,
        "the ready line's leader vs the record's pid",
    );

    let cancel = Spawned::wrapper(&root, &["cancel", c.id]);
    let cancel_pid = cancel.child.id();
    let out = cancel.finish(CMD);
    c.code(&out, 0, "cancel");
    c.gone_now(&tree, "right after cancel returned");
    c.finish(fg.proc, 143);
    c.gone_now(&fg.wrapper_pin, "the wrapper after it exited");

    let st = c.status();
    c.fields(
        &st,
        "status.json",
        json!({"state": "cancelled", "reason": "cancel_request"}),
    );
    c.eq(
        &c.parse(&out, "cancel")["ended_at"],
        &st["ended_at"],
        "printed ended_at",
    );

    let request = text(&c.bytes("cancel.json"));
    let request: Value = serde_json::from_str(&request)
        .unwrap_or_else(|e| c.fail(format_args!("cancel.json: {e}: {request:?}")));
    for key in ["source", "requested_at", "by_uid", "by_pid"] {
        c.check(
            request.get(key).is_some(),
            format_args!("cancel.json has no {key}: {request}"),
        );
    }
    c.fields(
        &request,
        "cancel.json",
        json!({"by_pid": cancel_pid, "by_uid": geteuid()}),
    );
    let at = request["requested_at"].as_str().unwrap_or_default();
    c.check(
        is_rfc3339_ms(at),
        format_args!("cancel.json requested_at: {request}"),
    );
    // The TERM to the wrapper is journalled with its target and reason.
    let signals = c.events("signal");
    let to_wrapper: Vec<&Value> = signals
        .iter()
        .filter(|e| target_number(e) == Some(i64::from(fg.wrapper)))
        .collect();
    c.eq(to_wrapper.len(), 1, "signals journalled to the wrapper");
    c.fields(
        to_wrapper[0],
        "the wrapper's signal event",
        json!({"signal": "TERM"}),
    );
    c.check(
        to_wrapper[0].get("reason").is_some(),
        "the signal event names no reason",
    );
    // cancel.json is written before the wrapper is signalled.
    let signalled_at = to_wrapper[0]["ts"].as_str().unwrap_or_default();
    let ordered = at <= signalled_at;
    c.check(
        ordered,
        format_args!("cancel.json at {at}, TERM at {signalled_at}"),
    );
}

#[test]
fn term_to_the_wrapper_stops_leader_children_and_grandchildren() {
    let root = TestRoot::new();
    let c = ctx(&root, "term-wrapper");
    let log = root.dir.path().join("worker.log");
    let tree_opts = "--children 2 --grandchildren --leader-term log-exit --member-term log-exit";
    let fg = c.start_foreground("--quiet", &logged_tree(tree_opts, &log), Stdio::null());
    let (ready, tree) = c.pin_tree();
    fg.proc.signal(libc::SIGTERM);
    let st = c.wait_final();
    c.gone_now(&tree, "when the record became final");
    c.fields(
        &st,
        "status.json",
        json!({"state": "cancelled", "reason": "signal:TERM"}),
    );
    for pid in ready.all_pids() {
        c.eq(
            logged(&log, pid, "TERM"),
            1,
            format_args!("TERMs logged by {pid}"),
        );
    }
    c.session_empty(ready.sid);
    c.finish(fg.proc, 143);
}

#[test]
fn term_to_the_leader_alone_ends_the_run_and_its_group_is_stopped_before_the_final_record() {
    let root = TestRoot::new();
    let c = ctx(&root, "term-leader");
    let log = root.dir.path().join("worker.log");
    // The members handle TERM and HUP and stay: only the stop routine's KILL ends them.
    let tree_opts = "--children 2 --grandchildren --member-term log-stay --member-hup log-stay";
    let fg = c.start_foreground(
        "--quiet --grace 1s",
        &logged_tree(tree_opts, &log),
        Stdio::null(),
    );
    let (ready, tree) = c.pin_tree();
    c.signal(&tree, ready.pid, libc::SIGTERM);

    let st = c.wait_final();
    c.gone_now(&tree, "when the record became final");
    let want = json!({"state": "finished", "term_signal": "TERM", "exit_code": null});
    c.fields(&st, "status.json", want);
    let signals = st["cleanup"]["signals"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let needed = signals.contains(&json!("TERM")) && signals.contains(&json!("KILL"));
    c.check(
        needed,
        format_args!("cleanup should list TERM and KILL: {}", st["cleanup"]),
    );
    // The members' TERM came from the wrapper's stop routine: the test signalled the leader only.
    for &pid in &ready.members {
        c.eq(
            logged(&log, pid, "TERM"),
            1,
            format_args!("TERMs logged by member {pid}"),
        );
    }
    c.finish(fg.proc, 143);
}

#[test]
fn a_cancelling_record_whose_wrapper_died_mid_stop_is_told_apart_and_finished_by_the_next_cancel() {
    let root = TestRoot::new();
    let c = ctx(&root, "stuck");
    let f = ctx(&root, "fresh");
    let log = root.dir.path().join("worker.log");
    // Everyone handles TERM and stays; HUP (default) ends them, but only 5 s into a stop.
    let tree_opts = "--children 1 --grandchildren --leader-term log-stay --member-term log-stay";
    let run = c.start_detached("--hup-after 5s --grace 60s", &logged_tree(tree_opts, &log));
    let (ready, tree) = c.pin_tree();
    let fresh = f.start_detached("", &fx("tree --children 1"));
    let (_, fresh_tree) = f.pin_tree();

    c.signal(&run.wrapper_pin, run.wrapper, libc::SIGTERM);
    c.wait_state(&["cancelling"]);
    // Mid-stop: the wrapper's TERM has reached every process (each logged it) before it dies.
    c.wait("every process to log the wrapper's TERM", || {
        let logs: Vec<usize> = ready
            .all_pids()
            .iter()
            .map(|&p| logged(&log, p, "TERM"))
            .collect();
        match logs.iter().all(|&n| n == 1) {
            true => Ok(()),
            false => Err(format!("TERM lines per pid: {logs:?}")),
        }
    });
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    let state = c.status()["state"].clone();
    c.eq(
        state,
        json!("cancelling"),
        "the state once the wrapper died (within a 5 s window)",
    );
    c.all_alive(&tree, "the stubborn tree after the wrapper died");

    // status --json and list tell the orphaned record from a fresh running job.
    let orphan = json!({"state": "cancelling", "note": "wrapper gone, not reconciled"});
    let doc = c.json(&["status", "--json", c.id]);
    c.record_keys(&doc, "status --json");
    c.fields(&doc, "status --json of the orphan", orphan.clone());
    let healthy = json!({"state": "running", "note": null});
    f.fields(
        &f.json(&["status", "--json", f.id]),
        "status --json of the fresh run",
        healthy,
    );
    let human = text(&c.ctl(&["status", c.id], 0).stdout);
    c.check(
        human.contains("wrapper gone, not reconciled"),
        format_args!("status:\n{human}"),
    );
    let human = text(&f.ctl(&["status", f.id], 0).stdout);
    f.check(
        !human.contains("wrapper gone"),
        format_args!("status of the fresh run:\n{human}"),
    );
    let list = c.json(&["list", "--json"]);
    let entry = |id: &str| {
        list.as_array()
            .and_then(|a| a.iter().find(|e| e["run_id"] == id))
    };
    let (orphan_entry, fresh_entry) = (entry(c.id).cloned(), entry(f.id).cloned());
    c.fields(
        &orphan_entry.unwrap_or_default(),
        "list --json, orphan",
        orphan,
    );
    f.fields(
        &fresh_entry.unwrap_or_default(),
        "list --json, fresh",
        json!({"note": null}),
    );
    let human = text(&c.ctl(&["list"], 0).stdout);
    let flagged = human
        .lines()
        .any(|l| l.starts_with(c.id) && l.contains("wrapper gone"));
    c.check(
        flagged,
        format_args!("list should flag the orphan:\n{human}"),
    );

    // The next cancel takes over: stops what is left and writes the final record.
    let t0 = Instant::now();
    let out = c.ctl(&["cancel", c.id], 0);
    eprintln!(
        "takeover cancel of a stubborn orphan took {:?}",
        t0.elapsed()
    );
    c.gone_now(&tree, "right after the takeover cancel returned");
    let printed = c.parse(&out, "cancel");
    let want = json!({"state": "cancelled", "reason": "cancel_request", "exit_code": null});
    c.fields(&printed, "the takeover's record", want);
    c.check(
        printed["cleanup"].is_object(),
        format_args!("no cleanup report: {printed:#}"),
    );
    c.eq(&c.status()["ended_at"], &printed["ended_at"], "ended_at");
    // Both stops reached every process: the wrapper's and the takeover's.
    for pid in ready.all_pids() {
        c.eq(
            logged(&log, pid, "TERM"),
            2,
            format_args!("TERMs logged by {pid}"),
        );
    }
    c.eq(c.final_state_events(), 1, "final state events");

    // The other run was never touched.
    f.all_alive(&fresh_tree, "the fresh run after the takeover");
    f.fields(&f.status(), "the fresh run", json!({"state": "running"}));
    f.ctl(&["cancel", f.id], 0);
    f.gone_now(&fresh_tree, "the fresh run after its own cancel");
    f.wait_gone(&fresh.wrapper_pin, "the fresh run's wrapper");
}

#[test]
fn two_runs_of_one_user_cancel_one_and_the_other_lives_and_finishes() {
    let root = TestRoot::new();
    let (a, b) = (ctx(&root, "victim"), ctx(&root, "bystander"));
    let run_a = a.start_detached("", &fx("tree --children 2 --grandchildren"));
    let (_, tree_a) = a.pin_tree();
    // The bystander runs the same program (a kill by name would hit it too) and ends with 5
    // once the test writes a line to its stdin.
    let script = r#""$0" tree --children 1 --grandchildren & read line; exit 5"#;
    let mut run_b = b.start_foreground("--quiet", &sh(script, &[&fixture_path()]), Stdio::piped());
    let (_, tree_b) = b.pin_tree();

    a.ctl(&["cancel", a.id], 0);
    a.gone_now(&tree_a, "the cancelled run");
    a.wait_gone(&run_a.wrapper_pin, "the cancelled run's wrapper");

    b.all_alive(&tree_b, "the other run after the cancel");
    b.all_alive(&run_b.leader_pin, "the other run's leader");
    b.all_alive(&run_b.wrapper_pin, "the other run's wrapper");
    b.fields(&b.status(), "the other run", json!({"state": "running"}));

    let mut stdin = run_b.proc.child.stdin.take().expect("piped stdin");
    stdin
        .write_all(b"go\n")
        .expect("cannot write the bystander's stdin");
    drop(stdin);
    let st = b.wait_final();
    b.gone_now(&tree_b, "the other run's leftovers at its final record");
    b.fields(
        &st,
        "the other run",
        json!({"state": "finished", "exit_code": 5}),
    );
    b.finish(run_b.proc, 5);
}

#[test]
fn kill_9_of_the_wrapper_then_cancel_stops_the_workload_and_writes_a_final_record() {
    let root = TestRoot::new();
    let c = ctx(&root, "orphan");
    let run = c.start_detached("", &fx("tree --children 2 --grandchildren --escapee"));
    let (ready, tree) = c.pin_tree();
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    c.all_alive(&tree, "the workload after the wrapper's death");
    let doc = c.json(&["status", "--json", c.id]);
    let orphan = json!({"state": "running", "note": "wrapper gone, not reconciled"});
    c.fields(&doc, "status --json must not claim the run is fine", orphan);

    let out = c.ctl(&["cancel", c.id], 0);
    c.gone_now(&tree, "right after cancel returned (escapee included)");
    c.session_empty(ready.sid);
    let printed = c.parse(&out, "cancel");
    c.record_keys(&printed, "cancel's output");
    let want = json!({"state": "cancelled", "reason": "cancel_request", "exit_code": null});
    c.fields(&printed, "cancel's output", want);
    let signals = printed["cleanup"]["signals"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    c.check(
        signals.contains(&json!("TERM")),
        format_args!("cleanup: {}", printed["cleanup"]),
    );
    let st = c.status();
    c.fields(&st, "status.json", json!({"state": "cancelled"}));
    c.eq(&st["ended_at"], &printed["ended_at"], "ended_at");
    c.eq(c.final_state_events(), 1, "final state events");
}

#[test]
fn cancel_of_an_orphan_whose_processes_are_gone_records_unknown_and_wait_exits_75() {
    let root = TestRoot::new();
    let c = ctx(&root, "vanished");
    let run = c.start_detached("", &fx("tree --children 1 --grandchildren"));
    let (_, tree) = c.pin_tree();
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    for pid in tree.pids() {
        c.signal(&tree, pid, libc::SIGKILL);
    }
    c.wait_gone(&tree, "the tree the test killed");

    // Nobody saw how it ended: unknown, never finished or cancelled.
    let printed = c.json(&["cancel", c.id]);
    c.fields(
        &printed,
        "cancel's output",
        json!({"state": "unknown", "exit_code": null}),
    );
    let st = c.status();
    c.fields(&st, "status.json", json!({"state": "unknown"}));
    c.check(!st["reason"].is_null(), "an unknown record names no reason");
    c.ctl(&["wait", c.id], 75);
    c.ctl(&["attach", c.id], 75);
    c.ctl(
        &start_args("", c.id, &fx("tree --children 1 --grandchildren")),
        75,
    );
}

#[test]
fn ten_concurrent_cancels_stop_the_run_once_and_every_caller_prints_the_same_record() {
    let root = TestRoot::new();
    let c = ctx(&root, "crowd");
    let log = root.dir.path().join("worker.log");
    let tree_opts = "--children 2 --grandchildren --leader-term log-exit --member-term log-exit";
    let run = c.start_detached("", &logged_tree(tree_opts, &log));
    let (ready, tree) = c.pin_tree();
    let outs = concurrent_cancels(c, 10);
    c.gone_now(&tree, "after every cancel returned");
    all_print_the_final_record(c, &outs);
    c.fields(&c.status(), "status.json", json!({"state": "cancelled"}));
    c.eq(c.final_state_events(), 1, "final state events");
    c.eq(c.events("stop_begin").len(), 1, "stop_begin events");
    c.eq(
        c.events("stop_escalated").len(),
        0,
        "a second TERM cut the grace short",
    );
    let signals = c.events("signal");
    let to = |pid: i32, sig: &str| {
        let hit = |e: &&Value| target_number(e) == Some(i64::from(pid)) && e["signal"] == sig;
        signals.iter().filter(hit).count()
    };
    for e in &signals {
        let named = e.get("target").is_some() && e.get("reason").is_some();
        c.check(
            named,
            format_args!("a signal event without target or reason: {e}"),
        );
    }
    c.eq(to(run.wrapper, "TERM"), 1, "TERMs sent to the wrapper");
    c.eq(
        to(ready.pgid, "TERM"),
        1,
        "TERMs sent to the leader's group",
    );
    for sig in ["HUP", "KILL"] {
        c.check(
            to(ready.pgid, sig) <= 1,
            format_args!("{sig} sent twice to the group"),
        );
    }
    for pid in ready.all_pids() {
        c.eq(
            logged(&log, pid, "TERM"),
            1,
            format_args!("TERMs logged by {pid}"),
        );
    }
    c.wait_gone(&run.wrapper_pin, "the wrapper");
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
    let out = c.ctl(&["cancel", "--wait", "20s", c.id], 0);
    c.gone_now(&tree, "right after cancel returned");
    let printed = c.parse(&out, "cancel");
    c.fields(&printed, "cancel's output", json!({"state": "cancelled"}));
    c.fields(&c.status(), "status.json", json!({"state": "cancelled"}));
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
    let log = root.dir.path().join("worker.log");
    let tree_opts = "--children 1 --leader-term ignore --member-term ignore";
    let run = c.start_running("--grace 3s --hup-after 0", &logged_tree(tree_opts, &log));
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
    let out = c.ctl(&["cancel", "--wait", "30s", c.id], 0);
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
fn ten_concurrent_cancels_of_an_orphaned_run_take_it_over_once_and_agree() {
    let root = TestRoot::new();
    let c = ctx(&root, "orphan-crowd");
    let run = c.start_detached("", &fx("tree --children 2 --grandchildren"));
    let (_, tree) = c.pin_tree();
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    let outs = concurrent_cancels(c, 10);
    c.gone_now(&tree, "after every cancel returned");
    all_print_the_final_record(c, &outs);
    c.fields(&c.status(), "status.json", json!({"state": "cancelled"}));
    c.eq(c.final_state_events(), 1, "final state events");
    c.eq(c.events("takeover").len(), 1, "takeovers");
    c.eq(c.events("stop_begin").len(), 1, "stop_begin events");
}

#[test]
fn a_record_whose_pid_now_belongs_to_an_unrelated_process_lends_it_nothing_and_the_run_is_stopped()
{
    let root = TestRoot::new();
    let c = ctx(&root, "reused");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);

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
    c.fields(
        &st,
        "the record",
        json!({"state": "cancelled", "reason": "cancel_request"}),
    );
    let to_wrapper: Vec<Value> = c
        .events("signal")
        .into_iter()
        .filter(|e| e["target"] == format!("pid:{}", run.wrapper))
        .collect();
    c.eq(to_wrapper.len(), 1, "TERMs to the true wrapper");
    c.all_alive(&unrelated.pin, "the unrelated process at the end");
}

#[test]
fn a_record_forged_to_another_boot_over_live_processes_is_rewritten_and_the_run_is_stopped() {
    let root = TestRoot::new();
    let c = ctx(&root, "rebooted");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    let forged_boot = "00000000-0000-4000-8000-000000000000";
    assert_ne!(
        boot_id(),
        forged_boot,
        "this host's boot id is the forged one"
    );
    c.edit_status(|st| {
        st.insert("boot_id".into(), forged_boot.into());
    });

    // The run's cgroup holds its processes: they are this boot's, whatever the record says.
    let note = c.json(&["status", "--json", c.id])["note"].clone();
    c.check(
        note.as_str().is_some_and(|n| n.contains("rewritten")),
        format_args!("status --json's note: {note}"),
    );
    c.ctl(&["cancel", c.id], 0);
    c.gone_now(&tree, "the run's processes");
    c.fields(
        &c.status(),
        "the record",
        json!({"state": "cancelled", "proof": "cgroup_empty"}),
    );
}

#[test]
fn a_record_of_an_earlier_boot_with_nothing_of_it_held_is_host_rebooted_and_nothing_is_signalled() {
    let root = TestRoot::new();
    let c = ctx(&root, "old-boot");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    // The run's processes are not its any more (its cgroup and marker are what find them):
    // take them out of its cgroup and clear the record's cgroup, as after a reboot.
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    let cg = c.status()["containment"]["cgroup"]
        .as_str()
        .map(str::to_string);
    let unrelated = Unrelated::spawn();
    c.edit_status(|st| {
        st.insert(
            "boot_id".into(),
            "00000000-0000-4000-8000-000000000000".into(),
        );
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
    c.fields(
        &c.status(),
        "the record",
        json!({"state": "unknown", "reason": "host_rebooted"}),
    );
}

#[test]
fn cancel_refuses_a_foreign_or_symlinked_run_dir_and_sets_an_opened_one_back_to_0700() {
    let root = TestRoot::new();
    let c = ctx(&root, "guarded");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    let dir = root.run_dir(c.id);
    let untouched = |after: &str| {
        c.all_alive(&tree, &format!("the run's processes after {after}"));
        c.all_alive(&run.wrapper_pin, &format!("the wrapper after {after}"));
        c.fields(&c.status(), after, json!({"state": "running"}));
    };

    // Owned by another uid (the tests run as root: chown to nobody).
    chown(&dir, Some(65534), Some(65534)).expect("chown the run dir");
    let out = c.run(&["cancel", c.id]);
    chown(&dir, Some(0), Some(0)).expect("chown the run dir back");
    let code = exit_code(&out.status);
    let what = describe_output("cancel of a foreign run dir", &out);
    c.check(
        code == 77 || code == 78,
        format_args!("exit {code}, not 77 or 78\n{what}"),
    );
    untouched("cancel of a foreign run dir");

    // A symlink in the root pointing at the run dir.
    symlink(&dir, root.run_dir("alias")).expect("symlink");
    c.ctl(&["cancel", "alias"], 78);
    untouched("cancel through a symlink");

    // Open to the group and others (the workload may chmod its own dir): a mode is no reason
    // to leave a run running. It is set back to 0700, said, and the run stopped.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod the run dir");
    let out = c.run(&["cancel", c.id]);
    c.code(&out, 0, "cancel of a 0755 run dir");
    let mode = fs::metadata(&dir)
        .expect("the run dir")
        .permissions()
        .mode()
        & 0o7777;
    c.eq(mode, 0o700, "the run dir's mode after the cancel");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    c.check(
        said.contains("mode was 0755"),
        format_args!("cancel does not say what it repaired: {said}"),
    );
    c.gone_now(&tree, "after the cancel");
    c.fields(&c.status(), "the record", json!({"state": "cancelled"}));
}

#[test]
fn cancel_of_a_final_run_prints_it_and_exits_0_without_touching_it() {
    let root = TestRoot::new();
    let c = ctx(&root, "done");
    c.finished(3);
    let before = c.bytes("status.json");
    let st = c.status();
    let printed = c.json(&["cancel", c.id]);
    c.record_keys(&printed, "cancel's output");
    c.fields(
        &printed,
        "cancel's output",
        json!({"state": "finished", "exit_code": 3}),
    );
    c.eq(&printed["ended_at"], &st["ended_at"], "ended_at");
    c.eq(c.bytes("status.json"), before, "status.json changed");
    c.eq(c.events("signal").len(), 0, "signal events");
}

#[test]
fn subcommands_on_a_missing_run_exit_69_and_bad_ids_exit_64() {
    let root = TestRoot::new();
    let c = ctx(&root, "nope");
    // No root at all yet.
    c.ctl(&["cancel", c.id], 69);
    c.ctl(&["status", c.id], 69);
    ctx(&root, "other").finished(0);
    for args in [
        &["cancel", c.id][..],
        &["renew", c.id, "--lease", "60s"],
        &["status", c.id],
        &["status", "--json", c.id],
        &["wait", c.id],
        &["attach", c.id],
        &["logs", c.id],
    ] {
        let said = text(&c.ctl(args, 69).stderr);
        c.check(
            said.starts_with("agent-run: "),
            format_args!("{args:?}: stderr {said:?}"),
        );
    }
    c.check(!root.run_dir(c.id).exists(), "a query created the run dir");
    for bad in ["../other", ".hidden", "-x", "a/b", "sp ace"] {
        c.ctl(&["cancel", "--", bad], 64);
    }
}

#[test]
fn cancel_wait_running_out_exits_75_naming_the_state() {
    let root = TestRoot::new();
    let c = ctx(&root, "stubborn");
    let log = root.dir.path().join("worker.log");
    let stay =
        "--leader-term log-stay --leader-hup log-stay --member-term log-stay --member-hup log-stay";
    let tree_opts = format!("--children 1 --grandchildren {stay}");
    let run = c.start_detached("--grace 60s", &logged_tree(&tree_opts, &log));
    let (_, tree) = c.pin_tree();

    let t0 = Instant::now();
    let out = c.ctl(&["cancel", c.id, "--wait", "1s"], 75);
    let took = t0.elapsed();
    let said = text(&out.stderr);
    let named = said.contains("cancelling") || said.contains("running");
    c.check(
        said.starts_with("agent-run: ") && named,
        format_args!("stderr {said:?}"),
    );
    let in_time = took >= Duration::from_millis(900) && took < Duration::from_secs(15);
    c.check(
        in_time,
        format_args!("cancel --wait 1s returned after {took:?}"),
    );
    c.fields(&c.status(), "status.json", json!({"state": "cancelling"}));
    c.all_alive(&tree, "the stubborn tree within its grace");
    let said = text(&c.ctl(&["wait", c.id, "--timeout", "200ms"], 75).stderr);
    c.check(
        said.contains("cancelling"),
        format_args!("wait --timeout: stderr {said:?}"),
    );

    // Clean up through the contract: a second TERM to the wrapper skips to KILL.
    c.signal(&run.wrapper_pin, run.wrapper, libc::SIGTERM);
    let st = c.wait_final();
    c.gone_now(&tree, "after the second TERM");
    c.fields(&st, "status.json", json!({"state": "cancelled"}));
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

// =============================================================================================
// start --detach

#[test]
fn start_detach_returns_once_running_and_the_wrapper_lives_on_in_its_own_session_on_dev_null() {
    let root = TestRoot::new();
    let c = ctx(&root, "detached");
    let t0 = Instant::now();
    let run = c.start_detached("", &fx("tree --children 1"));
    eprintln!("start --detach returned in {:?}", t0.elapsed());
    c.fields(
        &run.line,
        "the detach line",
        json!({"state": "running", "pgid": run.leader}),
    );
    let st = c.status();
    c.fields(
        &st,
        "the record when start -d returned",
        json!({"state": "running", "pid": run.leader}),
    );
    let (ready, tree) = c.pin_tree();
    c.eq(ready.pid, run.leader, "the ready line's leader");
    let leads = ready.pid == ready.pgid && ready.pid == ready.sid;
    c.check(
        leads,
        format_args!("the leader does not lead its group and session: {ready:?}"),
    );

    c.all_alive(&run.wrapper_pin, "the wrapper after start -d returned");
    let wrapper = proc_stat(run.wrapper).expect("the wrapper's stat");
    let own_session = wrapper.3 != my_sid() && wrapper.3 != ready.sid;
    c.check(
        own_session,
        format_args!("the wrapper's session: {wrapper:?}, test's {}", my_sid()),
    );
    let dev_null = Some(PathBuf::from("/dev/null"));
    for fd in 0..3 {
        let link = fs::read_link(format!("/proc/{}/fd/{fd}", run.wrapper)).ok();
        c.eq(
            link,
            dev_null.clone(),
            format_args!("the detached wrapper's fd {fd}"),
        );
    }
    let stdin = fs::read_link(format!("/proc/{}/fd/0", run.leader)).ok();
    c.eq(stdin, dev_null, "the detached workload's stdin");

    c.ctl(&["cancel", c.id], 0);
    c.gone_now(&tree, "after cancel");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

#[test]
fn start_detach_of_a_missing_command_reports_launch_failed_with_127() {
    let root = TestRoot::new();
    let c = ctx(&root, "missing");
    let command = ["/nonexistent/agent-run-test".to_string()];
    let out = c.ctl(&start_args("--detach", c.id, &command), 127);
    c.fields(
        &c.detach_line(&out),
        "the detach line",
        json!({"state": "launch_failed"}),
    );
    c.fields(
        &c.wait_final(),
        "status.json",
        json!({"state": "launch_failed"}),
    );
    // A relaunch replays the failure; wait agrees.
    c.ctl(&start_args("--quiet", c.id, &command), 127);
    c.ctl(&["wait", c.id], 127);
}

#[test]
fn start_detach_passes_a_cwd_and_a_label_that_begin_with_a_dash_as_values() {
    let root = TestRoot::new();
    let c = ctx(&root, "dashes");
    let odd = root.dir.path().join("-odd");
    std::fs::create_dir(&odd).expect("the odd dir");
    let cwd = format!("--cwd={}", path_str(&odd));
    let command = ["/bin/pwd".to_string()];
    let mut args = vec![
        "start",
        "--detach",
        cwd.as_str(),
        "--label",
        "k=-v",
        c.id,
        "--",
    ];
    args.extend(command.iter().map(String::as_str));
    c.ctl(&args, 0);
    let st = c.wait_final();
    c.fields(
        &st,
        "status.json",
        json!({"state": "finished", "exit_code": 0, "labels": {"k": "-v"}}),
    );
    c.eq(&st["cwd"], path_str(&odd), "the recorded cwd");
    let out = std::fs::read_to_string(root.run_dir(c.id).join("stdout.log")).unwrap_or_default();
    c.eq(out.trim(), path_str(&odd), "what pwd printed");
}

// =============================================================================================
// wait, attach, logs

#[test]
fn wait_blocks_until_the_run_is_final_and_exits_as_the_run_did() {
    let root = TestRoot::new();
    let c = ctx(&root, "waited");
    let fifo = make_fifo(&root, "go");
    let run = c.start_detached("", &sh(r#"read line < "$0"; exit 7"#, &[path_str(&fifo)]));

    let t0 = Instant::now();
    let out = c.ctl(&["wait", c.id, "--timeout", "1s"], 75);
    let took = t0.elapsed();
    c.check(
        took >= Duration::from_millis(900),
        format_args!("wait --timeout 1s took {took:?}"),
    );
    let said = text(&out.stderr);
    c.check(
        said.contains("running"),
        format_args!("wait --timeout: stderr {said:?}"),
    );

    let mut waiter = Spawned::wrapper(&root, &["wait", c.id]);
    let _waiter_pin = Pinned::new(&[waiter.child.id() as i32]);
    let early = waiter.child.try_wait().expect("try_wait");
    c.check(
        early.is_none(),
        format_args!("wait returned before the run ended: {early:?}"),
    );
    c.all_alive(&run.leader_pin, "the leader while wait blocks");
    c.release(&fifo);
    c.finish(waiter, 7);
    c.fields(
        &c.status(),
        "status.json",
        json!({"state": "finished", "exit_code": 7}),
    );
    c.ctl(&["wait", c.id], 7);
    c.wait_gone(&run.wrapper_pin, "the wrapper");

    // A leader killed by a signal: wait says 128 + N, as the wrapper did.
    let k = ctx(&root, "killed");
    k.ctl(&start_args("--quiet", k.id, &fx("signal 9")), 137);
    k.ctl(&["wait", k.id], 137);
}

#[test]
fn attach_streams_the_output_from_the_start_every_byte_once_and_exits_as_the_run_did() {
    let root = TestRoot::new();
    let c = ctx(&root, "chatty");
    let fifo = make_fifo(&root, "go");
    let script = r#""$1" spew 100000 --stderr-bytes 2000; read line < "$0";
        "$1" spew 50000 --stderr-bytes 1000 --chunk 1000; exit 9"#;
    let run = c.start_detached("", &sh(script, &[path_str(&fifo), &fixture_path()]));
    let size = |name: &str| fs::metadata(c.file(name)).map_or(0, |m| m.len());
    c.wait("the first 100000 bytes", || match size("stdout.log") {
        100_000 => Ok(()),
        n => Err(format!("{n} bytes")),
    });

    let attach = Spawned::wrapper(&root, &["attach", c.id]);
    let _attach_pin = Pinned::new(&[attach.child.id() as i32]);
    c.wait("attach to copy the first part", || {
        match attach.stdout_so_far().len() {
            n if n >= 100_000 => Ok(()),
            n => Err(format!("{n} bytes")),
        }
    });
    c.release(&fifo);
    let out = c.finish(attach, 9);

    let mut expected = spew_bytes(100_000);
    expected.extend(spew_bytes(50_000));
    c.check(
        c.bytes("stdout.log") == expected,
        "stdout.log is not what the workload wrote",
    );
    let (got, want) = (out.stdout.len(), expected.len());
    c.check(
        out.stdout == expected,
        format_args!("attach's stdout: {got} bytes, not the {want} written"),
    );
    let stderr = text(&out.stderr);
    let theirs: String = stderr
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("agent-run: "))
        .collect();
    let same = theirs.as_bytes() == c.bytes("stderr.log") && theirs.len() == 3000;
    c.check(
        same,
        format_args!("attach's stderr: {} bytes unlike stderr.log", theirs.len()),
    );
    c.wait_gone(&run.wrapper_pin, "the wrapper");

    // Attaching to a finished run replays all of it once and exits the same way.
    let again = c.ctl(&["attach", c.id], 9);
    c.check(again.stdout == expected, "attach after the end");
}

#[test]
fn logs_prints_one_log_and_follows_it_until_the_run_is_final() {
    let root = TestRoot::new();
    let c = ctx(&root, "logged");
    let fifo = make_fifo(&root, "go");
    let script = r#""$1" spew 3000 --stderr-bytes 500; read line < "$0";
        "$1" spew 4000 --stderr-bytes 700; exit 0"#;
    let run = c.start_detached("", &sh(script, &[path_str(&fifo), &fixture_path()]));
    let size = |name: &str| fs::metadata(c.file(name)).map_or(0, |m| m.len());
    c.wait("the first part of both logs", || {
        match (size("stdout.log"), size("stderr.log")) {
            (3000, 500) => Ok(()),
            seen => Err(format!("{seen:?} bytes")),
        }
    });
    let out = c.ctl(&["logs", c.id], 0);
    c.check(
        out.stdout == spew_bytes(3000),
        format_args!("logs: {} bytes", out.stdout.len()),
    );
    let err = c.ctl(&["logs", "--stderr", c.id], 0);
    c.check(
        err.stdout == spew_bytes(500),
        format_args!("logs --stderr: {} bytes", err.stdout.len()),
    );

    let follow = Spawned::wrapper(&root, &["logs", "-f", c.id]);
    let _follow_pin = Pinned::new(&[follow.child.id() as i32]);
    c.release(&fifo);
    let out = c.finish(follow, 0);
    let expected = [spew_bytes(3000), spew_bytes(4000)].concat();
    c.check(
        out.stdout == expected,
        format_args!("logs -f printed {} bytes", out.stdout.len()),
    );
    let err = c.ctl(&["logs", "--stderr", "-f", c.id], 0);
    let expected = [spew_bytes(500), spew_bytes(700)].concat();
    c.check(
        err.stdout == expected,
        format_args!("logs --stderr -f: {} bytes", err.stdout.len()),
    );
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

// =============================================================================================
// renew, status, list, gc

/// lease.json: (deadline_epoch, lease_s).
fn lease(c: Ctx) -> (f64, f64) {
    let text = text(&c.bytes("lease.json"));
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| c.fail(format_args!("lease.json: {e}: {text:?}")));
    match (v["deadline_epoch"].as_f64(), v["lease_s"].as_f64()) {
        (Some(deadline), Some(len)) => (deadline, len),
        _ => c.fail(format_args!("lease.json lacks a key: {v}")),
    }
}

/// Runs `args` (which set a lease of `len` seconds from now) and checks lease.json after it.
fn check_lease_after(c: Ctx, args: &[&str], len: f64) {
    let before = epoch_now();
    let out = c.ctl(args, 0);
    let after = epoch_now();
    let (deadline, got) = lease(c);
    let what = describe_output(&args.join(" "), &out);
    c.check(
        (got - len).abs() < 1e-6,
        format_args!("lease_s {got}, not {len}\n{what}"),
    );
    let in_window = deadline >= before + len - 1.0 && deadline <= after + len + 1.0;
    c.check(
        in_window,
        format_args!("deadline {deadline} not in [{before}, {after}] + {len}"),
    );
}

#[test]
fn renew_pushes_the_lease_deadline_and_renew_of_a_final_run_exits_69_and_changes_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "leased");
    let id = c.id;
    let before = epoch_now();
    let run = c.start_detached("--lease 60s", &fx("tree --children 0"));
    let (deadline, len) = lease(c);
    c.check((len - 60.0).abs() < 1e-6, format_args!("lease_s {len}"));
    let in_window = deadline >= before + 59.0 && deadline <= epoch_now() + 61.0;
    c.check(
        in_window,
        format_args!("deadline {deadline}, started at {before}"),
    );

    check_lease_after(c, &["renew", id, "--lease", "120s"], 120.0);
    // Without --lease: the run's lease length (now 120 s) from now.
    check_lease_after(c, &["renew", id], 120.0);
    let list = c.json(&["list", "--json"]);
    let entry = list
        .as_array()
        .and_then(|a| a.iter().find(|e| e["run_id"] == id));
    let left = entry
        .and_then(|e| key_starting(e, "lease"))
        .and_then(Value::as_f64);
    let plausible = left.is_some_and(|l| l > 100.0 && l <= 121.0);
    c.check(plausible, format_args!("list --json lease left: {entry:?}"));
    c.all_alive(&run.leader_pin, "the leased run");

    c.ctl(&["cancel", id], 0);
    let (lease_before, status_before) = (c.bytes("lease.json"), c.bytes("status.json"));
    c.ctl(&["renew", id], 69);
    c.ctl(&["renew", id, "--lease", "300s"], 69);
    c.eq(c.bytes("lease.json"), lease_before, "lease.json changed");
    c.eq(c.bytes("status.json"), status_before, "status.json changed");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

#[test]
fn renew_with_a_shorter_lease_makes_the_run_expire_at_the_new_deadline() {
    let root = TestRoot::new();
    let c = ctx(&root, "shortened");
    let tree = fx("tree --children 1 --grandchildren");
    let fg = c.start_foreground("--quiet --lease 60s", &tree, Stdio::null());
    let (_, tree) = c.pin_tree();
    let t0 = Instant::now();
    c.ctl(&["renew", c.id, "--lease", "1s"], 0);
    let st = c.wait_final();
    let took = t0.elapsed();
    c.gone_now(&tree, "when the lease-expiry record became final");
    c.fields(
        &st,
        "status.json",
        json!({"state": "cancelled", "reason": "lease_expired"}),
    );
    c.check(
        took >= Duration::from_millis(900),
        format_args!("ended {took:?} after a 1 s renew"),
    );
    c.finish(fg.proc, 124);
    c.ctl(&["wait", c.id], 124);
}

#[test]
fn status_prints_a_human_summary_and_json_with_every_contract_key() {
    let root = TestRoot::new();
    let c = ctx(&root, "summarised");
    c.finished(3);
    let human = text(&c.ctl(&["status", c.id], 0).stdout);
    let summary = human.contains(c.id) && human.contains("finished") && human.contains('3');
    c.check(summary, format_args!("status (human):\n{human}"));
    let doc = c.json(&["status", "--json", c.id]);
    c.record_keys(&doc, "status --json");
    for (key, value) in c.status().as_object().expect("status.json is an object") {
        c.eq(
            &doc[key],
            value,
            format_args!("status --json {key} vs status.json"),
        );
    }
    c.fields(&doc, "status --json", json!({"exit_code": 3, "schema": 1}));

    // A running run: the same keys, and nothing claimed beyond what is known.
    let l = ctx(&root, "live");
    let run = l.start_detached("", &fx("tree --children 0"));
    let doc = l.json(&["status", "--json", l.id]);
    l.record_keys(&doc, "status --json (running)");
    let want = json!({"state": "running", "pid": run.leader, "wrapper_pid": run.wrapper,
        "note": null, "ended_at": null});
    l.fields(&doc, "status --json (running)", want);
    l.ctl(&["cancel", l.id], 0);
    l.gone_now(&run.leader_pin, "after cancel");
}

#[test]
fn list_shows_every_run_and_reports_corrupt_or_foreign_run_dirs_on_their_own_stderr_line() {
    let root = TestRoot::new();
    let c = ctx(&root, "done");
    c.finished(3);
    let l = ctx(&root, "live");
    let run = l.start_detached("--lease 60s", &fx("tree --children 0"));
    for (bad, bytes) in [
        ("trunc", None),
        ("garbage", Some(&b"not json at all\n"[..])),
    ] {
        let b = ctx(&root, bad);
        b.finished(0);
        let whole = b.bytes("status.json");
        b.replace_status(bytes.unwrap_or(&whole[..whole.len() / 2]));
    }
    ctx(&root, "foreign").finished(0);
    chown(root.run_dir("foreign"), Some(65534), Some(65534)).expect("chown");
    let bad = ["foreign", "garbage", "trunc"];

    let out = c.ctl(&["list"], 0);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let what = describe_output("list", &out);
    let line_of = |run: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(run))
    };
    let done = line_of("done").unwrap_or_default();
    c.check(
        done.contains("finished") && done.contains('3'),
        format_args!("done:\n{what}"),
    );
    let live = line_of("live").unwrap_or_default();
    let live_ok = live.contains("running") && live.contains(&run.leader.to_string());
    c.check(live_ok, format_args!("live:\n{what}"));
    for name in bad {
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(name)).collect();
        let own_line = lines.len() == 1 && lines[0].starts_with("agent-run: ");
        c.check(
            own_line,
            format_args!("{name} on its own stderr line:\n{what}"),
        );
        c.check(
            line_of(name).is_none(),
            format_args!("list shows {name} as a run:\n{what}"),
        );
    }

    let out = c.ctl(&["list", "--json"], 0);
    let list = c.parse(&out, "list --json");
    let entry = |id: &str| {
        let found = list
            .as_array()
            .and_then(|a| a.iter().find(|e| e["run_id"] == id));
        found
            .cloned()
            .unwrap_or_else(|| c.fail(format_args!("list --json lacks {id}: {list:#}")))
    };
    for id in ["done", "live"] {
        let e = entry(id);
        for key in ["run_id", "state", "pid"] {
            c.check(e.get(key).is_some(), format_args!("{id} lacks {key}: {e}"));
        }
        for prefix in ["age", "lease", "exit"] {
            c.check(
                key_starting(&e, prefix).is_some(),
                format_args!("{id}: no {prefix}*: {e}"),
            );
        }
    }
    let done = entry("done");
    c.fields(&done, "list --json, done", json!({"state": "finished"}));
    c.eq(
        key_starting(&done, "exit"),
        Some(&json!(3)),
        "list --json, done's exit",
    );
    l.fields(
        &entry("live"),
        "list --json, live",
        json!({"state": "running", "pid": run.leader}),
    );
    let stderr = text(&out.stderr);
    for name in bad {
        let once = stderr.lines().filter(|l| l.contains(name)).count() == 1;
        c.check(
            once,
            format_args!("list --json: stderr should name {name} once:\n{stderr}"),
        );
    }
    l.ctl(&["cancel", l.id], 0);
    l.wait_gone(&run.wrapper_pin, "the wrapper");
}

#[test]
fn gc_removes_final_run_dirs_older_than_the_age_and_never_active_or_unreadable_ones() {
    let root = TestRoot::new();
    let c = ctx(&root, "live");
    let now = epoch_now() as i64;
    let (hours_ago, minutes_ago) = (rfc3339(now - 2 * 3600), rfc3339(now - 10 * 60));
    let age = |id: &str, when: &str| {
        ctx(&root, id).edit_status(|st| {
            for key in ["created_at", "started_at", "ended_at"] {
                if !st[key].is_null() {
                    st.insert(key.into(), when.into());
                }
            }
        });
    };
    for (id, when) in [
        ("hours", Some(&hours_ago)),
        ("minutes", Some(&minutes_ago)),
        ("fresh", None),
    ] {
        ctx(&root, id).finished(0);
        if let Some(when) = when {
            age(id, when);
        }
    }
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    // An active run that looks ancient is still active.
    age(c.id, &hours_ago);
    let t = ctx(&root, "trunc");
    t.finished(0);
    age(t.id, &hours_ago);
    let whole = t.bytes("status.json");
    t.replace_status(&whole[..whole.len() / 2]);
    ctx(&root, "foreign").finished(0);
    age("foreign", &hours_ago);
    chown(root.run_dir("foreign"), Some(65534), Some(65534)).expect("chown");
    let exists = |id: &str| root.run_dir(id).exists();

    let out = c.ctl(&["gc", "--older-than", "1h", "--dry-run"], 0);
    let what = describe_output("gc --dry-run", &out);
    for id in ["hours", "minutes", "fresh", c.id, "trunc", "foreign"] {
        c.check(exists(id), format_args!("--dry-run removed {id}\n{what}"));
    }
    let said = text(&out.stdout);
    c.check(
        said.contains("hours"),
        format_args!("--dry-run names no old run\n{what}"),
    );
    for kept in ["minutes", "fresh", c.id] {
        c.check(
            !said.contains(kept),
            format_args!("--dry-run names {kept}\n{what}"),
        );
    }

    let out = c.ctl(&["gc", "--older-than", "1h"], 0);
    let what = describe_output("gc --older-than 1h", &out);
    c.check(
        !exists("hours"),
        format_args!("the 2 h old run is still there\n{what}"),
    );
    for kept in ["minutes", "fresh", c.id, "trunc", "foreign"] {
        c.check(
            exists(kept),
            format_args!("gc --older-than 1h removed {kept}\n{what}"),
        );
    }
    let stderr = text(&out.stderr);
    for skipped in ["trunc", "foreign"] {
        let reported = stderr
            .lines()
            .any(|l| l.starts_with("agent-run: ") && l.contains(skipped));
        c.check(
            reported,
            format_args!("gc does not report {skipped} on stderr\n{what}"),
        );
    }

    let out = c.ctl(&["gc", "--older-than", "5m"], 0);
    let what = describe_output("gc --older-than 5m", &out);
    c.check(
        !exists("minutes"),
        format_args!("the 10 min old run is still there\n{what}"),
    );
    for kept in ["fresh", c.id, "trunc", "foreign"] {
        c.check(
            exists(kept),
            format_args!("gc --older-than 5m removed {kept}\n{what}"),
        );
    }
    c.all_alive(&tree, "the active run after gc");
    c.fields(&c.status(), "the active run", json!({"state": "running"}));

    c.ctl(&["cancel", c.id], 0);
    c.gone_now(&tree, "after cancel");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

// =============================================================================================
// Relaunch by run id

#[test]
fn relaunch_of_a_finished_run_replays_its_exit_code_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "once");
    let counter = root.dir.path().join("counter");
    let command = counting(&counter, 3);
    let args = start_args("--quiet", c.id, &command);
    c.ctl(&args, 3);
    c.eq(count_lines(&counter), 1, "runs after the first launch");
    let before = c.bytes("status.json");
    let st = c.status();

    let out = c.ctl(&args, 3);
    c.eq(count_lines(&counter), 1, "runs after the relaunch");
    c.eq(c.bytes("status.json"), before, "status.json changed");
    let record = first_json_object(&text(&out.stderr));
    let record = record.unwrap_or_else(|| c.fail(describe_output("no record on stderr", &out)));
    c.fields(
        &record,
        "the replayed record",
        json!({"state": "finished", "exit_code": 3}),
    );
    c.eq(
        &record["ended_at"],
        &st["ended_at"],
        "the replayed record's ended_at",
    );

    // The bare form (no `start`) is the same command.
    let mut bare = vec![c.id.to_string(), "--".to_string()];
    bare.extend(command);
    c.ctl(&bare, 3);
    c.eq(count_lines(&counter), 1, "runs after the bare relaunch");
}

#[test]
fn relaunch_with_a_different_command_is_refused_with_65() {
    let root = TestRoot::new();
    let c = ctx(&root, "fixed");
    let counter = root.dir.path().join("counter");
    c.ctl(&start_args("--quiet", c.id, &counting(&counter, 3)), 3);
    let before = c.bytes("status.json");
    let out = c.ctl(&start_args("--quiet", c.id, &counting(&counter, 4)), 65);
    let said = text(&out.stderr);
    c.check(
        said.starts_with("agent-run: "),
        format_args!("stderr {said:?}"),
    );
    c.eq(count_lines(&counter), 1, "runs after the refused relaunch");
    c.eq(c.bytes("status.json"), before, "status.json changed");
}

#[test]
fn relaunch_with_detach_and_a_different_command_is_refused_with_65_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "taken");
    let counter = root.dir.path().join("counter");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    let other = start_args("--detach", c.id, &counting(&counter, 0));

    // While the run is active.
    let before = c.bytes("status.json");
    c.ctl(&other, 65);
    c.all_alive(&tree, "the run that owns the id");
    c.eq(c.bytes("status.json"), before, "status.json changed");

    // Once the run is final.
    c.ctl(&["cancel", c.id], 0);
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    let before = c.bytes("status.json");
    c.ctl(&other, 65);
    c.eq(c.bytes("status.json"), before, "status.json changed");
    c.eq(count_lines(&counter), 0, "runs of the refused command");
}

#[test]
fn relaunch_with_detach_of_a_finished_run_replays_its_exit_code_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "once-detached");
    let counter = root.dir.path().join("counter");
    let command = counting(&counter, 3);
    c.ctl(&start_args("--quiet", c.id, &command), 3);
    let before = c.bytes("status.json");
    c.ctl(&start_args("--detach", c.id, &command), 3);
    c.eq(count_lines(&counter), 1, "runs after the relaunch");
    c.eq(c.bytes("status.json"), before, "status.json changed");
}

#[test]
fn relaunch_of_an_active_run_attaches_and_exits_as_the_run_does() {
    let root = TestRoot::new();
    let c = ctx(&root, "active");
    let fifo = make_fifo(&root, "go");
    let counter = root.dir.path().join("counter");
    let script = r#"echo started; "$1" count "$2"; read line < "$0"; echo done; exit 6"#;
    let command = sh(
        script,
        &[path_str(&fifo), &fixture_path(), path_str(&counter)],
    );
    let run = c.start_detached("", &command);
    c.wait("the workload to count", || match count_lines(&counter) {
        1 => Ok(()),
        n => Err(format!("{n} lines")),
    });

    let relaunch = Spawned::wrapper(&root, &start_args("", c.id, &command));
    let _relaunch_pin = Pinned::new(&[relaunch.child.id() as i32]);
    // Attached: it streams the output written so far.
    c.wait(
        "the relaunch to stream the run's output",
        || match relaunch.stdout_so_far() {
            out if out == b"started\n" => Ok(()),
            out => Err(format!("{:?}", text(&out))),
        },
    );
    // A different command for the same id is refused while it runs too.
    c.ctl(&start_args("", c.id, &fx("exit 0")), 65);

    c.release(&fifo);
    let out = c.finish(relaunch, 6);
    c.eq(
        text(&out.stdout),
        "started\ndone\n",
        "the attached relaunch's stdout",
    );
    c.eq(count_lines(&counter), 1, "runs of the command");
    c.fields(
        &c.status(),
        "status.json",
        json!({"state": "finished", "exit_code": 6}),
    );
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

#[test]
fn simultaneous_launches_of_one_new_id_run_the_command_once_and_exit_alike() {
    let root = TestRoot::new();
    let launch_twice = |c: Ctx, args: &[String], between: &dyn Fn()| {
        let (a, b) = (Spawned::wrapper(&root, args), Spawned::wrapper(&root, args));
        let _pins = Pinned::new(&[a.child.id() as i32, b.child.id() as i32]);
        between();
        c.finish(a, 4);
        c.finish(b, 4);
    };
    // A command that ends at once: the second launch may find no record yet, a starting or
    // running one, or a final one.
    for i in 0..6 {
        let id = format!("race-{i}");
        let c = ctx(&root, &id);
        let counter = root.dir.path().join(format!("counter-{i}"));
        launch_twice(
            c,
            &start_args("--quiet", &id, &counting(&counter, 4)),
            &|| {},
        );
        c.eq(count_lines(&counter), 1, "runs of the command");
    }

    // A command that waits: the loser must attach to the winner's run.
    let c = ctx(&root, "race-slow");
    let fifo = make_fifo(&root, "go");
    let counter = root.dir.path().join("counter-slow");
    let script = r#""$1" count "$2"; read line < "$0"; exit 4"#;
    let command = sh(
        script,
        &[path_str(&fifo), &fixture_path(), path_str(&counter)],
    );
    launch_twice(c, &start_args("--quiet", c.id, &command), &|| {
        c.wait("the command to count", || match count_lines(&counter) {
            0 => Err("no line yet".to_string()),
            _ => Ok(()),
        });
        c.release(&fifo);
    });
    c.eq(count_lines(&counter), 1, "runs of the command");
}
