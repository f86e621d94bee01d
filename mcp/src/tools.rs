//! The tools: names, descriptions written for a model, JSON schemas of their inputs, and the
//! checks every input passes before anything reaches a host.
//!
//! Inputs are parsed strictly (unknown fields are refused, so a misspelt `timeout` is a visible
//! error rather than a run without a timeout) and checked against the same rules agent-run uses
//! on the host (shared::spec for labels and variables, shared::id for run ids), so a bad input is
//! a tool error that says what to fix, before anything is started.

use crate::keeper::{DETACHED_LABEL, OWNER_LABEL};
use agent_run_shared::id::RunId;
use agent_run_shared::record::State;
use rmcp::model::{Tool, ToolAnnotations};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

/// The longest command (argv bytes or shell line) accepted.
pub const MAX_COMMAND: usize = 256 * 1024;
/// The most a `run` or `wait` may wait before it answers.
pub const MAX_WAIT_S: f64 = 600.0;
/// The shortest `idle_s` of a wait.
pub const MIN_IDLE_S: f64 = 1.0;
/// `run`'s and `wait`'s default wait.
pub const DEFAULT_WAIT_S: f64 = 30.0;
/// Default bytes of each stream's tail in a result.
pub const DEFAULT_TAIL: u64 = 4096;
/// The shortest timeout or grace a host can be given: agent-run reads durations in whole
/// milliseconds, so anything shorter would reach it as 0.
pub const MIN_SECONDS: f64 = 0.001;
/// The longest grace the host honours (agent-run's `--grace`, at most 5m).
pub const MAX_GRACE_S: f64 = agent_run_shared::stop::MAX_GRACE.as_secs() as f64;
/// The longest timeout agent-run reads (10 years).
pub const MAX_TIMEOUT_S: f64 = 10.0 * 365.0 * 86400.0;
/// How many runs one status, wait or cancel may name.
pub const MAX_IDS: usize = 20;
/// The states `list` filters on (agent-run's `list --state`): `active` (not final), `final`,
/// or a state of the record, spelt as shared's [`State::as_str`] spells it.
pub fn list_states() -> Vec<&'static str> {
    ["active", "final"]
        .into_iter()
        .chain(State::ALL.map(State::as_str))
        .collect()
}

fn schema(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("a schema is an object"),
    }
}

fn host_schema(hosts: &[String], any: bool) -> Value {
    let mut s = json!({
        "type": "string",
        "default": hosts.first().cloned().unwrap_or_default(),
        "description": format!(
            "Where: {}{}. Defaults to {:?}.",
            hosts.iter().map(|h| format!("{h:?}")).collect::<Vec<_>>().join(", "),
            if any { ", or any ssh destination (user@host, a Host of ~/.ssh/config)" } else { "" },
            hosts.first().cloned().unwrap_or_default(),
        ),
    });
    if !any && !hosts.is_empty() {
        s["enum"] = json!(hosts);
    }
    s
}

fn run_id_schema(what: &str) -> Value {
    json!({
        "type": "string",
        "pattern": "^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$",
        "description": what,
    })
}

fn launch_properties(hosts: &[String], any: bool) -> Map<String, Value> {
    let v = json!({
        "host": host_schema(hosts, any),
        "argv": {
            "type": "array", "items": {"type": "string"}, "minItems": 1,
            "description": "The command and its arguments, run directly without a shell, e.g. [\"make\", \"-j4\", \"test\"]. Give argv or command, not both."
        },
        "command": {
            "type": "string", "minLength": 1,
            "description": "A shell command line, run with sh -c, e.g. \"cd src && make test 2>&1 | tail -n 50\". Give argv or command, not both."
        },
        "cwd": {
            "type": "string",
            "description": "Directory to run in, on the host (best absolute; a relative path is from the home directory over ssh). It must exist."
        },
        "env": {
            "type": "object", "additionalProperties": {"type": "string"},
            "description": "Extra environment variables, e.g. {\"CI\": \"1\"}. The record keeps the names only. Not for secrets: the values pass on a command line."
        },
        "timeout_s": {
            "type": "number", "minimum": MIN_SECONDS, "maximum": MAX_TIMEOUT_S,
            "description": "Wall-clock limit in seconds, enforced by the host: at the limit the whole run is stopped (state cancelled, reason timeout, exit code 124)."
        },
        "grace_s": {
            "type": "number", "minimum": MIN_SECONDS, "maximum": MAX_GRACE_S,
            "description": "When the run is stopped: seconds between TERM and KILL (default 5, at most 300)."
        },
        "labels": {
            "type": "object", "additionalProperties": {"type": "string"},
            "description": "Your own labels, kept in the record and usable in list, e.g. {\"task\": \"fix-tests\"}. Keys: 1-128 of A-Z a-z 0-9 . _ - /; the prefix agent-run-mcp/ is the server's."
        }
    });
    match v {
        Value::Object(mut m) => {
            m.insert("verbose".into(), verbose_schema());
            m
        }
        _ => unreachable!(),
    }
}

