//! The MCP side: tools/list, tools/call and the Tasks extension's tasks/get and tasks/cancel, on
//! top of agent-run on the hosts.
//!
//! Nothing about a run lives only here. A run id is chosen here (`mcp-` and 64 random bits) and
//! everything else is the host's: the record, the logs, the lease. A task id is `RUN_ID@HOST`, so
//! tasks/get and tasks/cancel work for any server that knows the host, also after a restart.

use crate::host::Host;
use crate::keeper::{Keeper, DETACHED_LABEL, OWNER_LABEL};
use crate::probe::{probe, Probe, Read};
use crate::tools::{self, IdsArgs, Launch, LaunchArgs, ListArgs, LogsArgs};
use crate::view::{self, RunError, RunView, Runs};
use crate::Hosts;
use agent_run_shared::time::{duration_arg, rfc3339_now};
use rmcp::model::*;
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde::Serialize;
use serde_json::Value;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A `run` still going after this becomes a task (for clients that support tasks).
const TASK_AFTER: Duration = Duration::from_secs(1);
/// Suggested interval between tasks/get polls.
const TASK_POLL_MS: u64 = 1000;
/// The most of new output one progress notification carries.
const PROGRESS_TEXT: usize = 4096;
/// The shortest time between two looks at a run that is not final.
const MIN_LOOK: Duration = Duration::from_millis(200);
/// How long a host may take to launch a run.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a cancel may take on the host (its grace, 5 s by default, plus the confirmation).
const CANCEL_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    hosts: Arc<Hosts>,
    keeper: Arc<Keeper>,
    /// Cancelled when the server shuts down: task watchers end.
    shutdown: CancellationToken,
    tools: Vec<Tool>,
    instructions: String,
}

type Answer = Result<CallToolResponse, String>;

impl Server {
    pub fn new(hosts: Arc<Hosts>, keeper: Arc<Keeper>, shutdown: CancellationToken) -> Server {
        let names = hosts.names();
        let tools = tools::all(&names, hosts.any());
        let instructions = format!(
            "Commands on {} through agent-run: every process a command starts belongs to its run, a \
             cancel stops all of them, and each run keeps an honest record (finished, cancelled, \
             launch_failed, unknown) on its host. Use run for commands that end within a minute or \
             so, start plus wait/logs for longer ones, cancel to stop, list to find runs again. \
             Runs are tied to this server unless started with detach: true.",
            names.join(", ")
        );
        Server {
            inner: Arc::new(Inner {
                hosts,
                keeper,
                shutdown,
                tools,
                instructions,
            }),
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "agent-run-mcp",
            agent_run_shared::VERSION,
        ))
        .with_instructions(self.inner.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.inner.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let inner = &self.inner;
        let args = request.arguments;
        let answer = match request.name.as_ref() {
            "run" => inner.run(args, &context).await,
            "start" => inner.start(args).await,
            "status" => inner.status(args).await,
            "logs" => inner.logs(args).await,
            "wait" => inner.wait(args, &context).await,
            "cancel" => inner.cancel(args).await,
            "list" => inner.list(args).await,
            other => {
                return Err(McpError::invalid_params(
                    format!(
                    "no tool {other:?}: the tools are run, start, status, logs, wait, cancel, list"
                ),
                    None,
                ))
            }
        };
        Ok(answer.unwrap_or_else(|msg| view::error(&msg).into()))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let (host, id) = self.inner.task_run(&request.task_id)?;
        let p = probe(
            &host,
            &id,
            None,
            (
                Read::Tail {
                    bytes: tools::DEFAULT_TAIL,
                },
                Read::Tail {
                    bytes: tools::DEFAULT_TAIL,
                },
            ),
        )
        .await
        .map_err(|e| McpError::internal_error(e, None))?;
        let record = match &p.record {
            Ok(r) => r.clone(),
            Err((Some(69), msg)) => {
                return Err(McpError::invalid_params(
                    format!("no task {}: {msg}", request.task_id),
                    None,
                ))
            }
            Err((_, msg)) => return Err(McpError::internal_error(msg.clone(), None)),
        };
        self.inner.keeper.observe(&host.name, &record);
        let task = task_of(&request.task_id, &record);
        let payload = if record["final"].as_bool() != Some(true) {
            TaskPayload::Working
        } else if record["state"].as_str() == Some("cancelled") {
            TaskPayload::Cancelled
        } else {
            let owned = self.inner.keeper.owns(&host.name, &id);
            let result = self.inner.final_answer(&host, record, &p, owned);
            let value = serde_json::to_value(result).unwrap_or_default();
            TaskPayload::Completed {
                result: value.as_object().cloned().unwrap_or_default(),
            }
        };
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (host, id) = self.inner.task_run(&request.task_id)?;
        let inner = self.inner.clone();
        let ids = vec![id];
        // The cancel goes on if it takes longer than the acknowledgement may wait: the task's
        // status (tasks/get, from the host) says when the run is final.
        let job = tokio::spawn(async move { inner.cancel_runs(&host, &ids).await });
        match tokio::time::timeout(Duration::from_secs(2), job).await {
            Ok(Ok(Err(e))) => Err(McpError::invalid_params(e, None)),
            _ => Ok(()),
        }
    }
}

