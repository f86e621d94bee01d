//! The daemon's full pass, worked through in slices between which the loop serves deadlines
//! and events.

use super::*;

/// A full pass in progress: the entries listed when it began, worked through in slices of at
/// most [`SLICE`], between which the loop serves the deadlines that fell due and the events
/// that came (a pass over 10,000 dirs that need the careful path takes seconds; a deadline
/// must not wait for it). One look at /proc and one cgroup walk serve the whole pass, as when
/// it ran in one go.
pub(super) struct Rescan {
    pass: Pass,
    looks: Looks,
    ents: std::vec::IntoIter<Entry>,
    /// The pass's look at /proc, being taken on a thread of its own (`Looks::deferred`): a look
    /// of a big process table (10,000 processes: their stats and markers, about half a second
    /// here) would hold every deadline due meanwhile behind it.
    look: Option<mpsc::Receiver<agent_run_shared::procset::Snapshot>>,
    /// The entry that asked for the look, assessed again once it is there.
    retry: Option<Entry>,
    /// When the pass began, and over how many run dirs.
    began: Instant,
    dirs: usize,
    /// Its end is said in the log (a pass SIGHUP asked for).
    pub(super) say_end: bool,
}

impl Rescan {
    /// Whether the pass waits for its look (the loop then sleeps between two slices).
    pub(super) fn waiting(&self) -> bool {
        self.look.is_some()
    }
}

/// How long one slice of a full pass works before the loop looks at the clock's deadlines and
/// the events again: the most a due deadline waits behind a pass (plus one run's look).
pub(super) const SLICE: Duration = Duration::from_millis(5);

impl Daemon {
    /// Begin a full pass over the root, the backstop for anything an event missed (one in
    /// progress is dropped: the new one lists the root afresh). [`Daemon::scan_slice`] works
    /// it through.
    pub(super) fn begin_scan(&mut self) {
        self.rescan = None;
        let Some((rootfd, ents)) = pass::list(&self.root) else {
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
        let dirs = ents.len();
        // One look at /proc for the whole pass, not one per run; one look at the flocks.
        self.rescan = Some(Rescan {
            began: Instant::now(),
            dirs,
            say_end: false,
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
    pub(super) fn scan_slice(&mut self, budget: Option<Duration>) -> bool {
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
        while let Some(e) = r.retry.take().or_else(|| r.ents.next()) {
            let name = &e.name;
            if self.busy.contains(name) {
                continue;
            }
            if agent_run_shared::fault::armed(agent_run_shared::fault::SLOW_PASS) {
                thread::sleep(agent_run_shared::fault::SLOW_PASS_STEP);
            }
            // Settled and unchanged: one statx. Final for sure: settled without the careful
            // path. Anything else: the careful path (the costly one). The clock is read after
            // each run dir, whatever it cost (a read of the clock is tens of ns, a statx µs).
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
            }
            if budget.is_some_and(|b| started.elapsed() >= b) {
                self.rescan = Some(r);
                return false;
            }
        }
        if r.say_end {
            log(&format!(
                "pass over {} run dirs done in {:.1?}",
                r.dirs,
                r.began.elapsed()
            ));
        }
        true
    }
}