fn verbose_schema() -> Value {
    json!({
        "type": "boolean", "default": false,
        "description": "Add the host's full record of each run (status --json) and who answers for it. Off by default: the answer has what you act on (state, exit code, summary, output tails and offsets, next)."
    })
}

/// Every tool, with the hosts this server offers in their schemas.
pub fn all(hosts: &[String], any: bool) -> Vec<Tool> {
    let hs = host_schema(hosts, any);
    vec![
        run_tool(hosts, any),
        start_tool(hosts, any),
        status_tool(&hs),
        logs_tool(&hs),
        wait_tool(&hs),
        cancel_tool(&hs),
        list_tool(&hs),
    ]
}

/// An input schema: an object of `props`, nothing else.
fn object(props: Map<String, Value>, required: &[&str]) -> Arc<Map<String, Value>> {
    schema(json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    }))
}

/// What a tool does to runs, for the client's hints.
#[derive(Clone, Copy)]
enum Effect {
    /// Reads runs: nothing changes, a second call is harmless (status, logs, wait, list).
    Reads,
    /// Starts a run: each call starts another (run, start).
    Starts,
    /// Stops runs: a second call changes nothing (cancel).
    Stops,
}

/// A tool: its name, its title, its effect, its description for the model, its inputs.
fn tool(
    name: &'static str,
    title: &str,
    effect: Effect,
    about: impl Into<Cow<'static, str>>,
    input: Arc<Map<String, Value>>,
) -> Tool {
    let (read_only, destructive, idempotent) = match effect {
        Effect::Reads => (true, false, true),
        Effect::Starts => (false, true, false),
        Effect::Stops => (false, true, true),
    };
    let mut a = ToolAnnotations::new();
    a.read_only_hint = Some(read_only);
    a.destructive_hint = Some(destructive);
    a.idempotent_hint = Some(idempotent);
    a.open_world_hint = Some(true);
    Tool::new(name, about, input)
        .with_title(title)
        .with_annotations(a)
}

/// `host`, and `run_id` or `run_ids`: the inputs of status, wait and cancel.
fn ids_properties(hs: &Value) -> Map<String, Value> {
    let mut p = Map::new();
    p.insert("host".into(), hs.clone());
    p.insert(
        "run_id".into(),
        run_id_schema("The run's id, as start or run returned it."),
    );
    p.insert(
        "run_ids".into(),
        json!({
            "type": "array", "items": run_id_schema("A run id."), "minItems": 1, "maxItems": MAX_IDS,
            "description": "Several runs at once (instead of run_id)."
        }),
    );
    p.insert("verbose".into(), verbose_schema());
    p
}

