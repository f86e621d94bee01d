//! The MCP side: tools/list, tools/call and the Tasks extension's tasks/get and tasks/cancel, on
//! top of agent-run on the hosts.
//!
//! Nothing about a run lives only here. A run id is chosen here (`mcp-` and 64 random bits) and
//! everything else is the host's: the record, the logs, the lease. A task id is `RUN_ID@HOST`, so
//! tasks/get and tasks/cancel work for any server that knows the host, also after a restart.

mod launch;
mod progress;
mod runs;
mod watch;

use crate::host::Host;
use crate::keeper::Keeper;
use crate::probe::{probe, Read};
use crate::tools;
use crate::view;
use crate::Hosts;
use agent_run_shared::time::rfc3339_now;
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// A `run` still going after this becomes a task (for clients that support tasks).
const TASK_AFTER: Duration = Duration::from_secs(1);
/// Suggested interval between tasks/get polls.
const TASK_POLL_MS: u64 = 1000;
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
    tools: Vec<Tool>,
    instructions: String,
    /// The longest time between two progress notifications of a call.
    progress_every: Duration,
}

type Answer = Result<CallToolResponse, String>;

impl Server {
    pub fn new(hosts: Arc<Hosts>, keeper: Arc<Keeper>, progress_every: Duration) -> Server {
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
                tools,
                instructions,
                progress_every,
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
            let result = self.inner.final_answer(&host, record, &p, None);
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
}
