//! Carrying out a verdict on one run. Every path ends in the shared stop routine and the shared
//! final-record writer, under the run's lock, so the watchdog, `cancel` and the wrapper never
//! both write a final record.

use crate::assess::{Action, Due, Subject};
use agent_run_shared::journal::Journal;
use agent_run_shared::lifecycle::{
    finalize, record_lost_launch, remove_cgroup, reopen_contradicted, stop_orphaned, timings_of,
    transition,
};
use agent_run_shared::lock::RunLock;
use agent_run_shared::procset::RunScope;
use agent_run_shared::reason::Reason;
use agent_run_shared::record::State;
use agent_run_shared::stop::{stop_run, Sig};
use agent_run_shared::sys::{self, PollFd};
use agent_run_shared::wrapper::{
    check_record, live_wrapper, lock_holder, signal_wrapper, LockHolder, Wrapper,
};
use agent_run_shared::{pid::Pid, Result};
use serde_json::json;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// What happened, for the log line.
pub fn act(subject: &Subject, action: Action) -> Result<String> {
    let dir = &subject.dir;
    let journal = dir.journal("watchdog")?;
    let lock = dir.lock()?;
    match action {
        Action::HostRebooted => {
            if !lock.try_lock()? {
                return Ok("locked by another party; left alone".into());
            }
            let mut st = dir.read_status()?;
            if st.state.is_final() {
                return Ok(format!("already {}", st.state.as_str()));
            }
            let _ = journal.event(
                "reconcile",
                json!({"why": "host_rebooted", "record_boot_id": st.boot_id}),
            );
            finalize(
                dir,
                &mut st,
                State::Unknown,
                Some(&*Reason::HostRebooted.as_str()),
                None,
                Some(&journal),
            )?;
            Ok("unknown (host_rebooted), nothing signalled".into())
        }
        Action::Orphan { .. } | Action::Contradicted => {
            let why = match action {
                Action::Orphan { why } => why,
                _ => Due::WrapperLost,
            };
            // A final record is the end of it, unless (Contradicted) the run's cgroup still
            // holds processes: then the record was forged, and the run is reopened and stopped
            // (looked at once, under the lock, below).
            let mut st = dir.read_status()?;
            if st.state.is_final() && action != Action::Contradicted {
                return Ok(format!("already {}", st.state.as_str()));
            }
            refuse_unless_whole(&st, &journal)?;
            let mut how = "the wrapper is gone";
            if !lock.try_lock()? {
                match lock_holder(&lock, dir, &st) {
                    // The wrapper or a canceller: theirs to finish.
                    LockHolder::Wrapper(_) | LockHolder::Party(_) => {
                        return Ok(
                            "locked by another party (a cancel in progress?); left alone".into(),
                        )
                    }
                    LockHolder::Mismatch(why) => {
                        return Err(agent_run_shared::Error::Identity { why })
                    }
                    // A process that is not agent-run sits on the dead wrapper's lock: finish
                    // the run without it (the stop ends the squatter if it is the run's).
                    LockHolder::Squatter(pids) => {
                        let _ = journal.event("lock_squatted", json!({"holders": pids}));
                        how = "the wrapper is gone; its lock is squatted";
                    }
                }
            }
            // Ours now (or squatted): what the record says now is what we finish.
            st = dir.read_status()?;
            if st.state.is_final() {
                let contradicted = (action == Action::Contradicted)
                    .then(|| dir.contradicting_cgroup(&st, None))
                    .flatten();
                match contradicted {
                    Some(cg) => reopen_contradicted(dir, &mut st, &cg, &journal)?,
                    None => return Ok(format!("already {}", st.state.as_str())),
                }
                refuse_unless_whole(&st, &journal)?;
            }
            let reason = why.reason().as_str();
            let reason: &str = &reason;
            let _ = dir.request_cancel("watchdog", reason);
            let _ = journal.event("takeover", json!({"why": how, "reason": reason}));
            let report = stop_orphaned(dir, &mut st, reason, &journal)?;
            Ok(format!(
                "{} ({}), signalled {}, survivors {}",
                st.state.as_str(),
                st.reason.as_deref().unwrap_or("-"),
                pid_list(&report.signalled),
                pid_list(&report.survivors)
            ))
        }
        Action::Stuck { why } => stuck(subject, &journal, &lock, why),
        Action::LostLaunch => {
            if !lock.try_lock()? {
                return Ok("locked (a launch in progress?); left alone".into());
            }
            if dir.read_status().is_ok() {
                return Ok("the record appeared meanwhile".into());
            }
            record_lost_launch(dir, &journal)?;
            Ok("unknown (wrapper_lost): no record was ever written".into())
        }
    }
}

