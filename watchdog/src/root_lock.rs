//! One watchdog per root: a `flock` on a dot-named file in the root, and who holds it when
//! another watchdog does.

use agent_run_shared::root::Root;
use agent_run_shared::sys;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The file in a root whose `flock` makes one watchdog the root's only one (dot-named: never
/// taken for a run dir).
pub const ROOT_LOCK: &str = ".watchdog.lock";

/// Another watchdog holds the root.
#[derive(Debug)]
pub struct RootBusy {
    pub root: PathBuf,
    /// The holders, by the kernel's account (/proc/locks).
    pub pids: Vec<i32>,
}

impl std::fmt::Display for RootBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = match self.pids.as_slice() {
            [] => "another process".to_string(),
            [p] => format!("pid {p}"),
            ps => format!("pids {ps:?}"),
        };
        write!(
            f,
            "another watchdog ({who}) already watches {}: one watchdog per root",
            self.root.display()
        )
    }
}

impl std::error::Error for RootBusy {}

/// The root's watchdog lock, held for as long as this value lives.
pub struct RootLock {
    _file: std::fs::File,
}

/// Take the root's watchdog lock, or say who holds it ([`RootBusy`]).
pub fn lock_root(root: &Root) -> anyhow::Result<RootLock> {
    use std::os::fd::AsFd;
    let file = root.open_rw_create(ROOT_LOCK)?;
    if sys::try_lock_exclusive(file.as_fd())? {
        return Ok(RootLock { _file: file });
    }
    let md = file.metadata()?;
    Err(RootBusy {
        root: root.path().to_path_buf(),
        pids: agent_run_shared::procfs::flock_holders_of_held(md.dev(), md.ino()),
    }
    .into())
}
