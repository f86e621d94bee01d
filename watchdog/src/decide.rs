//! The watchdog's decisions as pure functions of time: which deadline is due first, when a
//! live wrapper counts as stuck, and when an orphan is stopped. No file, no process: the
//! callers ([`crate::assess`]) bring the facts, and the tests bring tables.

use agent_run_shared::reason::Reason;
use agent_run_shared::time;
use std::time::Duration;

/// The watchdog's knobs.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a run without a lease may outlive its wrapper.
    pub orphan_grace: Duration,
    /// How far past deadline + grace a live wrapper may be before it counts as stuck.
    pub slack: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            orphan_grace: Duration::from_secs(60),
            slack: Duration::from_secs(5),
        }
    }
}

/// What made a stop due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The lease expired.
    Lease,
    /// The run's `--timeout` expired.
    Timeout,
    /// The wrapper is gone and neither came first (the orphan grace passed).
    WrapperLost,
    /// The live wrapper has been stopping its run for longer than its grace + slack.
    Stalled,
}

impl Due {
    /// The record's reason for the stop.
    pub fn reason(self) -> Reason {
        match self {
            Due::Lease => Reason::LeaseExpired,
            Due::Timeout => Reason::Timeout,
            Due::WrapperLost => Reason::WrapperLost,
            Due::Stalled => Reason::CancelRequest,
        }
    }
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Record from an earlier boot: `unknown`, `host_rebooted`, signal nothing.
    HostRebooted,
    /// Wrapper gone: stop what remains (reason `lease_expired`, `timeout` or `wrapper_lost`).
    Orphan { why: Due },
    /// Wrapper alive but stuck past its lease or timeout: ask it, then stop the run ourselves.
    Stuck { why: Due },
    /// A run dir that never got a record (its wrapper died before writing one).
    LostLaunch,
    /// The record says the run is over, but the run's cgroup holds processes and the wrapper
    /// is gone: reopen the run and stop it (reason `wrapper_lost`).
    Contradicted,
    /// The record says the run is over and nobody holds it, but its cgroup is left: a process
    /// that may have left it reopens the run (`unknown`, `escaped`); else the cgroup goes.
    CgroupLeft,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::HostRebooted => "from an earlier boot",
            Action::Orphan { why: Due::Lease } => "wrapper gone, lease expired",
            Action::Orphan { why: Due::Timeout } => "wrapper gone, timeout expired",
            Action::Orphan {
                why: Due::WrapperLost | Due::Stalled,
            } => "wrapper gone",
            Action::Stuck { why: Due::Timeout } => "wrapper stuck past its timeout",
            Action::Stuck { why: Due::Stalled } => "wrapper stuck in its stop",
            Action::Stuck { .. } => "wrapper stuck past its lease",
            Action::LostLaunch => "no record: a lost launch or a removed record",
            Action::Contradicted => "final record contradicted by the run's cgroup",
            Action::CgroupLeft => "final record, its cgroup left behind",
        })
    }
}

/// The earlier of two deadlines, either may be missing: a lease.json read after the wrapper is
/// gone (the workload's to write) never pushes the deadline seen while it lived later.
pub fn earliest(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    [a, b]
        .into_iter()
        .flatten()
        .filter(|d| d.is_finite())
        .reduce(f64::min)
}

/// The earlier of the lease deadline and the timeout deadline, and which it is (the lease on
/// a tie). A timeout that is not a finite number (a rewritten record) counts as none.
pub fn first_due(lease: Option<f64>, timeout: Option<f64>) -> Option<(f64, Due)> {
    [
        lease.map(|l| (l, Due::Lease)),
        timeout.filter(|d| d.is_finite()).map(|d| (d, Due::Timeout)),
    ]
    .into_iter()
    .flatten()
    .min_by(|a, b| a.0.total_cmp(&b.0))
}

/// What to do about a run whose wrapper is alive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Alive {
    /// Past its deadline + grace + slack: the wrapper is stopped or stuck.
    Stuck(Due),
    /// The wrapper's business; look again at `recheck_epoch` (deadline + grace + slack).
    Watch { recheck_epoch: Option<f64> },
}

/// The decision for a live wrapper, from the first deadline ([`first_due`]) and the run's
/// grace (seconds).
pub fn decide_alive(now: f64, due: Option<(f64, Due)>, grace: f64, policy: &Policy) -> Alive {
    let stuck_at = due.map(|(d, why)| (d + grace + policy.slack.as_secs_f64(), why));
    match stuck_at {
        Some((t, why)) if now >= t => Alive::Stuck(why),
        _ => Alive::Watch {
            recheck_epoch: stuck_at.map(|(t, _)| t),
        },
    }
}

