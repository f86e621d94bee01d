//! What the watchdog should do about one run dir, decided from kernel facts first ([`Look`]:
//! who holds the run's lock, its cgroup found by name) and its files second. Pure decision, no
//! action: [`crate::act`] carries it out.
//!
//! - final and believed (no live wrapper that did not write it, no process in its cgroup):
//!   nothing (forgotten). A final record the kernel contradicts is reopened and stopped when
//!   nobody holds the run, and watched while its wrapper lives;
//! - from an earlier boot, with nothing of it held: `unknown`, `host_rebooted`, nothing
//!   signalled (those pids belong to this boot's processes now);
//! - wrapper alive: the wrapper's business, unless its lease or its `--timeout` is past
//!   deadline + grace + slack, or it has been stopping its run for longer than its grace +
//!   slack (it is stopped, frozen or stuck): then the watchdog takes it over;
//! - wrapper gone: if processes of the run remain, the watchdog owns them and stops them when the
//!   lease or the timeout expires, whichever is first (or after the orphan grace without
//!   either); if none remain, at once.
//!
//! A record that is missing or damaged does not make a run unstoppable: its wrapper and cgroup
//! are the kernel's to show. While the wrapper lives, its deadline is the one it publishes in
//! its heartbeat thread's name ([`heartbeat::published_due`]), which the workload cannot
//! write; lease.json and the record's `started_at` + `timeout_ms` only for a wrapper that
//! publishes none. Once the wrapper is gone, the heartbeat and lease.json (files the workload
//! can write) only ever bring a deadline earlier than what was seen while it lived ([`Seen`]).

pub use crate::decide::{decide_alive, delay_until, Action, Alive, Due, Policy};
use crate::decide::{decide_gone, earliest, first_due};
use agent_run_shared::heartbeat::{self, DueKind};
use agent_run_shared::id::RunId;
use agent_run_shared::lifecycle::timings_of;
use agent_run_shared::procfs;
use agent_run_shared::procfs::LockTable;
use agent_run_shared::procset::{discover_in, Depth, Snapshot};
use agent_run_shared::record::Status;
use agent_run_shared::root::Root;
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::stop::Timings;
use agent_run_shared::verdict::{Look, Shared};
use agent_run_shared::wrapper::Holder;
use std::cell::OnceCell;
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::time::Duration;

/// How long a run dir may exist without a record before its launch counts as lost.
pub const LOST_LAUNCH_AFTER: Duration = Duration::from_secs(10);

/// What a pass (or a burst of events) looks at once, on first need, for every run it
/// assesses: the processes, the run cgroups on the cgroup2 mount, and /proc/locks.
#[derive(Default)]
pub struct Looks {
    pub procs: OnceCell<Snapshot>,
    pub cgroups: OnceCell<agent_run_shared::cgroup::RunCgroups>,
    pub locks: OnceCell<LockTable>,
    /// The look at /proc is the caller's to take (the daemon's pass takes it on a thread of its
    /// own, so that a look of a big process table does not hold up the deadlines): a run that
    /// needs it before it is there gets [`Verdict::NeedsLook`].
    pub deferred: bool,
}

impl Looks {
    /// The look at /proc a pass (`whole_pass`: indexed, every marker read once, for thousands
    /// of lookups) or a single event (plain: markers read lazily) takes.
    pub fn take_procs(whole_pass: bool) -> Snapshot {
        if whole_pass {
            Snapshot::take_indexed()
        } else {
            Snapshot::take()
        }
    }
}

/// The verdict on one run dir.
pub enum Verdict {
    /// Final, or not a run: nothing to do.
    Done,
    /// Unusable dir (unsafe, foreign): skipped, with the reason.
    Skip(String),
    /// Alive wrapper (pinned), to be looked at again at `recheck_epoch`.
    Watch {
        wrapper: OwnedFd,
        recheck_epoch: Option<f64>,
    },
    /// Wrapper gone, processes remain: act at `act_epoch`.
    Later { act_epoch: f64, action: Action },
    /// Act now.
    Now(Action),
    /// The decision needs the look at /proc, which is not there yet ([`Looks::deferred`]):
    /// assess the run again once it is.
    NeedsLook,
}

