//! A full disk (ENOSPC on a 256 KiB tmpfs) during `cancel` or TERM to the wrapper does not keep a
//! tree alive, and a later `cancel` finishes the record (hazard H-2).
//!
//! The standard is the seed ADR's (`docs/references.md`): name the hazard, name the causal
//! scenario, and prove with real processes that the constraint holds. Every process a test sees is
//! pinned with a pidfd right after the fixture's ready line, asserted on through /proc (a zombie is
//! dead), and SIGKILLed by pid when the test ends. Run ids start with `rel-`.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use agent_run_tests::facts::ended;
use agent_run_tests::hazards::*;
use agent_run_tests::workload::{fx_args, start_argv};
use agent_run_tests::{
    ctx, describe_output, ensure, run_with_timeout, Pinned, Spawned, TestRoot, FINAL_STATES,
};

// =============================================================================================
// 2. A full disk: the record cannot be written, the stop must happen anyway.

/// A 256 KiB tmpfs (mode 0700) mounted over a test's temporary dir, lazily unmounted on drop.
struct SmallTmpfs {
    at: PathBuf,
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        // Lazy: a process of a failed test may still hold a log open in it.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .stdin(Stdio::null())
            .output();
    }
}

/// Mounts the tmpfs over the TestRoot's dir (so the run root lives in it), or None, with a note
/// on stderr, when this host does not allow mounting.
fn small_tmpfs(root: &TestRoot) -> Option<SmallTmpfs> {
    let at = root.dir.path().to_path_buf();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs"])
        .arg(&at)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => Some(SmallTmpfs { at }),
        Ok(out) => {
            eprintln!(
                "note: skipping a full-disk test: cannot mount a tmpfs on {}: {}",
                at.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("note: skipping a full-disk test: cannot run mount: {e}");
            None
        }
    }
}

/// Writes `path` until the filesystem says ENOSPC, then checks that a new file cannot get a
/// single byte: the filesystem is full.
fn fill_the_disk(root: &TestRoot, id: &str, path: &Path) {
    let c = ctx(root, id);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| c.fail(format_args!("cannot create {}: {e}", path.display())));
    let chunk = vec![0x5au8; 4096];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => c.fail(format_args!("cannot fill {}: {e}", path.display())),
        }
    }
    let probe = path.with_extension("probe");
    let full = fs::File::create(&probe).and_then(|mut p| p.write_all(&chunk));
    let _ = fs::remove_file(&probe);
    ensure!(
        c,
        full.as_ref().err().and_then(io::Error::raw_os_error) == Some(libc::ENOSPC),
        "the filesystem is not full after filling it: {full:?}"
    );
}

/// Asserts that an error report on a full disk is agent-run's, names status.json, and says
/// ENOSPC.
fn assert_enospc_reported(root: &TestRoot, id: &str, what: &str, out: &Output) {
    let c = ctx(root, id);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        stderr.contains("No space left on device") && stderr.contains("status.json"),
        "{what} must say that status.json could not be written (No space left on device)\n{}",
        describe_output(what, out)
    );
    ensure!(
        c,
        stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| l.starts_with("agent-run: ")),
        "every line {what} writes to stderr starts with \"agent-run: \"\n{}",
        describe_output(what, out)
    );
}

