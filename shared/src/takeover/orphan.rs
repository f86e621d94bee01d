//! A run nobody holds, finished by the caller under the run's lock: the record to finish, the stop, the final word.

use super::*;

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
    let (mut st, record_lost) = match record_to_finish(dir, &look, journal) {
        ControlFlow::Break(fin) => return Ok(fin),
        ControlFlow::Continue(open) => open,
    };
    hold_by_look(&mut st, &look);
    let _ = dir.request_cancel(by, reason);
    let _ = journal.event(
        "takeover",
        json!({"why": how, "reason": reason, "state": st.state.as_str()}),
    );
    let scope = scope_of(dir, &st, look.cgroup.clone(), journal);
    if st.state != State::Cancelling {
        // A record that cannot be written (a full disk, a dir made read-only) never keeps
        // the processes alive.
        let _ = transition(dir, &mut st, State::Cancelling, Some(reason), Some(journal));
    }
    let mut timings = timings_of(&st);
    if took_over.is_some() {
        timings.hup_after = Duration::ZERO;
        timings.grace = Duration::ZERO;
    }
    let mut report = match &scope {
        Some(scope) => stop_run(scope, &timings, reason, Some(journal), None),
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
    finalize(dir, &mut st, state, Some(why), Some(&report), Some(journal)).or_else(
        |e| match dir.read_status() {
            // Another party finished it meanwhile (a squatted or stalled lock gives no
            // exclusivity): that record is the answer.
            Ok(fin) if fin.state.is_final() => {
                st = fin;
                Ok(())
            }
            _ => Err(Failure::RecordFailed(format!(
                "the run's processes were stopped, but its final record could not be written: {e}"
            ))),
        },
    )?;
    if let Some(cg) = &look.cgroup {
        remove_cgroup(cg, journal);
    }
    Ok(st)
}

/// The record a takeover finishes, read under the lock: a final one that no live process
/// contradicts is the answer as it is (`Break`); else the record to finish (a final one
/// reopened, or one written anew when it was lost) and whether it was lost.
pub(super) fn record_to_finish(
    dir: &RunDir,
    look: &Look,
    journal: &Journal,
) -> ControlFlow<Status, (Status, bool)> {
    // Under the lock: what the record says now is what is finished.
    let record = dir.read_status();
    match record {
        Ok(st) if st.state.is_final() => {
            let members = match &look.cgroup {
                Some(cg) if holds_processes(cg) => cg.members(),
                Some(cg) => possible_escapees(dir, &st, cg),
                None => marked_alive(dir, &st),
            };
            if members.is_empty() {
                return ControlFlow::Break(st);
            }
            let _ = journal.event(
                "record_contradicted",
                json!({"recorded_state": st.state.as_str(), "recorded_reason": st.reason,
                       "cgroup": look.cgroup.as_ref().map(|c| c.path()),
                       "members": pid_list(&members),
                       "why": "the record says the run is over, but processes of the run live"}),
            );
            ControlFlow::Continue((reopened(st), false))
        }
        Ok(st) => ControlFlow::Continue((st, false)),
        Err(e) => {
            // No record, or one that cannot be read: a launch that died before its first
            // record, or a record the workload removed. Either way what carries the run's
            // marker is stopped; what was found says which it was.
            let _ = journal.event("record_damaged", json!({"error": e.to_string()}));
            let mut st = Status::blank(dir.id().as_str());
            st.state = State::Running;
            st.error = Some(format!("the run's record was lost ({e}); written anew"));
            ControlFlow::Continue((st, true))
        }
    }
}

/// The cgroup found by name decides the mode, whatever the record says.
pub(super) fn hold_by_look(st: &mut Status, look: &Look) {
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
}

/// Whether a run's cgroup holds processes, as a contradiction of its final record needs it
/// shown: `populated 1` and a member listed. A cgroup that says populated with no member
/// listed is settling (seen under load, right after its last process exited): it is given
/// up to [`SETTLE`] to say `populated 0`.
pub(super) fn holds_processes(cg: &RunCgroup) -> bool {
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
    marked_alive_in(dir, st, None)
}

