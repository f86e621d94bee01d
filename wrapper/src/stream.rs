//! Copying a run's logs to a stream: the wrapper's live output, `attach` and `logs -f`.
//!
//! The output keeper writes stdout.log/stderr.log (the workload writes into its pipes); this
//! only reads them from an offset and writes what is new to our stdout/stderr, every byte once.
//! A log that shrank below the offset (the run truncated it by path) is followed again from its
//! start, with a note on stderr. A sink that breaks (EPIPE, EIO: the
//! SSH channel is gone) is dropped and the copy of the other goes on; supervision never depends
//! on it. The wrapper runs it on its own thread, so a stalled reader never blocks the event loop.

use agent_run_shared::run_dir::{files, RunDir};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Without a wake-up (inotify for `attach`/`logs -f`, the keeper's pipe for the wrapper): how
/// soon a follower looks again after it copied bytes.
pub const FOLLOW_FAST: Duration = Duration::from_millis(5);
/// Without a wake-up: the longest an idle follower waits between looks.
pub const FOLLOW_SLOW: Duration = Duration::from_millis(80);
/// The streaming thread's name (its comm).
pub const THREAD_NAME: &str = "agent-run-strm";
/// The most one pump moves before the other log gets its turn.
const TURN: u64 = 8 << 20;
/// Bytes asked of one sendfile(2) (a pipe takes what fits in it, a file all of it).
const SEND: usize = 4 << 20;
/// The read/write copy's buffer, allocated only when sendfile cannot serve the sink.
const BUF: usize = 128 << 10;

/// One log being followed into one sink.
///
/// The copy is sendfile(2) from the log at our offset: a pipe sink gets references to the log's
/// page-cache pages (no copy through our memory), a file sink an in-kernel copy. A sink the
/// kernel cannot splice into (EINVAL), or any error of sendfile, hands over to pread/write for
/// good, which also tells a broken sink (dropped) from a failed read (tried again later).
pub struct Tail {
    dir: RunDir,
    name: &'static str,
    src: Option<File>,
    sink: Option<File>,
    /// Empty until the read/write copy needs it.
    buf: Vec<u8>,
    /// sendfile(2) still serves this sink.
    zero_copy: bool,
    /// Bytes read from the log so far (the offset in it).
    pub copied: u64,
    /// The most this follower copies in all, restarts after a truncation included (`None`:
    /// no bound): what the keeper can write into the log at most. The log is the run's to
    /// extend for free (`truncate -s 50G`, a sparse file), and the wrapper streamed all of it,
    /// past the cap, long after the final record.
    bound: Option<u64>,
    /// Bytes copied in all.
    total: u64,
    /// Copy no further than this offset for now ([`Tail::pump_to`]).
    stop: Option<u64>,
}

/// What one copy did.
enum Copy {
    Moved(usize),
    /// Interrupted, or the sink was full and has room now: go again.
    Again,
    /// Nothing past our offset.
    End,
    /// The log could not be read.
    SrcFailed,
    /// The sink is gone (EPIPE, EIO).
    SinkGone,
}

impl Tail {
    /// Follow `dir/name` (which may not exist yet) into `sink`.
    pub fn new(dir: &RunDir, name: &'static str, sink: Option<File>) -> Tail {
        Tail {
            dir: dir.clone(),
            name,
            src: None,
            sink,
            buf: Vec::new(),
            zero_copy: true,
            copied: 0,
            bound: None,
            total: 0,
            stop: None,
        }
    }

    /// Copy at most `bound` bytes in all (see [`Tail::bound`]); `None`: no bound.
    pub fn bounded(mut self, bound: Option<u64>) -> Tail {
        self.bound = bound;
        self
    }

    /// What the bound leaves to copy (`u64::MAX` without one), and at most up to the stop.
    fn left(&self) -> u64 {
        let bound = self
            .bound
            .map_or(u64::MAX, |b| b.saturating_sub(self.total));
        bound.min(
            self.stop
                .map_or(u64::MAX, |s| s.saturating_sub(self.copied)),
        )
    }

    /// Copy up to offset `end` of the log (not past it). Whether the copy got there, or the sink
    /// is gone (nothing more to do): false when the log ends before `end`.
    pub fn pump_to(&mut self, end: u64) -> bool {
        self.stop = Some(end);
        while self.copied < end && self.open() {
            if !self.pump() {
                break;
            }
        }
        self.stop = None;
        self.copied >= end || !self.open()
    }

    /// Start from `offset` instead of the beginning.
    pub fn starting_at(mut self, offset: u64) -> Tail {
        self.copied = offset;
        self
    }

    /// The log, opened on first use. Never through a symlink planted in the run dir, never
    /// blocking on a planted FIFO.
    fn source(&mut self) -> Option<&File> {
        if self.src.is_none() {
            self.src = self.dir.open_run_file(self.name).ok().map(|(f, _)| f);
        }
        self.src.as_ref()
    }

    /// Copy everything new (up to one turn). Returns whether any byte moved.
    pub fn pump(&mut self) -> bool {
        if self.sink.is_none() || self.source().is_none() {
            return false;
        }
        let mut moved = 0u64;
        while moved < TURN {
            if self.stop.is_some_and(|s| self.copied >= s) {
                return moved > 0;
            }
            if self.left() == 0 {
                // Past what the keeper can have written: the rest is not the run's output.
                if self.bound.is_some() && self.sink.is_some() {
                    crate::human::say(&format!(
                        "{} holds more than the keeper can have written ({} bytes); the rest is not streamed",
                        self.name, self.total
                    ));
                }
                self.sink = None;
                return moved > 0;
            }
            match self.copy_some() {
                Copy::Moved(n) => {
                    moved += n as u64;
                    self.copied += n as u64;
                    self.total += n as u64;
                }
                Copy::Again => {}
                Copy::End => {
                    // The keeper only appends; a log shorter than what we copied was truncated
                    // by path (the run can do that). Start again from its beginning, and say so,
                    // rather than wait forever past its end. (Pages already handed to a pipe
                    // sink show what the log holds when the reader reads them: only a run that
                    // truncates its own log can make that differ from what it held here.)
                    let len = self
                        .src
                        .as_ref()
                        .and_then(|f| f.metadata().ok())
                        .map_or(self.copied, |m| m.len());
                    if len < self.copied {
                        crate::human::say(&format!(
                            "{} shrank from {} to {len} bytes (truncated by the run); following it from its start",
                            self.name, self.copied
                        ));
                        self.copied = 0;
                        continue;
                    }
                    return moved > 0;
                }
                Copy::SrcFailed => return moved > 0,
                Copy::SinkGone => {
                    // The reader is gone (EPIPE, EIO): stop streaming, never stop the run.
                    self.sink = None;
                    return moved > 0;
                }
            }
        }
        true
    }

    /// One sendfile, or one pread and its write, from our offset.
    fn copy_some(&mut self) -> Copy {
        let left = self.left();
        let (Some(src), Some(sink)) = (&self.src, &self.sink) else {
            return Copy::End;
        };
        if self.zero_copy {
            let mut at = self.copied;
            let want = (SEND as u64).min(left) as usize;
            match rustix::fs::sendfile(sink, src, Some(&mut at), want) {
                Ok(0) => return Copy::End,
                Ok(n) => return Copy::Moved(n),
                Err(Errno::INTR) => return Copy::Again,
                Err(Errno::AGAIN) => {
                    wait_writable(sink);
                    return Copy::Again;
                }
                // EINVAL, ENOSYS (a tty, a socket or a filesystem sendfile cannot serve), EPIPE,
                // EIO: the plain copy takes over and says which side failed.
                Err(_) => self.zero_copy = false,
            }
        }
        if self.buf.is_empty() {
            self.buf = vec![0u8; BUF];
        }
        let want = (BUF as u64).min(left) as usize;
        let n = loop {
            match rustix::io::pread(src, &mut self.buf[..want], self.copied) {
                Ok(0) => return Copy::End,
                Ok(n) => break n,
                Err(Errno::INTR) => {}
                Err(_) => return Copy::SrcFailed,
            }
        };
        let mut done = 0;
        while done < n {
            match rustix::io::write(sink, &self.buf[done..n]) {
                Ok(0) => return Copy::SinkGone,
                Ok(k) => done += k,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => wait_writable(sink),
                Err(_) => return Copy::SinkGone,
            }
        }
        Copy::Moved(n)
    }

    /// Whether the sink still accepts bytes.
    pub fn open(&self) -> bool {
        self.sink.is_some()
    }
}

/// Block until a non-blocking sink (a descriptor the caller shares with us and set O_NONBLOCK)
/// has room, or fails: the next write says which.
fn wait_writable(sink: &File) {
    let mut fds = [PollFd::new(sink, PollFlags::OUT)];
    while let Err(Errno::INTR) = poll(&mut fds, None) {}
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
///
/// It sleeps in poll(2) on two pipes: the keeper's wake-up pipe (one byte after each round of
/// appends to the logs, EOF when the keeper exits; see [`crate::keeper`]) and one whose write
/// end [`Streamer::finish`] closes. An idle run costs it no wake-up at all; a busy one wakes it
/// once per round of the keeper's. Not inotify: closing an inotify instance waits in the kernel
/// for an SRCU grace period (2 to 20 ms here), which every run's exit would pay. Without the
/// keeper's pipe (none could be made) it looks on a timer.
pub struct Streamer {
    done: Arc<AtomicBool>,
    /// Closed by `finish`: the thread's poll wakes.
    wake: Option<OwnedFd>,
    handle: JoinHandle<()>,
}

impl Streamer {
    /// Open the run dir's logs for copying to our stdout and stderr. Call before the workload
    /// exists: the logs are opened here, so they are the keeper's, not files the run put in
    /// their place. The copying starts with [`OpenedLogs::start`] (a thread: after the
    /// keeper's fork, which needs a single-threaded process).
    ///
    /// `bound`: the most the keeper can write into one log (its cap with the markers and the
    /// kept tail; `None` without a cap): no more of either log is streamed.
    pub fn open(dir: &RunDir, bound: Option<u64>) -> OpenedLogs {
        let mut out = Tail::new(dir, files::STDOUT, std_sink(false)).bounded(bound);
        let mut err = Tail::new(dir, files::STDERR, std_sink(true)).bounded(bound);
        out.source();
        err.source();
        OpenedLogs { out, err }
    }

    /// Copy what is left and stop. Call once the workload can write no more.
    pub fn finish(mut self) {
        self.done.store(true, Ordering::SeqCst);
        drop(self.wake.take());
        let _ = self.handle.join();
    }
}

/// The logs a streamer copies, opened ([`Streamer::open`]), its thread not yet started.
pub struct OpenedLogs {
    out: Tail,
    err: Tail,
}

impl OpenedLogs {
    /// Start copying, in a thread. `notify` is the read end of the keeper's wake-up pipe
    /// (non-blocking).
    pub fn start(self, notify: Option<OwnedFd>) -> Streamer {
        let OpenedLogs { mut out, mut err } = self;
        let done = Arc::new(AtomicBool::new(false));
        let (wake_r, wake) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
            Ok((r, w)) => (Some(r), Some(w)),
            Err(_) => (None, None),
        };
        let flag = Arc::clone(&done);
        // Named, so its wake-ups can be told from the other threads' (/proc/PID/task/*/comm).
        let thread = thread::Builder::new().name(THREAD_NAME.into());
        let handle = thread
            .spawn(move || {
                let mut notify = notify;
                // Without the keeper's pipe, or without our own, nothing wakes us for sure.
                let timed = notify.is_none() || wake_r.is_none();
                let mut interval = FOLLOW_FAST;
                loop {
                    // Read `done` before pumping: once it is set every writer is gone, so one more
                    // pass that moves nothing means everything was copied. The keeper's bytes are
                    // read before the pump too: an append after the pump's last look wakes the
                    // next poll.
                    let finishing = flag.load(Ordering::SeqCst);
                    if notify.as_ref().is_some_and(keeper_gone) {
                        // No more wake-ups from it: the keeper has exited.
                        notify = None;
                    }
                    let moved = out.pump() | err.pump();
                    if finishing && !moved {
                        break;
                    }
                    if !out.open() && !err.open() {
                        break;
                    }
                    if moved {
                        interval = FOLLOW_FAST;
                        continue;
                    }
                    let timeout = timed.then_some(interval);
                    if wait(notify.as_ref(), wake_r.as_ref(), timeout) {
                        // The write end is closed: by `finish`, which set `done` first, or by a
                        // Streamer dropped without it. Either way no more waiting.
                        flag.store(true, Ordering::SeqCst);
                    }
                    interval = (interval * 2).min(FOLLOW_SLOW);
                }
            })
            .expect("cannot start the streaming thread");
        Streamer { done, wake, handle }
    }
}

/// Read every wake-up byte the keeper's pipe holds (non-blocking). True at its EOF (the
/// keeper has exited) or on an error: no more wake-ups come from it.
fn keeper_gone(notify: &OwnedFd) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match rustix::io::read(notify, &mut buf) {
            Ok(0) => return true,
            Ok(_) | Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return false,
            Err(_) => return true,
        }
    }
}

