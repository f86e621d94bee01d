//! Black-box tests of agent-run's core: stopping a whole run (its process group, its session,
//! setsid escapees, the groups of a job-control shell, the leftovers of a leader that exited),
//! exit codes, the records and their modes, what the workload inherits, and refusal of bad input.
//!
//! Every test spawns the real `agent-run` binary on a real process tree and asserts on the process
//! table: each pid the fixture reports is pinned with a pidfd right after the handshake, and the
//! run's session is looked up in /proc, so "stopped" means the kernel says so, not agent-run. A
//! zombie counts as dead. Nothing here sleeps to synchronise: waits poll a kernel fact or a file
//! to one generous deadline (CI is two slow cores), and every failure prints the run's
//! diagnostics (its [`Ctx`]). Each test has its own run root; every process a test starts is
//! killed by pid when the test ends, whether it passed or not ([`Run`]'s and [`Pinned`]'s `Drop`).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use agent_run_tests::contain::marked;
use agent_run_tests::ctx::T;
use agent_run_tests::facts::{cleanup_signals, geteuid, is_rfc3339_ms, path_str};
use agent_run_tests::workload::{fixture_path, strings};
use agent_run_tests::{
    children_of, ctx, descendants, describe_output, ensure, fixture_bin, proc_stat,
    run_with_timeout, session_members, Ctx, Pinned, Spawned, TestRoot, FINAL_STATES, RECORD_KEYS,
};
use serde_json::{json, Value};

/// Every state of the contract.
const STATES: [&str; 7] = [
    "starting",
    "running",
    "cancelling",
    "finished",
    "cancelled",
    "launch_failed",
    "unknown",
];

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

// ---------------------------------------------------------------------------------------------
// A run under test

/// One `agent-run` wrapper started by a test in the foreground (`agent-run OPTS ID -- ARGV`, the
/// form without `start`), with its output drained and (optionally) its stdin held open. Its
/// checks and waits are its run's, [`Run::c`]. Dropping it before [`Run::finish`] kills, by pid,
/// the wrapper and every process of the run it can find (the run's marked processes, the
/// wrapper's descendants, the run's session while its leader is the recorded one), so a failing
/// test leaves nothing behind.
struct Run<'a> {
    c: Ctx<'a>,
    wrapper: Option<Spawned>,
    stdin: Option<ChildStdin>,
}

