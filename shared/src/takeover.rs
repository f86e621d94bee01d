//! Finishing a run from outside: the one routine `cancel`, the watchdog and the output keeper's
//! stop go through, whatever state the run and its files are in.
//!
//! [`finish`] looks at the run ([`Look`]) until it is over by the kernel's account:
//!
//! - **A live wrapper** is asked: cancel.json, then TERM through its verified pidfd (CONT and a
//!   thaw first when it is stopped or frozen). It gets a bounded time to make progress: its
//!   run's grace + 2 s from the ask ([`Patience::Grace`]), or a second for a wrapper the
//!   watchdog found already past its deadline ([`Patience::Brief`]). A wrapper still not done then is
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

use crate::cgroup::RunCgroup;
use crate::error::Error;
use crate::journal::Journal;
use crate::lifecycle::{finalize, remove_cgroup, timings_of, transition};
use crate::lock::{RunLock, Taken};
use crate::pid::Pid;
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
    let mut t = Takeover {
        dir,
        req,
        journal: &journal,
        lock: dir.lock(),
        notes: Vec::new(),
        asked: None,
        we_signalled: None,
        requested: false,
        took_over: None,
        cgroup: None,
        party_since: None,
        squat_noted: false,
    };
    t.note_damage();
    let mut recheck = RECHECK;
    loop {
        let look = t.look();
        if let Some(st) = look.believed() {
            // With nobody holding the run, a stop asks the facts a record cannot fake: the
            // run's marker (by /proc scans alone), or who is where a process that left its
            // emptied cgroup could be. A process found makes the record a lie.
            let recheck = req.until == Until::Final && matches!(look.holder, Holder::Nobody);
            if !recheck || !final_doubted(dir, &look, st, &journal) {
                return Ok(t.done(Some(st.clone())));
            }
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
            return Err(Failure::TimedOut(t.timed_out()));
        }
        wait_for(wait_on, (req.deadline - now).min(recheck));
        recheck = (recheck * 2).min(RECHECK_MAX);
    }
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
    /// When we first found the live wrapper (the ask, or found stopping): its time to finish
    /// counts from here.
    asked: Option<Instant>,
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
}

