//! The workload's spawn: a new session, in the run's cgroup, verified its own session and
//! group leader, then recorded `running`.

use super::*;
use agent_run_shared::pid::{raw, ClaimedPid};

/// The descriptors the workload's child takes, besides the pty: the pipes' write ends (None
/// with `--pty`), /dev/null as stdin (a detached run without a pty) and the run's cgroup.
struct ChildFds {
    ends: Option<(OwnedFd, OwnedFd)>,
    null: Option<OwnedFd>,
    cgroup_dir: Option<std::fs::File>,
}

/// The pty of `--pty` (None without), a copy of its master for the keeper, and its size.
type OpenedPty = (Option<Pty>, Option<OwnedFd>, pty::Size);

impl Launch {
    /// Spawn the workload in a new session and verify pid == pgid == sid. On failure the final
    /// record is written here and the exit code returned.
    pub(super) fn spawn(
        &mut self,
        args: &StartArgs,
        streamer: &mut Option<Streamer>,
    ) -> Result<(Identity, Option<std::os::fd::OwnedFd>), u8> {
        // 1. The pty, the keeper's sources and the streamer's logs, before the workload exists.
        let (opened, master, size) = self.open_pty(args)?;
        // Pipes, drained by the keeper: reopening /dev/stdout by path opens the pipe again,
        // never the log (no O_TRUNC of the log, no offset past the streamer's).
        // The streamer's wake-up, written by the keeper (none: it looks on a timer).
        let (notify_r, notify_w) = match args.quiet {
            true => (None, None),
            false => keeper::wake_pipe().ok().unzip(),
        };
        // The signals the keeper and the workload reset: every handler is in place by now.
        let reset_signals = sys::nondefault_signals();
        let ends = match self.prepare_keeper(args, master, notify_w, reset_signals) {
            Ok(ends) => ends,
            Err(e) => return Err(self.launch_failed(exit::SOFTWARE, &format!("{e:#}"))),
        };
        // The streamer's logs, opened before the workload exists (its thread starts after the
        // keeper's fork).
        let bound = args.max_output.and_then(|m| m.0).map(keeper::most_logged);
        let logs = (!args.quiet).then(|| Streamer::open(&self.dir, bound));
        crate::phases::mark("keeper_prep");
        // 2. The workload's exec and descriptors, prepared before the clone: its child half
        //    only reads memory.
        let env = self.workload_env(args);
        let exec = sys::Exec::new(&args.command, &env, args.cwd.as_deref());
        let fds = match self.child_fds(args, opened.is_some(), ends) {
            Ok(fds) => fds,
            Err(msg) => {
                // The slave too: the keeper sees EOF (or EIO) at once.
                drop(opened);
                return Err(self.launch_failed(exit::SOFTWARE, &msg));
            }
        };
        // Root on a mount with nsdelegate: the workload in a cgroup namespace of its own, so
        // the kernel refuses any move of its processes out of the run's cgroup.
        let cgroupns = sys::geteuid() == 0 && cgroup::nsdelegate();
        let io = child_io(opened.as_ref(), &fds, reset_signals, cgroupns);
        crate::phases::mark("spawn_prep");
        // 3. The spawn.
        let spawned = exec.map_err(sys::SpawnError::Fork).and_then(|exec| {
            let dir = fds.cgroup_dir.as_ref().map(|d| d.as_fd());
            agent_run_shared::spawn::spawn_workload(
                &exec,
                &io,
                dir,
                fault::armed(fault::SPAWN_BY_FORK),
            )
        });
        crate::phases::mark("spawn");
        // Every slave descriptor of ours goes now, and our copies of the pipes' write ends:
        // the keeper's EOF is the workload's last writer, and while we held a slave the master
        // would never read EOF (EIO) nor the session get a hangup.
        drop(fds);
        // 4. The keeper and the threads, whatever the spawn's outcome.
        let keeper = self.start_keeper_and_threads(logs, notify_r, streamer);
        let master = opened.map(|p| {
            let Pty { master, name, .. } = p;
            (master, name)
        });
        let mut child = spawned.map_err(|e| self.spawn_failed(args, e))?;
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
        let pidfd = child.pidfd.take().or_else(|| sys::pidfd_open(pid).ok());
        // 5. The checks, the `running` record, the spawn in the journal.
        let stat = self.verify_leader(pid, keeper)?;
        self.record_running(&stat)?;
        self.journal_spawn(&child, &stat);
        Ok((stat.identity(), pidfd))
    }

