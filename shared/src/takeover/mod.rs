//! Finishing a run from outside: the one routine `cancel`, the watchdog and the output keeper's
//! stop go through, whatever state the run and its files are in.
//!
//! [`finish`] looks at the run ([`Look`]) until it is over by the kernel's account:
//!
//! - **A live wrapper** is asked: cancel.json, then TERM through its verified pidfd (CONT and a
//!   thaw first when it is stopped or frozen). It gets a bounded time to make progress: its
//!   run's grace + 2 s from the ask ([`Patience::Grace`]), or a second for a wrapper the
//!   watchdog found already past its deadline ([`Patience::Brief`]) unless that wrapper begins
//!   its own stop once asked (then its grace + 2 s too). A wrapper still not done then is
//!   taken over ([`crate::wrapper::kill_wrapper`]: thaw, CONT, KILL), unless it is visibly
//!   finishing (it is stopping, running, and nothing of its run is left but its output keeper).
//! - **Nobody holds the run** (its wrapper is gone): the caller takes the lock and stops the run
//!   through the shared routine ([`finish_orphan`]), and writes its final record once.
//! - **A party holds it** (another `cancel`, the watchdog): its record is waited for.
//! - **A squatter holds it** (a process that is not agent-run, on a dead wrapper's lock): the
//!   caller takes the dir's lock and finishes the run without the file's.
//!
//! Nothing a run file says can stop this: a missing or damaged record, journal or lock file is
//! named ([`Finished::notes`]) and the stop goes on from kernel facts (the cgroup found by name,
//! the marker). A final record that cannot be written is an error, after the processes were
//! stopped all the same.

mod orphan;

pub use orphan::*;

use crate::cgroup::RunCgroup;
use crate::error::Error;
use crate::journal::Journal;
use crate::lifecycle::{finalize, remove_cgroup, timings_of, transition};
use crate::lock::{RunLock, Taken};
use crate::pid::{Identity, Pid};
use crate::procfs;
use crate::procset::RunScope;
use crate::reason::Reason;
use crate::record::{Containment, ContainmentMode, Proof, State, Status};
use crate::run_dir::RunDir;
use crate::stop::{stop_run, Report, Sig, Timings};
use crate::verdict::{Look, Shared};
use crate::wrapper::{
    check_record, kill_wrapper, signal_wrapper, unfreeze_wrapper, Holder, VerifiedWrapper,
};
use serde_json::json;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// When [`finish`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// With the run's final record, believed.
    Final,
    /// Once a live wrapper was signalled by us or is stopping (its signal mask says so); a
    /// run without a live wrapper is still finished to its final record. The output keeper
    /// asks this way: the wrapper's final record waits for the keeper.
    Asked,
}

/// How long a live wrapper gets to finish what it was asked before it is taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patience {
    /// The run's grace + [`SLACK`] from the ask.
    Grace,
    /// A second ([`BRIEF`]): it is already past every deadline (the watchdog's stuck
    /// wrapper), and gets only the moment a wrapper that is merely slow needs to write its
    /// record.
    Brief,
}

/// What [`Patience::Brief`] gives.
pub const BRIEF: Duration = Duration::from_secs(1);

/// What a wrapper gets beyond its grace to show progress.
pub const SLACK: Duration = Duration::from_secs(2);

/// What another party gets beyond the run's grace + [`SLACK`] to finish the run it holds.
const PARTY_EXTRA: Duration = Duration::from_secs(5);

/// A request to finish a run.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Who asks (the journal's `by`, cancel.json's `source`).
    pub by: &'static str,
    /// Why the run is stopped.
    pub reason: Reason,
    pub until: Until,
    pub patience: Patience,
    /// Give up (the run not final by then) at this moment.
    pub deadline: Instant,
}

/// How [`finish`] ended.
#[derive(Debug)]
pub struct Finished {
    /// The final record; `None` when [`Until::Asked`] returned at the ask.
    pub record: Option<Status>,
    /// What was found wrong on the way (a damaged file, a wrapper taken over), for the caller's
    /// output; each is in the journal too.
    pub notes: Vec<String>,
}

/// Why [`finish`] could not end the run.
#[derive(Debug)]
pub enum Failure {
    /// The deadline passed; the run's state then, and why.
    TimedOut(String),
    /// The processes were stopped, but the final record could not be written.
    RecordFailed(String),
    /// Anything else (an I/O error on the lock, say).
    Other(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Other(e)
    }
}

/// How often the run is looked at again while a party or a live wrapper finishes it: from
/// [`RECHECK`] doubling up to [`RECHECK_MAX`]. A wrapper's exit wakes the wait at once.
const RECHECK: Duration = Duration::from_millis(20);
const RECHECK_MAX: Duration = Duration::from_millis(320);