impl<'a> Run<'a> {
    /// `agent-run --root R OPTS... ID -- ARGV...`, stdin from /dev/null.
    fn start(root: &'a TestRoot, id: &'a str, opts: &[&str], argv: &[&str]) -> Run<'a> {
        Run::start_with(root, id, opts, argv, |_| {})
    }

    /// Like [`Run::start`], with stdin a pipe that the test holds open until [`Run::close_stdin`]
    /// or the end of the test.
    fn start_holding_stdin(
        root: &'a TestRoot,
        id: &'a str,
        opts: &[&str],
        argv: &[&str],
    ) -> Run<'a> {
        Run::start_with(root, id, opts, argv, |cmd| {
            cmd.stdin(Stdio::piped());
        })
    }

    /// Like [`Run::start`], with the command adjusted by `configure` before it is spawned.
    fn start_with(
        root: &'a TestRoot,
        id: &'a str,
        opts: &[&str],
        argv: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Run<'a> {
        let mut cmd = root.cmd();
        cmd.args(opts).arg(id).arg("--").args(argv);
        configure(&mut cmd);
        let mut wrapper = Spawned::spawn(&mut cmd);
        let stdin = wrapper.child.stdin.take();
        Run {
            c: ctx(root, id),
            wrapper: Some(wrapper),
            stdin,
        }
    }

    fn wrapper_pid(&self) -> i32 {
        self.wrapper
            .as_ref()
            .expect("the wrapper has finished")
            .child
            .id() as i32
    }

    /// Sends `sig` to the wrapper (not yet reaped, so its pid is still its own).
    fn signal(&self, sig: i32) {
        self.wrapper
            .as_ref()
            .expect("the wrapper has finished")
            .signal(sig);
    }

    /// Closes the workload's stdin pipe.
    fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for the wrapper to exit and reaps it; it must exit `code`. The workload's stdin
    /// stays open until then (an interactive shell would exit at its EOF).
    fn finish(&mut self, code: i32) -> Output {
        let wrapper = self.wrapper.take().expect("the wrapper has finished");
        let out = self.c.finish_within(wrapper, T, code);
        self.stdin.take();
        out
    }

    /// status.json, which must be final and valid.
    fn final_record(&self) -> Value {
        let st = self.c.status();
        let state = st["state"].as_str().unwrap_or_default();
        ensure!(
            self.c,
            FINAL_STATES.contains(&state),
            "the wrapper exited but status.json is not final"
        );
        if let Err(e) = check_record(&st) {
            self.c.fail(format_args!("invalid final record: {e}"));
        }
        st
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        self.stdin.take();
        // Not reaped yet (or reaped just now), so its pid is still its own until try_wait.
        let mut wrapper = self.wrapper.take();
        let wrapper_pid = match wrapper.as_mut().map(|w| w.child.try_wait()) {
            Some(Ok(None)) => wrapper.as_ref().map(|w| w.child.id() as i32),
            _ => None,
        };
        let (root, id) = (self.c.root, self.c.id);
        let dir = root.run_dir(id);
        // What carries this test's run dir in its environment is this test's; while the wrapper
        // lives (a subreaper), so is every descendant of it, and the recorded leader's session.
        // Kill them all, then the wrapper; repeat for processes forked meanwhile.
        for _ in 0..20 {
            let mut pids = marked(&dir);
            if let Some(w) = wrapper_pid {
                pids.extend(descendants(w));
                if let Ok(st) = root.try_status(id) {
                    if let (Some(pid), Some(ticks)) =
                        (st["pid"].as_i64(), st["start_ticks"].as_u64())
                    {
                        let pid = pid as i32;
                        if proc_stat(pid).is_some_and(|s| s.4 == ticks && s.0 != 'Z') {
                            pids.extend(session_members(pid));
                        }
                    }
                }
            }
            pids.sort_unstable();
            pids.dedup();
            if pids.is_empty() {
                break;
            }
            let pinned = Pinned::new(&pids);
            for pid in pinned.pids() {
                let _ = pinned.signal(pid, libc::SIGKILL);
            }
            let _ = pinned.wait_all_gone(std::time::Duration::from_secs(5));
        }
        if let Some(mut w) = wrapper {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// The state and reason a record must have.
fn outcome(state: &str, reason: Option<&str>) -> Value {
    json!({"state": state, "reason": reason})
}

/// The invariant users rely on: once the record is final, nothing of the run is alive. Every
/// pinned process is gone and the run's session has no live member.
fn nothing_left(c: Ctx<'_>, pinned: &Pinned, sid: i32) {
    c.gone_now(pinned, "processes of the run after its final record");
    c.session_empty(sid);
}

/// `key` of a record as an i32 (pid, pgid, sid).
fn int(c: Ctx<'_>, st: &Value, key: &str) -> i32 {
    st[key]
        .as_i64()
        .and_then(|v| i32::try_from(v).ok())
        .unwrap_or_else(|| c.fail(format_args!("status.json {key} is not an int: {st}")))
}

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

/// The bit of signal `sig` in a /proc signal mask.
fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
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

/// Checks one status.json document against the contract: every key present with its type, a
/// known state, times in RFC 3339 UTC with milliseconds, ids once launched, `ended_at` once final.
fn check_record(v: &Value) -> Result<(), String> {
    let obj = v.as_object().ok_or("not a JSON object")?;
    let missing: Vec<&str> = RECORD_KEYS
        .iter()
        .copied()
        .filter(|k| !obj.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(format!("missing keys {missing:?}"));
    }
    if v["schema"] != 1 {
        return Err(format!("schema {}", v["schema"]));
    }
    let state = v["state"].as_str().ok_or("state is not a string")?;
    if !STATES.contains(&state) {
        return Err(format!("unknown state {state:?}"));
    }
    for key in [
        "run_id",
        "cwd",
        "boot_id",
        "host",
        "user",
        "version",
        "created_at",
    ] {
        if !v[key].is_string() {
            return Err(format!("{key} is not a string: {}", v[key]));
        }
    }
    for key in ["reason", "term_signal", "error", "started_at", "ended_at"] {
        if !(v[key].is_null() || v[key].is_string()) {
            return Err(format!("{key} is neither null nor a string: {}", v[key]));
        }
    }
    for key in ["created_at", "started_at", "ended_at"] {
        if let Some(t) = v[key].as_str() {
            if !is_rfc3339_ms(t) {
                return Err(format!("{key} {t:?} is not RFC 3339 UTC with milliseconds"));
            }
        }
    }
    for key in [
        "exit_code",
        "pid",
        "pgid",
        "sid",
        "start_ticks",
        "wrapper_pid",
    ] {
        if !(v[key].is_null() || v[key].is_i64()) {
            return Err(format!("{key} is neither null nor an integer: {}", v[key]));
        }
    }
    if !v["uid"].is_u64() {
        return Err(format!("uid is not an integer: {}", v["uid"]));
    }
    let argv_ok = v["argv"]
        .as_array()
        .is_some_and(|a| a.iter().all(Value::is_string));
    if !argv_ok {
        return Err(format!("argv is not an array of strings: {}", v["argv"]));
    }
    if !v["cleanup"].is_null() {
        let c = &v["cleanup"];
        if !(c["signals"].is_array() && c["duration_ms"].is_u64() && c["survivors"].is_array()) {
            return Err(format!("cleanup lacks signals/duration_ms/survivors: {c}"));
        }
    }
    if ["running", "cancelling", "finished", "cancelled"].contains(&state) {
        for key in ["pid", "pgid", "sid", "start_ticks", "started_at"] {
            if v[key].is_null() {
                return Err(format!("{key} is null in state {state}"));
            }
        }
    }
    if FINAL_STATES.contains(&state) && v["ended_at"].is_null() {
        return Err(format!("ended_at is null in final state {state}"));
    }
    Ok(())
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
    let mut run = Run::start(
        &root,
        &id,
        &[],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--grandchildren",
            "--leader-term",
            "log-exit",
            "--member-term",
            "log-exit",
            "--log",
            path_str(&log),
        ],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
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

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, sid);
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

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, sid);
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
    let mut run = Run::start(
        &root,
        "ignorer",
        &["--grace", "1s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
    let child = ready.members[0];
    let ign = sig_mask(child, "SigIgn").unwrap_or_default();
    c.eq(
        &(ign & (bit(libc::SIGTERM) | bit(libc::SIGHUP))),
        &(bit(libc::SIGTERM) | bit(libc::SIGHUP)),
        format_args!("the child {child} should ignore TERM and HUP: SigIgn {ign:016x}"),
    );

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, ready.sid);
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
    let mut run = Run::start(
        &root,
        "outlived",
        &["--grace", "2s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--grandchildren",
            "--leader-term",
            "log-exit",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
            "--log",
            path_str(&log),
        ],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
    for &m in &ready.members {
        let pgid = proc_stat(m).map(|s| s.2);
        c.eq(
            &pgid,
            &Some(ready.pgid),
            format_args!("member {m} should share the leader's group"),
        );
    }

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, ready.sid);
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

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, sid);
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
    let mut run = Run::start(
        &root,
        "stubborn",
        &["--grace", "30s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--grandchildren",
            "--leader-term",
            "ignore",
            "--leader-hup",
            "ignore",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());

    run.signal(libc::SIGTERM);
    c.wait_state(&["cancelling"]);
    c.eq(
        &pinned.alive(),
        &ready.all_pids(),
        "the tree ignores TERM and HUP: all of it must still be alive while cancelling",
    );
    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, ready.sid);
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
    let mut run = Run::start(
        &root,
        "escapee",
        &[],
        &[&fixture_path(), "tree", "--children", "1", "--escapee"],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
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

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, ready.sid);
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

#[test]
fn a_setsid_escapee_without_the_runs_marker_is_stopped_on_cancel() {
    let root = TestRoot::new();
    let pidfile = root.dir.path().join("escapee.pid");
    let script = scrubbed_escapee_script("exec sleep 600");
    let mut run = Run::start(
        &root,
        "scrubbed",
        &[],
        &["sh", "-c", &script, "sh", path_str(&pidfile)],
    );
    let c = run.c;
    let st = c.wait_state(&["running"]);
    let (leader, sid) = (int(c, &st, "pid"), int(c, &st, "sid"));
    let (_, escapee) = scrubbed_escapee(&run, &pidfile, sid);
    let pinned = Pinned::new(&[leader]);

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, sid);
    nothing_left(c, &escapee, sid);
}

