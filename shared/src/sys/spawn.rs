//! The workload's process: clone3(2) into its cgroup (CLONE_INTO_CGROUP, CLONE_PIDFD, CLONE_VFORK, no CLONE_VM), or fork(2) and a write to `cgroup.procs`; the child then runs [`exec`].

use super::*;

/// `CLONE_INTO_CGROUP` (linux/sched.h, kernel 5.7+): the child starts in the cgroup whose
/// directory `clone_args.cgroup` is open on.
pub(super) const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `CLONE_PIDFD` (kernel 5.2+): a pidfd of the child, written to `clone_args.pidfd`.
pub(super) const CLONE_PIDFD: u64 = 0x1000;

/// `CLONE_VFORK`: the calling thread sleeps until the child execs or exits.
pub(super) const CLONE_VFORK: u64 = 0x4000;

/// `struct clone_args` of linux/sched.h, up to `cgroup` (CLONE_ARGS_SIZE_VER2, 88 bytes).
#[repr(C)]
#[derive(Default)]
pub(super) struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// A step of the workload's child between its clone and its exec, as it reports a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStep {
    /// dup2(2) of stdin, stdout or stderr.
    Stdio = 1,
    /// chdir(2) to the run's working directory.
    Cwd,
    /// The reset of every signal's action and of the mask.
    Signals,
    /// setsid(2).
    Setsid,
    /// TIOCSCTTY on the pty slave (`--pty`).
    Ctty,
    /// The write of `0` to `cgroup.procs` (the fork fallback only).
    Cgroup,
    /// close_range(2) marking every descriptor above stderr close-on-exec.
    Cloexec,
    /// execve(2) of the command itself.
    Exec,
}

impl ChildStep {
    pub(crate) const ALL: [ChildStep; 8] = [
        ChildStep::Stdio,
        ChildStep::Cwd,
        ChildStep::Signals,
        ChildStep::Setsid,
        ChildStep::Ctty,
        ChildStep::Cgroup,
        ChildStep::Cloexec,
        ChildStep::Exec,
    ];
}

/// How the workload entered its cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupEntry {
    /// Created in it, by clone3(2) with CLONE_INTO_CGROUP: it never ran outside.
    Clone3,
    /// Forked in the wrapper's cgroup, it moved itself in (wrote `0` to `cgroup.procs`) before
    /// its exec: kernels before 5.7, seccomp profiles that refuse clone3, the fault knob
    /// `spawn_by_fork`.
    Write,
}

impl CgroupEntry {
    /// The name the journal gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupEntry::Clone3 => "clone3",
            CgroupEntry::Write => "write",
        }
    }
}

/// The spawned workload: our child, unreaped.
#[derive(Debug)]
pub struct Spawned {
    pub pid: Pid,
    /// Its pidfd, from the clone itself (CLONE_PIDFD); `None` after a fork, where the caller
    /// opens one by pid (the pid is our unreaped child's, so it cannot be reused meanwhile).
    pub pidfd: Option<OwnedFd>,
    /// How it entered the run's cgroup; `None` without one.
    pub cgroup_entry: Option<CgroupEntry>,
    /// A report in the pipe that the child did not write (it exec'd: see
    /// [`crate::spawn::spawn_workload`]), as it read: step and errno. For the journal only.
    pub report_ignored: Option<(ChildStep, i32)>,
}

/// Why the workload's spawn failed. A child that was made has been reaped.
#[derive(Debug)]
pub enum SpawnError {
    /// No process could be made (clone3 or fork: EAGAIN, ENOMEM), or the report pipe.
    Fork(io::Error),
    /// The process could not be made in, or move into, the run's cgroup.
    Cgroup(io::Error),
    /// A step of the child failed; [`ChildStep::Exec`]: the command could not be executed.
    Child(ChildStep, io::Error),
}

/// The workload's stdio and terminal, as the child takes them: each source descriptor is
/// dup2'd onto 0, 1, 2 (none may itself be 0, 1 or 2 unless at its own number).
pub struct ChildIo<'a> {
    /// `None`: the wrapper's own stdin.
    pub stdin: Option<BorrowedFd<'a>>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    /// `--pty`: the slave, made the new session's controlling terminal.
    pub ctty: Option<BorrowedFd<'a>>,
    /// The signals the child resets to their default action: [`nondefault_signals`], read by
    /// the caller after its last change of a signal's action (a launch reads it once for the
    /// keeper and the workload).
    pub reset_signals: u64,
    /// Start the workload in a cgroup namespace of its own, rooted at its run's cgroup
    /// (unshare(2) `CLONE_NEWCGROUP` once it is in it): on a cgroup2 mount with `nsdelegate`
    /// the kernel then refuses any move of its processes out of that cgroup. Needs
    /// CAP_SYS_ADMIN (root).
    pub cgroupns: bool,
}