/// Finish the run in `dir` as `req` asks.
pub fn finish(dir: &RunDir, req: &Request) -> std::result::Result<Finished, Failure> {
    let journal = dir.journal(req.by);
    let mut t = Takeover::new(dir, req, &journal);
    t.note_damage();
    let mut recheck = RECHECK;
    loop {
        let look = t.look();
        if let Some(st) = answer(dir, req, &look, &journal, t.asker()) {
            return Ok(t.done(Some(st)));
        }
        let wait_on = match &look.holder {
            Holder::Wrapper(w) => match t.live_wrapper(w, &look)? {
                Step::Done => return Ok(t.done(None)),
                Step::Again => continue,
                Step::Wait => Some(w),
            },
            Holder::Nobody => {
                if let Some(st) = t.orphan(look, false)? {
                    return Ok(t.done(Some(st)));
                }
                None
            }
            Holder::Squatter(pids) => {
                if !t.squat_noted {
                    t.squat_noted = true;
                    let _ = journal.event("lock_squatted", json!({"holders": pid_list(pids)}));
                    t.notes.push(format!(
                        "the run's lock is squatted by pid {}; finishing the run without it",
                        pid_list(pids).join(", ")
                    ));
                }
                if let Some(st) = t.orphan(look, true)? {
                    return Ok(t.done(Some(st)));
                }
                None
            }
            // Another canceller or the watchdog is finishing the run: its record is the answer,
            // within the time a stop takes. A "party" that holds the run longer (stopped, or a
            // process of the workload that only looks like one) does not keep it from ending:
            // the run is finished without the lock.
            Holder::Party(pids) => {
                let since = *t.party_since.get_or_insert_with(Instant::now);
                let patience = timings_of_look(&look).grace + SLACK + PARTY_EXTRA;
                if since.elapsed() >= patience {
                    let _ = journal.event(
                        "party_stalled",
                        json!({"holders": pid_list(pids), "for_ms": since.elapsed().as_millis() as u64}),
                    );
                    t.notes.push(format!(
                        "pid {} held the run's lock for {:?} without finishing it; finished without the lock",
                        pid_list(pids).join(", "),
                        since.elapsed()
                    ));
                    let st = finish_orphan(
                        dir,
                        look,
                        req.by,
                        req.reason,
                        "a party held the run's lock too long",
                        t.took_over,
                        &journal,
                    )?;
                    return Ok(t.done(Some(st)));
                }
                None
            }
        };
        let now = Instant::now();
        if now >= req.deadline {
            // A record made final since the look above is the answer, not a time-out.
            let look = t.look();
            return match answer(dir, req, &look, &journal, t.asker()) {
                Some(st) => Ok(t.done(Some(st))),
                None => Err(Failure::TimedOut(t.timed_out())),
            };
        }
        wait_for(wait_on, (req.deadline - now).min(recheck));
        recheck = (recheck * 2).min(RECHECK_MAX);
    }
}

/// The final record `look` found, when it is the answer: the kernel agrees the run is over. With
/// nobody holding the run, a stop also asks the facts a record cannot fake: the run's marker (by
/// /proc scans alone), or who is where a process that left its emptied cgroup could be. A
/// process found makes the record a lie.
fn answer(
    dir: &RunDir,
    req: &Request,
    look: &Look,
    journal: &Journal,
    asker: Asker,
) -> Option<Status> {
    let st = look.believed()?;
    let recheck = req.until == Until::Final && matches!(look.holder, Holder::Nobody);
    (!recheck || !final_doubted(dir, look, st, journal, asker)).then(|| st.clone())
}

/// How a live wrapper was taken over: idle (its stop never began), or in its own stop (by
/// its signal mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TookOver {
    Idle,
    Stopping,
}

/// What to do after a look at a live wrapper.
enum Step {
    /// [`Until::Asked`] is satisfied.
    Done,
    /// Look again at once (the wrapper was just taken over).
    Again,
    /// Wait for the wrapper's exit or the next look.
    Wait,
}

