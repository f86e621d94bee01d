//! The one output rule: every subcommand prints for people on stdout, whether it is a terminal
//! or not, and one JSON document with `--json`. Here stdout is always a pipe, the case that
//! used to print JSON unasked.

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::facts::shared_cpu;
use agent_run_tests::{
    agent_run_bin, describe_output, exit_code, run_with_timeout, TestRoot, LEASE_TOKEN_ENV,
};
use serde_json::Value;
use std::process::Output;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Stdout is for people: not empty, and not a JSON document.
fn human(what: &str, out: &Output) -> String {
    let s = text(&out.stdout);
    assert!(!s.trim().is_empty(), "{}", describe_output(what, out));
    assert!(
        serde_json::from_str::<Value>(&s).is_err() && !s.trim_start().starts_with('{'),
        "JSON without --json: {}",
        describe_output(what, out)
    );
    s
}

fn sleeper(root: &TestRoot, id: &str, opts: &[&str]) -> Output {
    let mut args = vec!["start", "-d"];
    args.extend(opts);
    args.extend([id, "--", "sleep", "60"]);
    ar_code(root, &args, 0)
}

/// `start -d` without a token of the caller's: start makes one and hands it out.
fn sleeper_own_token(root: &TestRoot, id: &str, opts: &[&str]) -> Output {
    let mut cmd = root.cmd();
    cmd.env_remove(LEASE_TOKEN_ENV)
        .args(["start", "-d"])
        .args(opts);
    cmd.args([id, "--", "sleep", "60"]);
    let out = run_with_timeout(&mut cmd, T);
    assert_eq!(
        exit_code(&out.status),
        0,
        "{}",
        describe_output("start -d", &out)
    );
    out
}

#[test]
fn start_d_says_started_and_hands_the_lease_token_to_the_caller() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let out = sleeper_own_token(&root, "o1", &["--lease", "10m"]);
    let said = human("start -d", &out);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{}", describe_output("start -d", &out));
    let pid = root.status("o1")["pid"].as_i64().expect("a pid");
    assert_eq!(
        lines[0],
        format!("started o1 (pid {pid}); agent-run attach o1 to follow")
    );
    let token = lines[1]
        .strip_prefix("lease token: ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no token line: {said}"));
    assert_eq!(
        lines[1],
        format!("lease token: {token} (renew: AGENT_RUN_LEASE_TOKEN={token} agent-run renew o1)")
    );
    // The token said is the run's: renew takes it.
    let out = ar_code(&root, &["renew", "--token", token, "o1"], 0);
    let said = human("renew", &out);
    assert!(
        said.starts_with("renewed o1: the lease ends at ") && said.contains("(in 10m)"),
        "{said}"
    );
    let out = ar_code(&root, &["renew", "--json", "--token", token, "o1"], 0);
    assert_eq!(json_of(&out)["lease_s"], 600.0);

    // --json: the JSON line, with the token this start made.
    let out = sleeper_own_token(&root, "o2", &["--json", "--lease", "10m"]);
    let line = json_of(&out);
    assert_eq!(line["run_id"], "o2");
    assert_eq!(line["state"], "running");
    assert!(
        line["lease_token"].as_str().is_some_and(|t| t.len() >= 16),
        "{line}"
    );
    ar_code(&root, &["cancel", "--all"], 0);
}

