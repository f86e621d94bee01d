//! The run's members: the looks at /proc (or the wrapper's tree), each process pinned by a pidfd and
//! re-checked, and what is still alive of them.

use super::*;

impl Stopper<'_> {
    /// Discover members not yet tracked, pin each with a pidfd, and keep those whose start time
    /// still matches after the pidfd is open. Returns the new members.
    pub(super) fn adopt(&mut self, depth: Depth) -> Vec<Pid> {
        let now = Instant::now();
        self.last_look = Some(now);
        let snap = match self.own_look(depth) {
            Some(own) => own,
            None => self.look(now),
        };
        self.adopt_in(&snap, depth)
    }

    /// A look that needs no scan of /proc, where the run has one: its cgroup without its
    /// wrapper ([`Stopper::cgroup_look`]), or inside the wrapper its tree
    /// ([`Stopper::tree_look`]).
    pub(super) fn own_look(&self, depth: Depth) -> Option<Arc<Snapshot>> {
        self.cgroup_look().or_else(|| self.tree_look(depth))
    }

    /// A run held in a cgroup whose wrapper is gone (the watchdog's stop of an orphan, a
    /// cancel after a wrapper loss): the cgroup is the membership. Every process in it is the
    /// run's, whatever its session or environment, and [`discover_in`] reads them from
    /// `cgroup.procs`; the look itself holds no process. A process that left the cgroup is no
    /// member (the kernel refuses root's workloads the move where it can); after an emptied
    /// cgroup, the caller looks where such a process could be ([`crate::escape`]). So neither
    /// the first look nor the look that calls the run gone reads /proc: many stops due
    /// together wait for no scan, and `cgroup.events` says when the run is empty.
    fn cgroup_look(&self) -> Option<Arc<Snapshot>> {
        if self.scope.wrapper.is_some() || self.scope.cgroup.is_none() {
            return None;
        }
        Some(Arc::new(Snapshot::empty()))
    }

    /// Inside the wrapper, for a look that reads no marker: the wrapper's tree alone, from the
    /// kernel's children lists, not every pid. The wrapper is a child subreaper that has lived
    /// since before the workload began, so every process the run forked is in its tree while it
    /// lives: an orphan is reparented to the nearest subreaper above it, which is the wrapper
    /// or a process of the run. The leader's group and session are in it too: a session is
    /// joined only by being forked in it (setsid makes a new one, setpgid moves only within
    /// one), and the leader's began with the leader. The cgroup's members are read from the
    /// cgroup as before. What the tree cannot hold, a process of someone else's that carries
    /// the run's marker, is what the looks with the marker are for: they still read every pid
    /// (the last look, when every known member is gone, is one). With 1,000 runs stopping at
    /// once, each wrapper's looks read a few processes instead of 3,000.
    pub(super) fn tree_look(&self, depth: Depth) -> Option<Arc<Snapshot>> {
        if depth != Depth::Tree || self.scope.wrapper != Some(Pid::this()) {
            return None;
        }
        Snapshot::of_tree(Pid::this()).map(Arc::new)
    }

    /// A look at /proc that began no earlier than `since`: of the pids the run's processes can
    /// have (newer than its leader, or than the stop's first look, while no wrap of the pid
    /// counter is possible since), or of every pid.
    pub(super) fn look(&self, since: Instant) -> Arc<Snapshot> {
        if let Some(min) = self.scope.newer_than() {
            return Snapshot::since(since, Some(min));
        }
        let Some((floor, _)) = self.floor.as_ref().filter(|(f, _)| f.holds_now()) else {
            return Snapshot::since(since, None);
        };
        let snap = Snapshot::since(since, Some(floor.pid));
        // The floor must hold until the look's last read of the pid counter, not only when
        // it was asked for.
        match snap.min_pid() {
            Some(_) if !floor.holds_at(snap.finished()) => Snapshot::since(since, None),
            _ => snap,
        }
    }

    /// [`Stopper::adopt`] over a given look at /proc.
    pub(super) fn adopt_in(&mut self, snap: &Snapshot, depth: Depth) -> Vec<Pid> {
        let skip: HashSet<Pid> = self.members.keys().copied().collect();
        let mut new = Vec::new();
        let mut found = discover_in(snap, self.scope, depth, &skip);
        // Inside the wrapper (a child subreaper), every orphan of the run is a child of ours: ask
        // the kernel for them directly, so one that appeared after the look (a process that
        // forks and exits in a loop) is not missed.
        if self.scope.wrapper == Some(Pid::this()) {
            for c in procfs::children_of(Pid::this()) {
                if skip.contains(&c) || found.iter().any(|s| s.pid == c) {
                    continue;
                }
                if let Some(st) = procfs::stat(c).filter(|st| {
                    !st.is_dead()
                        && st.start_ticks >= self.scope.floor_ticks
                        && !self.scope.exclude.contains(&st.identity())
                }) {
                    found.push(st);
                }
            }
        }
        self.seen_last.clear();
        for st in found {
            let fd = match sys::pidfd_open(st.pid) {
                Ok(fd) => Some(fd),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    self.seen_last.push(st);
                    continue;
                }
                Err(_) => None,
            };
            // The check that matters: the process behind the pidfd is the one we scanned.
            match procfs::stat(st.pid) {
                Some(now) if now.start_ticks == st.start_ticks && !now.is_dead() => {}
                _ => {
                    self.seen_last.push(st);
                    continue;
                }
            }
            self.members.insert(
                st.pid,
                Member {
                    stat: st,
                    fd,
                    gone: false,
                },
            );
            new.push(st.pid);
        }
        new
    }

    /// Inside the wrapper (a child subreaper), the live children of the wrapper that are the
    /// run's, by the kernel's list of our children: every orphan of the run is reparented to
    /// us, so while any process of the run's tree lives we have a live child. Children found
    /// dead are reaped here (the leader's status is kept in the report), so the list stays the
    /// truth and their pids cannot be mistaken for new processes. Empty outside the wrapper.
    pub(super) fn live_children(&mut self) -> Vec<Pid> {
        if self.scope.wrapper != Some(Pid::this()) {
            return Vec::new();
        }
        loop {
            let mut live = Vec::new();
            let mut reaped = false;
            for c in procfs::children_of(Pid::this()) {
                match procfs::stat(c) {
                    Some(st) if !st.is_dead() => {
                        if !self.scope.exclude.contains(&st.identity()) {
                            live.push(c);
                        }
                    }
                    _ => {
                        if let Ok(Some((p, ws))) = sys::waitpid_nohang(Some(c)) {
                            reaped = true;
                            if p == self.scope.leader.pid {
                                self.report.leader_exit = Some(ws);
                            }
                        }
                    }
                }
            }
            // A child that died since the list was read has handed its own children to us:
            // list again until a list shows no dead child.
            if !live.is_empty() || !reaped {
                return live;
            }
        }
    }

    /// Inside the wrapper (a child subreaper), reap every child that has ended, at every wake
    /// of the stop: a pid hopper leaves a zombie child of ours at each hop (thousands in a
    /// stop's grace), and only its parent can take them off the process table. The leader's
    /// status is kept in the report.
    pub(super) fn reap_dead_children(&mut self) {
        if self.scope.wrapper != Some(Pid::this()) {
            return;
        }
        if let (Some(ws), _) = crate::reap::reap_all(Some(self.scope.leader.pid)) {
            self.report.leader_exit = Some(ws);
        }
    }

    pub(super) fn live(&self) -> Vec<Pid> {
        self.members
            .iter()
            .filter(|(_, m)| !m.gone)
            .map(|(p, _)| *p)
            .collect()
    }

    /// Whether a member is alive now: its pidfd not readable (any thread of it alive), or
    /// without one, its pid still its own and not dead.
    pub(super) fn member_alive(&self, p: Pid) -> bool {
        let Some(m) = self.members.get(&p) else {
            return false;
        };
        match &m.fd {
            Some(fd) => {
                let mut fds = [sys::PollFd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                sys::poll(&mut fds, Some(Duration::ZERO)).is_ok_and(|n| n == 0)
            }
            None => procfs::stat(p)
                .is_some_and(|st| st.start_ticks == m.stat.start_ticks && !st.is_dead()),
        }
    }

    pub(super) fn mark_gone(&mut self, p: Pid) {
        if let Some(m) = self.members.get_mut(&p) {
            m.gone = true;
            m.fd = None;
        }
    }

    /// How this stop knows that nothing of the run is left: its cgroup empty, or (inside the
    /// wrapper, a subreaper) no live child; else it cannot tell. None when something is left.
    pub(super) fn proof(&mut self) -> Option<Proof> {
        if !self.report.survivors.is_empty() {
            return None;
        }
        if let Some(cg) = &self.scope.cgroup {
            return (!cg.populated()).then_some(Proof::CgroupEmpty);
        }
        if self.scope.wrapper == Some(Pid::this()) {
            return self.live_children().is_empty().then_some(Proof::TreeWalk);
        }
        Some(Proof::Unprovable)
    }
}
