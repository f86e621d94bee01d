//! `--pty`: a pseudo-terminal for the workload (pty(7)).
//!
//! The wrapper opens the pair before the spawn; the slave becomes the workload's stdin, stdout,
//! stderr and controlling terminal (TIOCSCTTY in the child before its exec,
//! [`crate::sys::child_set_ctty`]); the master goes to the output keeper, which copies it to
//! stdout.log. The wrapper closes every
//! slave descriptor it holds right after the spawn: only then does the last close of the
//! master, or the exit of the session's last process, reach the other end (the kernel hangs up
//! the slave when the master closes: SIGHUP to the session, and the master reads EIO once no
//! slave descriptor is left).
//!
//! Built on rustix (`openpt`, `grantpt`, `unlockpt`, `ptsname`, `TIOCGPTPEER`): safe calls, no
//! libc static buffer (ptsname(3)), no helper process (old glibc grantpt), and the slave is
//! opened from the master itself (TIOCGPTPEER, Linux 4.13+) instead of by a path that could be
//! raced, with the path only as a fallback. nix's `openpty` would be the same syscalls behind
//! libc with a second dependency.

use rustix::pty::{grantpt, ioctl_tiocgptpeer, openpt, ptsname, unlockpt, OpenptFlags};
use rustix::termios::{self, OptionalActions, Termios, Winsize};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The size a pty gets when nobody says otherwise and the caller has no terminal.
pub const DEFAULT_SIZE: Size = Size { cols: 80, rows: 24 };

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub cols: u16,
    pub rows: u16,
}

impl Size {
    /// `COLSxROWS`, as `--pty-size` takes it (`120x40`); both more than zero.
    pub fn parse(s: &str) -> Option<Size> {
        let (c, r) = s.split_once(['x', 'X'])?;
        let cols: u16 = c.trim().parse().ok()?;
        let rows: u16 = r.trim().parse().ok()?;
        (cols > 0 && rows > 0).then_some(Size { cols, rows })
    }

