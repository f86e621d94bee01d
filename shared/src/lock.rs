//! The run's lock: an exclusive `flock(2)` the wrapper holds for its whole life.
//!
//! It is held on two inodes. The run dir itself is the one that decides: the workload can
//! delete, replace or chmod every file in its run dir, but it cannot give the dir another inode
//! (the run's cgroup is named for that inode too). The `lock` file is the contract's: its mtime
//! is the wrapper's heartbeat, and wrappers before this version hold only it. Whoever takes the
//! lock knows the wrapper is gone and becomes the one party that finishes the run.
//!
//! Who holds a lock we could not take is the kernel's to say (/proc/locks, by inode), never the
//! run dir's: see [`crate::wrapper::holder`]. A `lock` file the workload replaced (a directory,
//! a FIFO, a file it chmodded to 000) is named in [`RunLock::damage`] and the dir's lock decides
//! alone; nothing about that file can keep a stop from going on.

use crate::error::{Error, Result};
use crate::pid::Pid;
use crate::procfs;
use crate::run_dir::{files, RunDir};
use crate::sys;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

/// The run's lock, opened (not yet taken).
pub struct RunLock {
    /// The run dir, opened for reading (a flock needs a real descriptor, not an `O_PATH` one).
    dir: Option<File>,
    dir_id: (u64, u64),
    /// `lock`, when it is a regular file of ours that could be opened.
    file: Option<(File, (u64, u64))>,
    /// What is wrong with the run dir or `lock`, for the journal and the caller's output.
    pub damage: Vec<String>,
}

/// Whether a lock could be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Ours now: the dir's lock, and `lock`'s when that file is usable.
    Yes,
    /// Someone holds the dir's lock: a wrapper of this version, or a party finishing the run.
    Dir,
    /// The dir's lock was free but `lock` is held (a wrapper of an earlier version, or a
    /// process squatting on the file): the dir's lock was let go again; the caller asks who
    /// holds the file ([`crate::wrapper::holder`]).
    File,
}

impl RunDir {
    /// Open the run's lock: the dir, and `lock` (created 0600 when missing, never through a
    /// symlink, never a planted FIFO). Never fails: what cannot be opened is named in
    /// [`RunLock::damage`].
    pub fn lock(&self) -> RunLock {
        let mut damage = Vec::new();
        let dir = match self.open_self() {
            Ok(f) => Some(f),
            Err(e) => {
                damage.push(format!("cannot open the run dir to lock it: {e}"));
                None
            }
        };
        let file = match self.open_rw_create(files::LOCK) {
            Ok(f) => match f.metadata() {
                Ok(md) => Some((f, (md.dev(), md.ino()))),
                Err(e) => {
                    damage.push(format!(
                        "cannot inspect {}: {e}",
                        self.file(files::LOCK).display()
                    ));
                    None
                }
            },
            Err(e) => {
                damage.push(e.to_string());
                None
            }
        };
        RunLock {
            dir,
            dir_id: self.identity(),
            file,
            damage,
        }
    }
}

impl RunLock {
    /// Take the lock for a launch: as [`RunLock::try_lock`], again for up to 100 ms while it
    /// is held (another party's look, [`RunDir::lock_held`], holds it for microseconds).
    pub fn lock_new(&self) -> Result<Taken> {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
        loop {
            match self.try_lock()? {
                Taken::Yes => return Ok(Taken::Yes),
                held if std::time::Instant::now() >= until => return Ok(held),
                _ => std::thread::sleep(std::time::Duration::from_micros(200)),
            }
        }
    }

    /// Take the lock without blocking: the dir's, then `lock`'s (when the file is usable).
    pub fn try_lock(&self) -> Result<Taken> {
        let Some(dir) = &self.dir else {
            // Without the dir's descriptor only the file can be locked: it decides alone.
            return match &self.file {
                Some((f, _)) if lock(f)? => Ok(Taken::Yes),
                Some(_) => Ok(Taken::File),
                None => Err(Error::io(
                    "lock",
                    "run dir",
                    std::io::Error::from_raw_os_error(libc::EACCES),
                )),
            };
        };
        if !lock(dir)? {
            return Ok(Taken::Dir);
        }
        match &self.file {
            Some((f, _)) if !lock(f)? => {
                let _ = sys::unlock(dir.as_fd());
                Ok(Taken::File)
            }
            _ => Ok(Taken::Yes),
        }
    }

