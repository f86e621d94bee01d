//! The server's parent: the agent host that launched it. The server never outlives it.
//!
//! EOF on stdin is the usual end of a session, but a client killed by SIGKILL while another
//! process holds the server's stdin open (a sibling it forked, a shell between them) gives no EOF.
//! So the server also watches its parent through a pidfd, which polls readable once the parent
//! has exited (one blocking thread sleeps in that poll): no signal handler and no pid-reuse race. `PR_SET_PDEATHSIG` would
//! signal us at the death of the *thread* that forked us, which a client may well end on
//! purpose.
//!
//! The pidfd is opened after reading the parent's pid, and that pid is read again afterwards: if
//! it is still our parent, the pidfd is our parent's (had the parent died between the two reads,
//! we would have been reparented). A parent that is pid 1 is not watched: init does not go away,
//! and a server reparented to it before this check has no client left to watch.

use agent_run_shared::pid::Pid;
use agent_run_shared::sys;
use std::os::fd::{AsRawFd, OwnedFd};

/// A pidfd on the parent.
pub struct Parent {
    pub pid: u32,
    /// None: it was gone by the time we looked.
    fd: Option<OwnedFd>,
}

impl Parent {
    /// Pin the parent. Ok(None) when there is none to watch (pid 1).
    pub fn pin() -> Result<Option<Parent>, String> {
        let pid = std::os::unix::process::parent_id();
        if pid <= 1 {
            return Ok(None);
        }
        let fd = Pid::new(pid.into())
            .ok_or_else(|| format!("parent pid {pid} out of range"))
            .and_then(|p| {
                sys::pidfd_open(p).map_err(|e| format!("cannot pin the parent {pid}: {e}"))
            });
        let fd = match fd {
            Ok(fd) if std::os::unix::process::parent_id() == pid => Some(fd),
            // It exited before the pidfd was open, or just after (reparented): gone already.
            Ok(_) => None,
            Err(_) if std::os::unix::process::parent_id() != pid => None,
            Err(e) => return Err(e),
        };
        Ok(Some(Parent { pid, fd }))
    }

    /// Returns once the parent has exited.
    pub async fn gone(&self) {
        let Some(fd) = &self.fd else {
            return;
        };
        let fd = match fd.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                crate::say(&format!(
                    "cannot watch the parent {}: {e}: the server ends at the EOF of its stdin only",
                    self.pid
                ));
                return std::future::pending().await;
            }
        };
        // Readable once the process has exited. EINTR is asked again; another failure counts
        // as gone (the server then shuts down, which is the safe side).
        let _ = tokio::task::spawn_blocking(move || loop {
            let mut fds = [sys::PollFd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            match sys::poll(&mut fds, None) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                _ => return,
            }
        })
        .await;
    }
}