    /// `--pty`: the slave is the workload's stdin, stdout, stderr and controlling terminal;
    /// the keeper drains the master into stdout.log, the wrapper keeps a duplicate. The
    /// caller's terminal is asked for its size only for a pty (three ioctls otherwise spent on
    /// every launch).
    fn open_pty(&mut self, args: &StartArgs) -> Result<OpenedPty, u8> {
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
        Ok((opened, master, size))
    }

    /// The workload's stdin (/dev/null for a detached run, else the wrapper's own: the pty's
    /// slave with --pty) and its cgroup's dir. With a cgroup, the workload is made in it
    /// (clone3), or on old kernels moves itself in before its exec: it runs no code of its own
    /// outside. On failure the write ends are dropped here: the keeper sees EOF at once.
    fn child_fds(
        &self,
        args: &StartArgs,
        pty: bool,
        ends: Option<(OwnedFd, OwnedFd)>,
    ) -> Result<ChildFds, String> {
        let null = match (pty, args.detach_child()) {
            (false, true) => match std::fs::File::open("/dev/null") {
                Ok(f) => Some(OwnedFd::from(f)),
                Err(e) => {
                    return Err(format!(
                        "cannot open /dev/null for the workload's stdin: {e}"
                    ))
                }
            },
            _ => None,
        };
        let cgroup_dir = self
            .cgroup
            .as_ref()
            .map(RunCgroup::open_dir)
            .transpose()
            .map_err(|e| e.to_string())?;
        Ok(ChildFds {
            ends,
            null,
            cgroup_dir,
        })
    }

    /// The keeper's fork, still single-threaded (the vfork-style child has exec'd or exited),
    /// and only then the wrapper's threads: the heartbeat and the streamer. Not being able to
    /// beat costs only the bound the watchdog takes from the beats. A failed launch has its
    /// keeper too, for its counts.
    fn start_keeper_and_threads(
        &mut self,
        logs: Option<crate::stream::OpenedLogs>,
        notify_r: Option<OwnedFd>,
        streamer: &mut Option<Streamer>,
    ) -> anyhow::Result<()> {
        let keeper = self.fork_keeper();
        crate::phases::mark("keeper");
        if let Some(beat) = self.heartbeat.beat.take() {
            let _ = beat.start(self.heartbeat.published.clone());
        }
        if let (Some(logs), true) = (logs, keeper.is_ok()) {
            *streamer = Some(logs.start(notify_r));
        }
        crate::phases::mark("threads");
        keeper
    }

    /// A spawn that failed: the final record says why, with the exit code a shell would give.
    fn spawn_failed(&mut self, args: &StartArgs, e: sys::SpawnError) -> u8 {
        match e {
            sys::SpawnError::Cgroup(e) => {
                let cg = self.cgroup.as_ref().map(|c| c.path().display().to_string());
                let msg = format!(
                    "cannot move the workload into its cgroup {}: {e}",
                    cg.unwrap_or_default()
                );
                self.launch_failed(exit::SOFTWARE, &msg)
            }
            sys::SpawnError::Child(step, e)
                if step == sys::ChildStep::Cwd
                    || args.cwd.as_ref().is_some_and(|c| !c.is_dir()) =>
            {
                // A --cwd the child could not enter (gone since the check, or not searchable by
                // us): the command was never looked at, so neither 127 nor 126.
                let c = args.cwd.as_ref().map(|c| c.display().to_string());
                let msg = format!("cannot change to --cwd {}: {e}", c.unwrap_or_default());
                self.launch_failed(exit::SOFTWARE, &msg)
            }
            sys::SpawnError::Fork(e) | sys::SpawnError::Child(_, e) => {
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
                let msg = format!("{what}: {}: {e}", args.command[0].to_string_lossy());
                self.launch_failed(code, &msg)
            }
        }
    }

