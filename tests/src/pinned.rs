//! `Pinned`: pidfds for the processes a test sees, killed by pidfd when it ends.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::{proc_stat, proc_threads, sys};

/// pidfds for a set of processes, opened right after the handshake, so that later checks and
/// signals reach these processes and never a process that reused a pid. On drop, every pinned
/// process still alive is sent SIGKILL through its pidfd.
pub struct Pinned {
    procs: Vec<(i32, Option<OwnedFd>)>,
}

fn readable(fd: &OwnedFd) -> bool {
    use std::os::fd::AsFd;
    sys::poll_readable(&[fd.as_fd()], 0)
        .map(|r| r[0])
        .unwrap_or_else(|e| panic!("poll on a pidfd: {e}"))
}

impl Pinned {
    /// Opens a pidfd for each pid; a pid already gone is recorded as gone.
    pub fn new(pids: &[i32]) -> Pinned {
        let procs = pids
            .iter()
            .map(|&pid| {
                let fd = sys::pidfd_open(pid)
                    .unwrap_or_else(|e| panic!("pidfd_open({pid}): {e} (Linux >= 5.3 needed)"));
                (pid, fd)
            })
            .collect();
        Pinned { procs }
    }

    /// Every pinned pid, alive or not.
    pub fn pids(&self) -> Vec<i32> {
        self.procs.iter().map(|(pid, _)| *pid).collect()
    }

    /// The pinned pids still alive: the pidfd does not poll readable (it does once the process
    /// has exited, zombie included) and /proc does not show it as a zombie or dead.
    pub fn alive(&self) -> Vec<i32> {
        self.procs
            .iter()
            .filter(|(pid, fd)| match fd {
                // The pidfd polls readable once every thread has exited; a zombie main
                // thread whose other threads run is alive.
                Some(fd) => {
                    !readable(fd)
                        && proc_stat(*pid)
                            .is_some_and(|s| !matches!(s.0, 'Z' | 'X') || proc_threads(*pid) > 1)
                }
                None => false,
            })
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Waits, to one deadline, until every pinned process has exited (zombies count as gone).
    /// Ok(time waited), or Err(the pids still alive at the deadline).
    pub fn wait_all_gone(&self, timeout: Duration) -> Result<Duration, Vec<i32>> {
        use std::os::fd::AsFd;
        let start = Instant::now();
        let mut pending: Vec<&(i32, Option<OwnedFd>)> =
            self.procs.iter().filter(|(_, fd)| fd.is_some()).collect();
        loop {
            // Before the poll: with nothing pending (every pid gone at the pin) a poll of no
            // descriptors would sleep out the whole timeout.
            if pending.is_empty() {
                return Ok(start.elapsed());
            }
            let remaining = timeout.saturating_sub(start.elapsed());
            let fds: Vec<_> = pending
                .iter()
                .filter_map(|(_, fd)| fd.as_ref().map(|fd| fd.as_fd()))
                .collect();
            let ms = remaining.as_millis().min(i32::MAX as u128) as i32;
            let gone =
                sys::poll_readable(&fds, ms).unwrap_or_else(|e| panic!("poll on pidfds: {e}"));
            let mut gone = gone.into_iter();
            pending.retain(|_| !gone.next().unwrap_or(false));
            if pending.is_empty() {
                continue;
            }
            if remaining.is_zero() {
                return Err(pending.iter().map(|(pid, _)| *pid).collect());
            }
        }
    }

    /// Sends `sig` to one pinned pid through its pidfd. Panics if `pid` is not pinned.
    pub fn signal(&self, pid: i32, sig: i32) -> io::Result<()> {
        use std::os::fd::AsFd;
        let (_, fd) = self
            .procs
            .iter()
            .find(|(p, _)| *p == pid)
            .unwrap_or_else(|| panic!("pid {pid} is not pinned"));
        match fd {
            Some(fd) => sys::pidfd_send_signal(fd.as_fd(), sig),
            None => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        use std::os::fd::AsFd;
        for (_, fd) in &self.procs {
            if let Some(fd) = fd {
                if !readable(fd) {
                    // ESRCH: it exited meanwhile, which is what we want.
                    let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
                }
            }
        }
    }
}

/// SIGKILLs, by pid through pidfds, what `find` returns, and again what appeared meanwhile,
/// until `find` returns nothing or `rounds` rounds have passed. For the `Drop` of a test's
/// guards: it never fails.
pub fn kill_until_gone(rounds: usize, mut find: impl FnMut() -> Vec<i32>) {
    for _ in 0..rounds {
        let pids = find();
        if pids.is_empty() {
            return;
        }
        let pins = Pinned::new(&pids);
        for pid in pins.pids() {
            let _ = pins.signal(pid, libc::SIGKILL);
        }
        let _ = pins.wait_all_gone(Duration::from_secs(5));
    }
}
