//! Atomic file writes and safe file creation in a run dir.
//!
//! [`write_atomic`] is the one way any record reaches disk: a temp file in the same directory
//! (created `O_EXCL | O_NOFOLLOW`, mode 0600), the bytes, `rename(2)` over the target. Readers see
//! the old document or the new one, never a mix. With `durable`, the file is fsynced before the
//! rename and the directory after it, so the record survives a crash once we report it.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh temp file beside `dir/name` (`O_EXCL | O_NOFOLLOW`, mode 0600), unique to this
/// process and call, so the rename or link that follows is atomic within the directory.
fn temp_beside(dir: &Path, name: &str) -> (PathBuf, Result<File>) {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| Error::io("create", &tmp, e));
    (tmp, f)
}

/// Replace `dir/name` atomically with `bytes`; fsync file and dir when `durable`.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> Result<()> {
    let (tmp, file) = temp_beside(dir, name);
    let target = dir.join(name);
    let result = (|| {
        let mut f = file?;
        if name == crate::root::files::STATUS
            && crate::fault::armed("mid_record_write")
            && target.exists()
        {
            // Die with half a document in the temp file: status.json must stay whole.
            let _ = f.write_all(&bytes[..bytes.len() / 2]);
            crate::sys::kill_self();
        }
        f.write_all(bytes)
            .map_err(|e| Error::io("write", &tmp, e))?;
        if durable {
            f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
        }
        drop(f);
        std::fs::rename(&tmp, &target).map_err(|e| Error::io("rename into place", &target, e))?;
        if durable {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Create `dir/name` with `bytes` unless it exists: the bytes go to a temp file first, which is
/// then hard-linked into place, so the file appears whole and exactly one of several racing
/// callers creates it. Returns whether this call created it.
pub fn write_new(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool> {
    let (tmp, file) = temp_beside(dir, name);
    let target = dir.join(name);
    let result = (|| {
        let mut f = file?;
        f.write_all(bytes)
            .map_err(|e| Error::io("write", &tmp, e))?;
        drop(f);
        match std::fs::hard_link(&tmp, &target) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io("create", &target, e)),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// fsync a directory, so a rename in it is durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync directory", dir, e))
}

/// The flags every open of a run file carries: never follow a symlink, never block on a FIFO,
/// never make a terminal our controlling one, never leak into a child.
const HOSTILE: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// Size caps for the documents of a run dir: a record holds argv (at most ~2 MiB on Linux,
/// escaped); lease and cancel requests are a line each.
pub mod caps {
    pub const STATUS: u64 = 16 << 20;
    pub const LEASE: u64 = 64 << 10;
    pub const CANCEL: u64 = 64 << 10;
}

/// Check what `open` gave us: a regular file owned by this user. A FIFO, socket, device or
/// directory planted by the workload makes the file corrupt, never a blocked reader.
fn check_regular(f: &File, path: &Path) -> Result<std::fs::Metadata> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
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

/// Open `dir/name` with `opts` plus the hostile flags, and check it is a regular file of ours:
/// the one way every run file is opened.
fn open_hostile(
    dir: &Path,
    name: &str,
    opts: &mut OpenOptions,
) -> Result<(File, std::fs::Metadata)> {
    let path = dir.join(name);
    let f = opts
        .mode(0o600)
        .custom_flags(HOSTILE)
        .open(&path)
        .map_err(|e| open_error(&path, e))?;
    let md = check_regular(&f, &path)?;
    Ok((f, md))
}

/// Open `dir/name` for appending, creating it mode 0600, as a file the run could have replaced
/// (see [`open_run_file`]).
pub fn open_append(dir: &Path, name: &str) -> Result<File> {
    open_hostile(dir, name, OpenOptions::new().append(true).create(true)).map(|(f, _)| f)
}

/// Open `dir/name` (creating it mode 0600) for reading and writing, as a file the run could
/// have replaced: the run's lock file.
pub fn open_rw_create(dir: &Path, name: &str) -> Result<File> {
    open_hostile(
        dir,
        name,
        OpenOptions::new().read(true).write(true).create(true),
    )
    .map(|(f, _)| f)
}

/// Open `dir/name` read-only as a file the run could have replaced: `O_NOFOLLOW | O_NONBLOCK`,
/// then fstat: a regular file owned by us, or `Corrupt` naming what it is instead. A FIFO
/// costs one failed open, never a blocked reader. `Missing` when there is none.
pub fn open_run_file(dir: &Path, name: &str) -> Result<(File, std::fs::Metadata)> {
    open_hostile(dir, name, OpenOptions::new().read(true))
}

/// Read a whole run document of at most `cap` bytes ([`open_run_file`], then plain `read(2)`
/// calls). A larger file is `Corrupt`, and at most `cap + 1` bytes are ever read, so a 1 GiB
/// file planted as status.json costs one fstat.
pub fn read_run_file(dir: &Path, name: &str, cap: u64) -> Result<Vec<u8>> {
    let (mut f, md) = open_run_file(dir, name)?;
    let path = || dir.join(name);
    let too_big = |n: u64| Error::Corrupt {
        path: path(),
        why: format!("it holds {n} bytes, more than the {cap} a {name} may hold"),
    };
    if md.len() > cap {
        return Err(too_big(md.len()));
    }
    let bytes = read_capped(&mut f, cap).map_err(|e| Error::io("read", path(), e))?;
    if bytes.len() as u64 > cap {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Read up to `cap + 1` bytes: plain `read(2)` calls into a growing buffer, without the size
/// probe and seek that `read_to_string` adds (two syscalls per record, 10,000 records per
/// rescan).
fn read_capped(f: &mut File, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let limit = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    let mut buf = vec![0u8; 4096.min(limit)];
    let mut n = 0;
    while n < limit {
        if n == buf.len() {
            buf.resize((buf.len() * 2).min(limit), 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A FIFO swapped in between the fstat and here cannot happen (same fd), but a
            // regular file on a filesystem that answers EAGAIN is reported, not spun on.
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_whole_files_with_mode_0600_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        write_atomic(d.path(), "status.json", b"{\"a\":1}", false).unwrap();
        write_atomic(d.path(), "status.json", b"{\"a\":2}", true).unwrap();
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
    }

    #[test]
    fn planted_fifos_symlinks_and_big_files_are_corrupt_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        assert!(std::process::Command::new("mkfifo")
            .arg(d.path().join("lease.json"))
            .status()
            .unwrap()
            .success());
        let e = read_run_file(d.path(), "lease.json", caps::LEASE).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("FIFO"), "{e}");
        // Appending to a FIFO nobody reads: ENXIO at once, never a blocked open.
        assert!(matches!(
            open_append(d.path(), "lease.json"),
            Err(Error::Corrupt { .. })
        ));
        std::os::unix::fs::symlink("/dev/zero", d.path().join("cancel.json")).unwrap();
        let e = read_run_file(d.path(), "cancel.json", caps::CANCEL).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        let big = std::fs::File::create(d.path().join("status.json")).unwrap();
        big.set_len(1 << 30).unwrap();
        let e = read_run_file(d.path(), "status.json", caps::STATUS).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
        assert!(matches!(
            read_run_file(d.path(), "nope", 10),
            Err(Error::Missing { .. })
        ));
        std::fs::write(d.path().join("small"), b"12345").unwrap();
        assert_eq!(read_run_file(d.path(), "small", 5).unwrap(), b"12345");
        assert!(read_run_file(d.path(), "small", 4).is_err());
    }

    #[test]
    fn refuses_to_append_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("stdout.log")).unwrap();
        assert!(open_append(d.path(), "stdout.log").is_err());
    }
}
