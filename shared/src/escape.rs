//! Where a process of a run can go when it leaves the run's cgroup, and who is there.
//!
//! A process may move itself (or be moved) to any cgroup whose `cgroup.procs` its user may
//! write, within the subtree whose top it may write too: a parent delegated to the user (the
//! operator's `mkdir` + `chown`, systemd's `Delegate=yes`), or, for root, any cgroup. The
//! kernel refuses the move only for a process in a cgroup namespace on a mount with
//! `nsdelegate` ([`crate::cgroup::nsdelegate`]): agent-run spawns root's workloads so.
//!
//! After its wrapper is lost, a run whose cgroup is empty may still have processes that left
//! it. [`reach`] says where they can be, and [`look`] names each process there that may be the
//! run's: of the run's user, started no earlier than the run, alive, not the caller or one of
//! its ancestors, not another run's (inside a run's cgroup, or an agent-run wrapper or output
//! keeper by name). Those are not signalled (nothing proves they are the run's), but the run
//! is not called clean while they live: its record says `unknown`, reason `escaped`, and names
//! them.
//!
//! Root's workloads are not looked for this way: root can move anything anywhere, so the look
//! would name every process the host started since (see docs/safety.md, the threat model).

use crate::cgroup::{RunCgroup, PREFIX};
use crate::pid::{Identity, Pid};
use crate::procfs;
use std::path::{Path, PathBuf};

/// The most cgroups [`look`] lists.
const LOOK_CAP: usize = 4096;

/// The top of the subtree a process of the run could have moved to, for a run held in `cg`
/// by a user who is not root: the highest ancestor whose `cgroup.procs` this user may write.
/// `None` when there is none (nothing to look at) or for root (see the module's note).
pub fn reach(cg: &RunCgroup) -> Option<PathBuf> {
    if crate::sys::geteuid() == 0 {
        return None;
    }
    let mount = crate::cgroup::mount()?;
    let mut top = None;
    let mut at = cg.path().parent();
    while let Some(p) = at.filter(|p| p.starts_with(mount)) {
        if !crate::sys::writable(&p.join("cgroup.procs")) {
            break;
        }
        top = Some(p.to_path_buf());
        at = p.parent();
    }
    top
}

/// The processes under `top` (outside every run's cgroup) that may be a run's escapees: of
/// user `uid`, started no earlier than the run's leader `first` (in the same clock tick, with
/// a pid no lower than its), alive, and not the caller, its ancestors, an agent-run wrapper
/// or output keeper.
pub fn look(top: &Path, first: Identity, uid: u32) -> Vec<Pid> {
    let ours = ancestors_of_this();
    let mut out = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    let mut listed = 0;
    while let Some(dir) = stack.pop() {
        listed += 1;
        if listed > LOOK_CAP {
            break;
        }
        if let Ok(text) = procfs::read_kernel_file(dir.join("cgroup.procs")) {
            for pid in text
                .lines()
                .filter_map(|l| l.trim().parse::<i64>().ok())
                .filter_map(Pid::new)
            {
                if !ours.contains(&pid) && may_be_the_runs(pid, first, uid) {
                    out.push(pid);
                }
            }
        }
        for (name, is_dir) in procfs::dir_entries(&dir).unwrap_or_default() {
            // A run's cgroup holds that run's processes: another run's, or this one's (empty).
            if is_dir && !name.starts_with(PREFIX) {
                stack.push(dir.join(name));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn may_be_the_runs(pid: Pid, first: Identity, uid: u32) -> bool {
    let Some(st) = procfs::stat(pid).filter(|s| !s.is_dead()) else {
        return false;
    };
    // A clock tick is 10 ms: in the leader's own tick, pids tell which came first.
    let after = st.start_ticks > first.start_ticks
        || (st.start_ticks == first.start_ticks && pid >= first.pid);
    // A process that is gone by the time its name is read (a keeper that just saw its EOF and
    // was reaped) is no escapee: a live process's name can always be read by its own user.
    after
        && procfs::real_uid(pid) == Some(uid)
        && procfs::comm(pid).is_some_and(|c| !matches!(c.as_str(), "agent-run" | "agent-run-keep"))
}

/// This process and every ancestor of it.
fn ancestors_of_this() -> Vec<Pid> {
    let mut out = vec![Pid::this()];
    let mut at = Pid::this();
    while let Some(parent) = procfs::stat(at).and_then(|s| s.ppid) {
        if out.contains(&parent) || out.len() > 4096 {
            break;
        }
        out.push(parent);
        at = parent;
    }
    out
}
