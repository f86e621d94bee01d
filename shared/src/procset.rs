//! The run's process set: which processes belong to a run, found from one /proc scan.
//!
//! A process is the run's when it started at or after the run's leader (same boot) and
//! - it is in the run's process group or session, or
//! - it descends from the wrapper (a child subreaper, so double-forked escapees come back to it), or
//! - it is of the run's user and its environment carries this run's `AGENT_RUN_ID`.
//!
//! Session and group ids are trusted only while they cannot have been reused and the leader is
//! the run's by a kernel fact: while the leader (pid == sid == pgid) is alive with its recorded
//! start time and is the child of the live wrapper or carries the run's marker, or for
//! processes that also carry the run's marker. Once an empty session's id is free, the kernel
//! may hand it to an unrelated process, and a start-time check alone cannot tell that process
//! from ours; and a rewritten record may name any session leader.
//!
//! This module never signals; [`crate::stop`] verifies each member again through a pidfd.

use crate::pid::{Identity, Pid};
use crate::pid_counter;
use crate::procfs::{self, Stat};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Everything needed to recognise a run's processes.
#[derive(Debug, Clone)]
pub struct RunScope {
    pub run_id: String,
    /// The workload leader (pid == pgid == sid at launch).
    pub leader: Identity,
    pub uid: u32,
    /// The live wrapper whose descendants are the run's (`Some(self)` inside the wrapper).
    pub wrapper: Option<Pid>,
    /// The run dir's (device, inode): a marker only counts when the process's `AGENT_RUN_DIR`
    /// is this very directory, so a run of the same id under another root is never taken for
    /// ours. `None` skips the check.
    pub run_dir: Option<(u64, u64)>,
    /// The leader is not known (only the wrapper's identity, as a start-time floor): match by
    /// marker and wrapper descent only, never by group or session.
    pub marker_only: bool,
    /// No process that started before this tick is the run's. The record's start ticks, capped
    /// by the run dir's birth (a kernel fact): a record rewritten to say the run started later
    /// cannot shield the run's processes from its stop.
    pub floor_ticks: u64,
    /// The run's cgroup (checked): every process in it (or in a cgroup below it) is the run's,
    /// whatever its session, group, parent or environment.
    pub cgroup: Option<crate::cgroup::RunCgroup>,
    /// Processes that descend from the wrapper but are not the run's (its own helpers).
    pub exclude: Vec<Identity>,
}

impl RunScope {
    /// The lowest pid a member can have when a scan may skip the older pids
    /// ([`procfs::only_newer_pids`]): every member started after the leader. Only while the
    /// kernel shows the leader's pid with the leader's start time: a pid a record names is a
    /// claim, and a high one made up would shield every older pid from the scan. Inside the
    /// wrapper the leader is no claim (it forked it), so the skip holds after the leader died.
    pub fn newer_than(&self) -> Option<i32> {
        if self.wrapper != Some(Pid::this()) {
            procfs::stat(self.leader.pid).filter(|s| s.start_ticks == self.leader.start_ticks)?;
        }
        procfs::only_newer_pids(Identity {
            pid: self.leader.pid,
            start_ticks: self.floor_ticks.min(self.leader.start_ticks),
        })
    }

    /// The (device, inode) of a run dir, for [`RunScope::run_dir`].
    pub fn dir_identity(dir: &std::path::Path) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
    }
}

/// How deep a discovery looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Group, session and wrapper descendants: one stat per process.
    Tree,
    /// Also read the environment of the user's other processes for the run's marker.
    WithMarker,
}

/// One look at /proc: every process's stat, plus each process's run marker read at most once
/// (lazily, when a discovery asks for it). The watchdog shares one snapshot across every run of
/// a pass, so N runs cost one scan instead of N.
pub struct Snapshot {
    stats: Vec<Stat>,
    parent: HashMap<Pid, Pid>,
    markers: Mutex<HashMap<Pid, Option<Marker>>>,
    /// For [`Snapshot::take_indexed`]: positions in `stats` by session, by group and by marker,
    /// so a lookup costs the size of the run, not of the process table.
    index: Option<Index>,
    /// The lowest pid this look read (`None`: every pid).
    min_pid: Option<i32>,
    /// Of a look at every pid: the pid counter and the live tasks just before the listing,
    /// and when (CLOCK_BOOTTIME seconds), for [`Snapshot::pid_floor`].
    mark: Option<Mark>,
    /// When the look was done (CLOCK_BOOTTIME seconds).
    finished: f64,
    /// [`Snapshot::pid_floor`], worked out once for every stop that shares this look.
    floor: std::sync::OnceLock<Option<PidFloor>>,
}

