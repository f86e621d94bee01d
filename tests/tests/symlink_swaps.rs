//! Symlinks planted before a launch, raced into it or swapped in after it (run dir, logs, ids,
//! status.json, the lock, cancel.json) are never written through nor believed (hazard H-4).
//!
//! The standard is the seed ADR's (`docs/references.md`): name the hazard, name the causal
//! scenario, and prove with real processes that the constraint holds. Every process a test sees is
//! pinned with a pidfd right after the fixture's ready line, asserted on through /proc (a zombie is
//! dead), and SIGKILLed by pid when the test ends. Run ids start with `rel-`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use agent_run_tests::facts::{ended, path_str, private_dir};
use agent_run_tests::hazards::*;
use agent_run_tests::workload::{fx_args, start_argv};
use agent_run_tests::{
    ctx, describe_output, ensure, exit_code, run_with_timeout, Pinned, Spawned, TestRoot,
    FINAL_STATES,
};

// =============================================================================================
// 4. Hostile neighbours: symlinks in and around the run dir, another user, forged records.

/// A file outside every run dir that agent-run must never write, truncate or believe.
struct Sentinel {
    path: PathBuf,
    bytes: Vec<u8>,
    modified: SystemTime,
}

impl Sentinel {
    fn new(root: &TestRoot, bytes: &[u8]) -> Sentinel {
        let path = root.dir.path().join("sentinel");
        fs::write(&path, bytes).expect("cannot write the sentinel");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod sentinel");
        let modified = fs::metadata(&path)
            .and_then(|m| m.modified())
            .expect("sentinel mtime");
        Sentinel {
            path,
            bytes: bytes.to_vec(),
            modified,
        }
    }

    /// Asserts that the sentinel still holds its bytes and was never written to.
    fn assert_untouched(&self, root: &TestRoot, id: &str, when: &str) {
        let c = ctx(root, id);
        let now = fs::read(&self.path).unwrap_or_default();
        let modified = fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        ensure!(
            c,
            now == self.bytes && modified == Some(self.modified),
            "{when}: the sentinel {} was written through a symlink: now {:?} (mtime {modified:?})",
            self.path.display(),
            String::from_utf8_lossy(&now)
        );
    }
}

/// Replaces `dir/name` atomically with a symlink to `target`; the original (if any) is kept
/// as `name.orig`.
fn swap_for_symlink(dir: &Path, name: &str, target: &Path) {
    let path = dir.join(name);
    if fs::symlink_metadata(&path).is_ok() {
        fs::rename(&path, dir.join(format!("{name}.orig")))
            .unwrap_or_else(|e| panic!("cannot move {} away: {e}", path.display()));
    }
    symlink(target, &path).unwrap_or_else(|e| panic!("cannot plant {}: {e}", path.display()));
}

fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// A foreground run of a plain tree, running and pinned.
struct Foreground {
    proc: Spawned,
    wrapper_pin: Pinned,
    tree: Tree,
}

fn start_foreground(root: &TestRoot, id: &str, quiet: bool) -> Foreground {
    let mut opts = vec!["--grace", "1s"];
    if quiet {
        opts.push("--quiet");
    }
    let proc = Spawned::spawn(agent_run(root).args(start_argv(&opts, id, &fx_args(&PLAIN_TREE))));
    let wrapper_pin = Pinned::new(&[proc.child.id() as i32]);
    wait_state(root, id, &["running"]);
    // The journal's launch lines follow the record: a test that snapshots the journal waits.
    ctx(root, id).launched();
    let tree = pin_tree(root, id);
    Foreground {
        proc,
        wrapper_pin,
        tree,
    }
}

/// Waits for a foreground wrapper and checks its exit code.
fn finish_with(root: &TestRoot, id: &str, proc: Spawned, want: i32) -> Output {
    let c = ctx(root, id);
    let what = proc.what.clone();
    let out = proc.finish(CMD);
    c.eq(
        &exit_code(&out.status),
        &want,
        format_args!("the wrapper's exit code\n{}", describe_output(&what, &out)),
    );
    out
}

/// Runs an agent-run command that must refuse: not 0, not a crash, an `agent-run: ` message.
fn refused<S: AsRef<str>>(root: &TestRoot, id: &str, args: &[S], codes: &[i32]) -> Output {
    let (what, out, code) = ctl_run(root, args);
    ensure!(
        ctx(root, id),
        codes.contains(&code) && String::from_utf8_lossy(&out.stderr).starts_with("agent-run: "),
        "{what} must refuse with one of {codes:?} and say why\n{}",
        describe_output(&what, &out)
    );
    out
}