#[test]
fn cancel_status_renew_and_wait_print_lines_and_json_only_with_json() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    for id in ["m1", "m2", "m3"] {
        sleeper(&root, id, &["--lease", "10m"]);
    }
    let token = "output-rule-token-0123456789";
    sleeper(&root, "m4", &["--lease", "10m"]);
    // Several ids: a summary each for status, one JSON array with --json.
    let out = ar_code(&root, &["status", "m1", "m2"], 0);
    let said = human("status m1 m2", &out);
    assert!(
        said.contains("run m1: running") && said.contains("run m2: running"),
        "{said}"
    );
    let docs = json_of(&ar_code(&root, &["status", "--json", "m1", "m2"], 0));
    assert_eq!(docs.as_array().map(Vec::len), Some(2), "{docs}");

    // renew with a wrong token is refused (77) by each run, named on stderr; nothing JSON.
    let out = ar(&root, &["renew", "--token", token, "m1", "m2"]);
    assert_eq!(
        out.status.code(),
        Some(77),
        "{}",
        describe_output("renew", &out)
    );
    assert!(
        text(&out.stdout).is_empty(),
        "{}",
        describe_output("renew", &out)
    );
    let out = ar(&root, &["renew", "--json", "--token", token, "m1", "m2"]);
    let docs = json_of(&out);
    assert_eq!(docs[1]["error_exit_code"], 77, "{docs}");

    // cancel: one line a run; --json: the record, or one array.
    let out = ar_code(&root, &["cancel", "m1"], 0);
    let said = human("cancel m1", &out);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.starts_with("run m1: cancelled (cancel_request)"),
        "{said}"
    );
    let out = ar_code(&root, &["cancel", "m2", "m3"], 0);
    let said = human("cancel m2 m3", &out);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert!(lines[0].starts_with("run m2: cancelled"), "{said}");
    assert!(lines[1].starts_with("run m3: cancelled"), "{said}");
    let rec = json_of(&ar_code(&root, &["cancel", "--json", "m4"], 0));
    assert_eq!(rec["state"], "cancelled");
    let docs = json_of(&ar_code(&root, &["cancel", "--json", "m1", "m2"], 0));
    assert_eq!(docs.as_array().map(Vec::len), Some(2), "{docs}");

    // wait: its exit code says it; --json the records.
    let out = ar(&root, &["wait", "m1", "m2"]);
    assert!(
        !text(&out.stdout).trim_start().starts_with('['),
        "{}",
        describe_output("wait", &out)
    );
    let docs = json_of(&ar(&root, &["wait", "--json", "m1", "m2"]));
    assert_eq!(docs.as_array().map(Vec::len), Some(2), "{docs}");
}

#[test]
fn a_relaunch_of_a_final_run_prints_one_line_and_the_record_only_with_json() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    ar_code(&root, &["r1", "--", "sh", "-c", "exit 3"], 3);
    let out = ar_code(&root, &["r1", "--", "sh", "-c", "exit 3"], 3);
    let err = text(&out.stderr);
    assert_eq!(
        err.lines().count(),
        1,
        "{}",
        describe_output("relaunch", &out)
    );
    assert!(
        err.starts_with("agent-run: run r1: finished") && err.contains("not running it again"),
        "{err}"
    );
    assert!(
        text(&out.stdout).is_empty(),
        "{}",
        describe_output("relaunch", &out)
    );
    let out = ar_code(&root, &["r1", "--json", "--", "sh", "-c", "exit 3"], 3);
    assert_eq!(json_of(&out)["exit_code"], 3);
    assert_eq!(text(&out.stderr).lines().count(), 1);
    // start -d of it: its one line, and the run's code.
    let out = ar_code(&root, &["start", "-d", "r1", "--", "sh", "-c", "exit 3"], 3);
    let said = human("start -d of a final run", &out);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.starts_with("run r1: finished"), "{said}");
}

#[test]
fn the_help_says_the_rule_and_version_names_the_feature() {
    let root = TestRoot::new();
    let out = run_with_timeout(std::process::Command::new(agent_run_bin()).arg("--help"), T);
    let help = text(&out.stdout);
    assert!(help.contains("with --json, one JSON document"), "{help}");
    for sub in ["status", "cancel", "renew", "wait"] {
        let help = text(&ar_code(&root, &[sub, "--help"], 0).stdout);
        assert!(!help.contains("one JSON document for all"), "{sub}: {help}");
        assert!(!help.contains("not a terminal"), "{sub}: {help}");
    }
    let v = json_of(&ar_code(&root, &["version", "--json"], 0));
    let features = v["features"].as_array().expect("features");
    assert!(features.iter().any(|f| f == "json_flag"), "{v}");
}