#[derive(Debug, Clone, Copy)]
struct Mark {
    at: f64,
    last_pid: i32,
    tasks: u64,
    /// Where the followed pid counter stood ([`crate::pid_counter`]).
    chain: Option<pid_counter::ChainMark>,
}

/// From a look at every pid: the pids that processes begun since can have, as long as the pid
/// counter cannot have come around ([`procfs::no_wrap_within`]). A stop takes it from its first
/// look, so that its later looks read only the pids handed out since, not the whole table.
#[derive(Debug, Clone, Copy)]
pub struct PidFloor {
    /// The last pid handed out before the look began: every process begun since has a pid
    /// from here up (this one is read again, at no harm).
    pub pid: i32,
    at: f64,
    tasks: u64,
    held: u64,
    chain: Option<pid_counter::ChainMark>,
}

impl PidFloor {
    /// Whether the floor still holds at `when` (CLOCK_BOOTTIME seconds, not later than now): no
    /// wrap of the pid counter is possible since the look it came from began, by the time bound
    /// alone, or, in a process that follows the counter, by how far it moved since
    /// ([`pid_counter::holds`], read now).
    pub fn holds_at(&self, when: f64) -> bool {
        self.holds_by_time(when)
            || self
                .chain
                .is_some_and(|c| when <= crate::sys::boottime_secs() && pid_counter::holds(c))
    }

    /// The last pid handed out now, when the floor holds now and the counter is still at or
    /// above it: every process begun since the floor's look has a pid from the floor up to
    /// this one. One read of the counter where the chain holds it.
    pub fn top_now(&self) -> Option<i32> {
        let top = match self.chain.and_then(pid_counter::counter_if_holds) {
            Some(top) => top,
            None if self.holds_by_time(crate::sys::boottime_secs()) => procfs::last_pid()?,
            None => return None,
        };
        (top >= self.pid).then_some(top)
    }

    fn holds_by_time(&self, when: f64) -> bool {
        procfs::no_wrap_within(when - self.at, self.tasks, self.held)
    }

    /// [`PidFloor::holds_at`] now.
    pub fn holds_now(&self) -> bool {
        self.holds_at(crate::sys::boottime_secs())
    }
}

struct Index {
    by_sid: HashMap<Pid, Vec<usize>>,
    by_pgid: HashMap<Pid, Vec<usize>>,
    /// `None` in a look shared by stops ([`Snapshot::since`]): markers are read lazily there,
    /// only for the processes that started after a run's floor.
    by_marker: Option<ByMarker>,
}

/// Positions in a look's stats by marker: (uid, `AGENT_RUN_ID`).
type ByMarker = HashMap<(u32, Vec<u8>), Vec<usize>>;

/// A process's run marker: its uid, `AGENT_RUN_ID` and the (dev, inode) of its `AGENT_RUN_DIR`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Marker {
    uid: u32,
    run_id: Vec<u8>,
    dir: Option<(u64, u64)>,
}

impl Snapshot {
    /// Scan /proc now.
    pub fn take() -> Snapshot {
        Snapshot::take_above(None)
    }

    /// Scan /proc now, reading only pids above `min_pid` (see [`procfs::only_newer_pids`]).
    pub fn take_above(min_pid: Option<i32>) -> Snapshot {
        // Of a whole scan, where the pid counter stood before it (two small reads beside the
        // listing of every process): the floor of a stop's later looks.
        let mark = match min_pid {
            Some(_) => None,
            None => pid_counter::read().map(|r| Mark {
                at: r.at,
                last_pid: r.last_pid,
                tasks: r.tasks,
                chain: r.chain,
            }),
        };
        let snap = Snapshot::of_stats(procfs::scan_above(min_pid), min_pid, mark);
        // On a followed counter, the look's count of pids in use tightens the chain's bound,
        // and the look becomes the base of later ones (see [`Snapshot::since`]).
        if let (Some(m), Some(floor)) = (mark.and_then(|m| m.chain), snap.pid_floor()) {
            pid_counter::seed(m, floor.tasks + floor.held);
            let mut g = SHARED.0.lock().unwrap_or_else(|e| e.into_inner());
            if g.base.as_ref().is_none_or(|b| b.floor.at <= floor.at) {
                g.base = Some(Base {
                    stats: Arc::new(snap.stats.clone()),
                    floor,
                });
            }
        }
        snap
    }