    /// Take the dir's lock alone (for a caller that found `lock` held by a squatter).
    pub fn lock_dir_only(&self) -> Result<bool> {
        match &self.dir {
            Some(d) => lock(d),
            None => Ok(false),
        }
    }

    /// The inodes this lock is held on, as opened.
    pub fn ids(&self) -> LockIds {
        LockIds {
            dir: self.dir_id,
            file: self.file.as_ref().map(|(_, id)| *id),
        }
    }
}

/// The inodes a run's lock is held on: the run dir's, and `lock`'s when it is a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockIds {
    pub dir: (u64, u64),
    pub file: Option<(u64, u64)>,
}

impl LockIds {
    /// The holders of each, by the kernel's account: from `table` when given (one read of
    /// /proc/locks for many runs), else from a fresh read. (dir's, file's.)
    pub fn holders(&self, table: Option<&procfs::LockTable>) -> (Vec<Pid>, Vec<Pid>) {
        let fresh;
        let table = match table {
            Some(t) => t,
            None => {
                fresh = procfs::LockTable::read();
                &fresh
            }
        };
        let dir = table.holders(self.dir.0, self.dir.1);
        let file = self
            .file
            .map(|(d, i)| table.holders(d, i))
            .unwrap_or_default();
        (dir, file)
    }
}

impl RunDir {
    /// Whether anyone holds the run's lock, asked of the kernel the cheap way: take it without
    /// blocking (the dir's, then `lock`'s when it is a regular file) and let it go at once.
    /// `Some(false)`: nobody held it. `Some(true)`: someone does (then only /proc/locks says
    /// who: [`LockIds::holders`]). `None`: the dir could not be opened to ask.
    ///
    /// Why not /proc/locks every time: each read of it takes the kernel's file-lock rwsem for
    /// writing, which waits for an RCU grace period (5 to 20 ms here): a watchdog acting on a
    /// deadline, or `wait` looking twice a second, would pay that on every look.
    pub fn lock_held(&self) -> Option<bool> {
        let dir = self.open_self().ok()?;
        if !lock(&dir).ok()? {
            return Some(true);
        }
        let file_held = match self.open_run_file(files::LOCK) {
            Ok((f, _)) => match lock(&f) {
                Ok(true) => {
                    let _ = sys::unlock(f.as_fd());
                    false
                }
                Ok(false) => true,
                Err(_) => false,
            },
            Err(_) => false,
        };
        let _ = sys::unlock(dir.as_fd());
        Some(file_held)
    }

    /// The inodes of the run's lock without opening anything: the dir's, and `lock`'s by
    /// `lstat` (none when it is not a regular file).
    pub fn lock_ids(&self) -> LockIds {
        LockIds {
            dir: self.identity(),
            file: self
                .stat_file(files::LOCK)
                .filter(|m| m.regular)
                .map(|m| (m.dev, m.ino)),
        }
    }
}

fn lock(f: &File) -> Result<bool> {
    sys::try_lock_exclusive(f.as_fd()).map_err(|e| Error::io("lock", "run dir", e))
}

/// The executables that may hold a run's lock: the wrapper, and the parties that take a run
/// over (`agent-run cancel`, the watchdog).
pub fn is_agent_run_exe(name: &str) -> bool {
    name == "agent-run" || name == "agent-run-watchdog"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dir_lock_decides_and_a_damaged_lock_file_is_named() {
        let (d, rd) = crate::run_dir::temp();
        let first = rd.lock();
        assert!(first.damage.is_empty(), "{:?}", first.damage);
        assert_eq!(first.try_lock().unwrap(), Taken::Yes);
        // A second opener (another description) cannot take it.
        assert_eq!(rd.lock().try_lock().unwrap(), Taken::Dir);
        // The workload replaces `lock` with a directory: the dir's lock still decides.
        std::fs::remove_file(d.path().join("lock")).unwrap();
        std::fs::create_dir(d.path().join("lock")).unwrap();
        let second = rd.lock();
        assert_eq!(second.damage.len(), 1, "{:?}", second.damage);
        assert_eq!(second.try_lock().unwrap(), Taken::Dir);
        drop(first);
        assert_eq!(second.try_lock().unwrap(), Taken::Yes);
        assert_eq!(second.ids().holders(None).0, vec![Pid::this()]);
    }
}
