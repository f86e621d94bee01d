//! The two requests the session sends while a run is active, each on a fresh channel over the
//! master: `renew` (every third of the lease) and `cancel` (after INT, TERM or HUP).
//!
//! A request that gets no answer (ssh's 255, or no reply within its timeout) means the
//! connection is dead even if the master has not noticed yet: the master is stopped, which ends
//! the stream with 255, and the session resyncs. A late answer about an earlier master (its
//! generation) never stops the current one. A cancel that got no answer goes out again once
//! the session is reconnected.

use super::{Cancel, Event, Session, DRAIN};
use crate::human;
use crate::remote::outcome;
use crate::remote::say;
use agent_run_shared::record::Status;
use agent_run_shared::ssh::Reply;
use serde_json::Value;
use std::io::Write;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

impl Session<'_> {
    pub(super) fn send_renew(&mut self) {
        self.renewing = true;
        let sent = Instant::now();
        let mut script = super::super::READ_TOKEN.as_bytes().to_vec();
        script.extend(self.script_json(&["renew", &self.id]));
        let token = self
            .remote
            .token
            .as_ref()
            .map(|t| format!("{}\n", t.expose()));
        let timeout = self.lease.map_or(Duration::from_secs(10), |l| {
            (l / 6).clamp(Duration::from_secs(2), Duration::from_secs(20))
        });
        let (ssh, tx) = (Arc::clone(&self.ssh), self.tx.clone());
        let gen = ssh.generation();
        thread::spawn(move || {
            let reply = match token {
                Some(t) => ssh.run_with_input(&script, t.as_bytes(), Some(timeout)),
                None => ssh.run(&script, Some(timeout)),
            };
            let _ = tx.send(Event::Renewed { sent, gen, reply });
        });
    }

    pub(super) fn on_renewed(&mut self, sent: Instant, gen: u64, reply: Reply) -> Option<u8> {
        self.renewing = false;
        match reply.code {
            _ if reply.broken() => {
                self.next_renew = None;
                if self.streaming {
                    say(&format!(
                        "no answer to a lease renewal from {}; reconnecting",
                        self.host
                    ));
                    // Every channel over the master ends with 255: the stream's end resyncs.
                    self.ssh.drop_master_if(gen);
                }
            }
            Some(0) => {
                let v: Value = serde_json::from_slice(&reply.stdout).unwrap_or_default();
                if let Some(s) = v["lease_s"].as_f64().filter(|s| *s > 0.0) {
                    self.lease = Some(Duration::from_secs_f64(s));
                }
                self.launch = None;
                self.breaks = 0;
                self.last_ok = sent;
                self.deadline = self.lease.map(|l| sent + l);
                self.next_renew = self.lease.map(|l| sent + l / 3);
            }
            // 69: the run is final (the stream ends by itself); 64: it has no lease.
            Some(69 | 64) => self.next_renew = None,
            // 77: the host refuses our token (a run we came back to without its token, or
            // one started by another controller): renewing again cannot help.
            Some(77) => {
                say(&format!(
                    "the host refuses to renew run {} on {}: {}; it will be stopped at its \
                     lease (set AGENT_RUN_LEASE_TOKEN to the token its start handed out)",
                    self.id,
                    self.host,
                    reply.stderr_text().trim()
                ));
                self.next_renew = None;
            }
            Some(c) => {
                say(&format!(
                    "renewing the lease of run {} on {} failed ({c}): {}",
                    self.id,
                    self.host,
                    reply.stderr_text()
                ));
                self.next_renew = self.lease.map(|l| Instant::now() + l / 3);
            }
            None => unreachable!("a reply without a code is broken"),
        }
        None
    }

    pub(super) fn send_cancel(&mut self) {
        self.cancel = Cancel::InFlight;
        let wait = format!("{}ms", self.cancel_wait.as_millis());
        let script = self.script_json(&["cancel", &self.id, "--wait", &wait]);
        let timeout = self.cancel_wait + Duration::from_secs(15);
        let (ssh, tx) = (Arc::clone(&self.ssh), self.tx.clone());
        let gen = ssh.generation();
        thread::spawn(move || {
            let reply = ssh.run(&script, Some(timeout));
            let _ = tx.send(Event::Cancelled { gen, reply });
        });
    }

    pub(super) fn on_cancelled(&mut self, gen: u64, reply: Reply) -> Option<u8> {
        let now = Instant::now();
        match reply.code {
            _ if reply.broken() => {
                if let Some(c) = self.ended {
                    return Some(c);
                }
                // It goes out again once we are reconnected.
                self.cancel = Cancel::Wanted(None);
                if self.streaming {
                    say(&format!(
                        "no answer to the cancel request from {}; reconnecting",
                        self.host
                    ));
                    self.ssh.drop_master_if(gen);
                }
                None
            }
            Some(0) => {
                // How it ended, in one line on stderr: stdout carries the run's own output.
                let v: Value = serde_json::from_slice(&reply.stdout).unwrap_or_default();
                say_final(&self.id, &self.host, &v);
                if let Some(c) = self.ended {
                    return Some(outcome(&v).unwrap_or(c));
                }
                self.next_renew = None;
                self.known = outcome(&v);
                self.cancel = Cancel::Done(v);
                // The stream ends as soon as it has copied the rest of the logs.
                self.drain_until = Some(now + DRAIN);
                None
            }
            // No such run: the launch may not have reached the host yet.
            Some(69) if self.ended.is_none() && self.streaming && self.launch.is_some() => {
                self.cancel = Cancel::Wanted(Some(now + Duration::from_millis(200)));
                None
            }
            Some(c) => {
                let _ = std::io::stderr().write_all(&reply.stdout);
                say(&format!(
                    "cancel of run {} on {} ended with {c}: {}",
                    self.id,
                    self.host,
                    reply.stderr_text()
                ));
                Some(self.ended.unwrap_or(c as u8))
            }
            None => unreachable!("a reply without a code is broken"),
        }
    }
}

/// The one line a final record `v` (the host's `cancel --json`) gives a person, on stderr, as
/// `cancel` prints it on the host.
pub(super) fn say_final(id: &str, host: &str, v: &Value) {
    match serde_json::from_value::<Status>(v.clone()) {
        Ok(st) => say(&format!(
            "{} (on {host})",
            human::final_line(&st, human::colour_for(human::stderr_is_terminal()))
        )),
        Err(_) => say(&format!(
            "run {id} on {host} is {}",
            v["state"].as_str().unwrap_or("final")
        )),
    }
}