    /// A look made of `stats`, done now.
    fn of_stats(stats: Vec<Stat>, min_pid: Option<i32>, mark: Option<Mark>) -> Snapshot {
        let parent = stats
            .iter()
            .filter_map(|s| Some((s.pid, s.ppid?)))
            .collect();
        Snapshot {
            stats,
            parent,
            markers: Mutex::default(),
            index: None,
            min_pid,
            mark,
            finished: crate::sys::boottime_secs(),
            floor: std::sync::OnceLock::new(),
        }
    }

    /// A look at the tree below `root` only ([`procfs::tree_below`]): inside the wrapper, a
    /// child subreaper whose tree holds every process the run forked, a stop's looks that
    /// need no marker read the tree instead of every pid. `None` when the kernel's children
    /// lists cannot be read. Never shared with other stops: it is no look at every pid.
    pub fn of_tree(root: Pid) -> Option<Snapshot> {
        Some(Snapshot::of_stats(procfs::tree_below(root)?, None, None))
    }

    /// A look at no process: for a stop whose members come from the run's cgroup alone
    /// ([`discover_in`] reads `cgroup.procs`), so that it reads no /proc.
    pub fn empty() -> Snapshot {
        Snapshot::of_stats(Vec::new(), None, None)
    }

    /// The stat this look holds for `pid`, if it holds one.
    pub fn stat_of(&self, pid: Pid) -> Option<&Stat> {
        self.stats.iter().find(|s| s.pid == pid)
    }

    /// The lowest pid this look read (`None`: every pid).
    pub fn min_pid(&self) -> Option<i32> {
        self.min_pid
    }

    /// When this look was done (CLOCK_BOOTTIME seconds).
    pub fn finished(&self) -> f64 {
        self.finished
    }

    /// Of a look at every pid, the [`PidFloor`] of the looks after it. Counts the pids held
    /// by a process group or session alone (its leader gone, a member alive): the pid counter
    /// steps over those too.
    pub fn pid_floor(&self) -> Option<PidFloor> {
        *self.floor.get_or_init(|| {
            let mark = self.mark?;
            Some(PidFloor {
                pid: mark.last_pid,
                at: mark.at,
                tasks: mark.tasks,
                held: held_ids(&self.stats).len() as u64,
                chain: mark.chain,
            })
        })
    }

    /// Scan /proc now and read every live process's marker once, indexed: for a caller that
    /// asks about many runs at once (the watchdog's pass over thousands of run dirs).
    pub fn take_indexed() -> Snapshot {
        Snapshot::take_with_index(true)
    }

    /// Scan /proc now, indexed by session and group (and with `markers`, by every live
    /// process's marker, each read now).
    fn take_with_index(markers: bool) -> Snapshot {
        Snapshot::take_indexed_above(None, markers)
    }

    /// [`Snapshot::take_with_index`] over the pids from `min_pid` up.
    fn take_indexed_above(min_pid: Option<i32>, markers: bool) -> Snapshot {
        let mut snap = Snapshot::take_above(min_pid);
        snap.build_index(markers);
        snap
    }

    /// Index this look by session and group (and with `markers`, by every live process's
    /// marker, each read now).
    fn build_index(&mut self, markers: bool) {
        let snap = self;
        let mut index = Index {
            by_sid: HashMap::new(),
            by_pgid: HashMap::new(),
            by_marker: markers.then(HashMap::new),
        };
        for (i, st) in snap.stats.iter().enumerate() {
            if st.is_dead() {
                continue;
            }
            if let Some(sid) = st.sid {
                index.by_sid.entry(sid).or_default().push(i);
            }
            if let Some(pgid) = st.pgid {
                index.by_pgid.entry(pgid).or_default().push(i);
            }
            if let Some(by_marker) = index.by_marker.as_mut() {
                if let Some(m) = snap.marker(st.pid) {
                    by_marker.entry((m.uid, m.run_id)).or_default().push(i);
                }
            }
        }
        snap.index = Some(index);
    }

