//! The run's records: status.json is never partial or out of order, the run files are private,
//! the pid files name what the kernel shows, and the journal records every state and signal.
//!
//! Every test spawns the real `agent-run` binary on a real process tree ([`Run`], a foreground
//! run) and asserts on the process table: each pid the fixture reports is pinned with a pidfd right
//! after the handshake, so "stopped" means the kernel says so. Waits poll a kernel fact or a file
//! to one deadline; every failure prints the run's diagnostics.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agent_run_tests::facts::{cleanup_signals, geteuid, is_rfc3339_ms, path_str};
use agent_run_tests::foreground::*;
use agent_run_tests::workload::{fixture_path, fx, strings};
use agent_run_tests::{ensure, proc_stat, TestRoot};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Records, modes, what the workload inherits

#[test]
fn a_tight_reader_never_sees_a_partial_status_json_or_a_state_out_of_order() {
    let root = TestRoot::new();
    let path = root.run_dir("polled").join("status.json");
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let saw_running = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop.0);
        let saw_running = Arc::clone(&saw_running);
        std::thread::spawn(move || {
            let (mut states, mut bad, mut reads) = (Vec::<String>::new(), Vec::new(), 0u64);
            // Keeps reading after a bad document (so the test goes on), keeping the first ten.
            let note = |bad: &mut Vec<String>, what: String| {
                if bad.len() < 10 {
                    bad.push(what);
                }
            };
            let mut last_pass = false;
            // One more pass after the stop flag: the final record is in place by then.
            while !last_pass {
                last_pass = stop.load(Ordering::SeqCst);
                let bytes = match fs::read(&path) {
                    Ok(bytes) => bytes,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => {
                        note(&mut bad, format!("read: {e}"));
                        continue;
                    }
                };
                reads += 1;
                let doc: Value = match serde_json::from_slice(&bytes) {
                    Ok(doc) => doc,
                    Err(e) => {
                        note(
                            &mut bad,
                            format!("{e}: {:?}", String::from_utf8_lossy(&bytes)),
                        );
                        continue;
                    }
                };
                if let Err(e) = check_record(&doc) {
                    note(&mut bad, format!("{e}: {doc}"));
                }
                let state = doc["state"].as_str().unwrap_or_default().to_string();
                if state == "running" {
                    saw_running.store(true, Ordering::SeqCst);
                }
                if states.last() != Some(&state) {
                    states.push(state);
                }
            }
            (states, bad, reads)
        })
    };
    let (mut run, ready, pinned) = Run::start_deaf(&root, "polled");
    let c = run.c;
    // Cancel only once the reader has seen `running` (it may be starved on a loaded host).
    c.wait("the reader to see running", || {
        if saw_running.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    });
    run.signal(libc::SIGTERM);
    run.finish(143);
    drop(stop);
    let (states, bad, reads) = reader.join().expect("the reader thread panicked");
    nothing_left(c, &pinned, ready.sid);
    ensure!(
        c,
        bad.is_empty(),
        "the reader saw invalid documents ({reads} reads): {bad:#?}"
    );
    let order = ["starting", "running", "cancelling", "cancelled"];
    let ranks: Vec<Option<usize>> = states
        .iter()
        .map(|s| order.iter().position(|o| o == s))
        .collect();
    ensure!(
        c,
        ranks.iter().all(Option::is_some) && ranks.windows(2).all(|w| w[0] < w[1]),
        "states seen out of order or not allowed: {states:?}"
    );
    for must in ["running", "cancelling", "cancelled"] {
        ensure!(
            c,
            states.iter().any(|s| s == must),
            "the reader never saw {must}: {states:?} in {reads} reads"
        );
    }
}

/// Sets its flag when dropped, so a failing test also stops the reader thread.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Asserts the root and the run dir are 0700 and every entry of the run dir a regular 0600 file.
fn assert_private_modes(run: &Run<'_>, when: &str) {
    for dir in [run.c.root.root(), run.c.root.run_dir(run.c.id)] {
        let md = fs::symlink_metadata(&dir).unwrap();
        ensure!(
            run.c,
            md.is_dir() && md.mode() & 0o7777 == 0o700,
            "{when}: {} has mode {:o}, not a 0700 dir",
            dir.display(),
            md.mode()
        );
    }
    let entries = fs::read_dir(run.c.root.run_dir(run.c.id)).unwrap();
    for entry in entries {
        let entry = entry.unwrap();
        let md = fs::symlink_metadata(entry.path()).unwrap();
        ensure!(
            run.c,
            md.file_type().is_file() && md.mode() & 0o7777 == 0o600,
            "{when}: {} has mode {:o}, not a 0600 regular file",
            entry.path().display(),
            md.mode()
        );
    }
}

