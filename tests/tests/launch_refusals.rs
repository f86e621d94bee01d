//! Bad input is refused before anything is created: bad run ids, a missing command, a grace
//! out of range (64), and an unsafe run root or run dir (78).
//!
//! Every test spawns the real `agent-run` binary on a real process tree ([`Run`], a foreground
//! run) and asserts on the process table: each pid the fixture reports is pinned with a pidfd right
//! after the handshake, so "stopped" means the kernel says so. Waits poll a kernel fact or a file
//! to one deadline; every failure prints the run's diagnostics.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Output;

use agent_run_tests::facts::{dir_with_mode, geteuid, path_str};
use agent_run_tests::workload::fixture_path;
use agent_run_tests::{ctx, describe_output, ensure, TestRoot};
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// Bad input

/// The names in `dir` (empty if it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A refused command's output and the root's listing (its run's [`Ctx`] adds the diagnostics).
fn refusal(root: &TestRoot, what: &str, out: &Output) -> String {
    format!(
        "{}\n--- root {} holds {:?}",
        describe_output(what, out),
        root.root().display(),
        entries(&root.root()),
    )
}

#[test]
fn bad_run_ids_exit_64_before_anything_is_created() {
    let root = TestRoot::new();
    let marker = root.dir.path().join("ran");
    let fixture = fixture_path();
    let long = "a".repeat(129);
    for id in [
        "", ".", "..", "../x", "a/b", "-x", ".hidden", &long, "é", "a b",
    ] {
        let c = ctx(&root, id);
        let args = [id, "--", &fixture, "count", path_str(&marker)];
        let out = c.run(&args);
        let what = format!("run id {id:?}");
        c.code(&out, 64, &refusal(&root, &what, &out));
        ensure!(
            c,
            fs::symlink_metadata(root.root()).is_err(),
            "{what}: the root was created\n{}",
            refusal(&root, &what, &out)
        );
        ensure!(c, !marker.exists(), "{what}: the command ran");
    }
}

#[test]
fn a_run_id_of_128_characters_is_accepted() {
    let root = TestRoot::new();
    let marker = root.dir.path().join("ran");
    let id = format!("A{}", "z-_.9".repeat(26))
        .chars()
        .take(128)
        .collect::<String>();
    assert_eq!(id.len(), 128, "the id");
    let c = ctx(&root, &id);
    let out = c.run(&[&id, "--", &fixture_path(), "count", path_str(&marker)]);
    c.code(&out, 0, &refusal(&root, "a 128-character id", &out));
    c.eq(
        fs::read_to_string(&marker).unwrap_or_default(),
        "ran\n",
        "the command's count",
    );
    c.record("the record", json!({"state": "finished"}));
}

#[test]
fn a_missing_command_exits_64_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "no-command");
    for args in [&["no-command"][..], &["no-command", "--"][..]] {
        let out = c.run(args);
        let what = format!("agent-run {args:?}");
        c.code(&out, 64, &refusal(&root, &what, &out));
        ensure!(
            c,
            entries(&root.root()).is_empty(),
            "{what} created a run\n{}",
            refusal(&root, &what, &out)
        );
    }
}

/// A grace above 5 minutes is refused before anything is created: `cancel` and the watchdog
/// honour a record's grace only up to that (the run can rewrite its record), so a launch may
/// not ask for more; 5 minutes itself is accepted.
#[test]
fn a_grace_above_five_minutes_exits_64_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "long-grace");
    let marker = root.dir.path().join("ran");
    let out = c.run(&[
        "--grace",
        "301s",
        "long-grace",
        "--",
        &fixture_path(),
        "count",
        path_str(&marker),
    ]);
    let what = "agent-run --grace 301s";
    c.code(&out, 64, &refusal(&root, what, &out));
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("at most 300s"),
        "{}",
        refusal(&root, what, &out)
    );
    ensure!(c, !marker.exists(), "the command ran");
    ensure!(
        c,
        entries(&root.root()).is_empty(),
        "{what} created a run\n{}",
        refusal(&root, what, &out)
    );
    let out = c.run(&["--quiet", "--grace", "5m", "long-grace-ok", "--", "true"]);
    c.code(&out, 0, &refusal(&root, "agent-run --grace 5m", &out));
}

/// Runs `fixture count` under `root` as `id` and asserts exit 78, stderr naming `named`, and
/// that the command never ran and `untouched` stayed empty.
fn assert_refused_as_unsafe(root: &TestRoot, id: &str, named: &Path, untouched: &Path) {
    let c = ctx(root, id);
    let marker = root.dir.path().join("ran");
    let out = c.run(&[id, "--", &fixture_path(), "count", path_str(&marker)]);
    let what = format!("run {id} under {}", root.root().display());
    let refused = refusal(root, &what, &out);
    c.code(&out, 78, &refused);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        stderr.contains(path_str(named)),
        "stderr does not name {}\n{refused}",
        named.display()
    );
    ensure!(c, !marker.exists(), "{what}: the command ran\n{refused}");
    ensure!(
        c,
        entries(untouched).is_empty(),
        "{what}: {} got {:?}\n{refused}",
        untouched.display(),
        entries(untouched)
    );
}

#[test]
fn a_group_or_world_writable_root_exits_78_naming_it() {
    let root = TestRoot::new();
    let dir = root.root();
    fs::create_dir(&dir).unwrap();
    for mode in [0o777, 0o770, 0o720, 0o702, 0o1777] {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
        assert_refused_as_unsafe(&root, "unsafe-root", &dir, &dir);
        let now = fs::metadata(&dir).unwrap().mode() & 0o7777;
        ctx(&root, "unsafe-root").eq(now, mode, "agent-run changed the unsafe root's mode");
    }
}

#[test]
fn a_root_owned_by_another_user_exits_78() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if geteuid() != 0 {
        eprintln!("note: skipped a_root_owned_by_another_user_exits_78: chown needs root");
        return;
    }
    let root = TestRoot::new();
    let dir = root.root();
    dir_with_mode(&dir, 0o700);
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    assert_refused_as_unsafe(&root, "foreign-root", &dir, &dir);
}

#[test]
fn a_root_that_is_a_symlink_exits_78() {
    let root = TestRoot::new();
    let real = root.dir.path().join("real-root");
    dir_with_mode(&real, 0o700);
    std::os::unix::fs::symlink(&real, root.root()).unwrap();
    assert_refused_as_unsafe(&root, "via-link", &root.root(), &real);
}

#[test]
fn a_run_dir_that_is_a_symlink_exits_78() {
    let root = TestRoot::new();
    let elsewhere = root.dir.path().join("elsewhere");
    for dir in [root.root(), elsewhere.clone()] {
        dir_with_mode(&dir, 0o700);
    }
    std::os::unix::fs::symlink(&elsewhere, root.run_dir("linked")).unwrap();
    assert_refused_as_unsafe(&root, "linked", &root.run_dir("linked"), &elsewhere);
}
