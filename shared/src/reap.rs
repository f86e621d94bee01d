//! Reaping: a parent's duty that no stop does for it (see [`crate::stop`]). The wrapper, a child
//! subreaper, reaps every child that has ended so the kernel's count of its children is the
//! truth.

use crate::pid::Pid;
use crate::sys::{waitpid_nohang, WaitStatus};

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
