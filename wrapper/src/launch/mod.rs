//! `agent-run start`: spec -> run dir -> spawn -> supervise -> stop -> final record -> exit code,
//! with `--detach` (a wrapper of our own in its own session, the caller gets one JSON line) and
//! the relaunch of an id that exists (which never runs the command twice).
//!
//! The run dir is created with one `mkdir`; its lock is taken before the first record appears, so
//! anyone who sees a record and can take the lock knows the wrapper is gone. The workload is made
//! in the run's cgroup and starts in a new session ([`agent_run_shared::spawn::spawn_workload`]: clone3, setsid
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
use agent_run_shared::pid::{ClaimedPid, Identity, Pid};
use agent_run_shared::procset::{discover, Depth, RunScope};
use agent_run_shared::pty::{self, Pty};
use agent_run_shared::reap;
use agent_run_shared::reason::Reason;
use agent_run_shared::record::{Containment, Proof, State, Status};
use agent_run_shared::root::{resolve_root, Root};
use agent_run_shared::run_dir::{files, RunDir};
use agent_run_shared::spec::OnDisconnect;
use agent_run_shared::stop::{stop_run, Sig, Timings};
use agent_run_shared::sys::{self, WaitStatus};
use agent_run_shared::{fault, procfs, time, Error, ENV_RUN_DIR, ENV_RUN_ID};
use anyhow::Context;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod detach;
mod finish;
mod keeper_link;
mod prepare;
mod relaunch;
mod spawn;

use detach::{decode_env, detach_parent};
pub use detach::{duration_arg, ENV_PASSED};
use finish::failure_tail;
use keeper_link::KeeperLink;
pub use relaunch::relaunch;

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
                .args(std::env::args_os().skip(1))
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
        return relaunch(&root, &id, argv, args.quiet, args.detached_child, args.json);
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
pub(super) fn lease_token(args: &StartArgs) -> anyhow::Result<Option<Token>> {
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
    /// The output keeper: its sources before the spawn, then the forked keeper.
    keeper: KeeperLink,
    /// The heartbeat's first beat and the deadline it publishes.
    heartbeat: Heartbeat,
}

/// The wrapper's heartbeat: the lock's mtime, beaten by a thread of its own.
struct Heartbeat {
    /// The first beat done, its thread not yet started: until the keeper is forked the
    /// wrapper has one thread (see [`keeper::spawn`]).
    beat: Option<Beat>,
    /// The deadline this wrapper enforces, which its heartbeat thread publishes.
    published: Arc<Published>,
}

impl Launch {
    /// The launch, step by step (the caller made the run dir and this value: the lock, the
    /// first beat, the record's fields, the cgroup). Every failure after step 1 ends in a final
    /// `launch_failed` record, never in a `starting` record that only a later cancel or the
    /// watchdog could resolve.
    fn run(mut self, args: &StartArgs) -> anyhow::Result<u8> {
        // 1. The `starting` record, and the launch in the journal.
        self.record_starting(args)?;
        if let Some(why) = self.cgroup_failure.take() {
            return Ok(self.launch_failed(exit::SOFTWARE, &why));
        }
        // 2. The lease, the subreaper, the signal handlers.
        let (lease, signals) = match self.prepare(args) {
            Ok(p) => p,
            Err(e) => return Ok(self.launch_failed(exit::SOFTWARE, &format!("{e:#}"))),
        };
        crate::phases::mark("lease_signals");
        // 3. The workload's spawn, the keeper's fork, the threads, the `running` record. The
        //    streamer is a thread started there, after the keeper's fork.
        let mut streamer = None;
        let code = match self.spawn(args, &mut streamer) {
            Ok((leader, leader_fd)) => {
                // 4. Supervise until the leader exits or a stop is asked for.
                let limits = self.limits(args, lease);
                let outcome = self.supervise(args, &signals, leader, leader_fd, &limits);
                // 5. Stop what is left, write the final record, pick the exit code.
                self.finish(leader, outcome, &signals, &limits)?
            }
            Err(code) => code,
        };
        // 6. The streamer's last copy; a `--quiet` caller that did not stream still sees why.
        if let Some(s) = streamer {
            s.finish();
        }
        crate::phases::mark("stream_end");
        if args.quiet && !args.detached_child && code != exit::OK && self.st.started_at.is_some() {
            failure_tail(&self.dir, self.dir.id().as_str(), &self.st);
        }
        Ok(code)
    }

    /// What the supervision enforces: the lease, the timeout from the spawn, the caller.
    fn limits(&self, args: &StartArgs, lease: Option<(Lease, LeaseToken)>) -> Limits {
        Limits {
            lease,
            timeout: args.timeout.zip(self.started).map(|(t, s)| (s + t, t)),
            on_disconnect: (!args.detached_child).then(|| args.on_disconnect()),
        }
    }

    /// The caller's keystrokes to the pty, then [`supervise::supervise`] until the leader
    /// exits or a stop is asked for.
    fn supervise(
        &mut self,
        args: &StartArgs,
        signals: &Signals,
        leader: Identity,
        leader_fd: Option<OwnedFd>,
        limits: &Limits,
    ) -> Outcome {
        if let Some(p) = &mut self.pty {
            if !args.detached_child {
                if let Err(e) = p.copy_stdin() {
                    let w = format!("stdin is not copied to the pty: {e}");
                    human::say(&format!("warning: {w}"));
                    let _ = self.journal.event("warning", json!({"warning": w}));
                }
            }
        }
        let scope = self.scope();
        crate::phases::mark("scope");
        let outcome = supervise::supervise(
            &self.dir,
            &self.journal,
            signals,
            leader_fd.as_ref(),
            leader,
            limits,
            &mut self.st,
            &scope,
            self.pty.as_mut(),
            &self.heartbeat.published,
        );
        crate::phases::mark("supervise");
        if let Some(p) = &mut self.pty {
            p.restore_terminal();
        }
        outcome
    }

    /// The run's process scope, as every stop in this wrapper uses it: the keeper descends from
    /// us but is not the run's.
    fn scope(&self) -> RunScope {
        let mut scope = self
            .dir
            .scope_held(&self.st, Some(Pid::this()), self.cgroup.clone())
            .expect("a launched run has a scope");
        scope.exclude.extend(self.keeper.forked);
        scope
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