    /// A look of every pid made of the base (the last look of every pid, on a followed pid
    /// counter) and a fresh read of the pids handed out since its mark: every process begun
    /// since the base has one of those ([`PidFloor`]), and one of the base's older processes
    /// can leave the run but not join it (a session is joined only by being forked in it,
    /// setpgid moves only within one, a process never moves under the wrapper), so its stat
    /// from the base serves. Markers are read afresh. What a stop does with a member it names
    /// goes through its pidfd and start time, so one gone since the base is only skipped.
    /// `None` when the floor does not hold or too many pids were handed out since (then a new
    /// look of every pid is the cheaper one, and the next base).
    fn composite(base: &Base, indexed: bool) -> Option<Snapshot> {
        let floor = base.floor;
        let top = floor.top_now()?;
        if top - floor.pid > COMPOSITE_SPAN {
            return None;
        }
        let fresh = procfs::scan_above(Some(floor.pid));
        // The floor must hold past the fresh read's last look at the counter.
        floor.top_now()?;
        let fresh_pids: HashSet<Pid> = fresh.iter().map(|s| s.pid).collect();
        let mut stats = fresh;
        stats.extend(
            base.stats
                .iter()
                .filter(|s| {
                    let pid = s.pid.get();
                    (pid < floor.pid || pid > top) && !fresh_pids.contains(&s.pid)
                })
                .copied(),
        );
        stats.sort_unstable_by_key(|s| s.pid);
        let mut snap = Snapshot::of_stats(stats, None, None);
        let _ = snap.floor.set(Some(floor));
        if indexed {
            snap.build_index(false);
        }
        Some(snap)
    }

    fn marker(&self, pid: Pid) -> Option<Marker> {
        // Read under the lock: stops that share this look would otherwise all miss at once and
        // each read every environment itself.
        self.markers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(pid)
            .or_insert_with(|| read_marker(pid))
            .clone()
    }

    /// A look at /proc that began no earlier than `since`: the last one taken by this process
    /// if it began after `since`, else a new one. Stops that run at once (the watchdog's, a
    /// cancel of many runs) share their looks instead of each scanning the whole process
    /// table: what a stop needs is a look that began after the moment it asks about (its start,
    /// the moment its last known member was seen gone), and any such look will do.
    ///
    /// While several stops run in this process, a new look waits after the last one: each
    /// serves every stop that asked before it began, so a burst of stops costs a few scans
    /// instead of one each, and scanning cannot starve the stops themselves. The wait is twice
    /// what the last look took (scanning takes at most a third of a CPU), at least
    /// [`CONTENDED_GAP_MIN`], and never past [`CONTENDED_INTERVAL`] after the last look began:
    /// on a small process table, the looks that call many stops done come about 10 ms apart,
    /// not a fixed 25 ms.
    pub fn since(since: Instant, min_pid: Option<i32>) -> Arc<Snapshot> {
        // A look that read only the pids from `m` up serves a request whose members all have
        // pids from `want` up, when `m <= want`.
        let serves = |m: Option<i32>| match (m, min_pid) {
            (None, _) => true,
            (Some(m), Some(want)) => m <= want,
            (Some(_), None) => false,
        };
        let (lock, done) = &SHARED;
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some((began, m, snap)) = &st.last {
                if *began >= since && serves(*m) {
                    return Arc::clone(snap);
                }
            }
            // The last look of every pid, when a narrower one came after it.
            if let Some((began, snap)) = &st.last_full {
                if *began >= since {
                    return Arc::clone(snap);
                }
            }
            if st.scanning {
                // A look is being taken: wait for it (no second scan beside it), then see
                // whether it serves.
                st = done.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let contended = ACTIVE_STOPS.load(Ordering::Relaxed) > 1;
            if let Some((began, _, _)) = &st.last {
                let took = st.last_took;
                let next = (*began + took + (took * 2).max(CONTENDED_GAP_MIN))
                    .min(*began + CONTENDED_INTERVAL);
                let now = Instant::now();
                if contended && now < next {
                    let (g, _) = done
                        .wait_timeout(st, next - now)
                        .unwrap_or_else(|e| e.into_inner());
                    st = g;
                    continue;
                }
            }
            let began = Instant::now();
            st.scanning = true;
            let base = st.base.clone().filter(|_| min_pid.is_none());
            drop(st);
            // Shared by several stops: indexed by session and group; a marker is read (once,
            // for every stop sharing the look) only for a process that started after some
            // stop's run: reading every environment of a big table costs more than the stops
            // themselves. Only the pids the asking stop's members can have: a look of every
            // pid comes when a stop asks for one.
            // On a followed pid counter, a look of every pid is the last one's older pids
            // and a fresh read of the newer ones, while the counter cannot have come around.
            let composite = base.and_then(|b| Snapshot::composite(&b, contended));
            let snap = match composite {
                Some(snap) => snap,
                None if contended => Snapshot::take_indexed_above(min_pid, false),
                None => Snapshot::take_above(min_pid),
            };
            let snap = Arc::new(snap);
            let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
            g.scanning = false;
            g.last_took = began.elapsed();
            if min_pid.is_none() {
                g.last_full = Some((began, Arc::clone(&snap)));
            }
            g.last = Some((began, min_pid, Arc::clone(&snap)));
            done.notify_all();
            return snap;
        }
    }
}