#[test]
fn the_root_and_run_dir_are_0700_and_every_run_file_0600_even_with_umask_0() {
    let root = TestRoot::new();
    let mut run = Run::start_with(
        &root,
        "modes",
        &["--lease", "1h"],
        &fx("tree --children 1"),
        |cmd| {
            // SAFETY: umask(2) is async-signal-safe and cannot fail.
            unsafe {
                cmd.pre_exec(|| {
                    libc::umask(0);
                    Ok(())
                });
            }
        },
    );
    let c = run.c;
    let (ready, pinned) = c.pin_tree();
    c.wait_state(&["running"]);
    ensure!(
        c,
        root.run_dir("modes").join("lease.json").exists(),
        "--lease wrote no lease.json"
    );
    assert_private_modes(&run, "while running");
    run.signal(libc::SIGTERM);
    run.finish(143);
    nothing_left(c, &pinned, ready.sid);
    assert_private_modes(&run, "after the final record");
}

#[test]
fn pid_and_pgid_files_and_status_json_name_the_leader_the_kernel_shows() {
    let root = TestRoot::new();
    let fixture = fixture_path();
    let argv = [fixture.as_str(), "tree", "--children", "1"];
    let (mut run, ready, pinned) = Run::start_pinned(&root, "ids", &[], &argv);
    let c = run.c;
    let st = c.wait_state(&["running"]);
    let dir = root.run_dir("ids");
    for name in ["pid", "pgid"] {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
        c.eq(
            &text,
            &format!("{}\n", ready.pid),
            format_args!("{name} file"),
        );
    }
    if let Err(e) = check_record(&st) {
        c.fail(format_args!("invalid running record: {e}"));
    }
    let kernel = proc_stat(ready.pid).expect("the leader is pinned and parked");
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let cwd = std::env::current_dir().unwrap();
    let expected = [
        ("run_id", Value::from("ids")),
        ("pid", Value::from(ready.pid)),
        ("pgid", Value::from(ready.pid)),
        ("sid", Value::from(ready.pid)),
        ("start_ticks", Value::from(kernel.4)),
        ("wrapper_pid", Value::from(run.wrapper_pid())),
        ("argv", Value::from(argv.to_vec())),
        ("cwd", Value::from(path_str(&cwd))),
        ("boot_id", Value::from(boot_id.trim())),
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        ("uid", Value::from(geteuid())),
    ];
    for (key, want) in expected {
        c.eq(&st[key], &want, format_args!("status.json {key}"));
    }
    run.signal(libc::SIGTERM);
    run.finish(143);
    run.final_record();
    nothing_left(c, &pinned, ready.sid);
}

#[test]
fn the_journal_records_the_launch_every_state_change_and_every_signal_with_target_and_reason() {
    let root = TestRoot::new();
    let (mut run, ready, pinned) = Run::start_deaf(&root, "journal");
    let c = run.c;
    c.wait_state(&["running"]);
    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    nothing_left(c, &pinned, ready.sid);

    let events = root.events("journal");
    for e in &events {
        let ts = e["ts"].as_str().unwrap_or_default();
        ensure!(c, is_rfc3339_ms(ts), "bad ts in {e}");
    }
    c.eq(&named(&events, "launch").count(), &1, "launch events");
    let changes: Vec<&str> = named(&events, "state")
        .filter_map(|e| e["to"].as_str())
        .filter(|&to| to != "starting")
        .collect();
    c.eq(
        &changes,
        &["running", "cancelling", "cancelled"],
        "state changes in the journal",
    );
    let mut sent: Vec<String> = Vec::new();
    for e in named(&events, "signal") {
        let target = e["target"].as_str().unwrap_or_default();
        let signal = e["signal"].as_str().unwrap_or_default();
        ensure!(
            c,
            !target.is_empty() && !signal.is_empty() && e["reason"] == "signal:TERM",
            "a signal event without target, signal or reason: {e}"
        );
        if signal != "CONT" && !sent.iter().any(|s| s == signal) {
            sent.push(signal.to_string());
        }
    }
    c.eq(
        &sent,
        &cleanup_signals(&st),
        "the signals journalled and the signals in cleanup differ",
    );
    c.eq(&sent, &strings(&["TERM", "HUP", "KILL"]), "sent");
}

/// The journal events called `name`.
fn named<'a>(events: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events.iter().filter(move |e| e["event"] == name)
}
