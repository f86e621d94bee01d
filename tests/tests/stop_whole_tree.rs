//! A stop ends the whole run: signals to the wrapper, the grace, setsid escapees, the groups of a
//! job-control shell, and the leftovers of a leader that exited.
//!
//! Every test spawns the real `agent-run` binary on a real process tree ([`Run`], a foreground
//! run) and asserts on the process table: each pid the fixture reports is pinned with a pidfd right
//! after the handshake, so "stopped" means the kernel says so. Waits poll a kernel fact or a file
//! to one deadline; every failure prints the run's diagnostics.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use agent_run_tests::contain::marked;
use agent_run_tests::facts::{cleanup_signals, path_str};
use agent_run_tests::foreground::*;
use agent_run_tests::workload::{fixture_path, fx, logged_tree, strings, DEAF};
use agent_run_tests::{children_of, ensure, proc_stat, session_members, Ctx, Pinned, TestRoot};
use serde_json::Value;

/// The seed article's worker (003, "Test process trees instead of testing one sleepy shell"),
/// verbatim.
const SEED_WORKER_SH: &str = r#"#!/usr/bin/env bash
set -Eeuo pipefail
run_dir=${1:?run directory required}

note() {
  printf '%s pid=%s pgid=%s %s\n' \
    "$(date +%s)" "$$" "$(ps -o pgid= -p $$ | tr -d ' ')" "$1" \
    >>"$run_dir/worker.log"
}

trap 'note TERM; exit 143' TERM
trap 'note INT; exit 130' INT
trap 'note HUP; exit 129' HUP

(
  trap 'note grandchild_TERM; exit 143' TERM
  trap 'note grandchild_HUP; exit 129' HUP
  while :; do
    note grandchild_tick
    sleep 1
  done
) &
grandchild=$!

note "started grandchild=$grandchild"
while :; do
  note parent_tick
  sleep 1
done
"#;

/// Waits until `path` holds a line for which `find` returns Some, and returns that.
fn wait_line<V>(c: Ctx<'_>, path: &Path, what: &str, find: impl Fn(&str) -> Option<V>) -> V {
    c.wait(what, || {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        text.lines()
            .find_map(&find)
            .ok_or_else(|| format!("{}: {text:?}", path.display()))
    })
}

/// The `SigIgn`/`SigCgt`/`SigBlk` mask of a process (`field` like "SigIgn").
fn sig_mask(pid: i32, field: &str) -> Result<u64, String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?;
    u64::from_str_radix(line.trim(), 16).map_err(|e| format!("{field} {line:?}: {e}"))
}

fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// `cleanup.duration_ms` of a record.
fn cleanup_ms(st: &Value) -> Option<u64> {
    st["cleanup"]["duration_ms"].as_u64()
}

// ---------------------------------------------------------------------------------------------
// Signals to the wrapper stop the whole tree