#[test]
fn a_setsid_escapee_without_the_runs_marker_left_by_a_workload_that_exits_0_is_stopped() {
    let root = TestRoot::new();
    let pidfile = root.dir.path().join("escapee.pid");
    let script = scrubbed_escapee_script("exit 0");
    let mut run = Run::start(
        &root,
        "scrubbed-left",
        &[],
        &["sh", "-c", &script, "sh", path_str(&pidfile)],
    );
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

    run.signal(libc::SIGTERM);
    run.finish(143);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(c, &pinned, sid);
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
    let mut doomed = Run::start(
        &root,
        "doomed",
        &[],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "2",
            "--grandchildren",
        ],
    );
    let mut other = Run::start_holding_stdin(
        &root,
        "other",
        &[],
        &["sh", "-c", "sleep 600 & read line; kill $!"],
    );
    let ready = doomed.c.ready();
    let doomed_pins = Pinned::new(&ready.all_pids());
    let st = other.c.wait_state(&["running"]);
    let (leader, sid) = (int(other.c, &st, "pid"), int(other.c, &st, "sid"));
    let sleeper = other.c.wait("the other run's sleep", || {
        children_of(leader)
            .into_iter()
            .find(|&p| comm(p) == "sleep")
            .ok_or_else(|| format!("children of {leader}: {:?}", children_of(leader)))
    });
    let other_pins = Pinned::new(&[leader, sleeper]);

    doomed.signal(libc::SIGTERM);
    doomed.finish(143);
    let st = doomed.final_record();
    doomed
        .c
        .fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
    nothing_left(doomed.c, &doomed_pins, ready.sid);

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

