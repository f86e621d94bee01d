//! The run root and run dirs: where they are, and whether they are safe to use.
//!
//! The root is `--root`, else `$AGENT_RUN_ROOT`, else `$HOME/.agent-runs`. It is created mode 0700
//! when missing, and must be a real directory (not a symlink) owned by us and not group- or
//! world-writable. A run dir is `<root>/<run-id>`, created with one `mkdir(2)` (the exclusive step
//! that decides which of two simultaneous launches of one id runs the command) and held to the
//! same rules plus mode 0700. Every check names the path it refused.

use crate::error::{Error, Result};
use crate::id::RunId;
use crate::run_dir::RunDir;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One entry of a root that could be a run dir (dot-names are our own files), from `getdents`.
pub struct Entry {
    /// Its name; one that is not UTF-8 is kept lossily (it is then no valid run id).
    pub name: String,
    pub ino: u64,
    /// `d_type`: `Some(true)` a directory, `Some(false)` something else, `None` unknown.
    pub is_dir: Option<bool>,
}

/// The entries of the root open at `fd` that could be run dirs, in the order `getdents` gives.
/// The one listing of a root: `list`, `status --all`, gc and the watchdog's passes read it.
pub fn entries(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<Entry>> {
    use rustix::fs::{FileType, Mode, OFlags};
    // The root's own descriptor may be `O_PATH`, which cannot be read: open it for reading.
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let readable = rustix::fs::openat(fd, ".", flags, Mode::empty())?;
    let mut dir = rustix::fs::Dir::read_from(&readable)?;
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name.first() == Some(&b'.') {
            continue;
        }
        let is_dir = match e.file_type() {
            FileType::Directory => Some(true),
            FileType::Unknown => None,
            _ => Some(false),
        };
        out.push(Entry {
            name: String::from_utf8_lossy(name).into_owned(),
            ino: e.ino(),
            is_dir,
        });
    }
    Ok(out)
}

/// Where the root is: `--root`, else `$AGENT_RUN_ROOT`, else `$HOME/.agent-runs`, made absolute
/// (without resolving symlinks, so a symlinked root is still seen and refused).
pub fn resolve_root(cli: Option<&Path>) -> Result<PathBuf> {
    let p = match cli {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os(crate::ENV_ROOT).filter(|v| !v.is_empty()) {
            Some(v) => PathBuf::from(v),
            None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
                Some(h) => Path::new(&h).join(".agent-runs"),
                None => {
                    return Err(Error::Invalid {
                        what: "run root",
                        value: String::new(),
                        why: "neither --root, AGENT_RUN_ROOT nor HOME is set".into(),
                    })
                }
            },
        },
    };
    std::path::absolute(&p).map_err(|e| Error::io("resolve", &p, e))
}

/// A run root that passed the safety checks.
#[derive(Debug, Clone)]
pub struct Root {
    path: PathBuf,
    fd: Arc<OwnedFd>,
}

impl Root {
    /// Check the root, creating it (mode 0700, parents too) when `create` and it is missing.
    pub fn open(path: &Path, create: bool) -> Result<Root> {
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .map_err(|e| Error::io("create run root", path, e))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::Missing {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(Error::io("inspect run root", path, e)),
            Ok(_) => {}
        }
        let (fd, _) = open_checked(path, "run root", 0o022)?;
        Ok(Root {
            path: path.to_path_buf(),
            fd: Arc::new(fd),
        })
    }

    /// Read the file `name` of the root itself, of at most `cap` bytes, as a file a run could
    /// have planted (see [`RunDir::read_run_file`]): the root's defaults.
    pub fn read_file(&self, name: &str, cap: u64) -> Result<Vec<u8>> {
        crate::run_dir::read_capped_at(self.fd.as_fd(), &self.path, name, cap)
    }

    /// Open (creating, 0600) the file `name` of the root itself for reading and writing, as a
    /// file a run could have replaced: the watchdog's lock.
    pub fn open_rw_create(&self, name: &str) -> Result<fs::File> {
        use rustix::fs::OFlags;
        crate::run_dir::open_hostile_at(
            self.fd.as_fd(),
            &self.path,
            name,
            OFlags::RDWR | OFlags::CREATE,
        )
        .map(|(f, _)| f)
    }

    /// Replace the root's own file `name` atomically with `bytes`, by the one atomic writer
    /// (`run_dir::replace_at`: a temp file exchanged into place); not fsynced: the watchdog's
    /// settled file, a cache.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        crate::run_dir::replace_at(self.fd.as_fd(), &self.path, name, false, |f| {
            f.write_all(bytes)
        })
    }

    /// The root's descriptor, for reads relative to it ([`crate::sweep`]).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The root's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a run's dir is (it may not exist).
    pub fn run_dir_path(&self, id: &RunId) -> PathBuf {
        self.path.join(id.as_str())
    }

    /// Create a new run dir with one mkdir. `Ok(None)` when it already exists.
    pub fn create_run_dir(&self, id: &RunId) -> Result<Option<RunDir>> {
        let path = self.run_dir_path(id);
        match fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(Error::io("create run dir", &path, e)),
        }
        // mkdir never follows a symlink at the last component; umask may have narrowed 0700,
        // but never widened it. Check anyway: the dir must be ours and private.
        RunDir::open(&path, id.clone()).map(Some)
    }

    /// Open an existing run dir after the safety checks (`Missing` when there is none).
    pub fn open_run_dir(&self, id: &RunId) -> Result<RunDir> {
        let path = self.run_dir_path(id);
        match RunDir::open(&path, id.clone()) {
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Err(Error::Missing { path })
            }
            r => r,
        }
    }
}

pub use crate::run_dir::check_dir;
pub(crate) use crate::run_dir::open_checked;
