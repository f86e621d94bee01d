//! Cleanup that holds when a test panics: one [`Reaper`] pins every process a test starts and
//! kills it, by pid, on drop, with what still carries a run's marker and the cgroups the test
//! made.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;

use crate::contain::marked;
use crate::TestRoot;

/// What a test must leave behind it: nothing. On drop, in this order:
///
/// 1. its children ([`Reaper::push`]) still running are SIGKILLed and every child is reaped
///    (by pid: an unreaped child's pid is still its own), so no zombie stays behind;
/// 2. every live process that carries a watched run's `AGENT_RUN_DIR` marker
///    ([`Reaper::for_run`], [`Reaper::watch_run`]) is SIGKILLed through a pidfd, scanning again
///    until none is left (a shell loop may fork between a scan and the kill);
/// 3. the cgroups it was given ([`Reaper::cgroup`]) are removed, deepest first.
///
/// Declare it right after the [`TestRoot`], so that it runs before the root is removed.
#[derive(Default)]
pub struct Reaper {
    children: Vec<Child>,
    runs: Vec<PathBuf>,
    cgroups: Vec<PathBuf>,
}

impl Reaper {
    /// A reaper with nothing to reap yet.
    pub fn new() -> Reaper {
        Reaper::default()
    }

    /// A reaper of the processes that carry the marker of run `id` of `root`.
    pub fn for_run(root: &TestRoot, id: &str) -> Reaper {
        let mut reaper = Reaper::default();
        reaper.watch_run(root, id);
        reaper
    }

    /// Also reap the processes that carry the marker of run `id` of `root`.
    pub fn watch_run(&mut self, root: &TestRoot, id: &str) {
        self.runs.push(root.run_dir(id));
    }

    /// Keeps a child of the test, to be killed and reaped on drop; returns its pid.
    pub fn push(&mut self, child: Child) -> i32 {
        let pid = child.id() as i32;
        self.children.push(child);
        pid
    }

    /// The children kept so far, to wait on them before the drop.
    pub fn children_mut(&mut self) -> &mut [Child] {
        &mut self.children
    }

    /// A cgroup the test made, removed on drop (its processes must be gone by then).
    pub fn cgroup(&mut self, path: &Path) {
        self.cgroups.push(path.to_path_buf());
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.children {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        for dir in &self.runs {
            crate::kill_until_gone(50, || marked(dir));
        }
        // Deepest first: a cgroup with children cannot be removed.
        self.cgroups
            .sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for cg in &self.cgroups {
            let _ = fs::remove_dir(cg);
        }
    }
}
