//! The runs this server answers for: it renews their leases while it lives, and cancels them when
//! it shuts down cleanly.
//!
//! The set is a cache of what the hosts know, never the only copy: every run in it carries the
//! labels `agent-run-mcp/owner=<owner>` and `agent-run-mcp/detached=false` on its host, and a
//! server started with the same `--owner` rebuilds the set from `agent-run list` on each host.
//! Detached runs are never in it (they have no lease and outlive the server). A run leaves the set
//! when its host says it is final.

use crate::host::{Call, Host};
use crate::token::LeaseToken;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The label that names the server (owner) that started a run.
pub const OWNER_LABEL: &str = "agent-run-mcp/owner";
/// The label that says whether a run outlives its server (`true`) or is tied to it (`false`).
pub const DETACHED_LABEL: &str = "agent-run-mcp/detached";

/// Owned runs, by host name.
pub struct Keeper {
    pub owner: String,
    pub lease: Duration,
    /// Given to every `start` and `renew` (see [`crate::token`]).
    pub token: LeaseToken,
    runs: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl Keeper {
    pub fn new(owner: String, lease: Duration, token: LeaseToken) -> Keeper {
        Keeper {
            owner,
            lease,
            token,
            runs: Mutex::new(BTreeMap::new()),
        }
    }

    /// This server answers for `id` on `host` from now on.
    pub fn adopt(&self, host: &str, id: &str) {
        self.runs
            .lock()
            .unwrap()
            .entry(host.to_string())
            .or_default()
            .insert(id.to_string());
    }

    /// `id` is final (or cancelled through us): nothing more to renew or cancel.
    pub fn release(&self, host: &str, id: &str) {
        let mut runs = self.runs.lock().unwrap();
        if let Some(set) = runs.get_mut(host) {
            set.remove(id);
            if set.is_empty() {
                runs.remove(host);
            }
        }
    }

    pub fn owns(&self, host: &str, id: &str) -> bool {
        self.runs
            .lock()
            .unwrap()
            .get(host)
            .is_some_and(|s| s.contains(id))
    }

    /// Every owned run, by host.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<String>> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .map(|(h, s)| (h.clone(), s.iter().cloned().collect()))
            .collect()
    }

    /// A record seen by any tool: a run of ours that is still active and tied to a server is
    /// adopted (a restarted server with the same owner takes it back); a final one is released.
    pub fn observe(&self, host: &str, record: &Value) {
        let Some(id) = record["run_id"].as_str() else {
            return;
        };
        if record["final"].as_bool() == Some(true) {
            self.release(host, id);
            return;
        }
        let labels = &record["labels"];
        if labels[OWNER_LABEL].as_str() == Some(self.owner.as_str())
            && labels[DETACHED_LABEL].as_str() == Some("false")
        {
            self.adopt(host, id);
        }
    }

    /// Renew the leases of `ids` on `host` (one round trip), and forget those the host says are
    /// final or gone.
    pub async fn renew_host(&self, host: &Host, ids: &[String]) -> Result<(), String> {
        if ids.is_empty() {
            return Ok(());
        }
        let lease = format!(
            "--lease={}",
            agent_run_shared::time::duration_arg(self.lease)
        );
        let mut words: Vec<&str> = vec!["renew", &lease];
        words.extend(host.json_flag().await);
        words.extend(ids.iter().map(String::as_str));
        let reply = host
            .agent_run(&words, Duration::from_secs(30), Call::Leased(&self.token))
            .await?;
        let doc: Option<Value> = serde_json::from_slice(&reply.stdout).ok();
        // One id gives one object (exit 69 when it is final or gone); several give an array
        // whose failed entries carry error_exit_code.
        let gone: Vec<String> = match doc {
            Some(Value::Array(entries)) => entries
                .iter()
                .filter(|e| e["error_exit_code"].as_i64() == Some(69))
                .filter_map(|e| e["run_id"].as_str().map(str::to_string))
                .collect(),
            _ if ids.len() == 1 && reply.code == Some(69) => ids.to_vec(),
            Some(_) => Vec::new(),
            None if reply.code == Some(0) => Vec::new(),
            None => return Err(reply.stderr_text()),
        };
        for id in gone {
            self.release(&host.name, &id);
        }
        Ok(())
    }

    /// Renew every owned run, every third of the lease, for as long as the server lives.
    pub async fn renew_loop(self: Arc<Self>, hosts: Arc<crate::Hosts>) {
        let mut tick = tokio::time::interval(self.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut work = Vec::new();
            for (name, ids) in self.snapshot() {
                let Some(host) = hosts.get(&name) else {
                    continue;
                };
                let me = self.clone();
                work.push(async move {
                    if let Err(e) = me.renew_host(&host, &ids).await {
                        crate::say(&format!(
                            "cannot renew the leases of {} run(s) on {}: {e} (the host stops them \
                             when their lease runs out)",
                            ids.len(),
                            host.name
                        ));
                    }
                });
            }
            // One bounded call per host, all hosts at once: a slow host delays nobody else's
            // renewal.
            futures::future::join_all(work).await;
        }
    }

    /// Cancel every owned run (one `agent-run cancel` per host, all hosts at once), waiting at
    /// most `wait` for the final records. Each cancel is a process of its own (over ssh, a
    /// channel over a master that outlives us), so one still on its way when we exit still
    /// reaches its host. Returns one line per host for the log.
    pub async fn cancel_all(&self, hosts: &crate::Hosts, wait: Duration) -> Vec<String> {
        let mut work = Vec::new();
        for (name, ids) in self.snapshot() {
            let Some(host) = hosts.get(&name) else {
                continue;
            };
            work.push(async move {
                let mut words: Vec<&str> = vec!["cancel", "--json"];
                words.extend(ids.iter().map(String::as_str));
                match host.agent_run(&words, wait, Call::Lasting).await {
                    Ok(r) if r.code == Some(0) => {
                        format!("cancelled {} run(s) on {}", ids.len(), host.name)
                    }
                    Ok(r) => format!(
                        "cancel of {} run(s) on {} exited {}: {}",
                        ids.len(),
                        host.name,
                        r.code.map_or("?".into(), |c| c.to_string()),
                        r.stderr_text()
                    ),
                    Err(e) => format!("cancel of {} run(s) on {}: {e}", ids.len(), host.name),
                }
            });
        }
        futures::future::join_all(work).await
    }

    /// A server started with an explicit `--owner` takes back the active, attached runs of its
    /// predecessor on `host`, and renews them at once.
    pub async fn reclaim(&self, host: &Host) -> Result<usize, String> {
        let owner = format!("--label={OWNER_LABEL}={}", self.owner);
        let detached = format!("--label={DETACHED_LABEL}=false");
        let reply = host
            .agent_run(
                &["list", "--json", "--state=active", &owner, &detached],
                Duration::from_secs(30),
                Call::Plain,
            )
            .await?;
        let Ok(Value::Array(runs)) = serde_json::from_slice::<Value>(&reply.stdout) else {
            return Err(reply.stderr_text());
        };
        let ids: Vec<String> = runs
            .iter()
            .filter_map(|r| r["run_id"].as_str().map(str::to_string))
            .collect();
        for id in &ids {
            self.adopt(&host.name, id);
        }
        self.renew_host(host, &ids).await?;
        Ok(ids.len())
    }
}
