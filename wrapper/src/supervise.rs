//! The wrapper's event loop: one `poll(2)` on the signal pipe and the leader's pidfd, with the
//! lease deadline as its timeout. It returns when the leader has exited (with its wait status) or
//! when something asked the run to stop (with the reason); the caller does the stopping.

use crate::signals::Signals;
use agent_run_shared::journal::Journal;
use agent_run_shared::lease::read_lease;
use agent_run_shared::pid::Identity;
use agent_run_shared::root::{files, RunDir};
use agent_run_shared::stop::Sig;
use agent_run_shared::sys::{self, PollFd, WaitStatus};
use agent_run_shared::takeover::cancel_reason;
use serde_json::json;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

/// Why supervision ended.
pub enum Outcome {
    /// The leader exited on its own.
    LeaderExited(WaitStatus),
    /// A stop was asked for: "signal:TERM", "cancel_request", "lease_expired".
    Stop(String),
}

/// Supervise until the leader exits or a stop is requested. `lease_deadline` is the lease the
/// wrapper wrote at launch (epoch seconds), if any.
pub fn supervise(
    dir: &RunDir,
    journal: &Journal,
    signals: &Signals,
    leader_fd: Option<&OwnedFd>,
    leader: Identity,
    lease_deadline: Option<f64>,
) -> Outcome {
    // The deadline the wrapper wrote at launch, so a lease.json damaged before the first read
    // still cannot turn the leased run into one that runs forever.
    let mut lease = LeaseView {
        last: lease_deadline,
        complained: false,
    };
    // The lease is re-read at every wake-up; `renew` sends SIGUSR1 so a shortened lease is seen
    // at once. (Not inotify: closing an inotify instance costs ~10 ms of SRCU grace period on
    // this kernel, a launch's whole budget.)
    loop {
        let lease_left = lease.remaining(dir, journal);
        if lease_left.is_some_and(|l| l <= 0.0) {
            let _ = journal.event("lease_expired", json!({}));
            return Outcome::Stop("lease_expired".into());
        }
        let timeout = lease_left.map(|l| Duration::from_secs_f64(l.min(86_400.0)));
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
        if signals.take_chld() || fds.get(1).is_some_and(|f| f.revents != 0) {
            let (leader_status, _) = sys::reap_all(Some(leader.pid));
            if let Some(ws) = leader_status {
                let _ = journal.event("leader_exit", leader_exit_json(ws));
                return Outcome::LeaderExited(ws);
            }
        }
    }
}

fn leader_exit_json(ws: WaitStatus) -> serde_json::Value {
    match ws {
        WaitStatus::Exited(c) => json!({"exit_code": c}),
        WaitStatus::Signaled(s) => json!({"term_signal": Sig::from_number(s).name()}),
    }
}

/// The lease as the wrapper last saw it. lease.json is re-read at every wake-up, so a `renew`
/// is seen; a lease.json that cannot be read or parsed keeps the last deadline seen (a damaged
/// file must not turn a leased run into one that runs forever).
#[derive(Default)]
struct LeaseView {
    last: Option<f64>,
    complained: bool,
}

impl LeaseView {
    /// Seconds left on the lease, if the run has one.
    fn remaining(&mut self, dir: &RunDir, journal: &Journal) -> Option<f64> {
        match read_lease(&dir.path) {
            Ok(Some(l)) => {
                self.last = Some(l.deadline_epoch);
                self.complained = false;
            }
            Ok(None) => {}
            Err(e) => {
                if !self.complained {
                    self.complained = true;
                    let _ = journal.event(
                        "lease_unreadable",
                        json!({"error": e.to_string(), "keeping_deadline": self.last}),
                    );
                }
            }
        }
        self.last.map(|d| d - agent_run_shared::time::epoch_now())
    }
}

/// A TERM that follows a cancel.json is that cancel; its `reason` (the watchdog writes
/// "lease_expired") wins. Any other signal is "signal:NAME".
fn stop_reason(dir: &RunDir, sig: Sig) -> String {
    if sig == Sig::Term && dir.file(files::CANCEL).symlink_metadata().is_ok() {
        // Read without following a symlink: a planted link is not a cancel request's reason.
        return cancel_reason(&dir.path).unwrap_or_else(|| "cancel_request".into());
    }
    format!("signal:{}", sig.name())
}
