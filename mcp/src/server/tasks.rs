//! MCP Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663): a `run` still going after
//! [`super::TASK_AFTER`] answers with a task whose id is `RUN_ID@HOST`.
//!
//! The task is the run: nothing about it lives here. `tasks/get` reads the host's record each
//! time, so it works from any server that knows the host, a restarted one included. The task is
//! handed out only once its record is on the host's disk (fsynced, with the entries that name
//! it), so a `tasks/get` resolves even after the host itself restarted. `tasks/cancel` is
//! `agent-run cancel`, and it answers once the run is final: cancelled (nothing of it is left),
//! finished (it ended first), or an error that names the processes that survived (the record
//! says `unknown`). A client that did not declare the extension gets -32021 for `tasks/*` (rmcp
//! checks it before these run).

use super::Inner;
use crate::host::Host;
use crate::probe::{probe, Read};
use crate::tools;
use crate::view;
use agent_run_shared::time::rfc3339_now;
use rmcp::model::*;
use rmcp::ErrorData as McpError;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Suggested interval between tasks/get polls.
const TASK_POLL_MS: u64 = 1000;
/// How long tasks/cancel waits for the final record before it acknowledges anyway (under the
/// 60 s a client commonly gives a request); the stop goes on, and tasks/get says when it ends.
const CANCEL_ACK_WAIT: Duration = Duration::from_secs(50);

/// The Task for a run, from its record.
pub(super) fn task_of(task_id: &str, record: &Value) -> Task {
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

/// What `agent-run cancel --json ID` answered, for tasks/cancel: Ok for a run that is final and
/// whole (or still stopping: the cancel goes on), Err naming the survivors of an `unknown` end.
fn cancel_outcome(task_id: &str, records: &[Value]) -> Result<(), McpError> {
    let Some(r) = records.first() else {
        return Ok(());
    };
    if r["state"].is_null() {
        let why = r["error"].as_str().unwrap_or("the host said nothing");
        return Err(McpError::invalid_params(
            format!("no task {task_id}: {why}"),
            None,
        ));
    }
    if r["state"].as_str() != Some("unknown") {
        return Ok(());
    }
    let survivors = r["cleanup"]["survivors"].clone();
    Err(McpError::internal_error(
        format!(
            "task {task_id}: the run was cancelled but agent-run cannot vouch for its end: {}",
            view::summary(r)
        ),
        Some(json!({
            "run_id": r["run_id"],
            "state": "unknown",
            "reason": r["reason"],
            "survivors": survivors,
        })),
    ))
}

impl Inner {
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

    /// The task of run `id`, once its record is durable on `host`: the record, its run dir and
    /// the root's entry for it are fsynced (coreutils `sync FILE...`). A host whose `sync` cannot
    /// do that still has the record, which `tasks/get` reads: it is said, and the task goes out.
    pub(super) async fn task_for(
        &self,
        host: &Host,
        id: &str,
        record: &Value,
    ) -> Result<CreateTaskResult, String> {
        let dir = host.run_dir_word(id);
        let mut script = b"d=".to_vec();
        script.extend(dir);
        script.extend_from_slice(b"\nexec sync -- \"$d/status.json\" \"$d\" \"$d/..\"\n");
        match host.script(&script, Duration::from_secs(30)).await {
            Ok(r) if r.code == Some(0) => {}
            Ok(r) => crate::say(&format!(
                "run {id} on {}: sync of its record exited {}: {}",
                host.name,
                r.code.map_or("?".into(), |c| c.to_string()),
                r.stderr_text()
            )),
            Err(e) => return Err(format!("run {id} on {}: {e}", host.name)),
        }
        let task_id = format!("{id}@{}", host.name);
        Ok(CreateTaskResult::new(task_of(&task_id, record)))
    }

    pub(super) async fn get_task(&self, task_id: &str) -> Result<GetTaskResult, McpError> {
        let (host, id) = self.task_run(task_id)?;
        let tail = Read::Tail {
            bytes: tools::DEFAULT_TAIL,
        };
        let p = probe(&host, &id, None, (tail, tail))
            .await
            .map_err(|e| McpError::internal_error(e, None))?;
        let record = match &p.record {
            Ok(r) => r.clone(),
            Err((Some(69), msg)) => {
                return Err(McpError::invalid_params(
                    format!("no task {task_id}: {msg}"),
                    None,
                ))
            }
            Err((_, msg)) => return Err(McpError::internal_error(msg.clone(), None)),
        };
        self.keeper.observe(&host.name, &record);
        let task = task_of(task_id, &record);
        let payload = if record["final"].as_bool() != Some(true) {
            TaskPayload::Working
        } else if record["state"].as_str() == Some("cancelled") {
            TaskPayload::Cancelled
        } else {
            let result = self.final_answer(&host, record, &p, None);
            let value = serde_json::to_value(result).unwrap_or_default();
            TaskPayload::Completed {
                result: value.as_object().cloned().unwrap_or_default(),
            }
        };
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    /// `agent-run cancel` of the task's run, answered once its record is final (at most
    /// [`CANCEL_ACK_WAIT`]).
    pub(super) async fn cancel_task(self: Arc<Self>, task_id: &str) -> Result<(), McpError> {
        let (host, id) = self.task_run(task_id)?;
        let ids = vec![id];
        // Spawned: the cancel goes on if the acknowledgement stops waiting for it.
        let job = tokio::spawn(async move { self.cancel_runs(&host, &ids).await });
        match tokio::time::timeout(CANCEL_ACK_WAIT, job).await {
            Ok(Ok(Ok(records))) => cancel_outcome(task_id, &records),
            Ok(Ok(Err(e))) => Err(McpError::internal_error(e, None)),
            Ok(Err(_)) | Err(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_as_final_as_its_record() {
        let working = json!({"run_id": "r", "state": "running", "final": false});
        assert_eq!(task_of("r@h", &working).status, TaskStatus::Working);
        let cancelled = json!({"run_id": "r", "state": "cancelled", "final": true});
        assert_eq!(task_of("r@h", &cancelled).status, TaskStatus::Cancelled);
        let unknown = json!({"run_id": "r", "state": "unknown", "final": true,
            "reason": "cancel_request", "cleanup": {"survivors": [4242]}});
        let t = task_of("r@h", &unknown);
        assert_eq!(t.status, TaskStatus::Completed);
        assert!(t.status_message.unwrap().contains("4242"));
    }

    #[test]
    fn a_cancel_that_left_survivors_names_them() {
        let whole = json!({"run_id": "r", "state": "cancelled", "final": true});
        assert!(cancel_outcome("r@h", &[whole]).is_ok());
        let ended = json!({"run_id": "r", "state": "finished", "final": true});
        assert!(cancel_outcome("r@h", &[ended]).is_ok());
        let unknown = json!({"run_id": "r", "state": "unknown", "final": true,
            "reason": "cancel_request", "cleanup": {"survivors": [4242, 4243]}});
        let e = cancel_outcome("r@h", &[unknown]).unwrap_err();
        assert_eq!(e.code, ErrorCode::INTERNAL_ERROR);
        assert!(e.message.contains("4242"), "{}", e.message);
        assert_eq!(e.data.unwrap()["survivors"], json!([4242, 4243]));
        let gone = json!({"run_id": "r", "state": null, "error": "no such run r"});
        assert_eq!(
            cancel_outcome("r@h", &[gone]).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
    }
}
