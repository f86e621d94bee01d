//! The syscalls std lacks, in small functions with typed arguments, so callers stay in safe
//! code.
//!
//! Most bodies are [rustix](https://docs.rs/rustix) calls: borrowed descriptors, typed pids and
//! signals, errno as `io::Error`, kept by people who read the kernel's ABI for a living. What
//! rustix does not offer stays in [`raw`] at the end, each block with its safety argument:
//! `pidfd_send_signal` with flags, the `rt_sigaction` reset of every signal and `close_range`
//! for `pre_exec`, SIGPIPE's default action. This is the only module of the library that may
//! use `unsafe`. Functions marked async-signal-safe are the only ones a `pre_exec` closure may
//! call.
#![allow(unsafe_code)]

use crate::pid::Pid;
use rustix::event::{epoll, PollFlags, Timespec};
use rustix::fs::inotify;
use rustix::process::{Resource, Rlimit, Signal, WaitOptions};
use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub use raw::{args_os, default_sigpipe, pidfd_send_signal, runtime_start, self_cpu};
use raw::{child_cloexec_from_3, child_reset_signals};

// ---- processes ----------------------------------------------------------------------------

/// Our positive pid as rustix's.
pub(crate) fn rustix_pid(pid: Pid) -> rustix::process::Pid {
    rustix::process::Pid::from_raw(pid.get()).expect("a Pid is positive")
}

/// A timeout as the kernel takes it; durations beyond `i64` seconds wait forever.
fn timespec(d: Duration) -> Option<Timespec> {
    Timespec::try_from(d).ok()
}

/// A signal number as rustix's typed signal. `None` for 0 and numbers the kernel has no
/// signal for (EINVAL to the caller).
fn signal(sig: i32) -> Option<Signal> {
    if let Some(s) = Signal::from_named_raw(sig) {
        return Some(s);
    }
    // SAFETY: a number in the kernel's signal range (1..=64), so a valid, non-zero signal.
    // rustix's caveat about libc's reserved real-time numbers concerns signals this process
    // would block, catch or consume; these are only ever sent to other processes.
    (1..=64)
        .contains(&sig)
        .then(|| unsafe { Signal::from_raw_unchecked(sig) })
}

