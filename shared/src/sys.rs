//! Raw syscalls that std lacks, each in a small function with its safety argument.
//!
//! This is the only module of the library that may use `unsafe`. Every function here takes and
//! returns owned or borrowed descriptors and typed pids, so callers stay in safe code. Functions
//! marked async-signal-safe are the only ones a `pre_exec` closure may call.
#![allow(unsafe_code)]

use crate::pid::Pid;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `PIDFD_SIGNAL_PROCESS_GROUP` (linux/pidfd.h, kernel 6.9+): signal the pidfd's whole group.
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 4;
/// `CLOSE_RANGE_CLOEXEC` (linux/close_range.h, kernel 5.11+).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Open a pidfd for `pid` (pidfd_open(2)). Works for any process we can see, not only children;
/// while we hold it, signals sent through it cannot reach a process that reused the pid.
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is passed.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid.get(), 0 as libc::c_uint) })?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it. pidfds are
    // always close-on-exec (pidfd_open(2)).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Send `sig` to the process behind `pidfd` (pidfd_send_signal(2)). With `group`, to its whole
/// process group (kernel 6.9+; older kernels answer EINVAL).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: i32, group: bool) -> io::Result<()> {
    let flags = if group { PIDFD_SIGNAL_PROCESS_GROUP } else { 0 };
    // SAFETY: a valid fd, a signal number and a NULL siginfo (the kernel fills it in as for
    // kill(2)); no memory of ours is written.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    })?;
    Ok(())
}

/// kill(2) to one process, or with `group` to the process group whose id is `pid`. Only for
/// kernels without pidfds, after the caller re-checked the process's start time.
pub fn kill(pid: Pid, sig: i32, group: bool) -> io::Result<()> {
    let target = if group { -pid.get() } else { pid.get() };
    // SAFETY: integers only. `Pid` is > 0, so `target` is never 0 or -1 (our own group, or
    // every process we may signal).
    if unsafe { libc::kill(target, sig) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Make this process a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER): orphans of our
/// descendants are reparented to us instead of to init.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag; no pointers.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } as _)?;
    Ok(())
}

/// One `poll(2)` entry.
pub struct PollFd {
    pub fd: RawFd,
    pub events: i16,
    pub revents: i16,
}