/// The decision for a run whose wrapper is gone: the orphan action, and when (None: now). The
/// stop is due at the first deadline, or without one at the orphan grace after the wrapper was
/// first known gone (`gone_since`, never later than `now`). A stop that is not due yet is
/// still made now when nothing of the run `remains`: there is nothing to wait for (the stop
/// finds an empty set and ends as `unknown`/`wrapper_lost`). `gone_since` and `remains` are
/// asked only when the decision needs them.
pub fn decide_gone(
    now: f64,
    due: Option<(f64, Due)>,
    policy: &Policy,
    gone_since: impl FnOnce() -> Option<f64>,
    remains: impl FnOnce() -> Option<bool>,
) -> Option<(Action, Option<f64>)> {
    let (act_epoch, why) = due.unwrap_or_else(|| {
        let since = gone_since().map_or(now, |s| s.min(now));
        (since + policy.orphan_grace.as_secs_f64(), Due::WrapperLost)
    });
    let action = Action::Orphan { why };
    if now >= act_epoch || !remains()? {
        Some((action, None))
    } else {
        Some((action, Some(act_epoch)))
    }
}

/// Epoch seconds to a monotonic delay from now.
pub fn delay_until(epoch: f64) -> Duration {
    Duration::from_secs_f64((epoch - time::epoch_now()).clamp(0.0, 86_400.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// (now, due, what a live wrapper's run wants).
    type AliveCase = (f64, Option<(f64, Due)>, Alive);

    /// Each case decides what it wants with this grace and policy.
    fn check_alive(cases: &[AliveCase], grace: f64, p: &Policy) {
        for &(now, due, want) in cases {
            assert_eq!(
                decide_alive(now, due, grace, p),
                want,
                "now {now} due {due:?}"
            );
        }
    }

    /// Watched, to be looked at again at `epoch`.
    fn watch(epoch: f64) -> Alive {
        Alive::Watch {
            recheck_epoch: Some(epoch),
        }
    }

    fn policy() -> Policy {
        Policy {
            orphan_grace: Duration::from_secs(60),
            slack: Duration::from_secs(5),
        }
    }

    #[test]
    fn the_first_deadline_is_due_and_the_lease_wins_a_tie() {
        let cases = [
            (None, None, None),
            (Some(100.0), None, Some((100.0, Due::Lease))),
            (None, Some(50.0), Some((50.0, Due::Timeout))),
            (Some(100.0), Some(50.0), Some((50.0, Due::Timeout))),
            (Some(40.0), Some(50.0), Some((40.0, Due::Lease))),
            (Some(50.0), Some(50.0), Some((50.0, Due::Lease))),
            // A rewritten record's timeout that is not a number is none.
            (Some(100.0), Some(f64::NAN), Some((100.0, Due::Lease))),
            (None, Some(f64::INFINITY), None),
            (None, Some(f64::NEG_INFINITY), None),
        ];
        for (lease, timeout, want) in cases {
            assert_eq!(first_due(lease, timeout), want, "{lease:?} {timeout:?}");
        }
    }

    /// A live wrapper is stuck at deadline + grace (5) + slack (5), not a moment earlier.
    #[test]
    fn a_live_wrapper_is_stuck_only_past_deadline_grace_and_slack() {
        let p = policy();
        let cases = [
            (
                1000.0,
                None,
                Alive::Watch {
                    recheck_epoch: None,
                },
            ),
            (1000.0, Some((995.0, Due::Lease)), watch(1005.0)),
            (1004.9, Some((995.0, Due::Lease)), watch(1005.0)),
            (1005.0, Some((995.0, Due::Lease)), Alive::Stuck(Due::Lease)),
            (
                2000.0,
                Some((995.0, Due::Timeout)),
                Alive::Stuck(Due::Timeout),
            ),
            // A deadline still ahead: watched until it + grace + slack.
            (900.0, Some((995.0, Due::Lease)), watch(1005.0)),
            (1004.9, Some((995.0, Due::Timeout)), watch(1005.0)),
            (
                1005.0,
                Some((995.0, Due::Timeout)),
                Alive::Stuck(Due::Timeout),
            ),
        ];
        check_alive(&cases, 5.0, &p);
        // No grace and no slack: stuck at the deadline itself.
        let p = Policy {
            slack: Duration::ZERO,
            ..policy()
        };
        let cases = [
            (994.5, Some((995.0, Due::Lease)), watch(995.0)),
            (995.0, Some((995.0, Due::Lease)), Alive::Stuck(Due::Lease)),
            (
                995.0,
                Some((995.0, Due::Timeout)),
                Alive::Stuck(Due::Timeout),
            ),
        ];
        check_alive(&cases, 0.0, &p);
    }

    /// (now, due, gone since, remains) -> (why, when): None is now.
    #[test]
    fn an_orphan_is_stopped_at_its_first_deadline_or_the_orphan_grace() {
        let p = policy();
        let cases: [Case; 9] = [
            // Due: now, whatever remains.
            (
                1000.0,
                Some((999.0, Due::Lease)),
                None,
                true,
                Due::Lease,
                None,
            ),
            (
                1000.0,
                Some((1000.0, Due::Timeout)),
                None,
                true,
                Due::Timeout,
                None,
            ),
            // Not due: later while processes remain, now when none does.
            (
                1000.0,
                Some((1010.0, Due::Lease)),
                None,
                true,
                Due::Lease,
                Some(1010.0),
            ),
            (
                1000.0,
                Some((1010.0, Due::Lease)),
                None,
                false,
                Due::Lease,
                None,
            ),
            // No deadline: the orphan grace (60) from when the wrapper was first known gone.
            (1000.0, None, None, true, Due::WrapperLost, Some(1060.0)),
            (
                1000.0,
                None,
                Some(970.0),
                true,
                Due::WrapperLost,
                Some(1030.0),
            ),
            (1000.0, None, Some(900.0), true, Due::WrapperLost, None),
            // A "gone since" in the future (a forged heartbeat) does not push it later.
            (
                1000.0,
                None,
                Some(5000.0),
                true,
                Due::WrapperLost,
                Some(1060.0),
            ),
            (1000.0, None, Some(970.0), false, Due::WrapperLost, None),
        ];
        check_gone(&p, &cases);
        // A known deadline decides, however long ago the wrapper went.
        let later_deadline: [Case; 2] = [
            (
                1000.0,
                Some((1010.0, Due::Timeout)),
                Some(900.0),
                true,
                Due::Timeout,
                Some(1010.0),
            ),
            (
                1000.0,
                Some((1010.0, Due::Timeout)),
                Some(900.0),
                false,
                Due::Timeout,
                None,
            ),
        ];
        check_gone(&p, &later_deadline);
        // No orphan grace: a lease-less orphan is stopped as soon as its wrapper is known gone.
        let no_grace = Policy {
            orphan_grace: Duration::ZERO,
            ..policy()
        };
        let at_once: [Case; 3] = [
            (1000.0, None, None, true, Due::WrapperLost, None),
            (1000.0, None, Some(999.0), true, Due::WrapperLost, None),
            (1000.0, None, Some(5000.0), true, Due::WrapperLost, None),
        ];
        check_gone(&no_grace, &at_once);
    }

    type Case = (f64, Option<(f64, Due)>, Option<f64>, bool, Due, Option<f64>);

    /// Checks [`decide_gone`] against a table of (now, due, gone since, remains) -> (why, when).
    fn check_gone(p: &Policy, cases: &[Case]) {
        for &(now, due, since, remains, why, when) in cases {
            let scanned = Cell::new(false);
            let (action, at) = decide_gone(
                now,
                due,
                p,
                || since,
                || {
                    scanned.set(true);
                    Some(remains)
                },
            )
            .expect("a look was given");
            assert_eq!(action, Action::Orphan { why }, "{now} {due:?} {since:?}");
            assert_eq!(at, when, "{now} {due:?} {since:?} remains {remains}");
            // The /proc scan is made only when the stop is not due yet by its time.
            if remains {
                assert_eq!(scanned.get(), when.is_some(), "{now} {due:?} {since:?}");
            }
        }
    }

    #[test]
    fn each_action_says_what_the_watchdog_saw() {
        let cases = [
            (Action::HostRebooted, "from an earlier boot"),
            (
                Action::Orphan { why: Due::Lease },
                "wrapper gone, lease expired",
            ),
            (
                Action::Orphan { why: Due::Timeout },
                "wrapper gone, timeout expired",
            ),
            (
                Action::Orphan {
                    why: Due::WrapperLost,
                },
                "wrapper gone",
            ),
            (
                Action::Stuck { why: Due::Lease },
                "wrapper stuck past its lease",
            ),
            (
                Action::Stuck { why: Due::Timeout },
                "wrapper stuck past its timeout",
            ),
            (
                Action::LostLaunch,
                "no record: a lost launch or a removed record",
            ),
        ];
        for (action, said) in cases {
            assert_eq!(action.to_string(), said, "{action:?}");
        }
        let reasons = [
            (Due::Lease, "lease_expired"),
            (Due::Timeout, "timeout"),
            (Due::WrapperLost, "wrapper_lost"),
        ];
        for (due, reason) in reasons {
            assert_eq!(due.reason().to_string(), reason, "{due:?}");
        }
    }

    #[test]
    fn the_orphan_grace_does_not_ask_when_the_wrapper_went_if_a_deadline_is_known() {
        let asked = Cell::new(false);
        decide_gone(
            1000.0,
            Some((2000.0, Due::Lease)),
            &policy(),
            || {
                asked.set(true);
                None
            },
            || Some(true),
        );
        assert!(!asked.get());
    }

    #[test]
    fn a_decision_that_needs_the_look_before_it_is_there_waits_for_it() {
        let p = policy();
        // Not due yet: whether anything remains decides, and the look is not there.
        assert_eq!(
            decide_gone(1000.0, Some((2000.0, Due::Lease)), &p, || None, || None),
            None
        );
        // Due: no look needed.
        assert_eq!(
            decide_gone(3000.0, Some((2000.0, Due::Lease)), &p, || None, || None),
            Some((Action::Orphan { why: Due::Lease }, None))
        );
    }
}
