//! `agent-run rm ID...`: runs removed by id, only when they are over and the kernel agrees; a
//! typo's id freed for the right command.

use agent_run_tests::cli::*;
use agent_run_tests::{ctx, describe_output, exit_code, TestRoot};

#[test]
fn rm_removes_final_runs_and_refuses_a_running_one_with_75_leaving_it_running() {
    let root = TestRoot::new();
    ar_code(&root, &["--quiet", "done-1", "--", "true"], 0);
    ar_code(&root, &["--quiet", "done-2", "--", "false"], 1);
    let live = detached(&root, "live", &[], &["--children", "1"]);
    let out = ar(&root, &["rm", "done-1", "live", "done-2", "done-1"]);
    let c = ctx(&root, "live");
    c.eq(
        exit_code(&out.status),
        75,
        format_args!("{}", describe_output("rm", &out)),
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    c.eq(said.as_str(), "removed done-1\nremoved done-2\n", "stdout");
    c.check(
        err.contains("live: not removed") && err.contains("agent-run cancel live"),
        format_args!("stderr: {err}"),
    );
    for gone in ["done-1", "done-2"] {
        c.check(
            !root.run_dir(gone).exists(),
            format_args!("{gone} is still there"),
        );
    }
    c.check(root.run_dir("live").exists(), "the running run's dir went");
    c.all_alive(&live.tree, "the running run after rm");
    c.eq(&root.status("live")["state"], "running", "live's state");
    // Cancelled, it is over: now it goes.
    ar_code(&root, &["cancel", "live"], 0);
    live.assert_gone(&root, "after cancel");
    ar_code(&root, &["rm", "live"], 0);
    c.check(!root.run_dir("live").exists(), "the cancelled run stayed");
    // No such run: 69; a bad id: 64.
    ar_code(&root, &["rm", "live"], 69);
    ar_code(&root, &["rm", "-x"], 64);
}

#[test]
fn a_typo_s_id_is_freed_by_rm_and_the_65_message_says_so() {
    let root = TestRoot::new();
    ar_code(
        &root,
        &["--quiet", "typo", "--", "no-such-command-here"],
        127,
    );
    let out = ar_code(&root, &["--quiet", "typo", "--", "true"], 65);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let c = ctx(&root, "typo");
    c.check(
        err.contains("agent-run rm typo"),
        format_args!("the 65 message does not say how out: {err}"),
    );
    ar_code(&root, &["rm", "--dry-run", "typo"], 0);
    c.check(root.run_dir("typo").exists(), "--dry-run removed it");
    ar_code(&root, &["rm", "typo"], 0);
    ar_code(&root, &["--quiet", "typo", "--", "true"], 0);
    c.eq(&root.status("typo")["exit_code"], 0, "the rerun's record");
}

#[test]
fn a_final_record_forged_by_a_live_run_does_not_let_rm_take_its_dir() {
    let root = TestRoot::new();
    let live = detached(&root, "forger", &[], &["--children", "1"]);
    // The workload's move: its record rewritten to say it finished.
    let path = root.run_dir("forger").join("status.json");
    let mut st = root.status("forger");
    st["state"] = "finished".into();
    st["exit_code"] = 0.into();
    st["ended_at"] = "2020-01-01T00:00:00.000Z".into();
    std::fs::write(&path, serde_json::to_vec_pretty(&st).unwrap()).unwrap();
    let c = ctx(&root, "forger");
    ar_code(&root, &["rm", "forger"], 75);
    c.check(
        root.run_dir("forger").exists(),
        "rm removed a live run's dir",
    );
    c.all_alive(&live.tree, "the forger after rm");
    ar_code(&root, &["cancel", "forger"], 0);
    live.assert_gone(&root, "after cancel");
}