/// The fixture's worker tree (a leader, a child and a grandchild that log TERM and exit) under
/// agent-run; `sig` to the wrapper must stop all of it with one TERM each, and the wrapper must
/// exit `code` with a `cancelled` record naming the signal.
fn signal_to_wrapper_stops_the_worker_tree(sig: i32, name: &str, code: i32) {
    let root = TestRoot::new();
    let log = root.dir.path().join("tree.log");
    let id = format!("tree-{}", name.to_lowercase());
    let tree = "--children 1 --grandchildren --leader-term log-exit --member-term log-exit";
    let (mut run, ready, pinned) = Run::start_pinned(&root, &id, &[], &logged_tree(tree, &log));
    let c = run.c;
    let st = c.wait_state(&["running"]);
    c.eq(
        &(int(c, &st, "pid"), int(c, &st, "pgid"), int(c, &st, "sid")),
        &(ready.pid, ready.pgid, ready.sid),
        "status.json names another leader than the fixture reports",
    );
    // Not vacuous: before the cancel, the session holds exactly the tree.
    c.eq(
        &session_members(ready.sid),
        &ready.all_pids(),
        "the run's session before the cancel",
    );

    run.signal(sig);
    run.finish(code);
    let st = run.final_record();
    let reason = format!("signal:{name}");
    c.fields(
        &st,
        "the record",
        outcome("cancelled", Some(reason.as_str())),
    );
    nothing_left(c, &pinned, ready.sid);
    c.eq(
        &cleanup_signals(&st),
        &strings(&["TERM"]),
        "a tree that exits on TERM needs no HUP or KILL",
    );

    let text = fs::read_to_string(&log).unwrap_or_default();
    let mut roles: Vec<&str> = Vec::new();
    for pid in ready.all_pids() {
        let line = text
            .lines()
            .find(|l| l.ends_with(&format!(" {pid} TERM")))
            .unwrap_or_else(|| c.fail(format_args!("pid {pid} never logged TERM: {text:?}")));
        roles.push(line.split(' ').next().unwrap_or_default());
    }
    roles.sort_unstable();
    c.eq(
        &roles,
        &["child", "grandchild", "leader"],
        format_args!("log {text:?}"),
    );
    ensure!(c, !text.contains("HUP"), "HUP reached the tree: {text:?}");
}

#[test]
fn term_to_the_wrapper_stops_the_worker_tree_and_exits_143() {
    signal_to_wrapper_stops_the_worker_tree(libc::SIGTERM, "TERM", 143);
}

#[test]
fn int_to_the_wrapper_stops_the_worker_tree_and_exits_130() {
    signal_to_wrapper_stops_the_worker_tree(libc::SIGINT, "INT", 130);
}

#[test]
fn hup_to_the_wrapper_stops_the_worker_tree_and_exits_129() {
    signal_to_wrapper_stops_the_worker_tree(libc::SIGHUP, "HUP", 129);
}