#[test]
fn a_run_dir_planted_as_a_symlink_before_launch_is_refused_with_78_and_nothing_runs_through_it() {
    let root = TestRoot::sharing_cpu();
    let id = "rel-planted-dir";
    let c = ctx(&root, id);
    private_dir(&root.root());
    let elsewhere = root.dir.path().join("elsewhere");
    private_dir(&elsewhere);
    symlink(&elsewhere, root.run_dir(id)).expect("cannot plant the run dir symlink");
    let counter = root.dir.path().join("ran");
    let command = fx_args(&["count", path_str(&counter)]);
    let dir = root.run_dir(id);

    for opts in [&[][..], &["--detach"][..]] {
        let out = refused(&root, id, &start_argv(opts, id, &command), &[78]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            c,
            opts.contains(&"--detach") || stderr.contains(path_str(&dir)),
            "the refusal must name the run dir {}: {stderr}",
            dir.display()
        );
    }
    for args in [
        vec!["cancel", id],
        vec!["status", "--json", id],
        vec!["renew", id, "--lease", "1m"],
        vec!["logs", id],
        vec!["wait", id, "--timeout", "1s"],
    ] {
        refused(&root, id, &args, &[78]);
    }
    watchdog_once(&root, id);
    let planted: Vec<_> = fs::read_dir(&elsewhere)
        .expect("the target dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    ensure!(
        c,
        planted.is_empty(),
        "files were created through the symlinked run dir: {planted:?}"
    );
    ensure!(
        c,
        !counter.exists(),
        "the command ran through a symlinked run dir"
    );
    ensure!(c, is_symlink(&dir), "the planted symlink was replaced");
}

#[test]
fn symlinks_raced_into_a_new_run_dir_during_launch_are_never_written_through() {
    const PLANTED: [&str; 9] = [
        "lock",
        "events.jsonl",
        "status.json",
        "lease.json",
        "stdout.log",
        "stderr.log",
        "pid",
        "pgid",
        "cancel.json",
    ];
    const ROUNDS_PER_FILE: usize = 3;
    let root = TestRoot::sharing_cpu();
    let sentinel = Sentinel::new(&root, b"sentinel: agent-run must never write here\n");
    private_dir(&root.root());
    // file planted -> exit code -> launches
    let mut tally: BTreeMap<&str, BTreeMap<i32, usize>> = BTreeMap::new();
    for round in 0..PLANTED.len() * ROUNDS_PER_FILE {
        let name = PLANTED[round / ROUNDS_PER_FILE];
        let id = format!("rel-race-{round:02}");
        let id = id.as_str();
        let c = ctx(&root, id);
        let dir = root.run_dir(id);
        // The racer plants one symlink from the moment the run dir exists until the launch is
        // over; one file per round, so every step of a launch meets its own planted link.
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let (stop, link, target) = (Arc::clone(&stop), dir.join(name), sentinel.path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = symlink(&target, &link);
                }
            })
        };
        let out = run_with_timeout(
            agent_run(&root).args(start_argv(
                &["--quiet", "--lease", "1h"],
                id,
                &fx_args(&["spew", "4096", "--stderr-bytes", "512"]),
            )),
            CMD,
        );
        stop.store(true, Ordering::Relaxed);
        racer.join().expect("the racer panicked");
        sentinel.assert_untouched(&root, id, &format!("round {round} ({name} planted)"));

        let code = exit_code(&out.status);
        *tally.entry(name).or_default().entry(code).or_default() += 1;
        // A status.json that is still the racer's symlink is no record of agent-run's.
        let st = if is_symlink(&dir.join("status.json")) {
            None
        } else {
            observe(&root, id, "after a raced launch")
        };
        match code {
            0 => {
                let st = st.unwrap_or_else(|| c.fail("exit 0 without a record"));
                c.eq(
                    &(st["state"].as_str(), st["exit_code"].as_i64()),
                    &(Some("finished"), Some(0)),
                    "a launch that exits 0",
                );
                let log = fs::read(dir.join("stdout.log")).unwrap_or_default();
                ensure!(
                    c,
                    !is_symlink(&dir.join("stdout.log")) && log.len() == 4096,
                    "the workload's output went elsewhere ({} bytes in stdout.log)",
                    log.len()
                );
            }
            70 | 78 => {
                ensure!(
                    c,
                    String::from_utf8_lossy(&out.stderr).starts_with("agent-run: "),
                    "a refused launch says why\n{}",
                    describe_output("start", &out)
                );
                if let Some(st) = st {
                    ensure!(
                        c,
                        FINAL_STATES.contains(&st["state"].as_str().unwrap_or_default()),
                        "a refused launch leaves a final record or none: {}",
                        st["state"]
                    );
                }
            }
            other => c.fail(format_args!(
                "a launch with {name} raced exited {other}\n{}",
                describe_output("start", &out)
            )),
        }
        assert_no_strays(&root, id, "after a raced launch");
    }
    eprintln!("symlink race: planted file -> exit code -> launches: {tally:?}");
}

