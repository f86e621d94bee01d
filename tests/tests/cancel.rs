//! `cancel` and TERM stop a run from outside: the whole tree, once, with a final record, also for
//! an orphan whose wrapper was killed, for ten cancels at once, and never for a foreign run dir.
//!
//! The seed article's failure paths (`docs/references.md`) appear as far as they happen on one
//! host: TERM to the wrapper (1), TERM to the leader alone (2), a `cancelling` record whose wrapper
//! died mid-stop (4), two runs of one user of which one is cancelled (5).
//!
//! Every test drives the real binaries against real process trees (the `fixture` program) in its
//! own run root, and asserts on kernel facts: pids pinned with pidfds right after the fixture's
//! ready line, sessions and fds read from /proc, the run dir's files. Messages and exit codes are
//! checked too, never alone. Waits poll a probe to one deadline; every process a test sees is
//! pinned, so it is killed by pid when the test ends.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use agent_run_tests::ctx::{ctx, Ctx, CMD};
use agent_run_tests::facts::*;
use agent_run_tests::workload::*;
use agent_run_tests::{describe_output, exit_code, Detached, Pinned, Ready, Spawned, TestRoot};
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

/// Spawns `agent-run cancel ID` `n` times at once and returns their outputs.
fn concurrent_cancels(c: Ctx, n: usize) -> Vec<Output> {
    let cancels: Vec<Spawned> = (0..n)
        .map(|_| Spawned::wrapper(c.root, &["cancel", "--json", c.id]))
        .collect();
    let pids: Vec<i32> = cancels.iter().map(|s| s.child.id() as i32).collect();
    let _pins = Pinned::new(&pids);
    cancels.into_iter().map(|s| s.finish(CMD)).collect()
}

/// Ten cancels at once: then no process of `tree` is alive, every cancel exited 0 and printed
/// the record status.json holds now, and that record is `cancelled`, written final once.
fn ten_cancels_agree(c: Ctx, tree: &Pinned) {
    let outs = concurrent_cancels(c, 10);
    c.gone_now(tree, "after every cancel returned");
    let st = c.record("status.json", json!({"state": "cancelled"}));
    for (i, out) in outs.iter().enumerate() {
        c.code(out, 0, &format!("cancel #{i}"));
        let printed = c.parse(out, &format!("cancel #{i}"));
        for key in ["state", "reason", "ended_at", "exit_code", "term_signal"] {
            c.eq(&printed[key], &st[key], format_args!("cancel #{i}: {key}"));
        }
    }
    c.eq(c.final_state_events(), 1, "final state events");
}

/// `start --detach START_OPTS ID -- fixture tree TREE_OPTS --log LOG`: the run, the fixture's
/// ready line, the tree pinned, and LOG.
fn start_logged(
    c: Ctx<'_>,
    tree_opts: &str,
    start_opts: &str,
) -> (Detached, Ready, Pinned, PathBuf) {
    let (argv, log) = c.logged_tree(tree_opts);
    let run = c.start_detached(start_opts, &argv);
    let (ready, tree) = c.pin_tree();
    (run, ready, tree, log)
}

/// A tree whose every process logs TERM and exits.
const COOPERATIVE: &str =
    "--children 2 --grandchildren --leader-term log-exit --member-term log-exit";

// =============================================================================================
// cancel

#[test]
fn cancel_stops_the_worker_tree_and_nothing_is_left_when_it_returns() {
    let root = TestRoot::new();
    let c = ctx(&root, "worker");
    let (run, ready, tree, log) = start_logged(c, COOPERATIVE, "");

    let t0 = Instant::now();
    let out = c.ctl(&["cancel", "--json", c.id], 0);
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
        ended("cancelled", "cancel_request"),
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

    let cancel = Spawned::wrapper(&root, &["cancel", "--json", c.id]);
    let cancel_pid = cancel.child.id();
    let out = cancel.finish(CMD);
    c.code(&out, 0, "cancel");
    c.gone_now(&tree, "right after cancel returned");
    c.finish(fg.proc, 143);
    c.gone_now(&fg.wrapper_pin, "the wrapper after it exited");

    let st = c.status();
    c.fields(&st, "status.json", ended("cancelled", "cancel_request"));
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
    c.check(
        at <= signalled_at,
        format_args!("cancel.json at {at}, TERM at {signalled_at}"),
    );
}