// ---------------------------------------------------------------------------------------------
// Exit codes

#[test]
fn the_workloads_exit_code_passes_through() {
    let root = TestRoot::new();
    for code in [0, 3, 42, 255] {
        let id = format!("exit-{code}");
        let mut run = Run::start(
            &root,
            &id,
            &[],
            &[&fixture_path(), "exit", &code.to_string()],
        );
        let c = run.c;
        run.finish(code);
        let st = run.final_record();
        c.fields(&st, "the record", outcome("finished", None));
        c.eq(
            &(&st["exit_code"], &st["term_signal"]),
            &(&Value::from(code), &Value::Null),
            "(&st[\"exit_code\"], &st[\"term_signal\"])",
        );
        let leader = int(c, &st, "pid");
        let ticks = st["start_ticks"].as_u64();
        let alive = proc_stat(leader).filter(|s| Some(s.4) == ticks && s.0 != 'Z');
        ensure!(c, alive.is_none(), "leader {leader} still alive");
    }
}

#[test]
fn a_workload_killed_by_a_signal_exits_128_plus_n_with_the_signal_named() {
    let root = TestRoot::new();
    for (sig, name) in [(libc::SIGKILL, "KILL"), (libc::SIGTERM, "TERM")] {
        let id = format!("signal-{name}");
        let mut run = Run::start(
            &root,
            &id,
            &[],
            &[&fixture_path(), "signal", &sig.to_string()],
        );
        let c = run.c;
        run.finish(128 + sig);
        let st = run.final_record();
        c.fields(&st, "the record", outcome("finished", None));
        c.eq(
            &(&st["exit_code"], &st["term_signal"]),
            &(&Value::Null, &Value::from(name)),
            "(&st[\"exit_code\"], &st[\"term_signal\"])",
        );
    }
}