fn run_tool(hosts: &[String], any: bool) -> Tool {
    let mut p = launch_properties(hosts, any);
    p.insert(
        "wait_s".into(),
        json!({
            "type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": DEFAULT_WAIT_S,
            "description": "How long to wait for the run to end before answering (seconds). A run still going then keeps running: you get its run_id."
        }),
    );
    p.insert(
        "tail_bytes".into(),
        json!({
            "type": "integer", "minimum": 0, "maximum": crate::probe::MAX_READ, "default": DEFAULT_TAIL,
            "description": "How many bytes of the end of stdout and of stderr to return."
        }),
    );
    let about = format!(
        "Run a command on a host and wait for it to end (up to wait_s seconds, default {DEFAULT_WAIT_S}). \
         Returns run_id first, then the state, the exit code, a summary, and the last bytes of stdout and \
         stderr with their sizes (verbose: true adds the host's full record). Every process the command starts belongs to the run: a cancel stops all \
         of them, and the record says how it ended (finished, cancelled, launch_failed, unknown). \
         A command still going when wait_s is up keeps running: the answer has state \"running\"; then call \
         wait (to wait more), logs (output so far), status, or cancel with its run_id. \
         stdin is /dev/null, so a command that prompts fails instead of hanging. \
         The run is tied to this server: if the server dies the host stops it within the server's lease, and \
         a clean shutdown of the server cancels it (use start with detach: true for work that must outlive \
         the session). Clients that support MCP tasks get a task for a run still going after 1 s: its \
         status is the run's, and cancelling the task cancels the run."
    );
    let input = object(p, &[]);
    tool("run", "Run a command", Effect::Starts, about, input)
}

fn start_tool(hosts: &[String], any: bool) -> Tool {
    let mut p = launch_properties(hosts, any);
    p.insert(
        "detach".into(),
        json!({
            "type": "boolean", "default": false,
            "description": "false (default): the run is tied to this server session: leased and renewed by the server, stopped by the host if the server dies, cancelled when the server shuts down. true: the run outlives this server (no lease; nothing stops it but its timeout_s, a cancel or its own end), for work that must survive the session; find it again later with list."
        }),
    );
    let about = "Start a command on a host and return at once with its run_id, without waiting. Same inputs as run, \
     plus detach. Then use wait, logs, status and cancel with the run_id. With detach: false (default) \
     the run is tied to this server (leased; stopped by the host if the server dies; cancelled when the \
     server shuts down). With detach: true it outlives the server and this session (set timeout_s to \
     bound it), and a later session finds it with list.";
    let input = object(p, &[]);
    tool(
        "start",
        "Start a command in the background",
        Effect::Starts,
        about,
        input,
    )
}

fn status_tool(hs: &Value) -> Tool {
    let about = "The current state of runs on a host: state (starting, running, cancelling, or final: finished, \
     cancelled, launch_failed, unknown), reason, exit code, a summary (how long it ran), the sizes of its \
     output (the offsets to read on from with logs), and what to do next; verbose: true adds the host's full \
     record (lease and timeout left, labels, cleanup). Works for any run id on that host, also one started \
     by another session or agent.";
    let input = object(ids_properties(hs), &[]);
    tool("status", "Status of runs", Effect::Reads, about, input)
}

fn logs_tool(hs: &Value) -> Tool {
    let max = crate::probe::MAX_READ;
    let mut p = Map::new();
    p.insert("host".into(), hs.clone());
    p.insert("run_id".into(), run_id_schema("The run's id."));
    p.insert("stream".into(), json!({"type": "string", "enum": ["stdout", "stderr"], "default": "stdout", "description": "Which log."}));
    p.insert("offset".into(), json!({"type": "integer", "minimum": 0, "description": "Byte offset to read from (instead of tail_bytes)."}));
    p.insert("tail_bytes".into(), json!({"type": "integer", "minimum": 0, "maximum": max, "default": DEFAULT_TAIL, "description": "Without offset: how many bytes of the end to read."}));
    p.insert("max_bytes".into(), json!({"type": "integer", "minimum": 1, "maximum": max, "default": 16384, "description": "With offset: the most bytes to return."}));
    let about = "Read a run's output from the host's log files: stdout or stderr, by byte offset or from the end, at \
     most max_bytes per call. Without offset: the last tail_bytes bytes. To read a long log in order, start \
     at offset 0 and call again with offset = next_offset while more is true. A final run's logs no \
     longer grow. Text is UTF-8 with invalid bytes replaced.";
    let input = object(p, &["run_id"]);
    tool("logs", "Read a run's output", Effect::Reads, about, input)
}