struct Takeover<'a> {
    dir: &'a RunDir,
    req: &'a Request,
    journal: &'a Journal,
    lock: RunLock,
    notes: Vec<String>,
    /// When we asked the live wrapper (our TERM), or first found it stopping: its time to
    /// finish counts from here.
    asked: Option<Instant>,
    /// When we first found the live wrapper, not yet asked (a TERM of ours follows a second
    /// later if it does not start its stop).
    first_look: Option<Instant>,
    /// When we last signalled it.
    we_signalled: Option<Instant>,
    /// Whether we tried to create cancel.json (once).
    requested: bool,
    /// The live wrapper was taken over: the run's grace was spent waiting for it.
    took_over: Option<TookOver>,
    /// The run's cgroup, once found (it does not move).
    cgroup: Option<RunCgroup>,
    /// Since when another party holds the run.
    party_since: Option<Instant>,
    squat_noted: bool,
    /// The run's wrapper, once a look found it alive (verified by kernel facts).
    seen: Option<Identity>,
    /// When the last look began.
    looked: Instant,
}

impl<'a> Takeover<'a> {
    fn new(dir: &'a RunDir, req: &'a Request, journal: &'a Journal) -> Takeover<'a> {
        Takeover {
            dir,
            req,
            journal,
            lock: dir.lock(),
            notes: Vec::new(),
            asked: None,
            first_look: None,
            we_signalled: None,
            requested: false,
            took_over: None,
            cgroup: None,
            party_since: None,
            squat_noted: false,
            seen: None,
            looked: Instant::now(),
        }
    }

    /// Look at the run; remember its cgroup, and its wrapper when it is alive.
    fn look(&mut self) -> Look {
        self.looked = Instant::now();
        let known = self.cgroup.as_ref().map(|c| c.path().to_path_buf());
        let shared = Shared {
            cgroup: known.as_deref(),
            ..Shared::default()
        };
        let look = Look::take_with(self.dir, self.dir.read_status(), &shared);
        if self.cgroup.is_none() {
            self.cgroup = look.cgroup.clone();
        }
        if let Some(w) = look.wrapper() {
            self.seen = Some(w.identity());
        }
        look
    }

    /// What a check of a final record nobody holds may lean on (see [`Asker`]).
    fn asker(&self) -> Asker {
        Asker {
            since: self.looked,
            wrapper: self.seen,
        }
    }

    /// Say once what the run dir's files made us work around.
    fn note_damage(&mut self) {
        let mut found: Vec<String> = self.lock.damage.clone();
        match self.dir.read_status() {
            Ok(_) | Err(Error::Missing { .. }) => {}
            Err(e) => found.push(format!("{e}; going by the kernel's facts")),
        }
        found.extend(self.dir.repaired().map(str::to_string));
        if let Some(why) = self.journal.broken() {
            found.push(format!("the journal writes nothing: {why}"));
        }
        for what in found {
            let _ = self.journal.event("damaged", json!({"what": what}));
            self.notes.push(what);
        }
    }

    fn done(self, record: Option<Status>) -> Finished {
        Finished {
            record,
            notes: self.notes,
        }
    }

    /// Ask a live wrapper, give it its time, and take it over when that is spent.
    fn live_wrapper(
        &mut self,
        w: &VerifiedWrapper,
        look: &Look,
    ) -> std::result::Result<Step, Failure> {
        let reason = self.req.reason;
        let now = Instant::now();
        // Whether the wrapper is stopping is a kernel fact (its signal mask), never the
        // record's word: then it is never signalled again (a second TERM would cut its grace
        // short).
        let stopping = procfs::marks_stopping(w.pid());
        let seen = *self.first_look.get_or_insert(now);
        let mut signalled = false;
        if !stopping {
            // Exactly one caller signals: the one that creates cancel.json. A cancel.json that
            // was there (another caller's, or planted by the run) is not a stop: a wrapper still
            // not stopping a second after our first look (or our last TERM) is signalled anyway.
            let created = self.we_signalled.is_none()
                && !self.requested
                && self
                    .dir
                    .request_cancel(self.req.by, reason)
                    .unwrap_or_else(|e| {
                        self.notes
                            .push(format!("{e}; signalling the wrapper without it"));
                        true
                    });
            self.requested = true;
            let since = self.we_signalled.unwrap_or(seen);
            let stale = now.duration_since(since) > Duration::from_secs(1);
            if created || stale {
                unfreeze_wrapper(w, reason, self.journal);
                if let Err(e) = signal_wrapper(w, Sig::Term, reason, None, self.journal) {
                    self.notes.push(e.to_string());
                }
                self.we_signalled = Some(now);
                signalled = true;
            }
        }
        if self.req.until == Until::Asked && (signalled || stopping) {
            return Ok(Step::Done);
        }
        if !(signalled || stopping) && self.asked.is_none() {
            // Not asked yet (another caller's cancel.json is there): a TERM of ours follows
            // within a second. The wrapper's time to finish counts from the ask.
            return Ok(Step::Wait);
        }
        let first = *self.asked.get_or_insert(now);
        // A wrapper in its own stop gets its grace from the ask, whatever the caller's
        // patience: it makes progress (a stuck one, CONTinued and asked, may have just begun).
        let patience = match (self.req.patience, stopping) {
            (Patience::Grace, _) | (Patience::Brief, true) => timings_of_look(look).grace + SLACK,
            (Patience::Brief, false) => BRIEF,
        };
        if first.elapsed() < patience || finishing(w, look) {
            return Ok(Step::Wait);
        }
        // No progress in its time: the wrapper is stopped, frozen, wedged or lying. End it; the
        // run is then nobody's, and the next look finishes it.
        let why = if stopping {
            "the wrapper did not finish its stop in its grace + 2 s"
        } else {
            "the wrapper did not start its stop in its grace + 2 s"
        };
        let _ = self.journal.event(
            "takeover",
            json!({"why": why, "wrapper_pid": w.pid().get(), "reason": reason}),
        );
        self.notes.push(format!(
            "{why}: killed it (pid {}) and stopped the run",
            w.pid()
        ));
        self.took_over = Some(if stopping {
            TookOver::Stopping
        } else {
            TookOver::Idle
        });
        if !kill_wrapper(w, reason, self.journal, Duration::from_secs(2)) {
            return Ok(Step::Wait);
        }
        Ok(Step::Again)
    }

    /// The run's wrapper is gone: take the lock (the dir's alone when `squatted`) and finish
    /// the run. `None` when someone else took it first.
    fn orphan(
        &mut self,
        look: Look,
        squatted: bool,
    ) -> std::result::Result<Option<Status>, Failure> {
        let ours = if squatted {
            // Squatters hold nothing: the dir's lock is taken if it is free, and the run is
            // finished either way. A workload that kills its wrapper and flocks its own dir
            // (any process of its user may) must not keep every stop out.
            if !self.lock.lock_dir_only().unwrap_or(false) {
                let _ = self.journal.event("lock_unavailable", json!({}));
            }
            true
        } else {
            match self.lock.try_lock()? {
                Taken::Yes => true,
                // `lock` is held while the dir's was free: its holder is looked at again.
                Taken::Dir | Taken::File => false,
            }
        };
        if !ours {
            return Ok(None);
        }
        let how = if self.took_over.is_some() {
            "the wrapper was taken over"
        } else if squatted {
            "the wrapper is gone; its lock is squatted"
        } else {
            "the wrapper is gone"
        };
        finish_orphan(
            self.dir,
            look,
            self.req.by,
            self.req.reason,
            how,
            self.took_over,
            self.journal,
        )
        .map(Some)
    }

    /// What `finish` says when its deadline passes.
    fn timed_out(&self) -> String {
        let state = self
            .dir
            .read_status()
            .map(|st| st.state.as_str().to_string())
            .unwrap_or_else(|e| format!("without a readable record ({e})"));
        format!("run {} is still {state}", self.dir.id())
    }
}

/// A wrapper is finishing (not to be taken over yet) while it is stopping, runs (not stopped,
/// not frozen), and nothing of its run is left: its cgroup is empty, and its only live child is
/// its output keeper. It is then waiting for the keeper's counts, or writing its record.
fn finishing(w: &VerifiedWrapper, look: &Look) -> bool {
    if !procfs::marks_stopping(w.pid()) || procfs::stopped_or_stopping(w.pid()) || look.populated {
        return false;
    }
    let frozen = procfs::cgroup_of(w.pid())
        .and_then(|rel| crate::cgroup::mount().map(|m| m.join(rel.trim_start_matches('/'))))
        .is_some_and(|cg| {
            procfs::read_kernel_file(cg.join("cgroup.events"))
                .is_ok_and(|e| e.lines().any(|l| l.trim() == "frozen 1"))
        });
    !frozen
        && procfs::children_of(w.pid()).into_iter().all(|c| {
            procfs::stat(c).is_none_or(|s| s.is_dead())
                || procfs::comm(c).as_deref() == Some("agent-run-keep")
        })
}

/// The stop timings of the run a look saw (the defaults when its record cannot be read).
fn timings_of_look(look: &Look) -> Timings {
    look.record.as_ref().map(timings_of).unwrap_or_default()
}

/// Wait for a wrapper's exit, or `timeout`.
fn wait_for(w: Option<&VerifiedWrapper>, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let mut fds: Vec<crate::sys::PollFd> = w
        .map(|w| crate::sys::PollFd {
            fd: w.fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .into_iter()
        .collect();
    let _ = crate::sys::poll(&mut fds, Some(timeout));
}

fn pid_list(p: &[Pid]) -> Vec<String> {
    p.iter().map(|p| p.to_string()).collect()
}
