//! Whether a final run's dir may be removed, and its removal: the one routine that `gc`, `rm`
//! and the watchdog's retention (`--retain`) go by.
//!
//! A run dir goes only when the kernel agrees that its run is over ([`may_remove`]): no live
//! process holds its lock, its cgroup is empty, and nothing of it lives where a process of it
//! could have gone. Otherwise its record was forged, and the dir is the evidence.
//!
//! Many runs at once share their looks ([`Evidence`]): one walk of the cgroup2 mount, and one
//! scan of /proc for the runs' markers, taken after the dirs it answers for were made (a scan
//! older than a run dir is not used for it: a fresh one is taken).
//!
//! Removal ([`remove`]) goes by descriptors: the run dir's files by `unlinkat` relative to the
//! dir, in inode order, then the dir relative to the root. [`by_inode`] lists a root in inode
//! order too: on ext4 and xfs, inodes made together sit together in the inode table, and
//! freeing them in that order touches each table block once.

use crate::cgroup::{run_cgroups, RunCgroups};
use crate::error::Error;
use crate::procset::Snapshot;
use crate::record::{State, Status};
use crate::root::Root;
use crate::run_dir::RunDir;
use crate::time::parse_rfc3339;
use crate::verdict::{Look, Shared};
use crate::wrapper::Holder;
use rustix::fs::{self as rfs, AtFlags};
use rustix::io::Errno;
use std::cell::OnceCell;
use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, SystemTime};

/// What a sweep that removes many runs looks at once.
#[derive(Default)]
pub struct Evidence {
    cgroups: OnceCell<RunCgroups>,
    /// The last scan of /proc, and when it began.
    snap: Option<(Snapshot, SystemTime)>,
}

impl Evidence {
    /// A scan of /proc that began after `dir` was made: the last one, else a fresh one.
    fn snapshot_for(&mut self, dir: &RunDir) -> &Snapshot {
        let stale = match (&self.snap, dir.born()) {
            (Some((_, at)), Some(born)) => born >= *at,
            _ => true,
        };
        if stale {
            let at = SystemTime::now();
            self.snap = Some((Snapshot::take_indexed(), at));
        }
        &self.snap.as_ref().expect("a scan was taken").0
    }
}

/// Whether the final run in `dir` (its record `st`) may be removed (see the module doc). The
/// error says why not, and how on.
pub fn may_remove(dir: &RunDir, st: &Status, ev: &mut Evidence) -> Result<(), String> {
    let name = dir.id().as_str();
    if !st.state.is_final() {
        return Err(format!(
            "it is {}, not over (agent-run cancel {name} first)",
            st.state.as_str()
        ));
    }
    let shared = Shared {
        cgroups: Some(ev.cgroups.get_or_init(run_cgroups)),
        ..Shared::default()
    };
    let look = Look::take_with(dir, Ok(st.clone()), &shared);
    if look.believed().is_none() || !matches!(look.holder, Holder::Nobody) {
        let why = match look.doubt() {
            Some(d) => d.note(),
            None => "a process holds the run's lock".to_string(),
        };
        return Err(format!(
            "its record says {}, {why} (agent-run cancel {name})",
            st.state.as_str()
        ));
    }
    // The facts a record cannot fake: the run's marker (by /proc scans alone), or a process
    // where one that left the run's cgroup could be.
    let doubted = match &look.cgroup {
        None => !crate::takeover::marked_alive_in(dir, st, Some(ev.snapshot_for(dir))).is_empty(),
        Some(cg) => crate::takeover::cgroup_doubted(dir, st, cg, &dir.journal("gc")),
    };
    if doubted {
        return Err(format!(
            "its record says {}, but a process of the run may live on (agent-run cancel {name})",
            st.state.as_str()
        ));
    }
    Ok(())
}

/// Why [`removable`] leaves a run dir.
pub enum Kept {
    /// Its dir or record could not be read as a run's.
    Unreadable(String),
    /// It is old enough, but [`may_remove`] says something of it may live: why, and when the
    /// record says the run ended.
    Held { why: String, ended: String },
}

/// The run dir `name` of `root`, with its record, when the run ended at least `age` before
/// `now` and [`may_remove`] agrees: what `gc --older-than` and the watchdog's `--retain`
/// remove. `Ok(None)`: not over, or not old enough.
pub fn removable(
    root: &Root,
    name: &str,
    now: f64,
    age: Duration,
    ev: &mut Evidence,
) -> Result<Option<(RunDir, Status)>, Kept> {
    let unreadable = |e: crate::error::Error| Kept::Unreadable(e.to_string());
    let id = crate::id::RunId::parse(name).map_err(unreadable)?;
    let dir = root.open_run_dir(&id).map_err(unreadable)?;
    let st = dir.read_status().map_err(unreadable)?;
    if !ended_before(&st, now, age) {
        return Ok(None);
    }
    may_remove(&dir, &st, ev).map_err(|why| Kept::Held {
        why,
        ended: st.ended_at.clone().unwrap_or_else(|| "?".into()),
    })?;
    Ok(Some((dir, st)))
}

