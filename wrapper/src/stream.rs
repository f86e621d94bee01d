//! Copying a run's logs to a stream: the wrapper's live output, `attach` and `logs -f`.
//!
//! The workload writes stdout.log/stderr.log itself; this only reads them from an offset and
//! writes what is new to our stdout/stderr, every byte once. A sink that breaks (EPIPE, EIO: the
//! SSH channel is gone) is dropped and the copy of the other goes on; supervision never depends
//! on it. The wrapper runs it on its own thread, so a stalled reader never blocks the event loop.

use agent_run_shared::root::{files, RunDir};
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
                Ok(0) => return moved,
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
