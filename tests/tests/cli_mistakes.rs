//! A user's first mistakes launch nothing: a mistyped subcommand and a lease of zero exit 64, and
//! `-d` on an existing run prints its line and starts nothing.
//!
//! Every test drives the real binaries and asserts on facts (the run root's contents, files a
//! command would have created, /proc, status.json), not on messages alone. Run ids start with `fc-`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::{
    ctx, describe_output, ensure, exit_code, processes_with_env, run_with_timeout, TestRoot,
};
use serde_json::{json, Value};

/// What is under the run root (nothing when it does not even exist).
fn root_entries(root: &TestRoot) -> Vec<String> {
    match fs::read_dir(root.root()) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// An executable script that records that it ran by creating `marker`.
fn marker_script(dir: &Path, name: &str, marker: &Path) -> PathBuf {
    let script = dir.join(name);
    fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    script
}

// =============================================================================================
// Typos never launch runs

/// `stop`, `kill`, `ls`, `frobnicate`, `cancle` (and a run id without `--`) exit 64, create
/// nothing under the root, run nothing (the second word is a real program that would leave a
/// marker), and suggest the near subcommand. Before: `stop X` and `kill X` made runs named stop
/// and kill that ran X; `frobnicate` exited 127; `ls` complained about a missing COMMAND.
#[test]
fn a_mistyped_subcommand_exits_64_creates_nothing_and_runs_nothing() {
    let root = TestRoot::swept();
    let marker = root.dir.path().join("it-ran");
    let prog = marker_script(root.dir.path(), "train-3", &marker);
    let prog = prog.to_str().unwrap();
    for (args, hint) in [
        (vec!["stop", prog], Some("cancel")),
        (vec!["kill", prog], Some("cancel")),
        (vec!["ls"], Some("list")),
        (vec!["frobnicate", prog], None),
        (vec!["cancle", "fc-x"], Some("cancel")),
        (vec!["fc-no-dashes", prog], None),
    ] {
        let out = ar_code(&root, &args, 64);
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!("agent-run: unrecognized subcommand '{}'", args[0])),
            "{args:?}: {err}"
        );
        match hint {
            Some(h) => assert!(
                err.contains(&format!("did you mean '{h}'?")),
                "{args:?}: {err}"
            ),
            None => assert!(!err.contains("did you mean"), "{args:?}: {err}"),
        }
        assert!(err.contains("RUN_ID -- COMMAND"), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: stdout {:?}",
            text(&out.stdout)
        );
        assert_eq!(
            root_entries(&root),
            Vec::<String>::new(),
            "{args:?} created runs"
        );
        assert!(!root.root().exists(), "{args:?} created the run root");
        assert!(!marker.exists(), "{args:?} ran {prog}");
    }
    let c = ctx(&root, "fc-with-dashes");
    // The implicit form with `--` still starts a run, and runs the program.
    ar_code(&root, &["fc-with-dashes", "--quiet", "--", prog], 0);
    ensure!(c, marker.exists(), "agent-run ID -- PROG did not run PROG");
    c.record("the record", json!({"state": "finished"}));
}

// =============================================================================================
// Leases

/// `--lease 0` is refused (64) by `start`, `start -d`, `renew` and `remote`, with a message that
/// says why, and nothing is created. Before: the run started and was stopped at once.
#[test]
fn a_lease_of_zero_is_refused_with_64() {
    let root = TestRoot::swept();
    for args in [
        &["start", "--lease", "0", "fc-l0", "--", "true"][..],
        &["--lease", "0s", "fc-l0", "--", "true"],
        &["start", "-d", "--lease", "0ms", "fc-l0", "--", "true"],
        &["remote", "--lease", "0", "nohost", "--", "true"],
    ] {
        let out = ar_code(&root, args, 64);
        let err = text(&out.stderr);
        assert!(
            err.starts_with("agent-run: ") && err.contains("a lease must be longer than 0"),
            "{args:?}: {err}"
        );
        assert!(!root.root().exists(), "{args:?} created the run root");
    }
    let c = ctx(&root, "fc-l1");
    ar_code(
        &root,
        &["-d", "--lease", "1h", "fc-l1", "--", "sleep", "300"],
        0,
    );
    let before = fs::read(root.run_dir("fc-l1").join("lease.json")).unwrap();
    let out = ar_code(&root, &["renew", "fc-l1", "--lease", "0"], 64);
    ensure!(
        c,
        text(&out.stderr).contains("a lease must be longer than 0"),
        "text(&out.stderr).contains(\"a lease must be longer than 0\")"
    );
    c.eq(
        &fs::read(root.run_dir("fc-l1").join("lease.json")).unwrap(),
        &before,
        "a refused renew changed lease.json",
    );
    ar_code(&root, &["cancel", "fc-l1"], 0);
}