fn wait_tool(hs: &Value) -> Tool {
    let mut p = ids_properties(hs);
    p.insert(
        "timeout_s".into(),
        json!({
            "type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": DEFAULT_WAIT_S,
            "description": "How long to wait at most (seconds). Waiting never stops a run."
        }),
    );
    p.insert(
        "idle_s".into(),
        json!({
            "type": "number", "minimum": MIN_IDLE_S, "maximum": MAX_WAIT_S,
            "description": "Also return when a run has written nothing (stdout or stderr) for this many seconds, counted from this call: the answer says idle: true and the run goes on. For a command that may hang waiting for something."
        }),
    );
    p.insert(
        "any".into(),
        json!({"type": "boolean", "default": false, "description": "Return as soon as one of the runs is final (or idle, with idle_s)."}),
    );
    p.insert(
        "tail_bytes".into(),
        json!({
            "type": "integer", "minimum": 0, "maximum": crate::probe::MAX_READ, "default": 2048,
            "description": "How many bytes of the end of each run's stdout and stderr to return."
        }),
    );
    let about = format!(
        "Wait until runs on a host are final, at most timeout_s seconds (default {DEFAULT_WAIT_S}, at most {MAX_WAIT_S}), \
         then return each run's state, exit code and output tails. With any: true, return as soon as one \
         of them is final. With idle_s, also return once a run has written nothing for idle_s seconds \
         (idle: true in its answer). A run still going when the time is up comes back with state running: \
         call wait again. Waiting never stops a run."
    );
    let input = object(p, &[]);
    tool("wait", "Wait for runs", Effect::Reads, about, input)
}

fn cancel_tool(hs: &Value) -> Tool {
    let about = "Stop runs on a host, with everything they started: TERM to every process of the run, HUP, then KILL \
     after the run's grace (5 s unless grace_s was given), and only then the final record. Returns each \
     final record: cancelled (no process of the run is left), finished (it ended first), or unknown \
     (processes survived; their pids are listed). Cancelling a final run changes nothing.";
    let input = object(ids_properties(hs), &[]);
    tool("cancel", "Cancel runs", Effect::Stops, about, input)
}

fn list_tool(hs: &Value) -> Tool {
    let mut p = Map::new();
    p.insert("host".into(), hs.clone());
    p.insert("state".into(), json!({"type": "string", "enum": list_states(), "description": "Only runs in this state: active (not final), final, or a state name."}));
    p.insert("labels".into(), json!({"type": "object", "additionalProperties": {"type": "string"}, "description": "Only runs with all these labels; the value \"*\" matches any value."}));
    p.insert("mine".into(), json!({"type": "boolean", "default": false, "description": "Only the runs this server started (its owner label)."}));
    p.insert("limit".into(), json!({"type": "integer", "minimum": 1, "maximum": 200, "default": 20, "description": "At most this many (the newest)."}));
    let about = format!(
        "List runs on a host, newest first: run_id, state, reason, exit code, age, labels. Filter by state, \
         by labels, mine: true for the runs of this server. Runs started through this server carry the \
         labels {OWNER_LABEL} and {DETACHED_LABEL}: use list to find a run again after a restart or in \
         another session, then status, logs, wait or cancel it by run_id."
    );
    let input = object(p, &[]);
    tool("list", "List runs", Effect::Reads, about, input)
}

// ---------------------------------------------------------------------------------------------
// Inputs

/// `run` and `start`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchArgs {
    pub host: Option<String>,
    pub argv: Option<Vec<String>>,
    pub command: Option<String>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub timeout_s: Option<f64>,
    pub grace_s: Option<f64>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub wait_s: Option<f64>,
    pub tail_bytes: Option<u64>,
    pub detach: Option<bool>,
    #[serde(default)]
    pub verbose: bool,
}

/// `status`, `cancel`, `wait`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdsArgs {
    pub host: Option<String>,
    pub run_id: Option<String>,
    pub run_ids: Option<Vec<String>>,
    pub timeout_s: Option<f64>,
    #[serde(default)]
    pub any: bool,
    pub tail_bytes: Option<u64>,
    pub idle_s: Option<f64>,
    #[serde(default)]
    pub verbose: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsArgs {
    pub host: Option<String>,
    pub run_id: String,
    pub stream: Option<String>,
    pub offset: Option<u64>,
    pub tail_bytes: Option<u64>,
    pub max_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    pub host: Option<String>,
    pub state: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub mine: bool,
    pub limit: Option<u64>,
}

