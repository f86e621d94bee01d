//! The watchdog's loop, as library functions: [`run_once`] (one full pass, acting on what is due
//! now and waiting for those stops) and [`run`] (the daemon).

use crate::act::act;
use crate::assess::{assess, delay_until, Action, Looks, Policy, Seen, Subject, Verdict};
use crate::ledger::{Ledger, Settled};
use crate::pass::{self, Entry, Pass};
use crate::notify::Notifier;
use crate::watched::{self, Watched};
use agent_run_shared::root::Root;
use agent_run_shared::run_dir::files;
use agent_run_shared::sys::{self, Epoll, Inotify};
use agent_run_shared::time::epoch_now;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Options of the daemon.
#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    pub scan_interval: Duration,
    pub policy: Policy,
    /// Stops allowed in flight at once.
    pub max_parallel: usize,
    /// How long SIGTERM waits for stops in flight.
    pub shutdown_timeout: Duration,
}

/// The file in a root whose `flock` makes one watchdog the root's only one (dot-named: never
/// taken for a run dir).
pub const ROOT_LOCK: &str = ".watchdog.lock";

/// Another watchdog holds the root.
#[derive(Debug)]
pub struct RootBusy {
    pub root: PathBuf,
    /// The holders, by the kernel's account (/proc/locks).
    pub pids: Vec<i32>,
}

impl std::fmt::Display for RootBusy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = match self.pids.as_slice() {
            [] => "another process".to_string(),
            [p] => format!("pid {p}"),
            ps => format!("pids {ps:?}"),
        };
        write!(
            f,
            "another watchdog ({who}) already watches {}: one watchdog per root",
            self.root.display()
        )
    }
}

impl std::error::Error for RootBusy {}

/// The root's watchdog lock, held for as long as this value lives.
pub struct RootLock {
    _file: std::fs::File,
}

/// Take the root's watchdog lock, or say who holds it ([`RootBusy`]).
pub fn lock_root(root: &Root) -> anyhow::Result<RootLock> {
    use std::os::fd::AsFd;
    let file = root.open_rw_create(ROOT_LOCK)?;
    if sys::try_lock_exclusive(file.as_fd())? {
        return Ok(RootLock { _file: file });
    }
    let md = file.metadata()?;
    Err(RootBusy {
        root: root.path().to_path_buf(),
        pids: agent_run_shared::procfs::flock_holders_of_held(md.dev(), md.ino()),
    }
    .into())
}

fn log(msg: &str) {
    eprintln!("agent-run-watchdog: {msg}");
}

/// One pass over the root: act on everything due now, wait for those stops, and return what
/// was done (one line per run acted on). Runs that are not due are left alone.
pub fn run_once(root: &Root, policy: &Policy) -> Vec<String> {
    let now = epoch_now();
    let looks = Looks::default();
    let mut handles = Vec::new();
    let Some((rootfd, ents)) = entries(root) else {
        return Vec::new();
    };
    // The ledger of the last pass: the final records it read are not read again while their
    // status.json is unchanged (crate::ledger).
    let mut pass = Pass::new(rootfd).with_ledger(Ledger::load(root));
    // What the last pass saw of the runs that are not over (crate::watched).
    let before = Watched::load(root);
    let mut after = Watched::default();
    for e in ents {
        if pass.classify(&e, &looks.cgroups).is_some() {
            continue;
        }
        let name = e.name;
        let dir_ino = dir_inode(root, &name);
        let known = dir_ino.and_then(|i| before.get(&name, i)).cloned();
        let seen = known.as_ref().map(watched::Entry::seen).unwrap_or_default();
        let (verdict, subject) = assess(root, &name, now, seen, policy, &looks, true);
        if let (Some(s), Some(ino)) = (&subject, dir_ino) {
            let said = known.as_ref().and_then(|k| k.lease_damage.as_deref());
            report_lease_damage(s, said);
            let said = known.as_ref().and_then(|k| k.record_damage.as_deref());
            report_record_damage(s, said);
            after.runs.insert(
                name.clone(),
                watched::Entry {
                    dir_ino: ino,
                    orphan_since: s.seen.orphan_since,
                    last_lease: s.seen.last_lease,
                    stopping_since: s.seen.stopping_since,
                    lease_damage: s.lease_damaged.clone(),
                    record_damage: s.record_damaged.clone(),
                },
            );
        }
        match (verdict, subject) {
            (Verdict::Now(action), Some(subject)) => {
                handles.push(thread::spawn(move || {
                    describe(&subject, action, act(&subject, action))
                }));
            }
            (Verdict::Skip(why), _) => {
                log(&format!("{name}: skipped: {why}"));
                journal_once(root, &name, &why);
            }
            _ => {}
        }
    }
    if let Some(ledger) = pass.into_ledger() {
        if let Err(e) = ledger.store(root) {
            log(&format!("cannot keep the settled ledger: {e}"));
        }
    }
    if after != before {
        if let Err(e) = after.store(root) {
            log(&format!("cannot keep the watch ledger: {e}"));
        }
    }
    handles
        .into_iter()
        .filter_map(|h| h.join().ok())
        .inspect(|l| log(l))
        .collect()
}

