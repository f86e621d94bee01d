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
use crate::sys;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Open the directory at `path` ([`crate::run_dir::open_dir`]) and hold what was opened to the
/// rules of [`check_dir`]. A refusal names the path; a missing dir is an `Io` error of kind
/// `NotFound`.
pub(crate) fn open_checked(
    path: &Path,
    what: &str,
    forbidden_bits: u32,
) -> Result<(OwnedFd, fs::Metadata)> {
    let (fd, md) = match crate::run_dir::open_dir(path) {
        Ok(x) => x,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                // A symlink or not a directory: the path check says which, in its words.
                check_dir(path, what, forbidden_bits)?;
            }
            return Err(Error::io("inspect", path, e));
        }
    };
    check_metadata(path, what, forbidden_bits, &md)?;
    Ok((fd, md))
}

/// Refuse a path that is a symlink, not a directory, not ours, or has any of `forbidden_bits`.
/// The refusal names the path and says what to do about it.
pub fn check_dir(path: &Path, what: &str, forbidden_bits: u32) -> Result<()> {
    let md = fs::symlink_metadata(path).map_err(|e| Error::io("inspect", path, e))?;
    check_metadata(path, what, forbidden_bits, &md)
}

/// [`check_dir`] on what `lstat` or `fstat` said of `path`.
pub(crate) fn check_metadata(
    path: &Path,
    what: &str,
    forbidden_bits: u32,
    md: &fs::Metadata,
) -> Result<()> {
    let unsafe_ = |why: String| {
        Err(Error::Unsafe {
            path: path.to_path_buf(),
            why,
        })
    };
    let p = path.display();
    if md.file_type().is_symlink() {
        return unsafe_(format!(
            "{what} {p} is a symlink: use the directory itself (--root DIR) or remove the link"
        ));
    }
    if !md.is_dir() {
        return unsafe_(format!(
            "{what} {p} is not a directory: remove it or use another {}",
            if what == "run root" {
                "root (--root DIR)"
            } else {
                "run id"
            }
        ));
    }
    let me = sys::geteuid();
    if md.uid() != me {
        return unsafe_(format!(
            "{what} {p} belongs to uid {}, not to you (uid {me}): use a {} of your own",
            md.uid(),
            if what == "run root" {
                "root (--root DIR)"
            } else {
                "run id or root"
            }
        ));
    }
    let mode = md.mode() & 0o7777;
    if mode & forbidden_bits != 0 {
        let who = match (
            mode & forbidden_bits & 0o070 != 0,
            mode & forbidden_bits & 0o007 != 0,
        ) {
            (true, true) => "its group and others",
            (true, false) => "its group",
            _ => "others",
        };
        let how = if forbidden_bits & 0o044 != 0 {
            "open to"
        } else {
            "writable by"
        };
        // A shared directory such as /tmp (sticky) must stay as it is: a private one inside it.
        let fix = if mode & 0o1000 != 0 {
            format!(
                "use a private directory inside it (--root {})",
                path.join("agent-runs").display()
            )
        } else {
            format!("chmod 700 {p}")
        };
        return unsafe_(format!(
            "{what} {p} is {how} {who} (mode {mode:04o}): {fix}"
        ));
    }
    Ok(())
}
