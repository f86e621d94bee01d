//! The end of a stop: what is left of the run, named (survivors, and processes that may be
//! its own but cannot be proven so), and the report.

use super::*;

impl Stopper<'_> {
    /// Name what is left and close the report (journalled as `stop_end`).
    pub(super) fn finish(mut self) -> Report {
        self.name_survivors();
        self.report.proof = self.proof();
        self.report.survivors.sort();
        self.report.signalled.sort();
        self.report.signalled.dedup();
        self.report.duration = self.t0.elapsed();
        let r = &self.report;
        if !r.signals.is_empty() || !r.survivors.is_empty() {
            self.journal_event(
                "stop_end",
                json!({
                    "signals": r.signals.iter().map(|x| x.name()).collect::<Vec<_>>(),
                    "duration_ms": r.duration.as_millis() as u64,
                    "survivors": r.survivors,
                    "signalled": r.signalled,
                }),
            );
        }
        self.report
    }

    /// Every process of the run still alive at the end, from every source: the members, the
    /// last look, the wrapper's children, the cgroup, the recorded leader.
    fn name_survivors(&mut self) {
        // Only what is alive at the end: a member whose exit the wait did not see yet (a pid
        // hopper's generation that exited a moment ago) is not a survivor.
        self.report.survivors = self
            .live()
            .into_iter()
            .filter(|p| self.member_alive(*p))
            .collect();
        self.name_hidden();
        // What the last look saw of the run and never pinned, if it still lives (a process that
        // kept one step ahead of every look): named, so the run is not called clean.
        for st in std::mem::take(&mut self.seen_last) {
            if procfs::stat(st.pid)
                .is_some_and(|now| now.start_ticks == st.start_ticks && !now.is_dead())
                && !self.report.survivors.contains(&st.pid)
            {
                self.report.survivors.push(st.pid);
            }
        }
        // Inside the wrapper: a live child is a live descendant, whether a look saw it or not.
        for p in self.live_children() {
            if !self.report.survivors.contains(&p) {
                self.report.survivors.push(p);
            }
        }
        // Whatever the cgroup still holds is left of the run, known to us or not.
        if let Some(cg) = self.scope.cgroup.as_ref().filter(|c| c.populated()) {
            for p in cg.members() {
                if !self.report.survivors.contains(&p)
                    && procfs::stat(p).is_some_and(|st| !st.is_dead())
                {
                    self.report.survivors.push(p);
                }
            }
        }
        // The recorded leader, alive and never taken in: the kernel could not confirm it as the
        // run's (not the live wrapper's child, no marker of this run), so it was not signalled. It
        // may still be the run's: the run is not clean while it lives.
        let leader = self.scope.leader;
        if !self.scope.marker_only
            && !self.members.contains_key(&leader.pid)
            && procfs::stat(leader.pid)
                .is_some_and(|st| st.start_ticks == leader.start_ticks && !st.is_dead())
        {
            self.journal_event(
                "unverified",
                json!({"pid": leader.pid.get(), "why": "the recorded leader is alive but is not the run's by any kernel fact; not signalled"}),
            );
            self.report.survivors.push(leader.pid);
        }
    }

    /// By scanning alone, after the wrapper is gone: a process of the user that started after
    /// the run and hides its environment may be the run's. It is not signalled, but named.
    /// (Root reads every environment: nothing is hidden from it, and no look is needed.)
    fn name_hidden(&mut self) {
        if self.scope.wrapper.is_none() && self.scope.cgroup.is_none() && sys::geteuid() != 0 {
            // The last look serves (it began after the last member was seen gone); one of only
            // the newer pids, with the first look for the older ones.
            let snap = self.look(self.last_look.unwrap_or(self.t0));
            let mut hidden = crate::procset::unverifiable(self.scope, &snap);
            if let (Some(_), Some((_, first))) = (snap.min_pid(), &self.floor) {
                hidden.extend(crate::procset::unverifiable(self.scope, first));
                hidden.sort();
                hidden.dedup();
            }
            // A process on its way out (killed a moment ago, its memory already released) is
            // no hidden one: the ones that end within a short while are not named.
            let hidden = still_alive_after(hidden, HIDDEN_SETTLE);
            // Named with the escapees: it may have left the run, nothing proves it did.
            for p in hidden {
                if !self.members.contains_key(&p) && !self.report.escapees.contains(&p) {
                    self.journal_event(
                        "unverified",
                        json!({"pid": p.get(), "why": "a process of the run's user, started after the run, whose environment cannot be read; not signalled"}),
                    );
                    self.report.escapees.push(p);
                }
            }
        }
    }
}

/// How long [`still_alive_after`] gives a hidden process to end.
const HIDDEN_SETTLE: Duration = Duration::from_millis(300);

/// The processes of `pids` still alive after `settle` (each waited on through its pidfd; one
/// that cannot be pinned is kept if /proc still shows it alive).
fn still_alive_after(pids: Vec<Pid>, settle: Duration) -> Vec<Pid> {
    if pids.is_empty() {
        return pids;
    }
    let pinned: Vec<(Pid, Option<std::os::fd::OwnedFd>)> = pids
        .into_iter()
        .map(|p| (p, sys::pidfd_open(p).ok()))
        .collect();
    let deadline = Instant::now() + settle;
    let mut gone = vec![false; pinned.len()];
    loop {
        let mut fds: Vec<sys::PollFd> = Vec::new();
        let mut index = Vec::new();
        for (i, (_, fd)) in pinned.iter().enumerate() {
            if let (Some(fd), false) = (fd, gone[i]) {
                fds.push(sys::PollFd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                index.push(i);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if fds.is_empty() || left.is_zero() {
            break;
        }
        let _ = sys::poll(&mut fds, Some(left));
        for (k, f) in fds.iter().enumerate() {
            if f.revents != 0 {
                gone[index[k]] = true;
            }
        }
    }
    pinned
        .into_iter()
        .zip(gone)
        .filter(|((p, _), gone)| !gone && procfs::stat(*p).is_some_and(|s| !s.is_dead()))
        .map(|((p, _), _)| p)
        .collect()
}