/// Say (log and journal) that a run's lease.json is damaged and what the watchdog goes by
/// instead, unless it said so already for the same damage (`said`). True when the damage
/// changed (said now, or repaired).
pub fn report_lease_damage(s: &Subject, said: Option<&str>) -> bool {
    let Some(why) = &s.lease_damaged else {
        return said.is_some();
    };
    if said == Some(why.as_str()) {
        return false;
    }
    let keep = s.seen.last_lease;
    let instead = match keep {
        Some(d) => format!(
            "the watchdog keeps the deadline it last saw while the wrapper lived ({})",
            agent_run_shared::time::rfc3339(
                std::time::UNIX_EPOCH + Duration::from_secs_f64(d.clamp(0.0, 1e11))
            )
        ),
        None => "no deadline was seen: if its wrapper is gone, the run gets the orphan grace"
            .to_string(),
    };
    log(&format!(
        "{}: lease.json is damaged ({why}); {instead}",
        s.id()
    ));
    let j = s.dir.journal("watchdog");
    let _ = j.event(
        "lease_unreadable",
        serde_json::json!({"error": why, "keeping_deadline": keep, "instead": instead}),
    );
    true
}

/// Say (log and journal) that a run's record cannot be read and that the watchdog goes by
/// the kernel's facts instead, unless it said so already for the same damage (`said`). True
/// when the damage changed.
pub fn report_record_damage(s: &Subject, said: Option<&str>) -> bool {
    let Some(why) = &s.record_damaged else {
        return said.is_some();
    };
    if said == Some(why.as_str()) {
        return false;
    }
    log(&format!(
        "{}: status.json cannot be read ({why}); the watchdog goes by the kernel's facts (the \
         run's lock, its cgroup, its marker)",
        s.id()
    ));
    let _ = s
        .dir
        .journal("watchdog")
        .event("record_damaged", serde_json::json!({"error": why}));
    true
}

/// The inode of the run dir `name` in the root (without following a symlink).
fn dir_inode(root: &Root, name: &str) -> Option<u64> {
    std::fs::symlink_metadata(root.path().join(name))
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| m.ino())
}

fn describe(s: &Subject, action: Action, r: agent_run_shared::Result<String>) -> String {
    match r {
        Ok(what) => format!("run {}: {action}: {what}", s.id()),
        Err(e) => format!("run {}: {action}: failed: {e}", s.id()),
    }
}

/// The root, opened for a pass, and the entries in it that could be run dirs.
fn entries(root: &Root) -> Option<(OwnedFd, Vec<Entry>)> {
    let listed = pass::open_root(root.path()).and_then(|fd| {
        let ents = pass::entries(&fd)?;
        Ok((fd, ents))
    });
    match listed {
        Ok(l) => Some(l),
        Err(e) => {
            log(&format!("cannot list {}: {e}", root.path().display()));
            None
        }
    }
}

/// Journal why a run dir is skipped, when it is a run dir we may write to (a skipped dir may be
/// unsafe or not ours: then only the log says it).
fn journal_once(root: &Root, name: &str, why: &str) {
    let Ok(id) = agent_run_shared::id::RunId::parse(name) else {
        return;
    };
    if let Ok(dir) = root.open_run_dir(&id) {
        let j = dir.journal("watchdog");
        let _ = j.event("skipped", serde_json::json!({"why": why}));
    }
}

