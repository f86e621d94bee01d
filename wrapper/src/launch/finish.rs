//! The end of a launch: stop what is left, write the final record, pick the exit code.

use super::*;
use agent_run_shared::stop::Report;

impl Launch {
    pub(super) fn launch_failed(&mut self, code: u8, msg: &str) -> u8 {
        human::say(msg);
        self.st.error = Some(msg.replace('\n', " "));
        // The leader never exited: `exit_code` stays null; the launch's own code is recorded.
        self.st.launch_exit_code = Some(code as i32);
        // A launch that failed before the keeper's fork (still single-threaded then) has its
        // zero counts too, as every run has.
        if let Err(e) = self.fork_keeper() {
            human::say(&format!("{e:#}"));
        }
        self.wait_keeper(false);
        // Said in our signal mask first: a final record is believed while we still live only
        // with this mark (see sys::mark_final).
        sys::mark_final();
        if let Err(e) = finalize(
            &self.dir,
            &mut self.st,
            State::LaunchFailed,
            None,
            None,
            Some(&self.journal),
        ) {
            human::say(&e.to_string());
        }
        if let Some(cg) = &self.cgroup {
            agent_run_shared::lifecycle::remove_cgroup(cg, &self.journal);
        }
        code
    }

    /// After supervision: stop what is left, write the final record, pick the exit code.
    pub(super) fn finish(
        &mut self,
        leader: Identity,
        outcome: Outcome,
        signals: &Signals,
        limits: &Limits,
    ) -> anyhow::Result<u8> {
        let scope = self.scope();
        // 1. How the run ended, and the stop of what is left of it.
        let ended = match outcome {
            Outcome::LeaderExited(ws) => self.leader_exited(&scope, ws, signals),
            Outcome::Stop(reason) => self.stop_asked(&scope, leader, reason, signals, limits),
        };
        // 2. The record's last facts: the leader's status, the resources, the keeper's counts.
        self.note_end(&ended);
        // 3. The final record, then the cgroup.
        // Said in our signal mask first: a final record is believed while we still live only
        // with this mark (see sys::mark_final).
        sys::mark_final();
        let written = finalize(
            &self.dir,
            &mut self.st,
            ended.state,
            ended.reason,
            ended.report.as_ref(),
            Some(&self.journal),
        );
        crate::phases::mark("final_record");
        // The cgroup goes after the final record (a cgroup that still holds a survivor stays,
        // and the record says unknown).
        if let Some(cg) = &self.cgroup {
            agent_run_shared::lifecycle::remove_cgroup(cg, &self.journal);
        }
        crate::phases::mark("cgroup_rm");
        // 4. The exit code.
        if let Err(e) = written {
            let left = ended.report.as_ref().map_or(0, |r| r.survivors.len());
            return fail(
                exit::SOFTWARE,
                format!(
                    "the run ended ({}, {left} survivors) but its final record could not be written: {e}",
                    self.st.state.as_str()
                ),
            );
        }
        if ended.state == State::Cancelled {
            let colour = human::colour_for(human::stderr_is_terminal());
            human::say(&human::final_line(&self.st, colour));
        }
        Ok(exit::for_record(&self.st).unwrap_or(exit::SOFTWARE))
    }

    /// The leader exited on its own. It ends the run; whatever of the run remains is stopped
    /// by the same routine as a cancel.
    fn leader_exited(&mut self, scope: &RunScope, ws: WaitStatus, signals: &Signals) -> Ended {
        let report = self.leftovers(scope).then(|| {
            let r = self.stop_what_is_left(scope, Reason::LeaderExited, signals);
            reap::reap_all(None);
            r
        });
        Ended {
            state: State::Finished,
            reason: None,
            report,
            leader_status: Some(ws),
        }
    }

    /// Whether anything of the run is left after its leader's exit: our children (double-forked
    /// daemons come back to us), the cgroup's members, and processes elsewhere that carry the
    /// marker. Reaps the dead children first.
    fn leftovers(&self, scope: &RunScope) -> bool {
        let (_, children_left) = reap::reap_all(None);
        // The keeper is our child and outlives the leader until the pipes' last writer is
        // gone: it is no leftover, but any other child of ours is (we are a subreaper: a pid
        // hopper's live generation is always one of our children, even while it dodges a /proc
        // scan). The kernel lists them in /proc/self/task/*/children; where it cannot be read,
        // `discover` below decides.
        let children_left = match self.keeper.forked {
            None => children_left,
            Some(k) => children_left && procfs::children_besides(k.pid).unwrap_or(false),
        };
        crate::phases::mark("reap");
        // A cgroup just seen unpopulated has no member to list: the marker look runs without it
        // (no second read of the cgroup's files on every launch).
        let leftovers = children_left
            || scope.cgroup.as_ref().is_some_and(|c| c.populated())
            || !discover(
                &RunScope {
                    cgroup: None,
                    ..scope.clone()
                },
                Depth::WithMarker,
                &HashSet::new(),
            )
            .is_empty();
        crate::phases::mark("leftovers");
        leftovers
    }