impl Takeover<'_> {
    fn look(&mut self) -> Look {
        let known = self.cgroup.as_ref().map(|c| c.path().to_path_buf());
        let shared = Shared {
            cgroup: known.as_deref(),
            ..Shared::default()
        };
        let look = Look::take_with(self.dir, self.dir.read_status(), &shared);
        if self.cgroup.is_none() {
            self.cgroup = look.cgroup.clone();
        }
        look
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
        let reason = self.req.reason.as_str();
        let now = Instant::now();
        // Whether the wrapper is stopping is a kernel fact (its signal mask), never the
        // record's word: then it is never signalled again (a second TERM would cut its grace
        // short).
        let stopping = procfs::marks_stopping(w.pid());
        let first = *self.asked.get_or_insert(now);
        let mut signalled = false;
        if !stopping {
            // Exactly one caller signals: the one that creates cancel.json. A cancel.json that
            // was there (another caller's, or planted by the run) is not a stop: a wrapper still
            // not stopping a second after our first look (or our last TERM) is signalled anyway.
            let created = self.we_signalled.is_none()
                && !self.requested
                && self
                    .dir
                    .request_cancel(self.req.by, &reason)
                    .unwrap_or_else(|e| {
                        self.notes
                            .push(format!("{e}; signalling the wrapper without it"));
                        true
                    });
            self.requested = true;
            let since = self.we_signalled.unwrap_or(first);
            let stale = now.duration_since(since) > Duration::from_secs(1);
            if created || stale {
                unfreeze_wrapper(w, &reason, self.journal);
                if let Err(e) = signal_wrapper(w, Sig::Term, &reason, None, self.journal) {
                    self.notes.push(e.to_string());
                }
                self.we_signalled = Some(now);
                signalled = true;
            }
        }
        if self.req.until == Until::Asked && (signalled || stopping) {
            return Ok(Step::Done);
        }
        let patience = match self.req.patience {
            Patience::Grace => timings_of_look(look).grace + SLACK,
            Patience::Brief => BRIEF,
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
            json!({"why": why, "wrapper_pid": w.pid().get(), "reason": &*reason}),
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
        if !kill_wrapper(w, &reason, self.journal, Duration::from_secs(2)) {
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
            self.lock.lock_dir_only()?
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

/// With the run's lock held (or its dir's, against a squatter) and its wrapper gone: stop
/// whatever of the run remains through the shared routine and write the final record once.
///
/// The record informs and the kernel decides: the run's cgroup is the one found by name (a
/// record that names another, or none, or says procfs, changes nothing), and a record that is
/// missing or damaged is written anew from what is known. The final word:
///
/// - processes were found and stopped, and the run's cgroup is empty: `cancelled`, with
///   `reason` (proof `cgroup_empty`);
/// - processes were found and stopped by /proc scans alone: `unknown`, reason `unprovable`
///   (a process of the run that left its session and cleared its environment cannot be found
///   once the wrapper is gone);
/// - nothing of the run was found: `unknown`, reason `wrapper_lost` (but `cancelled` when the
///   wrapper was taken over in its own stop and the kernel proves the run empty);
/// - something survived: `unknown`, reason `survivors`; a process that may have left the
///   emptied cgroup: `unknown`, reason `escaped`.
///
/// `took_over`: the live wrapper had the run's grace and did not finish with it, so the
/// processes get TERM and, at once, KILL.
pub fn finish_orphan(
    dir: &RunDir,
    look: Look,
    by: &str,
    reason: Reason,
    how: &str,
    took_over: Option<TookOver>,
    journal: &Journal,
) -> std::result::Result<Status, Failure> {
    // Under the lock: what the record says now is what is finished.
    let record = dir.read_status();
    let record_lost = record.is_err();
    let mut st = match record {
        Ok(st) if st.state.is_final() => {
            let members = match &look.cgroup {
                Some(cg) if holds_processes(cg) => cg.members(),
                Some(cg) => possible_escapees(dir, &st, cg),
                None => marked_alive(dir, &st),
            };
            if members.is_empty() {
                return Ok(st);
            }
            let _ = journal.event(
                "record_contradicted",
                json!({"recorded_state": st.state.as_str(), "recorded_reason": st.reason,
                       "cgroup": look.cgroup.as_ref().map(|c| c.path()),
                       "members": pid_list(&members),
                       "why": "the record says the run is over, but processes of the run live"}),
            );
            reopened(st)
        }
        Ok(st) => st,
        Err(e) => {
            // No record, or one that cannot be read: a launch that died before its first
            // record, or a record the workload removed. Either way what carries the run's
            // marker is stopped; what was found says which it was.
            let _ = journal.event("record_damaged", json!({"error": e.to_string()}));
            let mut st = Status::blank(dir.id().as_str());
            st.state = State::Running;
            st.error = Some(format!("the run's record was lost ({e}); written anew"));
            st
        }
    };
    // The cgroup found by name decides the mode, whatever the record says.
    match &look.cgroup {
        Some(cg) => st.containment = Some(Containment::cgroup(cg.path())),
        None => {
            if st
                .containment
                .as_ref()
                .is_some_and(|c| c.mode == ContainmentMode::Cgroup)
            {
                // The record names a cgroup that is not there (removed, or never the run's):
                // the run is held by what /proc shows.
                st.containment = Some(Containment::procfs());
            }
        }
    }
    let _ = dir.request_cancel(by, &reason.as_str());
    let _ = journal.event(
        "takeover",
        json!({"why": how, "reason": &*reason.as_str(), "state": st.state.as_str()}),
    );
    let scope = scope_of(dir, &st, look.cgroup.clone(), journal);
    if st.state != State::Cancelling {
        // A record that cannot be written (a full disk, a dir made read-only) never keeps
        // the processes alive.
        let _ = transition(
            dir,
            &mut st,
            State::Cancelling,
            Some(&reason.as_str()),
            Some(journal),
        );
    }
    let mut timings = timings_of(&st);
    if took_over.is_some() {
        timings.hup_after = Duration::ZERO;
        timings.grace = Duration::ZERO;
    }
    let mut report = match &scope {
        Some(scope) => stop_run(scope, &timings, &reason.as_str(), Some(journal), None),
        None => Report::default(),
    };
    // The cgroup is empty: where a process that left it could be, who is there?
    if let (Some(cg), Some(scope)) = (&look.cgroup, &scope) {
        if report.proof == Some(Proof::CgroupEmpty) {
            report.escapees = escapees_of(cg, scope.leader, journal);
        }
    }
    let rebooted = !st.boot_id.is_empty() && st.boot_id != procfs::boot_id();
    let (state, why) = final_word(&report, reason, rebooted, took_over);
    if record_lost && why == Reason::WrapperLost {
        st.error = Some(
            "no record, and nothing of the run found: its wrapper died before it wrote the \
             first record, or the record was removed after the run ended"
                .into(),
        );
    }
    st.exit_code = None;
    st.term_signal = None;
    if let Some(cg) = &look.cgroup {
        st.resources = Some(cg.resources());
    }
    finalize(
        dir,
        &mut st,
        state,
        Some(&why.as_str()),
        Some(&report),
        Some(journal),
    )
    .or_else(|e| match dir.read_status() {
        // Another party finished it meanwhile (a squatted or stalled lock gives no
        // exclusivity): that record is the answer.
        Ok(fin) if fin.state.is_final() => {
            st = fin;
            Ok(())
        }
        _ => Err(Failure::RecordFailed(format!(
            "the run's processes were stopped, but its final record could not be written: {e}"
        ))),
    })?;
    if let Some(cg) = &look.cgroup {
        remove_cgroup(cg, journal);
    }
    Ok(st)
}

/// Whether a run's cgroup holds processes, as a contradiction of its final record needs it
/// shown: `populated 1` and a member listed. A cgroup that says populated with no member
/// listed is settling (seen under load, right after its last process exited): it is given
/// up to [`SETTLE`] to say `populated 0`.
fn holds_processes(cg: &RunCgroup) -> bool {
    let until = Instant::now() + SETTLE;
    loop {
        if !cg.populated() {
            return false;
        }
        if !cg.members().is_empty() {
            return true;
        }
        if Instant::now() >= until {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The live processes that carry the run's marker and started after its dir was made (a run
/// held by /proc scans alone, its record final: what the record cannot say). One scan of /proc.
pub fn marked_alive(dir: &RunDir, st: &Status) -> Vec<Pid> {
    let Some(scope) = scope_without_leader(dir, st, None) else {
        return Vec::new();
    };
    crate::procset::discover(
        &scope,
        crate::procset::Depth::WithMarker,
        &Default::default(),
    )
    .into_iter()
    .map(|s| s.pid)
    .collect()
}

/// Whether a final record that nobody holds is doubted by a fact it cannot fake: by /proc scans
/// alone, a live process carries the run's marker; in a cgroup, the cgroup is still there (the
/// one who writes a final record removes it) and a process that may have left it lives where
/// it could have gone. A cgroup left behind with no such process is removed.
pub fn final_doubted(dir: &RunDir, look: &Look, st: &Status, journal: &Journal) -> bool {
    match &look.cgroup {
        None => !marked_alive(dir, st).is_empty(),
        Some(cg) => {
            if !possible_escapees(dir, st, cg).is_empty() {
                return true;
            }
            remove_cgroup(cg, journal);
            false
        }
    }
}

/// The processes that may have left the run's empty cgroup ([`crate::escape::look`], from the
/// run's leader, or its dir's birth when the record's leader cannot be used). Not journalled.
fn possible_escapees(dir: &RunDir, st: &Status, cg: &RunCgroup) -> Vec<Pid> {
    let Some(top) = crate::escape::reach(cg) else {
        return Vec::new();
    };
    let first = match check_record(st).ok().and_then(|_| st.leader()) {
        Some(leader) => leader,
        None => match scope_without_leader(dir, st, None) {
            Some(scope) => scope.leader,
            None => return Vec::new(),
        },
    };
    crate::escape::look(&top, first, crate::sys::geteuid())
}

/// How long [`holds_processes`] lets a cgroup settle.
const SETTLE: Duration = Duration::from_millis(500);

/// The final state and reason of a run stopped without its wrapper (see [`finish_orphan`]);
/// `rebooted`: its record is from an earlier boot.
fn final_word(
    report: &Report,
    reason: Reason,
    rebooted: bool,
    took_over: Option<TookOver>,
) -> (State, Reason) {
    let proven = matches!(report.proof, Some(Proof::CgroupEmpty | Proof::TreeWalk));
    if took_over == Some(TookOver::Stopping) && proven && report.survivors.is_empty() {
        // A wrapper killed in the middle of its own stop: the stop is what ended the run.
        return (State::Cancelled, reason);
    }
    if report.signalled.is_empty() && report.survivors.is_empty() {
        let why = if rebooted {
            Reason::HostRebooted
        } else {
            Reason::WrapperLost
        };
        return (State::Unknown, why);
    }
    match report.proof {
        Some(Proof::CgroupEmpty) | Some(Proof::TreeWalk) => (State::Cancelled, reason),
        Some(Proof::Unprovable) => (State::Unknown, Reason::Unprovable),
        // Survivors: finalize says `unknown`, `survivors`.
        None => (State::Cancelled, reason),
    }
}

/// The processes that may have left the run's cgroup (see [`crate::escape`]), each
/// journalled `escapee`.
fn escapees_of(cg: &RunCgroup, leader: crate::pid::Identity, journal: &Journal) -> Vec<Pid> {
    let Some(top) = crate::escape::reach(cg) else {
        return Vec::new();
    };
    let found = crate::escape::look(&top, leader, crate::sys::geteuid());
    for p in &found {
        let _ = journal.event(
            "escapee",
            json!({"pid": p.get(), "where": top,
                   "why": "a process of the run's user, started after the run, in a cgroup a process of the run could have moved to; not signalled"}),
        );
    }
    found
}

/// A final record the run's cgroup contradicts, back to `running` (the processes are stopped
/// as an orphan's).
fn reopened(mut st: Status) -> Status {
    st.state = State::Running;
    st.reason = None;
    st.exit_code = None;
    st.term_signal = None;
    st.ended_at = None;
    st.cleanup = None;
    st.proof = None;
    st
}

/// The scope of a stop without the wrapper: the cgroup found by name; the record's leader
/// only when its identity holds ([`check_record`]), else the marker alone, from the run dir's
/// birth. `None` when nothing describes the run (no cgroup, no leader, no wrapper recorded).
fn scope_of(
    dir: &RunDir,
    st: &Status,
    cgroup: Option<RunCgroup>,
    journal: &Journal,
) -> Option<RunScope> {
    if let Err(e) = check_record(st) {
        let _ = journal.event(
            "record_unusable",
            json!({"why": e.to_string(), "using": "the run's cgroup and marker only"}),
        );
        let mut blind = st.clone();
        blind.pid = None;
        blind.pgid = None;
        blind.sid = None;
        blind.start_ticks = None;
        return dir
            .scope_held(&blind, None, cgroup.clone())
            .or_else(|| scope_without_leader(dir, &blind, cgroup));
    }
    match dir.scope_held(st, None, cgroup.clone()) {
        Some(scope) => Some(scope),
        None => scope_without_leader(dir, st, cgroup),
    }
}

/// A scope for a run whose record names no usable leader or wrapper: the cgroup, and every
/// process carrying the run's marker that started after its dir was made.
fn scope_without_leader(dir: &RunDir, st: &Status, cgroup: Option<RunCgroup>) -> Option<RunScope> {
    let born = dir
        .born()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| procfs::epoch_to_ticks(d.as_secs_f64()).saturating_sub(2));
    // The dir's birth stands in for the wrapper: the marker decides, from then on. Pid 1 is
    // a placeholder that is never a member, never signalled and lends no pid floor.
    let leader = crate::pid::Identity {
        pid: Pid::new(1).expect("1 is a pid"),
        start_ticks: born.unwrap_or(0),
    };
    Some(RunScope {
        run_id: st.run_id.clone(),
        leader,
        uid: crate::sys::geteuid(),
        wrapper: None,
        run_dir: Some(dir.identity()),
        marker_only: true,
        floor_ticks: leader.start_ticks,
        cgroup,
        exclude: Vec::new(),
    })
}