/// `poll(2)` with a timeout (None blocks). EINTR is reported as zero ready fds.
pub fn poll(fds: &mut [PollFd], timeout: Option<Duration>) -> io::Result<usize> {
    let mut raw: Vec<libc::pollfd> = fds
        .iter()
        .map(|p| libc::pollfd {
            fd: p.fd,
            events: p.events,
            revents: 0,
        })
        .collect();
    let ms = match timeout {
        None => -1,
        // Round up, so a deadline 0.4 ms away does not spin with a 0 ms timeout.
        Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
    };
    // SAFETY: `raw` is a valid, exclusively borrowed array of `raw.len()` pollfd structs.
    let r = unsafe { libc::poll(raw.as_mut_ptr(), raw.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    for (p, r) in fds.iter_mut().zip(&raw) {
        p.revents = r.revents;
    }
    Ok(r as usize)
}

/// Non-blocking exclusive `flock(2)`. Ok(false) when another open file description holds it.
pub fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: flock on a valid fd; no memory involved.
    let r = unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Blocking exclusive `flock(2)`, retried on EINTR.
pub fn lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<()> {
    loop {
        // SAFETY: flock on a valid fd; no memory involved.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
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
    let mut status: libc::c_int = 0;
    let target = pid.map_or(-1, Pid::get);
    loop {
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let r = unsafe { libc::waitpid(target, &mut status, libc::WNOHANG) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let Some(p) = Pid::new(r as i64) else {
            return Ok(None);
        };
        let ws = if libc::WIFEXITED(status) {
            WaitStatus::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            WaitStatus::Signaled(libc::WTERMSIG(status))
        } else {
            continue; // stopped/continued are not reported without WUNTRACED/WCONTINUED
        };
        return Ok(Some((p, ws)));
    }
}

/// Reap every child that has ended (never blocks). Returns the leader's status if it was among
/// them, and whether any child at all is left.
pub fn reap_all(leader: Option<Pid>) -> (Option<WaitStatus>, bool) {
    let mut leader_status = None;
    loop {
        match waitpid_nohang(None) {
            Ok(Some((p, ws))) => {
                if Some(p) == leader {
                    leader_status = Some(ws);
                }
            }
            Ok(None) => return (leader_status, true),
            Err(_) => return (leader_status, false), // ECHILD: nothing left
        }
    }
}

/// This process's effective uid.
pub fn geteuid() -> u32 {
    // agent-run never changes its credentials, so one call per process is enough (the watchdog
    // asks once per run dir of a pass).
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    // SAFETY: geteuid cannot fail and touches no memory.
    *EUID.get_or_init(|| unsafe { libc::geteuid() })
}

/// Whether this process may write `path` by its effective ids (faccessat(2) with AT_EACCESS).
pub fn writable(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) == 0 }
}

/// This host's name (gethostname(2)).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the result is NUL-terminated when it fits.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The login name of `uid`: `$USER` when /etc/passwd agrees, else the first /etc/passwd entry
/// with that uid, else the number. Read directly rather than through NSS: a static binary has no
/// NSS modules, and a launch should not pay for loading them.
pub fn user_name(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entries: Vec<(&str, Option<u32>)> = passwd
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.parse().ok();
            Some((name, id))
        })
        .collect();
    let env_user = std::env::var("USER").ok();
    if let Some(u) = env_user.as_deref() {
        if entries.iter().any(|(n, id)| *n == u && *id == Some(uid)) {
            return u.to_string();
        }
    }
    entries
        .iter()
        .find(|(_, id)| *id == Some(uid))
        .map_or_else(|| uid.to_string(), |(n, _)| n.to_string())
}

/// Clock ticks per second (sysconf(_SC_CLK_TCK)), for /proc start times.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no memory arguments.
    let r = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if r > 0 {
        r as u64
    } else {
        100
    }
}

/// Seconds since boot (CLOCK_BOOTTIME), comparable with /proc start ticks.
pub fn boottime_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

// ---- the pre_exec half: async-signal-safe only -------------------------------------------

