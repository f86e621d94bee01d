//! A master connection we started: its login, then its pid pinned by a pidfd.
//!
//! [`Login`] reads what `ssh -f` said and turns its exit into Ok(messages) or Err(why).
//! [`Master`] is the running master: liveness is a poll of its pidfd, and [`Master::stop`]
//! signals through that pidfd only, so a reused pid is never hit. The caller waits for the login
//! (with std or tokio) and runs `ssh -O check` for the pid; the decisions are here.

use super::children::exited;
use crate::pid::Pid;
use crate::signal::Sig;
use crate::sys;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// How long the master gets after TERM, then after KILL.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// A login under way: the file that gets ssh's messages.
pub struct Login {
    errors: PathBuf,
}

impl Login {
    pub(super) fn new(errors: PathBuf) -> Login {
        Login { errors }
    }

    /// What the end of `ssh -f` means. `status` is Ok(None) when it did not end within
    /// `timeout` (the caller has killed it). Ok(what ssh said, trimmed: warnings a user may want
    /// to see) or Err(why, on one line).
    pub fn outcome(
        self,
        status: io::Result<Option<ExitStatus>>,
        timeout: Option<Duration>,
    ) -> Result<String, String> {
        let said = fs::read_to_string(&self.errors).unwrap_or_default();
        let _ = fs::remove_file(&self.errors);
        let said = said.trim().to_string();
        match status {
            Ok(Some(st)) if st.success() => Ok(said),
            Ok(Some(_)) if !said.is_empty() => Err(said.replace('\n', "; ")),
            Ok(Some(st)) => Err(format!(
                "ssh exited {}",
                st.code().map_or("a signal".to_string(), |c| c.to_string())
            )),
            Ok(None) => Err(format!("no login within {:?}", timeout.unwrap_or_default())),
            Err(e) => Err(format!("cannot wait for ssh: {e}")),
        }
    }
}

/// A running master: its pid (for messages), a pidfd that pins it, and which one it is (a late
/// report about an earlier master must not stop its successor).
pub struct Master {
    pid: Pid,
    fd: OwnedFd,
    gen: u64,
}

impl Master {
    /// Pin the master whose pid `ssh -O check` gave; `gen` counts the masters of a link.
    pub fn pin(pid: Option<Pid>, gen: u64) -> Result<Master, String> {
        let pid = pid.ok_or("the master connection did not come up (ssh -O check failed)")?;
        let fd =
            sys::pidfd_open(pid).map_err(|e| format!("cannot pin the master ssh {pid}: {e}"))?;
        Ok(Master { pid, fd, gen })
    }

    /// Which master this is.
    pub fn generation(&self) -> u64 {
        self.gen
    }

    /// Whether it still runs.
    pub fn alive(&self) -> bool {
        !exited(&self.fd, Duration::ZERO)
    }

    /// A second handle on its pidfd, to wait on without holding a lock.
    pub fn pidfd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// TERM, then KILL after 500 ms: every channel over it ends with 255. A master that is
    /// merely hung on a dead link goes too. Blocks for at most a second. Err(message) when a
    /// signal could not be sent (ESRCH, already gone, is success).
    pub fn stop(self) -> Result<(), String> {
        for sig in [Sig::Term, Sig::Kill] {
            if exited(&self.fd, Duration::ZERO) {
                break;
            }
            if let Err(e) = sys::pidfd_send_signal(self.fd.as_fd(), sig) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(format!("cannot stop the master ssh {}: {e}", self.pid));
                }
                break;
            }
            if exited(&self.fd, STOP_WAIT) {
                break;
            }
        }
        Ok(())
    }
}