/// Whether the final record `st` ended at least `age` before `now` (epoch seconds). A record
/// without a readable end is never old enough.
pub fn ended_before(st: &Status, now: f64, age: Duration) -> bool {
    ended_when(st.state, st.ended_at.as_deref(), now, age)
}

/// [`ended_before`] of a record's state and `ended_at`.
pub fn ended_when(state: State, ended_at: Option<&str>, now: f64, age: Duration) -> bool {
    let ended = ended_at.and_then(parse_rfc3339);
    state.is_final() && ended.is_some_and(|e| now - e >= age.as_secs_f64())
}

/// The names in the root that could be run dirs (not dot-names), in inode order.
pub fn by_inode(root: &Root) -> crate::error::Result<Vec<String>> {
    let mut names =
        crate::root::entries(root.fd()).map_err(|e| Error::io("list run root", root.path(), e))?;
    names.sort_unstable_by_key(|e| e.ino);
    Ok(names.into_iter().map(|e| e.name).collect())
}

/// The files of the run dir open at `fd` (not `.` and `..`; our temp files too), with their
/// inodes.
fn entries(fd: std::os::fd::BorrowedFd<'_>) -> rustix::io::Result<Vec<(u64, Vec<u8>)>> {
    let mut dir = rfs::Dir::read_from(fd)?;
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push((e.ino(), n.to_vec()));
        }
    }
    Ok(out)
}

/// Remove the run dir `dir` of `root`: its files by `unlinkat` relative to the dir, in inode
/// order and the record last (a directory the workload made in it by `remove_dir_all`, which
/// follows no symlink), then the dir relative to the root.
pub fn remove(root: &Root, dir: &RunDir) -> io::Result<()> {
    let me = dir
        .open_self()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut files = entries(me.as_fd())?;
    // The record goes last: a removal cut short leaves a final run that the next one removes.
    files.sort_unstable_by_key(|(ino, name)| (name.as_slice() == b"status.json", *ino));
    for (_, name) in files {
        match rfs::unlinkat(&me, name.as_slice(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) | Err(Errno::PERM) => {
                use std::os::unix::ffi::OsStrExt;
                std::fs::remove_dir_all(dir.path().join(std::ffi::OsStr::from_bytes(&name)))?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    rfs::unlinkat(root.fd(), dir.id().as_str(), AtFlags::REMOVEDIR)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::RunId;

    #[test]
    fn remove_takes_the_files_a_subdir_and_the_dir_and_follows_no_symlink() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::open(&d.path().join("root"), true).unwrap();
        let id = RunId::parse("r1").unwrap();
        let dir = root.create_run_dir(&id).unwrap().unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        for f in ["status.json", "stdout.log", "lock"] {
            std::fs::write(dir.file(f), b"x").unwrap();
        }
        std::fs::create_dir(dir.file("sub")).unwrap();
        std::fs::write(dir.file("sub/x"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.file("link")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.file("sub/link")).unwrap();
        let names = by_inode(&root).unwrap();
        assert_eq!(names, vec!["r1".to_string()]);
        remove(&root, &dir).unwrap();
        assert!(!dir.path().exists());
        assert!(outside.join("keep").exists(), "a symlink was followed");
        assert!(by_inode(&root).unwrap().is_empty());
    }

    #[test]
    fn only_a_final_record_that_ended_long_enough_ago_is_old_enough() {
        let mut st = Status::blank("r1");
        st.state = crate::record::State::Finished;
        st.ended_at = Some("2020-01-01T00:00:00.000Z".into());
        let then = parse_rfc3339("2020-01-01T00:00:00.000Z").unwrap();
        let day = Duration::from_secs(86_400);
        assert!(ended_before(&st, then + 86_400.0, day));
        assert!(!ended_before(&st, then + 86_399.0, day));
        st.ended_at = None;
        assert!(!ended_before(&st, then + 1e9, day));
        st.ended_at = Some("2020-01-01T00:00:00.000Z".into());
        st.state = crate::record::State::Running;
        assert!(!ended_before(&st, then + 1e9, day));
    }
}
