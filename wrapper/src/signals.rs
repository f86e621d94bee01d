//! Signals as data: TERM, INT, HUP and CHLD (and TSTP, WINCH where asked for) set flags and write a byte to a self-pipe
//! (signal-hook), and the event loop polls the pipe. No handler code of ours runs in signal
//! context.

use agent_run_shared::stop::{Escalation, Sig};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The wrapper's signal state.
pub struct Signals {
    read: UnixStream,
    /// The write end every handler wakes. Never closed: the handlers outlive any value of
    /// ours, so its number is never reused for another file. One descriptor for all of them
    /// (signal-hook's `pipe::register` takes one of its own per signal: a dup each).
    wake: RawFd,
    term: Arc<AtomicBool>,
    int: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
    chld: Arc<AtomicBool>,
    tstp: Arc<AtomicBool>,
    usr1: Arc<AtomicBool>,
    winch: Arc<AtomicBool>,
}

impl Signals {
    /// Register TERM, INT, HUP, CHLD and USR1 (`renew`'s "re-read the lease", `attach`'s
    /// "someone is here"). Call before spawning, so no signal is lost.
    pub fn register() -> io::Result<Signals> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let s = Signals {
            read,
            wake: write.into_raw_fd(),
            term: Arc::default(),
            int: Arc::default(),
            hup: Arc::default(),
            chld: Arc::default(),
            tstp: Arc::default(),
            usr1: Arc::default(),
            winch: Arc::default(),
        };
        for (sig, flag) in [
            (Sig::Term, &s.term),
            (Sig::Int, &s.int),
            (Sig::Hup, &s.hup),
            (Sig::Chld, &s.chld),
            (Sig::Usr1, &s.usr1),
        ] {
            // The flag first, then the wake-up: the loop never wakes to an unset flag.
            s.catch(sig, flag)?;
        }
        Ok(s)
    }

    /// `sig` sets `flag`, then wakes the loop.
    fn catch(&self, sig: Sig, flag: &Arc<AtomicBool>) -> io::Result<()> {
        signal_hook::flag::register(sig.number(), Arc::clone(flag))?;
        signal_hook::low_level::pipe::register_raw(sig.number(), self.wake)?;
        Ok(())
    }

    /// Catch TSTP too (Ctrl-Z): the supervising wrapper suspends the whole run, then itself,
    /// instead of stopping alone.
    pub fn catch_tstp(&self) -> io::Result<()> {
        self.catch(Sig::Tstp, &self.tstp)
    }

    /// Catch WINCH too (`--pty` with a caller's terminal): the wrapper copies the terminal's
    /// new size to the workload's pty.
    pub fn catch_winch(&self) -> io::Result<()> {
        self.catch(Sig::Winch, &self.winch)
    }

    /// Whether the caller's terminal changed size (SIGWINCH) since the last call.
    pub fn take_winch(&self) -> bool {
        self.winch.swap(false, Ordering::SeqCst)
    }

    /// Whether Ctrl-Z (SIGTSTP) arrived since the last call.
    pub fn take_tstp(&self) -> bool {
        self.tstp.swap(false, Ordering::SeqCst)
    }

    /// Whether USR1 (a renew or an attach) arrived since the last call.
    pub fn take_usr1(&self) -> bool {
        self.usr1.swap(false, Ordering::SeqCst)
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
