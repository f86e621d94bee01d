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
//! escalation fd (the wrapper's signal pipe: a second TERM/INT/HUP skips to KILL at once). When
//! every known member is gone it scans again (with the environment marker) and only finishes when
//! that scan is empty too, so processes forked mid-stop are caught. "Already gone" (ESRCH) is
//! success. Zombies count as gone.
//!
//! What it does not do: reap. Only a parent can, and an unreaped zombie leader still answers
//! `kill(pid, 0)`; the wrapper reaps its children after this returns. It never signals a bare
//! pid or pgid: every signal goes through a pidfd whose process was verified after opening.

use crate::journal::Journal;
use crate::pid::Pid;
use crate::procfs::{self, Stat};
use crate::procset::{discover_in, Depth, RunScope, Snapshot};
use crate::record::{Cleanup, Proof};
pub use crate::signal::Sig;
use crate::sys;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            survivors: self.survivors.iter().map(|p| p.get()).collect(),
            signalled: self.signalled.iter().map(|p| p.get()).collect(),
            escapees: self.escapees.iter().map(|p| p.get()).collect(),
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
    reason: &'a str,
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

/// Stop the run's processes: TERM, HUP, KILL on deadlines, until none is left or `confirm` has
/// passed after KILL. `reason` goes into every journal line.
pub fn stop_run(
    scope: &RunScope,
    timings: &Timings,
    reason: &str,
    journal: Option<&Journal>,
    mut escalation: Option<&mut dyn Escalation>,
) -> Report {
    crate::procset::ACTIVE_STOPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let report = stop_run_inner(
        scope,
        timings,
        reason,
        journal,
        escalation.as_mut().map(|e| &mut **e as _),
    );
    crate::procset::ACTIVE_STOPS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    report
}