#[test]
fn a_full_disk_does_not_keep_a_cancelled_tree_alive_and_a_later_cancel_finishes_the_record() {
    let root = TestRoot::sharing_cpu();
    let Some(_fs) = small_tmpfs(&root) else {
        return;
    };
    let id = "rel-disk-cancel";
    let c = ctx(&root, id);
    let watch = RecordWatch::start(root.run_dir(id).join("status.json"));
    let run = start_detached(&root, id, &["--grace", "1s"], &fx_args(&PLAIN_TREE));
    let tree = pin_tree(&root, id);
    let filler = root.dir.path().join("filler");
    fill_the_disk(&root, id, &filler);

    let what = format!("agent-run cancel {id} (disk full)");
    let out = run_with_timeout(agent_run(&root).args(["cancel", id]), CMD);
    // The tree is stopped whether or not any record can be written.
    for (pins, part) in [(&tree.leader, "leader"), (&tree.members, "members")] {
        if let Err(alive) = pins.wait_all_gone(T) {
            c.fail(format_args!(
                "the {part} {alive:?} of the run outlived a cancel on a full disk by {T:?}\n{}",
                describe_output(&what, &out)
            ));
        }
    }
    let st = observe(&root, id, "after the cancel on a full disk").expect("status.json");
    let state = st["state"].as_str().unwrap_or_default();
    if out.status.success() {
        ensure!(
            c,
            FINAL_STATES.contains(&state),
            "cancel exited 0 but the record is {state}\n{}",
            describe_output(&what, &out)
        );
    } else {
        assert_enospc_reported(&root, id, &what, &out);
        ensure!(
            c,
            ["running", "cancelling"].contains(&state) || FINAL_STATES.contains(&state),
            "the record after a failed write is {state}"
        );
    }

    fs::remove_file(&filler).expect("cannot remove the filler");
    let out = ctl(&root, id, &["cancel", "--json", id], 0);
    let printed = json_doc(&root, id, "cancel", &out);
    let st = observe(&root, id, "after the cancel with space").expect("status.json");
    c.eq(&printed["state"], &st["state"], "cancel's printed state");
    let outcome = (
        st["state"].as_str().unwrap_or_default(),
        st["reason"].as_str().unwrap_or_default(),
    );
    ensure!(
        c,
        [("cancelled", "cancel_request"), ("unknown", "wrapper_lost")].contains(&outcome),
        "the final record of a run stopped on a full disk: {outcome:?}"
    );
    wait_gone(&root, id, &run.wrapper_pin, "the wrapper");
    assert_no_strays(&root, id, "after the final record");
    c.eq(
        &final_state_events(&root.events(id)).len(),
        &1,
        "transitions to a final state",
    );
    let seen = watch.finish();
    ensure!(
        c,
        seen.partial.is_empty(),
        "status.json was seen partial: {:?}",
        seen.partial
    );
}

#[test]
fn term_to_the_wrapper_on_a_full_disk_stops_the_tree_and_exits_non_zero_naming_the_record() {
    let id = "rel-disk-term";
    let root = TestRoot::sharing_cpu();
    let Some(_fs) = small_tmpfs(&root) else {
        return;
    };
    let watch = RecordWatch::start(root.run_dir(id).join("status.json"));
    let wrapper = Spawned::spawn(agent_run(&root).args(start_argv(
        &["--quiet", "--grace", "1s"],
        id,
        &fx_args(&PLAIN_TREE),
    )));
    let wrapper_pin = Pinned::new(&[wrapper.child.id() as i32]);
    wait_state(&root, id, &["running"]);
    let tree = pin_tree(&root, id);
    let filler = root.dir.path().join("filler");
    fill_the_disk(&root, id, &filler);

    wrapper.signal(libc::SIGTERM);
    let what = wrapper.what.clone();
    let out = wrapper.finish(CMD);
    ensure!(
        ctx(&root, id),
        out.status.code().is_some_and(|c| c != 0),
        "the wrapper must exit non-zero when it cannot write the final record\n{}",
        describe_output(&what, &out)
    );
    assert_enospc_reported(&root, id, &what, &out);
    // It returned after its stop: nothing of the tree may be alive now.
    let alive = tree.alive();
    ensure!(
        ctx(&root, id),
        alive.is_empty(),
        "the wrapper returned but {alive:?} of its tree are alive\n{}",
        describe_output(&what, &out)
    );
    wait_gone(&root, id, &wrapper_pin, "the wrapper");
    let st = observe(&root, id, "after the wrapper failed to write").expect("status.json");
    ensure!(
        ctx(&root, id),
        ["running", "cancelling"].contains(&st["state"].as_str().unwrap_or_default()),
        "on a full disk the old record stays: {}",
        st["state"]
    );

    fs::remove_file(&filler).expect("cannot remove the filler");
    watchdog_once(&root, id);
    let st = observe(&root, id, "after the watchdog").expect("status.json");
    ctx(&root, id).fields(
        &st,
        "nothing was left to stop, and no record says how the run ended",
        ended("unknown", "wrapper_lost"),
    );
    assert_no_strays(&root, id, "after the final record");
    ctx(&root, id).eq(
        &final_state_events(&root.events(id)).len(),
        &1,
        "transitions to a final state",
    );
    let seen = watch.finish();
    ensure!(
        ctx(&root, id),
        seen.partial.is_empty(),
        "status.json was seen partial: {:?}",
        seen.partial
    );
}