const TOKEN_SIGNALS: u64 = 0;
const TOKEN_INOTIFY: u64 = 1;
const TOKEN_FIRST_WRAPPER: u64 = 16;

/// What the daemon remembers about a non-final run.
#[derive(Default)]
struct Tracked {
    wrapper: Option<(OwnedFd, u64)>,
    wd: Option<i32>,
    /// What the last look saw: since when the wrapper is gone or stopping, the lease seen
    /// while it lived.
    seen: Seen,
    /// What was wrong with lease.json when it was last reported (reported once per damage).
    lease_damage: Option<String>,
    /// The same for status.json.
    record_damage: Option<String>,
}

struct Daemon {
    opts: Options,
    root: Root,
    epoll: Epoll,
    ino: Inotify,
    root_wd: i32,
    runs: HashMap<String, Tracked>,
    /// Final runs by status.json's (inode, change time): not parsed again until it changes.
    settled: HashMap<String, Settled>,
    /// Why each skipped run was skipped, so each reason is said once. Skipped runs are not
    /// settled: every full scan (and SIGHUP) looks at them again.
    skipped: HashMap<String, String>,
    wd_names: HashMap<i32, String>,
    tokens: HashMap<u64, String>,
    next_token: u64,
    heap: BinaryHeap<Reverse<(Instant, String)>>,
    inflight: Arc<AtomicUsize>,
    busy: HashSet<String>,
    done_tx: mpsc::Sender<(String, String)>,
    done_rx: mpsc::Receiver<(String, String)>,
    threads: Vec<thread::JoinHandle<()>>,
    /// The last look at /proc outside a full pass, and when it was taken.
    snapshot: Option<(Instant, Looks)>,
    /// The full pass in progress, if any.
    rescan: Option<Rescan>,
}

/// A full pass in progress: the entries listed when it began, worked through in slices of at
/// most [`SLICE`], between which the loop serves the deadlines that fell due and the events
/// that came (a pass over 10,000 dirs that need the careful path takes seconds; a deadline
/// must not wait for it). One look at /proc and one cgroup walk serve the whole pass, as when
/// it ran in one go.
struct Rescan {
    pass: Pass,
    looks: Looks,
    ents: std::vec::IntoIter<Entry>,
    /// The pass's look at /proc, being taken on a thread of its own (`Looks::deferred`): a look
    /// of a big process table (10,000 processes: their stats and markers, about half a second
    /// here) would hold every deadline due meanwhile behind it.
    look: Option<mpsc::Receiver<agent_run_shared::procset::Snapshot>>,
    /// The entry that asked for the look, assessed again once it is there.
    retry: Option<Entry>,
}

impl Rescan {
    /// Whether the pass waits for its look (the loop then sleeps between two slices).
    fn waiting(&self) -> bool {
        self.look.is_some()
    }
}

/// How long one slice of a full pass works before the loop looks at the clock's deadlines and
/// the events again: the most a due deadline waits behind a pass (plus one run's look).
const SLICE: Duration = Duration::from_millis(5);

/// How long one look at /proc may serve events outside a full pass (it only decides whether a
/// not-yet-due orphan still has processes; the stop itself always looks afresh).
const SNAPSHOT_REUSE: Duration = Duration::from_secs(1);

/// Signal flags for the daemon.
struct Flags {
    term: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
    read: UnixStream,
}

fn register_signals() -> std::io::Result<Flags> {
    let (read, write) = UnixStream::pair()?;
    read.set_nonblocking(true)?;
    write.set_nonblocking(true)?;
    let f = Flags {
        term: Arc::default(),
        hup: Arc::default(),
        read,
    };
    for (sig, flag) in [
        (libc::SIGTERM, &f.term),
        (libc::SIGINT, &f.term),
        (libc::SIGHUP, &f.hup),
    ] {
        signal_hook::flag::register(sig, Arc::clone(flag))?;
        signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
    }
    Ok(f)
}

