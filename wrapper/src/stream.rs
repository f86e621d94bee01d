//! Copying a run's logs to a stream: the wrapper's live output, `attach` and `logs -f`.
//!
//! The output keeper writes stdout.log/stderr.log (the workload writes into its pipes); this
//! only reads them from an offset and writes what is new to our stdout/stderr, every byte once.
//! A log that shrank below the offset (the run truncated it by path) is followed again from its
//! start, with a note on stderr. A sink that breaks (EPIPE, EIO: the
//! SSH channel is gone) is dropped and the copy of the other goes on; supervision never depends
//! on it. The wrapper runs it on its own thread, so a stalled reader never blocks the event loop.

use agent_run_shared::run_dir::{files, RunDir};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How soon a follower looks again after it copied bytes.
pub const FOLLOW_FAST: Duration = Duration::from_millis(5);
/// The longest an idle follower waits between looks: output reaches the stream within this.
pub const FOLLOW_SLOW: Duration = Duration::from_millis(80);

/// One log being followed into one sink.
pub struct Tail {
    dir: RunDir,
    name: &'static str,
    src: Option<File>,
    sink: Option<File>,
    buf: Vec<u8>,
    /// Bytes read from the log so far (the offset in it).
    pub copied: u64,
}

impl Tail {
    /// Follow `dir/name` (which may not exist yet) into `sink`.
    pub fn new(dir: &RunDir, name: &'static str, sink: Option<File>) -> Tail {
        Tail {
            dir: dir.clone(),
            name,
            src: None,
            sink,
            buf: vec![0u8; 128 * 1024],
            copied: 0,
        }
    }

    /// Start from `offset` instead of the beginning.
    pub fn starting_at(mut self, offset: u64) -> Tail {
        self.copied = offset;
        self
    }