/// Parse a tool's arguments; a mismatch is a message for the model.
pub fn parse<T: for<'de> Deserialize<'de>>(
    tool: &str,
    args: Option<Map<String, Value>>,
) -> Result<T, String> {
    serde_json::from_value(Value::Object(args.unwrap_or_default()))
        .map_err(|e| format!("bad arguments for {tool}: {e}"))
}

/// What to launch, checked.
#[derive(Debug)]
pub struct Launch {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    pub grace: Option<Duration>,
    pub labels: Vec<(String, String)>,
}

/// Seconds for the host: at least [`MIN_SECONDS`] (a shorter value would reach agent-run as 0
/// and is refused here, never rounded), at most `max`.
fn seconds(what: &str, v: f64, max: f64) -> Result<Duration, String> {
    if !v.is_finite() || !(MIN_SECONDS..=max).contains(&v) {
        return Err(format!(
            "{what} must be at least {MIN_SECONDS} (1 ms, the host's resolution) and at most {max} (seconds), not {v}"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

fn no_nul(what: &str, s: &str) -> Result<(), String> {
    if s.contains('\0') {
        return Err(format!(
            "{what} holds a NUL byte, which no command line can carry"
        ));
    }
    Ok(())
}

impl LaunchArgs {
    /// Check everything; `detach` and `wait_s`/`tail_bytes` belong to one tool each.
    pub fn check(&self, tool: &str) -> Result<Launch, String> {
        match tool {
            "run" if self.detach.is_some() => {
                return Err("run has no detach: a run is tied to this server; use start with detach: true".into())
            }
            "start" if self.wait_s.is_some() || self.tail_bytes.is_some() => {
                return Err("start returns at once: wait_s and tail_bytes are for run (or use wait after start)".into())
            }
            _ => {}
        }
        let argv = match (&self.argv, &self.command) {
            (Some(_), Some(_)) => return Err("give argv or command, not both".into()),
            (None, None) => return Err(
                "give the command: argv (a list, run without a shell) or command (a shell line)"
                    .into(),
            ),
            (Some(a), None) => {
                if a.is_empty() || a[0].is_empty() {
                    return Err(
                        "argv must not be empty, and its first word is the program to run".into(),
                    );
                }
                a.clone()
            }
            (None, Some(c)) => {
                if c.trim().is_empty() {
                    return Err("command must not be empty".into());
                }
                vec!["sh".into(), "-c".into(), c.clone()]
            }
        };
        let total: usize = argv.iter().map(|a| a.len() + 1).sum();
        if total > MAX_COMMAND {
            return Err(format!(
                "the command is {total} bytes long; at most {MAX_COMMAND} are accepted (write a script to a file and run that)"
            ));
        }
        for a in &argv {
            no_nul("an argument", a)?;
        }
        if let Some(c) = &self.cwd {
            if c.is_empty() {
                return Err("cwd must not be empty (leave it out for the default)".into());
            }
            no_nul("cwd", c)?;
            // agent-run's `start -d` hands the directory on to its detached wrapper as a word of
            // its own, where a leading '-' would read as an option.
            if c.starts_with('-') {
                return Err(format!(
                    "cwd {c:?} begins with '-', which a command line reads as an option: write ./{c}"
                ));
            }
        }
        let env = self.checked_env()?;
        let labels = self.checked_labels()?;
        Ok(Launch {
            argv,
            cwd: self.cwd.clone(),
            env,
            timeout: self
                .timeout_s
                .map(|t| seconds("timeout_s", t, MAX_TIMEOUT_S))
                .transpose()?,
            grace: self
                .grace_s
                .map(|g| seconds("grace_s", g, MAX_GRACE_S))
                .transpose()?,
            labels,
        })
    }

    fn checked_env(&self) -> Result<Vec<(String, String)>, String> {
        let mut env = Vec::new();
        for (k, v) in &self.env {
            no_nul("an env value", v)?;
            no_nul("an env name", k)?;
            if k.contains('=') {
                return Err(format!("env name {k:?} must not hold '='"));
            }
            agent_run_shared::spec::parse_env(&OsString::from(format!("{k}={v}")))
                .map_err(|e| e.to_string())?;
            env.push((k.clone(), v.clone()));
        }
        Ok(env)
    }

    fn checked_labels(&self) -> Result<Vec<(String, String)>, String> {
        let mut labels = Vec::new();
        for (k, v) in &self.labels {
            // As for cwd: the detached wrapper gets `--label K=V` as two words.
            if k.starts_with('-') {
                return Err(format!(
                    "label {k:?}: a label key must not begin with '-', which a command line reads as an option"
                ));
            }
            if k.starts_with("agent-run-mcp/") {
                return Err(format!(
                    "label {k:?}: the prefix agent-run-mcp/ is the server's own"
                ));
            }
            labels.push(
                agent_run_shared::spec::parse_label(&format!("{k}={v}"))
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(labels)
    }

    pub fn wait(&self) -> Result<Duration, String> {
        wait_bound("wait_s", self.wait_s)
    }
}

/// A wait in seconds between 0 and [`MAX_WAIT_S`], default [`DEFAULT_WAIT_S`].
pub fn wait_bound(what: &str, v: Option<f64>) -> Result<Duration, String> {
    let v = v.unwrap_or(DEFAULT_WAIT_S);
    if !v.is_finite() || !(0.0..=MAX_WAIT_S).contains(&v) {
        return Err(format!(
            "{what} must be between 0 and {MAX_WAIT_S} (seconds), not {v}"
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A byte count of at most [`crate::probe::MAX_READ`].
pub fn bytes(what: &str, v: Option<u64>, default: u64) -> Result<u64, String> {
    let v = v.unwrap_or(default);
    if v > crate::probe::MAX_READ {
        return Err(format!(
            "{what} is at most {} (read a long log in pieces with logs and offset)",
            crate::probe::MAX_READ
        ));
    }
    Ok(v)
}

/// A run id, checked as agent-run checks it.
pub fn run_id(id: &str) -> Result<String, String> {
    RunId::parse(id)
        .map(|r| r.as_str().to_string())
        .map_err(|e| e.to_string())
}

impl IdsArgs {
    /// The run ids named, checked (run_id or run_ids, not both).
    pub fn ids(&self) -> Result<Vec<String>, String> {
        let ids = match (&self.run_id, &self.run_ids) {
            (Some(_), Some(_)) => return Err("give run_id or run_ids, not both".into()),
            (None, None) => return Err("give run_id (or run_ids for several)".into()),
            (Some(id), None) => vec![id.clone()],
            (None, Some(ids)) => ids.clone(),
        };
        if ids.is_empty() || ids.len() > MAX_IDS {
            return Err(format!("give 1 to {MAX_IDS} run ids, not {}", ids.len()));
        }
        let mut out: Vec<String> = Vec::new();
        for id in &ids {
            let id = run_id(id)?;
            if !out.contains(&id) {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// `idle_s`, checked: at least [`MIN_IDLE_S`] (the looks are a second apart), at most
    /// [`MAX_WAIT_S`].
    pub fn idle(&self) -> Result<Option<Duration>, String> {
        let Some(v) = self.idle_s else {
            return Ok(None);
        };
        if !v.is_finite() || !(MIN_IDLE_S..=MAX_WAIT_S).contains(&v) {
            return Err(format!(
                "idle_s must be between {MIN_IDLE_S} and {MAX_WAIT_S} (seconds), not {v}"
            ));
        }
        Ok(Some(Duration::from_secs_f64(v)))
    }

    /// Refuse the inputs that belong to another of the three tools.
    pub fn only_for(&self, tool: &str) -> Result<(), String> {
        let extra = match tool {
            "wait" => None,
            _ if self.timeout_s.is_some() => Some("timeout_s"),
            _ if self.any => Some("any"),
            _ if self.tail_bytes.is_some() => Some("tail_bytes"),
            _ if self.idle_s.is_some() => Some("idle_s"),
            _ => None,
        };
        match extra {
            Some(f) => Err(format!("{tool} has no {f} (that is for wait)")),
            None => Ok(()),
        }
    }
}
