//! The cgroups of a test's runs: found by name, emptied and removed when the test ends.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::{contain, poll_until, read_run_file};

/// The cgroup names agent-run may have given the runs below a test's temporary dir `dir`:
/// `agent-run.<id>.<run dir inode, hex>` for every dir one or two levels down (`runs/<id>`, the
/// run dirs of any other root the test made there, a run dir the test moved), the id being the
/// dir's name or the `run_id` of its status.json (a moved run dir keeps its record).
fn run_cgroup_names(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let dirs = |d: &Path| -> Vec<(PathBuf, u64)> {
        let entries = fs::read_dir(d).into_iter().flatten().flatten();
        entries
            .filter_map(|e| {
                let md = fs::symlink_metadata(e.path()).ok()?;
                md.is_dir().then(|| (e.path(), md.ino()))
            })
            .collect()
    };
    let top = dirs(dir);
    let below = top.iter().flat_map(|(d, _)| dirs(d));
    let mut names = Vec::new();
    for (path, ino) in top.iter().cloned().chain(below) {
        let recorded = read_run_file(&path.join("status.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|st| st["run_id"].as_str().map(String::from));
        let named = path.file_name().map(|n| n.to_string_lossy().into_owned());
        for id in named.into_iter().chain(recorded) {
            names.push(format!("agent-run.{id}.{ino:x}"));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Every dir of the cgroup2 mount named in `names`, deepest first (a cgroup with children
/// cannot be removed).
fn cgroups_named(names: &[String]) -> Vec<PathBuf> {
    let Some(mount) = contain::cgroup2_mount() else {
        return Vec::new();
    };
    let (mut found, mut todo, mut seen) = (Vec::new(), vec![(mount, 0)], 0);
    while let Some((dir, depth)) = todo.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            seen += 1;
            if !is_dir || seen > 100_000 {
                continue;
            }
            if names.iter().any(|n| e.file_name() == OsStr::new(n)) {
                found.push(e.path());
            }
            if depth < 16 {
                todo.push((e.path(), depth + 1));
            }
        }
    }
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Removes the cgroups of the runs below `dir` once their processes are gone, and returns those
/// still there after `wait`, with what is in them.
pub(crate) fn remove_run_cgroups(dir: &Path, wait: Duration) -> Vec<String> {
    remove_run_cgroups_killing(dir, wait, false)
}

/// [`remove_run_cgroups`], with whatever is still in each cgroup killed first (`cgroup.kill`:
/// by the kernel's membership, never by name) when `kill`.
pub(crate) fn remove_run_cgroups_killing(dir: &Path, wait: Duration, kill: bool) -> Vec<String> {
    let names = run_cgroup_names(dir);
    if names.is_empty() {
        return Vec::new();
    }
    let mut left = Vec::new();
    for cg in cgroups_named(&names) {
        if kill {
            let _ = fs::write(cg.join("cgroup.kill"), "1");
        }
        // The tests' pins SIGKILL their processes as they drop, just before: wait for the kernel
        // to say the cgroup is empty (a zombie does not count), then remove it.
        let removed = poll_until(wait, || {
            let events = fs::read_to_string(cg.join("cgroup.events")).unwrap_or_default();
            if events.lines().any(|l| l == "populated 1") {
                return Err(format!("populated: {events:?}"));
            }
            match fs::remove_dir(&cg) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.to_string()),
                _ => Ok(()),
            }
        });
        if let Err((_, why)) = removed {
            let procs = fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
            left.push(format!("{} ({why}; procs {procs:?})", cg.display()));
        }
    }
    left
}
