//! The daemon's stops, each on a thread of its own, and the deadlines that start them.

use super::*;

impl Daemon {
    pub(super) fn spawn_action(&mut self, name: &str, subject: Subject, action: Action) {
        if self.inflight.load(Ordering::SeqCst) >= self.opts.max_parallel {
            self.heap.push(Reverse((
                Instant::now() + Duration::from_millis(50),
                name.to_string(),
            )));
            return;
        }
        self.busy.insert(name.to_string());
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let tx = self.done_tx.clone();
        let inflight = Arc::clone(&self.inflight);
        let n = name.to_string();
        self.threads.push(thread::spawn(move || {
            let line = describe(&subject, action, act(&subject, action));
            log(&line);
            inflight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send((n, line));
        }));
    }

    pub(super) fn collect_done(&mut self) {
        while let Ok((name, _)) = self.done_rx.try_recv() {
            self.busy.remove(&name);
            self.evaluate(&name);
        }
        self.threads.retain(|h| !h.is_finished());
    }

    pub(super) fn run_due(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(Reverse((t, _))) = self.heap.peek() {
            if *t > now {
                break;
            }
            let Reverse((_, name)) = self.heap.pop().expect("peeked");
            due.push(name);
        }
        due.sort();
        due.dedup();
        for name in due {
            self.evaluate(&name);
        }
    }

    /// Watch a run dir's record and lease; true when the watch is new.
    /// SIGTERM: take no new work, let the stops in flight finish (bounded), never start a stop
    /// because we are stopping.
    pub(super) fn shutdown(&mut self) {
        let deadline = Instant::now() + self.opts.shutdown_timeout;
        while self.inflight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            let _ = self.done_rx.recv_timeout(Duration::from_millis(100));
        }
        let left = self.inflight.load(Ordering::SeqCst);
        if left > 0 {
            log(&format!("exiting with {left} stops still in flight"));
        } else {
            log("stopped");
        }
    }
}
