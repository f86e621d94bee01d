//! Signals: kill by pid or pidfd, the signal mask, and every action reset to its default.

use super::*;

/// kill(2) to one process. Only for kernels without pidfds, after the caller re-checked the
/// process's start time, or for our own unreaped child. `Pid` is > 0, so the target is never 0
/// or -1 (our own group, or every process we may signal).
pub fn kill_process(pid: Pid, sig: Sig) -> io::Result<()> {
    Ok(rustix::process::kill_process(
        rustix_pid(pid),
        signal(sig)?,
    )?)
}

/// kill(2) to the process group whose id is `pgid` (> 0: never our own group nor every
/// process). Only for kernels without pidfds, after the caller re-checked its leader.
pub fn kill_group(pgid: Pid, sig: Sig) -> io::Result<()> {
    Ok(rustix::process::kill_process_group(
        rustix_pid(pgid),
        signal(sig)?,
    )?)
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
        .filter_map(|l| {
            l.strip_prefix("SigIgn:")
                .or_else(|| l.strip_prefix("SigCgt:"))
        })
        .fold(0, |set, v| set | hex(v))
}

/// `PIDFD_SIGNAL_PROCESS_GROUP` (linux/pidfd.h, kernel 6.9+): signal the pidfd's whole group.
pub(super) const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 4;

/// Send `sig` to the process behind `pidfd` (pidfd_send_signal(2)).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: Sig) -> io::Result<()> {
    pidfd_signal(pidfd, sig, 0)
}

/// Send `sig` to the whole process group of the process behind `pidfd` (kernel 6.9+; older
/// kernels answer EINVAL).
pub fn pidfd_send_signal_group(pidfd: BorrowedFd<'_>, sig: Sig) -> io::Result<()> {
    pidfd_signal(pidfd, sig, PIDFD_SIGNAL_PROCESS_GROUP)
}

/// pidfd_send_signal(2) with `flags`. Raw: rustix's `pidfd_send_signal` takes no flags.
fn pidfd_signal(pidfd: BorrowedFd<'_>, sig: Sig, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: a valid fd, a signal number and a NULL siginfo (the kernel fills it in as for
    // kill(2)); no memory of ours is written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig.number(),
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
/// parent's non-default ones, [`nondefault_signals`]) to its default action and empty
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

/// The action of every signal of `set` (bit N-1 for signal N) back to SIG_DFL, leaving the
/// mask alone. Async-signal-safe.
pub(super) fn child_reset_signals_keep_mask(set: u64) {
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

/// Restore SIGPIPE's default action (Rust's runtime ignores it), so a command whose output
/// goes to a closed pipe (`agent-run list | head`) ends quietly like any Unix filter. Not
/// for the supervising wrapper: a dropped SSH channel must never kill it. Raw: rustix's
/// sigaction is in its unstable `runtime` API.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of ours.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
