//! A run whose processes are all stopped (SIGSTOP of the tree, as Ctrl-Z does) or whose cgroup
//! is frozen: `status` and `list` say `suspended`, and `running` again once it continues.

use std::time::Duration;

use agent_run_tests::cli::*;
use agent_run_tests::{cases, ctx, wait_until_dbg, TestRoot};

/// What `status` (human and JSON) and `list` (human and JSON) say of `id`'s state.
fn said(root: &TestRoot, id: &str) -> (String, bool, String, bool) {
    let human = String::from_utf8_lossy(&ar(root, &["status", id]).stdout).into_owned();
    let first = human.lines().next().unwrap_or_default().to_string();
    let json = json_of(&ar(root, &["status", "--json", id]));
    let list = String::from_utf8_lossy(&ar(root, &["list"]).stdout).into_owned();
    let row = list
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_default()
        .to_string();
    let rows = json_of(&ar(root, &["list", "--json"]));
    let listed = rows
        .as_array()
        .and_then(|a| a.iter().find(|r| r["run_id"] == id))
        .is_some_and(|r| r["suspended"] == true);
    (first, json["suspended"] == true, row, listed)
}

/// Wait until every view says `suspended` (`want`) or `running`.
fn wait_said(root: &TestRoot, id: &str, want: bool) {
    let word = if want { "suspended" } else { "running" };
    wait_until_dbg(word, Duration::from_secs(20), || {
        let s = said(root, id);
        let ok = s.0.contains(word) && s.1 == want && s.2.contains(word) && s.3 == want;
        ok.then_some(()).ok_or(s)
    });
}

fn stop_and_continue(mode: &[&str], id: &str) {
    let root = TestRoot::new();
    let run = detached(&root, id, mode, &["--children", "2"]);
    let c = ctx(&root, id);
    wait_said(&root, id, false);
    for pid in run.tree.pids() {
        c.signal(&run.tree, pid, libc::SIGSTOP);
    }
    wait_said(&root, id, true);
    // One process running again: not suspended.
    let first = run.tree.pids()[0];
    c.signal(&run.tree, first, libc::SIGCONT);
    wait_said(&root, id, false);
    for pid in run.tree.pids() {
        c.signal(&run.tree, pid, libc::SIGCONT);
    }
    ar_code(&root, &["cancel", id], 0);
    run.assert_gone(&root, "after cancel");
}

cases!(|(mode, id): (&[&str], &str)| stop_and_continue(mode, id);
    a_run_whose_processes_are_all_stopped_is_suspended_in_a_cgroup => (&[], "stopped-cg"),
    a_run_whose_processes_are_all_stopped_is_suspended_by_proc_scans => (&["--cgroup", "off"], "stopped-procfs"),
);

#[test]
fn a_run_whose_cgroup_is_frozen_is_suspended() {
    let root = TestRoot::new();
    let id = "frozen";
    let run = detached(&root, id, &[], &["--children", "1"]);
    let st = root.status(id);
    let Some(cg) = st["containment"]["cgroup"].as_str().map(str::to_string) else {
        eprintln!("no cgroup on this host: the frozen case is not tested");
        ar_code(&root, &["cancel", id], 0);
        return;
    };
    let freeze = std::path::Path::new(&cg).join("cgroup.freeze");
    std::fs::write(&freeze, "1").expect("freeze the run's cgroup");
    wait_said(&root, id, true);
    std::fs::write(&freeze, "0").expect("thaw it");
    wait_said(&root, id, false);
    ar_code(&root, &["cancel", id], 0);
    run.assert_gone(&root, "after cancel");
}