/// Which record a run dir holds: its status.json's inode and change time (None: none yet).
/// A new record is a new inode (it is exchanged or renamed into place).
fn status_key(dir: &std::path::Path) -> Option<Settled> {
    std::fs::symlink_metadata(dir.join(files::STATUS))
        .ok()
        .map(|m| Settled {
            ctime_ns: m.ctime_nsec() + m.ctime() * 1_000_000_000,
            ino: m.ino(),
        })
}

/// Run the daemon until SIGTERM/SIGINT. Returns after the stops in flight finished (bounded).
pub fn run(opts: Options) -> anyhow::Result<()> {
    let root = Root::open(&opts.root, true)?;
    let _root_lock = lock_root(&root)?;
    let limit = sys::raise_nofile_limit();
    // Follow the pid counter: the stops of runs held by scanning alone then read only the pids
    // handed out since the last look of every pid, however long ago it was taken.
    agent_run_shared::pid_counter::follow();
    let flags = register_signals()?;
    let epoll = Epoll::new()?;
    let ino = Inotify::new()?;
    let root_wd = ino.add_watch(
        root.path(),
        libc::IN_CREATE
            | libc::IN_MOVED_TO
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            // A run dir's mode or owner fixed: look again at once.
            | libc::IN_ATTRIB
            | libc::IN_ONLYDIR,
    )?;
    epoll.add(flags.read.as_raw_fd(), TOKEN_SIGNALS)?;
    epoll.add(ino.raw_fd(), TOKEN_INOTIFY)?;
    let (done_tx, done_rx) = mpsc::channel();
    let mut d = Daemon {
        opts,
        root,
        epoll,
        ino,
        root_wd,
        runs: HashMap::new(),
        settled: HashMap::new(),
        skipped: HashMap::new(),
        wd_names: HashMap::new(),
        tokens: HashMap::new(),
        next_token: TOKEN_FIRST_WRAPPER,
        heap: BinaryHeap::new(),
        inflight: Arc::default(),
        busy: HashSet::new(),
        done_tx,
        done_rx,
        threads: Vec::new(),
        snapshot: None,
        rescan: None,
    };
    let notifier = Notifier::from_env();
    // Said (and READY sent) once the first full pass has looked at every run dir: whoever waits
    // for the line knows every run's record and lease as they were then has been read.
    d.begin_scan();
    while !d.scan_slice(None) {}
    log(&format!(
        "watching {} (rescan every {:?}, orphan grace {:?}, open-file limit {limit})",
        d.root.path().display(),
        d.opts.scan_interval,
        d.opts.policy.orphan_grace
    ));
    notifier.send("READY=1");
    let mut next_scan = Instant::now() + d.opts.scan_interval;
    let mut next_ping = notifier.ping_every.map(|p| Instant::now() + p);
    let mut last_status = String::new();
    loop {
        let now = Instant::now();
        let mut deadline = next_scan;
        if let Some(Reverse((t, _))) = d.heap.peek() {
            deadline = deadline.min(*t);
        }
        if let Some(p) = next_ping {
            deadline = deadline.min(p);
        }
        // A pass in progress only looks at what is ready, and goes on with its next slice; while
        // stops are in flight it gives them the CPU for a slice's time between two slices (a
        // stop's duration is a lease's lateness; the pass is only the backstop).
        let wait = match &d.rescan {
            Some(r) if r.waiting() || d.inflight.load(Ordering::SeqCst) > 0 => {
                SLICE.min(deadline.saturating_duration_since(now))
            }
            Some(_) => Duration::ZERO,
            None => deadline.saturating_duration_since(now),
        };
        let tokens = d.epoll.wait(Some(wait))?;
        for t in tokens {
            match t {
                TOKEN_SIGNALS => {
                    let mut buf = [0u8; 64];
                    while matches!(std::io::Read::read(&mut &flags.read, &mut buf), Ok(n) if n > 0)
                    {
                    }
                }
                TOKEN_INOTIFY => d.on_inotify(),
                t => {
                    // A wrapper exited: look at its run now.
                    if let Some(name) = d.tokens.get(&t).cloned() {
                        d.evaluate(&name);
                    }
                }
            }
        }
        if flags.term.load(Ordering::SeqCst) {
            notifier.send("STOPPING=1");
            log("stopping: no new work; waiting for stops in flight");
            d.shutdown();
            return Ok(());
        }
        if flags.hup.swap(false, Ordering::SeqCst) {
            log("SIGHUP: rescanning");
            d.begin_scan();
        }
        d.collect_done();
        d.run_due();
        if d.rescan.is_none() && Instant::now() >= next_scan {
            d.begin_scan();
        }
        if d.rescan.is_some() && d.scan_slice(Some(SLICE)) {
            next_scan = Instant::now() + d.opts.scan_interval;
        }
        if let (Some(p), Some(every)) = (next_ping, notifier.ping_every) {
            if Instant::now() >= p {
                notifier.send("WATCHDOG=1");
                next_ping = Some(Instant::now() + every);
            }
        }
        let status = format!(
            "STATUS=watching {} runs, {} stops in flight",
            d.runs.len(),
            d.inflight.load(Ordering::SeqCst)
        );
        if status != last_status {
            notifier.send(&status);
            last_status = status;
        }
    }
}

