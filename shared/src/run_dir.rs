//! A run dir, held open: every run file is reached through one descriptor of the checked dir.
//!
//! [`RunDir`] is made once, by [`crate::root::Root::create_run_dir`] or
//! [`crate::root::Root::open_run_dir`] (or [`RunDir::open`] for a dir named by path): an
//! `O_PATH | O_DIRECTORY | O_NOFOLLOW` descriptor of the dir, whose `fstat` passed the checks (a
//! directory of ours, mode 0700). Every file of the run is then opened, replaced and linked
//! relative to that descriptor (`openat`, `renameat`, `linkat`), so a run dir the workload renames
//! or swaps for a symlink after the check changes nothing about where we read and write.
//!
//! The files themselves are the workload's to rewrite. Every open carries `O_NOFOLLOW |
//! O_NONBLOCK` and is checked to be a regular file of ours ([`RunDir::open_run_file`]); reads are
//! capped ([`RunDir::read_run_file`]); whatever we create is mode 0600. A record reaches disk one
//! way only, [`RunDir::write_atomic`]: a temp file beside it, the bytes, exchanged with the target
//! (`renameat2(RENAME_EXCHANGE)`, the old file unlinked) or renamed over it, durable when asked
//! (see [`RunDir::replace`]).
//!
//! The module that owns a file adds its methods to [`RunDir`]: [`crate::record`] (status.json),
//! [`crate::journal`] (events.jsonl), [`crate::lease`] (lease.json), [`crate::lock`] (lock),
//! [`crate::cancel_request`] (cancel.json), [`crate::heartbeat`] (the lock's mtime),
//! [`crate::wrapper`] (the live wrapper), [`crate::lifecycle`] (the run's scope and cgroup).

use crate::error::{Error, Result};
use crate::id::RunId;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::fs::{self, File};
use std::io;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The files of a run dir.
pub mod files {
    pub const STATUS: &str = "status.json";
    pub const STDOUT: &str = "stdout.log";
    pub const STDERR: &str = "stderr.log";
    pub const EVENTS: &str = "events.jsonl";
    pub const LEASE: &str = "lease.json";
    pub const CANCEL: &str = "cancel.json";
    pub const PID: &str = "pid";
    pub const PGID: &str = "pgid";
    pub const LOCK: &str = "lock";
}

/// Size caps for the documents of a run dir: a record holds argv (at most ~2 MiB on Linux,
/// escaped); lease and cancel requests are a line each.
pub mod caps {
    pub const STATUS: u64 = 16 << 20;
    pub const LEASE: u64 = 64 << 10;
    pub const CANCEL: u64 = 64 << 10;
}

/// A run dir that passed the safety checks, held by a descriptor.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
    id: RunId,
    fd: Arc<OwnedFd>,
    dev: u64,
    ino: u64,
    born: Option<SystemTime>,
    repaired: Option<String>,
}

/// What `lstat` says of one file of a run dir.
#[derive(Debug, Clone, Copy)]
pub struct FileStat {
    pub dev: u64,
    pub ino: u64,
    /// A regular file (not a symlink, FIFO, directory...).
    pub regular: bool,
    pub modified: SystemTime,
    pub size: u64,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The flags every open of a run file carries: never follow a symlink, never block on a FIFO,
/// never make a terminal our controlling one, never leak into a child.
const HOSTILE: OFlags = OFlags::NOFOLLOW
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// Mode 0600 for everything we create in a run dir.
const PRIVATE: Mode = Mode::RUSR.union(Mode::WUSR);

impl RunDir {
    /// Open the directory at `path` as the run dir of `id`: `O_PATH | O_DIRECTORY |
    /// O_NOFOLLOW`, then the checks of [`check_dir`] on what was opened. A refusal
    /// names the path; a missing dir is an `Io` error of kind `NotFound`.
    ///
    /// A run dir of ours whose mode is not 0700 (the workload can chmod its own dir: 0500
    /// keeps every file from being written, 0755 opens it to others) is set back to 0700, and
    /// [`RunDir::repaired`] says what it was: a mode is no reason to leave a run unstopped.
    pub fn open(path: &Path, id: RunId) -> Result<RunDir> {
        // Symlink, not a directory, not ours: refused. The mode is checked below.
        let (fd, md) = open_checked(path, "run dir", 0)?;
        let mode = md.mode() & 0o7777;
        let repaired = (mode != 0o700).then(|| {
            let how = match crate::sys::chmod_fd_path(fd.as_fd(), 0o700) {
                Ok(()) => "set back to 0700".to_string(),
                Err(e) => format!("could not be set back to 0700: {e}"),
            };
            format!("the run dir's mode was {mode:04o}; {how}")
        });
        Ok(RunDir {
            path: path.to_path_buf(),
            id,
            dev: md.dev(),
            ino: md.ino(),
            born: crate::sys::born(fd.as_fd(), &md),
            fd: Arc::new(fd),
            repaired,
        })
    }

