//! The ssh processes we start: a registry that pins each with a pidfd until it is reaped, waits
//! with deadlines, and commands whose output is captured into a [`Reply`].
//!
//! Nothing here signals a bare pid: a child is killed through `Child::kill` while we still own
//! it (not reaped, so its pid is its own) or through its pidfd.

use crate::pid::Pid;
use crate::sys::{self, PollFd};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// What a command said: its exit code (None when killed or not started), its output, and
/// whether we gave up waiting for it.
#[derive(Debug, Default)]
pub struct Reply {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
}

impl Reply {
    /// ssh itself failed (255), the command was killed, or it did not answer in time: the
    /// remote command may or may not have run.
    pub fn broken(&self) -> bool {
        self.timed_out || !matches!(self.code, Some(c) if c != 255)
    }

    /// stderr as one trimmed line of text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr)
            .trim()
            .replace('\n', "; ")
    }
}

/// Our running children, each pinned by a pidfd.
#[derive(Default)]
pub struct Children(Mutex<Vec<(u32, OwnedFd)>>);

impl Children {
    /// Spawn and register a child.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<Child> {
        let child = cmd.spawn()?;
        if let Some(fd) = Pid::new(child.id().into()).and_then(|p| sys::pidfd_open(p).ok()) {
            self.0.lock().unwrap().push((child.id(), fd));
        }
        Ok(child)
    }

    /// Forget a child once it has been waited for.
    pub fn reaped(&self, child: &Child) {
        self.0.lock().unwrap().retain(|(pid, _)| *pid != child.id());
    }

    /// TERM to every child not yet reaped.
    pub fn stop_all(&self) {
        for (_, fd) in self.0.lock().unwrap().drain(..) {
            let _ = sys::pidfd_send_signal(fd.as_fd(), crate::signal::Sig::Term);
        }
    }

    /// Run `cmd` with its output captured and `input` on its stdin (then closed), for at most
    /// `timeout` (then it is killed).
    pub fn capture(
        &self,
        mut cmd: Command,
        input: Option<Vec<u8>>,
        timeout: Option<Duration>,
    ) -> Reply {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = match self.spawn(&mut cmd) {
            Ok(c) => c,
            Err(e) => {
                return Reply {
                    stderr: format!("cannot run ssh: {e}").into_bytes(),
                    ..Reply::default()
                }
            }
        };
        feed(child.stdin.take(), input);
        let (tx, rx) = mpsc::channel();
        let readers = [
            read_all(child.stdout.take(), 0, tx.clone()),
            read_all(child.stderr.take(), 1, tx),
        ];
        let status = wait_timeout(&mut child, timeout);
        let mut reply = Reply::default();
        match status {
            Ok(Some(st)) => reply.code = st.code(),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                reply.timed_out = true;
            }
        }
        self.reaped(&child);
        // The master closes its copies of our pipes when the channel closes; a master hung
        // on a dead link may not, so the wait for EOF is bounded too.
        let until = Instant::now() + Duration::from_secs(2);
        for _ in readers.iter().flatten() {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok((0, bytes)) => reply.stdout = bytes,
                Ok((_, bytes)) => reply.stderr = bytes,
                Err(_) => reply.timed_out = true,
            }
        }
        reply
    }
}

/// Write `input` into a child's stdin on a thread, then close it (a line: nothing blocks).
pub fn feed(stdin: Option<std::process::ChildStdin>, input: Option<Vec<u8>>) {
    if let (Some(mut pipe), Some(bytes)) = (stdin, input) {
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = pipe.write_all(&bytes);
        });
    }
}

/// Read a pipe to EOF on a thread, then send (tag, bytes).
fn read_all(
    pipe: Option<impl Read + Send + 'static>,
    tag: u8,
    tx: mpsc::Sender<(u8, Vec<u8>)>,
) -> Option<()> {
    let mut pipe = pipe?;
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send((tag, buf));
    });
    Some(())
}

/// Whether the process behind a pidfd has exited, waiting at most `timeout`.
pub fn exited(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut fds = [PollFd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    matches!(sys::poll(&mut fds, Some(timeout)), Ok(n) if n > 0)
}

/// Wait for a child at most `timeout` (None: forever). Ok(None) when it is still running.
pub fn wait_timeout(
    child: &mut Child,
    timeout: Option<Duration>,
) -> io::Result<Option<ExitStatus>> {
    let Some(timeout) = timeout else {
        return child.wait().map(Some);
    };
    // Not reaped yet, so the pid is still this child's.
    let fd = Pid::new(child.id().into())
        .ok_or(io::Error::from(io::ErrorKind::InvalidData))
        .and_then(sys::pidfd_open)?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        exited(&fd, left);
    }
}