impl Daemon {
    /// Begin a full pass over the root, the backstop for anything an event missed (one in
    /// progress is dropped: the new one lists the root afresh). [`Daemon::scan_slice`] works
    /// it through.
    fn begin_scan(&mut self) {
        self.rescan = None;
        let Some((rootfd, ents)) = entries(&self.root) else {
            return;
        };
        let present: HashSet<&String> = ents.iter().map(|e| &e.name).collect();
        let gone: Vec<String> = self
            .runs
            .keys()
            .filter(|n| !present.contains(n))
            .cloned()
            .collect();
        for n in gone {
            self.forget(&n);
        }
        self.settled.retain(|n, _| present.contains(n));
        // One look at /proc for the whole pass, not one per run; one look at the flocks.
        self.rescan = Some(Rescan {
            pass: Pass::new(rootfd),
            looks: Looks {
                deferred: true,
                ..Looks::default()
            },
            ents: ents.into_iter(),
            look: None,
            retry: None,
        });
    }

    /// Work on the pass in progress for about `budget` (`None`: to its end). True when the
    /// pass is over (or there was none).
    fn scan_slice(&mut self, budget: Option<Duration>) -> bool {
        let Some(mut r) = self.rescan.take() else {
            return true;
        };
        if let Some(rx) = &r.look {
            // To the end: wait for the look (the first pass, before READY).
            let got = match budget {
                None => rx.recv().map_err(|_| mpsc::TryRecvError::Disconnected),
                Some(_) => rx.try_recv(),
            };
            match got {
                Ok(snap) => {
                    let _ = r.looks.procs.set(snap);
                    r.look = None;
                }
                Err(mpsc::TryRecvError::Empty) => {
                    self.rescan = Some(r);
                    return false;
                }
                // The thread is gone without a look: take it here.
                Err(mpsc::TryRecvError::Disconnected) => {
                    r.looks.deferred = false;
                    r.look = None;
                }
            }
        }
        let started = Instant::now();
        let mut since_clock = 0u32;
        while let Some(e) = r.retry.take().or_else(|| r.ents.next()) {
            let name = &e.name;
            if self.busy.contains(name) {
                continue;
            }
            // Settled and unchanged: one statx. Final for sure: settled without the careful
            // path. Anything else: the careful path (the costly one: the clock is read after
            // each, and every 64 cheap ones).
            since_clock += 1;
            if self
                .settled
                .get(name)
                .is_some_and(|k| Settled::of(r.pass.root(), name).as_ref() == Some(k))
            {
                // unchanged
            } else if let Some(k) = r.pass.classify(&e, &r.looks.cgroups) {
                self.forget(name);
                self.skipped.remove(name);
                self.settled.insert(name.clone(), k);
            } else {
                if self.evaluate_with(name, &r.looks, true) {
                    // The run needs the pass's look: take it on its own thread, and go on with
                    // the pass (this run first) once it is there.
                    let (tx, rx) = mpsc::channel();
                    let spawned =
                        thread::Builder::new()
                            .name("pass-look".into())
                            .spawn(move || {
                                let _ = tx.send(Looks::take_procs(true));
                            });
                    match spawned {
                        Ok(_) => r.look = Some(rx),
                        Err(_) => r.looks.deferred = false,
                    }
                    r.retry = Some(e);
                    self.rescan = Some(r);
                    return false;
                }
                since_clock = 64;
            }
            if since_clock >= 64 {
                since_clock = 0;
                if budget.is_some_and(|b| started.elapsed() >= b) {
                    self.rescan = Some(r);
                    return false;
                }
            }
        }
        true
    }

