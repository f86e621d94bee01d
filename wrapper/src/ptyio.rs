//! `--pty`, the wrapper's side: the pty's size and the caller's keystrokes.
//!
//! The keeper owns the master's output (it copies it to stdout.log); the wrapper keeps a
//! duplicate of the master only to set the window size (TIOCSWINSZ: at creation from the
//! caller's terminal or `--pty-size`, then on every SIGWINCH) and, in the foreground, to copy its
//! own stdin into the pty. With a terminal on stdin that terminal is put in raw mode for the
//! run (keystrokes, Ctrl-C and Ctrl-Z included, reach the workload as bytes and its pty turns
//! them into signals for its own foreground job), and restored on every way out of the wrapper
//! but SIGKILL. A stdin that is not a terminal is copied until its end, then one end-of-file
//! character (VEOF) is written, so a program reading the pty sees the end as it would from a
//! file. Detached, nothing is written to the pty.

use agent_run_shared::journal::Journal;
use agent_run_shared::pid::Pid;
use agent_run_shared::pty::{self, RawMode, Size};
use agent_run_shared::stop::Sig;
use agent_run_shared::sys;
use serde_json::json;
use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::{AsFd, OwnedFd};

/// A pty run, as the wrapper holds it after the spawn.
pub struct PtyRun {
    /// A duplicate of the master (the keeper holds the one it reads).
    master: OwnedFd,
    /// The slave's path, for the journal.
    name: String,
    /// Follow the caller's terminal (SIGWINCH): the size was not given with --pty-size.
    follow: bool,
    /// The keeper (our child), until its end was seen.
    keeper: Option<Pid>,
    /// The caller's terminal in raw mode, while the wrapper copies it to the pty.
    raw: Option<RawMode>,
    size: Size,
}

impl PtyRun {
    /// After the spawn, with the master and the size the pty was opened with.
    pub fn new(
        master: OwnedFd,
        name: String,
        size: Size,
        follow: bool,
        keeper: Option<Pid>,
    ) -> PtyRun {
        PtyRun {
            master,
            name,
            follow,
            keeper,
            raw: None,
            size,
        }
    }

    /// The caller's terminal changed size: give the pty the same (the kernel sends SIGWINCH to
    /// the workload's foreground group).
    pub fn resize(&mut self, journal: &Journal) {
        if !self.follow {
            return;
        }
        let Some(size) = pty::caller_size() else {
            return;
        };
        if size == self.size {
            return;
        }
        let r = pty::set_size(self.master.as_fd(), size);
        let _ = journal.event(
            "pty_resized",
            json!({"tty": self.name, "cols": size.cols, "rows": size.rows,
                   "error": r.as_ref().err().map(|e| e.to_string())}),
        );
        if r.is_ok() {
            self.size = size;
        }
    }

    /// Foreground: copy our stdin into the pty, on a thread of its own (a workload that does
    /// not read blocks only that thread). A terminal on stdin goes raw for the run.
    pub fn copy_stdin(&mut self) -> std::io::Result<()> {
        let stdin = std::io::stdin();
        let tty = stdin.is_terminal();
        if tty {
            if !pty::in_foreground(stdin.as_fd()) {
                // A background job (`agent-run ... &`): reading the terminal or changing its
                // modes would stop the wrapper (SIGTTIN, SIGTTOU). The pty gets no input.
                return Err(std::io::Error::other(
                    "the wrapper is not in its terminal's foreground process group",
                ));
            }
            self.raw = RawMode::enter(stdin.as_fd());
        }
        let mut from = File::from(stdin.as_fd().try_clone_to_owned()?);
        let mut to = File::from(self.master.try_clone()?);
        std::thread::Builder::new()
            .name("pty-stdin".into())
            .spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if write_all_waiting(&mut to, &buf[..n]).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => return,
                    }
                }
                if !tty {
                    // The end of a file or pipe: what Ctrl-D at the start of a line says.
                    let eof = pty::veof(to.as_fd());
                    let _ = write_all_waiting(&mut to, &[eof]);
                }
            })?;
        Ok(())
    }

    /// Whether the keeper has ended since the last call, and how: `Some(Ok(()))` when it exited
    /// 0 (every slave descriptor closed: the session let go of its terminal), `Some(Err(why))`
    /// when it died or its end cannot be known. Reaps it (it is our child): call before any
    /// `reap_all`, so its status is ours to read.
    pub fn keeper_ended(&mut self) -> Option<Result<(), String>> {
        let pid = self.keeper?;
        let end = match sys::waitpid_nohang(Some(pid)) {
            Ok(None) => return None,
            Ok(Some((_, sys::WaitStatus::Exited(0)))) => Ok(()),
            Ok(Some((_, sys::WaitStatus::Exited(c)))) => Err(format!("exited {c}")),
            Ok(Some((_, sys::WaitStatus::Signaled(n)))) => {
                Err(format!("killed by SIG{}", Sig::from_number(n).name()))
            }
            Err(e) => Err(format!("reaped before its status was read ({e})")),
        };
        self.keeper = None;
        Some(end.map_err(|why| format!("the output keeper (pid {pid}) {why}")))
    }

    /// Before the wrapper stops itself (Ctrl-Z): the caller's shell gets its terminal back as
    /// it left it.
    pub fn suspend(&mut self) {
        if let Some(r) = &mut self.raw {
            r.restore();
        }
    }

    /// After `fg`: raw again (not after `bg`: a background job that changes the terminal's
    /// modes is stopped by SIGTTOU).
    pub fn resume(&mut self) {
        if let Some(r) = &mut self.raw {
            if pty::in_foreground(std::io::stdin().as_fd()) {
                r.reenter();
            }
        }
    }

    /// The caller's terminal as it was (idempotent; also done on drop).
    pub fn restore_terminal(&mut self) {
        self.suspend();
    }
}

/// `write_all` to the master, whose open file description the keeper made non-blocking (it is
/// shared with the keeper's copy): on EAGAIN, wait until the pty takes input again.
fn write_all_waiting(to: &mut File, mut buf: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    while !buf.is_empty() {
        match to.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut fds = [sys::PollFd {
                    fd: to.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                }];
                sys::poll(&mut fds, None)?;
                if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                    return Err(std::io::ErrorKind::BrokenPipe.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