/// What the watchdog remembers of a run between looks (the daemon in memory, `--once` in the
/// root's watch ledger, [`crate::watched`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Seen {
    /// When the watchdog first saw the wrapper gone (epoch seconds).
    pub orphan_since: Option<f64>,
    /// The lease deadline: the last one seen while the wrapper lived (the wrapper keeps
    /// lease.json signed by the run's token), then only ever earlier (once the wrapper is gone
    /// the file is the workload's to write).
    pub last_lease: Option<f64>,
    /// When it first saw the live wrapper stopping its run (its signal mask, or a
    /// `cancelling` record).
    pub stopping_since: Option<f64>,
}

/// A run dir the watchdog looks at.
pub struct Subject {
    pub dir: RunDir,
    /// The record, when it could be read.
    pub status: Option<Status>,
    /// The lease deadline assessed (epoch seconds), if the run has one.
    pub lease: Option<f64>,
    /// Why lease.json could not be read, when it is damaged (the deadline is then the last
    /// valid one, or the orphan grace).
    pub lease_damaged: Option<String>,
    /// Why status.json could not be read, when it is damaged (not merely missing).
    pub record_damaged: Option<String>,
    /// What the watchdog saw, to remember for the next look.
    pub seen: Seen,
}

impl Subject {
    /// The run's id, for messages.
    pub fn id(&self) -> &str {
        self.dir.id().as_str()
    }
}

