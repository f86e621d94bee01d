//! The wrapper's side of the output keeper: its sources made before the spawn, its fork
//! after it, and the wait for its counts before the final record.

use super::*;

/// What [`Launch::fork_keeper`] hands the keeper: its sources (pipes' read ends or the pty's
/// master), the streamer's wake-up (write end), the signals to reset, and what it does at the
/// cap.
pub(super) struct PendingKeeper {
    /// Each source with its log, opened before the spawn ([`keeper::open_logs`]).
    held: Vec<(keeper::Stream, OwnedFd, std::fs::File)>,
    notify: Option<OwnedFd>,
    reset_signals: u64,
    policy: keeper::Policy,
    pty: bool,
}

/// The output keeper as the wrapper holds it: its sources between their making (before the
/// spawn) and its fork (after the spawn, see [`Launch::fork_keeper`]), then the keeper itself.
#[derive(Default)]
pub(super) struct KeeperLink {
    pending: Option<PendingKeeper>,
    /// The keeper, once forked: never the run's, never signalled.
    pub(super) forked: Option<Identity>,
    /// Its pidfd (our unreaped child: the pid is its own): the final record waits on it, not on
    /// inotify, for the keeper's counts.
    pidfd: Option<OwnedFd>,
}

impl Launch {
    /// The pipes the keeper will drain into the logs: the workload's stdout and stderr (the
    /// write ends), the read ends kept for [`Launch::fork_keeper`]. With `--pty` the keeper's
    /// one source is the pty's master (`pty_master`), copied to stdout.log, and there are no
    /// pipes (None).
    pub(super) fn prepare_keeper(
        &mut self,
        args: &StartArgs,
        pty_master: Option<OwnedFd>,
        notify: Option<OwnedFd>,
        reset_signals: u64,
    ) -> anyhow::Result<Option<(OwnedFd, OwnedFd)>> {
        let (sources, ends) = match pty_master {
            Some(m) => {
                // stderr.log exists, and stays empty: the pty has one output.
                self.dir.open_append(files::STDERR)?;
                (vec![(keeper::Stream::Stdout, m)], None)
            }
            None => {
                let (out_r, out_w) = keeper::pipe().context("cannot make the stdout pipe")?;
                let (err_r, err_w) = keeper::pipe().context("cannot make the stderr pipe")?;
                (
                    vec![
                        (keeper::Stream::Stdout, out_r),
                        (keeper::Stream::Stderr, err_r),
                    ],
                    Some((out_w, err_w)),
                )
            }
        };
        // The logs are created now, before the workload exists: ours, never files it planted.
        let held = keeper::open_logs(&self.dir, sources)?;
        self.keeper.pending = Some(PendingKeeper {
            held,
            notify,
            reset_signals,
            policy: keeper::Policy {
                limit: args.max_output.and_then(|m| m.0),
                stop: args.on_output_limit == "stop",
            },
            pty: args.pty,
        });
        Ok(ends)
    }

    /// Fork the keeper of [`Launch::prepare_keeper`]'s sources. After the workload's spawn: a
    /// fork copies the wrapper's page tables, and there that cost runs beside the workload's
    /// exec instead of before it. The workload's first 64 KiB wait in the pipes meanwhile.
    pub(super) fn fork_keeper(&mut self) -> anyhow::Result<()> {
        let Some(PendingKeeper {
            held,
            notify,
            reset_signals,
            policy,
            pty,
        }) = self.keeper.pending.take()
        else {
            return Ok(());
        };
        if fault::armed(fault::KEEPER_FORK_FAILS) {
            anyhow::bail!(
                "cannot start the output keeper: fork refused (the keeper_fork_fails knob)"
            );
        }
        let limit = policy.limit;
        let on_limit = if policy.stop { "stop" } else { "keep" };
        let k = keeper::spawn(&self.dir, held, &policy, notify, reset_signals)?;
        self.keeper.forked = Some(k.identity);
        self.keeper.pidfd = sys::pidfd_open(k.identity.pid).ok();
        self.st.output = Some(agent_run_shared::output::Output::pending(
            limit,
            policy.stop,
        ));
        let _ = self.journal.event(
            "keeper_started",
            json!({"pid": k.identity.pid.get(), "start_ticks": k.identity.start_ticks,
                   "limit": limit, "on_limit": on_limit, "pty": pty}),
        );
        Ok(())
    }

