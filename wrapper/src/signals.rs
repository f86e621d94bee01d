//! Signals as data: TERM, INT, HUP and CHLD set flags and write a byte to a self-pipe
//! (signal-hook), and the event loop polls the pipe. No handler code of ours runs in signal
//! context.

use agent_run_shared::stop::{Escalation, Sig};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The wrapper's signal state.
pub struct Signals {
    read: UnixStream,
    term: Arc<AtomicBool>,
    int: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
    chld: Arc<AtomicBool>,
}

impl Signals {
    /// Register TERM, INT, HUP, CHLD and USR1 (`renew`'s "re-read the lease"). Call before spawning, so no signal is lost.
    pub fn register() -> io::Result<Signals> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let s = Signals {
            read,
            term: Arc::default(),
            int: Arc::default(),
            hup: Arc::default(),
            chld: Arc::default(),
        };
        for (sig, flag) in [
            (libc::SIGTERM, &s.term),
            (libc::SIGINT, &s.int),
            (libc::SIGHUP, &s.hup),
            (libc::SIGCHLD, &s.chld),
        ] {
            // The flag first, then the wake-up: the loop never wakes to an unset flag.
            signal_hook::flag::register(sig, Arc::clone(flag))?;
            signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
        }
        // USR1 only wakes the loop, which re-reads lease.json at every wake-up.
        signal_hook::low_level::pipe::register(libc::SIGUSR1, write)?;
        Ok(s)
    }

    /// Empty the pipe (the flags say what happened).
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        while matches!((&self.read).read(&mut buf), Ok(n) if n > 0) {}
    }

    /// The first pending stop request (TERM, INT, HUP), cleared as it is taken.
    pub fn take_stop(&self) -> Option<Sig> {
        [
            (&self.term, Sig::Term),
            (&self.int, Sig::Int),
            (&self.hup, Sig::Hup),
        ]
        .into_iter()
        .find(|(flag, _)| flag.swap(false, Ordering::SeqCst))
        .map(|(_, sig)| sig)
    }

    /// Whether SIGCHLD arrived since the last call.
    pub fn take_chld(&self) -> bool {
        self.chld.swap(false, Ordering::SeqCst)
    }

    /// The descriptor to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

/// During a stop, a second TERM/INT/HUP means KILL now.
impl Escalation for &Signals {
    fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    fn kill_now(&mut self) -> bool {
        self.drain();
        self.take_stop().is_some()
    }
}
