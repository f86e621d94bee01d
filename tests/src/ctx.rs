//! One run under test, [`Ctx`]: a test's root and a run id, with the commands, waits and
//! checks a test needs, every failure of which ends with the run's [`diagnostics`]; and the
//! one assertion macro, [`ensure!`](crate::ensure), for everything else.

use std::fmt::{Debug, Display};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::contain::marked;
use crate::facts::{epoch_of, is_rfc3339_ms, text};
use crate::workload::{fx, start_args};
use crate::{
    describe_output, diagnostics, exit_code, parse_ready, proc_stat, run_with_timeout,
    session_members, Pinned, Ready, Spawned, TestRoot, FINAL_STATES, RECORD_KEYS,
};

/// The deadline for things that normally take milliseconds to a few seconds.
pub const T: Duration = Duration::from_secs(30);
/// The deadline for one agent-run command to return.
pub const CMD: Duration = Duration::from_secs(90);

/// Something whose failures carry a run's diagnostics: a [`Ctx`], or a fleet's host run
/// ([`crate::ansible::HostRun`]).
pub trait Diagnosed {
    /// The run dir listing, status.json, events.jsonl and log tails ([`diagnostics`]).
    fn diagnostics(&self) -> String;

    /// Panics with `msg` and the diagnostics.
    fn fail(&self, msg: impl Display) -> ! {
        panic!("{msg}\n{}", self.diagnostics())
    }

    /// `ok`, else [`Diagnosed::fail`] with `msg`.
    fn check(&self, ok: bool, msg: impl Display) {
        if !ok {
            self.fail(msg)
        }
    }

    /// `left == right`, else [`Diagnosed::fail`] with `what` and both values.
    fn eq<L: PartialEq<R> + Debug, R: Debug>(&self, left: L, right: R, what: impl Display) {
        if left != right {
            self.fail(format_args!("{what}\n  left: {left:?}\n right: {right:?}"))
        }
    }

    /// Every key of the object `expected` has that value in `doc`.
    fn fields(&self, doc: &Value, what: &str, expected: Value) {
        for (key, want) in expected.as_object().expect("expected fields are an object") {
            crate::ensure!(
                *self,
                doc.get(key) == Some(want),
                "{what}: {key} is {}, not {want}\n{doc:#}",
                doc[key]
            );
        }
    }
}

impl Diagnosed for Ctx<'_> {
    fn diagnostics(&self) -> String {
        diagnostics(self.root, self.id)
    }
}

/// `ensure!(run, condition, "format", args...)`: a condition on /proc or the record, else a
/// panic with the message and the run's diagnostics. `run` is a [`Ctx`] (or anything
/// [`Diagnosed`]: a fleet's host run).
#[macro_export]
macro_rules! ensure {
    ($run:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $crate::ctx::Diagnosed::fail(&$run, format_args!($($msg)+))
        }
    };
}

/// A run of a test's root, by id. Every failure it reports ends with [`diagnostics`].
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub root: &'a TestRoot,
    pub id: &'a str,
}

/// The [`Ctx`] of run `id` of `root`.
pub fn ctx<'a>(root: &'a TestRoot, id: &'a str) -> Ctx<'a> {
    Ctx { root, id }
}

/// A run started with `start --detach`: its JSON line, and pins on its wrapper and leader.
/// Dropping a pin SIGKILLs what it pins: destructure with every pin bound to a name
/// (`leader_pin: _leader_pin`), never `..` over a pin the test still needs alive.
pub struct Detached {
    pub line: Value,
    pub wrapper: i32,
    pub leader: i32,
    pub wrapper_pin: Pinned,
    pub leader_pin: Pinned,
}

/// A run started in the foreground (`agent-run start` as a child of the test).
pub struct Foreground {
    pub proc: Spawned,
    pub wrapper: i32,
    pub leader: i32,
    pub wrapper_pin: Pinned,
    pub leader_pin: Pinned,
}

impl<'a> Ctx<'a> {
    // The checks of [`Diagnosed`], callable without importing it.

    pub fn fail(self, msg: impl Display) -> ! {
        Diagnosed::fail(&self, msg)
    }

