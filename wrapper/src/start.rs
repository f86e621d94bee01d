//! `agent-run start`: spec -> run dir -> spawn -> supervise -> stop -> final record -> exit code,
//! with `--detach` (a wrapper of our own in its own session, the caller gets one JSON line) and
//! the relaunch of an id that exists (which never runs the command twice).
//!
//! The run dir is created with one `mkdir`; its lock is taken before the first record appears, so
//! anyone who sees a record and can take the lock knows the wrapper is gone. The workload is made
//! in the run's cgroup and starts in a new session ([`spawn::spawn_workload`]: clone3, setsid
//! before its exec), writes into pipes that the output keeper ([`crate::keeper`], started just
//! before it) drains into its logs, and is checked from /proc to be its own session and group
//! leader before the record says `running`.

use crate::cli::StartArgs;
use crate::error::fail;
use crate::human;
use crate::keeper;
use crate::logs;
use crate::ptyio::PtyRun;
use crate::runs::{self, wait_final};
use crate::signals::Signals;
use crate::stream::Streamer;
use crate::supervise::{self, Limits, Outcome};
use agent_run_shared::cgroup::{self, Parent, RunCgroup};
use agent_run_shared::exit;
use agent_run_shared::heartbeat::{Beat, Published};
use agent_run_shared::id::RunId;
use agent_run_shared::journal::Journal;
use agent_run_shared::lease::{Lease, LeaseToken, ENV_TOKEN};
use agent_run_shared::lifecycle::{finalize, transition};
use agent_run_shared::lock::{RunLock, Taken};
use agent_run_shared::pid::{Identity, Pid};
use agent_run_shared::procset::{discover, Depth, RunScope};
use agent_run_shared::pty::{self, Pty};
use agent_run_shared::reap;
use agent_run_shared::record::{Containment, Proof, State, Status};
use agent_run_shared::root::{resolve_root, Root};
use agent_run_shared::run_dir::{files, RunDir};
use agent_run_shared::spec::OnDisconnect;
use agent_run_shared::stop::{stop_run, Sig, Timings};
use agent_run_shared::sys::{self, WaitStatus};
use agent_run_shared::{fault, procfs, spawn, time, Error, ENV_RUN_DIR, ENV_RUN_ID};
use anyhow::Context;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The variable through which `start --detach` hands the `-e` pairs to its detached wrapper
/// (never on a command line: /proc/PID/cmdline is world readable). Removed from the workload's
/// environment.
pub const ENV_PASSED: &str = "AGENT_RUN_PASSED_ENV";

