//! Carrying out a verdict on one run. Every path ends in the shared takeover routine
//! ([`takeover::finish`]: the stop routine and the final-record writer, under the run's lock),
//! so the watchdog, `cancel` and the wrapper never both write a final record.

use crate::assess::{Action, Due, Subject};
use agent_run_shared::lifecycle::{finalize, timings_of};
use agent_run_shared::lock::Taken;
use agent_run_shared::pid::ClaimedPid;
use agent_run_shared::reason::Reason;
use agent_run_shared::record::State;
use agent_run_shared::takeover::{self, Failure, Patience, Request, Until};
use agent_run_shared::Result;
use serde_json::json;
use std::time::{Duration, Instant};

/// What happened, for the log line.
pub fn act(subject: &Subject, action: Action) -> Result<String> {
    let dir = &subject.dir;
    match action {
        Action::HostRebooted => {
            let journal = dir.journal("watchdog");
            let lock = dir.lock();
            if lock.try_lock()? != Taken::Yes {
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
                Some(Reason::HostRebooted),
                None,
                Some(&journal),
            )?;
            Ok("unknown (host_rebooted), nothing signalled".into())
        }
        // The marker finds what a launch left, or what a removed record hid.
        Action::LostLaunch => orphan(subject, Reason::WrapperLost),
        Action::Orphan { why } => orphan(subject, reason_of(subject, why)),
        Action::Contradicted | Action::CgroupLeft => orphan(subject, Reason::WrapperLost),
        Action::Stuck { why } => finish(subject, reason_of(subject, why), Patience::Brief),
    }
}

/// The reason of a stop the watchdog makes: the deadline's, or for a wrapper stuck in its own
/// stop, the reason that stop was for (the record's, when it names one of ours).
fn reason_of(subject: &Subject, why: Due) -> Reason {
    match why {
        Due::Stalled => subject
            .status
            .as_ref()
            .and_then(|st| st.reason.as_deref())
            .and_then(Reason::parse)
            .unwrap_or(Reason::CancelRequest),
        other => other.reason(),
    }
}

/// A run the assessment found without its wrapper: finished, unless a look now finds a live
/// wrapper after all (a launch that took its lock since): that run is its wrapper's.
fn orphan(subject: &Subject, reason: Reason) -> Result<String> {
    let dir = &subject.dir;
    if let agent_run_shared::wrapper::Holder::Wrapper(_) =
        agent_run_shared::wrapper::holder(dir, dir.lock_ids(), None, None, None)
    {
        return Ok("its wrapper is alive; left to it".into());
    }
    finish(subject, reason, Patience::Grace)
}

/// Finish the run through the shared takeover routine, and say how it ended.
fn finish(subject: &Subject, reason: Reason, patience: Patience) -> Result<String> {
    let grace = subject
        .status
        .as_ref()
        .map_or(Duration::from_secs(5), |st| timings_of(st).grace);
    let req = Request {
        by: "watchdog",
        reason,
        until: Until::Final,
        patience,
        deadline: Instant::now() + grace + takeover::SLACK + Duration::from_secs(30),
    };
    match takeover::finish(&subject.dir, &req) {
        Ok(done) => {
            let mut line = match &done.record {
                Some(st) => {
                    let c = st.cleanup.as_ref();
                    format!(
                        "{} ({}), signalled {}, survivors {}",
                        st.state.as_str(),
                        st.reason.as_deref().unwrap_or("-"),
                        pid_list(c.map(|c| c.signalled.as_slice()).unwrap_or(&[])),
                        pid_list(c.map(|c| c.survivors.as_slice()).unwrap_or(&[])),
                    )
                }
                None => "asked".into(),
            };
            for n in done.notes {
                line += &format!("; {n}");
            }
            Ok(line)
        }
        Err(Failure::TimedOut(msg)) | Err(Failure::RecordFailed(msg)) => {
            Err(agent_run_shared::Error::Identity { why: msg })
        }
        Err(Failure::Other(e)) => Err(e),
    }
}

fn pid_list(p: &[ClaimedPid]) -> String {
    let v: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    format!("[{}]", v.join(","))
}