    /// What [`RunDir::open`] found wrong with the dir and set right, for the journal.
    pub fn repaired(&self) -> Option<&str> {
        self.repaired.as_deref()
    }

    /// The dir's path, for messages and for what only takes a path (the workload's
    /// environment, inotify watches, removal).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// The path of one of the run's files, for messages.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The dir's (device, inode), as opened.
    pub fn identity(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// When the dir was made (its birth time), where the filesystem keeps it.
    pub fn born(&self) -> Option<SystemTime> {
        self.born
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The run dir itself, opened for reading (`O_RDONLY | O_DIRECTORY`) through its
    /// descriptor: what a `flock(2)` of the dir needs (see [`crate::lock`]).
    pub fn open_self(&self) -> Result<File> {
        rustix::fs::openat(
            self.fd(),
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(File::from)
        .map_err(|e| Error::io("open", &self.path, e.into()))
    }

    /// `lstat` of one file of the run dir; `None` when there is none (or it cannot be read).
    pub fn stat_file(&self, name: &str) -> Option<FileStat> {
        let st = rustix::fs::statat(self.fd(), name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let regular =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
        let modified = SystemTime::UNIX_EPOCH.checked_add(Duration::new(
            u64::try_from(st.st_mtime).ok()?,
            u32::try_from(st.st_mtime_nsec).ok()?,
        ))?;
        Some(FileStat {
            dev: st.st_dev,
            ino: st.st_ino,
            regular,
            modified,
            size: u64::try_from(st.st_size).unwrap_or(0),
        })
    }

    /// A fresh temp file beside `name` (`O_EXCL | O_NOFOLLOW`, mode 0600), unique to this
    /// process and call, so the rename or link that follows is atomic within the directory.
    fn temp_beside(&self, name: &str) -> (String, Result<File>) {
        temp_at(self.fd(), &self.path, name)
    }

    fn remove_temp(&self, tmp: &str) {
        let _ = rustix::fs::unlinkat(self.fd(), tmp, AtFlags::empty());
    }

    /// A new temp file beside `name` (ours: made O_EXCL) holding `bytes`, closed: its name. On
    /// failure nothing is left.
    fn temp_with(&self, name: &str, bytes: &[u8]) -> Result<String> {
        let (tmp, file) = self.temp_beside(name);
        file.and_then(|mut f| {
            f.write_all(bytes)
                .map_err(|e| Error::io("write", self.file(&tmp), e))
        })
        .inspect_err(|_| self.remove_temp(&tmp))?;
        Ok(tmp)
    }

    /// Replace `name` atomically with `bytes`; fsync file and dir when `durable`.
    pub fn write_atomic(&self, name: &str, bytes: &[u8], durable: bool) -> Result<()> {
        self.replace(name, durable, |f| f.write_all(bytes))
    }

    /// Put the same `bytes` under every name of `names` (the `pid` and `pgid` files), each
    /// appearing whole, from one temp file (ours: made O_EXCL): hard-linked to every name but
    /// the last (a name that exists, which the run may have planted, is replaced atomically on
    /// its own), then renamed onto the last. Not fsynced.
    pub fn write_same(&self, names: &[&str], bytes: &[u8]) -> Result<()> {
        let Some((last, first)) = names.split_last() else {
            return Ok(());
        };
        let tmp = self.temp_with(last, bytes)?;
        let result = (|| {
            for name in first {
                if rustix::fs::linkat(self.fd(), tmp.as_str(), self.fd(), *name, AtFlags::empty())
                    .is_err()
                {
                    self.write_atomic(name, bytes, false)?;
                }
            }
            rustix::fs::renameat(self.fd(), tmp.as_str(), self.fd(), *last)
                .map_err(|e| Error::io("rename into place", self.file(last), e.into()))
        })();
        if result.is_err() {
            self.remove_temp(&tmp);
        }
        result
    }

    /// Replace `name` atomically with what `write` puts into a temp file beside it; durable
    /// (on disk before this returns) when `durable`. The one way a document of the run reaches
    /// disk.
    ///
    /// The temp file takes the name's place by `renameat2(RENAME_EXCHANGE)`, and the old file,
    /// now under the temp name, is unlinked: a reader sees the old document or the new one,
    /// whole, as with a rename over it. A plain rename over an existing file costs a synchronous
    /// block allocation (ext4's `auto_da_alloc` flushes the new file) and, where the filesystem
    /// is mounted `discard`, a discard of the old one's block: about 4 ms a record on this
    /// project's machines, against 0.2 ms for the exchange (whose old file, a few milliseconds
    /// old, never got a block). Where there is nothing to exchange with, or the filesystem
    /// cannot exchange, it is a plain rename.
    ///
    /// Durable: where [`sync_order`] finds the ext4 driver (or tmpfs), the file is fsynced once
    /// after its rename, which carries the rename: a journal commit holds every change before
    /// it, and without a journal a freshly linked inode's fsync writes its directory too
    /// (`ext4_sync_parent`). Elsewhere the POSIX order: fsync the file, rename, fsync the dir.
    pub(crate) fn replace(
        &self,
        name: &str,
        durable: bool,
        write: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> Result<()> {
        replace_at(self.fd(), &self.path, name, durable, write)
    }

    /// Create `name` with `bytes` unless it exists: the bytes go to a temp file first, which is
    /// then hard-linked into place, so the file appears whole and exactly one of several racing
    /// callers creates it. Returns whether this call created it.
    pub fn write_new(&self, name: &str, bytes: &[u8]) -> Result<bool> {
        let tmp = self.temp_with(name, bytes)?;
        let result =
            match rustix::fs::linkat(self.fd(), tmp.as_str(), self.fd(), name, AtFlags::empty()) {
                Ok(()) => Ok(true),
                Err(rustix::io::Errno::EXIST) => Ok(false),
                Err(e) => Err(Error::io("create", self.file(name), e.into())),
            };
        self.remove_temp(&tmp);
        result
    }

    /// fsync the directory, so a rename in it is durable.
    pub fn sync(&self) -> Result<()> {
        sync_at(self.fd(), &self.path)
    }

    /// Open `name` with `flags` plus the hostile flags, and check it is a regular file of ours:
    /// the one way every run file is opened.
    fn open_hostile(&self, name: &str, flags: OFlags) -> Result<(File, std::fs::Metadata)> {
        open_hostile_at(self.fd(), &self.path, name, flags)
    }

    /// Open `name` for appending, creating it mode 0600, as a file the run could have replaced
    /// (see [`RunDir::open_run_file`]).
    pub fn open_append(&self, name: &str) -> Result<File> {
        self.open_hostile(name, OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE)
            .map(|(f, _)| f)
    }

    /// Open `name` (creating it mode 0600) for reading and writing, as a file the run could
    /// have replaced: the run's lock file.
    pub fn open_rw_create(&self, name: &str) -> Result<File> {
        self.open_hostile(name, OFlags::RDWR | OFlags::CREATE)
            .map(|(f, _)| f)
    }

    /// Open `name` write-only, never creating it, as a file the run could have replaced.
    pub fn open_write(&self, name: &str) -> Result<File> {
        self.open_hostile(name, OFlags::WRONLY).map(|(f, _)| f)
    }

    /// Open `name` read-only as a file the run could have replaced: `O_NOFOLLOW | O_NONBLOCK`,
    /// then fstat: a regular file owned by us, or `Corrupt` naming what it is instead. A FIFO
    /// costs one failed open, never a blocked reader. `Missing` when there is none.
    pub fn open_run_file(&self, name: &str) -> Result<(File, std::fs::Metadata)> {
        self.open_hostile(name, OFlags::RDONLY)
    }

    /// Read a whole run document of at most `cap` bytes ([`RunDir::open_run_file`], then plain
    /// `read(2)` calls). A larger file is `Corrupt`, and at most `cap + 1` bytes are ever read,
    /// so a 1 GiB file planted as status.json costs one fstat.
    pub fn read_run_file(&self, name: &str, cap: u64) -> Result<Vec<u8>> {
        read_capped_at(self.fd(), &self.path, name, cap)
    }
}

/// A fresh temp file beside `name` in the directory `dirfd` (at `dir`, for messages): see
/// [`RunDir::temp_beside`].
fn temp_at(dirfd: BorrowedFd<'_>, dir: &Path, name: &str) -> (String, Result<File>) {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{name}.{}.{n}.tmp", std::process::id());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
    let f = rustix::fs::openat(dirfd, tmp.as_str(), flags | OFlags::CLOEXEC, PRIVATE)
        .map(File::from)
        .map_err(|e| Error::io("create", dir.join(&tmp), e.into()));
    (tmp, f)
}

fn sync_at(dirfd: BorrowedFd<'_>, dir: &Path) -> Result<()> {
    rustix::fs::openat(
        dirfd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map(File::from)
    .map_err(std::io::Error::from)
    .and_then(|d| d.sync_all())
    .map_err(|e| Error::io("fsync directory", dir, e))
}

/// [`RunDir::replace`] in the directory `dirfd` (at `dir`, for messages): a temp file beside
/// `name`, what `write` puts in it, exchanged into the place of `name` ([`install_at`]), durable
/// when `durable` (in the [`SyncOrder`] of the filesystem). The one atomic writer, for the run
/// dirs and the root's own files alike.
pub(crate) fn replace_at(
    dirfd: BorrowedFd<'_>,
    dir: &Path,
    name: &str,
    durable: bool,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<()> {
    let (tmp, file) = temp_at(dirfd, dir, name);
    let mut installed = false;
    let result = (|| {
        let mut f = file?;
        write(&mut f).map_err(|e| Error::io("write", dir.join(&tmp), e))?;
        let after = durable && sync_order(dirfd) == SyncOrder::After;
        if durable && !after {
            f.sync_all()
                .map_err(|e| Error::io("fsync", dir.join(&tmp), e))?;
        }
        install_at(dirfd, dir, &tmp, name)?;
        installed = true;
        if after {
            f.sync_all()
                .map_err(|e| Error::io("fsync", dir.join(name), e))?;
        } else if durable {
            sync_at(dirfd, dir)?;
        }
        Ok(())
    })();
    if !installed {
        let _ = rustix::fs::unlinkat(dirfd, tmp.as_str(), AtFlags::empty());
    }
    result
}

/// Put the temp file `tmp` in the place of `name`: exchanged with the file there, which is
/// then unlinked (see [`RunDir::replace`]), or renamed when there is none or the filesystem
/// cannot exchange.
fn install_at(dirfd: BorrowedFd<'_>, dir: &Path, tmp: &str, name: &str) -> Result<()> {
    use rustix::fs::RenameFlags;
    match rustix::fs::renameat_with(dirfd, tmp, dirfd, name, RenameFlags::EXCHANGE) {
        // The old document, whatever was put there, now has the temp name: ours to remove
        // (a directory planted there stays, harmless, under a name nobody reads).
        Ok(()) => {
            let _ = rustix::fs::unlinkat(dirfd, tmp, AtFlags::empty());
            Ok(())
        }
        Err(_) => rustix::fs::renameat(dirfd, tmp, dirfd, name)
            .map_err(|e| Error::io("rename into place", dir.join(name), e.into())),
    }
}

/// Open the directory at `path` as a descriptor for `*at` calls (`O_PATH | O_DIRECTORY |
/// O_NOFOLLOW`: a symlink or a non-directory fails), with what `fstat` says of it.
pub(crate) fn open_dir(path: &Path) -> std::io::Result<(OwnedFd, std::fs::Metadata)> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = File::from(rustix::fs::open(path, flags, Mode::empty())?);
    let md = dir.metadata()?;
    Ok((OwnedFd::from(dir), md))
}

/// Open `name` in the directory `dirfd` (at `path`, for messages) with `flags` plus the hostile
/// flags, creating it mode 0600 where `flags` say so, and check it is a regular file of ours.
pub(crate) fn open_hostile_at(
    dirfd: BorrowedFd<'_>,
    path: &Path,
    name: &str,
    flags: OFlags,
) -> Result<(File, std::fs::Metadata)> {
    let path = path.join(name);
    let f = rustix::fs::openat(dirfd, name, flags | HOSTILE, PRIVATE)
        .map(File::from)
        .map_err(|e| open_error(&path, e.into()))?;
    let md = check_regular(&f, &path)?;
    Ok((f, md))
}

/// [`RunDir::read_run_file`] of `name` in the directory `dirfd` (at `path`, for messages).
pub(crate) fn read_capped_at(
    dirfd: BorrowedFd<'_>,
    path: &Path,
    name: &str,
    cap: u64,
) -> Result<Vec<u8>> {
    let (mut f, md) = open_hostile_at(dirfd, path, name, OFlags::RDONLY)?;
    let too_big = |n: u64| Error::Corrupt {
        path: path.join(name),
        why: format!("it holds {n} bytes, more than the {cap} a {name} may hold"),
    };
    if md.len() > cap {
        return Err(too_big(md.len()));
    }
    let bytes = read_capped(&mut f, cap).map_err(|e| Error::io("read", path.join(name), e))?;
    if bytes.len() as u64 > cap {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Check what `open` gave us: a regular file owned by this user. A FIFO, socket, device or
/// directory planted by the workload makes the file corrupt, never a blocked reader.
fn check_regular(f: &File, path: &Path) -> Result<std::fs::Metadata> {
    use std::os::unix::fs::FileTypeExt;
    let md = f.metadata().map_err(|e| Error::io("inspect", path, e))?;
    let ft = md.file_type();
    let kind = if ft.is_file() {
        None
    } else if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_char_device() || ft.is_block_device() {
        Some("a device")
    } else if ft.is_dir() {
        Some("a directory")
    } else {
        Some("not a file")
    };
    if let Some(kind) = kind {
        return Err(Error::Corrupt {
            path: path.to_path_buf(),
            why: format!("it is {kind}, not a regular file"),
        });
    }
    let me = crate::sys::geteuid();
    if md.uid() != me {
        return Err(Error::Corrupt {
            path: path.to_path_buf(),
            why: format!("it is owned by uid {}, not by uid {me}", md.uid()),
        });
    }
    Ok(md)
}

/// In which order a durable [`RunDir::replace`] syncs, by the filesystem of the run dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncOrder {
    /// Rename, then one fsync of the file: the ext4 driver and tmpfs.
    After,
    /// fsync the file, rename, fsync the dir: every other filesystem.
    Posix,
}

/// The [`SyncOrder`] of the filesystem of `dir`, found once per device and process. The ext4
/// driver is known by the filesystem magic (0xEF53, which ext2 and ext3 share) and its
/// /proc/fs/ext4/<device> entry, which the legacy ext2 driver does not make.
fn sync_order(dir: BorrowedFd<'_>) -> SyncOrder {
    let Ok(dev) = rustix::fs::fstat(dir).map(|st| st.st_dev) else {
        return SyncOrder::Posix;
    };
    static KNOWN: std::sync::Mutex<Vec<(u64, SyncOrder)>> = std::sync::Mutex::new(Vec::new());
    const EXT4: i64 = 0xEF53;
    const TMPFS: i64 = 0x0102_1994;
    let known = |k: &[(u64, SyncOrder)]| k.iter().find(|(d, _)| *d == dev).map(|&(_, o)| o);
    if let Some(o) = KNOWN.lock().ok().and_then(|k| known(&k)) {
        return o;
    }
    // f_type is a c_long here, an int or unsigned elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let order = match rustix::fs::fstatfs(dir).map(|s| s.f_type as i64) {
        Ok(TMPFS) => SyncOrder::After,
        Ok(EXT4) => {
            let link = format!(
                "/sys/dev/block/{}:{}",
                rustix::fs::major(dev),
                rustix::fs::minor(dev)
            );
            let ext4_driver = std::fs::read_link(link).ok().is_some_and(|target| {
                target
                    .file_name()
                    .is_some_and(|name| Path::new("/proc/fs/ext4").join(name).is_dir())
            });
            if ext4_driver {
                SyncOrder::After
            } else {
                SyncOrder::Posix
            }
        }
        _ => SyncOrder::Posix,
    };
    if let Ok(mut k) = KNOWN.lock() {
        k.push((dev, order));
    }
    order
}

/// An open() error on a run file, in the library's terms: `Missing`, `Corrupt` for what the
/// workload could have planted (a symlink: ELOOP; a socket or a FIFO without a reader: ENXIO),
/// `Io` otherwise.
fn open_error(path: &Path, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Error::Missing {
            path: path.to_path_buf(),
        },
        Some(libc::ELOOP) => Error::Corrupt {
            path: path.to_path_buf(),
            why: "it is a symlink, not a regular file".into(),
        },
        Some(libc::ENXIO) => Error::Corrupt {
            path: path.to_path_buf(),
            why: "it is a socket or a FIFO, not a regular file".into(),
        },
        _ => Error::io("open", path, e),
    }
}

pub(crate) use crate::sys::read_capped;

/// Open the directory at `path` ([`open_dir`]) and hold what was opened to the
/// rules of [`check_dir`]. A refusal names the path; a missing dir is an `Io` error of kind
/// `NotFound`.
pub(crate) fn open_checked(
    path: &Path,
    what: &str,
    forbidden_bits: u32,
) -> Result<(OwnedFd, fs::Metadata)> {
    let (fd, md) = match open_dir(path) {
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
    // What to use instead, in the refusal's words.
    let (another, own) = match what {
        "run root" => ("root (--root DIR)", "root (--root DIR)"),
        _ => ("run id", "run id or root"),
    };
    if md.file_type().is_symlink() {
        return unsafe_(format!(
            "{what} {p} is a symlink: use the directory itself (--root DIR) or remove the link"
        ));
    }
    if !md.is_dir() {
        return unsafe_(format!(
            "{what} {p} is not a directory: remove it or use another {another}"
        ));
    }
    let me = crate::sys::geteuid();
    if md.uid() != me {
        return unsafe_(format!(
            "{what} {p} belongs to uid {}, not to you (uid {me}): use a {own} of your own",
            md.uid()
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

/// A run dir for the unit tests of the modules that own its files: a fresh temp dir (0700).
#[cfg(test)]
pub(crate) fn temp() -> (tempfile::TempDir, RunDir) {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let rd = RunDir::open(d.path(), RunId::parse("t1").unwrap()).unwrap();
    (d, rd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_whole_files_with_mode_0600_and_leaves_no_temp() {
        let (d, rd) = temp();
        rd.write_atomic("status.json", b"{\"a\":1}", false).unwrap();
        rd.write_atomic("status.json", b"{\"a\":2}", true).unwrap();
        assert_eq!(
            std::fs::read(d.path().join("status.json")).unwrap(),
            b"{\"a\":2}"
        );
        let mode = std::fs::metadata(d.path().join("status.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        assert!(rd.write_new("cancel.json", b"1").unwrap());
        assert!(!rd.write_new("cancel.json", b"2").unwrap());
        assert_eq!(std::fs::read(d.path().join("cancel.json")).unwrap(), b"1");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_replace_exchanges_the_file_so_readers_keep_the_old_one_and_plants_go() {
        let (d, rd) = temp();
        rd.write_atomic("status.json", b"old", false).unwrap();
        let before = std::fs::metadata(d.path().join("status.json"))
            .unwrap()
            .ino();
        // A reader holding the old record reads it whole after the replace.
        let held = File::open(d.path().join("status.json")).unwrap();
        for durable in [false, true] {
            rd.write_atomic("status.json", b"new", durable).unwrap();
        }
        let after = std::fs::metadata(d.path().join("status.json")).unwrap();
        assert_ne!(after.ino(), before, "a new inode took the name");
        assert_eq!(std::fs::read(d.path().join("status.json")).unwrap(), b"new");
        assert_eq!(std::io::read_to_string(&held).unwrap(), "old");
        assert_eq!(
            held.metadata().unwrap().nlink(),
            0,
            "the old file was unlinked"
        );
        // A symlink the run planted is swapped out and removed, its target untouched.
        let target = d.path().join("target");
        std::fs::write(&target, b"theirs").unwrap();
        std::fs::remove_file(d.path().join("status.json")).unwrap();
        std::os::unix::fs::symlink(&target, d.path().join("status.json")).unwrap();
        rd.write_atomic("status.json", b"ours", true).unwrap();
        let md = std::fs::symlink_metadata(d.path().join("status.json")).unwrap();
        assert!(md.is_file(), "a regular file replaced the symlink");
        assert_eq!(std::fs::read(&target).unwrap(), b"theirs");
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no temp file is left: {names:?}");
    }

    #[test]
    fn the_sync_order_is_after_the_rename_only_where_the_fsync_carries_it() {
        use std::os::fd::AsFd;
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let f = File::open(shm.path()).unwrap();
        assert_eq!(sync_order(f.as_fd()), SyncOrder::After, "tmpfs");
        // /proc is neither ext4 nor tmpfs: the POSIX order.
        let p = File::open("/proc/self").unwrap();
        assert_eq!(sync_order(p.as_fd()), SyncOrder::Posix, "procfs");
        // The cache answers per device.
        assert_eq!(sync_order(f.as_fd()), SyncOrder::After);
    }

    #[test]
    fn planted_fifos_symlinks_and_big_files_are_corrupt_without_blocking() {
        let (d, rd) = temp();
        assert!(std::process::Command::new("mkfifo")
            .arg(d.path().join("lease.json"))
            .status()
            .unwrap()
            .success());
        let e = rd.read_run_file("lease.json", caps::LEASE).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("FIFO"), "{e}");
        // Appending to a FIFO nobody reads: ENXIO at once, never a blocked open.
        assert!(matches!(
            rd.open_append("lease.json"),
            Err(Error::Corrupt { .. })
        ));
        std::os::unix::fs::symlink("/dev/zero", d.path().join("cancel.json")).unwrap();
        let e = rd.read_run_file("cancel.json", caps::CANCEL).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        let big = std::fs::File::create(d.path().join("status.json")).unwrap();
        big.set_len(1 << 30).unwrap();
        let e = rd.read_run_file("status.json", caps::STATUS).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
        assert!(matches!(
            rd.read_run_file("nope", 10),
            Err(Error::Missing { .. })
        ));
        std::fs::write(d.path().join("small"), b"12345").unwrap();
        assert_eq!(rd.read_run_file("small", 5).unwrap(), b"12345");
        assert!(rd.read_run_file("small", 4).is_err());
    }

    #[test]
    fn refuses_to_append_through_a_symlink() {
        let (d, rd) = temp();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("stdout.log")).unwrap();
        assert!(rd.open_append("stdout.log").is_err());
    }

    #[test]
    fn files_stay_in_the_dir_that_was_checked_when_its_path_is_swapped() {
        let parent = tempfile::tempdir().unwrap();
        let (a, b) = (parent.path().join("r1"), parent.path().join("elsewhere"));
        std::fs::DirBuilder::new().mode(0o700).create(&a).unwrap();
        let rd = RunDir::open(&a, RunId::parse("r1").unwrap()).unwrap();
        // The workload renames the run dir away and plants a symlink in its place.
        std::fs::rename(&a, &b).unwrap();
        std::os::unix::fs::symlink("/tmp", &a).unwrap();
        rd.write_atomic("status.json", b"{}", true).unwrap();
        assert!(b.join("status.json").is_file());
        assert_eq!(rd.read_run_file("status.json", 10).unwrap(), b"{}");
        // And a dir that is a symlink is refused when opened, naming what it is.
        let e = RunDir::open(&a, RunId::parse("r1").unwrap()).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
    }

    use std::os::unix::fs::DirBuilderExt;
}
