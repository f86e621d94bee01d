//! Before the spawn: the lock, the first beat, the record's fields and the run's cgroup.

use super::*;

impl Launch {
    /// The launch before its first record: the lock, the first beat, the record's fields and
    /// the run's cgroup. Fails when the dir is locked or was declared lost meanwhile.
    pub(super) fn new(
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
        let mut st = record_fields(&dir, args, argv, token.as_ref(), &timings)?;
        // The cgroup exists before the first record names it, so anyone who finds the record
        // can find the run's processes through it, whatever step the wrapper dies at.
        let (cgroup, cgroup_failure) = run_cgroup(&dir, &parent, &mut st);
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
            keeper: KeeperLink::default(),
            heartbeat: Heartbeat {
                beat,
                published: Arc::default(),
            },
        })
    }

    /// The `starting` record, the launch in the journal and its warnings said.
    pub(super) fn record_starting(&mut self, args: &StartArgs) -> anyhow::Result<()> {
        self.dir.write_status(&self.st)?;
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
        Ok(())
    }

    /// The first lease (signed with the run's token), the subreaper, the signal handlers.
    pub(super) fn prepare(
        &self,
        args: &StartArgs,
    ) -> anyhow::Result<(Option<(Lease, LeaseToken)>, Signals)> {
        let lease = match (args.lease, &self.token) {
            (Some(len), Some(token)) => {
                let lease = Lease::from_now(len).sign(self.dir.id().as_str(), token);
                self.dir.write_lease(&lease)?;
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
    }
}

/// The record's fields known before the spawn: the command, its cwd, limits, labels, env
/// names, the wrapper, the token's hash, and the host's warnings.
fn record_fields(
    dir: &RunDir,
    args: &StartArgs,
    argv: &[OsString],
    token: Option<&LeaseToken>,
    timings: &Timings,
) -> anyhow::Result<Status> {
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
    st.lease_token_sha256 = token.map(LeaseToken::sha256);
    st.grace_ms = Some(timings.grace.as_millis() as u64);
    st.hup_after_ms = Some(timings.hup_after.as_millis() as u64);
    crate::phases::mark("record_fields");
    st.warnings = agent_run_shared::hostpolicy::launch_warnings(&st.user);
    st.warnings.extend(cwd_warning);
    crate::phases::mark("host_policy");
    Ok(st)
}

/// The run's cgroup under `parent` (none for a /proc-only parent), named in `st`'s
/// containment, with why an explicitly asked one could not be made.
fn run_cgroup(
    dir: &RunDir,
    parent: &Parent,
    st: &mut Status,
) -> (Option<RunCgroup>, Option<String>) {
    let (mut cgroup, mut cgroup_failure) = (None, None);
    st.containment = Some(Containment::procfs());
    if let Parent::Dir { path, explicit } = parent {
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
    (cgroup, cgroup_failure)
}

/// The working directory for the record, and a warning when it is not a plain path. A directory
/// deleted before the launch has no path (getcwd fails): the record keeps what the kernel says,
/// `/proc/self/cwd`'s `"/old/path (deleted)"`, never an empty string, and the run gets a warning
/// (the workload runs in that deleted directory, as it would from a shell).
pub(super) fn working_dir() -> (String, Option<String>) {
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