    /// Copy everything new. Returns whether any byte moved.
    pub fn pump(&mut self) -> bool {
        if self.src.is_none() {
            // Never follow a symlink planted in the run dir, never block on a planted FIFO.
            self.src = self.dir.open_run_file(self.name).ok().map(|(f, _)| f);
            if let Some(f) = &mut self.src {
                if f.seek(SeekFrom::Start(self.copied)).is_err() {
                    self.src = None;
                }
            }
        }
        let (Some(src), Some(_)) = (&mut self.src, &self.sink) else {
            return false;
        };
        let mut moved = false;
        loop {
            let n = match src.read(&mut self.buf) {
                Ok(0) => {
                    // The keeper only appends; a log shorter than what we copied was truncated
                    // by path (the run can do that). Start again from its beginning, and say so,
                    // rather than wait forever past its end.
                    let len = src.metadata().map_or(self.copied, |m| m.len());
                    if len < self.copied {
                        crate::human::say(&format!(
                            "{} shrank from {} to {len} bytes (truncated by the run); following it from its start",
                            self.name, self.copied
                        ));
                        self.copied = 0;
                        if src.seek(SeekFrom::Start(0)).is_err() {
                            self.src = None;
                            return moved;
                        }
                        continue;
                    }
                    return moved;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return moved,
            };
            moved = true;
            self.copied += n as u64;
            if let Some(sink) = &mut self.sink {
                if sink.write_all(&self.buf[..n]).is_err() {
                    // The reader is gone (EPIPE, EIO): stop streaming, never stop the run.
                    self.sink = None;
                    return moved;
                }
            }
        }
    }

    /// Whether the sink still accepts bytes.
    pub fn open(&self) -> bool {
        self.sink.is_some()
    }
}

/// A duplicate of this process's stdout (or stderr) as an unbuffered file.
pub fn std_sink(stderr: bool) -> Option<File> {
    let fd = if stderr {
        io::stderr().as_fd().try_clone_to_owned()
    } else {
        io::stdout().as_fd().try_clone_to_owned()
    };
    fd.ok().map(File::from)
}

/// The wrapper's streaming thread.
pub struct Streamer {
    done: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl Streamer {
    /// Start copying the run dir's logs to our stdout and stderr.
    pub fn start(dir: &RunDir) -> Streamer {
        let done = Arc::new(AtomicBool::new(false));
        let mut out = Tail::new(dir, files::STDOUT, std_sink(false));
        let mut err = Tail::new(dir, files::STDERR, std_sink(true));
        let flag = Arc::clone(&done);
        let handle = thread::spawn(move || {
            // Look again soon after output, then back off while the workload is quiet: a busy
            // run streams promptly, an idle one costs a dozen wake-ups a second.
            let mut interval = FOLLOW_FAST;
            loop {
                // Read `done` before pumping: once it is set every writer is gone, so one more
                // pass that moves nothing means everything was copied.
                let finishing = flag.load(Ordering::SeqCst);
                let moved = out.pump() | err.pump();
                if finishing && !moved {
                    break;
                }
                if !out.open() && !err.open() {
                    break;
                }
                if moved {
                    interval = FOLLOW_FAST;
                } else {
                    thread::park_timeout(interval);
                    interval = (interval * 2).min(FOLLOW_SLOW);
                }
            }
        });
        Streamer { done, handle }
    }

    /// Copy what is left and stop. Call once the workload can write no more.
    pub fn finish(self) {
        self.done.store(true, Ordering::SeqCst);
        self.handle.thread().unpark();
        let _ = self.handle.join();
    }
}

/// The last `n` lines of `dir/name` (a final line without a newline counts), read backwards
/// from the end in blocks: a 10 GB log costs a few reads. Empty when the log is missing.
pub fn last_lines(dir: &RunDir, name: &str, n: usize) -> Vec<u8> {
    let Ok((mut f, md)) = dir.open_run_file(name) else {
        return Vec::new();
    };
    let len = md.len();
    if n == 0 || len == 0 {
        return Vec::new();
    }
    const BLOCK: u64 = 64 * 1024;
    // Never more than this much of one log, however long its lines.
    const MOST: u64 = 16 << 20;
    let mut tail: Vec<u8> = Vec::new();
    let mut pos = len;
    loop {
        let start = pos.saturating_sub(BLOCK);
        let mut block = vec![0u8; (pos - start) as usize];
        if f.seek(SeekFrom::Start(start)).is_err() || f.read_exact(&mut block).is_err() {
            break;
        }
        block.extend_from_slice(&tail);
        tail = block;
        pos = start;
        // Newlines that end a line before the last one: n of them start the n lines.
        let body = tail.strip_suffix(b"\n").unwrap_or(&tail);
        let seen = body.iter().filter(|&&b| b == b'\n').count();
        if seen >= n || pos == 0 || len - pos >= MOST {
            break;
        }
    }
    let body_len = tail.strip_suffix(b"\n").map_or(tail.len(), <[u8]>::len);
    let mut count = 0;
    let mut from = 0;
    for i in (0..body_len).rev() {
        if tail[i] == b'\n' {
            count += 1;
            if count == n {
                from = i + 1;
                break;
            }
        }
    }
    tail.split_off(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_counts_from_the_end_with_or_without_a_final_newline() {
        use std::os::unix::fs::PermissionsExt;
        use std::path::{Path, PathBuf};
        let dir = std::env::temp_dir().join(format!("agent-run-last-lines.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        struct D(PathBuf);
        impl D {
            fn path(&self) -> &Path {
                &self.0
            }
        }
        impl Drop for D {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let d = D(dir);
        let id = agent_run_shared::id::RunId::parse("last-lines").unwrap();
        let rd = RunDir::open(d.path(), id).unwrap();
        std::fs::write(d.path().join("a"), b"1\n2\n3\n").unwrap();
        assert_eq!(last_lines(&rd, "a", 2), b"2\n3\n");
        assert_eq!(last_lines(&rd, "a", 9), b"1\n2\n3\n");
        std::fs::write(d.path().join("b"), b"1\n2\n3").unwrap();
        assert_eq!(last_lines(&rd, "b", 1), b"3");
        assert_eq!(last_lines(&rd, "b", 0), b"");
        let big: Vec<u8> = (0..100_000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        std::fs::write(d.path().join("c"), &big).unwrap();
        assert_eq!(last_lines(&rd, "c", 2), b"line 99998\nline 99999\n");
        assert!(last_lines(&rd, "missing", 3).is_empty());
    }
}
