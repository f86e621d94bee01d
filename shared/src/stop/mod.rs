//! THE stop routine: the only way agent-run ends a run's processes, from every path (a signal
//! to the wrapper, the leader exiting with leftovers, `cancel`, lease expiry, the watchdog).
//!
//! [`stop_run`] finds the run's process set ([`crate::procset`]), pins each member with a pidfd
//! and re-checks its start time through it, then escalates on deadlines:
//!
//! 1. t=0: TERM to all (the group through the leader's pidfd with `PIDFD_SIGNAL_PROCESS_GROUP`
//!    where the kernel has it), HUP at once to members whose TERM is ignored (SigIgn: they can run
//!    no TERM handler, so waiting gains nothing), CONT to stopped members;
//! 2. t=`hup_after`: HUP to whatever remains (skipped when `hup_after` is zero);
//! 3. t=`grace`: KILL to whatever remains, members that outlived the leader included;
//! 4. up to `confirm` more: wait until nothing remains; what does is reported as a survivor.
//!
//! Between deadlines it sleeps in one `poll(2)` on every member's pidfd and on an optional
//! escalation fd (the wrapper's signal pipe: a second TERM/INT/HUP skips to KILL at once); after
//! `cgroup.kill`, on the cgroup's `cgroup.events` alone until it is empty. When
//! every known member is gone it scans again (with the environment marker) and only finishes when
//! that scan is empty too, so processes forked mid-stop are caught. "Already gone" (ESRCH) is
//! success. Zombies count as gone.
//!
//! What it does not do: reap. Only a parent can, and an unreaped zombie leader still answers
//! `kill(pid, 0)`; the wrapper reaps its children after this returns. It never signals a bare
//! pid or pgid: every signal goes through a pidfd whose process was verified after opening.
//!
//! Here the schedule ([`stop_run`]: a first pass, the escalation, the end); in `look` the
//! looks and the pins, in `signal` the signals and `cgroup.kill`, in `wait` the poll
//! between deadlines, in `end` the survivors named and the report.

use crate::journal::Journal;
use crate::pid::Pid;
use crate::procfs::{self, Stat};
use crate::procset::{discover_in, Depth, RunScope, Snapshot};
use crate::reason::Reason;
use crate::record::{Cleanup, Proof};
pub use crate::signal::Sig;
use crate::sys;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod end;
mod look;
mod signal;
#[cfg(test)]
mod tests;
mod wait;

/// How soon a stop looks again when the run's processes vanish before they can be pinned.
const CHASE_STEP: Duration = Duration::from_millis(2);

/// How old a look at /proc may be for a stop's first pass.
const FIRST_LOOK_AGE: Duration = Duration::from_millis(250);

/// How soon `cgroup.kill` is written again while the cgroup is still populated after KILL.
const KILL_AGAIN: Duration = Duration::from_millis(10);

/// How many times `cgroup.kill` is written in one stop, at most.
const KILL_AGAIN_MAX: u32 = 100;

/// The longest grace a run may ask for (`--grace`), and the most that anyone reading a record
/// (`cancel`, the watchdog) honours: the run can rewrite its record's `grace_ms`, and a forged
/// hour held a takeover's KILL, and the watchdog's other runs, for that hour.
pub const MAX_GRACE: Duration = Duration::from_secs(300);

/// The escalation timings of a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// TERM -> HUP step; zero disables every HUP.
    pub hup_after: Duration,
    /// TERM -> KILL.
    pub grace: Duration,
    /// How long after KILL to wait for the last members to go.
    pub confirm: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            hup_after: Duration::from_millis(500),
            grace: Duration::from_secs(5),
            confirm: Duration::from_secs(2),
        }
    }
}

/// Something that can cut the grace short: a descriptor to poll and a check to run when it is
/// readable (it must drain the descriptor). `true` means "KILL now".
pub trait Escalation {
    fn fd(&self) -> BorrowedFd<'_>;
    fn kill_now(&mut self) -> bool;
}

