//! A run's lifecycle on disk: state transitions, the final record, what a record says about the
//! run's processes (its scope, cgroup and stop timings), and the ends a run meets without its
//! wrapper (the orphan stop, the lost launch).
//!
//! The wrapper, `cancel` and the watchdog all move a run through these functions, so the rules
//! live once: every transition is journalled; a final record carries `ended_at`; a stop that left
//! survivors turns any final state into `unknown` with reason `survivors` and their pids.

use crate::cgroup::RunCgroup;
use crate::error::Result;
use crate::journal::Journal;
use crate::pid::Pid;
use crate::procset::RunScope;
use crate::reason::Reason;
use crate::record::{ContainmentMode, State, Status};
use crate::run_dir::RunDir;
use crate::stop::{Report, Timings};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// Move a run to a non-final state (starting, running, cancelling) and journal it.
pub fn transition(
    dir: &RunDir,
    st: &mut Status,
    to: State,
    reason: Option<Reason>,
    journal: Option<&Journal>,
) -> Result<()> {
    debug_assert!(!to.is_final());
    let from = st.state;
    st.state = to;
    st.reason = reason.map(String::from);
    dir.write_status(st)?;
    if let Some(j) = journal {
        let _ = j.event(
            "state",
            json!({"from": from.as_str(), "to": to.as_str(), "reason": reason}),
        );
    }
    Ok(())
}

/// Write the final record (fsynced) and journal it. With a stop report that left survivors the
/// state becomes `unknown`, reason `survivors`: a run is never `cancelled` or `finished` while a
/// process of it lives.
pub fn finalize(
    dir: &RunDir,
    st: &mut Status,
    state: State,
    reason: Option<Reason>,
    report: Option<&Report>,
    journal: Option<&Journal>,
) -> Result<()> {
    debug_assert!(state.is_final());
    let from = st.state;
    let survivors = report.is_some_and(|r| !r.survivors.is_empty());
    // Escapees of an emptied cgroup make the run `escaped`; by /proc scans alone they are
    // named, and the run is already `unprovable`.
    let escaped = report.is_some_and(|r| {
        !r.escapees.is_empty() && r.proof != Some(crate::record::Proof::Unprovable)
    });
    st.state = if survivors || escaped {
        State::Unknown
    } else {
        state
    };
    st.reason = if survivors {
        Some(Reason::Survivors.into())
    } else if escaped {
        Some(Reason::Escaped.into())
    } else {
        reason.map(String::from)
    };
    if let Some(r) = report
        .filter(|r| !r.signals.is_empty() || !r.survivors.is_empty() || !r.escapees.is_empty())
    {
        st.cleanup = Some(r.to_cleanup());
    }
    if survivors || escaped {
        st.proof = None;
    } else if st.proof.is_none() {
        st.proof = report.and_then(|r| r.proof);
    }
    // The keeper's counts: it writes them once every writer of its pipes is gone, which the
    // stop has just made true (bounded: a survivor holding a pipe costs the wait, not the record).
    if let Some(pending) = st.output.as_ref().filter(|o| !o.complete && !o.settled) {
        st.output = Some(crate::output::collect(dir, pending, crate::output::WAIT));
    }
    st.ended_at = Some(crate::time::rfc3339_now());
    crate::fault::point("before_final");
    if let Err(e) = dir.write_status(st) {
        // A final record in the way of ours, while we (the lock holder, still holding a run
        // that was not final) finish the run: the workload wrote it. Ours replaces it, and the
        // journal keeps what it said.
        let forged = dir.read_status().ok().filter(|old| old.state.is_final());
        match forged {
            Some(old) if !from.is_final() => {
                dir.write_final_over_forgery(st).map_err(|_| e)?;
                if let Some(j) = journal {
                    let _ = j.event(
                        "record_contradicted",
                        json!({"recorded_state": old.state.as_str(), "recorded_reason": old.reason,
                               "why": "a final record the lock holder did not write"}),
                    );
                }
            }
            _ => return Err(e),
        }
    }
    if let Some(j) = journal {
        let _ = j.event(
            "state",
            json!({
                "from": from.as_str(), "to": st.state.as_str(), "reason": st.reason,
                "exit_code": st.exit_code, "term_signal": st.term_signal,
            }),
        );
    }
    Ok(())
}