/// [`marked_alive`] over the look `snap` when given (one scan for many runs: see
/// [`crate::removal`]), else over a fresh scan.
pub fn marked_alive_in(
    dir: &RunDir,
    st: &Status,
    snap: Option<&crate::procset::Snapshot>,
) -> Vec<Pid> {
    let Some(scope) = scope_without_leader(dir, st, None) else {
        return Vec::new();
    };
    let depth = crate::procset::Depth::WithMarker;
    let found = match snap {
        Some(snap) => crate::procset::discover_in(snap, &scope, depth, &Default::default()),
        None => crate::procset::discover(&scope, depth, &Default::default()),
    };
    found.into_iter().map(|s| s.pid).collect()
}

/// What the caller of [`final_doubted`] knows beyond its look at the run.
#[derive(Debug, Clone, Copy)]
pub struct Asker {
    /// When the look began. Any scan of /proc that began since then will do: it is shared
    /// with the other stops and checks of this process ([`crate::procset::Snapshot::since`]),
    /// so a cancel of many runs does not scan the whole process table once a run.
    pub since: Instant,
    /// The run's wrapper, when the caller saw it alive, verified by kernel facts
    /// ([`crate::wrapper::verify_wrapper`]). It forked the run, so every process of the run
    /// began after it and, while the pid counter has not wrapped since
    /// ([`procfs::only_newer_pids`]), has a higher pid: the scan reads only those. A record's
    /// word never sets this floor. A cancel's last check is cheap with it: the wrapper writes
    /// its final record and exits, and the canceller, woken by that exit, finds nobody holding
    /// the run.
    pub wrapper: Option<Identity>,
}

/// [`marked_alive`] over a look shared as [`Asker`] says.
fn marked_alive_for(dir: &RunDir, st: &Status, asker: Asker) -> Vec<Pid> {
    let floor = asker.wrapper.and_then(procfs::only_newer_pids);
    let snap = crate::procset::Snapshot::since(asker.since, floor);
    marked_alive_in(dir, st, Some(&snap))
}

/// Whether a final record that nobody holds is doubted by a fact it cannot fake: by /proc scans
/// alone, a live process carries the run's marker; in a cgroup, the cgroup is still there (the
/// one who writes a final record removes it) and a process that may have left it lives where
/// it could have gone. A cgroup left behind with no such process is removed.
pub fn final_doubted(
    dir: &RunDir,
    look: &Look,
    st: &Status,
    journal: &Journal,
    asker: Asker,
) -> bool {
    match &look.cgroup {
        None => !marked_alive_for(dir, st, asker).is_empty(),
        Some(cg) => cgroup_doubted(dir, st, cg, journal),
    }
}

/// [`final_doubted`] of a run whose cgroup is still there: a process that may have left it
/// lives where it could have gone. A cgroup left behind with no such process is removed.
pub fn cgroup_doubted(dir: &RunDir, st: &Status, cg: &RunCgroup, journal: &Journal) -> bool {
    if !possible_escapees(dir, st, cg).is_empty() {
        return true;
    }
    remove_cgroup(cg, journal);
    false
}

/// The processes that may have left the run's empty cgroup ([`crate::escape::look`], from the
/// run's leader, or its dir's birth when the record's leader cannot be used). Not journalled.
pub(super) fn possible_escapees(dir: &RunDir, st: &Status, cg: &RunCgroup) -> Vec<Pid> {
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
pub(super) const SETTLE: Duration = Duration::from_millis(500);

/// The final state and reason of a run stopped without its wrapper (see [`finish_orphan`]);
/// `rebooted`: its record is from an earlier boot.
pub(super) fn final_word(
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
pub(super) fn escapees_of(
    cg: &RunCgroup,
    leader: crate::pid::Identity,
    journal: &Journal,
) -> Vec<Pid> {
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
pub(super) fn reopened(mut st: Status) -> Status {
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
pub(super) fn scope_of(
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
pub(super) fn scope_without_leader(
    dir: &RunDir,
    st: &Status,
    cgroup: Option<RunCgroup>,
) -> Option<RunScope> {
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
