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
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use raw::{child_cloexec_from_3, child_reset_signals};
pub use raw::{default_sigpipe, pidfd_send_signal};

// ---- processes ----------------------------------------------------------------------------

/// Our positive pid as rustix's.
fn rustix_pid(pid: Pid) -> rustix::process::Pid {
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

// ---- spawning: the pre_exec half is async-signal-safe only --------------------------------

/// In a forked child before exec: start a new session (setsid(2), one raw syscall in rustix's
/// backend). Async-signal-safe.
fn child_setsid() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// Make `cmd` start its program in a new session with a clean signal state and no inherited
/// descriptor above stderr. The `pre_exec` closure calls only async-signal-safe functions:
/// sigaction, sigprocmask, setsid and close_range.
pub fn spawn_in_new_session(cmd: &mut std::process::Command) {
    spawn_in_new_session_into(cmd, None, None);
}

/// The errno a spawn fails with when the child could not enter its cgroup: ECHRNG, which no
/// step of a spawn (fork, setsid, exec) ever returns, so the parent can tell it apart.
pub const CGROUP_ENTRY_ERRNO: i32 = libc::ECHRNG;

/// [`spawn_in_new_session`], and with `cgroup_procs` (an open `cgroup.procs` of the run's
/// cgroup) the child moves itself into that cgroup (writes `0`: "this process") before it
/// execs, so the workload runs no code of its own outside it. A failed move fails the spawn
/// with [`CGROUP_ENTRY_ERRNO`]. Async-signal-safe: write(2) on a descriptor opened before the
/// fork. With `ctty` (a pty slave the parent keeps open until the spawn returns), the new
/// session takes that terminal as its controlling terminal ([`child_set_ctty`]).
pub fn spawn_in_new_session_into(
    cmd: &mut std::process::Command,
    cgroup_procs: Option<RawFd>,
    ctty: Option<RawFd>,
) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec; it allocates nothing, takes no
    // lock and calls only the async-signal-safe syscalls above, ioctl(2) and write(2)
    // (signal-safety(7)).
    // `cgroup_procs` is a descriptor the parent keeps open until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            child_reset_signals()?;
            child_setsid()?;
            if let Some(fd) = ctty {
                child_set_ctty(fd)?;
            }
            if let Some(fd) = cgroup_procs {
                let r = libc::write(fd, b"0".as_ptr().cast(), 1);
                if r != 1 {
                    return Err(io::Error::from_raw_os_error(CGROUP_ENTRY_ERRNO));
                }
            }
            child_cloexec_from_3()
        });
    }
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
    fn drain(&self) {
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

// ---- raw: what rustix does not offer ------------------------------------------------------

/// The calls rustix has no function for, as raw syscalls with their safety arguments.
mod raw {
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd};

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

    /// In a forked child before exec: reset every signal to its default action and empty the
    /// signal mask, so the workload inherits no ignored signal (SIGPIPE included) and no mask.
    /// Async-signal-safe: sigaction(2) and sigprocmask(2) only.
    pub(super) fn child_reset_signals() -> io::Result<()> {
        // The raw syscall, not glibc's signal(): glibc refuses signals 32 and 33 (its reserved
        // SIGCANCEL and SIGSETXID) with EINVAL, so an ignored 32 would leak into the workload.
        // A kernel `struct sigaction` that is all zeros is SIG_DFL, no flags, no restorer, an
        // empty mask, on every architecture's layout (with or without sa_restorer).
        let dfl = [0u64; 4];
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
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

    /// Restore SIGPIPE's default action (Rust's runtime ignores it), so a command whose output
    /// goes to a closed pipe (`agent-run list | head`) ends quietly like any Unix filter. Not
    /// for the supervising wrapper: a dropped SSH channel must never kill it. Raw: rustix's
    /// sigaction is in its unstable `runtime` API.
    pub fn default_sigpipe() {
        // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of ours.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
}

// --- output path ---

/// Make `cmd` (the output keeper, agent-run re-executed) start in a new session holding exactly
/// the descriptors in `keep` (at their own numbers) above stderr: every other descriptor is
/// marked close-on-exec (close_range(2) with CLOSE_RANGE_CLOEXEC), then `keep` loses the flag.
/// The run's lock, the journal and the pipes' write ends never reach the keeper. The `pre_exec`
/// closure calls only async-signal-safe functions: setsid, close_range and fcntl.
pub fn spawn_keeper(cmd: &mut std::process::Command, keep: Vec<RawFd>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec; it allocates nothing (`keep`
    // was built before the fork and is only read), takes no lock and calls only setsid(2),
    // close_range(2) and fcntl(2) (signal-safety(7)). The descriptors in `keep` are held open
    // by the parent until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            child_setsid()?;
            child_cloexec_from_3()?;
            for &fd in &keep {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Own descriptor `n`, handed to this process by number by its parent (the keeper's sources
/// and logs, see [`spawn_keeper`]). Fails when `n` is not open.
pub fn take_passed_fd(n: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) only asks whether `n` is open.
    if n < 0 || unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: `n` is open and was passed to us to own: the keeper takes each number once, at
    // start, before anything else in the process could have opened or wrapped it.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
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
