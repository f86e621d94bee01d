//! A process's tree from the kernel's children lists (/proc/PID/task/TID/children).

use super::*;

/// The children lists of each thread of `/proc/<who>` (`/proc/<who>/task/TID/children`): an
/// orphan reparented to a subreaper is the child of one of its threads. `None` when the task
/// dir cannot be listed; a list that cannot be read is an `Err`.
pub(super) fn children_lists(who: &str) -> Option<impl Iterator<Item = std::io::Result<String>>> {
    let base = format!("/proc/{who}/task");
    let tasks = dir_entries(&base)?;
    Some(
        tasks
            .into_iter()
            .map(move |(tid, _)| read_kernel_file(format!("{base}/{tid}/children"))),
    )
}

/// The pids of one children list.
pub(super) fn parse_children(list: &str) -> impl Iterator<Item = Pid> + '_ {
    list.split_ascii_whitespace()
        .filter_map(|p| p.parse::<i64>().ok())
        .filter_map(Pid::new)
}

/// The children of a process, from every one of its threads (/proc/PID/task/TID/children:
/// an orphan reparented to a subreaper is the child of one of its threads).
pub fn children_of(pid: Pid) -> Vec<Pid> {
    let Some(lists) = children_lists(&pid.to_string()) else {
        return Vec::new();
    };
    let mut out: Vec<Pid> = lists
        .filter_map(Result::ok)
        .flat_map(|text| parse_children(&text).collect::<Vec<_>>())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The output keeper of the live wrapper `wrapper`, known by kernel facts alone (never by the
/// journal's `keeper_started`, which the run can rewrite): the one child of the wrapper that
/// runs the wrapper's own executable (the keeper is forked, never exec'd), is named
/// `agent-run-keep`, leads a session of its own and is in the wrapper's cgroup (never the
/// run's). A stop that takes the wrapper's descendants excludes it: it is not the run's, and it
/// ends by EOF when the run's last writer is gone. None when no child, or more than one, fits
/// (then nothing is excluded, as before), or the wrapper cannot be read.
pub fn keeper_of(wrapper: Pid) -> Option<Identity> {
    let exe = |p: Pid| {
        fs::metadata(format!("/proc/{p}/exe"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let cgroup = |p: Pid| {
        read_kernel_file(format!("/proc/{p}/cgroup"))
            .ok()
            .and_then(|t| v2_path(&t).map(str::to_owned))
    };
    let (w_exe, w_cgroup) = (exe(wrapper)?, cgroup(wrapper)?);
    let mut fits = children_of(wrapper).into_iter().filter_map(|c| {
        let st = stat(c)?;
        let comm = read_kernel_file(format!("/proc/{c}/comm")).ok()?;
        let fits = st.ppid == Some(wrapper)
            && st.sid == Some(c)
            && comm.trim_end() == "agent-run-keep"
            && exe(c)? == w_exe
            && cgroup(c)? == w_cgroup;
        fits.then(|| st.identity())
    });
    let keeper = fits.next()?;
    fits.next().is_none().then_some(keeper)
}

/// Every process below `root` in the process tree (its children, theirs, and so on), each with
/// its stat, from the kernel's children lists: what a look at every pid would find descending
/// from `root`, for the cost of the tree, not of the process table. `None` when `root`'s own
/// lists cannot be read (a kernel without CONFIG_PROC_CHILDREN): the caller scans instead.
///
/// A list names pids: a child that exits, and whose pid is reused, between the list and its
/// stat is read as whatever has the pid now. Callers decide membership from the stats' own
/// `ppid` chain, as over a scan; the walk goes below a process only when its stat names the
/// parent whose list it came from. A process forked, or reparented, after the list it belongs
/// in was read is missed by this look, as by a scan that read its pid's slot first.
pub fn tree_below(root: Pid) -> Option<Vec<Stat>> {
    let mut queue: Vec<(Pid, Pid)> = Vec::new();
    for list in children_lists(&root.to_string())? {
        queue.extend(parse_children(&list.ok()?).map(|c| (c, root)));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    while let Some((pid, parent)) = queue.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let Some(st) = stat(pid) else { continue };
        out.push(st);
        if st.ppid != Some(parent) {
            continue;
        }
        if let Some(lists) = children_lists(&pid.to_string()) {
            for list in lists.flatten() {
                queue.extend(parse_children(&list).map(|c| (c, pid)));
            }
        }
    }
    out.sort_unstable_by_key(|s| s.pid);
    Some(out)
}

/// Whether this process has a child other than `skip`, from the kernel's list of each of our
/// threads' children (`/proc/self/task/TID/children`); `None` when it cannot be read. The
/// wrapper asks at the leader's exit: its keeper is no leftover, any other child is (a
/// subreaper's pid hopper is always one of its children, even while it dodges a /proc scan).
pub fn children_besides(skip: Pid) -> Option<bool> {
    for list in children_lists("self")? {
        if parse_children(&list.ok()?).any(|p| p != skip) {
            return Some(true);
        }
    }
    Some(false)
}