#[test]
fn term_to_the_wrapper_stops_leader_children_and_grandchildren() {
    let root = TestRoot::new();
    let c = ctx(&root, "term-wrapper");
    let (argv, log) = c.logged_tree(COOPERATIVE);
    let fg = c.start_foreground("--quiet", &argv, Stdio::null());
    let (ready, tree) = c.pin_tree();
    fg.proc.signal(libc::SIGTERM);
    let st = c.wait_final();
    c.gone_now(&tree, "when the record became final");
    c.fields(&st, "status.json", ended("cancelled", "signal:TERM"));
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
    // The members handle TERM and HUP and stay: only the stop routine's KILL ends them.
    let (argv, log) =
        c.logged_tree("--children 2 --grandchildren --member-term log-stay --member-hup log-stay");
    let fg = c.start_foreground("--quiet --grace 1s", &argv, Stdio::null());
    let (ready, tree) = c.pin_tree();
    c.signal(&tree, ready.pid, libc::SIGTERM);

    let st = c.wait_final();
    c.gone_now(&tree, "when the record became final");
    let want = json!({"state": "finished", "term_signal": "TERM", "exit_code": null});
    c.fields(&st, "status.json", want);
    let signals = cleanup_signals(&st);
    let needed = signals.iter().any(|s| s == "TERM") && signals.iter().any(|s| s == "KILL");
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
    // Everyone handles TERM and stays; HUP (default) ends them, but only 5 s into a stop.
    let (run, ready, tree, log) = start_logged(
        c,
        "--children 1 --grandchildren --leader-term log-stay --member-term log-stay",
        "--hup-after 5s --grace 60s",
    );
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
    let out = c.ctl(&["cancel", "--json", c.id], 0);
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
    f.record("the fresh run", json!({"state": "running"}));
    f.cancel_now(&fresh_tree, "the fresh run after its own cancel");
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

    a.cancel_now(&tree_a, "the cancelled run");
    a.wait_gone(&run_a.wrapper_pin, "the cancelled run's wrapper");

    b.all_alive(&tree_b, "the other run after the cancel");
    b.all_alive(&run_b.leader_pin, "the other run's leader");
    b.all_alive(&run_b.wrapper_pin, "the other run's wrapper");
    b.record("the other run", json!({"state": "running"}));

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
    let (_run, ready, tree) = c.orphan(&fx("tree --children 2 --grandchildren --escapee"));
    c.all_alive(&tree, "the workload after the wrapper's death");
    let doc = c.json(&["status", "--json", c.id]);
    let orphan = json!({"state": "running", "note": "wrapper gone, not reconciled"});
    c.fields(&doc, "status --json must not claim the run is fine", orphan);

    let out = c.ctl(&["cancel", "--json", c.id], 0);
    c.gone_now(&tree, "right after cancel returned (escapee included)");
    c.session_empty(ready.sid);
    let printed = c.parse(&out, "cancel");
    c.record_keys(&printed, "cancel's output");
    let want = json!({"state": "cancelled", "reason": "cancel_request", "exit_code": null});
    c.fields(&printed, "cancel's output", want);
    c.check(
        cleanup_signals(&printed).iter().any(|s| s == "TERM"),
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
    let (_run, _, tree) = c.orphan(&fx("tree --children 1 --grandchildren"));
    for pid in tree.pids() {
        c.signal(&tree, pid, libc::SIGKILL);
    }
    c.wait_gone(&tree, "the tree the test killed");

    // Nobody saw how it ended: unknown, never finished or cancelled.
    let printed = c.json(&["cancel", "--json", c.id]);
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
    let (run, ready, tree, log) = start_logged(c, COOPERATIVE, "");
    ten_cancels_agree(c, &tree);
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

#[test]
fn ten_concurrent_cancels_of_an_orphaned_run_take_it_over_once_and_agree() {
    let root = TestRoot::new();
    let c = ctx(&root, "orphan-crowd");
    let (_run, _, tree) = c.orphan(&fx("tree --children 2 --grandchildren"));
    ten_cancels_agree(c, &tree);
    c.eq(c.events("takeover").len(), 1, "takeovers");
    c.eq(c.events("stop_begin").len(), 1, "stop_begin events");
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
    c.record("the record", json!({"state": "cancelled"}));
}

#[test]
fn cancel_of_a_final_run_prints_it_and_exits_0_without_touching_it() {
    let root = TestRoot::new();
    let c = ctx(&root, "done");
    c.finished(3);
    let before = c.bytes("status.json");
    let st = c.status();
    let printed = c.json(&["cancel", "--json", c.id]);
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
fn cancel_wait_running_out_exits_75_naming_the_state() {
    let root = TestRoot::new();
    let c = ctx(&root, "stubborn");
    let stay =
        "--leader-term log-stay --leader-hup log-stay --member-term log-stay --member-hup log-stay";
    let (run, _, tree, _log) = start_logged(
        c,
        &format!("--children 1 --grandchildren {stay}"),
        "--grace 60s",
    );

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
    c.record("status.json", json!({"state": "cancelling"}));
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