#[test]
fn term_to_the_wrapper_stops_the_seed_articles_bash_worker_and_its_grandchild() {
    let root = TestRoot::new();
    let script = root.dir.path().join("worker.sh");
    let work = root.dir.path().join("work");
    fs::write(&script, SEED_WORKER_SH).unwrap();
    fs::create_dir(&work).unwrap();
    // Run through bash rather than exec'ing the fresh file: another test thread forking while
    // the file was open for writing would make exec fail with ETXTBSY. The HUP step comes late:
    // the worker's TERM trap forks `date` and `ps` to log its line, which took over the default
    // 500 ms on CI's loaded cores, and bash then ran the HUP trap, whose `exit` came first.
    let mut run = Run::start(
        &root,
        "seed-worker",
        &["--hup-after", "10s"],
        &["bash", path_str(&script), path_str(&work)],
    );
    let c = run.c;
    let log = work.join("worker.log");
    let grandchild: i32 = wait_line(c, &log, "the worker's grandchild pid", |l| {
        l.split("started grandchild=").nth(1)?.trim().parse().ok()
    });
    wait_line(c, &log, "a parent tick", |l| {
        l.ends_with(" parent_tick").then_some(())
    });
    wait_line(c, &log, "a grandchild tick", |l| {
        l.ends_with(" grandchild_tick").then_some(())
    });
    let st = c.wait_state(&["running"]);
    let (leader, sid) = (int(c, &st, "pid"), int(c, &st, "sid"));
    let mut pids = session_members(sid);
    ensure!(
        c,
        pids.contains(&leader) && pids.contains(&grandchild),
        "session {sid} = {pids:?} lacks the worker {leader} or its grandchild {grandchild}"
    );
    pids.sort_unstable();
    let pinned = Pinned::new(&pids);

    run.stop_by_term(&pinned, sid);
    let text = fs::read_to_string(&log).unwrap_or_default();
    ensure!(
        c,
        text.lines().any(|l| l.ends_with(" TERM")),
        "the worker never logged TERM: {text:?}"
    );
    ensure!(
        c,
        text.lines().any(|l| l.ends_with(" grandchild_TERM")),
        "the grandchild never logged TERM: {text:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The ADR's cases: ignorers, hangups, a second TERM

/// An interactive shell with stdin held open ignores TERM. HUP must go at once with TERM, so it
/// is gone within `max_ms` and without KILL. With `--hup-after 3s`, "at once" cannot be confused
/// with "at the HUP step".
fn interactive_shell_is_hung_up_at_once(id: &str, shell: &[&str], timings: &[&str], max_ms: u64) {
    let root = TestRoot::new();
    let home = root.dir.path().to_path_buf();
    let mut run = Run::start_with(&root, id, &[&["--quiet"], timings].concat(), shell, |cmd| {
        // A private HOME and no ENV/BASH_ENV: no rc file of this host runs.
        cmd.stdin(Stdio::piped())
            .env("HOME", &home)
            .env_remove("ENV")
            .env_remove("BASH_ENV");
    });
    let c = run.c;
    let st = c.wait_state(&["running"]);
    let (leader, sid) = (int(c, &st, "pid"), int(c, &st, "sid"));
    let pinned = Pinned::new(&[leader]);
    // The premise: the shell cannot run a TERM handler.
    c.wait("the shell to ignore TERM (SigIgn bit 15)", || {
        let ign = sig_mask(leader, "SigIgn")?;
        if ign & bit(libc::SIGTERM) != 0 {
            Ok(())
        } else {
            Err(format!("SigIgn {ign:016x}"))
        }
    });
    // And at its prompt (written to stderr, then it sleeps reading stdin): a shell still in its
    // start-up when the HUP comes can leave it for later (bash did, 1 run in 20: it went only
    // at the second HUP, after --hup-after). The claim is about a shell waiting at its prompt.
    let stderr_log = c.file("stderr.log");
    c.wait("the shell's prompt on stderr, the shell asleep", || {
        let err = std::fs::read(&stderr_log).map_err(|e| e.to_string())?;
        let state = proc_stat(leader).map_or('?', |s| s.0);
        if (err.ends_with(b"$ ") || err.ends_with(b"# ")) && state == 'S' {
            Ok(())
        } else {
            Err(format!(
                "state {state}, stderr {:?}",
                String::from_utf8_lossy(&err)
            ))
        }
    });

    let st = run.stop_by_term(&pinned, sid);
    c.eq(
        &cleanup_signals(&st),
        &strings(&["TERM", "HUP"]),
        "a TERM-ignoring shell ends on the HUP sent with TERM, without KILL",
    );
    let ms = cleanup_ms(&st).unwrap_or(u64::MAX);
    ensure!(
        c,
        ms < max_ms,
        "the shell took {ms} ms to go (limit {max_ms}): HUP was not sent at once with TERM"
    );
}

#[test]
fn interactive_bash_with_stdin_open_is_hung_up_at_once_instead_of_waiting_out_the_grace() {
    let timings = ["--hup-after", "3s", "--grace", "15s"];
    interactive_shell_is_hung_up_at_once("bash-i", &["bash", "-i"], &timings, 2000);
}

#[test]
fn interactive_sh_with_stdin_open_is_hung_up_at_once_instead_of_waiting_out_the_grace() {
    let timings = ["--hup-after", "3s", "--grace", "15s"];
    interactive_shell_is_hung_up_at_once("sh-i", &["sh", "-i"], &timings, 2000);
}

/// The ADR's own case, at the default timings: gone well under the 5 s grace (the design
/// target is milliseconds; the HUP step alone would take 500).
#[test]
fn interactive_bash_at_the_default_timings_is_gone_well_under_the_grace() {
    interactive_shell_is_hung_up_at_once("bash-i-default", &["bash", "-i"], &[], 2000);
}

#[test]
fn a_child_ignoring_term_and_hup_is_killed_at_the_grace() {
    let root = TestRoot::new();
    let (mut run, ready, pinned) = Run::start_deaf(&root, "ignorer");
    let c = run.c;
    let child = ready.members[0];
    let ign = sig_mask(child, "SigIgn").unwrap_or_default();
    c.eq(
        &(ign & (bit(libc::SIGTERM) | bit(libc::SIGHUP))),
        &(bit(libc::SIGTERM) | bit(libc::SIGHUP)),
        format_args!("the child {child} should ignore TERM and HUP: SigIgn {ign:016x}"),
    );

    let st = run.stop_by_term(&pinned, ready.sid);
    c.eq(
        &cleanup_signals(&st),
        &strings(&["TERM", "HUP", "KILL"]),
        "cleanup_signals(&st)",
    );
    let ms = cleanup_ms(&st).unwrap_or_default();
    ensure!(
        c,
        (1000..10_000).contains(&ms),
        "KILL must come at the 1 s grace, not before: cleanup took {ms} ms"
    );
}

#[test]
fn a_leader_exiting_on_term_does_not_strand_a_same_group_descendant_ignoring_term_and_hup() {
    let root = TestRoot::new();
    let log = root.dir.path().join("tree.log");
    let tree = "--children 1 --grandchildren --leader-term log-exit --member-term ignore";
    let argv = logged_tree(&format!("{tree} --member-hup ignore"), &log);
    let (mut run, ready, pinned) = Run::start_pinned(&root, "outlived", &["--grace", "2s"], &argv);
    let c = run.c;
    for &m in &ready.members {
        let pgid = proc_stat(m).map(|s| s.2);
        c.eq(
            &pgid,
            &Some(ready.pgid),
            format_args!("member {m} should share the leader's group"),
        );
    }

    let st = run.stop_by_term(&pinned, ready.sid);
    let text = fs::read_to_string(&log).unwrap_or_default();
    ensure!(
        c,
        text.contains(&format!("leader {} TERM", ready.pid)),
        "the leader never handled TERM: {text:?}"
    );
    ensure!(
        c,
        cleanup_signals(&st).contains(&"KILL".to_string()),
        "the descendants ignore TERM and HUP: only KILL ends them"
    );
    let ms = cleanup_ms(&st).unwrap_or_default();
    ensure!(c, ms >= 2000, "KILL before the 2 s grace: {ms} ms");
}

#[test]
fn a_daemon_that_exits_soon_after_term_never_receives_hup() {
    let root = TestRoot::new();
    let log = root.dir.path().join("daemon.log");
    // TERM: an orderly shutdown that takes 0.2 s; HUP would mean "reload" and is logged.
    let script = r#"log=$1
trap 'echo TERM >> "$log"; sleep 0.2; exit 0' TERM
trap 'echo HUP >> "$log"' HUP
echo ready >> "$log"
while :; do sleep 0.05; done"#;
    let mut run = Run::start(
        &root,
        "daemon",
        &[],
        &["bash", "-c", script, "daemon", path_str(&log)],
    );
    let c = run.c;
    wait_line(c, &log, "the daemon's ready line", |l| {
        (l == "ready").then_some(())
    });
    let st = c.wait_state(&["running"]);
    let (leader, sid) = (int(c, &st, "pid"), int(c, &st, "sid"));
    let pinned = Pinned::new(&[leader]);

    let st = run.stop_by_term(&pinned, sid);
    let text = fs::read_to_string(&log).unwrap_or_default();
    ensure!(
        c,
        text.lines().any(|l| l == "TERM"),
        "the daemon never handled TERM: {text:?}"
    );
    ensure!(
        c,
        !text.contains("HUP"),
        "the daemon was hung up during its TERM shutdown: {text:?}"
    );
    c.eq(
        &cleanup_signals(&st),
        &strings(&["TERM"]),
        "cleanup_signals(&st)",
    );
}

#[test]
fn a_second_term_during_the_grace_kills_at_once() {
    let root = TestRoot::new();
    let argv = fx(&format!("tree --children 1 --grandchildren {DEAF}"));
    let (mut run, ready, pinned) = Run::start_pinned(&root, "stubborn", &["--grace", "30s"], &argv);
    let c = run.c;

    run.signal(libc::SIGTERM);
    c.wait_state(&["cancelling"]);
    c.eq(
        &pinned.alive(),
        &ready.all_pids(),
        "the tree ignores TERM and HUP: all of it must still be alive while cancelling",
    );
    let st = run.stop_by_term(&pinned, ready.sid);
    ensure!(
        c,
        cleanup_signals(&st).contains(&"KILL".to_string()),
        "cleanup_signals(&st).contains(&\"KILL\".to_string())"
    );
    let ms = cleanup_ms(&st).unwrap_or(u64::MAX);
    ensure!(
        c,
        ms < 15_000,
        "the second TERM did not cut the 30 s grace short: cleanup took {ms} ms"
    );
}

// ---------------------------------------------------------------------------------------------
// Escapees and leftovers

#[test]
fn a_setsid_double_forked_escapee_is_stopped_on_cancel() {
    let root = TestRoot::new();
    let (mut run, ready, pinned) =
        Run::start_pinned(&root, "escapee", &[], &fx("tree --children 1 --escapee"));
    let c = run.c;
    let escapees: Vec<i32> = ready
        .members
        .iter()
        .copied()
        .filter(|&m| proc_stat(m).is_some_and(|s| s.3 != ready.sid))
        .collect();
    c.eq(
        &escapees.len(),
        &1,
        format_args!(
            "exactly one member should have left the run's session {}",
            ready.sid
        ),
    );
    let parent = proc_stat(escapees[0]).map(|s| s.1);
    c.eq(
        &parent,
        &Some(run.wrapper_pid()),
        "the orphaned escapee should be reparented to the wrapper, a child subreaper",
    );

    run.stop_by_term(&pinned, ready.sid);
}

/// A workload that double-forks a setsid escapee with the run's marker scrubbed from its
/// environment, records its pid in `pidfile`, then runs `rest`. Only the wrapper being a child
/// subreaper brings such an escapee back to the run: it is in no group, session or environment
/// of the run.
fn scrubbed_escapee_script(rest: &str) -> String {
    format!("(setsid env -u AGENT_RUN_ID -u AGENT_RUN_DIR sleep 300 & echo $! > \"$1\"); {rest}")
}

/// Waits for the escapee's pid in `pidfile` and checks that it escaped the session and the
/// marker, and came back to the wrapper.
fn scrubbed_escapee(run: &Run<'_>, pidfile: &Path, sid: i32) -> (i32, Pinned) {
    let pid: i32 = wait_line(run.c, pidfile, "the escapee's pid", |l| {
        l.trim().parse().ok()
    });
    let pinned = Pinned::new(&[pid]);
    run.c
        .wait("the escapee to exec sleep without the marker", || {
            let environ = fs::read(format!("/proc/{pid}/environ")).map_err(|e| e.to_string())?;
            let marked = environ
                .split(|&b| b == 0)
                .any(|v| v.starts_with(b"AGENT_RUN_ID="));
            let stat = proc_stat(pid);
            match (comm(pid).as_str(), marked, stat) {
                ("sleep", false, Some(s)) if s.3 != sid && s.1 == run.wrapper_pid() => Ok(()),
                (comm, marked, stat) => Err(format!("comm {comm} marked {marked} stat {stat:?}")),
            }
        });
    (pid, pinned)
}

/// A run of [`scrubbed_escapee_script`] ending with `then`, and the file where its escapee
/// writes its pid.
fn start_scrubbed<'a>(root: &'a TestRoot, id: &'a str, then: &str) -> (Run<'a>, PathBuf) {
    let pidfile = root.dir.path().join("escapee.pid");
    let script = scrubbed_escapee_script(then);
    let argv = ["sh", "-c", &script, "sh", path_str(&pidfile)];
    (Run::start(root, id, &[], &argv), pidfile)
}

#[test]
fn a_setsid_escapee_without_the_runs_marker_is_stopped_on_cancel() {
    let root = TestRoot::new();
    let (mut run, pidfile) = start_scrubbed(&root, "scrubbed", "exec sleep 600");
    let c = run.c;
    let st = c.wait_state(&["running"]);
    let (leader, sid) = (int(c, &st, "pid"), int(c, &st, "sid"));
    let (_, escapee) = scrubbed_escapee(&run, &pidfile, sid);
    let pinned = Pinned::new(&[leader]);

    run.stop_by_term(&pinned, sid);
    nothing_left(c, &escapee, sid);
}

#[test]
fn a_setsid_escapee_without_the_runs_marker_left_by_a_workload_that_exits_0_is_stopped() {
    let root = TestRoot::new();
    let (mut run, pidfile) = start_scrubbed(&root, "scrubbed-left", "exit 0");
    let c = run.c;
    run.finish(0);
    let st = run.final_record();
    c.eq(&st["state"], "finished", "st[\"state\"]");
    let sid = int(c, &st, "sid");
    let text = fs::read_to_string(&pidfile).unwrap_or_default();
    let escapee: i32 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| c.fail(format_args!("no escapee pid in {text:?}")));
    // Stopped and reaped by the wrapper before its final record, so its pid may in theory be
    // reused: a live process under it counts only if it is a sleep that started after the run.
    let leader_ticks = st["start_ticks"].as_u64().unwrap_or_default();
    let alive = proc_stat(escapee)
        .filter(|s| !matches!(s.0, 'Z' | 'X') && s.4 >= leader_ticks && comm(escapee) == "sleep");
    if alive.is_some() {
        let _kill_on_unwind = Pinned::new(&[escapee]);
        c.fail(format_args!(
            "the escapee {escapee} is alive after the final record: {alive:?}"
        ));
    }
    ensure!(
        c,
        session_members(sid).is_empty(),
        "session {sid} still has members"
    );
    let signalled = &st["cleanup"]["signalled"];
    ensure!(
        c,
        signalled
            .as_array()
            .is_some_and(|a| a.contains(&Value::from(escapee))),
        "the escapee {escapee} is not listed in cleanup.signalled"
    );
}