    pub fn check(self, ok: bool, msg: impl Display) {
        Diagnosed::check(&self, ok, msg)
    }

    pub fn eq<L: PartialEq<R> + Debug, R: Debug>(self, left: L, right: R, what: impl Display) {
        Diagnosed::eq(&self, left, right, what)
    }

    /// Every key of the object `expected` has that value in `doc`.
    pub fn fields(self, doc: &Value, what: &str, expected: Value) {
        Diagnosed::fields(&self, doc, what, expected)
    }

    /// status.json now has every field of `expected` (`what` names it in a failure); the
    /// record, for further checks.
    pub fn record(self, what: &str, expected: Value) -> Value {
        let st = self.status();
        self.fields(&st, what, expected);
        st
    }

    // --- commands

    /// `agent-run --root <root> ARGS...` to completion, exit code unchecked.
    pub fn run<S: AsRef<str>>(self, args: &[S]) -> Output {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        run_with_timeout(self.root.cmd().args(&args), CMD)
    }

    /// `agent-run --root <root> ARGS...` to completion; its exit code must be `want`.
    pub fn ctl<S: AsRef<str>>(self, args: &[S], want: i32) -> Output {
        let out = self.run(args);
        let what: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        self.code(&out, want, &format!("agent-run {}", what.join(" ")));
        out
    }

    /// `agent-run-watchdog --root <root> --once --orphan-grace GRACE`, which must exit 0.
    pub fn watchdog_once(self, orphan_grace: &str) -> Output {
        let what = format!("agent-run-watchdog --once --orphan-grace {orphan_grace}");
        let mut cmd = self.root.watchdog_cmd();
        cmd.args(["--once", "--orphan-grace", orphan_grace]);
        let out = run_with_timeout(&mut cmd, CMD);
        self.code(&out, 0, &what);
        out
    }

    /// A command's exit code must be `want`.
    pub fn code(self, out: &Output, want: i32, what: &str) {
        let code = exit_code(&out.status);
        crate::ensure!(
            self,
            code == want,
            "{what} exited {code}, not {want}\n{}",
            describe_output(what, out)
        );
    }