/// Open a pidfd for `pid` (pidfd_open(2)). Works for any process we can see, not only children;
/// while we hold it, signals sent through it cannot reach a process that reused the pid.
/// pidfds are always close-on-exec.
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    Ok(rustix::process::pidfd_open(
        rustix_pid(pid),
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// kill(2) to one process, or with `group` to the process group whose id is `pid`. Only for
/// kernels without pidfds, after the caller re-checked the process's start time. `Pid` is > 0,
/// so the target is never 0 or -1 (our own group, or every process we may signal).
pub fn kill(pid: Pid, sig: i32, group: bool) -> io::Result<()> {
    let p = rustix_pid(pid);
    let r = match (sig, group) {
        (0, false) => rustix::process::test_kill_process(p),
        (0, true) => rustix::process::test_kill_process_group(p),
        _ => {
            let s = signal(sig).ok_or(io::Error::from_raw_os_error(libc::EINVAL))?;
            if group {
                rustix::process::kill_process_group(p, s)
            } else {
                rustix::process::kill_process(p, s)
            }
        }
    };
    Ok(r?)
}

/// Make this process a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER): orphans of our
/// descendants are reparented to us instead of to init.
pub fn set_child_subreaper() -> io::Result<()> {
    Ok(rustix::process::set_child_subreaper(Some(
        rustix::process::getpid(),
    ))?)
}

/// The CPUs this thread may run on (sched_getaffinity(2)); `None` when it cannot be asked.
pub fn cpus_allowed() -> Option<rustix::thread::CpuSet> {
    rustix::thread::sched_getaffinity(None).ok()
}

/// Keep our helper `pid` (a child just forked, queued behind us) off the CPU this thread runs
/// on, within `allowed` (ours): a fork places the child on its parent's CPU when every CPU is
/// busy, and there it waits for the parent, which goes on working, while another CPU falls
/// idle without taking it (the idle CPU's quick balance skips a runqueue this busy). Nothing
/// when `allowed` has no other CPU. The caller gives `allowed` back ([`set_cpus_of`]) once the
/// helper has work. Returns whether the helper was moved.
pub fn keep_off_this_cpu(pid: Pid, allowed: &rustix::thread::CpuSet) -> bool {
    let cpu = rustix::thread::sched_getcpu();
    if cpu >= rustix::thread::CpuSet::MAX_CPU || !allowed.is_set(cpu) || allowed.count() < 2 {
        return false;
    }
    let mut others = *allowed;
    others.unset(cpu);
    rustix::thread::sched_setaffinity(Some(rustix_pid(pid)), &others).is_ok()
}

/// Let our helper `pid` run on the CPUs of `allowed` (sched_setaffinity(2)); errors are
/// ignored (it then runs where it was allowed to).
pub fn set_cpus_of(pid: Pid, allowed: &rustix::thread::CpuSet) {
    let _ = rustix::thread::sched_setaffinity(Some(rustix_pid(pid)), allowed);
}

/// Start writing back the dirty pages of the file open as `fd` (sync_file_range(2) with
/// `SYNC_FILE_RANGE_WRITE` over the whole file): asynchronous, no wait for completion, no
/// durability promise. A writer that calls it as it goes overlaps the disk's work with its
/// own, so its final fsync waits only for the last pages instead of all of them.
pub fn start_writeback(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: sync_file_range(2) takes a descriptor and three integers and touches no memory of
    // ours; `fd` is a live descriptor for the duration of the call (BorrowedFd). Offset 0 and
    // length 0 mean from the start to the end of the file.
    let r = unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How a child ended, from `waitpid(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    Exited(i32),
    Signaled(i32),
}

/// Reap one child without blocking: `pid` for one child, `None` for any. Ok(None) when a child
/// exists but none has ended; Err(ECHILD) when there is no child to wait for.
pub fn waitpid_nohang(pid: Option<Pid>) -> io::Result<Option<(Pid, WaitStatus)>> {
    loop {
        // rustix's `waitpid(None)` is wait4(0): children in our own process group only, which
        // a run's leader (a session of its own) never is. Any child is `wait`, wait4(-1).
        let r = match pid {
            Some(p) => rustix::process::waitpid(Some(rustix_pid(p)), WaitOptions::NOHANG),
            None => rustix::process::wait(WaitOptions::NOHANG),
        };
        let (p, status) = match r {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(None),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let Some(p) = Pid::new(p.as_raw_nonzero().get().into()) else {
            return Ok(None);
        };
        let ws = if let Some(code) = status.exit_status() {
            WaitStatus::Exited(code)
        } else if let Some(sig) = status.terminating_signal() {
            WaitStatus::Signaled(sig)
        } else {
            continue; // stopped/continued are not reported without WUNTRACED/WCONTINUED
        };
        return Ok(Some((p, ws)));
    }
}

/// This process's effective uid.
pub fn geteuid() -> u32 {
    // agent-run never changes its credentials, so one call per process is enough (the watchdog
    // asks once per run dir of a pass).
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EUID.get_or_init(|| rustix::process::geteuid().as_raw())
}

/// Stop this process (SIGSTOP to ourselves) until someone continues it (`fg`, SIGCONT): what
/// Ctrl-Z does, once the wrapper has suspended its run. Returns once continued.
pub fn stop_self() {
    let _ = rustix::process::kill_process(rustix::process::getpid(), Signal::STOP);
}

/// SIGKILL this process at once (fault injection in debug builds).
pub fn kill_self() -> ! {
    let _ = rustix::process::kill_process(rustix::process::getpid(), Signal::KILL);
    std::process::abort()
}

/// Raise the soft open-file limit to the hard limit (a watchdog holds one pidfd per live
/// wrapper). Returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    // `None` is RLIM_INFINITY.
    let lim = rustix::process::getrlimit(Resource::Nofile);
    let (cur, max) = (
        lim.current.unwrap_or(u64::MAX),
        lim.maximum.unwrap_or(u64::MAX),
    );
    if cur < max {
        let want = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if rustix::process::setrlimit(Resource::Nofile, want).is_ok() {
            return max;
        }
    }
    cur
}

// ---- host facts ---------------------------------------------------------------------------

/// Whether this process may write `path` by its effective ids (faccessat(2) with AT_EACCESS).
pub fn writable(path: &std::path::Path) -> bool {
    rustix::fs::accessat(
        rustix::fs::CWD,
        path,
        rustix::fs::Access::WRITE_OK,
        rustix::fs::AtFlags::EACCESS,
    )
    .is_ok()
}

/// This host's name (the nodename of uname(2), what gethostname(2) returns).
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Clock ticks per second (sysconf(_SC_CLK_TCK), through rustix's `use-libc-auxv`), for /proc
/// start times.
pub fn clock_ticks_per_sec() -> u64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100,
        n => n,
    }
}

/// Seconds since boot (CLOCK_BOOTTIME), comparable with /proc start ticks.
pub fn boottime_secs() -> f64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

// ---- waiting: poll, flock -----------------------------------------------------------------

/// One `poll(2)` entry.
pub struct PollFd {
    pub fd: RawFd,
    pub events: i16,
    pub revents: i16,
}

/// `poll(2)` with a timeout (None blocks). EINTR is reported as zero ready fds.
pub fn poll(fds: &mut [PollFd], timeout: Option<Duration>) -> io::Result<usize> {
    let mut set: Vec<rustix::event::PollFd<'_>> = fds
        .iter()
        .map(|p| {
            // SAFETY: the borrow lives only for this call, which neither closes the descriptor
            // nor does I/O on it: poll(2) takes the number, and a number that is not open comes
            // back as POLLNVAL, as with a raw poll.
            let fd = unsafe { BorrowedFd::borrow_raw(p.fd) };
            rustix::event::PollFd::from_borrowed_fd(fd, PollFlags::from_bits_retain(p.events as _))
        })
        .collect();
    let t = timeout.and_then(timespec);
    let n = match rustix::event::poll(&mut set, t.as_ref()) {
        Ok(n) => n,
        Err(rustix::io::Errno::INTR) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    for (p, r) in fds.iter_mut().zip(&set) {
        p.revents = r.revents().bits() as i16;
    }
    Ok(n)
}

/// Non-blocking exclusive `flock(2)`. Ok(false) when another open file description holds it.
pub fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// chmod(2) of what an `O_PATH` descriptor names, through its /proc/self/fd link (fchmod(2)
/// refuses an `O_PATH` descriptor; the link reaches the very inode, not a path that could have
/// been swapped).
pub fn chmod_fd_path(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(link.as_str(), rustix::fs::Mode::from_raw_mode(mode)).map_err(Into::into)
}

/// Let go of a `flock(2)` this open file description holds.
pub fn unlock(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::Unlock).map_err(Into::into)
}

// ---- spawning: the pre_exec half is async-signal-safe only --------------------------------

/// In a forked child before exec: start a new session (setsid(2), one raw syscall in rustix's
/// backend). Async-signal-safe.
fn child_setsid() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// Make `cmd` start its program in a new session with a clean signal state and no inherited
/// descriptor above stderr (the detached wrapper; the workload is [`spawn_workload`]'s). The
/// `pre_exec` closure calls only async-signal-safe functions: sigaction, sigprocmask, setsid
/// and close_range.
pub fn spawn_in_new_session(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let signals = nondefault_signals();
    // SAFETY: the closure runs in the forked child before exec; it allocates nothing, takes no
    // lock and calls only the async-signal-safe syscalls above (signal-safety(7)).
    unsafe {
        cmd.pre_exec(move || {
            child_reset_signals(signals)?;
            child_setsid()?;
            child_cloexec_from_3()
        });
    }
}

/// The signals whose action is not the default in this process, as a set (bit N-1 for signal
/// N): SigIgn | SigCgt of /proc/self/status, where a child about to exec (or the keeper)
/// resets only those instead of all 64 (the workload's child does it while the wrapper waits
/// for its exec: ~60 syscalls fewer on the launch's path). A launch reads it once, after its
/// last handler is in place, for the keeper and the workload ([`ChildIo::reset_signals`]).
/// Every signal when the file cannot be read.
pub fn nondefault_signals() -> u64 {
    let Ok(text) = read_kernel_file("/proc/self/status") else {
        return u64::MAX;
    };
    let hex = |v: &str| u64::from_str_radix(v.trim(), 16).unwrap_or(0);
    text.lines()
        .filter_map(|l| l.strip_prefix("SigIgn:").or_else(|| l.strip_prefix("SigCgt:")))
        .fold(0, |set, v| set | hex(v))
}

// ---- reads of whole files ------------------------------------------------------------------

/// A file the kernel makes as it is read (/proc, /sys, the cgroup2 mount), whole, as text.
/// Plain reads into a 4 KiB buffer that grows, until EOF (the run dir's reader, uncapped):
/// `fs::read_to_string` first asks for the size (statx says 0 for such files) and then starts
/// with 32-byte probe reads, six to nine syscalls for a file this reads in three or four. A
/// file that is not UTF-8 is `InvalidData`, as there.
pub fn read_kernel_file(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    let buf = read_capped(&mut std::fs::File::open(path)?, u64::MAX)?;
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Read up to `cap + 1` bytes: plain `read(2)` calls into a growing buffer, without the size
/// probe and seek that `read_to_string` adds (two syscalls per record, 10,000 records per
/// rescan).
pub fn read_capped(f: &mut std::fs::File, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let limit = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    let mut buf = vec![0u8; 4096.min(limit)];
    let mut n = 0;
    while n < limit {
        if n == buf.len() {
            buf.resize((buf.len() * 2).min(limit), 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A FIFO swapped in between the fstat and here cannot happen (same fd), but a
            // regular file on a filesystem that answers EAGAIN is reported, not spun on.
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

// ---- the workload's spawn: clone3(2) into its cgroup, exec by hand ------------------------

/// `CLONE_INTO_CGROUP` (linux/sched.h, kernel 5.7+): the child starts in the cgroup whose
/// directory `clone_args.cgroup` is open on.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
/// `CLONE_PIDFD` (kernel 5.2+): a pidfd of the child, written to `clone_args.pidfd`.
const CLONE_PIDFD: u64 = 0x1000;
/// `CLONE_VFORK`: the calling thread sleeps until the child execs or exits.
const CLONE_VFORK: u64 = 0x4000;
/// The shell execvp(3) hands a file to when the kernel cannot execute it (ENOEXEC).
const BSHELL: &std::ffi::CStr = c"/bin/sh";
/// execvp(3)'s search path when the environment has no PATH (glibc's `_CS_PATH`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// `struct clone_args` of linux/sched.h, up to `cgroup` (CLONE_ARGS_SIZE_VER2, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
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
    /// [`spawn_workload`]), as it read: step and errno. For the journal only.
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

/// Everything the workload's exec needs, prepared before the clone so that the child only
/// reads memory: argv and envp as C strings with their pointer arrays, the paths to try in
/// order, the working directory.
///
/// The program is found as std's `Command` finds it (execvp(3) in the child, glibc's rules):
/// a name with a `/` is executed as it is; any other is tried in each entry of the PATH of the
/// workload's own environment (`/bin:/usr/bin` without one; an empty entry is the working
/// directory), skipping entries that answer ENOENT, ENOTDIR, EACCES (remembered: reported
/// when nothing else ran), ESTALE, ENODEV or ETIMEDOUT, and stopping at any other error. A
/// file the kernel cannot execute (ENOEXEC) is run by `/bin/sh`, as execvp does.
pub struct Exec {
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The paths execve(2) is tried with, in order.
    candidates: Vec<CString>,
    /// For each candidate, the argv of `/bin/sh CANDIDATE ARGS...` (the ENOEXEC fallback).
    sh_argvs: Vec<Vec<*const libc::c_char>>,
    /// Whether `candidates` come from a PATH search (the skip rules apply).
    search: bool,
    cwd: Option<CString>,
    /// The errno the exec fails with before any attempt: an empty name (ENOENT), a name
    /// longer than NAME_MAX (ENAMETOOLONG).
    early: Option<i32>,
}

impl Exec {
    /// `argv[0]` is the program; `env` is the workload's whole environment, in order.
    pub fn new(
        argv: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cwd: Option<&std::path::Path>,
    ) -> io::Result<Exec> {
        use std::os::unix::ffi::OsStrExt;
        let nul = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            )
        };
        let c = |b: Vec<u8>| CString::new(b).map_err(|_| nul());
        let program = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?
            .as_bytes();
        let mut strings = Vec::with_capacity(argv.len() + env.len());
        for a in argv {
            strings.push(c(a.as_bytes().to_vec())?);
        }
        let mut path = None;
        for (k, v) in env {
            let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            strings.push(c(kv)?);
            if k.as_bytes() == b"PATH" {
                path = Some(v.as_bytes());
            }
        }
        let ptrs = |s: &[CString]| -> Vec<*const libc::c_char> {
            s.iter()
                .map(|s| s.as_ptr())
                .chain([std::ptr::null()])
                .collect()
        };
        // The C strings' buffers are their own heap allocations: the pointers stay valid
        // while `strings` lives, wherever the vector moves.
        let argv_ptrs = ptrs(&strings[..argv.len()]);
        let envp_ptrs = ptrs(&strings[argv.len()..]);
        let (mut candidates, mut search, mut early) = (Vec::new(), false, None);
        if program.is_empty() {
            early = Some(libc::ENOENT);
        } else if program.contains(&b'/') {
            candidates.push(c(program.to_vec())?);
        } else if program.len() > 255 {
            early = Some(libc::ENAMETOOLONG);
        } else {
            search = true;
            for dir in path.unwrap_or(DEFAULT_PATH).split(|&b| b == b':') {
                let mut p = Vec::with_capacity(dir.len() + 1 + program.len());
                if !dir.is_empty() {
                    p.extend_from_slice(dir);
                    p.push(b'/');
                }
                p.extend_from_slice(program);
                candidates.push(c(p)?);
            }
        }
        let sh_argvs = candidates
            .iter()
            .map(|cand| {
                [BSHELL.as_ptr(), cand.as_ptr()]
                    .into_iter()
                    .chain(argv_ptrs[1..].iter().copied())
                    .collect()
            })
            .collect();
        let cwd = cwd
            .map(|d| c(d.as_os_str().as_bytes().to_vec()))
            .transpose()?;
        Ok(Exec {
            _strings: strings,
            argv: argv_ptrs,
            envp: envp_ptrs,
            candidates,
            sh_argvs,
            search,
            cwd,
            early,
        })
    }
}

/// What the child reads, as plain numbers and the prepared [`Exec`].
struct ChildPlan<'a> {
    exec: &'a Exec,
    stdio: [(Option<RawFd>, RawFd); 3],
    ctty: Option<RawFd>,
    /// `cgroup.procs` of the run's cgroup, open for writing: the fork fallback only.
    procs: Option<RawFd>,
    /// The write end of the report pipe (close-on-exec).
    report: RawFd,
    /// The signals whose action the child resets ([`nondefault_signals`]).
    signals: u64,
    /// Unshare a cgroup namespace once in the cgroup ([`ChildIo::cgroupns`]).
    cgroupns: bool,
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
    let old_mask = raw::block_all_signals();
    let made = clone_workload(&mut plan, cgroup, force_fork);
    if let Ok((Forked::Child, ..)) = made {
        // SAFETY: we are the new process, one thread, between the clone and the exec; the plan
        // and everything it points to were prepared before the clone and are only read.
        unsafe { raw::child(&plan) }
    }
    raw::set_signal_mask(&old_mask);
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
        Ok((Forked::Child, ..)) => unreachable!("the child never returns from `raw::child`"),
        Err(e) => Err(e),
    }
}

/// Wait until `fd` is readable (or at its EOF, or in error), at most until `deadline`, through
/// interruptions. Whether it is (false also when poll itself fails).
pub fn readable_by(fd: BorrowedFd<'_>, deadline: Instant) -> bool {
    let mut fds = [PollFd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match poll(&mut fds, Some(left)) {
            Ok(0) if left.is_zero() => return false,
            Ok(0) => {} // EINTR
            Ok(_) => return true,
            Err(_) => return false,
        }
    }
}

/// Which side of a clone we are on.
enum Forked {
    Child,
    Parent(Pid, Option<OwnedFd>),
}

/// What [`clone_workload`] made: the side we are on, how the child enters its cgroup, the
/// parent's copy of `cgroup.procs` (the fork fallback), to close once the clone is done, and
/// whether the clone was vfork-style (the parent resumed only once the child exec'd or exited).
type Made = (Forked, Option<CgroupEntry>, Option<OwnedFd>, bool);

/// Make the workload's process: clone3 into the cgroup, else (old kernels, `force_fork`)
/// fork, with the child writing `cgroup.procs` (`plan.procs`).
fn clone_workload(
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
        let mut r = raw::clone3(cgroup, true);
        if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EMFILE)) {
            // No descriptor left for the pidfd: the run goes on without one, as before.
            r = raw::clone3(cgroup, false);
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
    let forked = raw::fork().map_err(SpawnError::Fork)?;
    Ok((forked, cgroup.map(|_| CgroupEntry::Write), procs, false))
}

// ---- inotify, epoll -----------------------------------------------------------------------

/// An inotify instance (inotify(7)), non-blocking and close-on-exec: event-driven waits for
/// records and leases instead of sleep loops.
pub struct Inotify {
    fd: OwnedFd,
}

/// One inotify event: the watch it came from, its mask, and the name inside a watched directory.
#[derive(Debug, Clone)]
pub struct InotifyEvent {
    pub wd: i32,
    pub mask: u32,
    pub name: String,
}

impl Inotify {
    /// `IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE`: a file renamed into place, written or created.
    pub const CHANGED: u32 = libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_CREATE;
    /// `IN_MODIFY`: bytes appended.
    pub const MODIFIED: u32 = libc::IN_MODIFY;

    /// A new instance.
    pub fn new() -> io::Result<Inotify> {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        Ok(Inotify { fd })
    }

    /// Throw away pending events (callers re-read the files they care about).
    pub fn drain(&self) {
        let mut buf = [0u8; 4096];
        while matches!(rustix::io::read(&self.fd, &mut buf), Ok(n) if n > 0) {}
    }

    /// Wait up to `timeout` for an event (drained before returning). Returns whether one came.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut fds = [PollFd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ready = poll(&mut fds, Some(timeout)).unwrap_or(0) > 0;
        self.drain();
        ready
    }

    /// The descriptor, to poll together with others.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Watch `path` for `mask` events (IN_DONT_FOLLOW: a symlink is watched as itself) and
    /// return the watch descriptor.
    pub fn add_watch(&self, path: &std::path::Path, mask: u32) -> io::Result<i32> {
        let flags = inotify::WatchFlags::from_bits_retain(mask | libc::IN_DONT_FOLLOW);
        Ok(inotify::add_watch(&self.fd, path, flags)?)
    }

    /// Watch the file open as `fd` for `mask` events: the inode we hold, whatever name it has
    /// now (through the /proc/self/fd magic link, which no other process can redirect).
    pub fn add_watch_fd(&self, fd: BorrowedFd<'_>, mask: u32) -> io::Result<i32> {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let flags = inotify::WatchFlags::from_bits_retain(mask);
        Ok(inotify::add_watch(&self.fd, path, flags)?)
    }

    /// Stop watching a descriptor (errors ignored: the watch may already be gone).
    pub fn rm_watch(&self, wd: i32) {
        let _ = inotify::remove_watch(&self.fd, wd);
    }

    /// Read every pending event without blocking.
    pub fn read_events(&self) -> Vec<InotifyEvent> {
        let mut out = Vec::new();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        // EAGAIN: nothing more is pending.
        while let Ok(ev) = events.next() {
            out.push(InotifyEvent {
                wd: ev.wd(),
                mask: ev.events().bits(),
                name: ev
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            });
        }
        out
    }
}

impl std::os::fd::AsFd for Inotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

/// An epoll instance (epoll(7)): one wait over thousands of pidfds without rebuilding a poll set.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new close-on-exec instance.
    pub fn new() -> io::Result<Epoll> {
        Ok(Epoll {
            fd: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        })
    }

    /// Watch `fd` for readability; `token` comes back with its events.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        // SAFETY: borrowed for this call only: epoll_ctl(2) takes the number and keeps no
        // reference to our descriptor (closing it removes it from the interest list).
        let src = unsafe { BorrowedFd::borrow_raw(fd) };
        Ok(epoll::add(
            &self.fd,
            src,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN,
        )?)
    }

    /// Stop watching `fd` (closing the fd also removes it).
    pub fn remove(&self, fd: RawFd) {
        // SAFETY: as in `add`: the number, for this call only.
        let src = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = epoll::delete(&self.fd, src);
    }

    /// Wait up to `timeout` (None: forever) and return the tokens that are ready.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Vec<u64>> {
        let mut evs: Vec<epoll::Event> = Vec::with_capacity(256);
        let t = timeout.and_then(timespec);
        match epoll::wait(
            &self.fd,
            rustix::buffer::spare_capacity(&mut evs),
            t.as_ref(),
        ) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
        Ok(evs
            .iter()
            .map(|e| {
                let data = e.data;
                data.u64()
            })
            .collect())
    }
}

/// The signal whose block in a wrapper's main thread says, as a kernel fact, that the wrapper is
/// stopping its run: /proc/PID/status shows the main thread's mask (`SigBlk`), and no other
/// process can change it (ptrace aside). `cancel` reads it instead of the record's `cancelling`,
/// which the run can write. URG: ignored by default, never used by agent-run, so a URG sent
/// meanwhile to another of the wrapper's threads does nothing.
pub const STOPPING_MARK: libc::c_int = libc::SIGURG;

/// Say, in this thread's signal mask, that this wrapper is stopping its run (the main thread,
/// at the stop's start; never undone: a stop is the run's end). See [`STOPPING_MARK`].
pub fn mark_stopping() {
    raw::mask_signal(STOPPING_MARK, true);
}

/// The signal whose block in a wrapper's main thread says that the wrapper wrote its run's
/// final record itself: a final record is believed while its wrapper still lives (its last
/// moments, the keeper's exit) only with this mark, so a record the workload forged while the
/// wrapper runs is not. VTALRM: never used by agent-run.
pub const FINAL_MARK: libc::c_int = libc::SIGVTALRM;

/// Say, in this thread's signal mask, that this wrapper wrote its final record (the main
/// thread, just before the write; never undone). See [`FINAL_MARK`].
pub fn mark_final() {
    raw::mask_signal(FINAL_MARK, true);
}

/// The signal whose block in a process's main thread says it is an agent-run party (`cancel`,
/// `status`, the watchdog: anything but a wrapper): whoever finds it holding a run's lock (a
/// takeover, or a look that holds the lock for a moment) never takes it for the run's wrapper.
/// PWR: never used by agent-run.
pub const PARTY_MARK: libc::c_int = libc::SIGPWR;

/// Say, in this thread's signal mask (the main thread, at the start), that this process is an
/// agent-run party, not a wrapper. See [`PARTY_MARK`].
pub fn mark_party() {
    raw::mask_signal(PARTY_MARK, true);
}

/// Take both marks out of this thread's mask at launch: a mask is inherited across exec, so a
/// caller that blocked URG or VTALRM must not make a new wrapper look as if it were stopping
/// or done.
pub fn clear_marks() {
    raw::mask_signal(STOPPING_MARK, false);
    raw::mask_signal(FINAL_MARK, false);
    raw::mask_signal(PARTY_MARK, false);
}

/// Name this thread (the main thread: the process) `name`, as /proc/PID/comm shows it: the
/// wrapper names itself `agent-run` whatever its executable is called, since that name is one
/// of the facts that tell it from the workload ([`crate::wrapper::verify_wrapper`]).
pub fn set_comm(name: &std::ffi::CStr) -> io::Result<()> {
    rustix::thread::set_name(name).map_err(Into::into)
}

/// Make this process non-dumpable (prctl(2) `PR_SET_DUMPABLE` 0): its memory, environment and
/// descriptors (/proc/PID/mem, environ, fd) are then closed to processes of its own user, and
/// none of them can ptrace it. The wrapper holds its run's lease token in memory.
pub fn set_non_dumpable() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(Into::into)
}

// ---- raw: what rustix does not offer ------------------------------------------------------

/// The calls rustix has no function for, as raw syscalls with their safety arguments.
mod raw {
    use super::{
        ChildPlan, ChildStep, CloneArgs, Exec, Forked, BSHELL, CLONE_INTO_CGROUP, CLONE_PIDFD,
    };
    use crate::pid::Pid;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

    /// `PIDFD_SIGNAL_PROCESS_GROUP` (linux/pidfd.h, kernel 6.9+): signal the pidfd's whole group.
    const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 4;
    /// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h, kernel 5.11+).
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;

    /// Send `sig` to the process behind `pidfd` (pidfd_send_signal(2)). With `group`, to its
    /// whole process group (kernel 6.9+; older kernels answer EINVAL). Raw: rustix's
    /// `pidfd_send_signal` takes no flags, and its `Signal` has no 0 (the existence probe).
    pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: i32, group: bool) -> io::Result<()> {
        let flags = if group { PIDFD_SIGNAL_PROCESS_GROUP } else { 0 };
        // SAFETY: a valid fd, a signal number and a NULL siginfo (the kernel fills it in as for
        // kill(2)); no memory of ours is written.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                flags,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// In a forked child before exec: reset every signal of `set` (bit N-1 for signal N: the
    /// parent's non-default ones, [`super::nondefault_signals`]) to its default action and empty
    /// the signal mask, so the workload inherits no ignored signal (SIGPIPE included), no
    /// handler and no mask. Async-signal-safe: sigaction(2) and sigprocmask(2) only.
    pub(super) fn child_reset_signals(set: u64) -> io::Result<()> {
        child_reset_signals_keep_mask(set);
        // SAFETY: an empty set built on the stack; sigprocmask is async-signal-safe.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// In a forked child before exec: mark every descriptor above stderr close-on-exec
    /// (close_range(2) with CLOSE_RANGE_CLOEXEC), so no descriptor the wrapper inherited leaks
    /// into the workload, while std's exec-error pipe still works. Async-signal-safe: one
    /// syscall.
    pub(super) fn child_cloexec_from_3() -> io::Result<()> {
        // SAFETY: close_range takes integers only.
        let r =
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // Kernels before 5.11 lack the flag: every fd we open is O_CLOEXEC anyway.
            if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::ENOSYS) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }

    /// Block every signal in this thread (pthread_sigmask(3); glibc keeps its two internal
    /// signals out of the set) and return the mask before.
    pub(super) fn block_all_signals() -> libc::sigset_t {
        // SAFETY: both sets live on our stack; sigfillset(3) and pthread_sigmask(3) only write
        // them and this thread's mask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            old
        }
    }

    /// Add `sig` to (`block`) or take it out of this thread's signal mask.
    pub(super) fn mask_signal(sig: libc::c_int, block: bool) {
        // SAFETY: the set lives on our stack; sigemptyset(3), sigaddset(3) and
        // pthread_sigmask(3) only write it and this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            let how = if block {
                libc::SIG_BLOCK
            } else {
                libc::SIG_UNBLOCK
            };
            libc::pthread_sigmask(how, &set, std::ptr::null_mut());
        }
    }

    /// Set this thread's signal mask back to `set` (from [`block_all_signals`]).
    pub(super) fn set_signal_mask(set: &libc::sigset_t) {
        // SAFETY: pthread_sigmask(3) reads `set` and writes nothing of ours (NULL old set).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, set, std::ptr::null_mut()) };
    }

    /// The `clone_args` both clones start from: SIGCHLD to us when the child ends; with
    /// `pidfd`, the child's pidfd written there (CLONE_PIDFD); with `cgroup`, the child made in
    /// that cgroup (CLONE_INTO_CGROUP).
    fn clone_args(cgroup: Option<BorrowedFd<'_>>, pidfd: Option<&mut libc::c_int>) -> CloneArgs {
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
    fn parent_of(pid: i64, want_pidfd: bool, pidfd: libc::c_int) -> Forked {
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
        args.flags |= super::CLONE_VFORK;
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

    /// The errno of the last failed call, without allocating.
    pub(super) fn errno() -> i32 {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    }

    /// The workload's child, from the clone to the exec: never returns. It execs, or writes the
    /// step that failed and its errno to the report pipe and `_exit`s 127.
    ///
    /// # Safety
    ///
    /// Only in the process just made by [`clone3`] or [`fork`], before anything else ran in
    /// it, with every signal blocked. It allocates nothing, takes no lock, cannot panic and
    /// calls only async-signal-safe functions (signal-safety(7)): dup2, fcntl, chdir,
    /// rt_sigaction, sigprocmask, setsid, ioctl, write, close_range, execve, _exit.
    pub(super) unsafe fn child(plan: &ChildPlan<'_>) -> ! {
        let (step, errno) = child_steps(plan);
        let s = (step as u32).to_ne_bytes();
        let e = (errno as u32).to_ne_bytes();
        let msg = [s[0], s[1], s[2], s[3], e[0], e[1], e[2], e[3]];
        // SAFETY: write(2) of a buffer on our stack to the report pipe (8 bytes: one atomic
        // pipe write), then _exit(2), which runs no handler of ours and flushes nothing.
        unsafe {
            libc::write(plan.report, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    }

    /// The child's steps in order; returns only on a failure, with its step and errno.
    fn child_steps(plan: &ChildPlan<'_>) -> (ChildStep, i32) {
        let os = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
        for (src, dst) in plan.stdio {
            let Some(src) = src else { continue };
            // SAFETY: dup2(2) and fcntl(2) take numbers; both are async-signal-safe. A source
            // already at its number keeps it, without its close-on-exec flag.
            let r = unsafe {
                if src == dst {
                    libc::fcntl(src, libc::F_SETFD, 0)
                } else {
                    loop {
                        let r = libc::dup2(src, dst);
                        if r >= 0 || errno() != libc::EINTR {
                            break r;
                        }
                    }
                }
            };
            if r < 0 {
                return (ChildStep::Stdio, errno());
            }
        }
        if let Some(cwd) = &plan.exec.cwd {
            // SAFETY: chdir(2) reads a C string prepared before the clone.
            if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
                return (ChildStep::Cwd, errno());
            }
        }
        if let Err(e) = child_reset_signals(plan.signals) {
            return (ChildStep::Signals, os(e));
        }
        if let Err(e) = super::child_setsid() {
            return (ChildStep::Setsid, os(e));
        }
        if let Some(fd) = plan.ctty {
            if let Err(e) = super::child_set_ctty(fd) {
                return (ChildStep::Ctty, os(e));
            }
        }
        if let Some(fd) = plan.procs {
            // SAFETY: write(2) of a static byte to a descriptor opened before the clone.
            if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
                return (ChildStep::Cgroup, errno());
            }
        }
        if plan.cgroupns {
            // SAFETY: unshare(2) takes a flag and changes only this task's namespaces;
            // async-signal-safe.
            if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } != 0 {
                return (ChildStep::Cgroup, errno());
            }
        }
        if let Err(e) = child_cloexec_from_3() {
            return (ChildStep::Cloexec, os(e));
        }
        (ChildStep::Exec, child_exec(plan.exec))
    }

    /// execve(2) of each candidate path in turn, by execvp(3)'s rules ([`Exec`]); returns only
    /// when none ran, with the errno execvp would leave.
    fn child_exec(exec: &Exec) -> i32 {
        if let Some(e) = exec.early {
            return e;
        }
        let (mut last, mut got_eacces) = (libc::ENOENT, false);
        for (path, sh_argv) in exec.candidates.iter().zip(&exec.sh_argvs) {
            // SAFETY: execve(2) reads the path, argv and envp prepared before the clone (each
            // array ends with NULL); it returns only on failure.
            let mut e = unsafe {
                libc::execve(path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr());
                errno()
            };
            if e == libc::ENOEXEC {
                // SAFETY: as above, `/bin/sh PATH ARGS...`, prepared before the clone.
                e = unsafe {
                    libc::execve(BSHELL.as_ptr(), sh_argv.as_ptr(), exec.envp.as_ptr());
                    errno()
                };
            }
            if !exec.search {
                return e;
            }
            match e {
                libc::EACCES => got_eacces = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return e,
            }
            last = e;
        }
        if got_eacces {
            libc::EACCES
        } else {
            last
        }
    }

    /// The child half of [`super::fork_helper`], before its body: session, stdio, descriptors,
    /// signals, name and title.
    pub(super) fn helper_setup(
        keep: &[RawFd],
        null: RawFd,
        signals: u64,
        ignore: &[i32],
        name: &std::ffi::CStr,
        title: &[&[u8]],
    ) -> io::Result<()> {
        rustix::process::setsid()?;
        for fd in 0..3 {
            // SAFETY: dup2(2) of two integers; `null` is open (the parent holds it).
            if unsafe { libc::dup2(null, fd) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        close_all_but(keep)?;
        // Every action back to its default (the parent's handlers are not ours), then the
        // ignored ones, then the mask emptied.
        child_reset_signals_keep_mask(signals);
        for &sig in ignore {
            // SAFETY: installing SIG_IGN touches no memory of ours.
            unsafe { libc::signal(sig, libc::SIG_IGN) };
        }
        // SAFETY: an empty set built on the stack.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            // PR_SET_NAME copies at most 16 bytes of the string (NUL included).
            libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
        }
        set_title(title);
        Ok(())
    }

    /// Close every descriptor above stderr but those in `keep` (close_range(2) over the gaps;
    /// before 5.9, the numbers /proc/self/fd lists).
    fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
        let mut keep: Vec<u32> = keep.iter().filter(|&&f| f > 2).map(|&f| f as u32).collect();
        keep.sort_unstable();
        // The gaps between the kept numbers, the last one open-ended.
        let mut ranges = Vec::new();
        let mut from = 3u32;
        for &k in &keep {
            if k > from {
                ranges.push((from, k - 1));
            }
            from = k.saturating_add(1);
        }
        ranges.push((from, u32::MAX));
        for (lo, hi) in &ranges {
            // SAFETY: close_range takes integers only; no descriptor in range is one Rust
            // code in this process will use again (the child runs only its body, which owns
            // exactly the descriptors in `keep`).
            let r = unsafe { libc::syscall(libc::SYS_close_range, *lo, *hi, 0u32) };
            if r < 0 {
                if super::raw::errno() != libc::ENOSYS {
                    return Err(io::Error::last_os_error());
                }
                let open: Vec<u32> = std::fs::read_dir("/proc/self/fd")?
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect();
                for fd in open {
                    if fd > 2 && keep.binary_search(&fd).is_err() {
                        // SAFETY: as above; EBADF (the listing's own descriptor) is harmless.
                        unsafe { libc::close(fd as i32) };
                    }
                }
                return Ok(());
            }
        }
        Ok(())
    }

    /// The action of every signal of `set` (bit N-1 for signal N) back to SIG_DFL, leaving the
    /// mask alone. Async-signal-safe.
    fn child_reset_signals_keep_mask(set: u64) {
        // The raw syscall, not glibc's signal(): glibc refuses signals 32 and 33 (its reserved
        // SIGCANCEL and SIGSETXID) with EINVAL, so an ignored 32 would leak into the workload.
        // A kernel `struct sigaction` that is all zeros is SIG_DFL, no flags, no restorer, an
        // empty mask, on every architecture's layout (with or without sa_restorer).
        let dfl = [0u64; 4];
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP || set & (1u64 << (sig - 1)) == 0 {
                continue;
            }
            // SAFETY: rt_sigaction reads `dfl` (32 bytes, at least the kernel struct's size) and
            // writes nothing (NULL old action); 8 is the kernel sigset size. Async-signal-safe.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    8usize,
                )
            };
        }
    }

    /// Write `words` (NUL-separated) over this process's argument strings, the range
    /// [arg_start, arg_end) of /proc/self/stat (fields 48 and 49), so /proc/PID/cmdline and ps
    /// show them. Cut to fit; the rest of the range is zeroed. Nothing happens when the range
    /// cannot be read.
    fn set_title(words: &[&[u8]]) {
        let Ok(stat) = super::read_kernel_file("/proc/self/stat") else {
            return;
        };
        // Fields after the command name, which is in parentheses and may hold anything.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            return;
        };
        // `rest` starts at field 3 (state): field N is rest's N-3.
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (Some(start), Some(end)) = (
            f.get(48 - 3).and_then(|v| v.parse::<usize>().ok()),
            f.get(49 - 3).and_then(|v| v.parse::<usize>().ok()),
        ) else {
            return;
        };
        if start == 0 || end <= start || end - start > (1 << 20) {
            return;
        }
        let len = end - start;
        let mut bytes = Vec::with_capacity(len);
        for w in words {
            bytes.extend_from_slice(w);
            bytes.push(0);
        }
        bytes.resize(len, 0);
        bytes[len - 1] = 0;
        // SAFETY: [start, end) is this process's argument area on its initial stack, mapped
        // writable and ours (the kernel reports it from mm->arg_start/arg_end); we are the only
        // thread, and the only other reader, std's copy of the argv pointers, reads NUL-
        // terminated strings from it, which it still holds (the last byte is NUL).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, len) };
    }

    /// The command line that [`runtime_start`] was given, owned (the keeper's title later
    /// overwrites the argument area).
    static ARGS: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

    /// The process's arguments: those `main` handed to [`runtime_start`], else std's (a binary
    /// with Rust's own start, the tests). std fills its copy from the C library's init only
    /// with glibc; under musl a binary that starts at its own C `main` has nothing there.
    pub fn args_os() -> Vec<std::ffi::OsString> {
        match ARGS.get() {
            Some(a) => a.clone(),
            None => std::env::args_os().collect(),
        }
    }

    /// What Rust's runtime start does before `main` that agent-run needs, for a binary that
    /// starts at its own C `main`: descriptors 0, 1 and 2 open (on /dev/null when closed),
    /// SIGPIPE ignored, and the arguments kept for [`args_os`] (`argc` strings at `argv`, as
    /// the C library passes them to `main`).
    ///
    /// # Safety
    ///
    /// `argv` is null or holds `argc` pointers to NUL-terminated strings that stay valid while
    /// this runs: the arguments the C library passed to `main`.
    pub unsafe fn runtime_start(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) {
        use std::os::unix::ffi::OsStrExt;
        let mut args = Vec::with_capacity(usize::try_from(argc).unwrap_or(0));
        if !argv.is_null() {
            for i in 0..usize::try_from(argc).unwrap_or(0) {
                // SAFETY: the caller's contract: `argc` valid pointers at `argv`, each to a
                // NUL-terminated string (the C library's arguments to `main`, on the initial
                // stack, which nothing has written to yet).
                let arg = unsafe {
                    let p = *argv.add(i);
                    if p.is_null() {
                        break;
                    }
                    std::ffi::CStr::from_ptr(p)
                };
                args.push(std::ffi::OsStr::from_bytes(arg.to_bytes()).to_owned());
            }
        }
        let _ = ARGS.set(args);
        let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        });
        // SAFETY: poll(2) reads and writes the three entries of an array on our stack; open(2)
        // reads a NUL-terminated literal; signal(2) installs SIG_IGN and touches no memory of
        // ours. Called first in `main`: no descriptor is in use by Rust code yet.
        unsafe {
            if libc::poll(fds.as_mut_ptr(), 3, 0) >= 0 {
                for f in &fds {
                    if f.revents & libc::POLLNVAL != 0 {
                        libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                    }
                }
            }
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
    }

    /// This process's own CPU so far: user and system microseconds, and minor page faults
    /// (getrusage(2), RUSAGE_SELF); zeros when it fails. For the launch phases' report.
    pub fn self_cpu() -> (u64, u64, u64) {
        // SAFETY: getrusage(2) writes one `rusage` into the zeroed value on our stack.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above: the pointer is to that value, alive for the call.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return (0, 0, 0);
        }
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        (us(ru.ru_utime), us(ru.ru_stime), ru.ru_minflt as u64)
    }

    /// Restore SIGPIPE's default action (Rust's runtime ignores it), so a command whose output
    /// goes to a closed pipe (`agent-run list | head`) ends quietly like any Unix filter. Not
    /// for the supervising wrapper: a dropped SSH channel must never kill it. Raw: rustix's
    /// sigaction is in its unstable `runtime` API.
    pub fn default_sigpipe() {
        // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of ours.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
}

// --- heap ---

/// The global allocator of the static binaries under musl: blocks under [`HEAP_LARGE`] from a
/// dlmalloc heap, which keeps the memory it got (musl's mallocng maps and unmaps pages as a
/// launch allocates and frees: ~60 mmap/munmap calls and their page faults), larger ones from
/// the C library, which maps them (so a zeroed one is fresh pages nobody touches: the keeper's
/// buffers are megabytes a short run never writes). Each block goes back to the allocator it
/// came from: `dealloc` and `realloc` get the layout it was allocated with.
#[cfg(target_env = "musl")]
pub struct Heap;

/// The size from which [`Heap`] hands a block to the C library.
#[cfg(target_env = "musl")]
pub const HEAP_LARGE: usize = 128 << 10;

#[cfg(target_env = "musl")]
static SMALL: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

// SAFETY: every method forwards to one of two sound allocators, chosen by the block's size,
// which `GlobalAlloc` guarantees is the same at `dealloc` (and `realloc`'s old layout) as it was
// at the allocation; a `realloc` across the threshold allocates in the other one, copies the
// smaller of the two sizes and frees the old block in its own.
#[cfg(target_env = "musl")]
unsafe impl std::alloc::GlobalAlloc for Heap {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.size() >= HEAP_LARGE {
            std::alloc::System.alloc(l)
        } else {
            SMALL.alloc(l)
        }
    }

    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.size() >= HEAP_LARGE {
            std::alloc::System.alloc_zeroed(l)
        } else {
            SMALL.alloc_zeroed(l)
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        if l.size() >= HEAP_LARGE {
            std::alloc::System.dealloc(p, l)
        } else {
            SMALL.dealloc(p, l)
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        match (l.size() >= HEAP_LARGE, new >= HEAP_LARGE) {
            (true, true) => std::alloc::System.realloc(p, l, new),
            (false, false) => SMALL.realloc(p, l, new),
            _ => {
                // SAFETY (of the layout): `realloc`'s caller guarantees `new`, rounded up to
                // the alignment, does not overflow isize.
                let nl = std::alloc::Layout::from_size_align_unchecked(new, l.align());
                let q = self.alloc(nl);
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                    self.dealloc(p, l);
                }
                q
            }
        }
    }
}

// --- output path ---

/// Whether this process has exactly one thread (`Threads:` of /proc/self/status): what
/// [`fork_helper`] requires of its caller. `None` when it cannot be read.
pub fn single_threaded() -> Option<bool> {
    let status = read_kernel_file("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Threads:"))?;
    Some(line["Threads:".len()..].trim() == "1")
}

/// Fork a helper that runs `body` and exits with what it returns, never returning here (the
/// output keeper: no exec, so no second program load on the launch's path).
///
/// The child starts a new session (setsid), has stdin, stdout and stderr on `null`, holds no
/// descriptor above stderr but those in `keep` (every other one is closed), has every signal at
/// its default action except `ignore` (SIG_IGN), an empty signal mask, `name` as its comm
/// (truncated to 15 bytes) and `title` as its /proc/PID/cmdline (written over the wrapper's
/// argument strings in place, cut to fit, the rest of them zeroed). Then it runs `body` and
/// `_exit`s with its code (no atexit handler, no flush of buffers copied from the parent). In
/// the parent `body` is dropped unrun (so what it owns is closed there) and the child's pid
/// returned. `reset` is the set of signals whose action is not the default here
/// ([`nondefault_signals`], read after the caller's last change of one): the child resets
/// those.
///
/// The caller must be single-threaded (checked in debug builds): the child of a fork runs
/// ordinary Rust code (allocations, locks, threads of its own), which is sound only when no
/// other thread of the parent could have held a lock at the fork.
pub fn fork_helper<F: FnOnce() -> u8>(
    keep: &[RawFd],
    null: BorrowedFd<'_>,
    ignore: &[i32],
    reset: u64,
    name: &std::ffi::CStr,
    title: &[&[u8]],
    body: F,
) -> io::Result<Pid> {
    debug_assert_eq!(
        single_threaded(),
        Some(true),
        "fork_helper needs a single-threaded caller"
    );
    // Every signal stays blocked from before the fork until the child has reset the actions:
    // no handler of the parent's (signal-hook's, writing to the parent's pipe) runs in it.
    let signals = reset;
    let old_mask = raw::block_all_signals();
    // SAFETY: fork(2) through the C library (glibc's atfork handlers reset malloc and the
    // thread's cached state; musl's fork does as much for its own); the caller is
    // single-threaded, so the child's copy of every lock is unheld and it may run any code.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match raw::helper_setup(keep, null.as_raw_fd(), signals, ignore, name, title) {
            Ok(()) => body(),
            Err(_) => 70,
        };
        // SAFETY: _exit(2) ends the process at once; nothing of ours needs to run after.
        unsafe { libc::_exit(code.into()) }
    }
    let err = io::Error::last_os_error();
    raw::set_signal_mask(&old_mask);
    drop(body);
    if pid < 0 {
        return Err(err);
    }
    Ok(Pid::new(pid.into()).expect("fork returns the child's positive pid"))
}

// --- pty ---

/// In a forked child before exec, after setsid: make the terminal on `fd` this session's
/// controlling terminal (ioctl TIOCSCTTY, tty_ioctl(4)), so the workload's session owns it:
/// a hangup of the pty (its master closed) sends SIGHUP to the session's foreground group and
/// its leader, and `tty`, job control and `/dev/tty` work as in a terminal. Async-signal-safe:
/// one ioctl(2).
pub fn child_set_ctty(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal a terminal that is already
    // some other session's); no memory is passed.
    if unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn pidfd_of_self_can_be_opened_and_signalled_with_zero() {
        let fd = pidfd_open(Pid::this()).unwrap();
        pidfd_send_signal(fd.as_fd(), 0, false).unwrap();
        kill(Pid::this(), 0, false).unwrap();
    }

    /// Whether the pidfd polls readable (its process exited) within `t`.
    fn exits_within(pidfd: &OwnedFd, t: Duration) -> bool {
        let mut fds = [PollFd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let n = poll(&mut fds, Some(t)).unwrap();
        n == 1 && fds[0].revents & libc::POLLIN != 0
    }

    #[test]
    fn a_killed_child_polls_readable_and_is_reaped_with_its_signal() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = Pid::new(child.id().into()).unwrap();
        let fd = pidfd_open(pid).unwrap();
        assert!(!exits_within(&fd, Duration::ZERO), "alive");
        kill(pid, libc::SIGKILL, false).unwrap();
        assert!(exits_within(&fd, Duration::from_secs(30)));
        assert_eq!(
            waitpid_nohang(Some(pid)).unwrap(),
            Some((pid, WaitStatus::Signaled(libc::SIGKILL)))
        );
        assert!(child.try_wait().is_err(), "already reaped");
    }

    /// Any child, a session leader of its own included (the run's leader is one). A wait for
    /// any child would reap other tests' children: the check runs in a process of its own, this
    /// test binary run again for this one test.
    #[test]
    fn any_child_is_reaped_in_whatever_session_it_is() {
        if std::env::var_os("AGENT_RUN_SYS_REAP_PROBE").is_some() {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "exit 7"]);
            spawn_in_new_session(&mut cmd);
            // Reaped by waitpid_nohang(None): the call under test.
            #[allow(clippy::zombie_processes)]
            let child = cmd.spawn().unwrap();
            let pid = Pid::new(child.id().into()).unwrap();
            assert!(exits_within(
                &pidfd_open(pid).unwrap(),
                Duration::from_secs(30)
            ));
            assert_eq!(
                waitpid_nohang(None).unwrap(),
                Some((pid, WaitStatus::Exited(7)))
            );
            assert_eq!(
                waitpid_nohang(None).unwrap_err().raw_os_error(),
                Some(libc::ECHILD)
            );
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sys::tests::any_child_is_reaped_in_whatever_session_it_is",
            ])
            .args(["--test-threads", "1"])
            .env("AGENT_RUN_SYS_REAP_PROBE", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    /// Reap our child `pid` and return how it ended.
    fn reap(pid: Pid) -> WaitStatus {
        let fd = pidfd_open(pid).unwrap();
        assert!(
            exits_within(&fd, Duration::from_secs(30)),
            "{pid} did not exit"
        );
        waitpid_nohang(Some(pid)).unwrap().unwrap().1
    }

    #[test]
    fn the_fork_semantics_clone3_makes_a_child_with_its_pidfd() {
        match raw::clone3(None, true).unwrap() {
            // SAFETY: the child of a multi-threaded process: _exit(2) at once, nothing else.
            Forked::Child => unsafe { libc::_exit(7) },
            Forked::Parent(pid, fd) => {
                assert!(fd.is_some(), "no pidfd for {pid}");
                assert_eq!(reap(pid), WaitStatus::Exited(7));
            }
        }
    }

    #[test]
    fn a_second_open_file_description_does_not_get_the_lock() {
        let f = tempfile::tempfile().unwrap();
        let path = format!("/proc/self/fd/{}", f.as_raw_fd());
        let other = std::fs::File::open(path).unwrap();
        assert!(try_lock_exclusive(f.as_fd()).unwrap());
        assert!(!try_lock_exclusive(other.as_fd()).unwrap());
    }

    #[test]
    fn inotify_names_the_file_renamed_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let ino = Inotify::new().unwrap();
        let wd = ino.add_watch(dir.path(), Inotify::CHANGED).unwrap();
        assert!(ino.read_events().is_empty());
        std::fs::write(dir.path().join("tmp"), b"x").unwrap();
        std::fs::rename(dir.path().join("tmp"), dir.path().join("status.json")).unwrap();
        let epoll = Epoll::new().unwrap();
        epoll.add(ino.raw_fd(), 7).unwrap();
        assert_eq!(epoll.wait(Some(Duration::from_secs(30))).unwrap(), vec![7]);
        let evs = ino.read_events();
        assert!(
            evs.iter()
                .any(|e| e.wd == wd && e.mask & libc::IN_MOVED_TO != 0 && e.name == "status.json"),
            "{evs:?}"
        );
        epoll.remove(ino.raw_fd());
        assert_eq!(epoll.wait(Some(Duration::ZERO)).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn host_facts_are_plausible() {
        assert!(clock_ticks_per_sec() >= 100);
        let up = boottime_secs();
        let ours = crate::procfs::stat(Pid::this()).unwrap().start_ticks as f64
            / clock_ticks_per_sec() as f64;
        assert!(
            ours <= up + 1.0,
            "started {ours}s after boot, booted {up}s ago"
        );
        assert_eq!(geteuid(), euid_from_proc());
        assert!(writable(&std::env::temp_dir()));
        assert!(!hostname().is_empty());
    }

    fn euid_from_proc() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        uid.split_whitespace().nth(2).unwrap().parse().unwrap()
    }
}
