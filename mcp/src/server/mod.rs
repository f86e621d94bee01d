//! The MCP side: tools/list, tools/call and the Tasks extension's tasks/get and tasks/cancel, on
//! top of agent-run on the hosts.
//!
//! Nothing about a run lives only here. A run id is chosen here (`mcp-` and 64 random bits) and
//! everything else is the host's: the record, the logs, the lease. A task id is `RUN_ID@HOST`, so
//! tasks/get and tasks/cancel work for any server that knows the host, also after a restart.

mod launch;
mod progress;
mod runs;
mod tasks;
mod watch;

use crate::host::Host;
use crate::keeper::Keeper;
use crate::tools;
use crate::view;
use crate::Hosts;
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A `run` still going after this becomes a task (for clients that support tasks).
const TASK_AFTER: Duration = Duration::from_secs(1);
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
            "run" => with("run", args, |a| inner.run(a, &context)).await,
            "start" => with("start", args, |a| inner.start(a)).await,
            "status" => with("status", args, |a| inner.status(a)).await,
            "logs" => with("logs", args, |a| inner.logs(a)).await,
            "wait" => with("wait", args, |a| inner.wait(a, &context)).await,
            "cancel" => with("cancel", args, |a| inner.cancel(a)).await,
            "list" => with("list", args, |a| inner.list(a)).await,
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
        self.inner.get_task(&request.task_id).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.inner.clone().cancel_task(&request.task_id).await
    }
}

/// Call a tool with its arguments parsed (a mismatch is a message for the model).
async fn with<A: DeserializeOwned, F: Future<Output = Answer>>(
    tool: &str,
    args: Option<JsonObject>,
    call: impl FnOnce(A) -> F,
) -> Answer {
    call(tools::parse(tool, args)?).await
}

impl Inner {
    fn host(&self, name: Option<&str>) -> Result<Arc<Host>, String> {
        self.hosts.resolve(name)
    }
}
