//! Launching runs: the `start` tool, the `run` tool (which then follows its run), and the
//! `agent-run start --detach` both go through.

use super::progress::Progress;
use super::watch::Watched;
use super::{Answer, Inner, LAUNCH_TIMEOUT, TASK_AFTER};
use crate::host::{Call, Host};
use crate::keeper::{DETACHED_LABEL, OWNER_LABEL};
use crate::probe::{probe, Probe, Read};
use crate::tools::{self, Launch, LaunchArgs};
use crate::view;
use agent_run_shared::time::duration_arg;
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer};
use serde::Serialize;
use serde_json::Value;
use std::ffi::OsString;
use std::sync::Arc;

/// The answer of `start`.
#[derive(Serialize)]
struct Started {
    run_id: String,
    host: String,
    state: String,
    detached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_s: Option<f64>,
    summary: String,
    next: String,
    /// The host's record, with `verbose: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<Value>,
}

impl Inner {
    /// Launch `l` on `host`, detached from the caller (`agent-run start --detach`), with a lease
    /// unless `detach`, labelled as this server's. Ok(run id, the launch line).
    pub(super) async fn launch(
        &self,
        host: &Arc<Host>,
        l: &Launch,
        detach: bool,
    ) -> Result<(String, Value), String> {
        let mut needs = vec!["labels", "many_ids"];
        if l.timeout.is_some() {
            needs.push("timeout");
        }
        if l.cwd.is_some() {
            needs.push("cwd");
        }
        if !l.env.is_empty() {
            needs.push("env");
        }
        host.require(&needs).await?;
        let id = format!(
            "mcp-{}",
            crate::random_hex(8).map_err(|e| format!("no random bytes: {e}"))?
        );
        let mut w: Vec<OsString> = vec!["start".into(), "--detach".into()];
        w.extend(host.json_flag().await.map(OsString::from));
        // One word per option, `--opt=VALUE`: a value that begins with '-' (a cwd, a label
        // key) can never be read as an option of its own.
        let mut opt = |k: &str, v: String| w.push(format!("{k}={v}").into());
        if !detach {
            opt("--lease", duration_arg(self.keeper.lease));
        }
        if let Some(t) = l.timeout {
            opt("--timeout", duration_arg(t));
        }
        if let Some(g) = l.grace {
            opt("--grace", duration_arg(g));
        }
        if let Some(c) = &l.cwd {
            opt("--cwd", c.clone());
        }
        for (k, v) in &l.env {
            opt("--env", format!("{k}={v}"));
        }
        for (k, v) in &l.labels {
            opt("--label", format!("{k}={v}"));
        }
        opt("--label", format!("{OWNER_LABEL}={}", self.keeper.owner));
        opt("--label", format!("{DETACHED_LABEL}={detach}"));
        w.push(id.clone().into());
        w.push("--".into());
        w.extend(l.argv.iter().map(OsString::from));
        let reply = host
            .agent_run(&w, LAUNCH_TIMEOUT, Call::Leased(&self.keeper.token))
            .await?;
        let line = reply
            .stdout
            .split(|&b| b == b'\n')
            .next()
            .and_then(|l| serde_json::from_slice::<Value>(l).ok())
            .filter(|v| v["run_id"].as_str() == Some(id.as_str()));
        let Some(line) = line else {
            return Err(format!(
                "agent-run on {} refused the launch (exit {}): {}",
                host.name,
                reply.code.map_or("?".into(), |c| c.to_string()),
                reply.stderr_text()
            ));
        };
        if !detach {
            self.keeper.adopt(&host.name, &id);
        }
        crate::say(&format!(
            "run {id} on {}: started{} ({})",
            host.name,
            if detach { ", detached" } else { "" },
            line["state"].as_str().unwrap_or("?")
        ));
        Ok((id, line))
    }

    pub(super) async fn start(&self, a: LaunchArgs) -> Answer {
        let l = a.check("start")?;
        let host = self.host(a.host.as_deref())?;
        let detach = a.detach.unwrap_or(false);
        let (id, line) = self.launch(&host, &l, detach).await?;
        // The launch line says enough for a run that started; the record is read only when
        // asked for, or when the launch did not start the run.
        let record = if a.verbose || line["state"].as_str() != Some("running") {
            let p = probe(&host, &id, None, (Read::Size, Read::Size)).await?;
            let record = p.record.unwrap_or(line);
            self.keeper.observe(&host.name, &record);
            record
        } else {
            line
        };
        let failed = record["state"].as_str() == Some("launch_failed");
        let doc = Started {
            summary: view::cut_to(view::summary(&record), 400),
            state: record["state"].as_str().unwrap_or("?").to_string(),
            next: format!(
                "wait, logs, status or cancel with run_id {id:?} and host {:?}",
                host.name
            ),
            run_id: id,
            host: host.name.clone(),
            detached: detach,
            lease_s: (!detach).then(|| self.keeper.lease.as_secs_f64()),
            record: a.verbose.then_some(record),
        };
        Ok(view::answer(&doc, failed).into())
    }

    pub(super) async fn run(&self, a: LaunchArgs, ctx: &RequestContext<RoleServer>) -> Answer {
        let l = a.check("run")?;
        let wait = a.wait()?;
        let tail = tools::bytes("tail_bytes", a.tail_bytes, tools::DEFAULT_TAIL)?;
        let host = self.host(a.host.as_deref())?;
        let (id, _) = self.launch(&host, &l, false).await?;
        let tasks = ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let limit = if tasks { wait.min(TASK_AFTER) } else { wait };
        // The run id first: the first notification names it.
        let mut progress = ctx.meta.get_progress_token().map(|t| {
            let first = format!("run {id} started on {}", host.name);
            Progress::new(ctx.peer.clone(), t, limit, self.progress_every, first)
        });
        match self
            .watch(&host, &id, limit, progress.as_mut(), &ctx.ct)
            .await?
        {
            Watched::Final => {}
            Watched::Aborted => {
                // The client gave up on this call (or the server is going down): the run goes
                // with it, as a cancelled command should.
                let _ = self.cancel_runs(&host, std::slice::from_ref(&id)).await;
                return Err(format!(
                    "run {id} on {}: cancelled with its request",
                    host.name
                ));
            }
            Watched::Going(p) if tasks => {
                let record = p.record.as_ref().cloned().unwrap_or_default();
                let task = self.task_for(&host, &id, &record).await?;
                return Ok(CallToolResponse::Task(task));
            }
            Watched::Going(_) => {}
        }
        let tails = (Read::Tail { bytes: tail }, Read::Tail { bytes: tail });
        let p = probe(&host, &id, None, tails).await?;
        let record = p.record.clone().map_err(|(_, m)| m)?;
        self.keeper.observe(&host.name, &record);
        let owned = a.verbose.then(|| self.keeper.owns(&host.name, &id));
        Ok(self.final_answer(&host, record, &p, owned).into())
    }

    /// The answer for a run: its view; a launch failure (the model asked for something that
    /// cannot run) and an `unknown` end (agent-run cannot vouch for it) are tool errors.
    pub(super) fn final_answer(
        &self,
        host: &Host,
        record: Value,
        p: &Probe,
        owned: Option<bool>,
    ) -> CallToolResult {
        let failed = matches!(record["state"].as_str(), Some("launch_failed" | "unknown"));
        view::answer(&view::run(&host.name, record, Some(p), owned), failed)
    }
}
