//! Finding out where a run stands after the stream broke (or when coming back with `--attach`):
//! reconnect with backoff if the master is gone, read the record with `status --json`, and
//! resume the stream with `attach` from the byte offsets already received.
//!
//! This runs on a thread of its own, bounded by the lease deadline: if the host stays
//! unreachable until then, the answer is [`Resync::Expired`] and the outcome is unknown.

use super::{backoff, Cancel, Event, Resync, Session};
use crate::remote::outcome;
use crate::remote::say;
use crate::remote::ssh::Ssh;
use agent_run_shared::exit;
use serde_json::Value;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// How long a `status` may take before the connection is declared dead.
const STATUS_TIMEOUT: Duration = Duration::from_secs(15);

impl Session<'_> {
    pub(super) fn start_resync(&mut self, delay: Duration) {
        self.resyncing = true;
        let script = self.script(&["status", "--json", &self.id]);
        // Before the lease is known (coming back with --attach), or once the run is known to
        // be over (only output is missing), a bounded try.
        let deadline = self
            .deadline
            .filter(|_| self.known.is_none())
            .unwrap_or_else(|| Instant::now() + delay + Duration::from_secs(30));
        let (ssh, tx) = (Arc::clone(&self.ssh), self.tx.clone());
        thread::spawn(move || {
            let r = resync(&ssh, &script, deadline, delay);
            let _ = tx.send(Event::Resynced(r));
        });
    }

    pub(super) fn on_resynced(&mut self, r: Resync) -> Option<u8> {
        self.resyncing = false;
        let (out, err) = self.counts.get();
        match r {
            Resync::Record(v) => self.on_record(v),
            Resync::NoSuchRun => match self.launch.clone() {
                // The launch never reached the host: nothing ran, so launching again is safe.
                Some(_) if self.signal.is_some() => {
                    say(&format!(
                        "run {} was never started on {}",
                        self.id, self.host
                    ));
                    Some(exit::for_signal(self.signal.expect("checked")))
                }
                Some(script) if (out, err) == (0, 0) => {
                    say(&format!(
                        "run {} is not on {}: starting it again",
                        self.id, self.host
                    ));
                    self.launch(script)
                }
                _ => {
                    say(&format!("run {} does not exist on {}", self.id, self.host));
                    Some(exit::NO_SUCH_RUN)
                }
            },
            Resync::Expired => match self.known {
                Some(code) => {
                    say(&format!(
                        "run {} on {} is over; the rest of its output could not be fetched",
                        self.id, self.host
                    ));
                    Some(code)
                }
                None => Some(self.unknown()),
            },
            Resync::Failed(code, _) if crate::remote::shell_cannot_run(Some(code.into())) => {
                let what = match self.launch {
                    Some(_) => format!("run {} was not started", self.id),
                    None => format!("nothing is known about run {}", self.id),
                };
                Some(crate::remote::bin_missing(
                    &self.host,
                    &self.remote.bin,
                    Some(code.into()),
                    &what,
                ))
            }
            Resync::Failed(code, why) => {
                say(&format!(
                    "cannot read the record of run {} on {}: {why}",
                    self.id, self.host
                ));
                Some(code)
            }
        }
    }

    /// The record was read: note what it says, then resume the stream from the offsets.
    fn on_record(&mut self, v: Value) -> Option<u8> {
        let now = Instant::now();
        let (out, err) = self.counts.get();
        self.launch = None;
        self.last_ok = now;
        if let Some(g) = v["grace_ms"].as_u64() {
            self.cancel_wait = Duration::from_millis(g) + Duration::from_secs(10);
        }
        if self.lost_at.take().is_some() {
            say(&format!(
                "reconnected to {}; resuming run {} at stdout byte {out}, stderr byte {err}",
                self.host, self.id
            ));
        }
        if let Some(code) = outcome(&v) {
            self.known = Some(code);
            self.next_renew = None;
            if matches!(self.cancel, Cancel::Wanted(_)) {
                // Over before our cancel got there: its record is the answer.
                super::requests::say_final(&self.id, &self.host, &v);
                self.cancel = Cancel::Done(v);
            }
        } else {
            if let Some(s) = v["lease_remaining_s"].as_f64() {
                self.deadline = Some(now + Duration::from_secs_f64(s.max(0.0)));
            }
            // The last renewal may be long ago.
            self.next_renew = Some(now);
            if let Cancel::Wanted(_) = self.cancel {
                self.cancel = Cancel::Wanted(Some(now));
            }
        }
        let from = (out.to_string(), err.to_string());
        let script = self.script(&[
            "attach",
            &self.id,
            "--stdout-from",
            &from.0,
            "--stderr-from",
            &from.1,
        ]);
        self.open_stream(&script);
        (!self.streaming).then_some(exit::SOFTWARE)
    }
}

/// Reconnect if need be and read the record, until `deadline`.
fn resync(ssh: &Ssh, status: &[u8], deadline: Instant, delay: Duration) -> Resync {
    let pause =
        |d: Duration| thread::sleep(d.min(deadline.saturating_duration_since(Instant::now())));
    pause(delay);
    let mut attempt = 1;
    let mut said = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Resync::Expired;
        }
        if !ssh.master_alive() {
            if let Err(why) = ssh.connect(Some(left.min(Duration::from_secs(60)))) {
                if why != said {
                    say(&format!("cannot reach {}: {why}; retrying", ssh.host()));
                    said = why;
                }
                pause(backoff(attempt));
                attempt += 1;
                continue;
            }
        }
        let reply = ssh.run(status, Some(left.min(STATUS_TIMEOUT)));
        if reply.broken() {
            ssh.drop_master();
            pause(backoff(attempt));
            attempt += 1;
            continue;
        }
        return match reply.code {
            Some(0) => match serde_json::from_slice(&reply.stdout) {
                Ok(v) => Resync::Record(v),
                Err(e) => Resync::Failed(exit::SOFTWARE, format!("bad status JSON: {e}")),
            },
            Some(69) => Resync::NoSuchRun,
            Some(c) => Resync::Failed(c as u8, reply.stderr_text()),
            None => unreachable!("a reply without a code is broken"),
        };
    }
}