/// What a stop did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Signals in the order first sent (TERM, HUP, KILL; CONT is journalled, not listed).
    pub signals: Vec<Sig>,
    pub duration: Duration,
    /// Members still alive at the end.
    pub survivors: Vec<Pid>,
    /// Every member that was signalled.
    pub signalled: Vec<Pid>,
    /// A second stop request cut the grace short.
    pub escalated: bool,
    /// The leader's wait status, when the stop reaped it (a stop inside the wrapper reaps the
    /// children it finds dead, so that the kernel's count of children is the truth).
    pub leader_exit: Option<sys::WaitStatus>,
    /// How the stop knows nothing of the run is left (None when something is).
    pub proof: Option<Proof>,
    /// Processes that may be the run's outside its cgroup (see [`crate::escape`]); the
    /// caller that looked for them sets this.
    pub escapees: Vec<Pid>,
}

impl Report {
    /// The `cleanup` key of the record.
    pub fn to_cleanup(&self) -> Cleanup {
        Cleanup {
            signals: self.signals.iter().map(|s| s.name()).collect(),
            duration_ms: self.duration.as_millis() as u64,
            survivors: self.survivors.iter().map(|&p| p.into()).collect(),
            signalled: self.signalled.iter().map(|&p| p.into()).collect(),
            escapees: self.escapees.iter().map(|&p| p.into()).collect(),
        }
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Term,
    Hup,
    Kill,
}

struct Member {
    stat: Stat,
    /// None when pidfds are unavailable (old kernel): then liveness is polled through /proc.
    fd: Option<OwnedFd>,
    gone: bool,
}

struct Stopper<'a> {
    scope: &'a RunScope,
    reason: Reason,
    journal: Option<&'a Journal>,
    t0: Instant,
    members: HashMap<Pid, Member>,
    report: Report,
    hup_enabled: bool,
    /// The run's cgroup.events, polled (POLLPRI) for `populated` to change.
    events: Option<std::fs::File>,
    /// What the last look found of the run that is not pinned (gone before its pidfd opened).
    seen_last: Vec<Stat>,
    /// When the last look was asked for.
    last_look: Option<Instant>,
    /// Of a run held by scanning alone (no wrapper, no cgroup): the pids its processes begun
    /// since the first look can have, while the pid counter cannot have come around, and that
    /// look (its processes of older pids are the run's only ones there).
    floor: Option<(crate::procset::PidFloor, Arc<Snapshot>)>,
    /// When `cgroup.kill` was last written, and how often: after the KILL step it is written
    /// again while the cgroup is still populated (a process moved in after the kill), at most
    /// every [`KILL_AGAIN`], up to [`KILL_AGAIN_MAX`] times.
    cgroup_killed: Option<(Instant, u32)>,
}

/// What a look says once every known member is gone.
enum Gone {
    /// Nothing of the run is left: the stop is done.
    Done,
    /// Look again at once.
    LookAgain,
    /// Something may be left: on to the deadlines.
    Wait,
}

/// Stop the run's processes: TERM, HUP, KILL on deadlines, until none is left or `confirm` has
/// passed after KILL. `reason` goes into every journal line.
pub fn stop_run(
    scope: &RunScope,
    timings: &Timings,
    reason: Reason,
    journal: Option<&Journal>,
    mut escalation: Option<&mut dyn Escalation>,
) -> Report {
    crate::procset::ACTIVE_STOPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut s = Stopper::new(scope, timings, reason, journal);
    let depth = s.first_pass();
    s.escalate(timings, depth, escalation.as_mut().map(|e| &mut **e as _));
    let report = s.finish();
    crate::procset::ACTIVE_STOPS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    report
}

