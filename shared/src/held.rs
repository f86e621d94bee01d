//! What the kernel says may still hold a run, read once per pass: the flocks held on the host
//! (/proc/locks), and the `agent-run.*` cgroups under each parent a record names. A record is
//! the workload's to write; these are not.

use crate::pid::Pid;
use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};

/// What holds a flock, from /proc/locks: the pids (a wrapper of an earlier version holds only
/// its `lock` file) and the inodes (a wrapper holds its run dir's).
#[derive(Default)]
pub struct Flocks {
    pids: HashSet<Pid>,
    inodes: HashSet<u64>,
}

impl Flocks {
    /// Read /proc/locks. It is a seq_file rendered about a page per read(2), and lines shift
    /// when locks come and go between reads, so one reading can miss a holder: the union of
    /// two readings is taken. `None` when it cannot be read.
    pub fn read() -> Option<Flocks> {
        let mut out = Flocks::default();
        for _ in 0..2 {
            let text = crate::procfs::read_kernel_file("/proc/locks").ok()?;
            for line in text.lines() {
                out.add(line);
            }
        }
        Some(out)
    }

    /// One line: "1: FLOCK  ADVISORY  WRITE 15672 fe:00:5341426 0 EOF". Waiters ("->") hold
    /// nothing.
    fn add(&mut self, line: &str) {
        let mut f = line.split_ascii_whitespace().skip(1);
        if f.next() != Some("FLOCK") {
            return;
        }
        let mut f = f.skip(2);
        if let Some(pid) = f.next().and_then(|p| Pid::new(p.parse().ok()?)) {
            self.pids.insert(pid);
        }
        let ino = f.next().and_then(|d| d.rsplit(':').next());
        if let Some(ino) = ino.and_then(|i| i.parse().ok()) {
            self.inodes.insert(ino);
        }
    }

    /// Whether a wrapper may hold the run: a flock on the run dir's inode (a wrapper holds it
    /// for its whole life), or one held by the pid the record names as its wrapper.
    pub fn may_hold(&self, dir_ino: u64, wrapper_pid: Option<Pid>) -> bool {
        self.inodes.contains(&dir_ino) || wrapper_pid.is_some_and(|p| self.pids.contains(&p))
    }

    /// Whether any flock is held on the inode `ino` (of any device).
    pub fn on_inode(&self, ino: u64) -> bool {
        self.inodes.contains(&ino)
    }

    /// Whether no flock is held at all.
    pub fn none(&self) -> bool {
        self.inodes.is_empty()
    }
}

/// The `agent-run.*` children of each cgroup parent asked about, listed once per pass (a
/// cgroup made after that belongs to a run launched after it, whose record is not final).
#[derive(Default)]
pub struct CgroupParents {
    /// `None`: the parent exists and could not be listed, so no cgroup counts as gone.
    listed: HashMap<String, Option<HashSet<String>>>,
}

impl CgroupParents {
    /// Whether the cgroup `base` (a run's cgroup name) is gone from `parent`.
    pub fn gone(&mut self, parent: &str, base: &str) -> bool {
        let children = self
            .listed
            .entry(parent.to_string())
            .or_insert_with(|| list(parent));
        children.as_ref().is_some_and(|c| !c.contains(base))
    }
}

/// The `agent-run.*` directories in `parent`; empty when it does not exist (a missing parent
/// has no child), `None` when it cannot be listed.
fn list(parent: &str) -> Option<HashSet<String>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = match rfs::open(parent, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Some(HashSet::new()),
        Err(_) => return None,
    };
    let mut dir = rfs::Dir::new(fd).ok()?;
    let mut out = HashSet::new();
    while let Some(e) = dir.read() {
        let e = e.ok()?;
        let n = e.file_name().to_bytes();
        if n.starts_with(b"agent-run.") {
            out.insert(String::from_utf8_lossy(n).into_owned());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flock_line_names_its_holder_and_inode_and_a_waiter_holds_nothing() {
        let mut f = Flocks::default();
        f.add("1: FLOCK  ADVISORY  WRITE 15672 fe:00:5341426 0 EOF");
        f.add("1: -> FLOCK  ADVISORY  WRITE 999 fe:00:77 0 EOF");
        f.add("2: POSIX  ADVISORY  WRITE 888 fe:00:88 0 EOF");
        assert!(f.may_hold(5341426, None));
        assert!(f.may_hold(1, Pid::new(15672)));
        assert!(!f.may_hold(77, Pid::new(999)));
        assert!(!f.may_hold(88, Pid::new(888)));
    }

    #[test]
    fn a_missing_parent_has_no_cgroup_left() {
        let mut p = CgroupParents::default();
        assert!(p.gone("/nonexistent/agent-run-test", "agent-run.r1.1f"));
    }
}