#[test]
fn log_and_id_files_swapped_for_symlinks_after_launch_are_never_written_through_and_cancel_still_stops_the_tree(
) {
    let root = TestRoot::sharing_cpu();
    let id = "rel-swap-logs";
    let c = ctx(&root, id);
    let sentinel = Sentinel::new(&root, b"sentinel: secret text that must not be streamed\n");
    let run = start_foreground(&root, id, false);
    let dir = root.run_dir(id);
    for name in ["stdout.log", "stderr.log", "pid", "pgid", "events.jsonl"] {
        swap_for_symlink(&dir, name, &sentinel.path);
    }
    for args in [vec!["logs", id], vec!["logs", "--stderr", id]] {
        let out = run_with_timeout(agent_run(&root).args(&args), CMD);
        ensure!(
            c,
            !String::from_utf8_lossy(&out.stdout).contains("sentinel"),
            "`agent-run {}` printed the sentinel through a symlink\n{}",
            args.join(" "),
            describe_output("logs", &out)
        );
    }
    // The journal is a symlink now: a cancel may refuse to act on it, but must not write it.
    let first = run_with_timeout(agent_run(&root).args(["cancel", id]), CMD);
    sentinel.assert_untouched(&root, id, "after a cancel with a symlinked journal");
    if !first.status.success() {
        assert_untouched_run(
            &root,
            id,
            &run.tree,
            &run.wrapper_pin,
            "after a refused cancel",
        );
        fs::rename(dir.join("events.jsonl.orig"), dir.join("events.jsonl"))
            .expect("cannot restore the journal");
        ctl(&root, id, &["cancel", id], 0);
    }
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    let out = finish_with(&root, id, run.proc, 143);
    ensure!(
        c,
        !String::from_utf8_lossy(&out.stdout).contains("sentinel"),
        "the wrapper streamed the sentinel through the symlinked stdout.log"
    );
    sentinel.assert_untouched(&root, id, "after the run ended");
    let st = observe(&root, id, "after the run ended").expect("status.json");
    c.eq(&st["state"], "cancelled", "the final state");
    ensure!(
        c,
        !is_symlink(&dir.join("status.json")),
        "status.json is a symlink"
    );
}

#[test]
fn a_status_json_swapped_for_a_symlink_is_named_by_cancel_and_replaced_not_followed_by_the_wrapper()
{
    let root = TestRoot::sharing_cpu();
    let id = "rel-swap-status";
    let c = ctx(&root, id);
    let run = start_foreground(&root, id, true);
    let dir = root.run_dir(id);
    // The sentinel is a copy of the live record: believable, if anyone followed the link.
    let record = fs::read(dir.join("status.json")).expect("status.json");
    let sentinel = Sentinel::new(&root, &record);
    let tmp = dir.join(".planted.tmp");
    symlink(&sentinel.path, &tmp).expect("cannot create the symlink");
    fs::rename(&tmp, dir.join("status.json")).expect("cannot swap status.json");

    // The record cannot be read, but the wrapper holds the run's lock: it is asked. The
    // cancel names the damaged file and never follows the link.
    let out = ctl(&root, id, &["cancel", id], 0);
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("status.json"),
        "cancel must name the damaged status.json\n{}",
        describe_output("cancel", &out)
    );
    sentinel.assert_untouched(&root, id, "after the cancel");

    // The wrapper replaced the link with its own record; it never wrote through it.
    finish_with(&root, id, run.proc, 143);
    let alive = run.tree.alive();
    ensure!(
        c,
        alive.is_empty(),
        "the wrapper returned with {alive:?} alive"
    );
    sentinel.assert_untouched(&root, id, "after the wrapper's final record");
    ensure!(
        c,
        !is_symlink(&dir.join("status.json")),
        "status.json is still a symlink after the final record"
    );
    let st = observe(&root, id, "after the run ended").expect("status.json");
    c.fields(
        &st,
        "the final record",
        ended("cancelled", "cancel_request"),
    );
}

