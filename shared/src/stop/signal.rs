//! The signals of a stop: through each member's pidfd (its group through the leader's where the
//! kernel can), CONT to the stopped, HUP at once to who ignores TERM, and `cgroup.kill`.

use super::*;

impl Stopper<'_> {
    /// Send the signals of `level` to `targets` (live members only). KILL to a run held in a
    /// cgroup also writes `cgroup.kill`, whether or not any member is known: the processes a
    /// look has not pinned yet (a pid hopper's newest generation, a process moved in from
    /// outside) are the cgroup's all the same.
    pub(super) fn signal(&mut self, targets: &[Pid], level: Level) {
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
        let grouped = targets.contains(&leader) && self.send_group(leader, main);
        for &p in &targets {
            let m = &self.members[&p];
            let in_group = m.stat.pgid == Some(leader);
            // KILL needs no CONT: spare the read of each member's stat.
            let stopped = level != Level::Kill
                && (m.stat.is_stopped() || procfs::stat(p).is_some_and(|s| s.is_stopped()));
            if grouped && in_group {
                self.report.signalled.push(p);
            } else {
                self.send(p, main);
            }
            if level == Level::Term && self.hup_enabled && ignores_term(p) {
                self.send(p, Sig::Hup);
            }
            if stopped {
                self.send(p, Sig::Cont);
            }
        }
        crate::fault::point(point);
    }

    /// One signal to one member, through its pidfd. Returns whether it was delivered; ESRCH
    /// marks the member gone.
    pub(super) fn send(&mut self, pid: Pid, sig: Sig) -> bool {
        self.deliver(pid, sig, false)
    }

    /// One signal to the whole process group a member leads, through its pidfd. Returns
    /// whether it was delivered.
    pub(super) fn send_group(&mut self, pid: Pid, sig: Sig) -> bool {
        self.deliver(pid, sig, true)
    }

    /// [`Self::send`] (`group` false) or [`Self::send_group`], journalled.
    fn deliver(&mut self, pid: Pid, sig: Sig, group: bool) -> bool {
        let Some(m) = self.members.get_mut(&pid) else {
            return false;
        };
        let result = match (&m.fd, group) {
            (Some(fd), false) => sys::pidfd_send_signal(fd.as_fd(), sig),
            (Some(fd), true) => sys::pidfd_send_signal_group(fd.as_fd(), sig),
            (None, _) => send_without_pidfd(&m.stat, sig, group),
        };
        let target = if group {
            format!("group:{}", crate::pid::raw(m.stat.pgid))
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

    /// `cgroup.kill` on the run's cgroup (journalled like every signal).
    pub(super) fn kill_cgroup(&mut self) {
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

    /// `cgroup.kill` again, if the cgroup is still populated and the last write is at least
    /// [`KILL_AGAIN`] old (bounded by [`KILL_AGAIN_MAX`]).
    pub(super) fn kill_cgroup_again(&mut self) {
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
}

fn ignores_term(p: Pid) -> bool {
    procfs::sig_dispositions(p).is_some_and(|d| d.ignores(Sig::Term))
}

/// Fallback for kernels without pidfds: re-check the start time, then kill(2). The window
/// between the check and the kill is the one pidfds close; it is as small as we can make it.
fn send_without_pidfd(st: &Stat, sig: Sig, group: bool) -> std::io::Result<()> {
    match procfs::stat(st.pid) {
        Some(now) if now.start_ticks == st.start_ticks => {}
        _ => return Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
    }
    if group && !st.leads_group() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    if group {
        sys::kill_group(st.pid, sig)
    } else {
        sys::kill_process(st.pid, sig)
    }
}
