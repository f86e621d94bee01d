//! Our children: pidfds, the subreaper flag and the reap.

use super::*;

/// Open a pidfd for `pid` (pidfd_open(2)). Works for any process we can see, not only children;
/// while we hold it, signals sent through it cannot reach a process that reused the pid.
/// pidfds are always close-on-exec.
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    Ok(rustix::process::pidfd_open(
        rustix_pid(pid),
        rustix::process::PidfdFlags::empty(),
    )?)
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