    /// Before a final record: give the keeper time to drain and exit (it writes output.json
    /// just before), so `finalize` finds its counts at once. [`agent_run_shared::output::WAIT`],
    /// and when nothing of the run survives (every writer of its pipes is gone, so the keeper is
    /// only draining and fsyncing the logs) also the time the logs' fsync may take on a slow
    /// disk: a second per [`FSYNC_RATE`] bytes logged, at most [`KEEPER_WAIT_MAX`]. A 1 GiB log
    /// took longer to fsync here than the bare wait, and its record went out `complete: false`.
    pub(super) fn wait_keeper(&mut self, survivors: bool) {
        // Done already (a short run's usual case), or no keeper: no look at the logs' sizes.
        if self.keeper_finished(Duration::ZERO) {
            self.note_keeper_lost();
            return;
        }
        let mut wait = agent_run_shared::output::WAIT;
        if !survivors {
            let logged: u64 = [files::STDOUT, files::STDERR]
                .iter()
                .filter_map(|f| self.dir.open_run_file(f).ok())
                .map(|(_, md)| md.len())
                .sum();
            wait += Duration::from_secs(logged / FSYNC_RATE);
            wait = wait.min(KEEPER_WAIT_MAX);
        }
        self.keeper_running_finished(wait);
        self.note_keeper_lost();
    }

    /// [`Launch::keeper_finished`] within `timeout`, looking whether the run has stopped the
    /// keeper (then it gets CONT: [`Launch::continue_stopped_keeper`]) after the first 10 ms
    /// and then every [`KEEPER_STOP_LOOK`]: a keeper that only drains is done before the first
    /// look, so a launch pays no read of its /proc status.
    pub(super) fn keeper_running_finished(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut slice = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.keeper_finished(left.min(slice)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.continue_stopped_keeper();
            slice = KEEPER_STOP_LOOK;
        }
    }

    /// A keeper that is gone without its counts (the run killed it, or it failed) will never
    /// write them: say so in the journal (`keeper_lost`), and take the logs' sizes now
    /// (`complete: false`) instead of letting `finalize` wait for output.json in vain.
    pub(super) fn note_keeper_lost(&mut self) {
        let (Some(k), Some(fd)) = (self.keeper.forked, &self.keeper.pidfd) else {
            return;
        };
        if !sys::readable_by(fd.as_fd(), Instant::now()) {
            return;
        }
        let pending = self.st.output.as_ref().filter(|o| !o.complete);
        let Some(pending) = pending else { return };
        let mut out = agent_run_shared::output::collect(&self.dir, pending, Duration::ZERO);
        out.settled = true;
        // A pty run's keeper that died mid-run was journalled then, as the stop's reason.
        if !out.complete
            && self.st.reason.as_deref().and_then(Reason::parse) != Some(Reason::KeeperLost)
        {
            let _ = self.journal.event(
                "keeper_lost",
                json!({"pid": k.pid.get(), "why": "the output keeper exited without its counts (output.json)"}),
            );
        }
        self.st.output = Some(out);
    }

    /// The run can SIGSTOP the keeper (same user): then it drains nothing, the record would
    /// wait out its wait and say `complete: false`, and the keeper would stay stopped after us,
    /// forever. Its wrapper, and only it, sends it CONT, through the pidfd of its own child
    /// (no pid is looked up), and says so in the journal; nothing ever sends it another signal.
    pub(super) fn continue_stopped_keeper(&self) {
        let (Some(k), Some(fd)) = (self.keeper.forked, &self.keeper.pidfd) else {
            return;
        };
        if !procfs::stopped_or_stopping(k.pid) {
            return;
        }
        let r = sys::pidfd_send_signal(fd.as_fd(), Sig::Cont);
        let _ = self.journal.event(
            "signal",
            json!({
                "target": format!("pid:{}", k.pid),
                "signal": "CONT",
                "reason": Reason::KeeperStopped,
                "error": r.err().map(|e| e.to_string()),
            }),
        );
    }

    /// Whether the keeper has exited within `timeout` (its pidfd; output.json is in place by
    /// then, unless it failed).
    pub(super) fn keeper_finished(&self, timeout: Duration) -> bool {
        let Some(pidfd) = &self.keeper.pidfd else {
            return true;
        };
        sys::readable_by(pidfd.as_fd(), Instant::now() + timeout)
    }
}

/// The slowest log fsync [`Launch::wait_keeper`] allows for: 20 MB/s (this project's disk
/// under contention wrote 250 MB/s).
const FSYNC_RATE: u64 = 20_000_000;

/// The longest [`Launch::wait_keeper`] waits for a keeper that is only fsyncing.
const KEEPER_WAIT_MAX: Duration = Duration::from_secs(60);

/// How often a wait for the keeper looks whether the run has stopped it (SIGSTOP).
const KEEPER_STOP_LOOK: Duration = Duration::from_millis(100);
