//! The controller's event loop for one remote run: stream, renew, cancel, resume.
//!
//! Everything that can block runs on a thread of its own and reports to this loop as an
//! [`Event`] (signals too: the self-pipe of [`Signals`] is watched by a thread). The loop itself
//! only changes state and starts work, with the next timer (renewal, cancel retry, the lease
//! deadline while disconnected) as its `recv_timeout`.
//!
//! What we know about the lease is a lower bound: a renewal sent at `t` and acknowledged moves
//! the host's deadline to at least `t + lease`. While we cannot reach the host we keep trying
//! until that bound; past it the run has been (or is being) stopped by its lease, and we say the
//! outcome is unknown rather than guess.

mod requests;
mod resync;

use super::ssh::Ssh;
use super::stream::{self, Counts};
use super::{outcome, say, Remote, DEFAULT_GRACE};
use crate::cli::RemoteArgs;
use crate::signals::Signals;
use agent_run_shared::exit;
use agent_run_shared::ssh::Reply;
use agent_run_shared::stop::Sig;
use agent_run_shared::sys::{self, PollFd};
use anyhow::Context;
use serde_json::Value;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The longest pause between two reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long the stream may take to end once a cancel has confirmed the final record.
const DRAIN: Duration = Duration::from_secs(10);

/// What the loop reacts to.
enum Event {
    Signal(Sig),
    /// The output channel ended (`gen` tells a stale one apart) with ssh's exit code.
    StreamEnded {
        gen: u64,
        code: Option<i32>,
    },
    /// A renewal sent at `sent` over master generation `gen` was answered.
    Renewed {
        sent: Instant,
        gen: u64,
        reply: Reply,
    },
    Cancelled {
        gen: u64,
        reply: Reply,
    },
    Resynced(Resync),
}

/// What a reconnection found out.
enum Resync {
    /// The run's record (`status --json`).
    Record(Value),
    NoSuchRun,
    /// The host stayed unreachable until the lease deadline.
    Expired,
    Failed(u8, String),
}

/// Where the cancel request stands.
enum Cancel {
    No,
    /// Asked for; goes out at the instant given (None: once reconnected).
    Wanted(Option<Instant>),
    InFlight,
    Done(Value),
}

/// Run the session: launch (with `launch`, the remote script) or come back to `id`, and return
/// the exit code.
pub fn run(
    args: &RemoteArgs,
    remote: &Remote,
    id: &str,
    launch: Option<Vec<u8>>,
) -> anyhow::Result<u8> {
    let (tx, rx) = mpsc::channel();
    watch_signals(tx.clone())?;
    let ssh = super::ssh::new(&args.host, &args.ssh_options, args.lease)
        .context("cannot create a private directory for the ssh control socket")?;
    let ssh = Arc::new(ssh);
    match ssh.connect(None) {
        Ok(said) if !said.is_empty() => {
            let _ = std::io::stderr().write_all(format!("{said}\n").as_bytes());
        }
        Ok(_) => {}
        Err(why) => {
            if let Ok(Event::Signal(sig)) = rx.try_recv() {
                say(&format!("{}: run {id} was not started", sig.name()));
                return Ok(exit::for_signal(sig));
            }
            let what = if launch.is_some() {
                "started"
            } else {
                "reached"
            };
            say(&format!(
                "cannot connect to {}: {why}; run {id} was not {what}",
                args.host
            ));
            return Ok(exit::TEMPFAIL);
        }
    }
    // Before anything starts: is there an agent-run on the host, and can it do what we ask?
    if launch.is_some() {
        if let Err((code, why)) = super::probe::check(&ssh, remote, args) {
            say(&why);
            ssh.shutdown();
            return Ok(code);
        }
    }
    let grace = args.grace.unwrap_or(DEFAULT_GRACE);
    let mut session = Session {
        ssh: Arc::clone(&ssh),
        remote,
        host: args.host.clone(),
        id: id.to_string(),
        tx,
        rx,
        counts: Arc::default(),
        gen: 0,
        streaming: false,
        resyncing: false,
        launch: None,
        lease: launch.is_some().then_some(args.lease),
        deadline: None,
        renewing: false,
        next_renew: None,
        cancel: Cancel::No,
        cancel_wait: grace + Duration::from_secs(10),
        signal: None,
        ended: None,
        known: None,
        lost_at: None,
        last_ok: Instant::now(),
        breaks: 0,
        drain_until: None,
        probed: false,
    };
    let code = session.run(launch);
    ssh.shutdown();
    Ok(code)
}

