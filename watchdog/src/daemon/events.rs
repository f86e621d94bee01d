//! One run looked at and filed by the daemon: forgotten, watched, scheduled or acted on.

use super::*;

/// How long one look at /proc may serve events outside a full pass (it only decides whether a
/// not-yet-due orphan still has processes; the stop itself always looks afresh).
pub(super) const SNAPSHOT_REUSE: Duration = Duration::from_secs(1);

impl Daemon {
    pub(super) fn on_inotify(&mut self) {
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
    pub(super) fn evaluate(&mut self, name: &str) {
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
    pub(super) fn evaluate_with(&mut self, name: &str, looks: &Looks, whole_pass: bool) -> bool {
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
    pub(super) fn note_lease(&mut self, name: &str, s: &Subject) {
        let t = self.runs.entry(name.to_string()).or_default();
        t.seen = s.seen;
        if report_lease_damage(s, t.lease_damage.as_deref()) {
            t.lease_damage = s.lease_damaged.clone();
        }
        if report_record_damage(s, t.record_damage.as_deref()) {
            t.record_damage = s.record_damaged.clone();
        }
    }

    pub(super) fn track_dir(&mut self, name: &str) -> bool {
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

    pub(super) fn drop_wrapper(&mut self, name: &str) {
        if let Some(t) = self.runs.get_mut(name) {
            if let Some((fd, token)) = t.wrapper.take() {
                self.epoll.remove(fd.as_raw_fd());
                self.tokens.remove(&token);
            }
        }
    }

    pub(super) fn forget(&mut self, name: &str) {
        self.drop_wrapper(name);
        if let Some(t) = self.runs.remove(name) {
            if let Some(wd) = t.wd {
                self.ino.rm_watch(wd);
                self.wd_names.remove(&wd);
            }
        }
    }
}