    /// The spawned workload read from /proc, with a keeper, its own session and group leader;
    /// else it is stopped before it runs on.
    fn verify_leader(&mut self, pid: Pid, keeper: anyhow::Result<()>) -> Result<procfs::Stat, u8> {
        let Some(stat) = procfs::stat(pid) else {
            // Our unreaped child: the pid is still its own. Journalled like every signal.
            let r = sys::kill_process(pid, Sig::Kill);
            let _ = self.journal.event(
                "signal",
                json!({"target": format!("pid:{pid}"), "signal": "KILL", "reason": Reason::LaunchFailed,
                       "error": r.err().map(|e| e.to_string())}),
            );
            reap::reap_all(Some(pid));
            return Err(self.launch_failed(
                exit::SOFTWARE,
                "the workload could not be read from /proc after its spawn",
            ));
        };
        crate::phases::mark("verify");
        let failed = match keeper {
            // A workload whose output nobody would drain: stopped before it runs on.
            Err(e) => Some(format!("{e:#}")),
            Ok(()) if stat.pgid != Some(pid) || stat.sid != Some(pid) => Some(format!(
                "workload pid {pid} is not its own session and group leader (pgid {}, sid {})",
                raw(stat.pgid),
                raw(stat.sid)
            )),
            Ok(()) => None,
        };
        self.st.set_leader(stat.identity());
        if let Some(msg) = failed {
            let report = self.stop_spawned(pid, Reason::LaunchFailed);
            self.st.cleanup = Some(report.to_cleanup());
            return Err(self.launch_failed(exit::SOFTWARE, &msg));
        }
        Ok(stat)
    }

    /// The `running` record, with the `pid` and `pgid` files. Without it nobody else can find
    /// this run: the workload is stopped rather than run blind.
    fn record_running(&mut self, stat: &procfs::Stat) -> Result<(), u8> {
        let pid = stat.identity().pid;
        // pid == pgid == sid (checked before).
        self.st.pgid = stat.pgid.map(ClaimedPid::from);
        self.st.sid = stat.sid.map(ClaimedPid::from);
        self.st.started_at = Some(time::rfc3339_now());
        self.started = Some(Instant::now());
        fault::point("before_running");
        // pid == pgid (checked before): one temp file, linked as `pgid`, renamed as `pid`.
        let ids = format!("{pid}\n");
        let written = self
            .dir
            .write_same(&[files::PGID, files::PID], ids.as_bytes())
            .and_then(|()| {
                transition(
                    &self.dir,
                    &mut self.st,
                    State::Running,
                    None,
                    Some(&self.journal),
                )
            });
        crate::phases::mark("running_record");
        if let Err(e) = written {
            human::say(&format!("{e}; stopping the workload"));
            self.stop_spawned(pid, Reason::RecordFailed);
            return Err(exit::SOFTWARE);
        }
        Ok(())
    }

    /// The spawn in the journal: the leader's identity and how it entered its cgroup.
    fn journal_spawn(&self, child: &sys::Spawned, stat: &procfs::Stat) {
        let pid = stat.identity().pid;
        let mut spawn = json!({"pid": pid.get(), "pgid": raw(stat.pgid), "sid": raw(stat.sid), "start_ticks": stat.identity().start_ticks,
                   "cgroup_entry": child.cgroup_entry.map(sys::CgroupEntry::as_str)});
        if let Some((step, errno)) = child.report_ignored {
            // Bytes the exec'd workload wrote into the spawn's report pipe (through /proc).
            spawn["report_ignored"] = json!({"step": format!("{step:?}"), "errno": errno});
        }
        let _ = self.journal.event("spawn", spawn);
        crate::phases::mark("journal_spawn");
    }

    /// The workload's environment, as std's `Command` built it: the wrapper's own with the
    /// run's id and dir set and our internal variables removed, then the `-e` pairs; sorted by
    /// name, one value each.
    pub(super) fn workload_env(&self, args: &StartArgs) -> Vec<(OsString, OsString)> {
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
    pub(super) fn keep_master(
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
        PtyRun::new(
            master,
            name,
            size,
            follow,
            self.keeper.forked.map(|k| k.pid),
        )
    }

    /// Stop a workload that was spawned but must not run on (it failed its checks, or its
    /// record could not be written), through the shared routine, and reap it.
    pub(super) fn stop_spawned(
        &mut self,
        pid: Pid,
        reason: Reason,
    ) -> agent_run_shared::stop::Report {
        let scope = self.scope();
        let report = stop_run(&scope, &self.timings, reason, Some(&self.journal), None);
        reap::reap_all(Some(pid));
        report
    }
}

/// The workload's stdio as its child takes it: the pipes' write ends (and /dev/null as stdin
/// when detached), or the pty's slave for all three and as its controlling terminal.
fn child_io<'a>(
    opened: Option<&'a Pty>,
    fds: &'a ChildFds,
    reset_signals: u64,
    cgroupns: bool,
) -> sys::ChildIo<'a> {
    match (opened, &fds.ends) {
        (None, Some((out, err))) => sys::ChildIo {
            stdin: fds.null.as_ref().map(|f| f.as_fd()),
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
    }
}