#[test]
fn a_lock_file_swapped_for_a_symlink_is_named_and_the_run_is_still_cancelled() {
    let root = TestRoot::sharing_cpu();
    let id = "rel-swap-lock";
    let c = ctx(&root, id);
    let dir = root.run_dir(id);
    let sentinel = Sentinel::new(&root, b"sentinel: not a lock\n");
    let run = start_foreground(&root, id, true);
    swap_for_symlink(&dir, "lock", &sentinel.path);

    // The wrapper still holds the run's lock on the run dir itself: it is found, and asked.
    let out = ctl(&root, id, &["cancel", id], 0);
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("lock"),
        "cancel must name the damaged lock file\n{}",
        describe_output("cancel", &out)
    );
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    finish_with(&root, id, run.proc, 143);
    sentinel.assert_untouched(&root, id, "after the cancel");
}

#[test]
fn a_cancel_json_planted_as_a_symlink_is_neither_written_through_nor_believed() {
    let root = TestRoot::sharing_cpu();
    let id = "rel-swap-cancel-json";
    let c = ctx(&root, id);
    // Believable, were it followed: a watchdog's lease expiry.
    let sentinel = Sentinel::new(
        &root,
        b"{\"source\":\"watchdog\",\"reason\":\"lease_expired\",\"by_uid\":0}\n",
    );
    let run = start_foreground(&root, id, true);
    let dir = root.run_dir(id);
    swap_for_symlink(&dir, "cancel.json", &sentinel.path);

    let out = ctl(&root, id, &["cancel", "--json", id], 0);
    let printed = json_doc(&root, id, "cancel", &out);
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    sentinel.assert_untouched(&root, id, "after the cancel");
    c.eq(
        &(printed["state"].as_str(), printed["reason"].as_str()),
        &(Some("cancelled"), Some("cancel_request")),
        "the run was cancelled by `cancel`, whatever a symlinked cancel.json says",
    );
    finish_with(&root, id, run.proc, 143);
}

#[test]
fn a_run_dir_swapped_for_a_symlink_after_launch_makes_cancel_exit_78_and_signal_nothing() {
    let root = TestRoot::sharing_cpu();
    let victim_root = TestRoot::new();
    let id = "rel-swap-dir";
    let c = ctx(&root, id);
    let victim_id = "rel-swap-dir-victim";
    let run = start_foreground(&root, id, true);
    let victim = start_foreground(&victim_root, victim_id, true);
    let victim_events = fs::read(victim_root.run_dir(victim_id).join("events.jsonl"))
        .expect("the victim's journal");
    let dir = root.run_dir(id);
    let moved = root.dir.path().join("moved");
    fs::rename(&dir, &moved).expect("cannot move the run dir");

    for target in [moved.clone(), victim_root.run_dir(victim_id)] {
        symlink(&target, &dir).expect("cannot plant the run dir symlink");
        let out = refused(&root, id, &["cancel", id], &[78]);
        ensure!(
            c,
            String::from_utf8_lossy(&out.stderr).contains(path_str(&dir)),
            "the refusal must name {}\n{}",
            dir.display(),
            describe_output("cancel", &out)
        );
        assert_untouched_run(
            &root,
            id,
            &run.tree,
            &run.wrapper_pin,
            &format!("after cancel through a symlink to {}", target.display()),
        );
        assert_untouched_run(
            &victim_root,
            victim_id,
            &victim.tree,
            &victim.wrapper_pin,
            "the victim, after a cancel through a symlink",
        );
        fs::remove_file(&dir).expect("cannot remove the symlink");
    }
    ctx(&victim_root, victim_id).eq(
        &fs::read(victim_root.run_dir(victim_id).join("events.jsonl")).unwrap_or_default(),
        &victim_events,
        "the victim's journal changed",
    );
    ensure!(
        ctx(&victim_root, victim_id),
        !victim_root.run_dir(victim_id).join("cancel.json").exists(),
        "a cancel through a symlink wrote the victim's cancel.json"
    );

    fs::rename(&moved, &dir).expect("cannot move the run dir back");
    ctl(&root, id, &["cancel", id], 0);
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    finish_with(&root, id, run.proc, 143);
    ctl(&victim_root, victim_id, &["cancel", victim_id], 0);
    finish_with(&victim_root, victim_id, victim.proc, 143);
}