/// The wrappers of this root's runs that are alive (found by their `--detached-child` argv).
fn detached_wrappers(root: &TestRoot) -> Vec<i32> {
    let root_arg = root.root().display().to_string();
    processes_with_argv(|argv| {
        argv.iter().any(|a| a == "--detached-child") && argv.contains(&root_arg)
    })
}

/// `-d` of an existing run id never runs the command again and never attaches: one JSON line
/// on stdout with the run's current state, nothing on stderr; the run's own code when it is
/// final, 0 while it is active; no second wrapper left waiting. Before: a `-d` relaunch of an
/// active run left a second wrapper process waiting for the run's end.
#[test]
fn detach_of_an_existing_run_prints_its_line_and_starts_nothing() {
    let root = TestRoot::swept();
    let c = ctx(&root, "fc-d-final");
    // Final.
    let cmd = ["fc-d-final", "--", "sh", "-c", "echo once; exit 3"];
    // Returns once the run is running (0), or already final (3) if it was that fast.
    let mut first = root.cmd();
    first.args(["-d", "--json"]).args(cmd);
    let first = run_with_timeout(&mut first, T);
    ensure!(
        c,
        matches!(exit_code(&first.status), 0 | 3),
        "{}",
        describe_output("the first -d", &first)
    );
    let line: Value = serde_json::from_slice(&first.stdout).unwrap();
    let st = root.wait_final("fc-d-final", T);
    c.eq(&st["exit_code"], 3, "st[\"exit_code\"]");
    let again = ar_code(&root, &[&["-d", "--json"][..], &cmd].concat(), 3);
    c.eq(
        &text(&again.stdout).lines().count(),
        &1,
        format_args!("{}", text(&again.stdout)),
    );
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    c.eq(&v["state"], "finished", "v[\"state\"]");
    c.eq(
        &(v["pid"].clone(), v["run_id"].clone()),
        &(line["pid"].clone(), line["run_id"].clone()),
        "(v[\"pid\"].clone(), v[\"run_id\"].clone())",
    );
    ensure!(
        c,
        again.stderr.is_empty(),
        "stderr: {}",
        text(&again.stderr)
    );
    let launches = root
        .event_names("fc-d-final")
        .iter()
        .filter(|e| *e == "launch")
        .count();
    ctx(&root, "fc-d-final").eq(&launches, &1, "launches");
    c.eq(
        fs::read_to_string(root.run_dir("fc-d-final").join("stdout.log")).unwrap(),
        "once\n",
        "fs::read_to_string(root.run_dir(\"fc-d-final\").join(\"stdout.log\")).unwrap()",
    );
    // A different command under the same id: 65, nothing printed on stdout.
    let other = ar_code(&root, &["-d", "fc-d-final", "--", "true"], 65);
    ensure!(c, other.stdout.is_empty(), "other.stdout.is_empty()");

    let c = ctx(&root, "fc-d-live");
    // Active.
    let cmd = ["fc-d-live", "--", "sleep", "300"];
    ar_code(&root, &[&["-d"][..], &cmd].concat(), 0);
    let wrapper = root.status("fc-d-live")["wrapper_pid"].as_i64().unwrap() as i32;
    let started = Instant::now();
    let again = ar_code(&root, &[&["-d", "--json"][..], &cmd].concat(), 0);
    ensure!(
        c,
        started.elapsed() < Duration::from_secs(10),
        "started.elapsed() < Duration::from_secs(10)"
    );
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    c.eq(&v["state"], "running", "v[\"state\"]");
    ensure!(
        c,
        again.stderr.is_empty(),
        "stderr: {}",
        text(&again.stderr)
    );
    c.eq(
        &detached_wrappers(&root),
        &vec![wrapper],
        "wrappers of this root",
    );
    let marked = processes_with_env("AGENT_RUN_ID", |v| v == b"fc-d-live");
    c.eq(
        &marked.len(),
        &1,
        format_args!("one workload process: {marked:?}"),
    );
    ar_code(&root, &["cancel", "fc-d-live"], 0);
}