    fn winsize(self) -> Winsize {
        Winsize {
            ws_row: self.rows,
            ws_col: self.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

/// The size of the terminal on `fd`, if it is one and says a size (a pty never sized says 0x0).
pub fn size_of(fd: BorrowedFd<'_>) -> Option<Size> {
    let ws = termios::tcgetwinsize(fd).ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some(Size {
        cols: ws.ws_col,
        rows: ws.ws_row,
    })
}

/// The size of the caller's terminal: stdin, stdout, stderr, the first that is a sized terminal.
pub fn caller_size() -> Option<Size> {
    [
        io::stdin().as_fd(),
        io::stdout().as_fd(),
        io::stderr().as_fd(),
    ]
    .into_iter()
    .find_map(size_of)
}

/// Set the size of the pty behind `master` (TIOCSWINSZ). The kernel sends SIGWINCH to the
/// slave's foreground process group when the size changes.
pub fn set_size(master: BorrowedFd<'_>, size: Size) -> io::Result<()> {
    termios::tcsetwinsize(master, size.winsize())?;
    Ok(())
}

/// The end-of-file character of the terminal on `fd` (VEOF; Ctrl-D when it cannot be read).
pub fn veof(fd: BorrowedFd<'_>) -> u8 {
    termios::tcgetattr(fd).map_or(4, |t| t.special_codes[termios::SpecialCodeIndex::VEOF])
}

/// Whether the terminal on `fd` (a pty master answers for its slave) is in its cooked state:
/// canonical input and echo, as a shell leaves it and raw mode does not.
pub fn is_cooked(fd: BorrowedFd<'_>) -> bool {
    use termios::LocalModes;
    termios::tcgetattr(fd).is_ok_and(|t| {
        t.local_modes
            .contains(LocalModes::ICANON | LocalModes::ECHO)
    })
}

/// Whether this process's group is the foreground group of the terminal on `fd`: only then may
/// it read that terminal or change its modes without being stopped (SIGTTIN, SIGTTOU).
pub fn in_foreground(fd: BorrowedFd<'_>) -> bool {
    termios::tcgetpgrp(fd).is_ok_and(|p| p == rustix::process::getpgrp())
}

/// An open pty pair.
pub struct Pty {
    /// The master (close-on-exec, no controlling-terminal side effect).
    pub master: OwnedFd,
    /// The slave, opened without becoming anyone's controlling terminal (O_NOCTTY); the child
    /// takes it with TIOCSCTTY after setsid.
    pub slave: OwnedFd,
    /// The slave's path (`/dev/pts/N`).
    pub name: String,
}

impl Pty {
    /// Open a pair sized `size`.
    pub fn open(size: Size) -> io::Result<Pty> {
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        let master = openpt(flags)?;
        grantpt(&master)?;
        unlockpt(&master)?;
        let name = ptsname(&master, Vec::new())?
            .into_string()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let slave = match ioctl_tiocgptpeer(&master, flags) {
            Ok(fd) => fd,
            // Kernels before 4.13: by its path (O_NOCTTY: the wrapper never takes it).
            Err(_) => {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NOCTTY)
                    .open(&name)?
                    .into()
            }
        };
        set_size(master.as_fd(), size)?;
        Ok(Pty {
            master,
            slave,
            name,
        })
    }
}

/// The caller's terminal in raw mode while this lives (for `--pty` in the foreground with a
/// terminal on stdin: keystrokes, Ctrl-C and Ctrl-Z included, go to the workload's pty as
/// bytes, and its line discipline decides what they mean). Output processing is kept, so the
/// wrapper's own messages still start at column 0. Restored on drop, and around a suspension
/// of the wrapper ([`RawMode::restore`], [`RawMode::reenter`]).
pub struct RawMode {
    fd: OwnedFd,
    saved: Termios,
    raw: Termios,
    active: bool,
}

impl RawMode {
    /// Put the terminal on `fd` in raw mode. None when `fd` is not a terminal.
    pub fn enter(fd: BorrowedFd<'_>) -> Option<RawMode> {
        let saved = termios::tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        raw.output_modes = saved.output_modes;
        let mut m = RawMode {
            fd: fd.try_clone_to_owned().ok()?,
            saved,
            raw,
            active: false,
        };
        m.reenter();
        m.active.then_some(m)
    }

    /// Put the terminal back as it was (idempotent).
    pub fn restore(&mut self) {
        if self.active {
            let _ = termios::tcsetattr(&self.fd, OptionalActions::Now, &self.saved);
            self.active = false;
        }
    }

    /// Raw again after [`RawMode::restore`] (idempotent).
    pub fn reenter(&mut self) {
        if !self.active {
            self.active = termios::tcsetattr(&self.fd, OptionalActions::Now, &self.raw).is_ok();
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_cols_x_rows() {
        assert_eq!(
            Size::parse("120x40"),
            Some(Size {
                cols: 120,
                rows: 40
            })
        );
        assert_eq!(Size::parse("80X24"), Some(DEFAULT_SIZE));
        for bad in [
            "", "80", "x24", "0x24", "80x0", "80x24x1", "-1x2", "70000x1",
        ] {
            assert_eq!(Size::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_pty_has_the_size_it_was_opened_with_and_a_pts_name() {
        let p = Pty::open(Size { cols: 97, rows: 31 }).unwrap();
        assert!(p.name.starts_with("/dev/pts/"), "{}", p.name);
        assert_eq!(size_of(p.slave.as_fd()), Some(Size { cols: 97, rows: 31 }));
        set_size(p.master.as_fd(), DEFAULT_SIZE).unwrap();
        assert_eq!(size_of(p.slave.as_fd()), Some(DEFAULT_SIZE));
        // The slave's device is the one the name says.
        let by_name = std::fs::metadata(&p.name).unwrap();
        let by_fd = std::fs::File::from(p.slave.try_clone().unwrap())
            .metadata()
            .unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(by_name.rdev(), by_fd.rdev());
    }
}