fn stop_run_inner(
    scope: &RunScope,
    timings: &Timings,
    reason: &str,
    journal: Option<&Journal>,
    mut escalation: Option<&mut dyn Escalation>,
) -> Report {
    let mut s = Stopper {
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
    };
    let hup_at = s.t0 + timings.hup_after;
    let mut kill_at = s.t0 + timings.grace;
    let mut level = Level::Term;
    let mut confirm_until = None::<Instant>;

    // TERM first to what one stat pass finds (group, session, wrapper descendants): the common
    // case is signalled before any environment is read. Without a live wrapper (cancel after its
    // death, the watchdog) escapees are found only by their marker: look for them right after,
    // so they get TERM and its grace too, not only the KILL at the end.
    let depth = if scope.wrapper.is_some() {
        Depth::Tree
    } else {
        Depth::WithMarker
    };
    // One look at /proc serves both: the stat pass, then the markers of what it did not match.
    // A look that began a little before this stop serves its first pass: anything forked
    // since is found by the later looks (the stop ends only on a look that began after its
    // last known member was gone), and the TERMs of many stops at once (a cancel of many runs,
    // leases expiring together) go out without a scan each.
    // Inside the wrapper, a look of its tree does (see [`Stopper::tree_look`]).
    let snap = match s.tree_look(depth) {
        Some(tree) => tree,
        None => Snapshot::since(
            s.t0.checked_sub(FIRST_LOOK_AGE).unwrap_or(s.t0),
            scope.newer_than(),
        ),
    };
    // Held by scanning alone, every later look would read the whole table again (a quiet
    // look needs two in a row): from a first look of every pid, they read only the pids
    // handed out since, while no wrap of the pid counter is possible.
    if scope.wrapper.is_none() && scope.cgroup.is_none() {
        s.floor = snap.pid_floor().map(|f| (f, Arc::clone(&snap)));
    }
    let mut first = s.adopt_in(&snap, Depth::Tree);
    s.signal(&first, Level::Term);
    if depth == Depth::WithMarker {
        let marked = s.adopt_in(&snap, Depth::WithMarker);
        s.signal(&marked, Level::Term);
        first.extend(marked);
    }
    drop(snap);
    if !first.is_empty() {
        s.journal_event("stop_begin", json!({ "members": pids(&first) }));
    }

    // Looks in a row that found nothing of the run (procfs: two are needed to call it done).
    let mut quiet_looks = 0;
    loop {
        if level == Level::Kill {
            s.kill_cgroup_again();
        }
        if s.live().is_empty() {
            // Everything we know of is gone: look once more, deeper, before calling it done.
            let late = s.adopt(Depth::WithMarker);
            if !late.is_empty() {
                quiet_looks = 0;
                s.signal(&late, level);
                continue;
            }
            if !s.seen_last.is_empty() || !s.live_children().is_empty() {
                // The look saw processes of the run that were gone before they could be
                // pinned (a process that forks and exits in a loop), or the kernel still counts
                // a live child of the wrapper (a subreaper: while any process of its tree lives,
                // it has a live child): not a quiet look. Go on to the deadlines and look again
                // shortly; what is still there at the end is named.
                quiet_looks = 0;
            } else {
                match &scope.cgroup {
                    // The kernel's own account: nothing of the subtree is left.
                    Some(cg) if !cg.populated() => break,
                    // Something of the cgroup lives that cannot be taken in (it is not ours to
                    // signal by pidfd: older than the run): wait on the deadlines, and KILL through
                    // cgroup.kill at the grace.
                    Some(_) => {}
                    // By scanning alone: a process forked between a scan and the exit of its parent
                    // can be missed by one look; two in a row that find nothing are the bar.
                    None => {
                        quiet_looks += 1;
                        if quiet_looks >= 2 {
                            break;
                        }
                        continue;
                    }
                }
            }
        }
        let now = Instant::now();
        let deadline = deadline_of(level, s.hup_enabled.then_some(hup_at), kill_at, || {
            *confirm_until.get_or_insert(now + timings.confirm)
        });
        if now >= deadline {
            level = match level_after(level, deadline, &mut kill_at, now) {
                Some(next) => next,
                None => break,
            };
            // The members we know get the signal at the deadline itself; the look at /proc
            // (a full scan on a busy host: tens of ms) comes after, for what it adds.
            let known = s.live();
            s.signal(&known, level);
            let new = s.adopt(depth);
            s.signal(&new, level);
            continue;
        }
        // Nothing pinned to wait on (the last look saw only processes gone before they could
        // be pinned): look again soon.
        let step = if s.live().is_empty() {
            (deadline - now).min(CHASE_STEP)
        } else {
            deadline - now
        };
        if s.wait(step, escalation.as_mut().map(|e| &mut **e as _)) && level < Level::Kill {
            s.report.escalated = true;
            s.journal_event("stop_escalated", json!({}));
            level = Level::Kill;
            kill_at = Instant::now();
            let mut all = s.adopt(Depth::Tree);
            all.extend(s.live());
            s.signal(&all, Level::Kill);
        }
    }

    // Only what is alive at the end: a member whose exit the wait did not see yet (a pid
    // hopper's generation that exited a moment ago) is not a survivor.
    s.report.survivors = s
        .live()
        .into_iter()
        .filter(|p| s.member_alive(*p))
        .collect();
    // By scanning alone, after the wrapper is gone: a process of the user that started after
    // the run and hides its environment may be the run's. It is not signalled, but named.
    // (Root reads every environment: nothing is hidden from it, and no look is needed.)
    if scope.wrapper.is_none() && scope.cgroup.is_none() && sys::geteuid() != 0 {
        // The last look serves (it began after the last member was seen gone); one of only
        // the newer pids, with the first look for the older ones.
        let snap = s.look(s.last_look.unwrap_or(s.t0));
        let mut hidden = crate::procset::unverifiable(scope, &snap);
        if let (Some(_), Some((_, first))) = (snap.min_pid(), &s.floor) {
            hidden.extend(crate::procset::unverifiable(scope, first));
            hidden.sort();
            hidden.dedup();
        }
        // Named with the escapees: it may have left the run, nothing proves it did.
        for p in hidden {
            if !s.members.contains_key(&p) && !s.report.escapees.contains(&p) {
                s.journal_event(
                    "unverified",
                    json!({"pid": p.get(), "why": "a process of the run's user, started after the run, whose environment cannot be read; not signalled"}),
                );
                s.report.escapees.push(p);
            }
        }
    }
    // What the last look saw of the run and never pinned, if it still lives (a process that
    // kept one step ahead of every look): named, so the run is not called clean.
    for st in std::mem::take(&mut s.seen_last) {
        if procfs::stat(st.pid)
            .is_some_and(|now| now.start_ticks == st.start_ticks && !now.is_dead())
            && !s.report.survivors.contains(&st.pid)
        {
            s.report.survivors.push(st.pid);
        }
    }
    // Inside the wrapper: a live child is a live descendant, whether a look saw it or not.
    for p in s.live_children() {
        if !s.report.survivors.contains(&p) {
            s.report.survivors.push(p);
        }
    }
    // Whatever the cgroup still holds is left of the run, known to us or not.
    if let Some(cg) = scope.cgroup.as_ref().filter(|c| c.populated()) {
        for p in cg.members() {
            if !s.report.survivors.contains(&p) && procfs::stat(p).is_some_and(|st| !st.is_dead()) {
                s.report.survivors.push(p);
            }
        }
    }
    // The recorded leader, alive and never taken in: the kernel could not confirm it as the
    // run's (not the live wrapper's child, no marker of this run), so it was not signalled. It
    // may still be the run's: the run is not clean while it lives.
    let leader = scope.leader;
    if !scope.marker_only
        && !s.members.contains_key(&leader.pid)
        && procfs::stat(leader.pid)
            .is_some_and(|st| st.start_ticks == leader.start_ticks && !st.is_dead())
    {
        s.journal_event(
            "unverified",
            json!({"pid": leader.pid.get(), "why": "the recorded leader is alive but is not the run's by any kernel fact; not signalled"}),
        );
        s.report.survivors.push(leader.pid);
    }
    s.report.proof = s.proof();
    s.report.survivors.sort();
    s.report.signalled.sort();
    s.report.signalled.dedup();
    s.report.duration = s.t0.elapsed();
    let r = &s.report;
    if !r.signals.is_empty() || !r.survivors.is_empty() {
        s.journal_event(
            "stop_end",
            json!({
                "signals": r.signals.iter().map(|x| x.name()).collect::<Vec<_>>(),
                "duration_ms": r.duration.as_millis() as u64,
                "survivors": pids(&r.survivors),
                "signalled": pids(&r.signalled),
            }),
        );
    }
    s.report
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

fn pids(p: &[Pid]) -> Vec<i32> {
    p.iter().map(|p| p.get()).collect()
}

impl Stopper<'_> {
    /// Discover members not yet tracked, pin each with a pidfd, and keep those whose start time
    /// still matches after the pidfd is open. Returns the new members.
    fn adopt(&mut self, depth: Depth) -> Vec<Pid> {
        let now = Instant::now();
        self.last_look = Some(now);
        let snap = match self.tree_look(depth) {
            Some(tree) => tree,
            None => self.look(now),
        };
        self.adopt_in(&snap, depth)
    }

    /// Inside the wrapper, for a look that reads no marker: the wrapper's tree alone, from the
    /// kernel's children lists, not every pid. The wrapper is a child subreaper that has lived
    /// since before the workload began, so every process the run forked is in its tree while it
    /// lives: an orphan is reparented to the nearest subreaper above it, which is the wrapper
    /// or a process of the run. The leader's group and session are in it too: a session is
    /// joined only by being forked in it (setsid makes a new one, setpgid moves only within
    /// one), and the leader's began with the leader. The cgroup's members are read from the
    /// cgroup as before. What the tree cannot hold, a process of someone else's that carries
    /// the run's marker, is what the looks with the marker are for: they still read every pid
    /// (the last look, when every known member is gone, is one). With 1,000 runs stopping at
    /// once, each wrapper's looks read a few processes instead of 3,000.
    fn tree_look(&self, depth: Depth) -> Option<Arc<Snapshot>> {
        if depth != Depth::Tree || self.scope.wrapper != Some(Pid::this()) {
            return None;
        }
        Snapshot::of_tree(Pid::this()).map(Arc::new)
    }

    /// A look at /proc that began no earlier than `since`: of the pids the run's processes can
    /// have (newer than its leader, or than the stop's first look, while no wrap of the pid
    /// counter is possible since), or of every pid.
    fn look(&self, since: Instant) -> Arc<Snapshot> {
        if let Some(min) = self.scope.newer_than() {
            return Snapshot::since(since, Some(min));
        }
        let Some((floor, _)) = self.floor.as_ref().filter(|(f, _)| f.holds_now()) else {
            return Snapshot::since(since, None);
        };
        let snap = Snapshot::since(since, Some(floor.pid));
        // The floor must hold until the look's last read of the pid counter, not only when
        // it was asked for.
        match snap.min_pid() {
            Some(_) if !floor.holds_at(snap.finished()) => Snapshot::since(since, None),
            _ => snap,
        }
    }

    /// [`Stopper::adopt`] over a given look at /proc.
    fn adopt_in(&mut self, snap: &Snapshot, depth: Depth) -> Vec<Pid> {
        let skip: HashSet<Pid> = self.members.keys().copied().collect();
        let mut new = Vec::new();
        let mut found = discover_in(snap, self.scope, depth, &skip);
        // Inside the wrapper (a child subreaper), every orphan of the run is a child of ours: ask
        // the kernel for them directly, so one that appeared after the look (a process that
        // forks and exits in a loop) is not missed.
        if self.scope.wrapper == Some(Pid::this()) {
            for c in procfs::children_of(Pid::this()) {
                if skip.contains(&c) || found.iter().any(|s| s.pid == c) {
                    continue;
                }
                if let Some(st) = procfs::stat(c).filter(|st| {
                    !st.is_dead()
                        && st.start_ticks >= self.scope.floor_ticks
                        && !self.scope.exclude.contains(&st.identity())
                }) {
                    found.push(st);
                }
            }
        }
        self.seen_last.clear();
        for st in found {
            let fd = match sys::pidfd_open(st.pid) {
                Ok(fd) => Some(fd),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    self.seen_last.push(st);
                    continue;
                }
                Err(_) => None,
            };
            // The check that matters: the process behind the pidfd is the one we scanned.
            match procfs::stat(st.pid) {
                Some(now) if now.start_ticks == st.start_ticks && !now.is_dead() => {}
                _ => {
                    self.seen_last.push(st);
                    continue;
                }
            }
            self.members.insert(
                st.pid,
                Member {
                    stat: st,
                    fd,
                    gone: false,
                },
            );
            new.push(st.pid);
        }
        new
    }

    /// Inside the wrapper (a child subreaper), the live children of the wrapper that are the
    /// run's, by the kernel's list of our children: every orphan of the run is reparented to
    /// us, so while any process of the run's tree lives we have a live child. Children found
    /// dead are reaped here (the leader's status is kept in the report), so the list stays the
    /// truth and their pids cannot be mistaken for new processes. Empty outside the wrapper.
    fn live_children(&mut self) -> Vec<Pid> {
        if self.scope.wrapper != Some(Pid::this()) {
            return Vec::new();
        }
        loop {
            let mut live = Vec::new();
            let mut reaped = false;
            for c in procfs::children_of(Pid::this()) {
                match procfs::stat(c) {
                    Some(st) if !st.is_dead() => {
                        if !self.scope.exclude.contains(&st.identity()) {
                            live.push(c);
                        }
                    }
                    _ => {
                        if let Ok(Some((p, ws))) = sys::waitpid_nohang(Some(c)) {
                            reaped = true;
                            if p == self.scope.leader.pid {
                                self.report.leader_exit = Some(ws);
                            }
                        }
                    }
                }
            }
            // A child that died since the list was read has handed its own children to us:
            // list again until a list shows no dead child.
            if !live.is_empty() || !reaped {
                return live;
            }
        }
    }

    /// How this stop knows that nothing of the run is left: its cgroup empty, or (inside the
    /// wrapper, a subreaper) no live child; else it cannot tell. None when something is left.
    fn proof(&mut self) -> Option<Proof> {
        if !self.report.survivors.is_empty() {
            return None;
        }
        if let Some(cg) = &self.scope.cgroup {
            return (!cg.populated()).then_some(Proof::CgroupEmpty);
        }
        if self.scope.wrapper == Some(Pid::this()) {
            return self.live_children().is_empty().then_some(Proof::TreeWalk);
        }
        Some(Proof::Unprovable)
    }

    /// Inside the wrapper (a child subreaper), reap every child that has ended, at every wake
    /// of the stop: a pid hopper leaves a zombie child of ours at each hop (thousands in a
    /// stop's grace), and only its parent can take them off the process table. The leader's
    /// status is kept in the report.
    fn reap_dead_children(&mut self) {
        if self.scope.wrapper != Some(Pid::this()) {
            return;
        }
        if let (Some(ws), _) = crate::reap::reap_all(Some(self.scope.leader.pid)) {
            self.report.leader_exit = Some(ws);
        }
    }

    /// `cgroup.kill` again, if the cgroup is still populated and the last write is at least
    /// [`KILL_AGAIN`] old (bounded by [`KILL_AGAIN_MAX`]).
    fn kill_cgroup_again(&mut self) {
        let Some(cg) = &self.scope.cgroup else {
            return;
        };
        let due = match self.cgroup_killed {
            Some((at, n)) => at.elapsed() >= KILL_AGAIN && n < KILL_AGAIN_MAX,
            None => true,
        };
        if due && cg.populated() {
            self.kill_cgroup();
        }
    }

    /// `cgroup.kill` on the run's cgroup (journalled like every signal).
    fn kill_cgroup(&mut self) {
        let Some(cg) = &self.scope.cgroup else {
            return;
        };
        let n = self.cgroup_killed.map_or(0, |(_, n)| n);
        self.cgroup_killed = Some((Instant::now(), n + 1));
        // When the KILL went out: before the write, which takes a while for many processes.
        let at_ms = self.t0.elapsed().as_millis() as u64;
        let r = cg.kill();
        if r.is_ok() && !self.report.signals.contains(&Sig::Kill) {
            self.report.signals.push(Sig::Kill);
        }
        self.journal_event(
            "signal",
            json!({
                "target": format!("cgroup:{}", cg.path().display()), "signal": "KILL",
                "reason": self.reason, "at_ms": at_ms, "error": r.err().map(|e| e.to_string()),
            }),
        );
    }

    fn live(&self) -> Vec<Pid> {
        self.members
            .iter()
            .filter(|(_, m)| !m.gone)
            .map(|(p, _)| *p)
            .collect()
    }

    /// Send the signals of `level` to `targets` (live members only). KILL to a run held in a
    /// cgroup also writes `cgroup.kill`, whether or not any member is known: the processes a
    /// look has not pinned yet (a pid hopper's newest generation, a process moved in from
    /// outside) are the cgroup's all the same.
    fn signal(&mut self, targets: &[Pid], level: Level) {
        if level == Level::Kill {
            self.kill_cgroup();
        }
        let targets: Vec<Pid> = targets
            .iter()
            .copied()
            .filter(|p| self.members.get(p).is_some_and(|m| !m.gone))
            .collect();
        if targets.is_empty() {
            return;
        }
        let point = match level {
            Level::Term => "after_term",
            Level::Hup => "after_hup",
            Level::Kill => "after_kill",
        };
        let main = match level {
            Level::Term => Sig::Term,
            Level::Hup if self.hup_enabled => Sig::Hup,
            Level::Hup => return,
            Level::Kill => Sig::Kill,
        };
        // The group, in one call through the leader's pidfd: it also reaches members forked
        // since the scan. Members outside the group get their own signal below.
        let leader = self.scope.leader.pid;
        let grouped = targets.contains(&leader) && self.send(leader, main, true);
        for &p in &targets {
            let m = &self.members[&p];
            let in_group = m.stat.pgid == leader.get();
            let stopped = m.stat.is_stopped() || procfs::stat(p).is_some_and(|s| s.is_stopped());
            if grouped && in_group {
                self.report.signalled.push(p);
            } else {
                self.send(p, main, false);
            }
            if level == Level::Term && self.hup_enabled && ignores_term(p) {
                self.send(p, Sig::Hup, false);
            }
            if stopped && level != Level::Kill {
                self.send(p, Sig::Cont, false);
            }
        }
        crate::fault::point(point);
    }

    /// One signal through a member's pidfd (`group`: to its whole process group). Returns
    /// whether it was delivered; ESRCH marks the member gone.
    fn send(&mut self, pid: Pid, sig: Sig, group: bool) -> bool {
        let Some(m) = self.members.get_mut(&pid) else {
            return false;
        };
        let result = match &m.fd {
            Some(fd) => sys::pidfd_send_signal(fd.as_fd(), sig.number(), group),
            None => send_without_pidfd(&m.stat, sig, group),
        };
        let target = if group {
            format!("group:{}", m.stat.pgid)
        } else {
            format!("pid:{pid}")
        };
        let ok = match &result {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                if !group {
                    m.gone = true;
                }
                false
            }
            Err(_) => false,
        };
        if ok {
            if sig != Sig::Cont && !self.report.signals.contains(&sig) {
                self.report.signals.push(sig);
            }
            self.report.signalled.push(pid);
        }
        let err = result.err().map(|e| e.to_string());
        let at_ms = self.t0.elapsed().as_millis() as u64;
        let start_ticks = m.stat.start_ticks;
        self.journal_event(
            "signal",
            json!({
                "target": target, "pid": pid.get(), "start_ticks": start_ticks,
                "signal": sig.name(), "reason": self.reason, "at_ms": at_ms, "error": err,
            }),
        );
        ok
    }

    /// Wait until a member goes, the escalation fd fires, or `timeout`. Returns true when the
    /// escalation asked for KILL now.
    fn wait(&mut self, timeout: Duration, esc: Option<&mut (dyn Escalation + '_)>) -> bool {
        let live: Vec<Pid> = self.live();
        let mut fds = Vec::with_capacity(live.len() + 1);
        let mut polled = Vec::with_capacity(live.len());
        let mut unpinned = false;
        for p in &live {
            match &self.members[p].fd {
                Some(fd) => {
                    fds.push(sys::PollFd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    polled.push(*p);
                }
                None => unpinned = true,
            }
        }
        let esc_index = esc.as_ref().map(|e| {
            fds.push(sys::PollFd {
                fd: e.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.len() - 1
        });
        // The cgroup emptying (or filling) wakes the wait too.
        if let Some(ev) = &self.events {
            fds.push(sys::PollFd {
                fd: ev.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            });
        }
        // Without pidfds, /proc is the only feedback: look again every 10 ms.
        let timeout = if unpinned {
            timeout.min(Duration::from_millis(10))
        } else {
            timeout
        };
        if sys::poll(&mut fds, Some(timeout)).is_err() {
            std::thread::yield_now();
        }
        self.reap_dead_children();
        for (i, p) in polled.iter().enumerate() {
            if fds[i].revents != 0 {
                self.mark_gone(*p);
            }
        }
        if let Some(ev) = &self.events {
            let i = fds.len() - 1;
            if fds[i].revents != 0 {
                // kernfs reports a change until the file is read again.
                use std::os::unix::fs::FileExt;
                let _ = ev.read_at(&mut [0u8; 128], 0);
            }
        }
        if unpinned {
            for p in &live {
                let m = &self.members[p];
                if m.fd.is_none() {
                    let alive = procfs::stat(*p)
                        .is_some_and(|s| s.start_ticks == m.stat.start_ticks && !s.is_dead());
                    if !alive {
                        self.mark_gone(*p);
                    }
                }
            }
        }
        match (esc, esc_index) {
            (Some(e), Some(i)) if fds[i].revents != 0 => e.kill_now(),
            _ => false,
        }
    }

    /// Whether a member is alive now: its pidfd not readable (any thread of it alive), or
    /// without one, its pid still its own and not dead.
    fn member_alive(&self, p: Pid) -> bool {
        let Some(m) = self.members.get(&p) else {
            return false;
        };
        match &m.fd {
            Some(fd) => {
                let mut fds = [sys::PollFd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                sys::poll(&mut fds, Some(Duration::ZERO)).is_ok_and(|n| n == 0)
            }
            None => procfs::stat(p)
                .is_some_and(|st| st.start_ticks == m.stat.start_ticks && !st.is_dead()),
        }
    }

    fn mark_gone(&mut self, p: Pid) {
        if let Some(m) = self.members.get_mut(&p) {
            m.gone = true;
            m.fd = None;
        }
    }

    fn journal_event(&self, event: &str, fields: serde_json::Value) {
        if let Some(j) = self.journal {
            let _ = j.event(event, fields);
        }
    }
}

fn ignores_term(p: Pid) -> bool {
    procfs::sig_dispositions(p).is_some_and(|d| d.ignores(libc::SIGTERM))
}

/// Fallback for kernels without pidfds: re-check the start time, then kill(2). The window
/// between the check and the kill is the one pidfds close; it is as small as we can make it.
fn send_without_pidfd(st: &Stat, sig: Sig, group: bool) -> std::io::Result<()> {
    match procfs::stat(st.pid) {
        Some(now) if now.start_ticks == st.start_ticks => {}
        _ => return Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
    }
    if group && st.pgid != st.pid.get() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    sys::kill(st.pid, sig.number(), group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The levels a stop reaches and when, for a run whose processes never go: the schedule of
    /// [`deadline_of`] and [`level_after`] driven as the loop drives it, time jumping to each
    /// deadline.
    fn schedule(t: Timings) -> Vec<(Level, Duration)> {
        let hup_at = (!t.hup_after.is_zero()).then_some(t.hup_after);
        let mut kill_at = t.grace;
        let mut confirm_until = None;
        let mut level = Level::Term;
        let mut now = Duration::ZERO;
        let mut out = vec![(Level::Term, now)];
        loop {
            let deadline = deadline_of(level, hup_at, kill_at, || {
                *confirm_until.get_or_insert(now + t.confirm)
            });
            now = now.max(deadline);
            level = match level_after(level, deadline, &mut kill_at, now) {
                Some(next) => next,
                None => break,
            };
            out.push((level, now));
        }
        out.push((level, now)); // the end of the confirm window
        out
    }

    #[test]
    fn term_hup_kill_on_their_deadlines() {
        let ms = Duration::from_millis;
        let timings = |hup, grace, confirm| Timings {
            hup_after: ms(hup),
            grace: ms(grace),
            confirm: ms(confirm),
        };
        use Level::*;
        let cases = [
            // The defaults: TERM, HUP at 500 ms, KILL at 5 s, 2 s to confirm.
            (
                Timings::default(),
                vec![(Term, 0), (Hup, 500), (Kill, 5000), (Kill, 7000)],
            ),
            (
                timings(100, 1000, 50),
                vec![(Term, 0), (Hup, 100), (Kill, 1000), (Kill, 1050)],
            ),
            // hup_after zero: no HUP step at all.
            (
                timings(0, 1000, 50),
                vec![(Term, 0), (Kill, 1000), (Kill, 1050)],
            ),
            // A HUP step at or after the grace never comes: KILL at the grace.
            (
                timings(1000, 1000, 50),
                vec![(Term, 0), (Kill, 1000), (Kill, 1050)],
            ),
            (
                timings(2000, 1000, 50),
                vec![(Term, 0), (Kill, 1000), (Kill, 1050)],
            ),
            // A HUP step just before the grace still comes.
            (
                timings(999, 1000, 50),
                vec![(Term, 0), (Hup, 999), (Kill, 1000), (Kill, 1050)],
            ),
            // No confirm window: the stop ends as KILL goes out.
            (
                timings(100, 1000, 0),
                vec![(Term, 0), (Hup, 100), (Kill, 1000), (Kill, 1000)],
            ),
            // Zero grace: KILL at once.
            (timings(500, 0, 50), vec![(Term, 0), (Kill, 0), (Kill, 50)]),
            (timings(0, 0, 0), vec![(Term, 0), (Kill, 0), (Kill, 0)]),
        ];
        for (t, want) in cases {
            let want: Vec<(Level, Duration)> =
                want.into_iter().map(|(l, at)| (l, ms(at))).collect();
            assert_eq!(schedule(t), want, "{t:?}");
        }
    }

    /// (level, its deadline, kill_at, now) -> (the next level, kill_at after): KILL goes out
    /// when it goes out (a late wake moves it, and so the confirm window, to `now`).
    #[test]
    fn each_level_leads_to_the_next_and_kill_moves_to_when_it_is_sent() {
        use Level::*;
        let cases = [
            // TERM whose deadline was the HUP step: HUP, the KILL stays where it was.
            (Term, 100, 1000, 100, Some(Hup), 1000),
            (Term, 100, 1000, 400, Some(Hup), 1000),
            // TERM whose deadline was the KILL: KILL, at now (late or not).
            (Term, 1000, 1000, 1000, Some(Kill), 1000),
            (Term, 1000, 1000, 1300, Some(Kill), 1300),
            (Hup, 1000, 1000, 1000, Some(Kill), 1000),
            (Hup, 1000, 1000, 1200, Some(Kill), 1200),
            // After KILL the stop is over, and nothing moves.
            (Kill, 1050, 1000, 1050, None, 1000),
        ];
        for (level, deadline, kill_at, now, want, want_kill_at) in cases {
            let mut at = kill_at;
            assert_eq!(
                level_after(level, deadline, &mut at, now),
                want,
                "{level:?} deadline {deadline} kill_at {kill_at} now {now}"
            );
            assert_eq!(at, want_kill_at, "{level:?} deadline {deadline} now {now}");
        }
    }

    #[test]
    fn the_confirm_window_is_asked_for_only_at_kill() {
        let asked = std::cell::Cell::new(0);
        let ask = || {
            asked.set(asked.get() + 1);
            7
        };
        assert_eq!(deadline_of(Level::Term, Some(1), 5, ask), 1);
        assert_eq!(deadline_of(Level::Hup, None, 5, ask), 5);
        assert_eq!(asked.get(), 0);
        assert_eq!(deadline_of(Level::Kill, None, 5, ask), 7);
        assert_eq!(asked.get(), 1);
    }
}
