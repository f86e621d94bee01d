//! Suspending and resuming a whole run: Ctrl-Z on a foreground run stops every process of the
//! run, not only the wrapper (the workload is in a session of its own, so the terminal's SIGTSTP
//! never reaches it), and `fg` continues them all.
//!
//! [`set_suspended`] is the one seam: it finds the run's process set ([`crate::procset`]),
//! pins each member with a pidfd, re-checks its start time through it and sends SIGSTOP (or
//! SIGCONT), the group in one call through the leader's pidfd where the kernel allows it. A
//! member forked while the set was being stopped is found by the next look, so it repeats until
//! a look finds nothing new. Every signal is journalled with its target and the reason
//! (`suspend`, `resume`). A run held in a cgroup can freeze it here instead (`cgroup.freeze`),
//! behind the same function.

use crate::cgroup::RunCgroup;
use crate::journal::Journal;
use crate::pid::Pid;
use crate::procfs;
use crate::procset::{discover, Depth, RunScope};
use crate::reason::Reason;
use crate::record::Status;
use crate::run_dir::RunDir;
use crate::signal::Sig;
use crate::sys;
use serde_json::json;
use std::collections::HashSet;
use std::os::fd::AsFd;

/// How many looks a suspension takes at most (each finds what forked during the previous one).
const MAX_ROUNDS: usize = 50;

/// Stop (`suspended`) or continue every process of the run. Returns the pids signalled.
pub fn set_suspended(scope: &RunScope, suspended: bool, journal: Option<&Journal>) -> Vec<Pid> {
    let (sig, reason) = if suspended {
        (Sig::Stop, Reason::Suspend)
    } else {
        (Sig::Cont, Reason::Resume)
    };
    // Continuing makes nothing new appear that is not running already: two looks are enough.
    let rounds = if suspended { MAX_ROUNDS } else { 2 };
    let leader = scope.leader.pid;
    let mut done: HashSet<Pid> = HashSet::new();
    let mut grouped = false;
    for _ in 0..rounds {
        let mut found = discover(scope, Depth::Tree, &done);
        if found.is_empty() {
            break;
        }
        // The leader first: its whole group goes in one call, so members forked since the scan
        // are reached too; the others (other groups of the session, escapees) one by one.
        found.sort_by_key(|st| st.pid != leader);
        for st in found {
            done.insert(st.pid);
            if grouped && st.pgid == Some(leader) {
                continue;
            }
            let Ok(fd) = sys::pidfd_open(st.pid) else {
                continue;
            };
            // The check that matters: the process behind the pidfd is the one we scanned.
            if procfs::stat(st.pid).is_none_or(|now| now.start_ticks != st.start_ticks) {
                continue;
            }
            let mut group = st.pid == leader && !grouped;
            let mut result = if group {
                sys::pidfd_send_signal_group(fd.as_fd(), sig)
            } else {
                sys::pidfd_send_signal(fd.as_fd(), sig)
            };
            if group && result.is_err() {
                // A kernel before 6.9: the leader alone, its group members one by one.
                group = false;
                result = sys::pidfd_send_signal(fd.as_fd(), sig);
            }
            grouped |= group && result.is_ok();
            if let Some(j) = journal {
                let target = if group {
                    format!("group:{}", crate::pid::raw(st.pgid))
                } else {
                    format!("pid:{}", st.pid)
                };
                let _ = j.event(
                    "signal",
                    json!({"target": target, "pid": st.pid.get(), "start_ticks": st.start_ticks,
                           "signal": sig.name(), "reason": reason,
                           "error": result.as_ref().err().map(|e| e.to_string())}),
                );
            }
        }
    }
    let mut pids: Vec<Pid> = done.into_iter().collect();
    pids.sort();
    pids
}

/// Whether a run that is not over is suspended: its cgroup (`cgroup`, found by name) is
/// frozen, or it has processes and every one of them is stopped (SIGSTOP, Ctrl-Z). By /proc
/// alone, the leader is asked first (verified by its start time), and the run's tree is looked
/// for only when the leader is stopped.
pub fn is_suspended(dir: &RunDir, st: &Status, cgroup: Option<&RunCgroup>) -> bool {
    let members: Vec<Pid> = match cgroup {
        Some(cg) if cg.frozen() => return true,
        Some(cg) => cg.members(),
        None => {
            let Some(leader) = st.leader() else {
                return false;
            };
            let ours =
                procfs::stat(leader.pid).is_some_and(|s| s.start_ticks == leader.start_ticks);
            if !ours || !procfs::stopped_or_stopping(leader.pid) {
                return false;
            }
            let Some(scope) = dir.scope_held(st, None, None) else {
                return false;
            };
            discover(&scope, Depth::Tree, &HashSet::new())
                .iter()
                .map(|s| s.pid)
                .collect()
        }
    };
    !members.is_empty() && members.iter().all(|&p| procfs::stopped_or_stopping(p))
}