/// In a forked child before exec: reset every signal to its default action and empty the
/// signal mask, so the workload inherits no ignored signal (SIGPIPE included) and no mask.
/// Async-signal-safe: sigaction(2) and sigprocmask(2) only.
pub fn child_reset_signals() -> io::Result<()> {
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
/// (close_range(2) with CLOSE_RANGE_CLOEXEC), so no descriptor the wrapper inherited leaks into
/// the workload, while std's exec-error pipe still works. Async-signal-safe: one syscall.
pub fn child_cloexec_from_3() -> io::Result<()> {
    // SAFETY: close_range takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
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

/// In a forked child before exec: start a new session (setsid(2)). Async-signal-safe.
pub fn child_setsid() -> io::Result<()> {
    // SAFETY: setsid has no arguments.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_of_self_can_be_opened_and_signalled_with_zero() {
        let fd = pidfd_open(Pid::this()).unwrap();
        pidfd_send_signal(fd.as_fd(), 0, false).unwrap();
    }

    use std::os::fd::AsFd;
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

/// An inotify instance (inotify(7)), non-blocking and close-on-exec: event-driven waits for
/// records and leases instead of sleep loops.
pub struct Inotify {
    fd: OwnedFd,
}

impl Inotify {
    /// `IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE`: a file renamed into place, written or created.
    pub const CHANGED: u32 = libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_CREATE;
    /// `IN_MODIFY`: bytes appended.
    pub const MODIFIED: u32 = libc::IN_MODIFY;

    /// A new instance.
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: flags only; returns a new fd or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nothing else owns.
        Ok(Inotify {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Throw away pending events (callers re-read the files they care about).
    pub fn drain(&self) {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: the buffer is valid for its length.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                return;
            }
        }
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
}

/// One inotify event: the watch it came from, its mask, and the name inside a watched directory.
#[derive(Debug, Clone)]
pub struct InotifyEvent {
    pub wd: i32,
    pub mask: u32,
    pub name: String,
}

impl Inotify {
    /// Watch `path` for `mask` events (IN_DONT_FOLLOW: a symlink is watched as itself) and
    /// return the watch descriptor.
    pub fn add_watch(&self, path: &std::path::Path, mask: u32) -> io::Result<i32> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a valid fd and a NUL-terminated path that outlives the call.
        let r = unsafe {
            libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), mask | libc::IN_DONT_FOLLOW)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r)
    }

    /// Stop watching a descriptor (errors ignored: the watch may already be gone).
    pub fn rm_watch(&self, wd: i32) {
        // SAFETY: integers only.
        unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
    }

    /// Read every pending event without blocking.
    pub fn read_events(&self) -> Vec<InotifyEvent> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: the buffer is valid for its length.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                return out;
            }
            let n = r as usize;
            let mut off = 0;
            let head = std::mem::size_of::<libc::inotify_event>();
            while off + head <= n {
                // SAFETY: the kernel wrote whole events; the header may be unaligned in our
                // byte buffer, so it is read with read_unaligned.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
                let name_bytes = &buf[off + head..(off + head + ev.len as usize).min(n)];
                let end = name_bytes
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(name_bytes.len());
                out.push(InotifyEvent {
                    wd: ev.wd,
                    mask: ev.mask,
                    name: String::from_utf8_lossy(&name_bytes[..end]).into_owned(),
                });
                off += head + ev.len as usize;
            }
        }
    }
}

/// An epoll instance (epoll(7)): one wait over thousands of pidfds without rebuilding a poll set.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new close-on-exec instance.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: flags only.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nothing else owns.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watch `fd` for readability; `token` comes back with its events.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `ev` is valid for the call; the kernel copies it.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stop watching `fd` (closing the fd also removes it).
    pub fn remove(&self, fd: RawFd) {
        // SAFETY: a NULL event is allowed for EPOLL_CTL_DEL since Linux 2.6.9.
        unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }

    /// Wait up to `timeout` (None: forever) and return the tokens that are ready.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Vec<u64>> {
        let mut evs: Vec<libc::epoll_event> = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let ms = match timeout {
            None => -1,
            Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        // SAFETY: `evs` is valid for `evs.len()` events.
        let r = unsafe {
            libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, ms)
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(Vec::new());
            }
            return Err(e);
        }
        Ok(evs[..r as usize].iter().map(|e| e.u64).collect())
    }
}

/// Raise the soft open-file limit to the hard limit (a watchdog holds one pidfd per live
/// wrapper). Returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer, then a valid in-pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Stop this process (SIGSTOP to ourselves) until someone continues it (`fg`, SIGCONT): what
/// Ctrl-Z does, once the wrapper has suspended its run. Returns once continued.
pub fn stop_self() {
    // SAFETY: raise takes a signal number; SIGSTOP stops every thread until SIGCONT.
    unsafe { libc::raise(libc::SIGSTOP) };
}

/// SIGKILL this process at once (fault injection in debug builds).
pub fn kill_self() -> ! {
    // SAFETY: raise takes a signal number; SIGKILL cannot be caught, so it does not return.
    unsafe { libc::raise(libc::SIGKILL) };
    std::process::abort()
}

/// Restore SIGPIPE's default action (Rust's runtime ignores it), so a command whose output goes
/// to a closed pipe (`agent-run list | head`) ends quietly like any Unix filter. Not for the
/// supervising wrapper: a dropped SSH channel must never kill it.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of ours.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
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
