//! `wait --timeout` that runs out says so in words (`wait gave up after 1.0s; ID is still
//! running`), and `wait --idle DUR` returns once a run has written nothing for DUR: both exit
//! 75 and leave the runs running.

use agent_run_tests::cli::*;
use agent_run_tests::{ctx, exit_code, Ctx, TestRoot};

#[test]
fn wait_that_runs_out_says_it_gave_up_and_which_runs_are_still_running() {
    let root = TestRoot::new();
    let d1 = detached(&root, "d1", &[], &["--children", "0"]);
    let d2 = detached(&root, "d2", &[], &["--children", "0"]);
    let c = ctx(&root, "d1");
    let one = ar(&root, &["wait", "d1", "--timeout", "1s"]);
    let err = String::from_utf8_lossy(&one.stderr).into_owned();
    c.eq(exit_code(&one.status), 75, "wait d1's exit");
    c.check(
        err.contains("wait gave up after 1.0s; d1 is still running"),
        format_args!("wait d1 said: {err}"),
    );
    let two = ar(&root, &["wait", "d1", "d2", "--timeout", "1s"]);
    let err = String::from_utf8_lossy(&two.stderr).into_owned();
    c.eq(exit_code(&two.status), 75, "wait d1 d2's exit");
    c.check(
        err.contains("wait gave up after 1.0s; still running: d1 (running), d2 (running)"),
        format_args!("wait d1 d2 said: {err}"),
    );
    c.all_alive(&d1.tree, "d1 after the waits");
    c.all_alive(&d2.tree, "d2 after the waits");
    ar_code(&root, &["cancel", "d1", "d2"], 0);
    d1.assert_gone(&root, "after cancel");
    d2.assert_gone(&root, "after cancel");
}

/// `wait ID --idle 1s --timeout TIMEOUT` exits 75 and its stderr says `said`.
fn idle_wait_gives_up(c: Ctx, id: &str, timeout: &str, said: &str) {
    let out = ar(c.root, &["wait", id, "--idle", "1s", "--timeout", timeout]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    c.eq(
        exit_code(&out.status),
        75,
        format_args!("wait --idle of {id}"),
    );
    c.check(
        err.contains(said),
        format_args!("wait --idle of {id} said: {err}"),
    );
}

#[test]
fn wait_idle_returns_75_once_a_run_is_silent_and_not_while_it_writes() {
    let root = TestRoot::new();
    let quiet = detached(&root, "quiet", &[], &["--children", "0"]);
    let c = ctx(&root, "quiet");
    let t0 = std::time::Instant::now();
    let said = "wait: quiet wrote nothing for 1.0s; it is still running";
    idle_wait_gives_up(c, "quiet", "60s", said);
    c.check(
        t0.elapsed() >= std::time::Duration::from_secs(1),
        format_args!(
            "returned after {:?}, before a second of silence",
            t0.elapsed()
        ),
    );
    c.all_alive(&quiet.tree, "the quiet run after wait --idle");
    // A run that writes every 100 ms is never idle for a second: the timeout ends the wait.
    ar_code(
        &root,
        &[
            "start",
            "-d",
            "chatty",
            "--",
            "sh",
            "-c",
            "while :; do echo x; sleep 0.1; done",
        ],
        0,
    );
    let said = "wait gave up after 3.0s; chatty is still running";
    idle_wait_gives_up(c, "chatty", "3s", said);
    // Several runs: refused.
    ar_code(&root, &["wait", "quiet", "chatty", "--idle", "1s"], 64);
    ar_code(&root, &["cancel", "quiet", "chatty"], 0);
    quiet.assert_gone(&root, "after cancel");
    // A run that ends is waited for as always: its own exit code.
    ar_code(
        &root,
        &["start", "-d", "ends", "--", "sh", "-c", "sleep 0.2; exit 3"],
        0,
    );
    ar_code(&root, &["wait", "ends", "--idle", "30s"], 3);
}