/// Decide about `name` under `root`, with what the watchdog remembers of it (`seen`); `now` is
/// the current epoch time. `looks` are shared by every run of a pass (taken on first use);
/// `whole_pass` takes the look at /proc indexed (every marker read once, for thousands of
/// lookups), a single event takes it plain.
pub fn assess(
    root: &Root,
    name: &str,
    now: f64,
    seen: Seen,
    policy: &Policy,
    looks: &Looks,
    whole_pass: bool,
) -> (Verdict, Option<Subject>) {
    let id = match RunId::parse(name) {
        Ok(id) => id,
        Err(e) => return (Verdict::Skip(e.to_string()), None),
    };
    let dir = match root.open_run_dir(&id) {
        Ok(d) => d,
        Err(e) => return (Verdict::Skip(e.to_string()), None),
    };
    if let Some(what) = dir.repaired() {
        // Opening the dir set its mode back (the workload can chmod its own dir): said.
        crate::report::log(&format!("{name}: {what}"));
        let _ = dir
            .journal("watchdog")
            .event("damaged", serde_json::json!({"what": what}));
    }
    let shared = Shared {
        locks: Some(looks.locks.get_or_init(LockTable::read)),
        cgroups: Some(
            looks
                .cgroups
                .get_or_init(agent_run_shared::cgroup::run_cgroups),
        ),
        cgroup: None,
    };
    let mut look = Look::take_with(&dir, dir.read_status(), &shared);
    if look.believed().is_some() {
        return (believed(&look), None);
    }
    if matches!(look.holder, Holder::Nobody | Holder::Squatter(_)) && dir.lock_held() != Some(false)
    {
        // The pass's read of /proc/locks may be older than a launch that took its lock since:
        // "nobody holds it" is what the watchdog acts on, so it is asked of the kernel afresh
        // (the lock itself says "nobody" cheaply; who holds it, only /proc/locks).
        let fresh = Shared {
            locks: None,
            ..shared
        };
        look = Look::take_with(&dir, dir.read_status(), &fresh);
        if look.believed().is_some() {
            return (believed(&look), None);
        }
    }
    let (lease, lease_damaged) = match dir.read_lease() {
        Ok(l) => (l.map(|l| l.deadline_epoch), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut subject = Subject {
        dir,
        status: look.record.as_ref().ok().cloned(),
        lease,
        lease_damaged,
        record_damaged: match &look.record {
            Err(e) if !verdict_missing(e) => Some(e.to_string()),
            _ => None,
        },
        seen,
    };
    let snapshot = || -> Option<&Snapshot> {
        if looks.deferred {
            return looks.procs.get();
        }
        Some(looks.procs.get_or_init(|| Looks::take_procs(whole_pass)))
    };
    let verdict = match &look.holder {
        Holder::Wrapper(w) => alive(&look, w, &mut subject, now, policy),
        // Another party (a cancel, a watchdog of an earlier pass) is finishing it.
        Holder::Party(_) => Verdict::Done,
        Holder::Nobody | Holder::Squatter(_) => {
            gone(&look, &mut subject, now, policy, snapshot, looks.deferred)
        }
    };
    (verdict, Some(subject))
}

/// A final record the kernel does not contradict: done, unless nobody holds the run and its
/// cgroup is still there (whoever writes a final record removes it): then it is looked at
/// under the lock for a process that may have left it.
fn believed(look: &Look) -> Verdict {
    if look.cgroup.is_some() && matches!(look.holder, Holder::Nobody) {
        return Verdict::Now(Action::CgroupLeft);
    }
    Verdict::Done
}

/// A run whose wrapper lives: watched, unless its deadline + grace + slack, or its stop's
/// grace + slack, is past.
fn alive(
    look: &Look,
    w: &agent_run_shared::wrapper::VerifiedWrapper,
    s: &mut Subject,
    now: f64,
    policy: &Policy,
) -> Verdict {
    s.seen.orphan_since = None;
    let st = look.record.as_ref().ok();
    // The deadline the wrapper enforces, as it publishes it where the workload cannot write
    // (its heartbeat thread's name); lease.json and the record only for a wrapper that does
    // not publish one (an earlier version's).
    let published = heartbeat::published_due(w.pid());
    let due = match published {
        Some((t, DueKind::Lease)) => {
            s.seen.last_lease = Some(t);
            Some((t, Due::Lease))
        }
        Some((t, DueKind::Timeout)) => Some((t, Due::Timeout)),
        None => {
            if s.lease.is_some() {
                s.seen.last_lease = s.lease;
            }
            let lease = s.lease.or(s.seen.last_lease);
            first_due(lease, st.and_then(Status::timeout_deadline_epoch))
        }
    };
    let grace = st.map_or(Timings::default().grace, |st| timings_of(st).grace);
    let stopping = w.was_stopping()
        || st.is_some_and(|st| st.state == agent_run_shared::record::State::Cancelling);
    s.seen.stopping_since = if stopping {
        Some(s.seen.stopping_since.unwrap_or(now))
    } else {
        None
    };
    let fd = || w.fd().try_clone().ok();
    match decide_alive(now, due, grace.as_secs_f64(), policy) {
        Alive::Stuck(why) => Verdict::Now(Action::Stuck { why }),
        Alive::Watch { recheck_epoch } => {
            // A stop that does not end: stuck too, lease or not.
            let stalled = s
                .seen
                .stopping_since
                .map(|t| t + grace.as_secs_f64() + policy.slack.as_secs_f64());
            if stalled.is_some_and(|t| now >= t) {
                return Verdict::Now(Action::Stuck { why: Due::Stalled });
            }
            let recheck = [recheck_epoch, stalled]
                .into_iter()
                .flatten()
                .reduce(f64::min);
            match fd() {
                Some(wrapper) => Verdict::Watch {
                    wrapper,
                    recheck_epoch: recheck,
                },
                None => Verdict::Skip("cannot hold the wrapper's pidfd".into()),
            }
        }
    }
}

/// A run that nobody holds (its wrapper is gone) or that a squatter holds.
fn gone<'a>(
    look: &Look,
    s: &mut Subject,
    now: f64,
    policy: &Policy,
    snapshot: impl Fn() -> Option<&'a Snapshot>,
    deferred: bool,
) -> Verdict {
    let _ = deferred;
    // Known gone since: the first time a look saw it, or the bound its last heartbeat gives
    // (which only ever brings that earlier: a workload can touch `lock`, never move the
    // first sight later).
    let first_seen = s.seen.orphan_since.unwrap_or(now);
    let gone_since = [Some(first_seen), s.dir.gone_by(now)]
        .into_iter()
        .flatten()
        .reduce(f64::min);
    s.seen.orphan_since = Some(first_seen);
    s.seen.stopping_since = None;
    // Without its wrapper, lease.json is the workload's to write: a deadline read now only ever
    // brings the one seen before earlier.
    s.seen.last_lease = earliest(s.lease, s.seen.last_lease);
    let st = match &look.record {
        Ok(st) => st,
        Err(e) => {
            // No record to go by: a launch that died before its first one, or a record the
            // workload removed or damaged. Nothing of it held, no cgroup: a lost launch (given
            // a moment to write its first record); else an orphan like any other.
            if verdict_missing(e) && look.cgroup.is_none() {
                let age = s.dir.stat_file(".").and_then(|m| m.modified.elapsed().ok());
                if age.is_some_and(|a| a >= LOST_LAUNCH_AFTER) {
                    return Verdict::Now(Action::LostLaunch);
                }
                return Verdict::Later {
                    act_epoch: now + LOST_LAUNCH_AFTER.as_secs_f64(),
                    action: Action::LostLaunch,
                };
            }
            let due = first_due(s.seen.last_lease, None);
            return orphan_when(now, due, policy, || gone_since, || Some(true));
        }
    };
    if st.state.is_final() {
        // Contradicted (the verdict did not believe it): reopened and stopped now.
        return Verdict::Now(Action::Contradicted);
    }
    if st.boot_id != procfs::boot_id() && !look.populated {
        // Pids from another boot name this boot's processes: signal nothing. Unless processes
        // carrying this run's marker are alive: then the run is of this boot and the record
        // was rewritten.
        let Some(snap) = snapshot() else {
            return Verdict::NeedsLook;
        };
        if !marked_alive(&s.dir, st, snap) {
            return Verdict::Now(Action::HostRebooted);
        }
    }
    let due = first_due(s.seen.last_lease, st.timeout_deadline_epoch());
    let populated = look.populated;
    let dir = s.dir.clone();
    let st = st.clone();
    orphan_when(
        now,
        due,
        policy,
        || gone_since,
        || Some(populated || snapshot().map(|snap| remains(&dir, &st, snap))?),
    )
}

/// [`decide_gone`] as a verdict.
fn orphan_when(
    now: f64,
    due: Option<(f64, Due)>,
    policy: &Policy,
    gone_since: impl FnOnce() -> Option<f64>,
    remains: impl FnOnce() -> Option<bool>,
) -> Verdict {
    match decide_gone(now, due, policy, gone_since, remains) {
        None => Verdict::NeedsLook,
        Some((action, None)) => Verdict::Now(action),
        Some((action, Some(act_epoch))) => Verdict::Later { act_epoch, action },
    }
}

fn verdict_missing(e: &agent_run_shared::Error) -> bool {
    agent_run_shared::verdict::is_missing(e)
}

/// Whether any live process carries this run's marker (its `AGENT_RUN_DIR` is this very dir).
fn marked_alive(dir: &RunDir, st: &Status, snap: &Snapshot) -> bool {
    let Some(mut scope) = dir.scope(st, None) else {
        return false;
    };
    // By marker alone, whenever it started: the record's pids and times are not to be trusted.
    scope.marker_only = true;
    scope.floor_ticks = 0;
    !discover_in(snap, &scope, Depth::WithMarker, &HashSet::new()).is_empty()
}

fn remains(dir: &RunDir, st: &Status, snap: &Snapshot) -> bool {
    dir.scope(st, None)
        .is_some_and(|s| !discover_in(snap, &s, Depth::WithMarker, &HashSet::new()).is_empty())
}