impl<'a> Stopper<'a> {
    fn new(
        scope: &'a RunScope,
        timings: &Timings,
        reason: Reason,
        journal: Option<&'a Journal>,
    ) -> Stopper<'a> {
        Stopper {
            scope,
            reason,
            journal,
            t0: Instant::now(),
            members: HashMap::new(),
            report: Report::default(),
            hup_enabled: !timings.hup_after.is_zero(),
            events: scope.cgroup.as_ref().and_then(|c| c.events_fd()),
            seen_last: Vec::new(),
            last_look: None,
            floor: None,
            cgroup_killed: None,
        }
    }

    /// TERM to the run as a first look finds it; returns how deep the later looks go.
    fn first_pass(&mut self) -> Depth {
        // TERM first to what one stat pass finds (group, session, wrapper descendants): the common
        // case is signalled before any environment is read. Without a live wrapper (cancel after its
        // death, the watchdog) escapees are found only by their marker: look for them right after,
        // so they get TERM and its grace too, not only the KILL at the end.
        let depth = if self.scope.wrapper.is_some() {
            Depth::Tree
        } else {
            Depth::WithMarker
        };
        // One look at /proc serves both: the stat pass, then the markers of what it did not match.
        // A look that began a little before this stop serves its first pass: anything forked
        // since is found by the later looks (the stop ends only on a look that began after its
        // last known member was gone), and the TERMs of many stops at once (a cancel of many runs,
        // leases expiring together) go out without a scan each.
        // Inside the wrapper, a look of its tree does (see [`Stopper::tree_look`]); in a
        // cgroup without the wrapper, the cgroup does (see [`Stopper::cgroup_look`]).
        let snap = match self.own_look(depth) {
            Some(own) => own,
            None => Snapshot::since(
                self.t0.checked_sub(FIRST_LOOK_AGE).unwrap_or(self.t0),
                self.scope.newer_than(),
            ),
        };
        // Held by scanning alone, every later look would read the whole table again (a quiet
        // look needs two in a row): from a first look of every pid, they read only the pids
        // handed out since, while no wrap of the pid counter is possible.
        if self.scope.wrapper.is_none() && self.scope.cgroup.is_none() {
            self.floor = snap.pid_floor().map(|f| (f, Arc::clone(&snap)));
        }
        let mut first = self.adopt_in(&snap, Depth::Tree);
        self.signal(&first, Level::Term);
        if depth == Depth::WithMarker {
            let marked = self.adopt_in(&snap, Depth::WithMarker);
            self.signal(&marked, Level::Term);
            first.extend(marked);
        }
        drop(snap);
        if !first.is_empty() {
            self.journal_event("stop_begin", json!({ "members": first }));
        }
        depth
    }

    /// The schedule: TERM, HUP, KILL on their deadlines, with a look at each, until the run is
    /// gone or the confirm window after KILL has passed. A second stop request (`escalation`)
    /// skips to KILL.
    fn escalate(
        &mut self,
        timings: &Timings,
        depth: Depth,
        mut escalation: Option<&mut dyn Escalation>,
    ) {
        let hup_at = self.t0 + timings.hup_after;
        let mut kill_at = self.t0 + timings.grace;
        let mut level = Level::Term;
        let mut confirm_until = None::<Instant>;
        // Looks in a row that found nothing of the run (procfs: two are needed to call it done).
        let mut quiet_looks = 0;
        loop {
            if level == Level::Kill {
                self.kill_cgroup_again();
            }
            if self.live().is_empty() {
                match self.when_all_gone(level, &mut quiet_looks) {
                    Gone::Done => break,
                    Gone::LookAgain => continue,
                    Gone::Wait => {}
                }
            }
            let now = Instant::now();
            let deadline = deadline_of(level, self.hup_enabled.then_some(hup_at), kill_at, || {
                *confirm_until.get_or_insert(now + timings.confirm)
            });
            if now >= deadline {
                level = match level_after(level, deadline, &mut kill_at, now) {
                    Some(next) => next,
                    None => break,
                };
                // The members we know get the signal at the deadline itself; the look at /proc
                // (a full scan on a busy host: tens of ms) comes after, for what it adds.
                let known = self.live();
                self.signal(&known, level);
                let new = self.adopt(depth);
                self.signal(&new, level);
                continue;
            }
            // Nothing pinned to wait on (the last look saw only processes gone before they
            // could be pinned): look again soon.
            let step = if self.live().is_empty() {
                (deadline - now).min(CHASE_STEP)
            } else {
                deadline - now
            };
            let esc = escalation.as_mut().map(|e| &mut **e as _);
            if self.wait(step, esc) && level < Level::Kill {
                self.report.escalated = true;
                self.journal_event("stop_escalated", json!({}));
                level = Level::Kill;
                kill_at = Instant::now();
                let mut all = self.adopt(Depth::Tree);
                all.extend(self.live());
                self.signal(&all, Level::Kill);
            }
        }
    }

    /// Everything we know of is gone: look once more, deeper, before calling it done.
    fn when_all_gone(&mut self, level: Level, quiet_looks: &mut u32) -> Gone {
        let late = self.adopt(Depth::WithMarker);
        if !late.is_empty() {
            *quiet_looks = 0;
            self.signal(&late, level);
            return Gone::LookAgain;
        }
        if !self.seen_last.is_empty() || !self.live_children().is_empty() {
            // The look saw processes of the run that were gone before they could be
            // pinned (a process that forks and exits in a loop), or the kernel still counts
            // a live child of the wrapper (a subreaper: while any process of its tree lives,
            // it has a live child): not a quiet look. Go on to the deadlines and look again
            // shortly; what is still there at the end is named.
            *quiet_looks = 0;
            return Gone::Wait;
        }
        match &self.scope.cgroup {
            // The kernel's own account: nothing of the subtree is left.
            Some(cg) if !cg.populated() => Gone::Done,
            // Something of the cgroup lives that cannot be taken in (it is not ours to
            // signal by pidfd: older than the run): wait on the deadlines, and KILL through
            // cgroup.kill at the grace.
            Some(_) => Gone::Wait,
            // By scanning alone: a process forked between a scan and the exit of its parent
            // can be missed by one look; two in a row that find nothing are the bar.
            None => {
                *quiet_looks += 1;
                if *quiet_looks >= 2 {
                    Gone::Done
                } else {
                    Gone::LookAgain
                }
            }
        }
    }

    fn journal_event(&self, event: &str, fields: serde_json::Value) {
        if let Some(j) = self.journal {
            let _ = j.event(event, fields);
        }
    }
}