#[test]
fn the_background_jobs_of_a_job_control_shell_are_stopped_on_cancel() {
    let root = TestRoot::new();
    let home = root.dir.path().to_path_buf();
    let mut run = Run::start_with(
        &root,
        "jobs",
        &["--quiet"],
        &["bash", "-ic", "set -m; sleep 300 & sleep 300 & wait"],
        |cmd| {
            cmd.stdin(Stdio::piped())
                .env("HOME", &home)
                .env_remove("BASH_ENV");
        },
    );
    let c = run.c;
    let st = c.wait_state(&["running"]);
    let (leader, sid) = (int(c, &st, "pid"), int(c, &st, "sid"));
    let jobs = c.wait("the shell's two background sleeps", || {
        let sleeps: Vec<i32> = children_of(leader)
            .into_iter()
            .filter(|&p| comm(p) == "sleep")
            .collect();
        if sleeps.len() == 2 {
            Ok(sleeps)
        } else {
            Err(format!("sleeps {sleeps:?}"))
        }
    });
    let mut pids = jobs.clone();
    pids.push(leader);
    let pinned = Pinned::new(&pids);
    for &job in &jobs {
        let stat = proc_stat(job);
        ensure!(
            c,
            stat.is_some_and(|s| s.2 != leader && s.3 == sid),
            "job {job} should be in its own group of the run's session: {stat:?}"
        );
    }

    run.stop_by_term(&pinned, sid);
}

