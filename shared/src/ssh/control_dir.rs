//! The private directory of the control sockets: 0700, ours, under a short plain path (a unix
//! socket path has ~108 bytes, and ssh's option parser treats spaces, quotes and `%` specially).
//! It is removed on drop, or earlier by [`ControlDir::remove`]. Its owner holds a flock on it
//! for its whole life, so the directories of an owner that was SIGKILLed are known stale: the
//! next [`ControlDir::create`] with the same prefix removes them.

use crate::sys;
use std::fs;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Our private directory for master sockets, removed on drop.
pub struct ControlDir {
    path: PathBuf,
    /// The directory, open and flocked while we live (close-on-exec: no ssh child holds it).
    _held: Option<fs::File>,
}

/// How old a directory must be before a sweep may take it for stale: its maker flocks it
/// right after the mkdir.
const STALE_AFTER: Duration = Duration::from_secs(10);

impl ControlDir {
    /// A new 0700 directory `PREFIX.RANDOM` under $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp. A
    /// base whose path has characters that ssh would treat specially, or that would make the
    /// socket path too long, is skipped.
    pub fn create(prefix: &str) -> io::Result<ControlDir> {
        let bases = [
            std::env::var_os("XDG_RUNTIME_DIR"),
            std::env::var_os("TMPDIR"),
        ]
        .into_iter()
        .flatten()
        .map(PathBuf::from)
        .chain([PathBuf::from("/tmp")]);
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no usable temporary directory");
        for base in bases.filter(|b| plain(b)) {
            sweep_stale(&base, prefix);
            for _ in 0..5 {
                let path = base.join(format!("{prefix}.{}", random_hex(6)?));
                match fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => return ControlDir::checked(path),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        last = e;
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    /// The directory we just made must be ours and private (a umask cannot widen 0700).
    fn checked(path: PathBuf) -> io::Result<ControlDir> {
        let mut dir = ControlDir { path, _held: None };
        let meta = fs::symlink_metadata(&dir.path)?;
        if !meta.is_dir() || meta.uid() != sys::geteuid() || meta.mode() & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not a private directory of ours",
                dir.path.display()
            )));
        }
        let held = fs::File::open(&dir.path)?;
        sys::try_lock_exclusive(held.as_fd())?;
        dir._held = Some(held);
        Ok(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove the directory and what is left in it.
    pub fn remove(&self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

impl Drop for ControlDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Remove the directories `PREFIX.*` in `base` that are ours, older than [`STALE_AFTER`] and
/// held by no one: their owner died without its drop (SIGKILL). Errors are ignored.
fn sweep_stale(base: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    let start = format!("{prefix}.");
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(|n| n.starts_with(&start)) {
            continue;
        }
        let path = e.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if !meta.is_dir() || meta.uid() != sys::geteuid() || !old {
            continue;
        }
        let free = fs::File::open(&path)
            .and_then(|f| sys::try_lock_exclusive(f.as_fd()))
            .unwrap_or(false);
        if free {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// An absolute, short path of letters, digits and `/._-` only.
fn plain(base: &Path) -> bool {
    base.to_str().is_some_and(|s| {
        s.starts_with('/')
            && s.len() < 60
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
    })
}

/// `n` random bytes from /dev/urandom, as lowercase hex.
fn random_hex(n: usize) -> io::Result<String> {
    let mut bytes = vec![0u8; n];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory `name` in `base`, made `age` old.
    fn aged(base: &Path, name: &str, age: Duration) -> PathBuf {
        let p = base.join(name);
        fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
        fs::write(p.join("cm0"), b"").unwrap();
        let when = std::time::SystemTime::now() - age;
        fs::File::open(&p).unwrap().set_modified(when).unwrap();
        p
    }

    #[test]
    fn a_sweep_removes_only_old_unheld_directories_of_its_prefix() {
        let base = tempfile::tempdir().unwrap();
        let old = Duration::from_secs(60);
        let stale = aged(base.path(), "agent-run-ssh.aaaa", old);
        let young = aged(base.path(), "agent-run-ssh.bbbb", Duration::ZERO);
        let held = aged(base.path(), "agent-run-ssh.cccc", old);
        let other = aged(base.path(), "agent-run-mcp.dddd", old);
        let lock = fs::File::open(&held).unwrap();
        assert!(sys::try_lock_exclusive(lock.as_fd()).unwrap());
        // A lock taken through another open file description, as another process would.
        sweep_stale(base.path(), "agent-run-ssh");
        assert!(!stale.exists(), "a stale directory was left");
        assert!(young.exists(), "a directory just made was taken for stale");
        assert!(held.exists(), "a held directory was removed");
        assert!(other.exists(), "another prefix's directory was removed");
    }
}