/// Sleep in poll until the keeper's pipe has a byte (or its EOF: the loop's [`keeper_gone`]
/// reads them), `wake` is closed or `timeout` passes. Returns whether `wake` was closed.
fn wait(notify: Option<&OwnedFd>, wake: Option<&OwnedFd>, timeout: Option<Duration>) -> bool {
    let mut fds = Vec::with_capacity(2);
    if let Some(w) = wake {
        fds.push(PollFd::new(w, PollFlags::IN));
    }
    if let Some(n) = notify {
        fds.push(PollFd::new(n, PollFlags::IN));
    }
    let ts = timeout.and_then(|t| rustix::event::Timespec::try_from(t).ok());
    match poll(&mut fds, ts.as_ref()) {
        Ok(_) => wake.is_some() && !fds[0].revents().is_empty(),
        Err(Errno::INTR) => false,
        // Cannot wait (ENOMEM): look again a little later rather than spin.
        Err(_) => {
            thread::sleep(FOLLOW_SLOW);
            false
        }
    }
}

/// The last `n` lines of `dir/name` (a final line without a newline counts), read backwards
/// from the end in blocks: a 10 GB log costs a few reads. Empty when the log is missing.
pub fn last_lines(dir: &RunDir, name: &str, n: usize) -> Vec<u8> {
    last_lines_at(dir, name, n).1
}

/// [`last_lines`] and the offset in the log where they start (its size for none).
pub fn last_lines_at(dir: &RunDir, name: &str, n: usize) -> (u64, Vec<u8>) {
    let Ok((mut f, md)) = dir.open_run_file(name) else {
        return (0, Vec::new());
    };
    let len = md.len();
    if n == 0 || len == 0 {
        return (len, Vec::new());
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
    let lines = tail.split_off(from);
    (len - lines.len() as u64, lines)
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