/// The last look at /proc this process took for its stops, and the one being taken.
struct Shared {
    /// When it began, the lowest pid it read (None: all), the look.
    last: Option<(Instant, Option<i32>, Arc<Snapshot>)>,
    /// The last look of every pid (when it began), kept while narrower ones follow it.
    last_full: Option<(Instant, Arc<Snapshot>)>,
    scanning: bool,
    /// How long the last look took.
    last_took: std::time::Duration,
    /// The last look of every pid on a followed pid counter (see [`Snapshot::composite`]).
    base: Option<Base>,
}

/// A look of every pid whose older pids later looks can reuse.
#[derive(Clone)]
struct Base {
    stats: Arc<Vec<Stat>>,
    floor: PidFloor,
}

static SHARED: (Mutex<Shared>, Condvar) = (
    Mutex::new(Shared {
        last: None,
        last_full: None,
        scanning: false,
        last_took: std::time::Duration::ZERO,
        base: None,
    }),
    Condvar::new(),
);

/// The most pids handed out since the base that a composite look reads afresh
/// ([`Snapshot::composite`]); past that, a new look of every pid.
const COMPOSITE_SPAN: i32 = 4096;

/// The longest time between the beginnings of two looks at /proc while several stops share
/// them (see [`Snapshot::since`]).
pub const CONTENDED_INTERVAL: std::time::Duration = std::time::Duration::from_millis(25);

/// The shortest time between the end of one look at /proc and the beginning of the next while
/// several stops share them. Each look wakes every stop waiting: 200 stops at once, with looks
/// 2 ms apart, spent their CPU waking (TERM to final record ten times slower than with 25 ms).
pub const CONTENDED_GAP_MIN: std::time::Duration = std::time::Duration::from_millis(10);

/// The process group and session ids of `stats` that are no process's pid: held by the group
/// or session alone, its leader gone (a pid the kernel's counter steps over as if in use).
fn held_ids(stats: &[Stat]) -> HashSet<Pid> {
    let tgids: HashSet<Pid> = stats.iter().map(|s| s.pid).collect();
    stats
        .iter()
        .flat_map(|s| [s.pgid, s.sid])
        .flatten()
        .filter(|id| !tgids.contains(id))
        .collect()
}

/// Stops running in this process (see [`Snapshot::since`]).
pub static ACTIVE_STOPS: AtomicUsize = AtomicUsize::new(0);

fn read_marker(pid: Pid) -> Option<Marker> {
    use std::os::unix::ffi::OsStrExt;
    let env = procfs::environ_get(pid, &[crate::ENV_RUN_ID, crate::ENV_RUN_DIR]);
    let [run_id, dir] = <[Option<Vec<u8>>; 2]>::try_from(env).ok()?;
    let run_id = run_id?;
    Some(Marker {
        uid: procfs::uid_of(pid)?,
        run_id,
        dir: dir.and_then(|d| {
            RunScope::dir_identity(std::path::Path::new(std::ffi::OsStr::from_bytes(&d)))
        }),
    })
}