    fn on_inotify(&mut self) {
        let mut names = HashSet::new();
        for ev in self.ino.read_events() {
            if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                log("inotify queue overflow: rescanning");
                self.begin_scan();
                return;
            }
            if ev.wd == self.root_wd {
                if !ev.name.is_empty() && !ev.name.starts_with('.') {
                    names.insert(ev.name);
                }
            } else if let Some(n) = self.wd_names.get(&ev.wd) {
                if ev.name == files::STATUS
                    || ev.name == files::LEASE
                    || ev.mask & libc::IN_IGNORED != 0
                {
                    names.insert(n.clone());
                }
            }
        }
        for n in names {
            self.evaluate(&n);
        }
    }

    /// Look at one run and file it: forget, watch, schedule, or act. Events come in bursts
    /// (renewals, a batch of deadlines): a look at /proc younger than SNAPSHOT_REUSE serves
    /// them all instead of one full scan per event.
    fn evaluate(&mut self, name: &str) {
        let fresh = self
            .snapshot
            .as_ref()
            .is_some_and(|(t, _)| t.elapsed() < SNAPSHOT_REUSE);
        let (taken, looks) = match self.snapshot.take() {
            Some(s) if fresh => s,
            _ => (Instant::now(), Looks::default()),
        };
        self.evaluate_with(name, &looks, false);
        self.snapshot = Some((taken, looks));
    }

    /// Assess `name` and act on the verdict. True when the verdict needs the look at /proc
    /// that `looks` defers and does not have yet (nothing was done).
    fn evaluate_with(&mut self, name: &str, looks: &Looks, whole_pass: bool) -> bool {
        if self.busy.contains(name) {
            return false;
        }
        let dir = self.root.path().join(name);
        let key = status_key(&dir);
        if key.is_some() && self.settled.get(name) == key.as_ref() {
            return false;
        }
        let seen = self.runs.get(name).map(|t| t.seen).unwrap_or_default();
        let (verdict, subject) = assess(
            &self.root,
            name,
            epoch_now(),
            seen,
            &self.opts.policy,
            looks,
            whole_pass,
        );
        if matches!(verdict, Verdict::NeedsLook) {
            return true;
        }
        if let Some(s) = &subject {
            self.note_lease(name, s);
        }
        if !matches!(verdict, Verdict::Skip(_)) {
            self.skipped.remove(name);
        }
        // A record replaced between the look above and the dir's new watch made no event we
        // can see (a launch's `running` record right after its `starting` one, the first
        // naming no deadline): such a run is looked at again at once, now watched.
        let mut missed = false;
        match verdict {
            Verdict::Done => {
                self.forget(name);
                if let Some(k) = key {
                    self.settled.insert(name.to_string(), k);
                }
            }
            Verdict::Skip(why) => {
                // Not settled: the next full scan or SIGHUP looks again. Its watch goes with
                // it, so a change inside the dir (a record repaired) waits for that scan; the
                // root's events are seen at once (a run dir whose mode or owner is fixed, the
                // dir removed or made again).
                self.forget(name);
                if self.skipped.get(name) != Some(&why) {
                    log(&format!("{name}: skipped: {why}"));
                    journal_once(&self.root, name, &why);
                    self.skipped.insert(name.to_string(), why);
                }
            }
            Verdict::Watch {
                wrapper,
                recheck_epoch,
            } => {
                missed = self.track_dir(name) && status_key(&dir) != key;
                let t = self.runs.entry(name.to_string()).or_default();
                if t.wrapper.is_none() {
                    let token = self.next_token;
                    self.next_token += 1;
                    if self.epoll.add(wrapper.as_raw_fd(), token).is_ok() {
                        self.tokens.insert(token, name.to_string());
                        let t = self.runs.get_mut(name).expect("just inserted");
                        t.wrapper = Some((wrapper, token));
                    }
                }
                if let Some(e) = recheck_epoch {
                    self.heap
                        .push(Reverse((Instant::now() + delay_until(e), name.to_string())));
                }
            }
            Verdict::Later { act_epoch, .. } => {
                missed = self.track_dir(name) && status_key(&dir) != key;
                self.drop_wrapper(name);
                self.heap.push(Reverse((
                    Instant::now() + delay_until(act_epoch),
                    name.to_string(),
                )));
            }
            Verdict::Now(action) => {
                self.drop_wrapper(name);
                if let Some(s) = subject {
                    self.spawn_action(name, s, action);
                }
            }
            // Returned above.
            Verdict::NeedsLook => {}
        }
        if missed {
            // Watched now: this second look adds no watch, so it makes no third.
            return self.evaluate_with(name, looks, whole_pass);
        }
        false
    }

    /// Remember what the look saw; say once that lease.json is damaged.
    fn note_lease(&mut self, name: &str, s: &Subject) {
        let t = self.runs.entry(name.to_string()).or_default();
        t.seen = s.seen;
        if report_lease_damage(s, t.lease_damage.as_deref()) {
            t.lease_damage = s.lease_damaged.clone();
        }
        if report_record_damage(s, t.record_damage.as_deref()) {
            t.record_damage = s.record_damaged.clone();
        }
    }

    fn spawn_action(&mut self, name: &str, subject: Subject, action: Action) {
        if self.inflight.load(Ordering::SeqCst) >= self.opts.max_parallel {
            self.heap.push(Reverse((
                Instant::now() + Duration::from_millis(50),
                name.to_string(),
            )));
            return;
        }
        self.busy.insert(name.to_string());
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let tx = self.done_tx.clone();
        let inflight = Arc::clone(&self.inflight);
        let n = name.to_string();
        self.threads.push(thread::spawn(move || {
            let line = describe(&subject, action, act(&subject, action));
            log(&line);
            inflight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send((n, line));
        }));
    }

    fn collect_done(&mut self) {
        while let Ok((name, _)) = self.done_rx.try_recv() {
            self.busy.remove(&name);
            self.evaluate(&name);
        }
        self.threads.retain(|h| !h.is_finished());
    }

    fn run_due(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(Reverse((t, _))) = self.heap.peek() {
            if *t > now {
                break;
            }
            let Reverse((_, name)) = self.heap.pop().expect("peeked");
            due.push(name);
        }
        due.sort();
        due.dedup();
        for name in due {
            self.evaluate(&name);
        }
    }

    /// Watch a run dir's record and lease; true when the watch is new.
    fn track_dir(&mut self, name: &str) -> bool {
        let t = self.runs.entry(name.to_string()).or_default();
        if t.wd.is_none() {
            let dir = self.root.path().join(name);
            if let Ok(wd) = self
                .ino
                .add_watch(&dir, Inotify::CHANGED | libc::IN_ONLYDIR)
            {
                t.wd = Some(wd);
                self.wd_names.insert(wd, name.to_string());
                return true;
            }
        }
        false
    }

    fn drop_wrapper(&mut self, name: &str) {
        if let Some(t) = self.runs.get_mut(name) {
            if let Some((fd, token)) = t.wrapper.take() {
                self.epoll.remove(fd.as_raw_fd());
                self.tokens.remove(&token);
            }
        }
    }

    fn forget(&mut self, name: &str) {
        self.drop_wrapper(name);
        if let Some(t) = self.runs.remove(name) {
            if let Some(wd) = t.wd {
                self.ino.rm_watch(wd);
                self.wd_names.remove(&wd);
            }
        }
    }

    /// SIGTERM: take no new work, let the stops in flight finish (bounded), never start a stop
    /// because we are stopping.
    fn shutdown(&mut self) {
        let deadline = Instant::now() + self.opts.shutdown_timeout;
        while self.inflight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            let _ = self.done_rx.recv_timeout(Duration::from_millis(100));
        }
        let left = self.inflight.load(Ordering::SeqCst);
        if left > 0 {
            log(&format!("exiting with {left} stops still in flight"));
        } else {
            log("stopped");
        }
    }
}