/// What the child reads, as plain numbers and the prepared [`Exec`].
pub(super) struct ChildPlan<'a> {
    pub(super) exec: &'a Exec,
    pub(super) stdio: [(Option<RawFd>, RawFd); 3],
    pub(super) ctty: Option<RawFd>,
    /// `cgroup.procs` of the run's cgroup, open for writing: the fork fallback only.
    pub(super) procs: Option<RawFd>,
    /// The write end of the report pipe (close-on-exec).
    pub(super) report: RawFd,
    /// The signals whose action the child resets ([`nondefault_signals`]).
    pub(super) signals: u64,
    /// Unshare a cgroup namespace once in the cgroup ([`ChildIo::cgroupns`]).
    pub(super) cgroupns: bool,
}

/// The workload's process, just made by [`start_workload`], unreaped, with both ends of its
/// report pipe: the child writes a failed step there (step and errno, 8 bytes), then `_exit`s
/// 127; its exec closes its copy of the write end.
pub struct Started {
    pub pid: Pid,
    /// Its pidfd, from the clone itself (CLONE_PIDFD); `None` after a fork.
    pub pidfd: Option<OwnedFd>,
    /// How it entered the run's cgroup; `None` without one.
    pub cgroup_entry: Option<CgroupEntry>,
    /// The report pipe's read end (close-on-exec).
    pub report_r: OwnedFd,
    /// Our copy of the report pipe's write end: the caller closes it.
    pub report_w: OwnedFd,
    /// Whether this thread slept until the child's exec or exit (clone3 with CLONE_VFORK):
    /// its report, if any, is then whole in the pipe. After a fork the child may still run.
    pub waited: bool,
}

/// Make the workload's process, as [`crate::spawn::spawn_workload`] describes: clone3(2)
/// with CLONE_PIDFD, CLONE_VFORK and, with a cgroup, CLONE_INTO_CGROUP; else fork(2) and a
/// child that writes `0` to `cgroup.procs`. The child takes `io`, resets its signals, starts a
/// new session and execs `exec`, or reports the step that failed. Every signal stays blocked
/// in this thread from before the clone until the clone is done.
pub fn start_workload(
    exec: &Exec,
    io: &ChildIo<'_>,
    cgroup: Option<BorrowedFd<'_>>,
    force_fork: bool,
) -> Result<Started, SpawnError> {
    let (report_r, report_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnError::Fork(e.into()))?;
    let raw = |fd: BorrowedFd<'_>| fd.as_raw_fd();
    let mut plan = ChildPlan {
        exec,
        stdio: [
            (io.stdin.map(raw), 0),
            (Some(raw(io.stdout)), 1),
            (Some(raw(io.stderr)), 2),
        ],
        ctty: io.ctty.map(raw),
        procs: None,
        report: report_w.as_raw_fd(),
        signals: io.reset_signals,
        cgroupns: io.cgroupns && cgroup.is_some(),
    };
    // Every signal stays blocked from before the clone until the child has reset their
    // actions: no handler of ours ever runs in the child (signal-hook's would write to the
    // wrapper's own signal pipe).
    let old_mask = block_all_signals();
    let made = clone_workload(&mut plan, cgroup, force_fork);
    if let Ok((Forked::Child, ..)) = made {
        // SAFETY: we are the new process, one thread, between the clone and the exec; the plan
        // and everything it points to were prepared before the clone and are only read.
        unsafe { child(&plan) }
    }
    set_signal_mask(&old_mask);
    match made {
        Ok((Forked::Parent(pid, pidfd), cgroup_entry, procs, waited)) => {
            drop(procs);
            Ok(Started {
                pid,
                pidfd,
                cgroup_entry,
                report_r,
                report_w,
                waited,
            })
        }
        Ok((Forked::Child, ..)) => unreachable!("the child never returns from `child`"),
        Err(e) => Err(e),
    }
}

/// Which side of a clone we are on.
pub(super) enum Forked {
    Child,
    Parent(Pid, Option<OwnedFd>),
}

/// What [`clone_workload`] made: the side we are on, how the child enters its cgroup, the
/// parent's copy of `cgroup.procs` (the fork fallback), to close once the clone is done, and
/// whether the clone was vfork-style (the parent resumed only once the child exec'd or exited).
pub(super) type Made = (Forked, Option<CgroupEntry>, Option<OwnedFd>, bool);