/// Find the run's live (non-zombie) processes, except those in `skip`. Never includes this
/// process, the wrapper itself or pid 1. Takes a fresh [`Snapshot`].
pub fn discover(scope: &RunScope, depth: Depth, skip: &HashSet<Pid>) -> Vec<Stat> {
    discover_in(
        &Snapshot::take_above(scope.newer_than()),
        scope,
        depth,
        skip,
    )
}

/// [`discover`] over a given snapshot.
pub fn discover_in(
    snap: &Snapshot,
    scope: &RunScope,
    depth: Depth,
    skip: &HashSet<Pid>,
) -> Vec<Stat> {
    let me = Pid::this();
    let leader = scope.leader;
    let leader_pid = leader.pid.get();
    // Session and group ids stand for the run only while its leader is alive and is the run's
    // by a kernel fact: the child of the live wrapper we descend from, or carrying the run's
    // marker. A record's leader that is neither (the record was rewritten to name another
    // session leader) lends its session and group nothing.
    // A look that read only newer pids (a stop's later looks) asks the kernel for the leader.
    let leader_stat = match snap.stats.iter().find(|s| s.pid == leader.pid) {
        Some(s) => Some(*s),
        None if snap.min_pid.is_some_and(|m| leader_pid < m) => procfs::stat(leader.pid),
        None => None,
    };
    let leader_trusted = !scope.marker_only
        && leader_stat
            .filter(|s| s.start_ticks == leader.start_ticks)
            .is_some_and(|s| {
                scope.wrapper.is_some_and(|w| s.ppid == Some(w)) || has_marker(snap, s.pid, scope)
            });
    let mut descends: HashMap<Pid, bool> = HashMap::new();
    let mut out = Vec::new();
    let excluded = |s: &Stat| {
        s.pid == me
            || Some(s.pid) == scope.wrapper
            || s.pid.get() == 1
            || s.is_dead()
            || skip.contains(&s.pid)
            || s.start_ticks < scope.floor_ticks
            || scope.exclude.contains(&s.identity())
    };
    for s in candidates(snap, scope, depth) {
        if excluded(s) {
            continue;
        }
        // Members of the leader's group or session joined it after the leader started.
        let in_group = (s.pgid == Some(leader.pid) || s.sid == Some(leader.pid))
            && s.start_ticks >= leader.start_ticks;
        let member = (in_group && leader_trusted)
            || scope
                .wrapper
                .is_some_and(|w| descends_from(s.pid, w, &snap.parent, &mut descends))
            || ((in_group || depth == Depth::WithMarker) && has_marker(snap, s.pid, scope));
        if member {
            out.push(*s);
        }
    }
    // In a cgroup, membership is the kernel's: every process of it is the run's.
    if let Some(cg) = &scope.cgroup {
        for pid in cg.members() {
            if out.iter().any(|s| s.pid == pid) {
                continue;
            }
            if let Some(s) = procfs::stat(pid).filter(|s| !excluded(s)) {
                out.push(s);
            }
        }
    }
    out
}

/// Processes that may be the run's without any scan being able to say so: of the run's user,
/// started after the run, alive, whose environment this process cannot read (non-dumpable).
/// Only asked when nothing else holds the run (no live wrapper to descend from, no cgroup):
/// they are not signalled, but the run cannot be called clean while they live.
pub fn unverifiable(scope: &RunScope, snap: &Snapshot) -> Vec<Pid> {
    // Root reads every environment: nothing is hidden from it.
    if crate::sys::geteuid() == 0 {
        return Vec::new();
    }
    snap.stats
        .iter()
        .filter(|s| {
            !s.is_dead()
                && s.start_ticks >= scope.floor_ticks
                && s.pid != Pid::this()
                && procfs::real_uid(s.pid) == Some(scope.uid)
                && procfs::environ_unreadable(s.pid)
                // Other runs' wrappers and keepers hide their environment too (the wrapper holds
                // its lease token): they are not this run's (by name, as the escape look).
                && !matches!(
                    procfs::comm(s.pid).as_deref(),
                    Some("agent-run" | "agent-run-keep")
                )
        })
        .map(|s| s.pid)
        .collect()
}

