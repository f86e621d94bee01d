//! The syscalls the harness needs, on top of `agent_run_shared::sys` (the product's one place
//! for unsafe code): no second copy of pidfd_open, pidfd_send_signal, poll or kill here.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use agent_run_shared::pid::Pid;
use agent_run_shared::signal::Sig;
use agent_run_shared::sys as shared;

fn pid_of(pid: i32) -> io::Result<Pid> {
    Pid::new(pid.into()).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// pidfd_open(2): Ok(None) when the process is already gone (ESRCH); EINVAL for pid <= 0.
pub fn pidfd_open(pid: i32) -> io::Result<Option<OwnedFd>> {
    match shared::pidfd_open(pid_of(pid)?) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
        Err(e) => Err(e),
    }
}

/// pidfd_send_signal(2) to the one process behind `fd`. ESRCH means it has exited.
pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: i32) -> io::Result<()> {
    shared::pidfd_send_signal(fd, Sig::from_number(sig))
}

/// pidfd_getfd(2): a copy of descriptor `target` of the process behind `pidfd`.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: i32) -> io::Result<OwnedFd> {
    let flags = rustix::process::PidfdGetfdFlags::empty();
    Ok(rustix::process::pidfd_getfd(pidfd, target, flags)?)
}

/// poll(2) for `events` on one fd: the events that came (empty at the timeout).
pub fn poll_one(fd: BorrowedFd<'_>, events: i16, timeout: std::time::Duration) -> io::Result<i16> {
    let mut pollfd = [shared::PollFd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }];
    shared::poll(&mut pollfd, Some(timeout))?;
    Ok(pollfd[0].revents)
}

/// poll(2) for readability; returns, per fd, whether it polled readable (or hung up).
/// EINTR counts as nothing ready.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pollfds: Vec<shared::PollFd> = fds
        .iter()
        .map(|fd| shared::PollFd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = u64::try_from(timeout_ms)
        .ok()
        .map(std::time::Duration::from_millis);
    shared::poll(&mut pollfds, timeout)?;
    Ok(pollfds.iter().map(|p| p.revents != 0).collect())
}

/// kill(2) to one positive pid (never 0 or -1, which reach many processes).
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    shared::kill_process(pid_of(pid)?, Sig::from_number(sig))
}

/// kill(2) to the process group `pgid` (positive: never the caller's own group or every
/// process), as a terminal sends Ctrl-C to its foreground group.
pub fn kill_group(pgid: i32, sig: i32) -> io::Result<()> {
    shared::kill_group(pid_of(pgid)?, Sig::from_number(sig))
}

/// SIGKILL to `pid` through a pidfd, so that a pid reused meanwhile is never hit. Ok when
/// the process is already gone. Cleanup only.
pub fn pidfd_kill(pid: i32) -> io::Result<()> {
    use std::os::fd::AsFd;
    match pidfd_open(pid)? {
        Some(fd) => match pidfd_send_signal(fd.as_fd(), libc::SIGKILL) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            other => other,
        },
        None => Ok(()),
    }
}

/// The effective uid of the test process.
pub fn geteuid() -> u32 {
    shared::geteuid()
}