/// A launch that must fail with `code`: exit code, `launch_failed`, a one-line error, and the
/// command never ran.
fn assert_launch_failed(run: &mut Run<'_>, code: i32) {
    run.finish(code);
    let st = run.final_record();
    run.c
        .fields(&st, "the record", outcome("launch_failed", None));
    // The leader never ran: `exit_code` is null; the launch's code is `launch_exit_code`.
    run.c
        .eq(&st["exit_code"], &Value::Null, "st[\"exit_code\"]");
    run.c
        .eq(&st["launch_exit_code"], code, "st[\"launch_exit_code\"]");
    let error = st["error"].as_str().unwrap_or_default();
    ensure!(
        run.c,
        !error.is_empty() && !error.contains('\n'),
        "error must be one non-empty line: {:?}",
        st["error"]
    );
}

#[test]
fn a_command_that_is_not_found_exits_127_as_launch_failed() {
    let root = TestRoot::new();
    let missing = root.dir.path().join("no-such-dir").join("cmd");
    for (id, cmd) in [
        ("not-on-path", "agent-run-test-no-such-command"),
        ("no-such-path", path_str(&missing)),
    ] {
        let mut run = Run::start(&root, id, &[], &[cmd]);
        assert_launch_failed(&mut run, 127);
    }
}