/// A live wrapper past its lease (or timeout) + grace + slack: ask it (cancel.json + TERM);
/// stop the process set ourselves; if the wrapper still has not written a final record, it is
/// stuck for good (SIGSTOPped, wedged): KILL it, take its lock, and write the record.
fn stuck(subject: &Subject, journal: &Journal, lock: &RunLock, why: Due) -> Result<String> {
    let reason = why.reason().as_str();
    let reason: &str = &reason;
    let dir = &subject.dir;
    let st = dir.read_status()?;
    if st.state.is_final() {
        return Ok(format!("already {}", st.state.as_str()));
    }
    refuse_unless_whole(&st, journal)?;
    let w = match live_wrapper(dir, &st) {
        Wrapper::Alive(w) => w,
        Wrapper::Mismatch(why) => return Err(agent_run_shared::Error::Identity { why }),
        // It died meanwhile: the orphan path handles it.
        Wrapper::Gone => return act(subject, Action::Orphan { why }),
    };
    let _ = dir.request_cancel("watchdog", reason);
    signal_wrapper(
        &w,
        Sig::Term,
        reason,
        Some(match why {
            Due::Timeout => "wrapper past its timeout + grace",
            _ => "wrapper past its lease deadline + grace",
        }),
        journal,
    )?;
    // The wrapper is confirmed by the kernel, so its descendants are the run's.
    let scope: RunScope =
        dir.scope(&st, Some(w.pid()))
            .ok_or_else(|| agent_run_shared::Error::Identity {
                why: "the record has no pid".into(),
            })?;
    let report = stop_run(&scope, &timings_of(&st), reason, Some(journal), None);
    // Give a wrapper that is only slow a moment to write its own record.
    let mut fds = [PollFd {
        fd: w.fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let _ = sys::poll(&mut fds, Some(Duration::from_secs(1)));
    if dir.read_status()?.state.is_final() {
        return Ok("the wrapper finished the stop itself".into());
    }
    signal_wrapper(&w, Sig::Kill, reason, Some("wrapper stuck"), journal)?;
    let _ = sys::poll(&mut fds, Some(Duration::from_secs(5)));
    // The lock frees when the wrapper's descriptors close, at its exit (before it is reaped).
    let mut locked = false;
    for _ in 0..50 {
        if lock.try_lock()? {
            locked = true;
            break;
        }
        let _ = sys::poll(&mut [], Some(Duration::from_millis(20)));
    }
    if !locked {
        return Ok("processes stopped; the wrapper still holds its lock, record left to it".into());
    }
    let mut st = dir.read_status()?;
    if st.state.is_final() {
        return Ok(format!("already {}", st.state.as_str()));
    }
    if st.state != State::Cancelling {
        transition(dir, &mut st, State::Cancelling, Some(reason), Some(journal))?;
    }
    st.exit_code = None;
    st.term_signal = None;
    if let Some(cg) = &scope.cgroup {
        st.resources = Some(cg.resources());
    }
    finalize(
        dir,
        &mut st,
        State::Cancelled,
        Some(reason),
        Some(&report),
        Some(journal),
    )?;
    // The killed wrapper cannot remove the run's cgroup any more: as for an orphan, it goes
    // after the final record (a cgroup a process is left in is journalled and left).
    if let Some(cg) = &scope.cgroup {
        remove_cgroup(cg, journal);
    }
    Ok(format!(
        "{} ({}), wrapper killed, signalled {}",
        st.state.as_str(),
        st.reason.as_deref().unwrap_or("-"),
        pid_list(&report.signalled)
    ))
}

/// The record must hold the whole identity before anything it names is signalled; a refusal is
/// journalled.
fn refuse_unless_whole(st: &agent_run_shared::record::Status, journal: &Journal) -> Result<()> {
    check_record(st).inspect_err(|e| {
        let _ = journal.event("refused", json!({"why": e.to_string()}));
    })
}

fn pid_list(p: &[Pid]) -> String {
    let v: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    format!("[{}]", v.join(","))
}