/// `-e` pairs as one environment value: each `NAME=VALUE` in hex, comma-separated.
pub fn encode_env(pairs: &[(OsString, OsString)]) -> String {
    use std::os::unix::ffi::OsStrExt;
    pairs
        .iter()
        .map(|(k, v)| {
            let mut b = k.as_bytes().to_vec();
            b.push(b'=');
            b.extend_from_slice(v.as_bytes());
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The pairs [`encode_env`] wrote, validated as `-e` validates them.
fn decode_env(s: &std::ffi::OsStr) -> anyhow::Result<Vec<(OsString, OsString)>> {
    use std::os::unix::ffi::OsStringExt;
    let bad = || anyhow::anyhow!("the environment passed to the detached wrapper is damaged");
    let s = s.to_str().ok_or_else(bad)?;
    let mut out = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        if item.len() % 2 != 0 {
            return Err(bad());
        }
        let bytes = (0..item.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&item[i..i + 2], 16).map_err(|_| bad()))
            .collect::<anyhow::Result<Vec<u8>>>()?;
        out.push(agent_run_shared::spec::parse_env(&OsString::from_vec(
            bytes,
        ))?);
    }
    Ok(out)
}

/// What [`Launch::fork_keeper`] hands the keeper: its sources (pipes' read ends or the pty's
/// master), the streamer's wake-up (write end), the signals to reset, the go pipe (read end),
/// and what it does at the cap.
struct PendingKeeper {
    /// Each source with its log, opened before the spawn ([`keeper::open_logs`]).
    held: Vec<(keeper::Stream, OwnedFd, std::fs::File)>,
    notify: Option<OwnedFd>,
    reset_signals: u64,
    go: Option<OwnedFd>,
    policy: keeper::Policy,
    pty: bool,
}

/// `agent-run start`.
pub fn start(root: Option<&Path>, mut args: StartArgs) -> anyhow::Result<u8> {
    // The lease token lives in this process's memory (and the detached wrapper's): closed to
    // the workload's user, which cannot read a non-dumpable process's memory or environment.
    let _ = sys::set_non_dumpable();
    // One of the kernel facts that tell the wrapper from its workload is its name.
    let _ = sys::set_comm(c"agent-run");
    let id = RunId::parse(&args.run_id)?;
    if args.detach && args.on_disconnect.is_some() {
        return fail(
            exit::USAGE,
            "--on-disconnect is for a foreground run: a detached run (-d) has no caller to lose",
        );
    }
    agent_run_shared::spec::labels_map(&args.labels)?;
    if let Some(c) = &args.cwd {
        // Checked before anything is created, and made absolute (the record says where).
        let abs = std::path::absolute(c).unwrap_or_else(|_| c.clone());
        match std::fs::metadata(&abs) {
            Ok(m) if m.is_dir() => args.cwd = Some(abs),
            Ok(_) => {
                return fail(
                    exit::USAGE,
                    format!("cannot use --cwd {}: not a directory", abs.display()),
                )
            }
            Err(e) => {
                return fail(
                    exit::USAGE,
                    format!("cannot use --cwd {}: {e}", abs.display()),
                )
            }
        }
    }
    if args.detached_child {
        if let Some(passed) = std::env::var_os(ENV_PASSED) {
            args.env = decode_env(&passed)?;
        }
    }
    // Where the run's cgroup goes, checked before anything is created (a bad --cgroup is 64).
    let parent = cgroup::choose_parent(args.cgroup.as_deref())?;
    crate::phases::mark("cgroup_parent");
    if let (Parent::Procfs(_), None) = (&parent, &args.cgroup) {
        // No cgroup of our own to use: a user with a systemd user manager can have one, a
        // transient scope delegated to it (which also takes the run out of the SSH session's
        // scope, so logind's KillUserProcesses no longer kills it).
        if let Some(scope) = cgroup::user_scope_command(args.run_id.as_str()) {
            let mut cmd = scope;
            cmd.arg(std::env::current_exe()?)
                .args(agent_run_shared::sys::args_os().into_iter().skip(1))
                .env(cgroup::ENV_IN_SCOPE, "1");
            use std::os::unix::process::CommandExt;
            // exec: the caller keeps talking to the same process (its pid, its signals).
            let e = cmd.exec();
            human::say(&format!(
                "cannot start a user scope through systemd-run ({e}); held by /proc scans"
            ));
        }
    }
    let root = Root::open(&resolve_root(root)?, true)?;
    crate::phases::mark("root");
    if args.max_output.is_none() {
        // The root's default, fixed now: a detached wrapper and the record see the same cap.
        match agent_run_shared::output::root_default(&root) {
            Ok(l) => args.max_output = Some(crate::cli::MaxOutput(l)),
            Err(e) => {
                return fail(
                    exit::USAGE,
                    format!("cannot use the default --max-output: {e}"),
                )
            }
        }
    }
    crate::phases::mark("root_default");
    let token = lease_token(&args)?;
    let argv: &[OsString] = &args.command;
    if args.detach {
        // The detached wrapper does everything below, in its own session.
        return detach_parent(&root, &id, argv, &args, token.as_ref());
    }
    let Some(dir) = root.create_run_dir(&id)? else {
        return relaunch(&root, &id, argv, args.quiet, args.detached_child);
    };
    fault::point("after_run_dir");
    crate::phases::mark("run_dir");
    if let Some(t) = token
        .as_ref()
        .filter(|t| t.handed_out && !args.detached_child)
    {
        // The first line: the caller renews with it from another connection.
        human::say(&format!(
            "run {id}: lease token {} (renew: AGENT_RUN_LEASE_TOKEN=<token> agent-run renew {id})",
            t.token.expose()
        ));
    }
    Launch::new(dir, &args, argv, parent, token.map(|t| t.token))?.run(&args)
}

/// A run's lease token, and whether this `start` made it (and so hands it out).
pub struct Token {
    pub token: LeaseToken,
    pub handed_out: bool,
}

/// The lease token of a run with `--lease`: the caller's (`AGENT_RUN_LEASE_TOKEN`), else a new
/// one. None without a lease.
fn lease_token(args: &StartArgs) -> anyhow::Result<Option<Token>> {
    if args.lease.is_none() {
        return Ok(None);
    }
    Ok(Some(match LeaseToken::from_env() {
        Some(t) => Token {
            token: t?,
            handed_out: false,
        },
        None => Token {
            token: LeaseToken::generate()?,
            handed_out: true,
        },
    }))
}

struct Launch {
    dir: RunDir,
    st: Status,
    journal: Journal,
    _lock: RunLock,
    /// The run's lease token (with `--lease`): it signs the first lease, and the supervision
    /// takes no lease it cannot verify with it.
    token: Option<LeaseToken>,
    timings: Timings,
    /// When the workload was spawned (the `--timeout` counts from here).
    started: Option<Instant>,
    /// The run's cgroup, when it has one.
    cgroup: Option<RunCgroup>,
    /// Why an explicitly asked cgroup could not be made (the launch fails with it).
    cgroup_failure: Option<String>,
    /// `--pty`: the wrapper's side of the workload's terminal, once spawned.
    pty: Option<PtyRun>,
    /// The output keeper, once started: never the run's, never signalled.
    keeper: Option<Identity>,
    /// The CPUs to give the keeper back at its go ([`keeper::Keeper::cpus`]).
    keeper_cpus: Option<rustix::thread::CpuSet>,
    /// Its pidfd (our unreaped child: the pid is its own): the final record waits on it, not on
    /// inotify, for the keeper's counts.
    keeper_fd: Option<OwnedFd>,
    /// The read end (non-blocking) of the keeper's done pipe: at EOF once the keeper has
    /// written output.json (see `keeper::keep_run`). None once given up on (bytes in it: not
    /// the keeper's).
    keeper_done: Option<OwnedFd>,
    /// The keeper said it was done, and its exit has not been seen yet: the wrapper waits for
    /// that exit (briefly: it is only being torn down) before its own.
    keeper_exiting: bool,
    /// The write end of the keeper's go pipe (see [`keeper::spawn`]): held from the keeper's
    /// fork until the workload has exec'd, its `running` record is written and the wrapper is
    /// about to sleep in the supervision (or the launch fails, or anything waits for the
    /// keeper), so the keeper's start never competes for a CPU with the exec and the wrapper's
    /// own steps after it. A byte written into it, or its drop, starts the keeper.
    keeper_go: Option<OwnedFd>,
    /// The keeper's sources and descriptors, between their making (before the spawn) and its
    /// fork (after the spawn, see [`Launch::fork_keeper`]).
    pending_keeper: Option<PendingKeeper>,
    /// The heartbeat, first beat done, its thread not yet started: until the keeper is forked
    /// the wrapper has one thread (see [`keeper::spawn`]).
    beat: Option<Beat>,
    /// The deadline this wrapper enforces, which its heartbeat thread publishes.
    published: Arc<Published>,
}

impl Launch {
    fn new(
        dir: RunDir,
        args: &StartArgs,
        argv: &[OsString],
        parent: Parent,
        token: Option<LeaseToken>,
    ) -> anyhow::Result<Launch> {
        // Taken before the first record exists, on the run dir and on `lock`: whoever sees a
        // record and can take the lock knows the wrapper is gone. Close-on-exec, so the
        // workload never holds it.
        let lock = dir.lock();
        if lock.lock_new()? != Taken::Yes {
            return fail(
                exit::SOFTWARE,
                "the new run dir is locked by another process",
            );
        }
        crate::phases::mark("lock");
        // The lock's mtime is our heartbeat: the watchdog bounds our death by it (a lease-less
        // run's orphan grace counts from there). Not being able to beat costs only that bound.
        // Its thread starts once the keeper is forked (the fork needs a single thread).
        let beat = dir.first_beat().ok();
        crate::phases::mark("heartbeat");
        // A `cancel` or the watchdog that found this dir without a record, and took the lock
        // before we did, has declared the launch lost: never run the command after that.
        if dir.read_status().is_ok() {
            return fail(
                exit::SOFTWARE,
                format!(
                    "run {} was declared lost before it could start; not running it",
                    dir.id()
                ),
            );
        }
        crate::phases::mark("lost_check");
        let journal = dir.journal("wrapper");
        crate::phases::mark("journal_open");
        let timings = Timings {
            hup_after: args.hup_after,
            grace: args.grace,
            ..Timings::default()
        };
        let mut st = Status::blank(dir.id().as_str());
        st.set_argv(argv);
        let (cwd, cwd_warning) = match &args.cwd {
            Some(c) => (c.to_string_lossy().into_owned(), None),
            None => working_dir(),
        };
        st.cwd = cwd;
        st.timeout_ms = args.timeout.map(|t| t.as_millis() as u64);
        st.labels = agent_run_shared::spec::labels_map(&args.labels)?;
        for (k, _) in &args.env {
            let name = k.to_string_lossy().into_owned();
            if !st.env.contains(&name) {
                st.env.push(name);
            }
        }
        st.on_disconnect = (!args.detached_child).then(|| args.on_disconnect().as_record());
        st.pty = args.pty;
        st.set_wrapper(
            Pid::this(),
            procfs::stat(Pid::this()).map(|s| s.start_ticks),
        );
        st.lease_token_sha256 = token.as_ref().map(LeaseToken::sha256);
        st.grace_ms = Some(timings.grace.as_millis() as u64);
        st.hup_after_ms = Some(timings.hup_after.as_millis() as u64);
        crate::phases::mark("record_fields");
        st.warnings = agent_run_shared::hostpolicy::launch_warnings(&st.user);
        st.warnings.extend(cwd_warning);
        crate::phases::mark("host_policy");
        // The cgroup exists before the first record names it, so anyone who finds the record
        // can find the run's processes through it, whatever step the wrapper dies at.
        let (mut cgroup, mut cgroup_failure) = (None, None);
        st.containment = Some(Containment::procfs());
        if let Parent::Dir { path, explicit } = &parent {
            let ino = dir.identity().1;
            match RunCgroup::create(path, &cgroup::name_for(dir.id().as_str(), ino)) {
                Ok(cg) => {
                    st.containment = Some(Containment::cgroup(cg.path()));
                    cgroup = Some(cg);
                }
                Err(e) if *explicit => cgroup_failure = Some(e.to_string()),
                Err(e) => st.warnings.push(format!(
                    "no cgroup for this run ({e}): held by /proc scans only"
                )),
            }
        }
        crate::phases::mark("cgroup");
        Ok(Launch {
            dir,
            st,
            journal,
            _lock: lock,
            token,
            timings,
            started: None,
            cgroup,
            cgroup_failure,
            pty: None,
            keeper: None,
            keeper_cpus: None,
            keeper_fd: None,
            keeper_done: None,
            keeper_exiting: false,
            keeper_go: None,
            pending_keeper: None,
            beat,
            published: Arc::default(),
        })
    }

    fn run(mut self, args: &StartArgs) -> anyhow::Result<u8> {
        let dir = self.dir.clone();
        dir.write_status(&self.st)?;
        crate::phases::mark("starting_record");
        fault::point("after_starting");
        let _ = self.journal.event(
            "launch",
            json!({"argv": self.st.argv, "argv_b64": self.st.argv_b64, "cwd": self.st.cwd, "wrapper_pid": self.st.wrapper_pid,
                   "grace_ms": self.st.grace_ms, "hup_after_ms": self.st.hup_after_ms,
                   "lease_s": args.lease.map(|l| l.as_secs_f64()),
                   "timeout_ms": self.st.timeout_ms, "labels": self.st.labels,
                   "env": self.st.env, "on_disconnect": self.st.on_disconnect}),
        );
        for w in &self.st.warnings {
            human::say(&format!("warning: {w}"));
            let _ = self.journal.event("warning", json!({"warning": w}));
        }
        crate::phases::mark("journal_launch");
        if let Some(why) = self.cgroup_failure.take() {
            return Ok(self.launch_failed(exit::SOFTWARE, &why));
        }
        // Every failure from here to the spawn ends in a final `launch_failed` record, never in
        // a `starting` record that only a later cancel or the watchdog could resolve.
        let prepared = (|| -> anyhow::Result<(Option<(Lease, LeaseToken)>, Signals)> {
            let lease = match (args.lease, &self.token) {
                (Some(len), Some(token)) => {
                    let lease = Lease::from_now(len).sign(dir.id().as_str(), token);
                    dir.write_lease(&lease)?;
                    Some((lease, token.clone()))
                }
                _ => None,
            };
            sys::set_child_subreaper().context("cannot become a child subreaper")?;
            // An inherited mask must not say "stopping" or "done" before we are (see
            // sys::mark_stopping, sys::mark_final).
            sys::clear_marks();
            let signals = Signals::register().context("cannot register signal handlers")?;
            signals
                .catch_tstp()
                .context("cannot register the SIGTSTP handler")?;
            if args.pty && args.pty_size.is_none() && !args.detached_child {
                signals
                    .catch_winch()
                    .context("cannot register the SIGWINCH handler")?;
            }
            Ok((lease, signals))
        })();
        let (lease_deadline, signals) = match prepared {
            Ok(p) => p,
            Err(e) => return Ok(self.launch_failed(exit::SOFTWARE, &format!("{e:#}"))),
        };
        crate::phases::mark("lease_signals");
        // The streamer is a thread: it starts after the keeper's fork (in `spawn`), and loses
        // nothing by it (it copies the logs from their start).
        let mut streamer = None;
        let code = match self.spawn(args, &mut streamer) {
            Ok((leader, leader_fd)) => {
                if let Some(p) = &mut self.pty {
                    if !args.detached_child {
                        if let Err(e) = p.copy_stdin() {
                            let w = format!("stdin is not copied to the pty: {e}");
                            human::say(&format!("warning: {w}"));
                            let _ = self.journal.event("warning", json!({"warning": w}));
                        }
                    }
                }
                let limits = Limits {
                    lease: lease_deadline,
                    timeout: args.timeout.zip(self.started).map(|(t, s)| (s + t, t)),
                    on_disconnect: (!args.detached_child).then(|| args.on_disconnect()),
                };
                let scope = self.scope();
                crate::phases::mark("scope");
                // The run is recorded running and we are about to sleep in the supervision's
                // poll: the keeper starts now (see `keeper_go`), where it takes no CPU from us.
                self.release_keeper();
                let outcome = supervise::supervise(
                    &self.dir,
                    &self.journal,
                    &signals,
                    leader_fd.as_ref(),
                    leader,
                    &limits,
                    &mut self.st,
                    &scope,
                    self.pty.as_mut(),
                    &self.published,
                );
                crate::phases::mark("supervise");
                if let Some(p) = &mut self.pty {
                    p.restore_terminal();
                }
                self.finish(leader, outcome, &signals, &limits)?
            }
            Err(code) => code,
        };
        if let Some(s) = streamer {
            s.finish();
        }
        crate::phases::mark("stream_end");
        if args.quiet && !args.detached_child && code != exit::OK && self.st.started_at.is_some() {
            // A caller that did not stream still sees why.
            failure_tail(&dir, self.dir.id().as_str(), &self.st);
        }
        Ok(code)
    }

    /// The run's process scope, as every stop in this wrapper uses it: the keeper descends from
    /// us but is not the run's.
    fn scope(&self) -> RunScope {
        let mut scope = self
            .dir
            .scope_held(&self.st, Some(Pid::this()), self.cgroup.clone())
            .expect("a launched run has a scope");
        scope.exclude.extend(self.keeper);
        scope
    }

    /// The pipes the keeper will drain into the logs: the workload's stdout and stderr (the
    /// write ends), the read ends kept for [`Launch::fork_keeper`]. With `--pty` the keeper's
    /// one source is the pty's master (`pty_master`), copied to stdout.log, and there are no
    /// pipes (None).
    fn prepare_keeper(
        &mut self,
        args: &StartArgs,
        pty_master: Option<OwnedFd>,
        notify: Option<OwnedFd>,
        reset_signals: u64,
        go: Option<OwnedFd>,
    ) -> anyhow::Result<Option<(OwnedFd, OwnedFd)>> {
        let (sources, ends) = match pty_master {
            Some(m) => {
                // stderr.log exists, and stays empty: the pty has one output.
                self.dir.open_append(files::STDERR)?;
                (vec![(keeper::Stream::Stdout, m)], None)
            }
            None => {
                let (out_r, out_w) = keeper::pipe().context("cannot make the stdout pipe")?;
                let (err_r, err_w) = keeper::pipe().context("cannot make the stderr pipe")?;
                (
                    vec![
                        (keeper::Stream::Stdout, out_r),
                        (keeper::Stream::Stderr, err_r),
                    ],
                    Some((out_w, err_w)),
                )
            }
        };
        // The logs are created now, before the workload exists: ours, never files it planted.
        let held = keeper::open_logs(&self.dir, sources)?;
        self.pending_keeper = Some(PendingKeeper {
            held,
            notify,
            reset_signals,
            go,
            policy: keeper::Policy {
                limit: args.max_output.and_then(|m| m.0),
                stop: args.on_output_limit == "stop",
            },
            pty: args.pty,
        });
        Ok(ends)
    }

    /// Fork the keeper of [`Launch::prepare_keeper`]'s sources. After the workload's spawn: a
    /// fork copies the wrapper's page tables, and there that cost runs beside the workload's
    /// exec instead of before it. The workload's first 64 KiB wait in the pipes meanwhile.
    fn fork_keeper(&mut self) -> anyhow::Result<()> {
        let Some(PendingKeeper {
            held,
            notify,
            reset_signals,
            go,
            policy,
            pty,
        }) = self.pending_keeper.take()
        else {
            return Ok(());
        };
        if fault::armed(fault::KEEPER_FORK_FAILS) {
            anyhow::bail!(
                "cannot start the output keeper: fork refused (the keeper_fork_fails knob)"
            );
        }
        let limit = policy.limit;
        let on_limit = if policy.stop { "stop" } else { "keep" };
        // Made after the workload's spawn: it never held either end.
        let (done_r, done_w) = keeper::wake_pipe().ok().unzip();
        let k = keeper::spawn(&self.dir, held, &policy, notify, reset_signals, go, done_w)?;
        self.keeper = Some(k.identity);
        self.keeper_cpus = k.cpus;
        self.keeper_fd = sys::pidfd_open(k.identity.pid).ok();
        self.keeper_done = done_r;
        self.st.output = Some(agent_run_shared::output::Output::pending(
            limit,
            policy.stop,
        ));
        let _ = self.journal.event(
            "keeper_started",
            json!({"pid": k.identity.pid.get(), "start_ticks": k.identity.start_ticks,
                   "limit": limit, "on_limit": on_limit, "pty": pty}),
        );
        Ok(())
    }

    /// Spawn the workload in a new session and verify pid == pgid == sid. On failure the final
    /// record is written here and the exit code returned.
    fn spawn(
        &mut self,
        args: &StartArgs,
        streamer: &mut Option<Streamer>,
    ) -> Result<(Identity, Option<std::os::fd::OwnedFd>), u8> {
        let command = &args.command[..];
        let stdin_null = args.detach_child();
        let dir = self.dir.clone();
        // --pty: the slave is the workload's stdin, stdout, stderr and controlling terminal;
        // the keeper drains the master into stdout.log, the wrapper keeps a duplicate.
        // The caller's terminal is asked for its size only for a pty (three ioctls otherwise
        // spent on every launch).
        let size = args
            .pty_size
            .or_else(|| {
                (args.pty && !args.detached_child)
                    .then(pty::caller_size)
                    .flatten()
            })
            .unwrap_or(pty::DEFAULT_SIZE);
        let opened = match args.pty.then(|| Pty::open(size)).transpose() {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("cannot open a pseudo-terminal for --pty: {e}");
                return Err(self.launch_failed(exit::SOFTWARE, &msg));
            }
        };
        let master = match opened.as_ref().map(|p| p.master.try_clone()).transpose() {
            Ok(m) => m,
            Err(e) => {
                let msg = format!("cannot use the pseudo-terminal: {e}");
                return Err(self.launch_failed(exit::SOFTWARE, &msg));
            }
        };
        // Pipes, drained by the keeper: reopening /dev/stdout by path opens the pipe again,
        // never the log (no O_TRUNC of the log, no offset past the streamer's).
        // The streamer's wake-up, written by the keeper (none: it looks on a timer).
        let (notify_r, notify_w) = match args.quiet {
            true => (None, None),
            false => keeper::wake_pipe().ok().unzip(),
        };
        // The signals the keeper and the workload reset: every handler is in place by now.
        let reset_signals = sys::nondefault_signals();
        // The keeper waits for the workload's exec and the `running` record before its own
        // start (see `keeper_go`).
        let (go_r, go_w) = keeper::pipe().ok().unzip();
        // Our end never blocks: the workload can open the pipe's write end through /proc and
        // fill it, and a full pipe holds the go already.
        if let Some(w) = &go_w {
            let _ = rustix::fs::fcntl_setfl(w, rustix::fs::OFlags::NONBLOCK);
        }
        let ends = match self.prepare_keeper(args, master, notify_w, reset_signals, go_r) {
            Ok(ends) => ends,
            Err(e) => return Err(self.launch_failed(exit::SOFTWARE, &format!("{e:#}"))),
        };
        self.keeper_go = go_w;
        // The streamer's logs, opened before the workload exists (its thread starts after the
        // keeper's fork).
        let bound = args.max_output.and_then(|m| m.0).map(keeper::most_logged);
        let logs = (!args.quiet).then(|| Streamer::open(&dir, bound));
        crate::phases::mark("keeper_prep");
        // The workload's exec, prepared before the clone: its child half only reads memory.
        let env = self.workload_env(args);
        let exec = sys::Exec::new(command, &env, args.cwd.as_deref());
        // stdin: /dev/null for a detached run, else the wrapper's own (the pty's slave with
        // --pty, as stdout and stderr).
        let null = match (&opened, stdin_null) {
            (None, true) => match std::fs::File::open("/dev/null") {
                Ok(f) => Some(OwnedFd::from(f)),
                Err(e) => {
                    drop(ends); // the write ends: the keeper sees EOF at once
                    let msg = format!("cannot open /dev/null for the workload's stdin: {e}");
                    return Err(self.launch_failed(exit::SOFTWARE, &msg));
                }
            },
            _ => None,
        };
        // With a cgroup, the workload is made in it (clone3), or on old kernels moves itself in
        // before its exec: it runs no code of its own outside.
        let cgroup_dir = match self.cgroup.as_ref().map(RunCgroup::open_dir).transpose() {
            Ok(d) => d,
            Err(e) => {
                // The write ends and the slave: the keeper sees EOF (or EIO) at once.
                drop((ends, opened));
                return Err(self.launch_failed(exit::SOFTWARE, &e.to_string()));
            }
        };
        // Root on a mount with nsdelegate: the workload in a cgroup namespace of its own, so
        // the kernel refuses any move of its processes out of the run's cgroup.
        let cgroupns = sys::geteuid() == 0 && cgroup::nsdelegate();
        let io = match (&opened, &ends) {
            (None, Some((out, err))) => sys::ChildIo {
                stdin: null.as_ref().map(|f| f.as_fd()),
                stdout: out.as_fd(),
                stderr: err.as_fd(),
                ctty: None,
                reset_signals,
                cgroupns,
            },
            (None, None) => unreachable!("without a pty the keeper drains two pipes"),
            (Some(p), _) => sys::ChildIo {
                stdin: Some(p.slave.as_fd()),
                stdout: p.slave.as_fd(),
                stderr: p.slave.as_fd(),
                ctty: Some(p.slave.as_fd()),
                reset_signals,
                cgroupns,
            },
        };
        crate::phases::mark("spawn_prep");
        let spawned = exec.map_err(sys::SpawnError::Fork).and_then(|exec| {
            let dir = cgroup_dir.as_ref().map(|d| d.as_fd());
            spawn::spawn_workload(&exec, &io, dir, fault::armed(fault::SPAWN_BY_FORK))
        });
        crate::phases::mark("spawn");
        // Every slave descriptor of ours goes now, and our copies of the pipes' write ends:
        // the keeper's EOF is the workload's last writer, and while we held a slave the master
        // would never read EOF (EIO) nor the session get a hangup.
        drop((ends, null, cgroup_dir));
        // The keeper, whatever the spawn's outcome (a failed launch has its counts too). Still
        // single-threaded: the vfork-style child has exec'd or exited.
        let keeper = self.fork_keeper();
        crate::phases::mark("keeper");
        // The wrapper's threads start only now: the keeper was forked from a single thread.
        // Not being able to beat costs only the bound the watchdog takes from the beats.
        if let Some(beat) = self.beat.take() {
            let _ = beat.start(self.published.clone());
        }
        if let (Some(logs), true) = (logs, keeper.is_ok()) {
            *streamer = Some(logs.start(notify_r));
        }
        crate::phases::mark("threads");
        let master = opened.map(|p| {
            let Pty { master, name, .. } = p;
            (master, name)
        });
        let child = match spawned {
            Ok(c) => c,
            Err(sys::SpawnError::Cgroup(e)) => {
                let cg = self.cgroup.as_ref().map(|c| c.path().display().to_string());
                let msg = format!(
                    "cannot move the workload into its cgroup {}: {e}",
                    cg.unwrap_or_default()
                );
                return Err(self.launch_failed(exit::SOFTWARE, &msg));
            }
            Err(sys::SpawnError::Child(step, e))
                if step == sys::ChildStep::Cwd
                    || args.cwd.as_ref().is_some_and(|c| !c.is_dir()) =>
            {
                // A --cwd the child could not enter (gone since the check, or not searchable by
                // us): the command was never looked at, so neither 127 nor 126.
                let c = args.cwd.as_ref().map(|c| c.display().to_string());
                let msg = format!("cannot change to --cwd {}: {e}", c.unwrap_or_default());
                return Err(self.launch_failed(exit::SOFTWARE, &msg));
            }
            Err(sys::SpawnError::Fork(e) | sys::SpawnError::Child(_, e)) => {
                let code = match e.raw_os_error() {
                    Some(libc::ENOENT | libc::ENOTDIR) => exit::NOT_FOUND,
                    Some(libc::EACCES | libc::ENOEXEC | libc::EISDIR | libc::EPERM) => {
                        exit::CANNOT_EXECUTE
                    }
                    _ => exit::SOFTWARE,
                };
                let what = if code == exit::NOT_FOUND {
                    "command not found"
                } else {
                    "cannot execute"
                };
                let msg = format!("{what}: {}: {e}", command[0].to_string_lossy());
                return Err(self.launch_failed(code, &msg));
            }
        };
        let pid = child.pid;
        if let Some((master, name)) = master {
            self.pty = Some(self.keep_master(master, name, size, args));
        }
        fault::point("after_spawn");
        // Our unreaped child (we reap it ourselves, through waitpid): its pid cannot be reused
        // until we wait for it, so this stat is its own even without a pidfd. The pidfd comes
        // with the clone; after a fork it is opened by pid. One that cannot be had (EMFILE, a
        // kernel before 5.3) costs the event-driven wake-up on its exit, not the run: SIGCHLD
        // still wakes the loop.
        let pidfd = child.pidfd.or_else(|| sys::pidfd_open(pid).ok());
        let Some(stat) = procfs::stat(pid) else {
            // Our unreaped child: the pid is still its own. Journalled like every signal.
            let r = sys::kill(pid, libc::SIGKILL, false);
            let _ = self.journal.event(
                "signal",
                json!({"target": format!("pid:{pid}"), "signal": "KILL", "reason": "launch_failed",
                       "error": r.err().map(|e| e.to_string())}),
            );
            reap::reap_all(Some(pid));
            return Err(self.launch_failed(
                exit::SOFTWARE,
                "the workload could not be read from /proc after its spawn",
            ));
        };
        let leader = stat.identity();
        crate::phases::mark("verify");
        if let Err(e) = keeper {
            // A workload whose output nobody would drain: stopped before it runs on.
            self.st.set_leader(leader);
            let report = self.stop_spawned(pid, "launch_failed");
            self.st.cleanup = Some(report.to_cleanup());
            return Err(self.launch_failed(exit::SOFTWARE, &format!("{e:#}")));
        }
        if stat.pgid != pid.get() || stat.sid != pid.get() {
            let msg = format!(
                "workload pid {pid} is not its own session and group leader (pgid {}, sid {})",
                stat.pgid, stat.sid
            );
            self.st.set_leader(leader);
            let report = self.stop_spawned(pid, "launch_failed");
            self.st.cleanup = Some(report.to_cleanup());
            return Err(self.launch_failed(exit::SOFTWARE, &msg));
        }
        self.st.set_leader(leader);
        self.st.pgid = Some(stat.pgid);
        self.st.sid = Some(stat.sid);
        self.st.started_at = Some(time::rfc3339_now());
        self.started = Some(Instant::now());
        fault::point("before_running");
        // pid == pgid (checked above): one temp file, linked as `pgid`, renamed as `pid`.
        let ids = format!("{pid}\n");
        let written = dir
            .write_same(&[files::PGID, files::PID], ids.as_bytes())
            .and_then(|()| {
                transition(
                    &dir,
                    &mut self.st,
                    State::Running,
                    None,
                    Some(&self.journal),
                )
            });
        crate::phases::mark("running_record");
        if let Err(e) = written {
            // Without a record nobody else can find this run: stop it rather than run blind.
            human::say(&format!("{e}; stopping the workload"));
            self.stop_spawned(pid, "record_failed");
            return Err(exit::SOFTWARE);
        }
        let mut spawn = json!({"pid": pid.get(), "pgid": stat.pgid, "sid": stat.sid, "start_ticks": leader.start_ticks,
                   "cgroup_entry": child.cgroup_entry.map(sys::CgroupEntry::as_str)});
        if let Some((step, errno)) = child.report_ignored {
            // Bytes the exec'd workload wrote into the spawn's report pipe (through /proc).
            spawn["report_ignored"] = json!({"step": format!("{step:?}"), "errno": errno});
        }
        let _ = self.journal.event("spawn", spawn);
        crate::phases::mark("journal_spawn");
        Ok((leader, pidfd))
    }

    /// The workload's environment, as std's `Command` built it: the wrapper's own with the
    /// run's id and dir set and our internal variables removed, then the `-e` pairs; sorted by
    /// name, one value each.
    fn workload_env(&self, args: &StartArgs) -> Vec<(OsString, OsString)> {
        let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        env.insert(ENV_RUN_ID.into(), self.dir.id().as_str().into());
        env.insert(ENV_RUN_DIR.into(), self.dir.path().as_os_str().to_owned());
        for name in [fault::ENV, crate::phases::ENV, ENV_PASSED, ENV_TOKEN] {
            env.remove(std::ffi::OsStr::new(name));
        }
        // -e after ours: the reserved names were refused when the command line was read.
        env.extend(args.env.iter().cloned());
        env.into_iter().collect()
    }

    /// The pty's master after the spawn (the keeper holds its own copy): kept for the window
    /// size and the caller's keystrokes.
    fn keep_master(
        &mut self,
        master: OwnedFd,
        name: String,
        size: pty::Size,
        args: &StartArgs,
    ) -> PtyRun {
        let follow =
            args.pty_size.is_none() && !args.detached_child && pty::caller_size().is_some();
        let _ = self.journal.event(
            "pty",
            json!({"tty": name, "cols": size.cols, "rows": size.rows, "follows_caller": follow}),
        );
        PtyRun::new(master, name, size, follow, self.keeper.map(|k| k.pid))
    }

    /// Stop a workload that was spawned but must not run on (it failed its checks, or its
    /// record could not be written), through the shared routine, and reap it.
    fn stop_spawned(&mut self, pid: Pid, reason: &str) -> agent_run_shared::stop::Report {
        let scope = self.scope();
        let report = stop_run(&scope, &self.timings, reason, Some(&self.journal), None);
        reap::reap_all(Some(pid));
        report
    }

    /// The keeper's go (see `keeper_go`), with every CPU of ours for it again. Once.
    fn release_keeper(&mut self) {
        if let Some(go) = self.keeper_go.take() {
            if let (Some(k), Some(cpus)) = (self.keeper, &self.keeper_cpus) {
                sys::set_cpus_of(k.pid, cpus);
            }
            // A byte, then our end closed: either one lets the keeper go (see keeper.rs). A
            // full pipe (EAGAIN: the workload filled it through /proc) has let it go already.
            let _ = rustix::io::write(&go, b"g");
            drop(go);
        }
    }

    /// Before a final record: give the keeper time to drain and exit (it writes output.json
    /// just before), so `finalize` finds its counts at once. [`agent_run_shared::output::WAIT`],
    /// and when nothing of the run survives (every writer of its pipes is gone, so the keeper is
    /// only draining and fsyncing the logs) also the time the logs' fsync may take on a slow
    /// disk: a second per [`FSYNC_RATE`] bytes logged, at most [`KEEPER_WAIT_MAX`]. A 1 GiB log
    /// took longer to fsync here than the bare wait, and its record went out `complete: false`.
    fn wait_keeper(&mut self, survivors: bool) {
        // A keeper still waiting for its go would never finish.
        self.release_keeper();
        // Done already (a short run's usual case), or no keeper: no look at the logs' sizes.
        if self.keeper_finished(Duration::ZERO) {
            self.note_keeper_lost();
            return;
        }
        let mut wait = agent_run_shared::output::WAIT;
        if !survivors {
            let logged: u64 = [files::STDOUT, files::STDERR]
                .iter()
                .filter_map(|f| self.dir.open_run_file(f).ok())
                .map(|(_, md)| md.len())
                .sum();
            wait += Duration::from_secs(logged / FSYNC_RATE);
            wait = wait.min(KEEPER_WAIT_MAX);
        }
        self.keeper_running_finished(wait);
        self.note_keeper_lost();
    }

    /// [`Launch::keeper_finished`] within `timeout`, looking whether the run has stopped the
    /// keeper (then it gets CONT: [`Launch::continue_stopped_keeper`]) after the first 10 ms
    /// and then every [`KEEPER_STOP_LOOK`]: a keeper that only drains is done before the first
    /// look, so a launch pays no read of its /proc status.
    fn keeper_running_finished(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut slice = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.keeper_finished(left.min(slice)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.continue_stopped_keeper();
            slice = KEEPER_STOP_LOOK;
        }
    }

    /// A keeper that is gone without its counts (the run killed it, or it failed) will never
    /// write them: say so in the journal (`keeper_lost`), and take the logs' sizes now
    /// (`complete: false`) instead of letting `finalize` wait for output.json in vain.
    fn note_keeper_lost(&mut self) {
        let (Some(k), Some(fd)) = (self.keeper, &self.keeper_fd) else {
            return;
        };
        // It said done (output.json is in place): nothing to look at, no syscall.
        if self.keeper_exiting || !sys::readable_by(fd.as_fd(), Instant::now()) {
            return;
        }
        let pending = self.st.output.as_ref().filter(|o| !o.complete);
        let Some(pending) = pending else { return };
        let mut out = agent_run_shared::output::collect(&self.dir, pending, Duration::ZERO);
        out.settled = true;
        // A pty run's keeper that died mid-run was journalled then, as the stop's reason.
        if !out.complete && self.st.reason.as_deref() != Some("keeper_lost") {
            let _ = self.journal.event(
                "keeper_lost",
                json!({"pid": k.pid.get(), "why": "the output keeper exited without its counts (output.json)"}),
            );
        }
        self.st.output = Some(out);
    }

    /// The run can SIGSTOP the keeper (same user): then it drains nothing, the record would
    /// wait out its wait and say `complete: false`, and the keeper would stay stopped after us,
    /// forever. Its wrapper, and only it, sends it CONT, through the pidfd of its own child
    /// (no pid is looked up), and says so in the journal; nothing ever sends it another signal.
    fn continue_stopped_keeper(&self) {
        let (Some(k), Some(fd)) = (self.keeper, &self.keeper_fd) else {
            return;
        };
        if !procfs::stopped_or_stopping(k.pid) {
            return;
        }
        let r = sys::pidfd_send_signal(fd.as_fd(), libc::SIGCONT, false);
        let _ = self.journal.event(
            "signal",
            json!({
                "target": format!("pid:{}", k.pid),
                "signal": "CONT",
                "reason": "keeper_stopped",
                "error": r.err().map(|e| e.to_string()),
            }),
        );
    }

    /// Whether the keeper is done within `timeout`: its done pipe at EOF (output.json is in
    /// place, see `keeper::keep_run`) or the keeper gone (its pidfd). Bytes in the pipe are
    /// not the keeper's (it writes none): someone opened the pipe through /proc; it is
    /// watched no more, and the keeper's exit decides.
    fn keeper_finished(&mut self, timeout: Duration) -> bool {
        let Some(pidfd) = &self.keeper_fd else {
            return true;
        };
        let deadline = Instant::now() + timeout;
        loop {
            let fd = |fd: &OwnedFd| sys::PollFd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let mut fds = [fd(pidfd), fd(self.keeper_done.as_ref().unwrap_or(pidfd))];
            let n = if self.keeper_done.is_some() { 2 } else { 1 };
            let left = deadline.saturating_duration_since(Instant::now());
            // EINTR is zero ready: a look again. Another error ends the wait, as before.
            if sys::poll(&mut fds[..n], Some(left)).is_err() {
                return false;
            }
            if fds[0].revents != 0 {
                self.keeper_exiting = false;
                return true;
            }
            if n == 2 && fds[1].revents != 0 {
                if let Some(done) = &self.keeper_done {
                    match rustix::io::read(done, &mut [0u8; 16]) {
                        Ok(0) => {
                            self.keeper_exiting = true;
                            return true;
                        }
                        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                        _ => self.keeper_done = None,
                    }
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// After the final record: a keeper that said it was done is only being torn down; its
    /// exit is waited for (at most [`KEEPER_EXIT_MAX`]) so that nothing of the launch outlives
    /// the wrapper, as before the done pipe.
    fn await_keeper_exit(&mut self) {
        if !std::mem::take(&mut self.keeper_exiting) {
            return;
        }
        if let Some(pidfd) = &self.keeper_fd {
            sys::readable_by(pidfd.as_fd(), Instant::now() + KEEPER_EXIT_MAX);
        }
    }

    fn launch_failed(&mut self, code: u8, msg: &str) -> u8 {
        human::say(msg);
        self.st.error = Some(msg.replace('\n', " "));
        // The leader never exited: `exit_code` stays null; the launch's own code is recorded.
        self.st.launch_exit_code = Some(code as i32);
        // A launch that failed before the keeper's fork (still single-threaded then) has its
        // zero counts too, as every run has.
        if let Err(e) = self.fork_keeper() {
            human::say(&format!("{e:#}"));
        }
        self.wait_keeper(false);
        // Said in our signal mask first: a final record is believed while we still live only
        // with this mark (see sys::mark_final).
        sys::mark_final();
        if let Err(e) = finalize(
            &self.dir,
            &mut self.st,
            State::LaunchFailed,
            None,
            None,
            Some(&self.journal),
        ) {
            human::say(&e.to_string());
        }
        if let Some(cg) = &self.cgroup {
            agent_run_shared::lifecycle::remove_cgroup(cg, &self.journal);
        }
        self.await_keeper_exit();
        code
    }

    /// After supervision: stop what is left, write the final record, pick the exit code.
    fn finish(
        &mut self,
        leader: Identity,
        outcome: Outcome,
        signals: &Signals,
        limits: &Limits,
    ) -> anyhow::Result<u8> {
        let dir = self.dir.clone();
        let scope = self.scope();
        let mut signals_esc = signals;
        // The stop comes first: a record that cannot be written (a full disk) is reported, but
        // never keeps the run's processes alive.
        let mut stop = |st: &mut Status, reason: &str| {
            // First, the kernel fact a `cancel` trusts over the record (which the run can
            // write): this wrapper is stopping, so a TERM now would cut the grace short.
            sys::mark_stopping();
            if let Err(e) = transition(
                &dir,
                st,
                State::Cancelling,
                Some(reason),
                Some(&self.journal),
            ) {
                human::say(&format!("{e}; stopping the run anyway"));
            }
            stop_run(
                &scope,
                &self.timings,
                reason,
                Some(&self.journal),
                Some(&mut signals_esc),
            )
        };
        let (state, reason, report, leader_status) = match outcome {
            Outcome::LeaderExited(ws) => {
                let (_, children_left) = reap::reap_all(None);
                // The keeper is our child and outlives the leader until the pipes' last writer
                // is gone: it is no leftover, but any other child of ours is (we are a
                // subreaper: a pid hopper's live generation is always one of our children, even
                // while it dodges a /proc scan). The kernel lists them in
                // /proc/self/task/*/children; where it cannot be read, `discover` below decides.
                let children_left = match self.keeper {
                    None => children_left,
                    Some(k) => children_left && procfs::children_besides(k.pid).unwrap_or(false),
                };
                crate::phases::mark("reap");
                // The leader's exit ends the run; whatever of the run remains is stopped by the
                // same routine as a cancel: our children (double-forked daemons come back to
                // us), the cgroup's members, and processes elsewhere that carry the marker.
                // A cgroup just seen unpopulated has no member to list: the marker look runs
                // without it (no second read of the cgroup's files on every launch).
                let leftovers = children_left
                    || scope.cgroup.as_ref().is_some_and(|c| c.populated())
                    || !discover(
                        &RunScope {
                            cgroup: None,
                            ..scope.clone()
                        },
                        Depth::WithMarker,
                        &HashSet::new(),
                    )
                    .is_empty();
                crate::phases::mark("leftovers");
                let report = leftovers.then(|| {
                    let r = stop(&mut self.st, "leader_exited");
                    reap::reap_all(None);
                    r
                });
                (State::Finished, None, report, Some(ws))
            }
            Outcome::Stop(reason) => {
                // Said before the TERM goes out (a dead stderr is no reason to wait).
                human::say(&stop_message(self.dir.id().as_str(), &reason, limits));
                let report = stop(&mut self.st, &reason);
                let (ws, _) = reap::reap_all(Some(leader.pid));
                // The stop may have reaped the leader itself (it reaps the dead children it
                // finds).
                let ws = ws.or(report.leader_exit);
                (State::Cancelled, Some(reason), Some(report), ws)
            }
        };
        let stopped = state == State::Cancelled;
        match leader_status {
            Some(WaitStatus::Exited(c)) => self.st.exit_code = Some(c),
            Some(WaitStatus::Signaled(s)) => self.st.term_signal = Some(Sig::from_number(s).name()),
            None => {}
        }
        if let Some(cg) = &self.cgroup {
            self.st.resources = Some(cg.resources());
        }
        crate::phases::mark("resources");
        self.wait_keeper(report.as_ref().is_some_and(|r| !r.survivors.is_empty()));
        crate::phases::mark("keeper_wait");
        if report.is_none() {
            // Nothing was left when the leader exited: the cgroup said so, or (a subreaper with
            // no child left but the keeper) the tree did.
            self.st.proof = Some(match self.cgroup {
                Some(_) => Proof::CgroupEmpty,
                None => Proof::TreeWalk,
            });
        }
        // Said in our signal mask first: a final record is believed while we still live only
        // with this mark (see sys::mark_final).
        sys::mark_final();
        let written = finalize(
            &dir,
            &mut self.st,
            state,
            reason.as_deref(),
            report.as_ref(),
            Some(&self.journal),
        );
        crate::phases::mark("final_record");
        // The cgroup goes after the final record (a cgroup that still holds a survivor stays,
        // and the record says unknown).
        if let Some(cg) = &self.cgroup {
            agent_run_shared::lifecycle::remove_cgroup(cg, &self.journal);
        }
        crate::phases::mark("cgroup_rm");
        self.await_keeper_exit();
        crate::phases::mark("keeper_exit");
        if let Err(e) = written {
            let left = report.as_ref().map_or(0, |r| r.survivors.len());
            return fail(
                exit::SOFTWARE,
                format!(
                    "the run ended ({}, {left} survivors) but its final record could not be written: {e}",
                    self.st.state.as_str()
                ),
            );
        }
        if stopped {
            let colour = human::colour_for(human::stderr_is_terminal());
            human::say(&human::final_line(&self.st, colour));
        }
        Ok(exit::for_record(&self.st).unwrap_or(exit::SOFTWARE))
    }
}

/// The slowest log fsync [`Launch::wait_keeper`] allows for: 20 MB/s (this project's disk
/// under contention wrote 250 MB/s).
const FSYNC_RATE: u64 = 20_000_000;
/// The longest [`Launch::wait_keeper`] waits for a keeper that is only fsyncing.
const KEEPER_WAIT_MAX: Duration = Duration::from_secs(60);
/// How often a wait for the keeper looks whether the run has stopped it (SIGSTOP).
const KEEPER_STOP_LOOK: Duration = Duration::from_millis(100);
/// The longest [`Launch::await_keeper_exit`] waits for a keeper that said it was done.
const KEEPER_EXIT_MAX: Duration = Duration::from_secs(2);

/// How many lines of stderr a `--quiet` run that failed prints.
const FAILURE_TAIL: usize = 10;

/// For a `--quiet` foreground run that ended non-zero: the last lines of its stderr, under a
/// header that says where the whole log is.
fn failure_tail(dir: &RunDir, id: &str, st: &Status) {
    let path = dir.file(files::STDERR);
    let lines = crate::stream::last_lines(dir, files::STDERR, FAILURE_TAIL);
    let how = match (st.exit_code, &st.term_signal, &st.reason) {
        (Some(c), _, _) => format!("exited {c}"),
        (_, Some(s), _) => format!("was killed by SIG{s}"),
        (_, _, Some(r)) => format!("ended {} ({r})", st.state.as_str()),
        _ => format!("ended {}", st.state.as_str()),
    };
    let msg = if lines.is_empty() {
        format!("run {id} {how}; its stderr is empty ({})", path.display())
    } else {
        let n = lines.iter().filter(|&&b| b == b'\n').count().max(1);
        format!(
            "run {id} {how}; the last {n} lines of its stderr (all of it: {}):",
            path.display()
        )
    };
    human::say(&msg);
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(&lines);
    if !lines.is_empty() && !lines.ends_with(b"\n") {
        let _ = writeln!(err);
    }
}

/// What a foreground run says on stderr when it is stopped, before the TERM goes out.
fn stop_message(id: &str, reason: &str, limits: &Limits) -> String {
    match reason {
        r if r.starts_with("signal:") => {
            let sig = &r["signal:".len()..];
            format!("{sig}: stopping run {id} (TERM sent; again to KILL)")
        }
        "cancel_request" => {
            format!("cancel requested from another connection: stopping run {id} (TERM sent)")
        }
        "lease_expired" => format!(
            "the lease expired without a renewal: stopping run {id} (TERM sent; again to KILL)"
        ),
        "timeout" => format!(
            "timeout of {} reached: stopping run {id} (TERM sent; again to KILL)",
            limits
                .timeout
                .map_or("?".into(), |(_, t)| human::duration(t.as_secs_f64()))
        ),
        "caller_lost" => format!("the caller went away: stopping run {id} (TERM sent)"),
        "keeper_lost" => format!(
            "the output keeper died, so the pty has no reader: stopping run {id} (TERM sent)"
        ),
        other => format!("{other}: stopping run {id} (TERM sent)"),
    }
}

/// The working directory for the record, and a warning when it is not a plain path. A directory
/// deleted before the launch has no path (getcwd fails): the record keeps what the kernel says,
/// `/proc/self/cwd`'s `"/old/path (deleted)"`, never an empty string, and the run gets a warning
/// (the workload runs in that deleted directory, as it would from a shell).
fn working_dir() -> (String, Option<String>) {
    match std::env::current_dir() {
        Ok(p) => (p.to_string_lossy().into_owned(), None),
        Err(e) => {
            let cwd = match std::fs::read_link("/proc/self/cwd") {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e2) => format!("(unknown: {e}; /proc/self/cwd: {e2})"),
            };
            let why = format!("the working directory has no path ({e}); recorded as {cwd:?}");
            (cwd, Some(why))
        }
    }
}

impl StartArgs {
    /// The workload reads /dev/null when detached.
    fn detach_child(&self) -> bool {
        self.detached_child
    }

    /// The `--on-disconnect` policy, or its default for this run.
    fn on_disconnect(&self) -> OnDisconnect {
        self.on_disconnect
            .unwrap_or_else(|| OnDisconnect::default_for(self.lease.is_some()))
    }
}

/// A relaunch must ask for the command the run id already stands for (65 otherwise).
fn same_command(id: &RunId, st: &Status, argv: &[OsString]) -> anyhow::Result<()> {
    // A final record with no command is a launch declared lost before anyone knew its command:
    // it stands for no command in particular, and replays its outcome (unknown) for any.
    // Compared byte for byte: two commands that differ only in bytes that are not UTF-8 are
    // two commands.
    if st.same_argv(argv) || (st.state.is_final() && st.argv.is_empty()) {
        return Ok(());
    }
    fail(
        exit::DATA_MISMATCH,
        format!(
            "run {id} exists with a different command: {:?} (asked for {:?})",
            st.argv,
            argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()
        ),
    )
}

/// Relaunch of an existing run id: never runs the command twice. In the foreground: a final run
/// prints its record on stderr and exits as it did; an active one is attached to. The wrapper
/// that `--detach` started (`detached`) found the id taken by a launch racing it: it leaves the
/// answer to its parent, which reads the record, and returns at once.
pub fn relaunch(
    root: &Root,
    id: &RunId,
    argv: &[OsString],
    quiet: bool,
    detached: bool,
) -> anyhow::Result<u8> {
    let dir = root.open_run_dir(id)?;
    let st = runs::read_record_waiting(&dir, Duration::from_secs(10))?;
    same_command(id, &st, argv)?;
    if detached {
        return Ok(exit::for_record(&st).unwrap_or(exit::OK));
    }
    if st.state.is_final() {
        // A person sees what happened in one line; a program gets the record.
        if human::stderr_is_terminal() {
            let line = human::final_line(&st, human::colour_for(true));
            eprintln!("agent-run: {line}; not running it again");
        } else {
            eprint!("{}", runs::record_json(&dir, &st));
        }
        return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
    }
    eprintln!(
        "agent-run: run {id} is already {}; attaching",
        st.state.as_str()
    );
    logs::claim_lost_run(&dir);
    if quiet {
        let st = wait_final(&dir, None)?;
        return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
    }
    logs::follow_to_end(&dir, (0, 0))
}

/// A duration as the command line parses it, without rounding (`1.5ms`, `90000ms`).
pub fn duration_arg(d: Duration) -> String {
    format!("{}ms", d.as_secs_f64() * 1000.0)
}

/// `start --detach`: start a wrapper of our own in its own session with stdio on /dev/null, and
/// return once its record says `running` (or the run is already final), printing one JSON line
/// `{"run_id","run_dir","pid","pgid","state"}` on stdout and nothing else there.
///
/// The same for a run id that exists (a relaunch, which never runs the command twice and never
/// attaches): the line with the run's current state; the exit code is the run's own when it is
/// final (as `wait` would give), else 0. A different command is refused (65). A launch failure
/// also prints its error on stderr.
pub fn detach_parent(
    root: &Root,
    id: &RunId,
    argv: &[OsString],
    args: &StartArgs,
    token: Option<&Token>,
) -> anyhow::Result<u8> {
    let path = root.run_dir_path(id);
    // An existing run needs no wrapper of ours (it would only find the id taken).
    let mut dir = None;
    let mut child = match root.open_run_dir(id) {
        Ok(d) => {
            dir = Some(d);
            None
        }
        Err(Error::Missing { .. }) => Some(spawn_detached(root, id, args, token)?),
        Err(e) => return Err(e.into()),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The detached wrapper makes the dir: held from the first look that finds it.
        if dir.is_none() {
            dir = root.open_run_dir(id).ok();
        }
        let read = || dir.as_ref().and_then(|d| d.read_status().ok());
        let st: Option<Status> = read();
        if let Some(st) = st.filter(|s| s.state != State::Starting) {
            // The id may be an earlier run's (a relaunch, or a launch that raced ours).
            same_command(id, &st, argv)?;
            let ours = child
                .as_ref()
                .is_some_and(|c| st.wrapper_pid == Some(c.id() as i32));
            // The token goes to the one who started the run, never to a relaunch's caller.
            let token = token.filter(|_| ours).map(|t| t.token.expose());
            let line = json!({
                "run_id": st.run_id, "run_dir": path, "pid": st.pid, "pgid": st.pgid,
                "state": st.state.as_str(), "lease_token": token,
            });
            println!("{line}");
            if st.state.is_final() {
                if let (true, Some(e)) = (ours, &st.error) {
                    eprintln!("agent-run: {e}");
                }
                return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
            }
            return Ok(exit::OK);
        }
        if let Some(status) = child.as_mut().map(|c| c.try_wait()).transpose()?.flatten() {
            if read().is_some() {
                // It found the id taken by a launch racing ours: that launch's record decides.
                child = None;
                continue;
            }
            // It ended before the run was running: refused input or a setup failure.
            return fail(
                status.code().map_or(exit::SOFTWARE, |c| c as u8),
                format!("the detached wrapper for run {id} exited before the run started"),
            );
        }
        if Instant::now() >= deadline {
            return fail(exit::TEMPFAIL, format!("run {id} did not start within 30s"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The wrapper of a detached run: this program, in its own session, stdio on /dev/null.
fn spawn_detached(
    root: &Root,
    id: &RunId,
    args: &StartArgs,
    token: Option<&Token>,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--root")
        .arg(root.path())
        .arg("start")
        .arg("--quiet")
        .arg("--detached-child")
        .arg("--grace")
        .arg(duration_arg(args.grace))
        .arg("--hup-after")
        .arg(duration_arg(args.hup_after));
    if let Some(l) = args.lease {
        cmd.arg("--lease").arg(duration_arg(l));
    }
    if let Some(t) = args.timeout {
        cmd.arg("--timeout").arg(duration_arg(t));
    }
    // `--opt=value`, one word: a value that begins with '-' is still a value.
    if let Some(c) = &args.cwd {
        let mut word = std::ffi::OsString::from("--cwd=");
        word.push(c);
        cmd.arg(word);
    }
    if let Some(c) = &args.cgroup {
        cmd.arg("--cgroup").arg(c);
    }
    if let Some(m) = args.max_output {
        cmd.arg("--max-output")
            .arg(m.0.map_or("none".to_string(), |b| b.to_string()));
    }
    cmd.arg("--on-output-limit").arg(&args.on_output_limit);
    for (k, v) in &args.labels {
        cmd.arg(format!("--label={k}={v}"));
    }
    if args.pty {
        // The detached wrapper has no terminal: the size is the caller's, taken now.
        let size = args
            .pty_size
            .or_else(pty::caller_size)
            .unwrap_or(pty::DEFAULT_SIZE);
        cmd.arg("--pty").arg("--pty-size").arg(size.to_string());
    }
    // The values of -e may be secrets: never on a command line (/proc/PID/cmdline is world
    // readable), but in the environment of our own detached wrapper, which passes them on.
    // The lease token likewise: in the environment of our detached wrapper, which drops it
    // from the workload's.
    match token {
        Some(t) => cmd.env(ENV_TOKEN, t.token.expose()),
        None => cmd.env_remove(ENV_TOKEN),
    };
    if args.env.is_empty() {
        cmd.env_remove(ENV_PASSED);
    } else {
        let passed = encode_env(&args.env);
        cmd.env(ENV_PASSED, passed);
    }
    cmd.arg(id.as_str()).arg("--").args(&args.command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    sys::spawn_in_new_session(&mut cmd);
    Ok(cmd.spawn()?)
}