#[test]
fn a_command_that_is_not_executable_exits_126_as_launch_failed() {
    let root = TestRoot::new();
    let script = root.dir.path().join("not-executable.sh");
    let marker = root.dir.path().join("ran");
    fs::write(
        &script,
        format!("#!/bin/sh\necho ran > {}\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let mut run = Run::start(&root, "not-exec", &[], &[path_str(&script)]);
    let c = run.c;
    assert_launch_failed(&mut run, 126);
    ensure!(c, !marker.exists(), "the non-executable file ran");
}

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
    let mut run = Run::start(
        &root,
        "polled",
        &["--grace", "1s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
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
        &[&fixture_path(), "tree", "--children", "1"],
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
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
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

/// Starts `cmd` the way a careless parent would: SIGINT, SIGPIPE, SIGHUP and the real-time
/// signals 32 and 33 ignored, SIGUSR1 blocked, and fd 7 open without close-on-exec.
///
/// glibc reserves signals 32 and 33 and refuses to change them through signal(3) or
/// sigaction(3), so they are set with the raw rt_sigaction(2) syscall. (cargo itself starts test
/// binaries with both ignored; setting them here makes the test the same under any runner.)
fn start_leaky(cmd: &mut Command) {
    /// `struct sigaction` as the kernel takes it (x86_64 and aarch64 layout).
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    // SAFETY: signal(2), rt_sigaction(2), sigemptyset/sigaddset(3), sigprocmask(2) and dup2(2)
    // are async-signal-safe; nothing is allocated between fork and exec. SIG_IGN runs no
    // handler, so no restorer is needed.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            let ignore = KernelSigaction {
                handler: libc::SIG_IGN,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            for sig in [32, 33] {
                let none = std::ptr::null_mut::<KernelSigaction>();
                if libc::syscall(libc::SYS_rt_sigaction, sig, &ignore, none, 8) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if libc::dup2(2, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A wrapper started with descriptors 0, 1 and 2 closed has them on /dev/null before it opens
/// anything (it starts at its own C `main`, and does what Rust's runtime start did): the
/// workload's stdin, the wrapper's own, is /dev/null, never a file of the run dir that took the
/// lowest free number. Without it, fd 0 would be the first file the wrapper opened.
#[test]
fn a_wrapper_started_with_fds_0_1_2_closed_gives_its_workload_dev_null_for_stdin() {
    let root = TestRoot::new();
    let id = "closed-std";
    let c = ctx(&root, id);
    let mut cmd = root.cmd();
    cmd.args(["--quiet", id, "--", "sh", "-c", "readlink /proc/self/fd/0"]);
    // SAFETY: close(2) is async-signal-safe; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for fd in 0..3 {
                libc::close(fd);
            }
            Ok(())
        });
    }
    let out = run_with_timeout(&mut cmd, T);
    ensure!(
        c,
        out.status.code() == Some(0),
        "{}",
        describe_output("agent-run with 0-2 closed", &out)
    );
    let st = root.status(id);
    c.fields(&st, "the record", outcome("finished", None));
    let seen = fs::read_to_string(root.run_dir(id).join("stdout.log")).unwrap_or_default();
    c.eq(&seen.trim_end(), &"/dev/null", "the workload's fd 0");
}

#[test]
fn no_fd_mask_or_ignored_signal_of_the_wrapper_leaks_into_the_workload() {
    // The control: started directly, the fixture does report what it inherited.
    let mut direct = Command::new(fixture_bin());
    direct.arg("env").stdin(Stdio::null());
    start_leaky(&mut direct);
    let control = run_with_timeout(&mut direct, T);
    let control_text = String::from_utf8_lossy(&control.stdout);
    let mask = |field: &str| {
        control_text
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_default()
    };
    let ignored = bit(libc::SIGINT) | bit(libc::SIGPIPE) | bit(libc::SIGHUP) | bit(32) | bit(33);
    let fds = control_text
        .lines()
        .find_map(|l| l.strip_prefix("fds: "))
        .unwrap_or_default();
    assert!(
        mask("SigIgn:") & ignored == ignored
            && mask("SigBlk:") & bit(libc::SIGUSR1) != 0
            && fds.split(',').any(|fd| fd == "7"),
        "the leaky start does not leak: the test proves nothing\n{}",
        describe_output("fixture env", &control)
    );

    let root = TestRoot::new();
    let mut run = Run::start_with(&root, "env", &[], &[&fixture_path(), "env"], start_leaky);
    let c = run.c;
    run.finish(0);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("finished", None));
    let dir = root.run_dir("env");
    let report = fs::read_to_string(dir.join("stdout.log")).unwrap_or_default();
    let leader = int(c, &st, "pid");
    let expected = [
        "SigIgn:\t0000000000000000".to_string(),
        "SigBlk:\t0000000000000000".to_string(),
        "fds: 0,1,2".to_string(),
        "AGENT_RUN_ID=env".to_string(),
        format!("AGENT_RUN_DIR={}", dir.display()),
        format!("pid={leader} pgid={leader} sid={leader}"),
    ];
    let missing: Vec<&String> = expected
        .iter()
        .filter(|want| !report.lines().any(|l| l == want.as_str()))
        .collect();
    ensure!(
        c,
        missing.is_empty(),
        "the workload's report lacks {missing:?}:\n{report}"
    );
}

#[test]
fn pid_and_pgid_files_and_status_json_name_the_leader_the_kernel_shows() {
    let root = TestRoot::new();
    let fixture = fixture_path();
    let argv = [fixture.as_str(), "tree", "--children", "1"];
    let mut run = Run::start(&root, "ids", &[], &argv);
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
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
    let mut run = Run::start(
        &root,
        "journal",
        &["--grace", "1s"],
        &[
            &fixture_path(),
            "tree",
            "--children",
            "1",
            "--member-term",
            "ignore",
            "--member-hup",
            "ignore",
        ],
    );
    let c = run.c;
    let ready = c.ready();
    let pinned = Pinned::new(&ready.all_pids());
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
    c.fields(&c.status(), "the record", json!({"state": "finished"}));
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
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    assert_refused_as_unsafe(&root, "foreign-root", &dir, &dir);
}

#[test]
fn a_root_that_is_a_symlink_exits_78() {
    let root = TestRoot::new();
    let real = root.dir.path().join("real-root");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, root.root()).unwrap();
    assert_refused_as_unsafe(&root, "via-link", &root.root(), &real);
}

#[test]
fn a_run_dir_that_is_a_symlink_exits_78() {
    let root = TestRoot::new();
    let elsewhere = root.dir.path().join("elsewhere");
    for dir in [root.root(), elsewhere.clone()] {
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    }
    std::os::unix::fs::symlink(&elsewhere, root.run_dir("linked")).unwrap();
    assert_refused_as_unsafe(&root, "linked", &root.run_dir("linked"), &elsewhere);
}
