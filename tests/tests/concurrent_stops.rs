//! Many parties stopping runs at once (200 runs with three cancellers each and a watchdog; ten
//! cancels of one orphan) end each run once, with one truthful record (hazard H-3).
//!
//! The standard is the seed ADR's (`docs/references.md`): name the hazard, name the causal
//! scenario, and prove with real processes that the constraint holds. Every process a test sees is
//! pinned with a pidfd right after the fixture's ready line, asserted on through /proc (a zombie is
//! dead), and SIGKILLed by pid when the test ends. Run ids start with `rel-`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use agent_run_tests::facts::ended;
use agent_run_tests::facts::exclusive_cpu;
use agent_run_tests::hazards::*;
use agent_run_tests::workload::{fx_args, start_argv};
use agent_run_tests::Reaper;
use agent_run_tests::{
    ctx, describe_output, diagnostics, ensure, exit_code, proc_stat, processes_with_env,
    run_with_timeout, wait_child, Pinned, Spawned, TestRoot, FINAL_STATES,
};
use serde_json::Value;

// =============================================================================================
// 3. Load and races: many runs under one root, concurrent cancellers, a watchdog daemon.

/// Runs under one root in the load test (half cancelled, half finishing on their own).
const LOAD_RUNS: usize = 200;

/// Cancel processes started together for each cancelled run.
const CANCELLERS: usize = 3;

/// One run of the load test.
struct LoadRun {
    id: String,
    cancelled: bool,
    wrapper: Pinned,
    leader: Pinned,
    /// The tree's members (cancelled runs only), pinned once its ready line is there.
    members: Option<Pinned>,
    pids: Vec<i32>,
}

impl LoadRun {
    fn alive(&self) -> Vec<i32> {
        let mut alive = self.leader.alive();
        if let Some(m) = &self.members {
            alive.extend(m.alive());
        }
        alive
    }
}

/// `start --detach` one run of the load test and pin its wrapper and leader (checked against the
/// record's start time, so the pin is the leader and not a reused pid).
fn launch_load_run(root: &TestRoot, i: usize) -> LoadRun {
    let id = format!("rel-load-{i:03}");
    let c = ctx(root, &id);
    let cancelled = i % 2 == 0;
    let command = if cancelled {
        fx_args(&["tree", "--children", "1"])
    } else {
        let ms = (1500 + (i * 37) % 1501).to_string();
        fx_args(&["sleep-ms", &ms])
    };
    let out = ctl(
        root,
        &id,
        &start_argv(&["--detach", "--json", "--grace", "2s"], &id, &command),
        0,
    );
    let line = json_doc(root, &id, "start --detach", &out);
    let st = observe(root, &id, "after start --detach").expect("a record after start --detach");
    let leader = line["pid"].as_i64().unwrap_or(0) as i32;
    let wrapper = st["wrapper_pid"].as_i64().unwrap_or(0) as i32;
    let leader_pin = Pinned::new(&[leader]);
    let wrapper_pin = Pinned::new(&[wrapper]);
    let ticks = proc_stat(leader).map(|s| s.4);
    ensure!(
        c,
        ticks.is_none() || ticks == st["start_ticks"].as_u64(),
        "pid {leader} is not the run's leader any more (start ticks {ticks:?})"
    );
    LoadRun {
        id,
        cancelled,
        wrapper: wrapper_pin,
        leader: leader_pin,
        members: None,
        pids: vec![leader],
    }
}