    /// A stop was asked for (a signal, a cancel, the lease, the timeout, the caller): said,
    /// then the run stopped and its leader reaped.
    fn stop_asked(
        &mut self,
        scope: &RunScope,
        leader: Identity,
        reason: Reason,
        signals: &Signals,
        limits: &Limits,
    ) -> Ended {
        // Said before the TERM goes out (a dead stderr is no reason to wait).
        human::say(&stop_message(self.dir.id().as_str(), reason, limits));
        let report = self.stop_what_is_left(scope, reason, signals);
        let (ws, _) = reap::reap_all(Some(leader.pid));
        // The stop may have reaped the leader itself (it reaps the dead children it finds).
        let ws = ws.or(report.leader_exit);
        Ended {
            state: State::Cancelled,
            reason: Some(reason),
            report: Some(report),
            leader_status: ws,
        }
    }

    /// The stop of the run's processes, after the `cancelling` record. The stop comes first: a
    /// record that cannot be written (a full disk) is reported, but never keeps the run's
    /// processes alive.
    fn stop_what_is_left(&mut self, scope: &RunScope, reason: Reason, signals: &Signals) -> Report {
        // First, the kernel fact a `cancel` trusts over the record (which the run can write):
        // this wrapper is stopping, so a TERM now would cut the grace short.
        sys::mark_stopping();
        if let Err(e) = transition(
            &self.dir,
            &mut self.st,
            State::Cancelling,
            Some(reason),
            Some(&self.journal),
        ) {
            human::say(&format!("{e}; stopping the run anyway"));
        }
        let mut escalation = signals;
        stop_run(
            scope,
            &self.timings,
            reason,
            Some(&self.journal),
            Some(&mut escalation),
        )
    }

    /// The record's last facts before it is final: the leader's exit, the cgroup's resources,
    /// the keeper's counts, and the proof that nothing was left.
    fn note_end(&mut self, ended: &Ended) {
        match ended.leader_status {
            Some(WaitStatus::Exited(c)) => self.st.exit_code = Some(c),
            Some(WaitStatus::Signaled(s)) => self.st.term_signal = Some(Sig::from_number(s).name()),
            None => {}
        }
        if let Some(cg) = &self.cgroup {
            self.st.resources = Some(cg.resources());
        }
        crate::phases::mark("resources");
        let survivors = ended
            .report
            .as_ref()
            .is_some_and(|r| !r.survivors.is_empty());
        self.wait_keeper(survivors);
        crate::phases::mark("keeper_wait");
        if ended.report.is_none() {
            // Nothing was left when the leader exited: the cgroup said so, or (a subreaper with
            // no child left but the keeper) the tree did.
            self.st.proof = Some(match self.cgroup {
                Some(_) => Proof::CgroupEmpty,
                None => Proof::TreeWalk,
            });
        }
    }
}

/// How a run ended: its final state and reason, the stop's report (None: nothing was left to
/// stop), and the leader's wait status (None: it was not reaped).
struct Ended {
    state: State,
    reason: Option<Reason>,
    report: Option<Report>,
    leader_status: Option<WaitStatus>,
}

/// How many lines of stderr a `--quiet` run that failed prints.
const FAILURE_TAIL: usize = 10;

/// For a `--quiet` foreground run that ended non-zero: the last lines of its stderr, under a
/// header that says where the whole log is.
pub(super) fn failure_tail(dir: &RunDir, id: &str, st: &Status) {
    let path = dir.file(files::STDERR);
    let lines = crate::stream::last_lines(dir, files::STDERR, FAILURE_TAIL);
    let how = match (st.exit_code, &st.term_signal, &st.reason) {
        (Some(c), _, _) => format!("exited {c}"),
        (_, Some(s), _) => format!("was killed by SIG{s}"),
        (_, _, Some(r)) => format!("ended {} ({r})", st.state.as_str()),
        _ => format!("ended {}", st.state.as_str()),
    };
    let msg = if lines.is_empty() {
        format!("run {id} {how}; its stderr is empty ({})", path.display())
    } else {
        let n = lines.iter().filter(|&&b| b == b'\n').count().max(1);
        format!(
            "run {id} {how}; the last {n} lines of its stderr (all of it: {}):",
            path.display()
        )
    };
    human::say(&msg);
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(&lines);
    if !lines.is_empty() && !lines.ends_with(b"\n") {
        let _ = writeln!(err);
    }
}

/// What a foreground run says on stderr when it is stopped, before the TERM goes out.
pub(super) fn stop_message(id: &str, reason: Reason, limits: &Limits) -> String {
    match reason {
        Reason::Signal(sig) => {
            let sig = sig.name();
            format!("{sig}: stopping run {id} (TERM sent; again to KILL)")
        }
        Reason::CancelRequest => {
            format!("cancel requested from another connection: stopping run {id} (TERM sent)")
        }
        Reason::LeaseExpired => format!(
            "the lease expired without a renewal: stopping run {id} (TERM sent; again to KILL)"
        ),
        Reason::Timeout => format!(
            "timeout of {} reached: stopping run {id} (TERM sent; again to KILL)",
            limits
                .timeout
                .map_or("?".into(), |(_, t)| human::duration(t.as_secs_f64()))
        ),
        Reason::CallerLost => format!("the caller went away: stopping run {id} (TERM sent)"),
        Reason::KeeperLost => format!(
            "the output keeper died, so the pty has no reader: stopping run {id} (TERM sent)"
        ),
        other => format!("{other}: stopping run {id} (TERM sent)"),
    }
}