    /// A command's whole stdout as one JSON document.
    pub fn parse(self, out: &Output, what: &str) -> Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            self.fail(format_args!(
                "{what}: stdout is not one JSON document: {e}\n{}",
                describe_output(what, out)
            ))
        })
    }

    /// Runs a command that must exit 0 and print one JSON document, and returns it.
    pub fn json(self, args: &[&str]) -> Value {
        let out = self.ctl(args, 0);
        self.parse(&out, &args.join(" "))
    }

    /// Waits for a foreground agent-run to exit; its exit code must be `want`.
    pub fn finish(self, proc: Spawned, want: i32) -> Output {
        self.finish_within(proc, CMD, want)
    }

    /// Waits for a foreground agent-run to exit (to `timeout`); its exit code must be `want`.
    pub fn finish_within(self, proc: Spawned, timeout: Duration, want: i32) -> Output {
        let what = proc.what.clone();
        let out = proc.finish(timeout);
        self.code(&out, want, &what);
        out
    }

    // --- the run dir

    pub fn file(self, name: &str) -> PathBuf {
        self.root.run_dir(self.id).join(name)
    }

    pub fn bytes(self, name: &str) -> Vec<u8> {
        fs::read(self.file(name))
            .unwrap_or_else(|e| self.fail(format_args!("cannot read {name}: {e}")))
    }

    pub fn status(self) -> Value {
        self.root.status(self.id)
    }

    /// The journal's events named `name` (events.jsonl must exist and parse).
    pub fn events(self, name: &str) -> Vec<Value> {
        let all = self.root.events(self.id).into_iter();
        all.filter(|e| e["event"] == name).collect()
    }

    /// The journal's events named `name` that `keep` accepts.
    pub fn events_where(self, name: &str, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.events(name).into_iter().filter(|e| keep(e)).collect()
    }

    /// The journal's events named `name` so far: none while events.jsonl does not exist yet (a
    /// run dir a test made, which only the watchdog journals in), the whole lines that parse.
    pub fn events_so_far(self, name: &str) -> Vec<Value> {
        let text = crate::read_run_file(&self.file("events.jsonl")).unwrap_or_default();
        let lines = String::from_utf8_lossy(&text).into_owned();
        let all = lines
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok());
        all.filter(|e| e["event"] == name).collect()
    }

    /// The `state` events that moved the run to a final state.
    pub fn final_state_events(self) -> usize {
        let to_final = |e: &Value| e["to"].as_str().is_some_and(|s| FINAL_STATES.contains(&s));
        self.events("state").iter().filter(|e| to_final(e)).count()
    }

    /// Replaces a run file atomically (temp file in the run dir, then rename) with `bytes`.
    pub fn replace(self, name: &str, bytes: &[u8]) {
        let tmp = self.file(&format!(".{name}.test-edit.tmp"));
        let written = fs::write(&tmp, bytes)
            .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)))
            .and_then(|()| fs::rename(&tmp, self.file(name)));
        written.unwrap_or_else(|e| self.fail(format_args!("cannot replace {name}: {e}")));
    }

    /// Replaces status.json atomically with `bytes`.
    pub fn replace_status(self, bytes: &[u8]) {
        self.replace("status.json", bytes)
    }

    /// Edits status.json atomically, as a reused pid or another boot would leave it; returns
    /// the bytes written.
    pub fn edit_status(self, edit: impl FnOnce(&mut Map<String, Value>)) -> Vec<u8> {
        let mut st = self.status();
        edit(st.as_object_mut().expect("status.json is an object"));
        let mut bytes = serde_json::to_vec_pretty(&st).expect("json serializes");
        bytes.push(b'\n');
        self.replace_status(&bytes);
        bytes
    }

    /// Checks that `doc` has every contract key and every key of status.json, with well-formed
    /// times.
    pub fn record_keys(self, doc: &Value, what: &str) {
        let mut keys: Vec<String> = RECORD_KEYS.iter().map(|k| k.to_string()).collect();
        if let Ok(Value::Object(st)) = self.root.try_status(self.id) {
            keys.extend(st.keys().cloned());
        }
        for key in keys {
            crate::ensure!(
                self,
                doc.get(&key).is_some(),
                "{what} has no {key:?}: {doc:#}"
            );
        }
        for key in ["created_at", "started_at", "ended_at"] {
            if let Some(t) = doc[key].as_str() {
                crate::ensure!(
                    self,
                    is_rfc3339_ms(t),
                    "{what}: {key} {t:?} is not RFC 3339"
                );
            }
        }
    }

    /// The lease's deadline as lease.json says now.
    pub fn lease_deadline(self) -> f64 {
        let lease: Value = serde_json::from_slice(&self.bytes("lease.json"))
            .unwrap_or_else(|e| self.fail(format_args!("lease.json is not JSON: {e}")));
        lease["deadline_epoch"]
            .as_f64()
            .unwrap_or_else(|| self.fail(format_args!("lease.json has no deadline: {lease}")))
    }

    /// A time field of a record or event, as seconds since the epoch.
    pub fn epoch(self, doc: &Value, key: &str) -> f64 {
        doc[key]
            .as_str()
            .and_then(epoch_of)
            .unwrap_or_else(|| self.fail(format_args!("{key} is not a contract time: {doc}")))
    }

    // --- waiting

    /// Polls `probe` every 5 ms until it succeeds; on timeout fails with the last thing seen.
    pub fn wait<V>(self, what: &str, probe: impl FnMut() -> Result<V, String>) -> V {
        crate::poll_until(T, probe).unwrap_or_else(|(waited, seen)| {
            self.fail(format_args!(
                "timed out after {waited:?} waiting for {what}; last seen: {seen}"
            ))
        })
    }

    /// Waits until status.json's state is one of `states`, and returns the record.
    pub fn wait_state(self, states: &[&str]) -> Value {
        self.wait(&format!("state {states:?}"), || {
            let st = self.root.try_status(self.id)?;
            match st["state"].as_str() {
                Some(s) if states.contains(&s) => Ok(st),
                other => Err(format!("state {other:?}")),
            }
        })
    }

    /// Waits until the record is final, and returns it.
    pub fn wait_final(self) -> Value {
        self.wait_state(&FINAL_STATES)
    }

    /// Waits for the first event named `name` (in a journal that may not exist yet).
    pub fn wait_event(self, name: &str) -> Value {
        self.wait(&format!("a {name:?} event"), || {
            let mut found = self.events_so_far(name);
            (!found.is_empty())
                .then(|| found.remove(0))
                .ok_or_else(|| "not yet".to_string())
        })
    }

    /// Writes one line into the fifo once a reader has it open.
    pub fn release(self, fifo: &Path) {
        let mut f = self.wait("a reader on the fifo", || {
            let mut opts = fs::OpenOptions::new();
            opts.write(true).custom_flags(libc::O_NONBLOCK);
            opts.open(fifo).map_err(|e| e.to_string())
        });
        f.write_all(b"go\n").expect("cannot write to the fifo");
    }

    // --- processes

    /// Waits for the fixture's ready line in stdout.log.
    pub fn ready(self) -> Ready {
        let log = self.file("stdout.log");
        self.wait("the fixture's ready line", || {
            let text = fs::read_to_string(&log).map_err(|e| e.to_string())?;
            let mut lines = text.split_inclusive('\n').filter(|l| l.ends_with('\n'));
            lines
                .find_map(parse_ready)
                .ok_or_else(|| format!("{text:?}"))
        })
    }

    /// Waits for the ready line and pins the whole tree; every pid must be alive then.
    pub fn pin_tree(self) -> (Ready, Pinned) {
        let ready = self.ready();
        let pins = Pinned::new(&ready.all_pids());
        self.all_alive(&pins, "the tree right after its ready line");
        (ready, pins)
    }

    /// Every pinned process is alive right now.
    pub fn all_alive(self, pins: &Pinned, what: &str) {
        let (mut alive, mut all) = (pins.alive(), pins.pids());
        alive.sort_unstable();
        all.sort_unstable();
        self.eq(
            alive,
            all,
            format_args!("{what}: a process is gone (alive vs all)"),
        );
    }

    /// Waits, to one deadline, until the wrapper that the record `st` names has exited. It
    /// removes the run's cgroup right after writing the final record, so a check that the
    /// cgroup is gone waits for this first. A pid that is gone, or is another process now (its
    /// start ticks differ), has exited.
    pub fn wait_wrapper_exit(self, st: &Value) {
        let (Some(pid), Some(ticks)) = (
            st["wrapper_pid"].as_i64(),
            st["wrapper_start_ticks"].as_u64(),
        ) else {
            return;
        };
        let pid = pid as i32;
        // Pinned first, then checked: a pidfd opened before the check that finds the wrapper's
        // start ticks is the wrapper's.
        let pins = Pinned::new(&[pid]);
        if crate::alive_as(pid, ticks) {
            self.wait_gone(&pins, "the wrapper after its final record");
        }
    }

    /// No pinned process is alive right now (zombies are dead).
    pub fn gone_now(self, pins: &Pinned, what: &str) {
        let alive: Vec<_> = pins.alive().iter().map(|&p| (p, proc_stat(p))).collect();
        crate::ensure!(self, alive.is_empty(), "{what}: still alive: {alive:?}");
    }

    /// `cancel ID` exits 0, and then no process of `tree` is alive.
    pub fn cancel_now(self, tree: &Pinned, what: &str) {
        self.ctl(&["cancel", self.id], 0);
        self.gone_now(tree, what);
    }

    /// Waits, to one deadline, until every pinned process is gone.
    pub fn wait_gone(self, pins: &Pinned, what: &str) {
        self.wait_gone_within(pins, T, what);
    }

    /// Waits until every pinned process is gone, to a deadline of the test's own (a bound the
    /// test asserts); returns how long it took.
    pub fn wait_gone_within(self, pins: &Pinned, timeout: Duration, what: &str) -> Duration {
        pins.wait_all_gone(timeout).unwrap_or_else(|alive| {
            let stats: Vec<_> = alive.iter().map(|&p| (p, proc_stat(p))).collect();
            self.fail(format_args!(
                "{what}: still alive after {timeout:?}: {stats:?}"
            ))
        })
    }

    /// Waits until the cgroup the final record `st` names is removed (whoever wrote the record
    /// removes it right after: the wrapper, or the watchdog that took over). A record that names
    /// no cgroup fails: a run on this host is contained by one.
    pub fn wait_cgroup_removed(self, st: &Value, what: &str) {
        let Some(cg) = st["containment"]["cgroup"]
            .as_str()
            .filter(|c| !c.is_empty())
        else {
            self.fail(format_args!("{what}: the record names no cgroup: {st}"))
        };
        let cg = std::path::Path::new(cg);
        self.wait(
            &format!("{what}: the run's cgroup {} removed", cg.display()),
            || {
                if cg.exists() {
                    let procs =
                        std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
                    Err(format!("still there, cgroup.procs {procs:?}"))
                } else {
                    Ok(())
                }
            },
        );
    }

    /// No live process is left in the run's session.
    pub fn session_empty(self, sid: i32) {
        self.eq(
            session_members(sid),
            Vec::<i32>::new(),
            "processes left in the run's session",
        );
    }

    /// No live process carries the run's marker, and none is left in the leader's session.
    pub fn nothing_left(self, sid: i32, when: &str) {
        let strays: Vec<_> = marked(&self.root.run_dir(self.id))
            .into_iter()
            .map(|p| (p, proc_stat(p)))
            .collect();
        crate::ensure!(
            self,
            strays.is_empty(),
            "{when}: processes with the run's marker: {strays:?}"
        );
        self.eq(
            session_members(sid),
            Vec::<i32>::new(),
            format_args!("{when}: processes left in the run's session"),
        );
    }

    /// Sends `sig` to a pinned process.
    pub fn signal(self, pins: &Pinned, pid: i32, sig: i32) {
        let sent = pins.signal(pid, sig);
        sent.unwrap_or_else(|e| self.fail(format_args!("cannot send {sig} to {pid}: {e}")));
    }

    /// SIGKILLs a pinned wrapper and waits until it is dead: the run is orphaned, its lock free.
    pub fn kill_wrapper(self, wrapper: i32, pin: &Pinned) {
        self.signal(pin, wrapper, libc::SIGKILL);
        self.wait_gone(pin, "the SIGKILLed wrapper");
    }

    // --- starting runs

    /// `fixture tree OPTS... --log LOG`, LOG being `<id>.log` in the test's temporary dir: a
    /// tree whose signal handlers log there. The command and LOG.
    pub fn logged_tree(self, opts: &str) -> (Vec<String>, PathBuf) {
        let log = self.root.dir.path().join(format!("{}.log", self.id));
        (crate::workload::logged_tree(opts, &log), log)
    }

    /// An orphan: `start --detach ID -- COMMAND...` (a fixture tree), its tree pinned, then its
    /// wrapper SIGKILLed and gone.
    pub fn orphan(self, command: &[String]) -> (Detached, Ready, Pinned) {
        let run = self.start_detached("", command);
        let (ready, tree) = self.pin_tree();
        self.kill_wrapper(run.wrapper, &run.wrapper_pin);
        (run, ready, tree)
    }

    /// `start --detach OPTS... ID -- COMMAND...`: exit 0 and one JSON line with the contract's
    /// keys; its wrapper and leader pinned.
    pub fn start_detached(self, opts: &str, command: &[String]) -> Detached {
        let out = self.ctl(
            &start_args(&format!("--detach --json {opts}"), self.id, command),
            0,
        );
        let line = self.detach_line(&out);
        let wrapper = self.status()["wrapper_pid"].as_i64().unwrap_or(0) as i32;
        let leader = line["pid"].as_i64().unwrap_or(0) as i32;
        crate::ensure!(
            self,
            wrapper > 0 && leader > 0,
            "no wrapper or leader pid: {line}"
        );
        let (wrapper_pin, leader_pin) = (Pinned::new(&[wrapper]), Pinned::new(&[leader]));
        // The pin is the recorded wrapper, not a process that reused its pid (read while the
        // pin says it lives: a short run's wrapper may be gone already).
        let ticks = proc_stat(wrapper).map(|s| s.4);
        if !wrapper_pin.alive().is_empty() {
            self.eq(
                ticks,
                self.status()["wrapper_start_ticks"].as_u64(),
                format_args!("the start ticks of wrapper {wrapper} (the kernel's, the record's)"),
            );
        }
        Detached {
            line,
            wrapper,
            leader,
            wrapper_pin,
            leader_pin,
        }
    }

    /// [`Ctx::start_detached`] of a run whose detach line says `running`.
    pub fn start_running(self, opts: &str, command: &[String]) -> Detached {
        let run = self.start_detached(opts, command);
        self.fields(&run.line, "the detach line", json!({"state": "running"}));
        run
    }

    /// The one JSON line `start --detach` prints, with its keys checked.
    pub fn detach_line(self, out: &Output) -> Value {
        let stdout = text(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        let what = describe_output("start --detach", out);
        self.eq(
            lines.len(),
            1,
            format_args!("lines printed by start --detach\n{what}"),
        );
        let line: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| {
            self.fail(format_args!("the detach line is not JSON: {e}\n{what}"))
        });
        for key in ["run_id", "run_dir", "pid", "pgid", "state"] {
            crate::ensure!(
                self,
                line.get(key).is_some(),
                "the detach line has no {key:?}: {line}"
            );
        }
        self.fields(&line, "the detach line", json!({"run_id": self.id}));
        let run_dir = line["run_dir"].as_str().map(PathBuf::from);
        self.eq(
            run_dir,
            Some(self.root.run_dir(self.id)),
            "run_dir of the detach line",
        );
        line
    }

    /// `start OPTS... ID -- COMMAND...` in the foreground; returns once the record says running.
    pub fn start_foreground(self, opts: &str, command: &[String], stdin: Stdio) -> Foreground {
        let args = start_args(opts, self.id, command);
        let proc = Spawned::spawn(self.root.cmd().args(args).stdin(stdin));
        let wrapper = proc.child.id() as i32;
        let wrapper_pin = Pinned::new(&[wrapper]);
        let leader = self.wait_state(&["running"])["pid"].as_i64().unwrap_or(0) as i32;
        let leader_pin = Pinned::new(&[leader]);
        self.launched();
        Foreground {
            proc,
            wrapper,
            leader,
            wrapper_pin,
            leader_pin,
        }
    }

    /// `start OPTS... ID -- COMMAND...` in the foreground from `cmd` (a [`TestRoot::cmd`],
    /// perhaps with more set up); returns once the record is past `starting` (a short workload
    /// may be over by then: the journal tells whether it was `running`), the wrapper pinned.
    pub fn spawn_start(
        self,
        mut cmd: Command,
        opts: &str,
        command: &[String],
    ) -> (Spawned, i32, Pinned) {
        let proc = Spawned::spawn(cmd.args(start_args(opts, self.id, command)));
        let wrapper = proc.child.id() as i32;
        let pin = Pinned::new(&[wrapper]);
        self.wait_state(&[
            "running",
            "cancelling",
            "finished",
            "cancelled",
            "launch_failed",
        ]);
        self.launched();
        (proc, wrapper, pin)
    }

    /// Waits until the launch is journalled to its end: the journal's lines follow the record's
    /// rename (`state` to running, then `spawn`), so a test that saw `running` in status.json and
    /// reads the journal would race them.
    pub fn launched(self) {
        self.wait("the launch's last journal line (spawn)", || {
            let states = self.events_so_far("state");
            let running = states.iter().any(|e| e["to"] == "running");
            match running && !self.events_so_far("spawn").is_empty() {
                true => Ok(()),
                false => Err(format!("state events {states:?}")),
            }
        });
    }

    /// A run of `fixture exit CODE` in the foreground, to its end.
    pub fn finished(self, code: i32) {
        self.ctl(
            &start_args("--quiet", self.id, &fx(&format!("exit {code}"))),
            code,
        );
    }
}