/// The Task for a run, from its record.
fn task_of(task_id: &str, record: &Value) -> Task {
    let status = match (record["final"].as_bool(), record["state"].as_str()) {
        (Some(true), Some("cancelled")) => TaskStatus::Cancelled,
        (Some(true), _) => TaskStatus::Completed,
        _ => TaskStatus::Working,
    };
    let created = record["created_at"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(rfc3339_now);
    let updated = record["ended_at"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(rfc3339_now);
    let id = record["run_id"].as_str().unwrap_or("?");
    Task::new(task_id, status, created, updated)
        .with_status_message(format!("run {id}: {}", view::summary(record)))
        .with_poll_interval_ms(TASK_POLL_MS)
}

/// How a watch ended.
enum Watched {
    /// The run is final.
    Final,
    /// The time was up first; the last look at it.
    Going(Box<Probe>),
    /// The caller went away (the request was cancelled, or the server is shutting down).
    Aborted,
}

/// Progress notifications for one request: the output as it arrives.
struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    /// Where the next read of each log starts.
    ends: [u64; 2],
    /// The last value sent (it only grows).
    sent: f64,
}

impl Progress {
    fn new(peer: Peer<RoleServer>, token: ProgressToken) -> Progress {
        Progress {
            peer,
            token,
            ends: [0, 0],
            sent: 0.0,
        }
    }

    async fn note(&mut self, message: String) {
        let p = ProgressNotificationParam::new(self.token.clone(), self.sent).with_message(message);
        let _ = self.peer.notify_progress(p).await;
    }

    fn reads(&self) -> (Read, Read) {
        let r = |o| Read::From {
            offset: o,
            max: 2 * PROGRESS_TEXT as u64,
        };
        (r(self.ends[0]), r(self.ends[1]))
    }

    /// Send what is new in `p` (if anything is): progress = bytes of output so far.
    async fn update(&mut self, p: &Probe) {
        let mut parts = Vec::new();
        for (i, (name, c)) in [("stdout", &p.stdout), ("stderr", &p.stderr)]
            .into_iter()
            .enumerate()
        {
            if c.size < self.ends[i] {
                // The log was cut (a cap, a rewrite): go on from its end.
                self.ends[i] = c.size;
                continue;
            }
            let mut text = String::from_utf8_lossy(&c.data).into_owned();
            self.ends[i] = c.end();
            // Far behind (a workload writing fast): skip to the last bytes.
            let behind = c.size.saturating_sub(self.ends[i]);
            if behind > 16 * PROGRESS_TEXT as u64 {
                self.ends[i] = c.size - PROGRESS_TEXT as u64;
                text.push_str(&format!(
                    "\n[... {} bytes not shown ...]\n",
                    behind - PROGRESS_TEXT as u64
                ));
            }
            if text.is_empty() {
                continue;
            }
            if text.len() > PROGRESS_TEXT {
                let mut cut = text.len() - PROGRESS_TEXT;
                while !text.is_char_boundary(cut) {
                    cut += 1;
                }
                text = format!("[... {cut} bytes not shown ...]{}", &text[cut..]);
            }
            parts.push(if name == "stdout" {
                text
            } else {
                format!("[stderr] {text}")
            });
        }
        let total = (p.stdout.size + p.stderr.size) as f64;
        if parts.is_empty() || total <= self.sent {
            return;
        }
        self.sent = total;
        let msg = parts.join("\n");
        let n = ProgressNotificationParam::new(self.token.clone(), total).with_message(msg);
        let _ = self.peer.notify_progress(n).await;
    }
}

#[derive(Serialize)]
struct Started {
    run_id: String,
    host: String,
    state: String,
    detached: bool,
    lease_s: Option<f64>,
    summary: String,
    next: String,
    record: Value,
}

#[derive(Serialize)]
struct LogsView {
    run_id: String,
    host: String,
    stream: String,
    offset: u64,
    next_offset: u64,
    size: u64,
    more: bool,
    #[serde(rename = "final")]
    is_final: bool,
    state: String,
    text: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    lossy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

#[derive(Serialize)]
struct ListView {
    host: String,
    count: usize,
    runs: Vec<Value>,
}

#[derive(Serialize)]
struct Cancelled {
    host: String,
    took_ms: u64,
    runs: Vec<Value>,
}

impl Inner {
    fn host(&self, name: Option<&str>) -> Result<Arc<Host>, String> {
        self.hosts.resolve(name)
    }

    /// `RUN_ID@HOST` of a task id.
    fn task_run(&self, task_id: &str) -> Result<(Arc<Host>, String), McpError> {
        let bad =
            |why: String| McpError::invalid_params(format!("no task {task_id:?}: {why}"), None);
        let (id, host) = task_id
            .split_once('@')
            .ok_or_else(|| bad("task ids of this server are RUN_ID@HOST".into()))?;
        let id = tools::run_id(id).map_err(bad)?;
        let host = self.hosts.resolve(Some(host)).map_err(bad)?;
        Ok((host, id))
    }

    /// Launch `l` on `host`, detached from the caller (`agent-run start --detach`), with a lease
    /// unless `detach`, labelled as this server's. Ok(run id, the launch line).
    async fn launch(
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
        let mut opt = |k: &str, v: String| {
            w.push(k.into());
            w.push(v.into());
        };
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
        let reply = host.agent_run(&w, LAUNCH_TIMEOUT).await?;
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

    async fn start(&self, args: Option<JsonObject>) -> Answer {
        let a: LaunchArgs = tools::parse("start", args)?;
        let l = a.check("start")?;
        let host = self.host(a.host.as_deref())?;
        let detach = a.detach.unwrap_or(false);
        let (id, line) = self.launch(&host, &l, detach).await?;
        let p = probe(&host, &id, None, (Read::Size, Read::Size)).await?;
        let record = p.record.unwrap_or(line);
        self.keeper.observe(&host.name, &record);
        let doc = Started {
            summary: view::summary(&record),
            state: record["state"].as_str().unwrap_or("?").to_string(),
            next: format!(
                "use wait, logs, status or cancel with run_id {id:?} and host {:?}",
                host.name
            ),
            run_id: id,
            host: host.name.clone(),
            detached: detach,
            lease_s: (!detach).then(|| self.keeper.lease.as_secs_f64()),
            record,
        };
        Ok(view::answer(&doc, false).into())
    }

    async fn run(&self, args: Option<JsonObject>, ctx: &RequestContext<RoleServer>) -> Answer {
        let a: LaunchArgs = tools::parse("run", args)?;
        let l = a.check("run")?;
        let wait = a.wait()?;
        let tail = tools::bytes("tail_bytes", a.tail_bytes, tools::DEFAULT_TAIL)?;
        let host = self.host(a.host.as_deref())?;
        let (id, _) = self.launch(&host, &l, false).await?;
        let mut progress = ctx
            .meta
            .get_progress_token()
            .map(|t| Progress::new(ctx.peer.clone(), t));
        if let Some(p) = progress.as_mut() {
            p.note(format!("run {id} started on {}", host.name)).await;
        }
        let tasks = ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let limit = if tasks { wait.min(TASK_AFTER) } else { wait };
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
                let task_id = format!("{id}@{}", host.name);
                if let Some(progress) = progress {
                    self.spawn_watcher(host.clone(), id.clone(), progress);
                }
                return Ok(CallToolResponse::Task(CreateTaskResult::new(task_of(
                    &task_id, &record,
                ))));
            }
            Watched::Going(_) => {}
        }
        let tails = (Read::Tail { bytes: tail }, Read::Tail { bytes: tail });
        let p = probe(&host, &id, None, tails).await?;
        let record = p.record.clone().map_err(|(_, m)| m)?;
        self.keeper.observe(&host.name, &record);
        let owned = self.keeper.owns(&host.name, &id);
        Ok(self.final_answer(&host, record, &p, owned).into())
    }

    /// The answer for a run: its view; a launch failure is a tool error (the model asked for
    /// something that cannot run).
    fn final_answer(&self, host: &Host, record: Value, p: &Probe, owned: bool) -> CallToolResult {
        let failed = record["state"].as_str() == Some("launch_failed");
        view::answer(&view::run(&host.name, record, Some(p), owned), failed)
    }

    /// Keep sending a task's output as progress, until the run is final or the server ends.
    fn spawn_watcher(&self, host: Arc<Host>, id: String, mut progress: Progress) {
        let keeper = self.keeper.clone();
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let reads = progress.reads();
                let t0 = Instant::now();
                let p = tokio::select! {
                    p = probe(&host, &id, Some(Duration::from_secs(1)), reads) => p,
                    _ = stop.cancelled() => return,
                };
                match p {
                    Ok(p) => {
                        progress.update(&p).await;
                        if let Ok(r) = &p.record {
                            keeper.observe(&host.name, r);
                        } else {
                            return;
                        }
                        if p.is_final() {
                            return;
                        }
                        if t0.elapsed() < MIN_LOOK {
                            tokio::time::sleep(MIN_LOOK - t0.elapsed()).await;
                        }
                    }
                    Err(_) => {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = stop.cancelled() => return,
                        }
                    }
                }
            }
        });
    }

    /// Follow a run until it is final, `limit` is up, or `ct` is cancelled; with `progress`,
    /// send its output as it arrives (a look every second), else look every 5 s (each look
    /// waits on the host, so a run that ends is seen at once).
    async fn watch(
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

    /// Views of several runs (or one), each probed with `tail` bytes of each log.
    async fn views(
        &self,
        host: &Arc<Host>,
        ids: &[String],
        tail: Option<u64>,
    ) -> Vec<Result<RunView, RunError>> {
        let reads = match tail {
            Some(b) => (Read::Tail { bytes: b }, Read::Tail { bytes: b }),
            None => (Read::Size, Read::Size),
        };
        let work = ids.iter().map(|id| {
            let host = host.clone();
            async move {
                let err = |e: String| RunError {
                    run_id: id.clone(),
                    host: host.name.clone(),
                    state: None,
                    error: e,
                };
                let p = probe(&host, id, None, reads).await.map_err(err)?;
                match &p.record {
                    Ok(r) => {
                        self.keeper.observe(&host.name, r);
                        let owned = self.keeper.owns(&host.name, id);
                        let mut v = view::run(&host.name, r.clone(), Some(&p), owned);
                        if tail.is_none() {
                            // Sizes only.
                            for s in [&mut v.stdout, &mut v.stderr].into_iter().flatten() {
                                s.shown_from = s.bytes;
                            }
                        }
                        Ok(v)
                    }
                    Err((_, msg)) => Err(err(msg.clone())),
                }
            }
        });
        futures::future::join_all(work).await
    }

    /// One view as the answer, or several in one document.
    fn views_answer(&self, host: &Host, mut views: Vec<Result<RunView, RunError>>) -> Answer {
        if views.len() == 1 {
            return match views.pop() {
                Some(Ok(v)) => {
                    let failed = v.state == "launch_failed";
                    Ok(view::answer(&v, failed).into())
                }
                Some(Err(e)) => Err(format!("run {} on {}: {}", e.run_id, e.host, e.error)),
                None => Err("no run".into()),
            };
        }
        let runs: Vec<Value> = views
            .into_iter()
            .map(|v| match v {
                Ok(v) => serde_json::to_value(v).unwrap_or_default(),
                Err(e) => serde_json::to_value(e).unwrap_or_default(),
            })
            .collect();
        Ok(view::answer(
            &Runs {
                host: host.name.clone(),
                runs,
            },
            false,
        )
        .into())
    }

    async fn status(&self, args: Option<JsonObject>) -> Answer {
        let a: IdsArgs = tools::parse("status", args)?;
        a.only_for("status")?;
        let ids = a.ids()?;
        let host = self.host(a.host.as_deref())?;
        let views = self.views(&host, &ids, None).await;
        self.views_answer(&host, views)
    }

    async fn wait(&self, args: Option<JsonObject>, ctx: &RequestContext<RoleServer>) -> Answer {
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
        let views = self.views(&host, &ids, Some(tail)).await;
        self.views_answer(&host, views)
    }

    /// `agent-run wait` for at most `step` (on the host, so an end is seen at once), then the
    /// records: one round trip.
    async fn wait_step(
        &self,
        host: &Host,
        ids: &[String],
        any: bool,
        step: Duration,
    ) -> Result<Vec<Value>, String> {
        let mut script = Vec::new();
        if !step.is_zero() {
            let ms = format!("{}ms", step.as_millis().max(1));
            let mut w = vec!["wait", "--timeout", &ms];
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

    /// `agent-run cancel --json IDS` on `host`: the final records (or error entries).
    async fn cancel_runs(&self, host: &Host, ids: &[String]) -> Result<Vec<Value>, String> {
        let mut w = vec!["cancel", "--json"];
        w.extend(ids.iter().map(String::as_str));
        let reply = host.agent_run(&w, CANCEL_TIMEOUT).await?;
        for id in ids {
            self.keeper.release(&host.name, id);
        }
        crate::say(&format!(
            "cancel of {} on {}: exit {}",
            ids.join(", "),
            host.name,
            reply.code.map_or("?".into(), |c| c.to_string())
        ));
        match serde_json::from_slice::<Value>(&reply.stdout) {
            Ok(Value::Array(a)) => Ok(a),
            Ok(v @ Value::Object(_)) => Ok(vec![v]),
            _ => Err(format!(
                "cancel of {} on {} (exit {}): {}",
                ids.join(", "),
                host.name,
                reply.code.map_or("?".into(), |c| c.to_string()),
                reply.stderr_text()
            )),
        }
    }

    async fn cancel(&self, args: Option<JsonObject>) -> Answer {
        let a: IdsArgs = tools::parse("cancel", args)?;
        a.only_for("cancel")?;
        let ids = a.ids()?;
        let host = self.host(a.host.as_deref())?;
        let t0 = Instant::now();
        let records = self.cancel_runs(&host, &ids).await?;
        let took_ms = t0.elapsed().as_millis() as u64;
        let runs: Vec<Value> = records
            .into_iter()
            .map(|r| {
                if r["state"].is_null() {
                    return r;
                }
                serde_json::to_value(view::run(&host.name, r, None, false)).unwrap_or_default()
            })
            .collect();
        let failed = runs.iter().all(|r| r["state"].is_null());
        Ok(view::answer(
            &Cancelled {
                host: host.name.clone(),
                took_ms,
                runs,
            },
            failed,
        )
        .into())
    }

    async fn logs(&self, args: Option<JsonObject>) -> Answer {
        let a: LogsArgs = tools::parse("logs", args)?;
        let id = tools::run_id(&a.run_id)?;
        let host = self.host(a.host.as_deref())?;
        let stream = a.stream.as_deref().unwrap_or("stdout");
        let which = match stream {
            "stdout" => 0,
            "stderr" => 1,
            other => return Err(format!("stream is stdout or stderr, not {other:?}")),
        };
        let read = match (a.offset, a.tail_bytes, a.max_bytes) {
            (Some(_), Some(_), _) => return Err("give offset or tail_bytes, not both".into()),
            (None, _, Some(_)) => {
                return Err("max_bytes goes with offset (tail_bytes without it)".into())
            }
            (Some(offset), None, max) => {
                let max = tools::bytes("max_bytes", max, 16384)?;
                if max == 0 {
                    return Err("max_bytes must be at least 1".into());
                }
                Read::From { offset, max }
            }
            (None, t, None) => Read::Tail {
                bytes: tools::bytes("tail_bytes", t, tools::DEFAULT_TAIL)?,
            },
        };
        let reads = if which == 0 {
            (read, Read::Size)
        } else {
            (Read::Size, read)
        };
        let p = probe(&host, &id, None, reads).await?;
        let record = p
            .record
            .as_ref()
            .map_err(|(_, m)| format!("run {id} on {}: {m}", host.name))?;
        self.keeper.observe(&host.name, record);
        let c = if which == 0 { &p.stdout } else { &p.stderr };
        let sv = view::StreamView::of(c);
        let doc = LogsView {
            run_id: id,
            host: host.name.clone(),
            stream: stream.to_string(),
            offset: c.offset,
            next_offset: c.end(),
            size: c.size,
            more: c.end() < c.size,
            is_final: record["final"].as_bool() == Some(true),
            state: record["state"].as_str().unwrap_or("?").to_string(),
            text: sv.text,
            lossy: sv.lossy,
            file: sv.file,
        };
        Ok(view::answer(&doc, false).into())
    }

    async fn list(&self, args: Option<JsonObject>) -> Answer {
        let a: ListArgs = tools::parse("list", args)?;
        let host = self.host(a.host.as_deref())?;
        let mut w: Vec<String> = vec!["list".into(), "--json".into()];
        if let Some(s) = &a.state {
            if !tools::LIST_STATES.contains(&s.as_str()) {
                return Err(format!(
                    "state is one of {}, not {s:?}",
                    tools::LIST_STATES.join(", ")
                ));
            }
            w.extend(["--state".into(), s.clone()]);
        }
        for (k, v) in &a.labels {
            let sel = if v == "*" {
                agent_run_shared::spec::parse_label(&format!("{k}=x"))
                    .map_err(|e| e.to_string())?;
                k.clone()
            } else {
                let (k, v) = agent_run_shared::spec::parse_label(&format!("{k}={v}"))
                    .map_err(|e| e.to_string())?;
                format!("{k}={v}")
            };
            w.extend(["--label".into(), sel]);
        }
        if a.mine {
            w.extend([
                "--label".into(),
                format!("{OWNER_LABEL}={}", self.keeper.owner),
            ]);
        }
        let limit = a.limit.unwrap_or(20);
        if !(1..=200).contains(&limit) {
            return Err(format!("limit is 1 to 200, not {limit}"));
        }
        w.extend(["-n".into(), limit.to_string()]);
        let reply = host.agent_run(&w, Duration::from_secs(60)).await?;
        let Ok(Value::Array(mut runs)) = serde_json::from_slice::<Value>(&reply.stdout) else {
            return Err(format!(
                "list on {} (exit {}): {}",
                host.name,
                reply.code.map_or("?".into(), |c| c.to_string()),
                reply.stderr_text()
            ));
        };
        for r in &mut runs {
            let id = r["run_id"].as_str().unwrap_or_default().to_string();
            if let Value::Object(m) = r {
                m.insert(
                    "owned_by_this_server".into(),
                    Value::Bool(self.keeper.owns(&host.name, &id)),
                );
            }
        }
        let doc = ListView {
            host: host.name.clone(),
            count: runs.len(),
            runs,
        };
        Ok(view::answer(&doc, false).into())
    }
}
