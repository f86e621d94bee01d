//! What the tools answer: one JSON document per call, its fields in the order a reader needs them
//! (run_id first), serialized as text for the model and as structuredContent for programs.

use crate::probe::{Chunk, Probe};
use agent_run_shared::time::{epoch_now, parse_rfc3339};
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::Value;

/// A tool's answer: `doc` as compact JSON in the text content, and as structuredContent.
pub fn answer<T: Serialize>(doc: &T, is_error: bool) -> CallToolResult {
    let text = serde_json::to_string(doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    let value = serde_json::to_value(doc).unwrap_or(Value::Null);
    let mut r = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    if value.is_object() {
        r.structured_content = Some(value);
    }
    r
}

/// A tool error: one line for the model, no structured content.
pub fn error(msg: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("agent-run-mcp: {msg}"))])
}

/// One log as shown in an answer.
#[derive(Debug, Serialize)]
pub struct StreamView {
    /// The log's size in bytes.
    pub bytes: u64,
    /// Where `text` starts in the log (0: the whole log is shown).
    pub shown_from: u64,
    pub text: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lossy: bool,
    /// Set when the log is not a readable regular file (missing, or replaced by a FIFO, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl StreamView {
    pub fn of(c: &Chunk) -> StreamView {
        let text = String::from_utf8_lossy(&c.data);
        StreamView {
            bytes: c.size,
            shown_from: c.offset,
            lossy: matches!(text, std::borrow::Cow::Owned(_)),
            text: text.into_owned(),
            file: (c.kind != "ok").then(|| c.kind.replace('_', " ")),
        }
    }
}

/// One run, as `run`, `wait`, `status` and `cancel` show it. By default what an agent acts on
/// (state, exit code, summary, output tails and offsets, next); `verbose` adds the host's record
/// and who answers for the run.
#[derive(Debug, Serialize)]
pub struct RunView {
    pub run_id: String,
    pub host: String,
    pub state: String,
    #[serde(rename = "final")]
    pub is_final: bool,
    /// The exit code agent-run gives for the final record (as `agent-run wait` would exit).
    pub exit_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamView>,
    /// Set by a `wait` with `idle_s` that returned because the run wrote nothing for that long
    /// (it goes on).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// How long it had written nothing, as the wait saw it (seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_for_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub more: Option<Verbose>,
}

impl RunView {
    /// A `wait` returned because this run wrote nothing for `silent`.
    pub fn mark_idle(&mut self, silent: std::time::Duration) {
        let secs = (silent.as_secs_f64() * 10.0).floor() / 10.0;
        self.idle = true;
        self.idle_for_s = Some(secs);
        self.next = Some(format!(
            "idle: no output for {secs}s, and it goes on: wait (run_id {:?}, host {:?}) to wait more, logs to read its output, cancel to stop it",
            self.run_id, self.host
        ));
    }
}

/// What `verbose: true` adds.
#[derive(Debug, Serialize)]
pub struct Verbose {
    /// true: the run is tied to a server session (leased); false: started detached.
    pub tied_to_server: bool,
    /// Whether this server renews its lease and cancels it at shutdown.
    pub owned_by_this_server: bool,
    /// The host's record (`agent-run status --json`).
    pub record: Value,
}

/// The most of a summary an answer carries (a launch error can be long).
const SUMMARY_MAX: usize = 400;

/// How long the run ran (or has run so far), in seconds.
fn elapsed(r: &Value) -> Option<f64> {
    let start = parse_rfc3339(r["started_at"].as_str().or(r["created_at"].as_str())?)?;
    let end = r["ended_at"]
        .as_str()
        .and_then(parse_rfc3339)
        .unwrap_or_else(epoch_now);
    Some((end - start).max(0.0))
}

/// Seconds for people: 0.4s, 12s, 3m 20s, 2h 5m.
pub fn human(secs: f64) -> String {
    if secs < 1.0 {
        format!("{}ms", (secs * 1000.0).round())
    } else if secs < 10.0 {
        format!("{secs:.1}s")
    } else if secs < 120.0 {
        format!("{}s", secs.round())
    } else if secs < 7200.0 {
        let s = secs.round() as u64;
        format!("{}m {}s", s / 60, s % 60)
    } else {
        let m = (secs / 60.0).round() as u64;
        format!("{}h {}m", m / 60, m % 60)
    }
}

