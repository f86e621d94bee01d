//! The wrapper's event loop: one `poll(2)` on the signal pipe, the leader's pidfd and the
//! caller's channel (our own stdout and stderr), with the nearest deadline (lease, `--timeout`,
//! the disconnect grace) as its timeout. It returns when the leader has exited (with its wait
//! status) or when something asked the run to stop (with the reason); the caller does the
//! stopping. Ctrl-Z (SIGTSTP) is handled here: the whole run is suspended, then the wrapper
//! itself, and `fg` resumes both.
//!
//! The caller is lost when every one of our stdout and stderr that was a pipe, a socket or a
//! terminal at launch reports a hang-up (POLLHUP/POLLERR: the reading end is gone). That is how
//! an SSH session without a pty ends: sshd closes the session's pipes, nothing is signalled.
//! It is seen even while the workload is silent, journalled, recorded (`caller_lost_at`) and
//! handled by the run's `--on-disconnect` policy.

use crate::human;
use crate::ptyio::PtyRun;
use crate::signals::Signals;
use agent_run_shared::heartbeat::{DueKind, Published};
use agent_run_shared::journal::Journal;
use agent_run_shared::lease::{Lease, LeaseToken};
use agent_run_shared::pid::Identity;
use agent_run_shared::procset::RunScope;
use agent_run_shared::reap;
use agent_run_shared::reason::Reason;
use agent_run_shared::record::Status;
use agent_run_shared::run_dir::{files, RunDir};
use agent_run_shared::spec::OnDisconnect;
use agent_run_shared::stop::Sig;
use agent_run_shared::suspend::set_suspended;
use agent_run_shared::sys::{self, PollFd, WaitStatus};
use serde_json::json;
use std::fs::File;
use std::io::IsTerminal;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

/// Why supervision ended.
pub enum Outcome {
    /// The leader exited on its own.
    LeaderExited(WaitStatus),
    /// A stop was asked for: a signal, a cancel request, the lease, the timeout, the caller,
    /// the keeper's loss.
    Stop(Reason),
}

/// The limits the wrapper enforces itself.
pub struct Limits {
    /// The lease the wrapper wrote at launch, and the run's token, if it has a lease.
    pub lease: Option<(Lease, LeaseToken)>,
    /// When the `--timeout` expires, and its length.
    pub timeout: Option<(Instant, Duration)>,
    /// The `--on-disconnect` policy of a foreground run; `None` for a detached run.
    pub on_disconnect: Option<OnDisconnect>,
}

/// Supervise until the leader exits or a stop is requested. `st` is the run's record (the
/// wrapper holds the lock: it may write it), `scope` its process set (for Ctrl-Z).
#[allow(clippy::too_many_arguments)]
pub fn supervise(
    dir: &RunDir,
    journal: &Journal,
    signals: &Signals,
    leader_fd: Option<&OwnedFd>,
    leader: Identity,
    limits: &Limits,
    st: &mut Status,
    scope: &RunScope,
    mut pty: Option<&mut PtyRun>,
    published: &Published,
) -> Outcome {
    // The lease the wrapper wrote at launch, so a lease.json damaged or forged before the
    // first read still cannot turn the leased run into one that runs forever.
    let mut lease = limits.lease.clone().map(|(l, t)| LeaseView::new(l, t));
    let mut caller = limits.on_disconnect.map(Caller::watch);
    let timeout_epoch = limits.timeout.map(|(at, _)| {
        agent_run_shared::time::epoch_now()
            + at.saturating_duration_since(Instant::now()).as_secs_f64()
    });
    // The lease is re-read at every wake-up; `renew` sends SIGUSR1 so a shortened lease is seen
    // at once. (Not inotify: closing an inotify instance costs ~10 ms of SRCU grace period on
    // this kernel, a launch's whole budget.)
    loop {
        let now = Instant::now();
        let lease_left = lease.as_mut().map(|l| l.remaining(dir, journal));
        // Published where the workload cannot write: the watchdog's word on when we are stuck.
        published.set(earliest_due(
            lease.as_ref().map(|l| l.taken.deadline_epoch),
            timeout_epoch,
        ));
        if let Some(out) = deadline_passed(now, lease_left, limits, caller.as_ref(), journal) {
            return out;
        }
        let timeout = next_deadline(now, lease_left, limits, caller.as_ref());
        let mut fds = poll_fds(signals, leader_fd, caller.as_ref());
        let _ = sys::poll(&mut fds, timeout);
        signals.drain();
        if let Some(sig) = signals.take_stop() {
            let reason = stop_reason(dir, sig);
            let _ = journal.event(
                "stop_requested",
                json!({"signal": sig.name(), "reason": reason}),
            );
            return Outcome::Stop(reason);
        }
        if signals.take_winch() {
            if let Some(p) = pty.as_deref_mut() {
                p.resize(journal);
            }
        }
        if signals.take_tstp() {
            suspend_with_pty(dir, journal, scope, pty.as_deref_mut());
            continue;
        }
        let usr1 = signals.take_usr1();
        if let Some(c) = &mut caller {
            if usr1 {
                c.reclaimed(journal);
            }
            // The caller's descriptors come after the signal pipe and the leader's pidfd.
            let first_caller_fd = 1 + usize::from(leader_fd.is_some());
            if let Some(out) = c.look(&fds[first_caller_fd..], dir, journal, st) {
                return out;
            }
        }
        let chld = signals.take_chld();
        // --pty: the keeper is the master's only reader. Its status is read before any
        // reap_all can take it; a leader that exited at the same time wins below.
        let keeper_end = match pty.as_deref_mut() {
            Some(p) if chld => p.keeper_ended(),
            _ => None,
        };
        if chld || leader_fd.is_some_and(|_| fds[1].revents != 0) {
            let (leader_status, _) = reap::reap_all(Some(leader.pid));
            if let Some(ws) = leader_status {
                let _ = journal.event("leader_exit", leader_exit_json(ws));
                return Outcome::LeaderExited(ws);
            }
        }
        if let Some(out) = keeper_end.and_then(|end| keeper_ended(end, journal)) {
            return out;
        }
    }
}

