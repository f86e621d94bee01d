//! Following runs: the loop under `run`, and the `wait` tool.

use super::progress::Progress;
use super::{Answer, Inner, MIN_LOOK};
use crate::host::Host;
use crate::probe::{probe, Probe, Read};
use crate::tools::{self, IdsArgs};
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer};
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How a watch ended.
pub(super) enum Watched {
    /// The run is final.
    Final,
    /// The time was up first; the last look at it.
    Going(Box<Probe>),
    /// The caller went away (the request was cancelled, or the server is shutting down).
    Aborted,
}

impl Inner {
    /// Follow a run until it is final, `limit` is up, or `ct` is cancelled; with `progress`,
    /// send its output as it arrives (a look every second), else look every 5 s (each look
    /// waits on the host, so a run that ends is seen at once).
    pub(super) async fn watch(
        &self,
        host: &Host,
        id: &str,
        limit: Duration,
        mut progress: Option<&mut Progress>,
        ct: &CancellationToken,
    ) -> Result<Watched, String> {
        let deadline = Instant::now() + limit;
        loop {
            let now = Instant::now();
            let step = deadline
                .saturating_duration_since(now)
                .min(if progress.is_some() {
                    Duration::from_secs(1)
                } else {
                    Duration::from_secs(5)
                });
            let reads = progress
                .as_ref()
                .map_or((Read::Size, Read::Size), |p| p.reads());
            let got = tokio::select! {
                p = probe(host, id, (!step.is_zero()).then_some(step), reads) => p,
                _ = ct.cancelled() => return Ok(Watched::Aborted),
            };
            match got {
                Ok(p) => {
                    if let Some(pg) = progress.as_mut() {
                        pg.update(&p).await;
                    }
                    match &p.record {
                        Ok(r) => self.keeper.observe(&host.name, r),
                        Err((_, msg)) => return Err(format!("run {id} on {}: {msg}", host.name)),
                    }
                    if p.is_final() {
                        return Ok(Watched::Final);
                    }
                    if Instant::now() >= deadline {
                        return Ok(Watched::Going(Box::new(p)));
                    }
                    // The look waits on the host; one that came back at once without the run
                    // being final (a host that refuses to wait) must not turn into a busy loop.
                    if now.elapsed() < MIN_LOOK {
                        tokio::time::sleep(MIN_LOOK - now.elapsed()).await;
                    }
                }
                Err(e) => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "{e}; run {id} goes on there under its lease and timeout: ask again with status or wait"
                        ));
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now()))) => {}
                        _ = ct.cancelled() => return Ok(Watched::Aborted),
                    }
                }
            }
        }
    }

    pub(super) async fn wait(
        &self,
        args: Option<JsonObject>,
        ctx: &RequestContext<RoleServer>,
    ) -> Answer {
        let a: IdsArgs = tools::parse("wait", args)?;
        let ids = a.ids()?;
        let limit = tools::wait_bound("timeout_s", a.timeout_s)?;
        let tail = tools::bytes("tail_bytes", a.tail_bytes, 2048)?;
        let host = self.host(a.host.as_deref())?;
        let deadline = Instant::now() + limit;
        loop {
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(5));
            let records = tokio::select! {
                r = self.wait_step(&host, &ids, a.any, step) => r?,
                _ = ctx.ct.cancelled() => return Err("wait cancelled with its request (the runs go on)".into()),
            };
            // An entry without a state (no such run, a refused record) counts as done: it will
            // not become final by waiting.
            let done: Vec<bool> = records
                .iter()
                .map(|r| r["final"].as_bool() == Some(true) || r["state"].is_null())
                .collect();
            let over = if a.any {
                done.iter().any(|&d| d)
            } else {
                done.iter().all(|&d| d)
            };
            if over || Instant::now() >= deadline {
                break;
            }
        }
        let views = self.views(&host, &ids, Some(tail), a.verbose).await;
        self.views_answer(&host, views)
    }

    /// `agent-run wait` for at most `step` (on the host, so an end is seen at once), then the
    /// records: one round trip.
    pub(super) async fn wait_step(
        &self,
        host: &Host,
        ids: &[String],
        any: bool,
        step: Duration,
    ) -> Result<Vec<Value>, String> {
        let mut script = Vec::new();
        if !step.is_zero() {
            let ms = format!("--timeout={}ms", step.as_millis().max(1));
            let mut w = vec!["wait", &ms];
            if any {
                w.push("--any");
            }
            w.extend(ids.iter().map(String::as_str));
            script.extend(host.line(&w)?);
            script.extend_from_slice(b" >/dev/null 2>&1\n");
        }
        let mut w = vec!["status", "--json"];
        w.extend(ids.iter().map(String::as_str));
        script.extend_from_slice(b"exec ");
        script.extend(host.line(&w)?);
        let reply = host.script(&script, step + Duration::from_secs(30)).await?;
        if reply.bin_missing() {
            return Err(format!(
                "cannot run agent-run on {}: {}",
                host.name,
                reply.stderr_text()
            ));
        }
        match serde_json::from_slice::<Value>(&reply.stdout) {
            Ok(Value::Array(a)) => Ok(a),
            Ok(v @ Value::Object(_)) => Ok(vec![v]),
            _ => Err(format!(
                "run {} on {}: {}",
                ids.join(", "),
                host.name,
                reply.stderr_text()
            )),
        }
    }
}
