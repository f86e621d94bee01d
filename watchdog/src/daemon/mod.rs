//! The daemon: event-driven over the root (inotify, a pidfd per live wrapper in one epoll set,
//! a deadline heap), with a full pass every `scan_interval` as the backstop. Its parts:
//! `rescan` (the full pass, in slices), `events` (one run looked at and filed), `stops`
//! (stops on threads of their own, and the deadlines).

mod events;
mod rescan;
mod stops;

use rescan::{Rescan, SLICE};

use crate::act::act;
use crate::assess::{assess, delay_until, Action, Looks, Policy, Seen, Subject, Verdict};
use crate::ledger::Settled;
use crate::notify::Notifier;
use crate::pass::{self, Entry, Pass};
use crate::report::{describe, journal_once, log, report_lease_damage, report_record_damage};
use crate::root_lock::lock_root;
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
    let mut d = Daemon::new(opts, root, &flags)?;
    let mut said = Said::new(Notifier::from_env());
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
    said.notifier.send("READY=1");
    let mut next_scan = Instant::now() + d.opts.scan_interval;
    loop {
        let deadline = [
            Some(next_scan),
            d.heap.peek().map(|r| r.0 .0),
            said.next_ping,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(next_scan);
        let tokens = d.epoll.wait(Some(d.wait_until(deadline)))?;
        for t in tokens {
            d.on_token(t, &flags);
        }
        if flags.term.load(Ordering::SeqCst) {
            said.notifier.send("STOPPING=1");
            log("stopping: no new work; waiting for stops in flight");
            d.shutdown();
            return Ok(());
        }
        if flags.hup.swap(false, Ordering::SeqCst) {
            log("SIGHUP: rescanning");
            d.begin_scan();
            if let Some(r) = d.rescan.as_mut() {
                r.say_end = true;
            }
        }
        d.collect_done();
        d.run_due();
        if d.rescan.is_none() && Instant::now() >= next_scan {
            d.begin_scan();
        }
        if d.rescan.is_some() && d.scan_slice(Some(SLICE)) {
            next_scan = Instant::now() + d.opts.scan_interval;
        }
        said.tell(&d);
    }
}

/// What the daemon tells its service manager: the watchdog pings, and its status line when it
/// changed.
struct Said {
    notifier: Notifier,
    next_ping: Option<Instant>,
    last_status: String,
}

impl Said {
    fn new(notifier: Notifier) -> Said {
        Said {
            next_ping: notifier.ping_every.map(|p| Instant::now() + p),
            notifier,
            last_status: String::new(),
        }
    }

    fn tell(&mut self, d: &Daemon) {
        if let (Some(p), Some(every)) = (self.next_ping, self.notifier.ping_every) {
            if Instant::now() >= p {
                self.notifier.send("WATCHDOG=1");
                self.next_ping = Some(Instant::now() + every);
            }
        }
        let status = format!(
            "STATUS=watching {} runs, {} stops in flight",
            d.runs.len(),
            d.inflight.load(Ordering::SeqCst)
        );
        if status != self.last_status {
            self.notifier.send(&status);
            self.last_status = status;
        }
    }
}

impl Daemon {
    /// The daemon over `root`: its epoll set (signals, inotify), the root's watch.
    fn new(opts: Options, root: Root, flags: &Flags) -> anyhow::Result<Daemon> {
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
        Ok(Daemon {
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
        })
    }

    /// How long to sleep in epoll: until `deadline`. A pass in progress only looks at what is
    /// ready, and goes on with its next slice; while stops are in flight it gives them the CPU
    /// for a slice's time between two slices (a stop's duration is a lease's lateness; the pass
    /// is only the backstop).
    fn wait_until(&self, deadline: Instant) -> Duration {
        let left = deadline.saturating_duration_since(Instant::now());
        match &self.rescan {
            Some(r) if r.waiting() || self.inflight.load(Ordering::SeqCst) > 0 => SLICE.min(left),
            Some(_) => Duration::ZERO,
            None => left,
        }
    }

    /// One ready fd: the signal pipe (drained: the flags say which), inotify, or a wrapper's
    /// pidfd (it exited: look at its run now).
    fn on_token(&mut self, t: u64, flags: &Flags) {
        match t {
            TOKEN_SIGNALS => {
                let mut buf = [0u8; 64];
                while matches!(std::io::Read::read(&mut &flags.read, &mut buf), Ok(n) if n > 0) {}
            }
            TOKEN_INOTIFY => self.on_inotify(),
            t => {
                if let Some(name) = self.tokens.get(&t).cloned() {
                    self.evaluate(&name);
                }
            }
        }
    }
}
