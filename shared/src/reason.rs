//! Why a stop happened or why a run's state is `unknown`: the record's `reason` (and the
//! `reason` of every journalled signal), as the contract spells them.
//!
//! The record keeps `reason` as a string on the wire: a hostile workload may write anything
//! there. Code that produces a reason uses a [`Reason`]; code that compares one parses the
//! record's string with [`Reason::parse`], so a misspelt comparison cannot compile.

use crate::signal::Sig;
use std::borrow::Cow;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `signal:NAME`: the wrapper got this signal (TERM, INT, HUP, ...).
    Signal(Sig),
    /// `cancel_request`: `agent-run cancel` asked.
    CancelRequest,
    /// `lease_expired`: nobody renewed the lease in time.
    LeaseExpired,
    /// `timeout`: the run's `--timeout` passed.
    Timeout,
    /// `caller_lost`: the caller's channel hung up (`--on-disconnect`).
    CallerLost,
    /// `wrapper_lost`: the wrapper died and nobody saw how the run ended.
    WrapperLost,
    /// `host_rebooted`: the record is from an earlier boot.
    HostRebooted,
    /// `survivors`: a stop left processes alive.
    Survivors,
    /// `suspend`: STOP sent to the run (Ctrl-Z); journal only.
    Suspend,
    /// `resume`: CONT sent to the run (`fg`); journal only.
    Resume,
    /// `unprovable`: the run was stopped after its wrapper was lost, held by /proc scans
    /// alone, which cannot prove that nothing of it is left.
    Unprovable,
    /// `escaped`: processes that may be the run's were found outside its cgroup, where a
    /// process of the run could have moved itself.
    Escaped,
    /// `output_limit`: `--on-output-limit=stop` stopped the run.
    OutputLimit,
    /// `keeper_lost`: the output keeper of a `--pty` run died while the run went on.
    KeeperLost,
    /// `leader_exited`: the leader exited and what was left of the run was stopped; journal
    /// only.
    LeaderExited,
    /// `launch_failed`: a launch that failed after the spawn; journal only.
    LaunchFailed,
    /// `record_failed`: the `running` record could not be written; journal only.
    RecordFailed,
    /// `keeper_stopped`: the run had stopped the output keeper; journal only.
    KeeperStopped,
    /// `renew`: the wrapper is woken to re-read its lease; journal only.
    Renew,
    /// `attach`: the wrapper is woken by an attach within the disconnect grace; journal only.
    Attach,
}

/// The reasons that are plain words, with their spelling.
const WORDS: &[(Reason, &str)] = &[
    (Reason::CancelRequest, "cancel_request"),
    (Reason::LeaseExpired, "lease_expired"),
    (Reason::Timeout, "timeout"),
    (Reason::CallerLost, "caller_lost"),
    (Reason::WrapperLost, "wrapper_lost"),
    (Reason::HostRebooted, "host_rebooted"),
    (Reason::Survivors, "survivors"),
    (Reason::Suspend, "suspend"),
    (Reason::Resume, "resume"),
    (Reason::Unprovable, "unprovable"),
    (Reason::Escaped, "escaped"),
    (Reason::OutputLimit, "output_limit"),
    (Reason::KeeperLost, "keeper_lost"),
    (Reason::LeaderExited, "leader_exited"),
    (Reason::LaunchFailed, "launch_failed"),
    (Reason::RecordFailed, "record_failed"),
    (Reason::KeeperStopped, "keeper_stopped"),
    (Reason::Renew, "renew"),
    (Reason::Attach, "attach"),
];

impl Reason {
    /// The contract's spelling ("lease_expired", "signal:TERM").
    pub fn as_str(self) -> Cow<'static, str> {
        match self {
            Reason::Signal(sig) => Cow::Owned(format!("signal:{}", sig.name())),
            r => Cow::Borrowed(
                WORDS
                    .iter()
                    .find(|(w, _)| *w == r)
                    .map(|(_, s)| *s)
                    .expect("every word reason is spelt"),
            ),
        }
    }

    /// A record's reason; None for what the contract does not name (a hostile record, or a
    /// newer agent-run's reason).
    pub fn parse(s: &str) -> Option<Reason> {
        if let Some(name) = s.strip_prefix("signal:") {
            return Sig::from_name(name).map(Reason::Signal);
        }
        WORDS.iter().find(|(_, w)| *w == s).map(|(r, _)| *r)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// As its spelling, so a journal line or record says the same as [`Reason::as_str`].
impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_str())
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> String {
        r.as_str().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_as_itself() {
        let mut all: Vec<Reason> = WORDS.iter().map(|(r, _)| *r).collect();
        all.extend([Sig::Term, Sig::Int, Sig::Hup, Sig::Other(34)].map(Reason::Signal));
        for r in all {
            assert_eq!(Reason::parse(&r.as_str()), Some(r), "{r}");
        }
        assert_eq!(Reason::LeaseExpired.as_str(), "lease_expired");
        assert_eq!(Reason::Signal(Sig::Term).to_string(), "signal:TERM");
        assert_eq!(
            Reason::parse("signal:SIGINT"),
            Some(Reason::Signal(Sig::Int))
        );
        for hostile in [
            "",
            "LEASE_EXPIRED",
            "signal:",
            "signal:NOPE",
            "signal:0",
            "x",
        ] {
            assert_eq!(Reason::parse(hostile), None, "{hostile:?}");
        }
    }

    /// The contract's record section names these reasons.
    #[test]
    fn the_contract_names_every_stop_reason() {
        let contract = include_str!("../../docs/contract.md");
        for (_, w) in WORDS {
            assert!(
                contract.contains(&format!("`{w}`")) || contract.contains(&format!("\"{w}\"")),
                "{w}"
            );
        }
        for sig in ["TERM", "INT", "HUP"] {
            assert!(contract.contains(&format!("\"signal:{sig}\"")), "{sig}");
        }
    }
}
