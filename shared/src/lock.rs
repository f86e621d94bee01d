//! The run's lock file, `<run dir>/lock`.
//!
//! The wrapper holds an exclusive `flock` on it for its whole life. Whoever else takes that lock
//! knows the wrapper is gone and becomes the one party allowed to write the final record. Who
//! holds a lock we could not take is the kernel's to say (/proc/locks, by the file's inode),
//! never the run dir's: see [`crate::wrapper::LockHolder`].

use crate::error::{Error, Result};
use crate::procfs;
use crate::run_dir::{files, RunDir};
use crate::sys;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

/// The run's lock file, opened (not yet locked).
pub struct RunLock {
    file: File,
    dev: u64,
    ino: u64,
}

impl RunDir {
    /// Open (creating, 0600, never through a symlink, never a planted FIFO) the run's lock
    /// file; not yet locked.
    pub fn lock(&self) -> Result<RunLock> {
        let file = self.open_rw_create(files::LOCK)?;
        let md = file
            .metadata()
            .map_err(|e| Error::io("inspect", self.file(files::LOCK), e))?;
        Ok(RunLock {
            file,
            dev: md.dev(),
            ino: md.ino(),
        })
    }
}

impl RunLock {
    /// Take the lock without blocking. `false`: someone (the wrapper, another canceller, the
    /// watchdog) holds it.
    pub fn try_lock(&self) -> Result<bool> {
        sys::try_lock_exclusive(self.file.as_fd()).map_err(|e| Error::io("lock", "lock file", e))
    }

    /// Who holds the lock, by the kernel's account (/proc/locks); for a lock this process
    /// could not take, so it is held by someone.
    pub fn holders(&self) -> Vec<i32> {
        procfs::flock_holders_of_held(self.dev, self.ino)
    }

    /// The lock file's (device, inode).
    pub fn identity(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// The executables that may hold a run's lock: the wrapper, and the parties that take a run
/// over (`agent-run cancel`, the watchdog).
pub fn is_agent_run_exe(name: &str) -> bool {
    name == "agent-run" || name == "agent-run-watchdog"
}