/// The processes worth looking at: all of them, or with an index and no wrapper to descend
/// from, only those of the run's session, group or marker.
fn candidates<'s>(snap: &'s Snapshot, scope: &RunScope, depth: Depth) -> Vec<&'s Stat> {
    let Some(index) = snap.index.as_ref().filter(|_| scope.wrapper.is_none()) else {
        return snap.stats.iter().collect();
    };
    let leader = scope.leader.pid;
    let none = Vec::new();
    let mut picked: Vec<usize> = Vec::new();
    picked.extend(index.by_sid.get(&leader).unwrap_or(&none));
    picked.extend(index.by_pgid.get(&leader).unwrap_or(&none));
    if depth == Depth::WithMarker {
        let Some(by_marker) = &index.by_marker else {
            // No marker index: every process, of which the caller reads the markers of those
            // that started after the run (the older ones are excluded before any read).
            return snap.stats.iter().collect();
        };
        let key = (scope.uid, scope.run_id.as_bytes().to_vec());
        picked.extend(by_marker.get(&key).unwrap_or(&none));
    }
    picked.sort_unstable();
    picked.dedup();
    picked.into_iter().map(|i| &snap.stats[i]).collect()
}

fn has_marker(snap: &Snapshot, pid: Pid, scope: &RunScope) -> bool {
    snap.marker(pid).is_some_and(|m| {
        m.uid == scope.uid
            && m.run_id == scope.run_id.as_bytes()
            && scope.run_dir.is_none_or(|want| m.dir == Some(want))
    })
}

/// Whether `pid` has `ancestor` among its ancestors, memoised across one scan.
fn descends_from(
    pid: Pid,
    ancestor: Pid,
    parent: &HashMap<Pid, Pid>,
    memo: &mut HashMap<Pid, bool>,
) -> bool {
    let mut chain = Vec::new();
    let mut cur = pid;
    let found = loop {
        if let Some(&known) = memo.get(&cur) {
            break known;
        }
        chain.push(cur);
        match parent.get(&cur) {
            Some(&pp) if pp == ancestor => break true,
            Some(&pp) if pp.get() > 1 && chain.len() < 4096 => cur = pp,
            _ => break false,
        }
    };
    for p in chain {
        memo.insert(p, found);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_and_session_whose_leader_is_gone_hold_their_pid() {
        // `setsid sh -c 'sleep & exit'`: the shell leads a session and a group and exits; the
        // sleep keeps both ids, which no process has as its pid.
        let mut sh = std::process::Command::new("setsid")
            .args(["sh", "-c", "sleep 30 >/dev/null & echo $!"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = String::new();
        use std::io::Read;
        sh.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let sleep: i32 = out.trim().parse().unwrap();
        let sleep_pid = Pid::new(sleep.into()).unwrap();
        sh.wait().unwrap();
        let snap = Snapshot::take();
        let st = procfs::stat(sleep_pid).unwrap();
        assert_ne!(st.sid, Some(sleep_pid), "sleep leads no session");
        let sid = st.sid.expect("a session id");
        let held = held_ids(&snap.stats);
        // The shell was `setsid`'s child or setsid itself (it forks when it leads a group):
        // either way the session's id is no live process's pid.
        assert!(held.contains(&sid), "{sid} not held: {held:?}");
        assert!(!held.contains(&sleep_pid));
        let floor = snap.pid_floor().expect("a look of every pid has a floor");
        assert!(floor.held >= 1);
        assert!(floor.holds_now(), "a look just taken holds");
        assert!(
            !floor.holds_at(floor.at + 3600.0),
            "an hour of forks can wrap"
        );
        assert!(Snapshot::take_above(Some(floor.pid)).pid_floor().is_none());
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(sleep).unwrap(),
            rustix::process::Signal::KILL,
        );
    }

    #[test]
    fn ancestry_is_followed_and_memoised() {
        let p = |n: i64| Pid::new(n).unwrap();
        let parent: HashMap<Pid, Pid> = [(10, 5), (11, 10), (12, 11), (20, 1)]
            .map(|(c, pp)| (p(c), p(pp)))
            .into();
        let mut memo = HashMap::new();
        assert!(descends_from(p(12), p(5), &parent, &mut memo));
        assert!(descends_from(p(11), p(5), &parent, &mut memo));
        assert!(!descends_from(p(20), p(5), &parent, &mut memo));
        assert_eq!(memo.get(&p(10)), Some(&true));
    }
}