/// Forward INT, TERM and HUP to the loop.
fn watch_signals(tx: Sender<Event>) -> anyhow::Result<()> {
    let signals = Signals::register().context("cannot register signal handlers")?;
    thread::spawn(move || loop {
        let mut fds = [PollFd {
            fd: signals.fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let _ = sys::poll(&mut fds, None);
        signals.drain();
        while let Some(sig) = signals.take_stop() {
            if tx.send(Event::Signal(sig)).is_err() {
                return;
            }
        }
    });
    Ok(())
}

struct Session<'a> {
    ssh: Arc<Ssh>,
    remote: &'a Remote,
    host: String,
    id: String,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    /// Bytes received per stream: where a resumed stream starts.
    counts: Arc<Counts>,
    /// Which output channel is current.
    gen: u64,
    streaming: bool,
    resyncing: bool,
    /// The launch script, until the run is known to exist on the host.
    launch: Option<Vec<u8>>,
    /// The lease length (learnt from `renew` when we came back with --attach).
    lease: Option<Duration>,
    /// A lower bound of the host's lease deadline.
    deadline: Option<Instant>,
    renewing: bool,
    next_renew: Option<Instant>,
    cancel: Cancel,
    /// `cancel --wait`: the run's grace + 10 s.
    cancel_wait: Duration,
    /// The first stop signal we got.
    signal: Option<Sig>,
    /// The stream's exit code, when it ended while a cancel was still to be answered.
    ended: Option<u8>,
    /// The outcome of a final record we have seen (from `status` or `cancel`): past it, a
    /// broken stream only costs output, never the answer.
    known: Option<u8>,
    /// When the stream was lost (None while connected).
    lost_at: Option<Instant>,
    /// When the host last answered (a renewal's sending time, a record read).
    last_ok: Instant,
    /// Consecutive breaks without a successful renewal (the backoff before resyncing).
    breaks: u32,
    drain_until: Option<Instant>,
    /// The launch's stream ended with the remote shell's 126/127 and the host was asked
    /// whether the run exists (once: agent-run missing there, or the run's own code).
    probed: bool,
}

impl Session<'_> {
    fn run(&mut self, launch: Option<Vec<u8>>) -> u8 {
        // A signal during the login: nothing was started yet.
        while let Ok(ev) = self.rx.try_recv() {
            if let Event::Signal(sig) = ev {
                say(&format!("{}: run {} was not started", sig.name(), self.id));
                return exit::for_signal(sig);
            }
        }
        match launch {
            Some(script) => {
                if let Some(code) = self.launch(script) {
                    return code;
                }
            }
            None => self.start_resync(Duration::ZERO),
        }
        loop {
            if let Some(code) = self.timers() {
                return code;
            }
            let ev = match self.next_timer() {
                Some(at) => match self
                    .rx
                    .recv_timeout(at.saturating_duration_since(Instant::now()))
                {
                    Ok(ev) => ev,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return exit::SOFTWARE,
                },
                None => match self.rx.recv() {
                    Ok(ev) => ev,
                    Err(_) => return exit::SOFTWARE,
                },
            };
            let code = match ev {
                Event::Signal(sig) => self.on_signal(sig),
                Event::StreamEnded { gen, code } if gen == self.gen => self.on_stream_end(code),
                Event::StreamEnded { .. } => None,
                Event::Renewed { sent, gen, reply } => self.on_renewed(sent, gen, reply),
                Event::Cancelled { gen, reply } => self.on_cancelled(gen, reply),
                Event::Resynced(r) => self.on_resynced(r),
            };
            if let Some(code) = code {
                return code;
            }
        }
    }

    /// (Re)start the run: the lease counts from now.
    fn launch(&mut self, script: Vec<u8>) -> Option<u8> {
        let now = Instant::now();
        let lease = self.lease.expect("a launch has a lease");
        self.deadline = Some(now + lease);
        self.next_renew = Some(now + lease / 3);
        self.last_ok = now;
        self.open_stream(&script);
        self.launch = Some(script);
        (!self.streaming).then_some(exit::SOFTWARE)
    }

    fn open_stream(&mut self, script: &[u8]) {
        self.gen += 1;
        let (gen, tx) = (self.gen, self.tx.clone());
        let done = move |code| {
            let _ = tx.send(Event::StreamEnded { gen, code });
        };
        // The launch script reads the run's lease token from the channel's stdin.
        let input = self
            .launch_input(script)
            .map(|t| format!("{t}\n").into_bytes());
        match stream::spawn(&self.ssh, script, input, &self.counts, done) {
            Ok(()) => self.streaming = true,
            Err(e) => say(&format!("cannot run ssh: {e}")),
        }
    }

    fn timers(&mut self) -> Option<u8> {
        let now = Instant::now();
        if !self.streaming && self.unsettled() && self.deadline.is_some_and(|d| now >= d) {
            return Some(self.unknown());
        }
        if self.drain_until.is_some_and(|t| now >= t) {
            if let Cancel::Done(v) = &self.cancel {
                return Some(outcome(v).unwrap_or(exit::TEMPFAIL));
            }
        }
        if self.streaming && !self.renewing && self.next_renew.is_some_and(|t| now >= t) {
            self.send_renew();
        }
        if matches!(self.cancel, Cancel::Wanted(Some(t)) if now >= t) && !self.resyncing {
            self.send_cancel();
        }
        None
    }

    fn next_timer(&self) -> Option<Instant> {
        let mut timers = vec![self.drain_until];
        if !self.streaming && self.unsettled() {
            timers.push(self.deadline);
        }
        if self.streaming && !self.renewing {
            timers.push(self.next_renew);
        }
        if let Cancel::Wanted(at) = self.cancel {
            timers.push(at);
        }
        timers.into_iter().flatten().min()
    }

    fn on_signal(&mut self, sig: Sig) -> Option<u8> {
        if !matches!(self.cancel, Cancel::No) {
            say(&format!(
                "{}: giving up before the final record of run {} on {}; its outcome is unknown \
                 here: agent-run remote {} --status {}",
                sig.name(),
                self.id,
                self.host,
                self.host,
                self.id
            ));
            return Some(exit::TEMPFAIL);
        }
        say(&format!(
            "{}: cancelling run {} on {}",
            sig.name(),
            self.id,
            self.host
        ));
        self.signal = Some(sig);
        self.cancel = Cancel::Wanted(Some(Instant::now()));
        None
    }

    fn on_stream_end(&mut self, code: Option<i32>) -> Option<u8> {
        self.streaming = false;
        match code {
            // 255 is ssh's failure, unless the final record says the run itself exited 255.
            // 127/126 before the run is known to exist: the remote shell's own "not found" /
            // "cannot execute" (agent-run missing there), or the run's code (its command was
            // not found). The record tells which.
            Some(c)
                if super::shell_cannot_run(Some(c))
                    && self.launch.is_some()
                    && !self.probed
                    && matches!(self.cancel, Cancel::No) =>
            {
                self.probed = true;
                self.start_resync(Duration::ZERO);
                None
            }
            Some(c) if c != 255 || self.known == Some(255) => {
                let c = c as u8;
                match &self.cancel {
                    Cancel::No => Some(c),
                    Cancel::Done(v) => Some(outcome(v).unwrap_or(c)),
                    // The run is over; the cancel (a no-op now) fetches the final record.
                    Cancel::Wanted(_) => {
                        self.ended = Some(c);
                        self.send_cancel();
                        None
                    }
                    Cancel::InFlight => {
                        self.ended = Some(c);
                        None
                    }
                }
            }
            _ => {
                if let (Some(k), true) = (self.known, self.breaks >= 3) {
                    say(&format!(
                        "run {} on {} is over; the rest of its output could not be fetched",
                        self.id, self.host
                    ));
                    return Some(k);
                }
                self.breaks += 1;
                // With the master alive this may be nothing worse than a run that exited 255
                // (or an `attach` that died): the record will tell, quietly.
                // The master notices a dead link (keepalive) and exits; its channels end 255
                // a moment before it does: give it that moment before deciding.
                let master_gone = self.ssh.master_gone_within(Duration::from_secs(1));
                if master_gone && self.lost_at.is_none() {
                    self.lost_at = Some(Instant::now());
                    let (out, err) = self.counts.get();
                    let left =
                        self.deadline
                            .filter(|_| self.unsettled())
                            .map_or(String::new(), |d| {
                                let s = d.saturating_duration_since(Instant::now()).as_secs();
                                format!(
                                "; it keeps running on the host under its lease for at least {s}s"
                            )
                            });
                    say(&format!(
                        "lost the stream of run {} from {} after {out} + {err} bytes{left}; reconnecting",
                        self.id, self.host
                    ));
                }
                let delay = backoff(self.breaks - 1);
                self.start_resync(delay);
                None
            }
        }
    }

    /// Whether the outcome is still open (no final record seen, no final exit code).
    fn unsettled(&self) -> bool {
        self.ended.is_none() && self.known.is_none()
    }

    /// The host has been unreachable until the lease must have run out.
    fn unknown(&self) -> u8 {
        let since = self.last_ok.elapsed().as_secs();
        say(&format!(
            "run {id} on {host}: outcome unknown: no answer from {host} for {since}s and the \
             run's lease has run out, so the host stops it by its lease; ask later with: \
             agent-run remote {host} --status {id}",
            id = self.id,
            host = self.host
        ));
        exit::TEMPFAIL
    }

    /// The token a script that starts with [`super::READ_TOKEN`] reads, if it does.
    fn launch_input(&self, script: &[u8]) -> Option<&str> {
        script
            .starts_with(super::READ_TOKEN.as_bytes())
            .then(|| self.remote.token.as_ref().map(|t| t.expose()))
            .flatten()
    }

    fn script(&self, words: &[&str]) -> Vec<u8> {
        self.remote
            .exec(words)
            .expect("run ids and numbers hold no NUL byte")
    }

    /// [`Session::script`] of a subcommand whose JSON we read (`--json` when the host has it).
    fn script_json(&self, words: &[&str]) -> Vec<u8> {
        self.remote
            .exec_json(words)
            .expect("run ids and numbers hold no NUL byte")
    }
}

/// The pause before the `n`th consecutive retry: 0, 250 ms, 500 ms, ... up to [`MAX_BACKOFF`].
fn backoff(n: u32) -> Duration {
    match n {
        0 => Duration::ZERO,
        n => (Duration::from_millis(250) * 2u32.pow((n - 1).min(5))).min(MAX_BACKOFF),
    }
}