/// The lease, the `--timeout` or the disconnect grace that has run out, journalled: the stop
/// it asks for.
fn deadline_passed(
    now: Instant,
    lease_left: Option<f64>,
    limits: &Limits,
    caller: Option<&Caller>,
    journal: &Journal,
) -> Option<Outcome> {
    if lease_left.is_some_and(|l| l <= 0.0) {
        let _ = journal.event("lease_expired", json!({}));
        return Some(Outcome::Stop(Reason::LeaseExpired));
    }
    if let Some((at, len)) = limits.timeout {
        if now >= at {
            let _ = journal.event("timeout", json!({"timeout_ms": len.as_millis() as u64}));
            return Some(Outcome::Stop(Reason::Timeout));
        }
    }
    if caller.is_some_and(|c| c.grace_over(now)) {
        let _ = journal.event("caller_lost_grace_over", json!({}));
        return Some(Outcome::Stop(Reason::CallerLost));
    }
    None
}

/// How long the loop may sleep: until the nearest of the lease, the `--timeout` and the
/// disconnect grace (None: no deadline).
fn next_deadline(
    now: Instant,
    lease_left: Option<f64>,
    limits: &Limits,
    caller: Option<&Caller>,
) -> Option<Duration> {
    [
        lease_left.map(|l| Duration::from_secs_f64(l.min(86_400.0))),
        limits
            .timeout
            .map(|(at, _)| at.saturating_duration_since(now)),
        caller
            .and_then(|c| c.grace_until)
            .map(|g| g.saturating_duration_since(now)),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// What the loop polls: the signal pipe, the leader's pidfd (when there is one), then the
/// caller's descriptors.
fn poll_fds(
    signals: &Signals,
    leader_fd: Option<&OwnedFd>,
    caller: Option<&Caller>,
) -> Vec<PollFd> {
    let mut fds = vec![PollFd {
        fd: signals.fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    if let Some(fd) = leader_fd {
        fds.push(PollFd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    if let Some(c) = caller {
        // No events asked for: poll reports a hang-up (POLLHUP, POLLERR) regardless.
        fds.extend(c.watched.iter().map(|(_, f)| PollFd {
            fd: f.as_raw_fd(),
            events: 0,
            revents: 0,
        }));
    }
    fds
}

/// Ctrl-Z with the pty's terminal handed back to the caller while the run is suspended.
fn suspend_with_pty(
    dir: &RunDir,
    journal: &Journal,
    scope: &RunScope,
    mut pty: Option<&mut PtyRun>,
) {
    if let Some(p) = pty.as_deref_mut() {
        p.suspend();
    }
    suspend_until_continued(dir, journal, scope);
    if let Some(p) = pty {
        p.resume();
        // The terminal may have changed size while we were stopped.
        p.resize(journal);
    }
}

/// A `--pty` run's keeper that exited while the run goes on: after EOF, nothing; else the
/// stop it asks for.
fn keeper_ended(end: Result<(), String>, journal: &Journal) -> Option<Outcome> {
    match end {
        Ok(()) => {
            // EOF: every descriptor of the pty's slave is closed, the session let go of its
            // terminal. Nothing of the output is lost; the run goes on.
            let _ = journal.event("keeper_exited", json!({"while": "running"}));
            None
        }
        Err(why) => {
            // Nobody reads the pty any more: its output would be lost and a writer would
            // block for ever. The master stays open (our copy), so no hangup comes by
            // itself: the run is stopped, as a cancel would.
            let _ = journal.event("keeper_lost", json!({"error": why}));
            human::say(&why);
            Some(Outcome::Stop(Reason::KeeperLost))
        }
    }
}

/// Ctrl-Z: stop every process of the run, then ourselves; once continued (`fg`, `bg`, a
/// SIGCONT), continue them all.
fn suspend_until_continued(dir: &RunDir, journal: &Journal, scope: &RunScope) {
    let stopped = set_suspended(scope, true, Some(journal));
    let _ = journal.event(
        "suspended",
        json!({"pids": stopped.iter().map(|p| p.get()).collect::<Vec<_>>()}),
    );
    let n = stopped.len();
    human::say(&format!(
        "run {} suspended ({n} process{} stopped); fg resumes it",
        dir.id(),
        if n == 1 { "" } else { "es" }
    ));
    sys::stop_self();
    let resumed = set_suspended(scope, false, Some(journal));
    let _ = journal.event(
        "resumed",
        json!({"pids": resumed.iter().map(|p| p.get()).collect::<Vec<_>>()}),
    );
    human::say(&format!("run {} resumed", dir.id()));
}

/// Our stdout and stderr, watched for the caller's hang-up.
struct Caller {
    policy: OnDisconnect,
    /// ("stdout" | "stderr", a duplicate of the descriptor) for those that are a pipe, a
    /// socket or a terminal and have not hung up yet.
    watched: Vec<(&'static str, File)>,
    /// Those that have hung up.
    gone: Vec<&'static str>,
    /// The stop deadline of a `DUR` policy once the caller is lost (None: none pending).
    grace_until: Option<Instant>,
}

impl Caller {
    fn watch(policy: OnDisconnect) -> Caller {
        let mut watched = Vec::new();
        for (name, fd) in [
            ("stdout", std::io::stdout().as_fd().try_clone_to_owned()),
            ("stderr", std::io::stderr().as_fd().try_clone_to_owned()),
        ] {
            let Ok(fd) = fd else { continue };
            let f = File::from(fd);
            let channel = f.metadata().is_ok_and(|m| {
                let t = m.file_type();
                t.is_fifo() || t.is_socket() || (t.is_char_device() && f.is_terminal())
            });
            if channel {
                watched.push((name, f));
            }
        }
        Caller {
            policy,
            watched,
            gone: Vec::new(),
            grace_until: None,
        }
    }

    /// After a poll: the watched descriptors' results (in `watched`'s order). When the last
    /// of them has hung up, the caller is lost: what its policy says.
    fn look(
        &mut self,
        polled: &[PollFd],
        dir: &RunDir,
        journal: &Journal,
        st: &mut Status,
    ) -> Option<Outcome> {
        let hung: Vec<usize> = polled
            .iter()
            .enumerate()
            .filter(|(_, f)| f.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
            .map(|(i, _)| i)
            .collect();
        if !hung.is_empty() && self.hung_up(&hung) {
            return self.lost(dir, journal, st);
        }
        None
    }

    /// Note the descriptors (indexes into `watched`) that hung up. True once every watched
    /// one has: the caller is gone.
    fn hung_up(&mut self, idx: &[usize]) -> bool {
        for &i in idx.iter().rev() {
            let (name, _) = self.watched.remove(i);
            self.gone.push(name);
        }
        self.watched.is_empty()
    }

    /// The caller is gone: journal and record it, then apply the policy.
    fn lost(&mut self, dir: &RunDir, journal: &Journal, st: &mut Status) -> Option<Outcome> {
        // Journalled first: whoever sees `caller_lost_at` in the record finds the event too.
        let _ = journal.event(
            "caller_lost",
            json!({"channels": self.gone, "policy": self.policy.as_record()}),
        );
        st.caller_lost_at = Some(agent_run_shared::time::rfc3339_now());
        if let Err(e) = dir.write_status(st) {
            let _ = journal.event("record_failed", json!({"error": e.to_string()}));
        }
        match self.policy {
            OnDisconnect::Keep => None,
            OnDisconnect::Cancel => Some(Outcome::Stop(Reason::CallerLost)),
            OnDisconnect::Grace(d) => {
                self.grace_until = Some(Instant::now() + d);
                None
            }
        }
    }

    /// Someone renewed or attached: a pending disconnect grace is over, the run goes on.
    fn reclaimed(&mut self, journal: &Journal) {
        if self.grace_until.take().is_some() {
            let _ = journal.event("caller_reclaimed", json!({"by": "a renew or an attach"}));
        }
    }

    fn grace_over(&self, now: Instant) -> bool {
        self.grace_until.is_some_and(|g| now >= g)
    }
}

fn leader_exit_json(ws: WaitStatus) -> serde_json::Value {
    match ws {
        WaitStatus::Exited(c) => json!({"exit_code": c}),
        WaitStatus::Signaled(s) => json!({"term_signal": Sig::from_number(s).name()}),
    }
}

/// The lease as the wrapper holds it: the last one it took, signed with the run's token.
/// lease.json is re-read at every wake-up, so a `renew` is seen. A lease.json that cannot be
/// read, is not signed with the token, or is older than the last one taken is refused
/// (journalled `lease_refused`, counted) and the last lease taken put back in its place: a
/// damaged or forged file never turns a leased run into one that runs on.
struct LeaseView {
    taken: Lease,
    token: LeaseToken,
    /// The last refused lease.json (its bytes' lease), so one forgery is journalled once.
    refused: Option<String>,
    refusals: u64,
}

impl LeaseView {
    fn new(taken: Lease, token: LeaseToken) -> LeaseView {
        LeaseView {
            taken,
            token,
            refused: None,
            refusals: 0,
        }
    }

    /// Seconds left on the lease.
    fn remaining(&mut self, dir: &RunDir, journal: &Journal) -> f64 {
        let read = dir.read_lease();
        let why = match &read {
            Ok(Some(l)) if *l == self.taken => None,
            Ok(Some(l)) if !l.verify(dir.id().as_str(), &self.token) => {
                Some("not signed with the run's lease token".to_string())
            }
            Ok(Some(l)) if l.issued_ns <= self.taken.issued_ns => {
                Some("older than the lease last taken".to_string())
            }
            Ok(Some(l)) => {
                self.taken = l.clone();
                self.refused = None;
                None
            }
            Ok(None) => Some("lease.json is gone".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = why {
            let seen = format!("{read:?}");
            if self.refused.as_deref() != Some(seen.as_str()) {
                self.refused = Some(seen);
                let keep = self.taken.deadline_epoch;
                let _ = match read.as_ref().ok().and_then(|l| l.as_ref()) {
                    // A lease that reads, but that the token does not sign (or an old one put
                    // back): a renewal that is not the starter's.
                    Some(l) => {
                        self.refusals += 1;
                        journal.event(
                            "lease_refused",
                            json!({"why": why, "offered_deadline_epoch": l.deadline_epoch,
                                   "keeping_deadline": keep, "count": self.refusals}),
                        )
                    }
                    None => journal.event(
                        "lease_unreadable",
                        json!({"error": why, "keeping_deadline": keep}),
                    ),
                };
            }
            // Put the lease taken back, so the watchdog and `status` read the truth.
            let _ = dir.write_lease(&self.taken);
        }
        self.taken.deadline_epoch - agent_run_shared::time::epoch_now()
    }
}

/// The earlier of the lease's and the timeout's deadlines (epoch seconds), with which it is.
fn earliest_due(lease: Option<f64>, timeout: Option<f64>) -> Option<(f64, DueKind)> {
    let lease = lease.map(|t| (t, DueKind::Lease));
    let timeout = timeout.map(|t| (t, DueKind::Timeout));
    match (lease, timeout) {
        (Some(l), Some(t)) => Some(if t.0 < l.0 { t } else { l }),
        (l, t) => l.or(t),
    }
}

/// A TERM that follows a cancel.json is that cancel; its `reason` (the watchdog writes
/// "lease_expired") wins. Any other signal is "signal:NAME".
fn stop_reason(dir: &RunDir, sig: Sig) -> Reason {
    if sig == Sig::Term && dir.stat_file(files::CANCEL).is_some() {
        // Read without following a symlink: a planted link is not a cancel request's reason.
        return dir.cancel_reason().unwrap_or(Reason::CancelRequest);
    }
    Reason::Signal(sig)
}
