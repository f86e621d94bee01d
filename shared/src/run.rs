//! A run's lifecycle on disk: state transitions, the final record, and what a record says about
//! the run's processes (its scope and stop timings).
//!
//! The wrapper, `cancel` and the watchdog all move a run through these functions, so the rules
//! live once: every transition is journalled; a final record carries `ended_at`; a stop that left
//! survivors turns any final state into `unknown` with reason `survivors` and their pids.

use crate::cgroup::RunCgroup;
use crate::error::Result;
use crate::journal::Journal;
use crate::pid::{Identity, Pid};
use crate::procset::RunScope;
use crate::reason::Reason;
use crate::record::{write_status, ContainmentMode, State, Status};
use crate::stop::{Report, Timings};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// Move a run to a non-final state (starting, running, cancelling) and journal it.
pub fn transition(
    dir: &Path,
    st: &mut Status,
    to: State,
    reason: Option<&str>,
    journal: Option<&Journal>,
) -> Result<()> {
    debug_assert!(!to.is_final());
    let from = st.state;
    st.state = to;
    st.reason = reason.map(str::to_string);
    write_status(dir, st)?;
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
    dir: &Path,
    st: &mut Status,
    state: State,
    reason: Option<&str>,
    report: Option<&Report>,
    journal: Option<&Journal>,
) -> Result<()> {
    debug_assert!(state.is_final());
    let from = st.state;
    let survivors = report.is_some_and(|r| !r.survivors.is_empty());
    st.state = if survivors { State::Unknown } else { state };
    st.reason = if survivors {
        Some(Reason::Survivors.into())
    } else {
        reason.map(str::to_string)
    };
    if let Some(r) = report.filter(|r| !r.signals.is_empty() || !r.survivors.is_empty()) {
        st.cleanup = Some(r.to_cleanup());
    }
    // The keeper's counts: it writes them once every writer of its pipes is gone, which the
    // stop has just made true (bounded: a survivor holding a pipe costs the wait, not the record).
    if let Some(pending) = st.output.as_ref().filter(|o| !o.complete) {
        st.output = Some(crate::output::collect(dir, pending, crate::output::WAIT));
    }
    st.ended_at = Some(crate::time::rfc3339_now());
    crate::fault::point("before_final");
    write_status(dir, st)?;
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

/// The process scope a record in `dir` describes. A record without a leader (the wrapper died
/// between spawn and `running`) falls back to the wrapper's identity: the wrapper is dead, so
/// only processes carrying the run's marker and started after it match. `None` when neither is
/// recorded.
pub fn scope_of(dir: &Path, st: &Status, wrapper: Option<Pid>) -> Option<RunScope> {
    let (leader, marker_only) = match (st.pid.and_then(|p| Pid::new(p.into())), st.start_ticks) {
        (Some(pid), Some(start_ticks)) => (Identity { pid, start_ticks }, false),
        _ => (
            Identity {
                pid: Pid::new(st.wrapper_pid?.into())?,
                start_ticks: st.wrapper_start_ticks?,
            },
            true,
        ),
    };
    // The run began after its dir was made: a floor above that is a rewritten record. Two ticks
    // of margin below it, for the clock arithmetic.
    let mut floor = leader.start_ticks;
    if let Some(born) = std::fs::metadata(dir)
        .and_then(|m| m.created())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
    {
        let born = crate::procfs::epoch_to_ticks(born.as_secs_f64());
        floor = floor.min(born.saturating_sub(2));
    }
    let run_dir = RunScope::dir_identity(dir);
    Some(RunScope {
        run_id: st.run_id.clone(),
        leader,
        uid: st.uid,
        wrapper,
        run_dir,
        marker_only,
        floor_ticks: floor,
        cgroup: recorded_cgroup(dir, st).ok().flatten(),
        exclude: Vec::new(),
    })
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

/// The run's cgroup as its record names it, checked ([`RunCgroup::verify`]): `Ok(None)` for a
/// run held by procfs or a cgroup already removed; `Err(Identity)` for a record naming a
/// cgroup that is not this run's (refuse, signal nothing).
pub fn recorded_cgroup(dir: &Path, st: &Status) -> Result<Option<RunCgroup>> {
    let Some(path) = st
        .containment
        .as_ref()
        .filter(|c| c.mode == ContainmentMode::Cgroup)
        .and_then(|c| c.cgroup.as_deref())
    else {
        return Ok(None);
    };
    let Some((_, ino)) = RunScope::dir_identity(dir) else {
        return Ok(None);
    };
    RunCgroup::verify(Path::new(path), &st.run_id, ino)
}

/// The stop timings a record was started with (the defaults where it does not say).
pub fn timings_of(st: &Status) -> Timings {
    let d = Timings::default();
    Timings {
        hup_after: st.hup_after_ms.map_or(d.hup_after, Duration::from_millis),
        grace: st.grace_ms.map_or(d.grace, Duration::from_millis),
        confirm: d.confirm,
    }
}
