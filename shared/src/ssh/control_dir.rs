//! The private directory of the control sockets: 0700, ours, under a short plain path (a unix
//! socket path has ~108 bytes, and ssh's option parser treats spaces, quotes and `%` specially).
//! It is removed on drop, or earlier by [`ControlDir::remove`].

use crate::sys;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Our private directory for master sockets, removed on drop.
pub struct ControlDir {
    path: PathBuf,
}

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
        let dir = ControlDir { path };
        let meta = fs::symlink_metadata(&dir.path)?;
        if !meta.is_dir() || meta.uid() != sys::geteuid() || meta.mode() & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not a private directory of ours",
                dir.path.display()
            )));
        }
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
