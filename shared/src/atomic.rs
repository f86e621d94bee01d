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

/// Open `dir/name` for appending, creating it mode 0600, never following a symlink.
pub fn open_append(dir: &Path, name: &str) -> Result<File> {
    let path = dir.join(name);
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| Error::io("open", &path, e))
}

/// Open `dir/name` read-only, never following a symlink.
pub fn open_read(dir: &Path, name: &str) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(name))
}

/// Read a small file whole: plain `read(2)` calls into a growing buffer, without the size probe
/// and seek that `read_to_string` adds (two syscalls per record, 10,000 records per rescan).
pub fn read_small(f: &mut File) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
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
    fn refuses_to_append_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("stdout.log")).unwrap();
        assert!(open_append(d.path(), "stdout.log").is_err());
    }
}