/// Make the workload's process: clone3 into the cgroup, else (old kernels, `force_fork`)
/// fork, with the child writing `cgroup.procs` (`plan.procs`).
pub(super) fn clone_workload(
    plan: &mut ChildPlan<'_>,
    cgroup: Option<BorrowedFd<'_>>,
    force_fork: bool,
) -> Result<Made, SpawnError> {
    // ENOSYS: no clone3 (before 5.3); E2BIG, EINVAL: no `cgroup` field, no CLONE_INTO_CGROUP
    // (before 5.7); EPERM: a seccomp profile that refuses clone3 (container runtimes of the
    // 2020s), never the cgroup's answer (EACCES, ENOENT, EBUSY, EOPNOTSUPP...).
    let old_kernel = |e: &io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL | libc::EPERM)
        )
    };
    if !force_fork {
        let mut r = clone3(cgroup, true);
        if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EMFILE)) {
            // No descriptor left for the pidfd: the run goes on without one, as before.
            r = clone3(cgroup, false);
        }
        match r {
            Ok(f) => return Ok((f, cgroup.map(|_| CgroupEntry::Clone3), None, true)),
            Err(e) if old_kernel(&e) => {}
            Err(e) if cgroup.is_none() => return Err(SpawnError::Fork(e)),
            Err(e) => {
                return Err(match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ENOMEM) => SpawnError::Fork(e),
                    _ => SpawnError::Cgroup(e),
                })
            }
        }
    }
    let procs = match cgroup {
        Some(dir) => Some(
            rustix::fs::openat(
                dir,
                "cgroup.procs",
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| SpawnError::Cgroup(e.into()))?,
        ),
        None => None,
    };
    plan.procs = procs.as_ref().map(|f| f.as_raw_fd());
    let forked = fork().map_err(SpawnError::Fork)?;
    Ok((forked, cgroup.map(|_| CgroupEntry::Write), procs, false))
}

/// The `clone_args` both clones start from: SIGCHLD to us when the child ends; with
/// `pidfd`, the child's pidfd written there (CLONE_PIDFD); with `cgroup`, the child made in
/// that cgroup (CLONE_INTO_CGROUP).
pub(super) fn clone_args(
    cgroup: Option<BorrowedFd<'_>>,
    pidfd: Option<&mut libc::c_int>,
) -> CloneArgs {
    let mut args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(p) = pidfd {
        args.flags |= CLONE_PIDFD;
        args.pidfd = std::ptr::from_mut(p) as u64;
    }
    if let Some(dir) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = dir.as_raw_fd() as u64;
    }
    args
}

/// The parent's side of a clone that returned the positive `pid`, with the pidfd the
/// kernel wrote to `pidfd` when one was asked for.
pub(super) fn parent_of(pid: i64, want_pidfd: bool, pidfd: libc::c_int) -> Forked {
    let pid = Pid::new(pid).expect("clone3 returns the child's positive pid");
    // SAFETY: with CLONE_PIDFD the kernel put a new descriptor, ours alone, in `pidfd`
    // (close-on-exec).
    let fd = (want_pidfd && pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Forked::Parent(pid, fd)
}

/// clone3(2) as a fork that the caller waits out: a new process with its own copy of our
/// memory, SIGCHLD to us when it ends; with `cgroup`, made in that cgroup
/// (CLONE_INTO_CGROUP); with `want_pidfd`, its pidfd with it (CLONE_PIDFD). CLONE_VFORK
/// without CLONE_VM: this thread sleeps until the child has exec'd or exited, so its
/// report, if any, is whole in the pipe when we return. Raw: neither libc nor rustix wraps
/// clone3.
pub(super) fn clone3(cgroup: Option<BorrowedFd<'_>>, want_pidfd: bool) -> io::Result<Forked> {
    let mut pidfd: libc::c_int = -1;
    let mut args = clone_args(cgroup, want_pidfd.then_some(&mut pidfd));
    args.flags |= CLONE_VFORK;
    // SAFETY: fork semantics. Without CLONE_VM and with no stack given (0), the child runs
    // on its own copy of our memory and of this very stack, as after fork(2), and returns
    // 0 from here; the kernel reads `args` (its size passed) and writes only the pidfd
    // number into `pidfd`, which outlives the call. The caller hands the child straight to
    // `child`, which makes only async-signal-safe syscalls until its exec or `_exit`
    // (libc's thread state, stale in the child, is never consulted: no allocation, no
    // lock, no pthread call). CLONE_VFORK only makes this thread wait for that exec or exit.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of_mut!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        r if r < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(parent_of(pid, want_pidfd, pidfd)),
    }
}

/// fork(2), for kernels without clone3 or CLONE_INTO_CGROUP.
pub(super) fn fork() -> io::Result<Forked> {
    // SAFETY: the child of a process that may have other threads has one thread; it runs
    // only `child` (async-signal-safe syscalls) until its exec or `_exit`.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(
            Pid::new(pid.into()).expect("fork returns the child's positive pid"),
            None,
        )),
    }
}
