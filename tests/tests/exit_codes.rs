//! The wrapper's exit code: the workload's own, 128+N for a signal, 127 and 126 for a launch that
//! failed, each recorded in status.json.
//!
//! Every test spawns the real `agent-run` binary on a real process tree ([`Run`], a foreground
//! run) and asserts on the process table: each pid the fixture reports is pinned with a pidfd right
//! after the handshake, so "stopped" means the kernel says so. Waits poll a kernel fact or a file
//! to one deadline; every failure prints the run's diagnostics.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use agent_run_tests::facts::path_str;
use agent_run_tests::foreground::*;
use agent_run_tests::workload::fx;
use agent_run_tests::{ensure, proc_stat, TestRoot};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Exit codes

#[test]
fn the_workloads_exit_code_passes_through() {
    let root = TestRoot::new();
    for code in [0, 3, 42, 255] {
        let id = format!("exit-{code}");
        let mut run = Run::start(&root, &id, &[], &fx(&format!("exit {code}")));
        let c = run.c;
        run.finish(code);
        let st = run.final_record();
        c.fields(&st, "the record", outcome("finished", None));
        c.eq(
            &(&st["exit_code"], &st["term_signal"]),
            &(&Value::from(code), &Value::Null),
            "(&st[\"exit_code\"], &st[\"term_signal\"])",
        );
        let leader = int(c, &st, "pid");
        let ticks = st["start_ticks"].as_u64();
        let alive = proc_stat(leader).filter(|s| Some(s.4) == ticks && s.0 != 'Z');
        ensure!(c, alive.is_none(), "leader {leader} still alive");
    }
}

#[test]
fn a_workload_killed_by_a_signal_exits_128_plus_n_with_the_signal_named() {
    let root = TestRoot::new();
    for (sig, name) in [(libc::SIGKILL, "KILL"), (libc::SIGTERM, "TERM")] {
        let id = format!("signal-{name}");
        let mut run = Run::start(&root, &id, &[], &fx(&format!("signal {sig}")));
        let c = run.c;
        run.finish(128 + sig);
        let st = run.final_record();
        c.fields(&st, "the record", outcome("finished", None));
        c.eq(
            &(&st["exit_code"], &st["term_signal"]),
            &(&Value::Null, &Value::from(name)),
            "(&st[\"exit_code\"], &st[\"term_signal\"])",
        );
    }
}

/// A launch that must fail with `code`: exit code, `launch_failed`, a one-line error, and the
/// command never ran.
fn assert_launch_failed(run: &mut Run<'_>, code: i32) {
    run.finish(code);
    let st = run.final_record();
    run.c
        .fields(&st, "the record", outcome("launch_failed", None));
    // The leader never ran: `exit_code` is null; the launch's code is `launch_exit_code`.
    run.c
        .eq(&st["exit_code"], &Value::Null, "st[\"exit_code\"]");
    run.c
        .eq(&st["launch_exit_code"], code, "st[\"launch_exit_code\"]");
    let error = st["error"].as_str().unwrap_or_default();
    ensure!(
        run.c,
        !error.is_empty() && !error.contains('\n'),
        "error must be one non-empty line: {:?}",
        st["error"]
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
    let c = run.c;
    assert_launch_failed(&mut run, 126);
    ensure!(c, !marker.exists(), "the non-executable file ran");
}
