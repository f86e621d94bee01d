//! The subcommands that read or keep a run: `status`, `list`, `logs`, `attach`, `wait`, `renew`
//! and `gc`, and their exit codes on a missing run (69) or a bad id (64).
//!
//! Every test drives the real binaries against real process trees (the `fixture` program) in its
//! own run root, and asserts on kernel facts: pids pinned with pidfds right after the fixture's
//! ready line, sessions and fds read from /proc, the run dir's files. Messages and exit codes are
//! checked too, never alone. Waits poll a probe to one deadline; every process a test sees is
//! pinned, so it is killed by pid when the test ends.

use std::fs;
use std::os::unix::fs::chown;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use agent_run_tests::ctx::{ctx, Ctx};
use agent_run_tests::facts::*;
use agent_run_tests::workload::*;
use agent_run_tests::{describe_output, Detached, Pinned, Spawned, TestRoot};
use serde_json::{json, Value};

/// The value of the first key of an object whose name starts with `prefix` (the contract names
/// list's columns, "age", "lease left", "exit", not its keys).
fn key_starting<'a>(entry: &'a Value, prefix: &str) -> Option<&'a Value> {
    let mut keys = entry.as_object()?.iter();
    keys.find(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v)
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
    c.record("status.json", json!({"state": "finished", "exit_code": 7}));
    c.ctl(&["wait", c.id], 7);
    c.wait_gone(&run.wrapper_pin, "the wrapper");

    // A leader killed by a signal: wait says 128 + N, as the wrapper did.
    let k = ctx(&root, "killed");
    k.ctl(&start_args("--quiet", k.id, &fx("signal 9")), 137);
    k.ctl(&["wait", k.id], 137);
}

/// A detached run that writes `(stdout, stderr)` bytes (`fixture spew`), waits for the returned
/// fifo, then runs `fixture spew SECOND` and exits `code`; returned once the logs hold the first
/// part.
fn two_part_run(c: Ctx, first: (u64, u64), second: &str, code: i32) -> (Detached, PathBuf) {
    let fifo = make_fifo(c.root, "go");
    let (out, err) = first;
    let script = format!(
        r#""$1" spew {out} --stderr-bytes {err}; read line < "$0"; "$1" spew {second}; exit {code}"#
    );
    let run = c.start_detached("", &sh(&script, &[path_str(&fifo), &fixture_path()]));
    let size = |name: &str| fs::metadata(c.file(name)).map_or(0, |m| m.len());
    c.wait("the first part of both logs", || {
        match (size("stdout.log"), size("stderr.log")) {
            seen if seen == first => Ok(()),
            seen => Err(format!("{seen:?} bytes")),
        }
    });
    (run, fifo)
}

#[test]
fn attach_streams_the_output_from_the_start_every_byte_once_and_exits_as_the_run_did() {
    let root = TestRoot::new();
    let c = ctx(&root, "chatty");
    let second = "50000 --stderr-bytes 1000 --chunk 1000";
    let (run, fifo) = two_part_run(c, (100_000, 2000), second, 9);

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
    let (run, fifo) = two_part_run(c, (3000, 500), "4000 --stderr-bytes 700", 0);
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
    c.fields(&st, "status.json", ended("cancelled", "lease_expired"));
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
    l.cancel_now(&run.leader_pin, "after cancel");
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

/// `gc --older-than AGE` removes the run `old` and keeps every run of `kept`: its output, and
/// that output described.
fn gc_pass(c: Ctx<'_>, age: &str, old: &str, kept: &[&str]) -> (Output, String) {
    let out = c.ctl(&["gc", "--older-than", age], 0);
    let what = describe_output(&format!("gc --older-than {age}"), &out);
    let exists = |id: &str| c.root.run_dir(id).exists();
    c.check(
        !exists(old),
        format_args!("the run {old}, older than {age}, is still there\n{what}"),
    );
    for kept in kept {
        c.check(
            exists(kept),
            format_args!("gc --older-than {age} removed {kept}\n{what}"),
        );
    }
    (out, what)
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

    let (out, what) = gc_pass(
        c,
        "1h",
        "hours",
        &["minutes", "fresh", c.id, "trunc", "foreign"],
    );
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

    gc_pass(c, "5m", "minutes", &["fresh", c.id, "trunc", "foreign"]);
    c.all_alive(&tree, "the active run after gc");
    c.record("the active run", json!({"state": "running"}));

    c.cancel_now(&tree, "after cancel");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}