impl RunDir {
    /// The process scope a record of this run describes. A record without a leader (the
    /// wrapper died between spawn and `running`) falls back to the wrapper's identity: the
    /// wrapper is dead, so only processes carrying the run's marker and started after it match.
    /// `None` when neither is recorded.
    ///
    /// With a live wrapper (a takeover from a stuck one) its descendants are the run's, but for
    /// its output keeper ([`crate::procfs::keeper_of`]), which is excluded: nobody signals it.
    pub fn scope(&self, st: &Status, wrapper: Option<Pid>) -> Option<RunScope> {
        let mut scope = self.scope_held(st, wrapper, self.recorded_cgroup(st).ok().flatten())?;
        scope
            .exclude
            .extend(wrapper.and_then(crate::procfs::keeper_of));
        Some(scope)
    }

    /// The same for the wrapper, which made the run's cgroup and holds it: `cgroup` is that one
    /// (what its record names), not looked up and checked again from the record's path (two
    /// statx on the cgroup filesystem, each time the wrapper builds its scope).
    pub fn scope_held(
        &self,
        st: &Status,
        wrapper: Option<Pid>,
        cgroup: Option<RunCgroup>,
    ) -> Option<RunScope> {
        let (leader, marker_only) = match st.leader() {
            Some(leader) => (leader, false),
            None => (st.wrapper()?, true),
        };
        // The run began after its dir was made: a floor above that is a rewritten record. Two
        // ticks of margin below it, for the clock arithmetic.
        let mut floor = leader.start_ticks;
        if let Some(born) = self
            .born()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        {
            let born = crate::procfs::epoch_to_ticks(born.as_secs_f64());
            floor = floor.min(born.saturating_sub(2));
        }
        Some(RunScope {
            run_id: st.run_id.clone(),
            leader,
            uid: st.uid,
            wrapper,
            run_dir: Some(self.identity()),
            marker_only,
            floor_ticks: floor,
            cgroup,
            exclude: Vec::new(),
        })
    }

    /// The run's cgroup as its record names it, checked ([`RunCgroup::verify`]): `Ok(None)` for
    /// a run held by procfs or a cgroup already removed; `Err(Identity)` for a record naming a
    /// cgroup that is not this run's (refuse, signal nothing).
    pub fn recorded_cgroup(&self, st: &Status) -> Result<Option<RunCgroup>> {
        let Some(path) = st
            .containment
            .as_ref()
            .filter(|c| c.mode == ContainmentMode::Cgroup)
            .and_then(|c| c.cgroup.as_deref())
        else {
            return Ok(None);
        };
        RunCgroup::verify(Path::new(path), &st.run_id, self.identity().1)
    }
}

/// Remove a run's cgroup after its final record; a cgroup that cannot go (a process is left:
/// the record says so) is journalled and left.
pub fn remove_cgroup(cg: &RunCgroup, journal: &Journal) {
    if let Err(e) = cg.remove() {
        let _ = journal.event(
            "cgroup_left",
            json!({"cgroup": cg.path(), "error": e.to_string()}),
        );
    }
}

/// The stop timings a record was started with (the defaults where it does not say), each at
/// most [`crate::stop::MAX_GRACE`]: the run can rewrite its record, and no launch asks for more.
pub fn timings_of(st: &Status) -> Timings {
    let d = Timings::default();
    let max = crate::stop::MAX_GRACE;
    Timings {
        hup_after: st
            .hup_after_ms
            .map_or(d.hup_after, Duration::from_millis)
            .min(max),
        grace: st.grace_ms.map_or(d.grace, Duration::from_millis).min(max),
        confirm: d.confirm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_grace_and_hup_step_are_honoured_up_to_the_most_a_launch_may_ask() {
        let mut st = crate::record::tests::sample();
        st.grace_ms = Some(3_600_000);
        st.hup_after_ms = Some(3_600_000);
        let t = timings_of(&st);
        assert_eq!(t.grace, crate::stop::MAX_GRACE);
        assert_eq!(t.hup_after, crate::stop::MAX_GRACE);
        st.grace_ms = Some(7_000);
        st.hup_after_ms = None;
        let t = timings_of(&st);
        assert_eq!(t.grace, Duration::from_secs(7));
        assert_eq!(t.hup_after, Timings::default().hup_after);
    }
}
