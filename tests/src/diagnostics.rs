//! What a failing check prints about a run: its run dir's listing, record, journal and logs.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::TestRoot;

/// Read a file of a run dir the way a careful reader must (a test plays the hostile workload
/// too): never follow a symlink, never block on a planted FIFO, only a regular file.
pub fn read_run_file(path: &Path) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    // A planted 1 GiB file must not become a 1 GiB failure message.
    let mut buf = Vec::new();
    (&mut f).take(16 << 20).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The last `max` bytes of a file, as lossy text, or why it cannot be read.
pub(crate) fn tail(path: &Path, max: usize) -> String {
    match read_run_file(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max);
            let prefix = if start > 0 { "[…]" } else { "" };
            format!("{prefix}{}", String::from_utf8_lossy(&bytes[start..]))
        }
        Err(e) => format!("<{e}>"),
    }
}

/// A dump of run `id` of `root` for panic messages ([`run_dir_diagnostics`]).
pub fn diagnostics(root: &TestRoot, id: &str) -> String {
    run_dir_diagnostics(&root.run_dir(id))
}

/// A dump of a run dir for panic messages: its listing (mode, size, name), status.json,
/// events.jsonl, lease.json and cancel.json, and the tails of stdout.log and stderr.log.
pub fn run_dir_diagnostics(dir: &Path) -> String {
    let dir = dir.to_path_buf();
    let mut out = format!("--- run dir {}\n", dir.display());
    match fs::read_dir(&dir) {
        Ok(entries) => {
            let mut names: Vec<_> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect();
            names.sort();
            for name in names {
                let path = dir.join(&name);
                match fs::symlink_metadata(&path) {
                    Ok(meta) => out.push_str(&format!(
                        "  {:06o} {:>8} {}\n",
                        meta.mode(),
                        meta.len(),
                        name.to_string_lossy()
                    )),
                    Err(e) => out.push_str(&format!("  {}: {e}\n", name.to_string_lossy())),
                }
            }
        }
        Err(e) => out.push_str(&format!("  <{e}>\n")),
    }
    let files = [
        ("status.json", 8000),
        ("events.jsonl", 8000),
        ("lease.json", 2000),
        ("cancel.json", 2000),
        ("stdout.log", 2000),
        ("stderr.log", 2000),
    ];
    for (name, max) in files {
        let path = dir.join(name);
        if name.ends_with(".log") || path.exists() {
            out.push_str(&format!("--- {name}\n{}\n", tail(&path, max)));
        }
    }
    out
}