/// A workload whose leader exits 0 and leaves `tree_opts` processes behind: they must be stopped
/// and listed, and the run still `finished` with exit code 0.
fn leftovers_of_a_leader_that_exits_0_are_stopped_and_listed(id: &str, tree_opts: &[&str]) {
    let root = TestRoot::new();
    let fixture = fixture_path();
    let mut argv = vec![fixture.as_str(), "tree"];
    argv.extend(tree_opts);
    argv.extend(["--leader-exit", "0"]);
    let mut run = Run::start(&root, id, &[], &argv);
    let c = run.c;
    let ready = c.ready();
    // Some may already be stopped and reaped by now: pin only what still carries this run's
    // marker (a reused pid would not); the rest counts as gone.
    let dir = root.run_dir(id);
    let ours: Vec<i32> = ready
        .all_pids()
        .into_iter()
        .filter(|p| marked(&dir).contains(p))
        .collect();
    let pinned = Pinned::new(&ours);

    run.finish(0);
    let st = run.final_record();
    // No reason is asserted: the contract leaves open whether a finished run with leftovers
    // names why they were stopped.
    c.eq(&st["state"], "finished", "st[\"state\"]");
    c.eq(
        &(&st["exit_code"], &st["term_signal"]),
        &(&Value::from(0), &Value::Null),
        "(&st[\"exit_code\"], &st[\"term_signal\"])",
    );
    nothing_left(c, &pinned, ready.sid);
    let signalled: Vec<i64> = st["cleanup"]["signalled"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    for &m in &ready.members {
        ensure!(
            c,
            signalled.contains(&i64::from(m)),
            "leftover {m} is not listed in cleanup.signalled"
        );
    }
    ensure!(
        c,
        cleanup_signals(&st).contains(&"TERM".to_string()),
        "cleanup_signals(&st).contains(&\"TERM\".to_string())"
    );
}

#[test]
fn background_children_left_by_a_workload_that_exits_0_are_stopped_and_listed() {
    leftovers_of_a_leader_that_exits_0_are_stopped_and_listed(
        "leftovers",
        &["--children", "2", "--grandchildren"],
    );
}

#[test]
fn a_setsid_escapee_left_by_a_workload_that_exits_0_is_stopped_and_listed() {
    leftovers_of_a_leader_that_exits_0_are_stopped_and_listed(
        "left-escapee",
        &["--children", "0", "--escapee"],
    );
}

#[test]
fn cancelling_one_run_leaves_another_run_under_the_same_root_running_to_its_finish() {
    let root = TestRoot::new();
    let (mut doomed, ready, doomed_pins) = Run::start_pinned(
        &root,
        "doomed",
        &[],
        &fx("tree --children 2 --grandchildren"),
    );
    let other_argv = ["sh", "-c", "sleep 600 & read line; kill $!"];
    let mut other = Run::start_with(&root, "other", &[], &other_argv, hold_stdin);
    let st = other.c.wait_state(&["running"]);
    let (leader, sid) = (int(other.c, &st, "pid"), int(other.c, &st, "sid"));
    let sleeper = other.c.wait("the other run's sleep", || {
        children_of(leader)
            .into_iter()
            .find(|&p| comm(p) == "sleep")
            .ok_or_else(|| format!("children of {leader}: {:?}", children_of(leader)))
    });
    let other_pins = Pinned::new(&[leader, sleeper]);

    doomed.stop_by_term(&doomed_pins, ready.sid);

    other.c.eq(
        &other_pins.alive(),
        &vec![leader, sleeper],
        "cancelling another run touched this one",
    );
    let st = other.c.status();
    other.c.fields(&st, "the record", outcome("running", None));

    other.close_stdin();
    other.finish(0);
    let st = other.final_record();
    other.c.fields(&st, "the record", outcome("finished", None));
    other.c.eq(&st["exit_code"], 0, "st[\"exit_code\"]");
    nothing_left(other.c, &other_pins, sid);
}
