//! The run's process set: which processes belong to a run, found from one /proc scan.
//!
//! A process is the run's when it started at or after the run's leader (same boot) and
//! - it is in the run's process group or session, or
//! - it descends from the wrapper (a child subreaper, so double-forked escapees come back to it), or
//! - it is of the run's user and its environment carries this run's `AGENT_RUN_ID`.
//!
//! Session and group ids are trusted only while they cannot have been reused: while the leader
//! (pid == sid == pgid) is alive with its recorded start time, or for processes that also carry
//! the run's marker. Once an empty session's id is free, the kernel may hand it to an unrelated
//! process, and a start-time check alone cannot tell that process from ours.
//!
//! This module never signals; [`crate::stop`] verifies each member again through a pidfd.

use crate::pid::{Identity, Pid};
use crate::procfs::{self, Stat};
use std::collections::{HashMap, HashSet};

/// Everything needed to recognise a run's processes.
#[derive(Debug, Clone)]
pub struct RunScope {
    pub run_id: String,
    /// The workload leader (pid == pgid == sid at launch).
    pub leader: Identity,
    pub uid: u32,
    /// The live wrapper whose descendants are the run's (`Some(self)` inside the wrapper).
    pub wrapper: Option<Pid>,
    /// The run dir's (device, inode): a marker only counts when the process's `AGENT_RUN_DIR`
    /// is this very directory, so a run of the same id under another root is never taken for
    /// ours. `None` skips the check.
    pub run_dir: Option<(u64, u64)>,
    /// The leader is not known (only the wrapper's identity, as a start-time floor): match by
    /// marker and wrapper descent only, never by group or session.
    pub marker_only: bool,
}

impl RunScope {
    /// The (device, inode) of a run dir, for [`RunScope::run_dir`].
    pub fn dir_identity(dir: &std::path::Path) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
    }
}

/// How deep a discovery looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Group, session and wrapper descendants: one stat per process.
    Tree,
    /// Also read the environment of the user's other processes for the run's marker.
    WithMarker,
}

/// Find the run's live (non-zombie) processes, except those in `skip`. Never includes this
/// process, the wrapper itself or pid 1.
pub fn discover(scope: &RunScope, depth: Depth, skip: &HashSet<Pid>) -> Vec<Stat> {
    let all = procfs::scan();
    let me = Pid::this();
    let leader = scope.leader;
    let leader_pid = leader.pid.get();
    let leader_alive = all
        .iter()
        .any(|s| s.pid == leader.pid && s.start_ticks == leader.start_ticks);
    let parent: HashMap<i32, i32> = all.iter().map(|s| (s.pid.get(), s.ppid)).collect();
    let mut descends: HashMap<i32, bool> = HashMap::new();
    let mut out = Vec::new();
    for s in &all {
        if s.pid == me
            || Some(s.pid) == scope.wrapper
            || s.pid.get() == 1
            || s.is_dead()
            || skip.contains(&s.pid)
            || s.start_ticks < leader.start_ticks
        {
            continue;
        }
        let in_group = s.pgid == leader_pid || s.sid == leader_pid;
        let member = (in_group && leader_alive && !scope.marker_only)
            || scope
                .wrapper
                .is_some_and(|w| descends_from(s.pid.get(), w.get(), &parent, &mut descends))
            || ((in_group || depth == Depth::WithMarker) && has_marker(s.pid, scope));
        if member {
            out.push(*s);
        }
    }
    out
}

fn has_marker(pid: Pid, scope: &RunScope) -> bool {
    if procfs::uid_of(pid) != Some(scope.uid) {
        return false;
    }
    let env = procfs::environ_get(pid, &[crate::ENV_RUN_ID, crate::ENV_RUN_DIR]);
    if env[0].as_deref() != Some(scope.run_id.as_bytes()) {
        return false;
    }
    match (scope.run_dir, &env[1]) {
        (None, _) => true,
        (Some(want), Some(dir)) => {
            use std::os::unix::ffi::OsStrExt;
            RunScope::dir_identity(std::path::Path::new(std::ffi::OsStr::from_bytes(dir)))
                == Some(want)
        }
        (Some(_), None) => false,
    }
}

/// Whether `pid` has `ancestor` among its ancestors, memoised across one scan.
fn descends_from(
    pid: i32,
    ancestor: i32,
    parent: &HashMap<i32, i32>,
    memo: &mut HashMap<i32, bool>,
) -> bool {
    let mut chain = Vec::new();
    let mut cur = pid;
    let found = loop {
        if let Some(&known) = memo.get(&cur) {
            break known;
        }
        chain.push(cur);
        match parent.get(&cur) {
            Some(&pp) if pp == ancestor => break true,
            Some(&pp) if pp > 1 && chain.len() < 4096 => cur = pp,
            _ => break false,
        }
    };
    for p in chain {
        memo.insert(p, found);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestry_is_followed_and_memoised() {
        let parent: HashMap<i32, i32> = [(10, 5), (11, 10), (12, 11), (20, 1)].into();
        let mut memo = HashMap::new();
        assert!(descends_from(12, 5, &parent, &mut memo));
        assert!(descends_from(11, 5, &parent, &mut memo));
        assert!(!descends_from(20, 5, &parent, &mut memo));
        assert_eq!(memo.get(&10), Some(&true));
    }
}
