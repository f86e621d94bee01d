//! A foreground run under test: one `agent-run OPTS ID -- ARGV` wrapper a test starts and
//! waits for ([`Run`]), with the checks its tests share (the contract's record, its outcome).
//!
//! Dropping a [`Run`] before [`Run::finish`] kills, by pid, the wrapper and every process of the
//! run it can find, so a failing test leaves nothing behind.

use std::process::{ChildStdin, Command, Output, Stdio};

use serde_json::{json, Value};

use crate::contain::marked;
use crate::ctx::T;
use crate::facts::is_rfc3339_ms;
use crate::workload::{fx, DEAF_CHILD};
use crate::{
    ctx, descendants, ensure, proc_stat, session_members, Ctx, Pinned, Ready, Spawned, TestRoot,
    FINAL_STATES, RECORD_KEYS,
};

/// The states of the contract before a final one ([`FINAL_STATES`]).
pub const ACTIVE_STATES: [&str; 3] = ["starting", "running", "cancelling"];

// ---------------------------------------------------------------------------------------------
// A run under test

/// For [`Run::start_with`]: stdin a pipe that the test holds open until [`Run::close_stdin`] or
/// the end of the test.
pub fn hold_stdin(cmd: &mut Command) {
    cmd.stdin(Stdio::piped());
}

/// One `agent-run` wrapper started by a test in the foreground (`agent-run OPTS ID -- ARGV`, the
/// form without `start`), with its output drained and (optionally) its stdin held open. Its
/// checks and waits are its run's, [`Run::c`]. Dropping it before [`Run::finish`] kills, by pid,
/// the wrapper and every process of the run it can find (the run's marked processes, the
/// wrapper's descendants, the run's session while its leader is the recorded one), so a failing
/// test leaves nothing behind.
pub struct Run<'a> {
    pub c: Ctx<'a>,
    wrapper: Option<Spawned>,
    stdin: Option<ChildStdin>,
}

impl<'a> Run<'a> {
    /// `agent-run --root R OPTS... ID -- ARGV...`, stdin from /dev/null.
    pub fn start(
        root: &'a TestRoot,
        id: &'a str,
        opts: &[&str],
        argv: &[impl AsRef<std::ffi::OsStr>],
    ) -> Run<'a> {
        Run::start_with(root, id, opts, argv, |_| {})
    }

    /// Like [`Run::start`], with the command adjusted by `configure` before it is spawned.
    pub fn start_with(
        root: &'a TestRoot,
        id: &'a str,
        opts: &[&str],
        argv: &[impl AsRef<std::ffi::OsStr>],
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

    /// [`Run::start`] of a fixture tree, with the tree pinned once the fixture is ready.
    pub fn start_pinned(
        root: &'a TestRoot,
        id: &'a str,
        opts: &[&str],
        argv: &[impl AsRef<std::ffi::OsStr>],
    ) -> (Run<'a>, Ready, Pinned) {
        let run = Run::start(root, id, opts, argv);
        let (ready, pinned) = run.c.pin_tree();
        (run, ready, pinned)
    }

    /// `agent-run --grace 1s ID -- fixture DEAF_CHILD` (a child that ignores TERM and HUP), with
    /// its tree pinned once the fixture is ready.
    pub fn start_deaf(root: &'a TestRoot, id: &'a str) -> (Run<'a>, Ready, Pinned) {
        Run::start_pinned(root, id, &["--grace", "1s"], &fx(DEAF_CHILD))
    }

    pub fn wrapper_pid(&self) -> i32 {
        self.wrapper
            .as_ref()
            .expect("the wrapper has finished")
            .child
            .id() as i32
    }

    /// Sends `sig` to the wrapper (not yet reaped, so its pid is still its own).
    pub fn signal(&self, sig: i32) {
        self.wrapper
            .as_ref()
            .expect("the wrapper has finished")
            .signal(sig);
    }

    /// Closes the workload's stdin pipe.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for the wrapper to exit and reaps it; it must exit `code`. The workload's stdin
    /// stays open until then (an interactive shell would exit at its EOF).
    pub fn finish(&mut self, code: i32) -> Output {
        let wrapper = self.wrapper.take().expect("the wrapper has finished");
        let out = self.c.finish_within(wrapper, T, code);
        self.stdin.take();
        out
    }

    /// status.json, which must be final and valid.
    pub fn final_record(&self) -> Value {
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

    /// TERM to the wrapper, which must exit 143 with a `cancelled` record (`signal:TERM`) and
    /// nothing of `pinned` or of the session `sid` left; the record.
    pub fn stop_by_term(&mut self, pinned: &Pinned, sid: i32) -> Value {
        self.signal(libc::SIGTERM);
        self.finish(143);
        let st = self.final_record();
        self.c
            .fields(&st, "the record", outcome("cancelled", Some("signal:TERM")));
        nothing_left(self.c, pinned, sid);
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
        crate::kill_until_gone(20, || {
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
            pids
        });
        if let Some(mut w) = wrapper {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// The state and reason a record must have.
pub fn outcome(state: &str, reason: Option<&str>) -> Value {
    json!({"state": state, "reason": reason})
}

/// The invariant users rely on: once the record is final, nothing of the run is alive. Every
/// pinned process is gone and the run's session has no live member.
pub fn nothing_left(c: Ctx<'_>, pinned: &Pinned, sid: i32) {
    c.gone_now(pinned, "processes of the run after its final record");
    c.session_empty(sid);
}

/// `key` of a record as an i32 (pid, pgid, sid).
pub fn int(c: Ctx<'_>, st: &Value, key: &str) -> i32 {
    st[key]
        .as_i64()
        .and_then(|v| i32::try_from(v).ok())
        .unwrap_or_else(|| c.fail(format_args!("status.json {key} is not an int: {st}")))
}

/// The bit of signal `sig` in a /proc signal mask.
pub fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// Checks one status.json document against the contract: every key present with its type, a
/// known state, times in RFC 3339 UTC with milliseconds, ids once launched, `ended_at` once final.
pub fn check_record(v: &Value) -> Result<(), String> {
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
    if !ACTIVE_STATES.contains(&state) && !FINAL_STATES.contains(&state) {
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
