//! `wait --timeout` that runs out says so in words (`wait gave up after 1.0s; ID is still
//! running`), exits 75, and leaves the runs running.

use agent_run_tests::cli::*;
use agent_run_tests::{ctx, exit_code, TestRoot};

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