/// The schedule's next deadline at `level`: TERM waits for the HUP step (`hup_at`, None when
/// HUP is disabled) if it comes before the KILL at `kill_at`, else for the KILL; HUP waits for
/// the KILL; KILL for the end of the confirm window (asked for once KILL is out).
fn deadline_of<T: PartialOrd + Copy>(
    level: Level,
    hup_at: Option<T>,
    kill_at: T,
    confirm_until: impl FnOnce() -> T,
) -> T {
    match level {
        Level::Term => match hup_at {
            Some(h) if h < kill_at => h,
            _ => kill_at,
        },
        Level::Hup => kill_at,
        Level::Kill => confirm_until(),
    }
}

/// The level after `level`'s `deadline` passed at `now`: HUP after a TERM whose deadline was
/// the HUP step, else KILL, which moves `kill_at` to `now` (when it goes out); None after KILL
/// (the stop is over).
fn level_after<T: PartialOrd + Copy>(
    level: Level,
    deadline: T,
    kill_at: &mut T,
    now: T,
) -> Option<Level> {
    let next = match level {
        Level::Term if deadline < *kill_at => Level::Hup,
        Level::Term | Level::Hup => Level::Kill,
        Level::Kill => return None,
    };
    if next == Level::Kill {
        *kill_at = now;
    }
    Some(next)
}