/// One line that says how the run is or ended.
pub fn summary(r: &Value) -> String {
    let state = r["state"].as_str().unwrap_or("?");
    let took = elapsed(r).map(human).unwrap_or_else(|| "a moment".into());
    let code = r["outcome_exit_code"].as_i64();
    let reason = r["reason"].as_str();
    match state {
        "finished" => match (r["term_signal"].as_str(), code) {
            (Some(sig), Some(c)) => {
                format!("finished: killed by signal {sig} (exit {c}) after {took}")
            }
            (_, Some(c)) => format!("finished with exit code {c} after {took}"),
            _ => format!("finished after {took}"),
        },
        "cancelled" => {
            let mut pids: Vec<i64> = r["cleanup"]["signalled"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_i64).collect())
                .unwrap_or_default();
            pids.sort_unstable();
            pids.dedup();
            let stopped = match (pids.len(), r["cleanup"]["duration_ms"].as_f64()) {
                (0, _) => String::new(),
                (n, Some(ms)) => format!(", {n} process(es) stopped in {}", human(ms / 1000.0)),
                (n, None) => format!(", {n} process(es) stopped"),
            };
            format!(
                "cancelled ({}) after {took}{stopped}, nothing of it left; exit {}",
                reason.unwrap_or("?"),
                code.map_or("?".into(), |c| c.to_string())
            )
        }
        "launch_failed" => format!(
            "launch failed (exit {}): {}",
            code.map_or("?".into(), |c| c.to_string()),
            r["error"].as_str().unwrap_or("?")
        ),
        "unknown" => {
            let surv = r["cleanup"]["survivors"]
                .as_array()
                .filter(|a| !a.is_empty())
                .map(|a| format!("; survivors: {}", Value::Array(a.clone())))
                .unwrap_or_default();
            format!(
                "unknown ({}): agent-run cannot vouch for how it ended{surv}",
                reason.unwrap_or("?")
            )
        }
        "running" => format!("running for {took}"),
        other => format!("{other} ({took})"),
    }
}

/// A run's view from its record and, when read, its logs; `owned` and the record itself only
/// when `verbose` is Some.
pub fn run(host: &str, record: Value, logs: Option<&Probe>, verbose: Option<bool>) -> RunView {
    let is_final = record["final"].as_bool() == Some(true);
    let id = record["run_id"].as_str().unwrap_or("?").to_string();
    let stdout = logs.map(|p| StreamView::of(&p.stdout));
    let stderr = logs.map(|p| StreamView::of(&p.stderr));
    let cut = stdout
        .iter()
        .chain(&stderr)
        .any(|s| s.shown_from > 0 && !s.text.is_empty());
    let next = if !is_final {
        Some(format!(
            "still going: wait (run_id {id:?}, host {host:?}) to wait more, logs to read its output, cancel to stop it"
        ))
    } else if cut {
        Some(format!(
            "the output is longer than shown: logs (run_id {id:?}, host {host:?}) with offset 0 reads it from the start"
        ))
    } else {
        None
    };
    let tied = record["labels"][crate::keeper::DETACHED_LABEL].as_str() != Some("true")
        && !record["lease_deadline_epoch"].is_null();
    RunView {
        next,
        run_id: id,
        host: host.to_string(),
        state: record["state"].as_str().unwrap_or("?").to_string(),
        is_final,
        exit_code: record["outcome_exit_code"].as_i64(),
        reason: record["reason"].as_str().map(str::to_string),
        summary: cut_to(summary(&record), SUMMARY_MAX),
        stdout,
        stderr,
        idle: false,
        idle_for_s: None,
        // Last: it takes the record.
        more: verbose.map(|owned| Verbose {
            tied_to_server: tied,
            owned_by_this_server: owned,
            record,
        }),
    }
}

/// `s` cut to at most `max` bytes (at a character boundary), marked when cut.
pub fn cut_to(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
    s
}

/// An entry for a run that could not be looked at (no such run, a refused record).
#[derive(Debug, Serialize)]
pub struct RunError {
    pub run_id: String,
    pub host: String,
    pub state: Option<String>,
    pub error: String,
}

/// Several runs.
#[derive(Debug, Serialize)]
pub struct Runs<T: Serialize> {
    pub host: String,
    pub runs: Vec<T>,
}
