//! `-C`, `-e` and `--label` reach the workload and the record (values stay out of it), bad ones
//! are refused with 64, and an unsafe root is refused with the command that fixes it.
//!
//! Every process a test starts is pinned with a pidfd after the fixture's ready line and
//! checked in /proc; every run is final (or cancelled) before the test ends.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::facts::dir_with_mode;
use agent_run_tests::workload::fixture_path;
use agent_run_tests::{ctx, describe_output, ensure, wait_ready, Pinned, TestRoot};

// ---------------------------------------------------------------------------------------------
// -C, -e, --label

#[test]
fn cwd_env_and_labels_reach_the_workload_and_the_record_but_values_stay_out_of_it() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "ce");
    let work = root.dir.path().join("work dir");
    fs::create_dir(&work).unwrap();
    let out = ar_code(
        &root,
        &[
            "-C",
            work.to_str().unwrap(),
            "-e",
            "GREETING=s3cret-value",
            "-e",
            "EMPTY=",
            "--label",
            "job=42",
            "--label",
            "team/sub=ml=x",
            "ce",
            "--",
            "sh",
            "-c",
            r#"pwd; printf '%s|%s|%s\n' "$GREETING" "${EMPTY-unset}" "${AGENT_RUN_PASSED_ENV-none}""#,
        ],
        0,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    c.eq(
        &stdout,
        &format!("{}\ns3cret-value||none\n", work.display()),
        format_args!("{}", describe_output("start -C -e", &out)),
    );
    let st = root.status("ce");
    c.eq(&st["cwd"], work.to_str().unwrap(), "st[\"cwd\"]");
    c.eq(
        &st["env"],
        &serde_json::json!(["GREETING", "EMPTY"]),
        "st[\"env\"]",
    );
    c.eq(
        &st["labels"],
        &serde_json::json!({"job": "42", "team/sub": "ml=x"}),
        "st[\"labels\"]",
    );
    for file in ["status.json", "events.jsonl"] {
        let text = fs::read_to_string(root.run_dir("ce").join(file)).unwrap();
        ensure!(
            c,
            !text.contains("s3cret"),
            "{file} holds the value: {text}"
        );
    }

    let c = ctx(&root, "ced");
    // Detached: the values reach the workload, and never a command line.
    let fx = fixture_path();
    let script = r#"printf '%s|%s\n' "$GREETING" "${AGENT_RUN_PASSED_ENV-none}"; exec "$0" tree --children 0"#;
    ar_code(
        &root,
        &[
            "-d",
            "-e",
            "GREETING=s3cret-2",
            "--label",
            "job=43",
            "-C",
            "/",
            "ced",
            "--",
            "sh",
            "-c",
            script,
            &fx,
        ],
        0,
    );
    let log = root.run_dir("ced").join("stdout.log");
    let ready = wait_ready(&log, T);
    let tree = Pinned::new(&ready.all_pids());
    let first = fs::read_to_string(&log).unwrap();
    ensure!(c, first.starts_with("s3cret-2|none\n"), "{first:?}");
    let st = root.status("ced");
    c.eq(
        &(st["cwd"].as_str(), st["env"][0].as_str()),
        &(Some("/"), Some("GREETING")),
        "(st[\"cwd\"].as_str(), st[\"env\"][0].as_str())",
    );
    let wrapper = st["wrapper_pid"].as_i64().unwrap();
    let cmdline = fs::read(format!("/proc/{wrapper}/cmdline")).unwrap();
    ensure!(
        c,
        !String::from_utf8_lossy(&cmdline).contains("s3cret"),
        "the detached wrapper's command line holds the value"
    );

    // list and status select by label.
    let listed = json_of(&ar_code(&root, &["list", "--json", "--label", "job=43"], 0));
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["run_id"].as_str())
        .collect();
    c.eq(&ids, &["ced"], "ids");
    let listed = json_of(&ar_code(&root, &["list", "--json", "--label", "job"], 0));
    c.eq(
        &listed.as_array().unwrap().len(),
        &2,
        format_args!("{listed:#}"),
    );
    let human =
        String::from_utf8_lossy(&ar_code(&root, &["list", "--label", "team/sub=ml=x"], 0).stdout)
            .into_owned();
    ensure!(
        c,
        human.lines().count() == 2 && human.contains("ce "),
        "{human}"
    );
    ar_code(&root, &["cancel", "--label", "job=43"], 0);
    c.wait_gone(&tree, "tree");
}

#[test]
fn bad_cwd_env_and_labels_are_refused_with_64_before_anything_is_created() {
    let root = TestRoot::sharing_cpu();
    for (args, says) in [
        (vec!["-C", "/nonexistent/dir"], "--cwd /nonexistent/dir"),
        (vec!["-C", "/etc/passwd"], "not a directory"),
        (vec!["-e", "AGENT_RUN_ID=x"], "agent-run sets this variable"),
        (vec!["-e", "NOVALUE"], "NAME=VALUE"),
        (vec!["--label", "bad key=1"], "--label"),
        (vec!["--label", "a=1", "--label", "a=2"], "given twice"),
        (vec!["--timeout", "0"], "must be more than 0"),
        (vec!["-d", "--on-disconnect", "cancel"], "no caller to lose"),
        (vec!["--on-disconnect", "sometimes"], "keep, cancel"),
    ] {
        let mut all = args.clone();
        all.extend(["refused", "--", "true"]);
        let out = ar_code(&root, &all, 64);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("agent-run: ") && stderr.contains(says),
            "{args:?}: {stderr}"
        );
        assert!(
            !root.run_dir("refused").exists(),
            "{args:?} created the run dir"
        );
    }
}

#[test]
fn an_unsafe_root_is_refused_with_the_command_that_fixes_it() {
    let root = TestRoot::sharing_cpu();
    dir_with_mode(&root.root(), 0o777);
    let out = ar_code(&root, &["list"], 78);
    let dir = root.root();
    let want = format!(
        "agent-run: run root {p} is writable by its group and others (mode 0777): chmod 700 {p}\n",
        p = dir.display()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        want,
        "String::from_utf8_lossy(&out.stderr)"
    );
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let c = ctx(&root, "x");
    ar_code(&root, &["x", "--", "true"], 0);
    // A run dir of ours whose mode was changed (the workload can chmod its own dir) is set
    // back to 0700: a mode never keeps a run from being looked at or stopped.
    fs::set_permissions(root.run_dir("x"), fs::Permissions::from_mode(0o755)).unwrap();
    ar_code(&root, &["status", "x"], 0);
    let mode = fs::metadata(root.run_dir("x"))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    c.eq(mode, 0o700, "the run dir's mode after status");
}
