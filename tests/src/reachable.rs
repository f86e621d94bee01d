//! Copies of the binaries under test that every user can run.
//!
//! Some tests run the binaries as `nobody`. A checkout below a directory that others cannot
//! search (a clone in /root, mode 0700) is out of that user's reach: exec fails with EACCES.
//! Then the binaries are linked, or copied, once per test process into a directory of root's
//! in the temporary directory, and the tests run those. The directory is mode 0755 and its
//! files are root's, 0755: `nobody` runs them and cannot replace them.
//!
//! The directory's name carries the test process's pid. It stays when the process ends (a
//! test binary has no exit hook); the next test process removes those of dead pids.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The name of each copy directory starts with this, then `<pid>.`.
const PREFIX: &str = "agent-run-test-bins.";

/// The binaries a test may ask for, linked together: a binary that finds another beside
/// itself (`agent-run-mcp` finds `agent-run`) finds it among the copies too.
const BINARIES: [&str; 5] = [
    "agent-run",
    "agent-run-watchdog",
    "agent-run-mcp",
    "agent-run-gen",
    "fixture",
];

/// `path` itself when every user reaches it; else its copy, and the copies of the
/// [`BINARIES`] beside it, made on the first call for its directory.
pub fn reachable(path: PathBuf) -> PathBuf {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return path;
    };
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    if others_reach(&dir) {
        return path;
    }
    static COPIES: Mutex<BTreeMap<PathBuf, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut copies = COPIES.lock().unwrap_or_else(|e| e.into_inner());
    let next = copies.len();
    let dest = copies
        .entry(dir.clone())
        .or_insert_with(|| copy_dir(&dir, next))
        .clone();
    let copy = dest.join(name);
    if !copy.exists() {
        link_or_copy(&path, &copy);
    }
    copy
}

/// Whether `dir` and every directory above it are searchable by others.
fn others_reach(dir: &Path) -> bool {
    dir.ancestors()
        .all(|d| fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 != 0))
}

/// `<copies>/<n>`, mode 0755, with the [`BINARIES`] of `dir` linked in.
fn copy_dir(dir: &Path, n: usize) -> PathBuf {
    let dest = copies().join(n.to_string());
    fs::create_dir(&dest).unwrap_or_else(|e| panic!("mkdir {}: {e}", dest.display()));
    chmod_755(&dest);
    for name in BINARIES {
        let source = dir.join(name);
        if source.is_file() {
            link_or_copy(&source, &dest.join(name));
        }
    }
    dest
}

/// This process's copy directory, made on first use (after removing those of dead pids).
fn copies() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        sweep_dead();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}.", std::process::id()))
            .tempdir()
            .expect("a directory for the copies of the binaries")
            .keep();
        chmod_755(&dir);
        dir
    })
}

/// Removes the copy directories of test processes that are gone.
fn sweep_dead() {
    for e in fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix(PREFIX).and_then(|r| r.split('.').next());
        let pid = pid.and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// A hard link of `source` at `dest` when `source` is root's, runnable by all and writable by
/// no one else; else a copy, root's and 0755.
fn link_or_copy(source: &Path, dest: &Path) {
    let meta = fs::metadata(source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    let safe = meta.uid() == 0 && meta.mode() & 0o022 == 0 && meta.mode() & 0o005 == 0o005;
    if safe && fs::hard_link(source, dest).is_ok() {
        return;
    }
    fs::copy(source, dest)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", source.display(), dest.display()));
    chmod_755(dest);
}

fn chmod_755(path: &Path) {
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod 0755 {}: {e}", path.display()));
}
