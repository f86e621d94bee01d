//! The run's output counts: what the keeper wrote to stdout.log/stderr.log and what it dropped,
//! the `--max-output` cap, and how the final record learns the counts.
//!
//! The workload writes into pipes; the keeper (a fork of the wrapper, `agent-run __keep DIR` in ps,
//! see the wrapper's `keeper.rs`) is the only writer of the logs. When its last source hits EOF it writes
//! `output.json` (0600, atomically) and exits. Whoever writes the final record calls
//! [`collect`]: it waits a bounded time for output.json, reads it as a file the run could have
//! planted, and otherwise falls back to the logs' sizes with `complete: false`. The workload can
//! forge output.json: it only ever feeds counts into the record, never what is signalled.

use crate::error::{Error, Result};
use crate::root::Root;
use crate::run_dir::{files, RunDir};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, Instant};

/// The keeper's final counts, in the run dir.
pub const FILE: &str = "output.json";
/// The file in the run root that sets the root's default `--max-output`.
pub const ROOT_FILE: &str = "max-output";
/// The variable that sets the default `--max-output` (before the root's file).
pub const ENV_MAX_OUTPUT: &str = "AGENT_RUN_MAX_OUTPUT";
/// The default cap per stream: 1 GiB.
pub const DEFAULT_LIMIT: u64 = 1 << 30;
/// How long the final record's writer waits for output.json once the run's processes are gone.
pub const WAIT: Duration = Duration::from_secs(2);
/// The largest output.json read.
const CAP: u64 = 64 << 10;

/// One stream's counts: bytes of the workload written to the log and dropped (markers not
/// counted), and why it was capped (`"max_output"`, `"disk_reserve"`, `"disk_full"`), if it was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCount {
    pub written: Option<u64>,
    pub dropped: Option<u64>,
    #[serde(default)]
    pub capped: Option<String>,
}

/// The record's `output` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub stdout: StreamCount,
    pub stderr: StreamCount,
    /// The cap per stream in bytes; null when unlimited.
    pub limit: Option<u64>,
    /// `"keep"` (drop and count) or `"stop"` (`--on-output-limit=stop`).
    #[serde(default)]
    pub on_limit: Option<String>,
    /// The keeper's own final counts (true), or the logs' sizes as found (false).
    pub complete: bool,
    /// Not in the record: these counts are what there will be (the keeper is gone), so the
    /// final record's writer takes them as they are instead of waiting for output.json.
    #[serde(skip)]
    pub settled: bool,
}

impl Output {
    /// What a record says while the keeper runs: the cap, no counts yet.
    pub fn pending(limit: Option<u64>, stop: bool) -> Output {
        Output {
            stdout: StreamCount::default(),
            stderr: StreamCount::default(),
            limit,
            on_limit: Some(if stop { "stop" } else { "keep" }.into()),
            complete: false,
            settled: false,
        }
    }
}

/// Parse a size: bytes, or a number with K, M, G or T (powers of 1024, an optional `B` or
/// `iB` after it). `0` and `none` mean unlimited (`Ok(None)`).
pub fn parse_size(s: &str) -> std::result::Result<Option<u64>, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") || t.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1u64 << 10),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        Some('g') => (&body[..body.len() - 1], 1 << 30),
        Some('t') => (&body[..body.len() - 1], 1 << 40),
        _ => (body, 1),
    };
    let bad = || {
        format!("invalid size {s:?}: expected BYTES, or a number with K, M, G or T, or 0 or none for no limit")
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    let v = n.checked_mul(mult).ok_or_else(bad)?;
    Ok((v > 0).then_some(v))
}

/// The default cap for runs under `root`: `$AGENT_RUN_MAX_OUTPUT`, else `<root>/max-output`
/// (one size, read as a file the runs could have planted), else [`DEFAULT_LIMIT`].
pub fn root_default(root: &Root) -> Result<Option<u64>> {
    let bad = |why: String, path: &Path| Error::Corrupt {
        path: path.to_path_buf(),
        why,
    };
    if let Some(v) = std::env::var_os(ENV_MAX_OUTPUT) {
        let v = v.to_string_lossy();
        return parse_size(&v).map_err(|e| bad(e, Path::new(ENV_MAX_OUTPUT)));
    }
    match root.read_file(ROOT_FILE, 256) {
        Ok(bytes) => {
            let s = String::from_utf8_lossy(&bytes);
            parse_size(s.trim()).map_err(|e| bad(e, &root.path().join(ROOT_FILE)))
        }
        Err(Error::Missing { .. }) => Ok(Some(DEFAULT_LIMIT)),
        Err(e) => Err(e),
    }
}

/// Read output.json (capped, never through a symlink or a FIFO).
pub fn read(dir: &RunDir) -> Result<Output> {
    let bytes = dir.read_run_file(FILE, CAP)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
        path: dir.file(FILE),
        why: e.to_string(),
    })
}

/// The counts for a final record: output.json once it appears (waiting up to `wait` for it,
/// on inotify, no fixed sleeps), else the logs' sizes as `written`, with `complete: false`.
pub fn collect(dir: &RunDir, pending: &Output, wait: Duration) -> Output {
    let deadline = Instant::now() + wait;
    if let Ok(o) = read(dir) {
        return o;
    }
    // Watch first, then look again: a file renamed into place between the two is seen.
    if let Ok(ino) = crate::sys::Inotify::new() {
        if ino
            .add_watch(dir.path(), crate::sys::Inotify::CHANGED)
            .is_ok()
        {
            loop {
                if let Ok(o) = read(dir) {
                    return o;
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                ino.wait(deadline - now);
            }
        }
    }
    if let Ok(o) = read(dir) {
        return o;
    }
    let size = |name: &str| dir.open_run_file(name).ok().map(|(_, md)| md.len());
    Output {
        stdout: StreamCount {
            written: size(files::STDOUT),
            ..StreamCount::default()
        },
        stderr: StreamCount {
            written: size(files::STDERR),
            ..StreamCount::default()
        },
        complete: false,
        ..pending.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_unlimited() {
        assert_eq!(parse_size("1048576"), Ok(Some(1 << 20)));
        assert_eq!(parse_size("64K"), Ok(Some(64 << 10)));
        assert_eq!(parse_size("2m"), Ok(Some(2 << 20)));
        assert_eq!(parse_size("1GiB"), Ok(Some(1 << 30)));
        assert_eq!(parse_size("3GB"), Ok(Some(3 << 30)));
        assert_eq!(parse_size("0"), Ok(None));
        assert_eq!(parse_size("none"), Ok(None));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn collect_falls_back_to_log_sizes_and_prefers_the_keepers_counts() {
        let (d, rd) = crate::run_dir::temp();
        std::fs::write(d.path().join("stdout.log"), b"abc").unwrap();
        let p = Output::pending(Some(10), false);
        let o = collect(&rd, &p, Duration::from_millis(50));
        assert!(!o.complete);
        assert_eq!(o.stdout.written, Some(3));
        assert_eq!(o.stderr.written, None);
        assert_eq!(o.limit, Some(10));
        let mut fin = p.clone();
        fin.complete = true;
        fin.stdout.written = Some(3);
        fin.stdout.dropped = Some(0);
        let bytes = serde_json::to_vec(&fin).unwrap();
        rd.write_atomic(FILE, &bytes, false).unwrap();
        assert_eq!(collect(&rd, &p, Duration::ZERO), fin);
    }
}