#[test]
fn two_hundred_concurrent_runs_half_cancelled_by_three_cancellers_each_end_with_one_truthful_record_each(
) {
    let _cpu = exclusive_cpu();
    let started = Instant::now();
    let root = TestRoot::new();
    let diag = |runs: &[LoadRun], i: usize| diagnostics(&root, &runs[i].id);

    // The watchdog daemon races every cancel and every wrapper exit, with no orphan grace.
    let daemon = Spawned::spawn(root.watchdog_cmd().args(["--orphan-grace", "0"]));
    let daemon_pid = daemon.child.id() as i32;
    let daemon_pin = Pinned::new(&[daemon_pid]);

    // Launch from four threads at once.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut runs: Vec<LoadRun> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= LOAD_RUNS {
                            break mine;
                        }
                        mine.push((i, launch_load_run(&root, i)));
                    }
                })
            })
            .collect();
        let mut all: Vec<(usize, LoadRun)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("a launcher thread panicked"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    });
    let launched = started.elapsed();

    // Pin every member of the cancelled trees.
    for run in runs.iter_mut().filter(|r| r.cancelled) {
        let ready = wait_ready_line(&root, &run.id);
        ctx(&root, &run.id).eq(&ready.pid, &run.pids[0], "the tree's leader");
        run.members = Some(Pinned::new(&ready.members));
        run.pids.extend(&ready.members);
    }

    // Three cancellers per cancelled run, started together; their output goes to files.
    let out_dir = root.dir.path().join("cancel-out");
    fs::create_dir(&out_dir).expect("cannot create the cancel output dir");
    let mut cancellers = Reaper::default();
    let mut cancel_of: Vec<(usize, PathBuf, PathBuf)> = Vec::new();
    for (i, run) in runs.iter().enumerate().filter(|(_, r)| r.cancelled) {
        let mut batch = Vec::new();
        for k in 0..CANCELLERS {
            let out = out_dir.join(format!("{}.{k}.out", run.id));
            let err = out_dir.join(format!("{}.{k}.err", run.id));
            let mut cmd = agent_run(&root);
            cmd.args(["cancel", "--json", &run.id])
                .stdout(fs::File::create(&out).expect("cancel stdout file"))
                .stderr(fs::File::create(&err).expect("cancel stderr file"));
            batch.push(cmd);
            cancel_of.push((i, out, err));
        }
        for mut cmd in batch {
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
            cancellers.push(child);
        }
    }

    // Every run reaches one final record; the moment it is seen final, none of its processes
    // may be alive.
    let mut pending: BTreeSet<usize> = (0..runs.len()).collect();
    let mut contradictions = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pending.is_empty() {
        let mut done = Vec::new();
        for &i in &pending {
            let run = &runs[i];
            let Some(st) = observe(&root, &run.id, "while the load test runs") else {
                continue;
            };
            let state = st["state"].as_str().unwrap_or_default();
            if FINAL_STATES.contains(&state) {
                let alive = run.alive();
                if !alive.is_empty() {
                    contradictions.push((i, format!("{state} while {alive:?} alive")));
                }
                done.push(i);
            }
        }
        for i in done {
            pending.remove(&i);
        }
        if Instant::now() >= deadline {
            let i = *pending.first().expect("pending runs");
            panic!(
                "{} runs not final after {:?}: {:?}\n{}",
                pending.len(),
                started.elapsed(),
                pending.iter().map(|&i| &runs[i].id).collect::<Vec<_>>(),
                diag(&runs, i)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let all_final = started.elapsed();
    if let Some((i, what)) = contradictions.first() {
        panic!(
            "{} records contradict the process table; first {}: {what}\n{}",
            contradictions.len(),
            runs[*i].id,
            diag(&runs, *i)
        );
    }

    // Every canceller returns 0 and prints the same final record.
    let statuses: Vec<_> = cancellers
        .children_mut()
        .iter_mut()
        .map(|c| wait_child(c, CMD))
        .collect();
    let mut failures: Vec<(usize, String)> = Vec::new();
    for ((i, out, err), status) in cancel_of.iter().zip(&statuses) {
        let run = &runs[*i];
        let st = root.status(&run.id);
        let stdout = fs::read_to_string(out).unwrap_or_default();
        let stderr = fs::read_to_string(err).unwrap_or_default();
        let printed: Option<Value> = serde_json::from_str(&stdout).ok();
        let agrees = printed.as_ref().is_some_and(|p| {
            p["state"] == st["state"]
                && p["ended_at"] == st["ended_at"]
                && p["reason"] == st["reason"]
        });
        if !status.success() || !agrees {
            failures.push((
                *i,
                format!("a canceller exited {status}: stdout {stdout:?} stderr {stderr:?}"),
            ));
        }
    }

    // Exactly one final record per run, truthful, journalled once.
    for (i, run) in runs.iter().enumerate() {
        let st = root.status(&run.id);
        let outcome = (
            st["state"].as_str().unwrap_or_default().to_string(),
            st["reason"].clone(),
            st["exit_code"].clone(),
        );
        let want = if run.cancelled {
            (
                "cancelled".to_string(),
                Value::from("cancel_request"),
                Value::Null,
            )
        } else {
            ("finished".to_string(), Value::Null, Value::from(0))
        };
        if outcome != want {
            failures.push((i, format!("outcome {outcome:?}, expected {want:?}")));
        }
        let events = root.events(&run.id);
        let finals = final_state_events(&events).len();
        let takeovers = named(&events, "takeover").len();
        let by_watchdog = events_by(&events, "watchdog").len();
        if finals != 1 || takeovers != 0 || by_watchdog != 0 {
            failures.push((
                i,
                format!(
                    "{finals} final transitions, {takeovers} takeovers, {by_watchdog} watchdog \
                     lines (expected 1, 0, 0: every wrapper lived to write its record)"
                ),
            ));
        }
    }
    if let Some((i, what)) = failures.first() {
        panic!(
            "{} failures; first, run {}: {what}\nall: {:?}\n{}",
            failures.len(),
            runs[*i].id,
            failures.iter().take(20).collect::<Vec<_>>(),
            diag(&runs, *i)
        );
    }

    // No strays: no process carries a marker of this root, and every wrapper is gone.
    let prefix = root.root().as_os_str().as_encoded_bytes().to_vec();
    let strays = processes_with_env("AGENT_RUN_DIR", |v| v.starts_with(&prefix));
    assert!(
        strays.is_empty(),
        "processes carrying a marker of the load root are alive: {:?}",
        strays
            .iter()
            .map(|&p| (p, proc_stat(p)))
            .collect::<Vec<_>>()
    );
    for (i, run) in runs.iter().enumerate() {
        if let Err(alive) = run.wrapper.wait_all_gone(T) {
            panic!(
                "the wrapper {alive:?} of {} outlived its final record by {T:?}\n{}",
                run.id,
                diag(&runs, i)
            );
        }
    }

    // The daemon is still up, and TERM ends it cleanly.
    assert_eq!(daemon_pin.alive(), vec![daemon_pid], "the watchdog died");
    daemon.signal(libc::SIGTERM);
    let what = daemon.what.clone();
    let out = daemon.finish(CMD);
    assert!(
        out.status.success(),
        "the watchdog did not exit 0 on TERM\n{}",
        describe_output(&what, &out)
    );
    eprintln!(
        "load: {LOAD_RUNS} runs launched in {launched:?}, all final at {all_final:?}, \
         checked at {:?}",
        started.elapsed()
    );
}

// =============================================================================================
// 5. Concurrent final writes: ten cancels of one orphaned run.

#[test]
fn ten_concurrent_cancels_of_a_run_whose_wrapper_was_kill_9ed_take_it_over_once_and_agree() {
    const CANCELS: usize = 10;
    let root = TestRoot::sharing_cpu();
    let id = "rel-crowd";
    let c = ctx(&root, id);
    // Members that ignore TERM and HUP keep the takeover's stop busy until KILL at 1 s, so the
    // other nine cancels meet a held lock.
    let run = start_detached(&root, id, &["--grace", "1s"], &fx_args(&STUBBORN_MEMBERS));
    let tree = pin_tree(&root, id);
    c.eq(&tree.ready.pid, &run.leader, "the tree's leader");
    run.wrapper_pin
        .signal(run.wrapper, libc::SIGKILL)
        .expect("cannot SIGKILL the wrapper");
    wait_gone(&root, id, &run.wrapper_pin, "the SIGKILLed wrapper");
    c.eq(
        &tree.alive(),
        &sorted(tree.all()),
        "the tree outlives its wrapper",
    );

    let gate = Barrier::new(CANCELS);
    let outs: Vec<Output> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CANCELS)
            .map(|_| {
                s.spawn(|| {
                    let mut cmd = agent_run(&root);
                    cmd.args(["cancel", "--json", id]);
                    gate.wait();
                    run_with_timeout(&mut cmd, CMD)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a cancel thread panicked"))
            .collect()
    });

    let alive = tree.alive();
    ensure!(
        c,
        alive.is_empty(),
        "every cancel returned but {alive:?} of the run are alive"
    );
    let st = root.status(id);
    c.fields(
        &st,
        "the final record",
        ended("cancelled", "cancel_request"),
    );
    let signalled = cleanup_pids(&st, "signalled");
    ensure!(
        c,
        tree.all().iter().all(|p| signalled.contains(p)),
        "cleanup.signalled {signalled:?} lacks members of {:?}",
        tree.all()
    );
    for (i, out) in outs.iter().enumerate() {
        c.eq(
            &exit_code(&out.status),
            &0,
            format_args!("cancel #{i}\n{}", describe_output("cancel", out)),
        );
        let printed = json_doc(&root, id, "cancel", out);
        for key in ["state", "reason", "ended_at", "cleanup", "exit_code"] {
            c.eq(&printed[key], &st[key], format_args!("cancel #{i}: {key}"));
        }
    }
    let events = root.events(id);
    c.eq(&named(&events, "takeover").len(), &1, "takeovers");
    c.eq(
        &final_state_events(&events).len(),
        &1,
        "transitions to a final state",
    );
    c.eq(&named(&events, "stop_begin").len(), &1, "stop_begin events");
    ensure!(
        c,
        named(&events, "refused").is_empty(),
        "a cancel refused the run"
    );
    ensure!(
        c,
        cancel_json_count(&root.run_dir(id)) == 1,
        "cancel.json must exist exactly once"
    );
    assert_no_strays(&root, id, "after the final record");
}

/// 1 if cancel.json exists, 0 otherwise (and leftover temp files count against it).
fn cancel_json_count(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains("cancel"))
                .count()
        })
        .unwrap_or(0)
}
