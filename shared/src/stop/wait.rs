//! The wait between deadlines: one poll(2) on every member's pidfd, the cgroup's events and the
//! escalation descriptor. After `cgroup.kill`, on the cgroup's events alone while it is
//! populated.

use super::*;

impl Stopper<'_> {
    /// Wait until a member goes, the escalation fd fires, or `timeout`. Returns true when the
    /// escalation asked for KILL now.
    pub(super) fn wait(
        &mut self,
        timeout: Duration,
        esc: Option<&mut (dyn Escalation + '_)>,
    ) -> bool {
        if self.cgroup_killed.is_some() && self.wait_for_empty(timeout) {
            return false;
        }
        let live: Vec<Pid> = self.live();
        let mut fds = Vec::with_capacity(live.len() + 1);
        let mut polled = Vec::with_capacity(live.len());
        let mut unpinned = false;
        for p in &live {
            match &self.members[p].fd {
                Some(fd) => {
                    fds.push(sys::PollFd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    polled.push(*p);
                }
                None => unpinned = true,
            }
        }
        let esc_index = esc.as_ref().map(|e| {
            fds.push(sys::PollFd {
                fd: e.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.len() - 1
        });
        // The cgroup emptying (or filling) wakes the wait too.
        if let Some(ev) = &self.events {
            fds.push(sys::PollFd {
                fd: ev.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            });
        }
        // Without pidfds, /proc is the only feedback: look again every 10 ms.
        let timeout = if unpinned {
            timeout.min(Duration::from_millis(10))
        } else {
            timeout
        };
        if sys::poll(&mut fds, Some(timeout)).is_err() {
            std::thread::yield_now();
        }
        self.reap_dead_children();
        for (i, p) in polled.iter().enumerate() {
            if fds[i].revents != 0 {
                self.mark_gone(*p);
            }
        }
        if let Some(ev) = &self.events {
            let i = fds.len() - 1;
            if fds[i].revents != 0 {
                // kernfs reports a change until the file is read again.
                use std::os::unix::fs::FileExt;
                let _ = ev.read_at(&mut [0u8; 128], 0);
            }
        }
        if unpinned {
            for p in &live {
                let m = &self.members[p];
                if m.fd.is_none() {
                    let alive = procfs::stat(*p)
                        .is_some_and(|s| s.start_ticks == m.stat.start_ticks && !s.is_dead());
                    if !alive {
                        self.mark_gone(*p);
                    }
                }
            }
        }
        match (esc, esc_index) {
            (Some(e), Some(i)) if fds[i].revents != 0 => e.kill_now(),
            _ => false,
        }
    }

    /// After `cgroup.kill`: while the cgroup is populated, wait on its `cgroup.events` alone
    /// (at most [`KILL_AGAIN`], so the loop can write `cgroup.kill` again), reaping as
    /// children end. Returns false when it did not wait (no events file, or the cgroup is
    /// empty): then the members' pidfds say who is gone. A thousand members dying at once
    /// would wake a wait on their pidfds once per exit, each wake polling all of them; the
    /// kernel's count wakes it once.
    fn wait_for_empty(&mut self, timeout: Duration) -> bool {
        use std::os::unix::fs::FileExt;
        let Some(ev) = &self.events else {
            return false;
        };
        // Read through the polled descriptor itself: a change after this read wakes the poll.
        let mut buf = [0u8; 128];
        let populated = ev.read_at(&mut buf, 0).is_ok_and(|n| {
            std::str::from_utf8(&buf[..n])
                .is_ok_and(|e| crate::cgroup::events_populated(e) == Some(true))
        });
        if !populated {
            return false;
        }
        let mut fds = [sys::PollFd {
            fd: ev.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        }];
        if sys::poll(&mut fds, Some(timeout.min(KILL_AGAIN))).is_err() {
            std::thread::yield_now();
        }
        self.reap_dead_children();
        true
    }
}
