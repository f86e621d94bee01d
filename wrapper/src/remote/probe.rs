//! Before a launch: ask the host's agent-run what it is (`version --json`), so a missing or too
//! old agent-run is said plainly, naming the host and the program, before anything starts.
//!
//! An agent-run without `version` (older than this one) still runs what needs none of the new
//! options; a launch that needs a feature the host lacks (`--timeout`, `--label`, `-C`, `-e`, `--pty`)
//! is refused with what to upgrade.

use super::ssh::Ssh;
use super::Remote;
use crate::cli::RemoteArgs;
use agent_run_shared::exit;
use serde_json::Value;
use std::time::Duration;

/// The exit code when the host's agent-run is missing, cannot run, or lacks a feature the
/// launch needs: nothing was started.
pub const UNAVAILABLE: u8 = exit::REMOTE_BIN_MISSING;

/// How long the host may take to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The features of the host's agent-run that this launch needs.
pub fn needed(args: &RemoteArgs) -> Vec<&'static str> {
    let mut v = Vec::new();
    if args.timeout.is_some() {
        v.push("timeout");
    }
    if !args.labels.is_empty() {
        v.push("labels");
    }
    if args.cwd.is_some() {
        v.push("cwd");
    }
    if !args.env.is_empty() {
        v.push("env");
    }
    if args.pty {
        v.push("pty");
    }
    if args.max_output.is_some() || args.on_output_limit.is_some() {
        v.push("max_output");
    }
    v
}

/// `Ok(())` when the launch may go ahead, else (exit code, message).
pub fn check(ssh: &Ssh, remote: &Remote, args: &RemoteArgs) -> Result<(), (u8, String)> {
    let script = remote
        .exec(&["version", "--json"])
        .map_err(|e| (exit::USAGE, e.to_string()))?;
    let reply = ssh.run(&script, Some(PROBE_TIMEOUT));
    let host = &args.host;
    let bin = &args.remote_bin;
    let needs = needed(args);
    if reply.broken() {
        return Err((
            exit::TEMPFAIL,
            format!(
                "no answer from {host} when asking its agent-run for its version ({}); nothing was started",
                reply.stderr_text()
            ),
        ));
    }
    let doc: Option<Value> = (reply.code == Some(0))
        .then(|| serde_json::from_slice(&reply.stdout).ok())
        .flatten();
    match (reply.code, doc) {
        (Some(127), _) => Err((
            UNAVAILABLE,
            format!(
                "agent-run is not installed on {host} (`{bin}` was not found there; ssh runs a \
                 non-interactive shell, which may not have ~/.local/bin on its PATH): install it \
                 or give its path with --remote-bin PATH; nothing was started"
            ),
        )),
        (Some(126), _) => Err((
            UNAVAILABLE,
            format!(
                "`{bin}` on {host} cannot be executed ({}): check it, or give another with \
                 --remote-bin PATH; nothing was started",
                reply.stderr_text()
            ),
        )),
        (_, Some(v)) => {
            let have: Vec<&str> = v["features"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let missing: Vec<&str> = needs
                .iter()
                .copied()
                .filter(|n| !have.contains(n))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            Err((
                UNAVAILABLE,
                format!(
                    "agent-run {} on {host} is too old for this launch (it lacks: {}): upgrade it \
                     to {} or newer; nothing was started",
                    v["version"].as_str().unwrap_or("?"),
                    missing.join(", "),
                    agent_run_shared::VERSION
                ),
            ))
        }
        // No `version --json`: older than this agent-run. Fine for a launch that needs nothing
        // new; refused, with what to do, for one that does.
        (code, None) if !needs.is_empty() => Err((
            UNAVAILABLE,
            format!(
                "the agent-run on {host} is too old for {} (it has no `version --json`, exit {}): \
                 upgrade it to {} or newer; nothing was started",
                needs.join(", "),
                code.map_or("?".into(), |c| c.to_string()),
                agent_run_shared::VERSION
            ),
        )),
        (_, None) => Ok(()),
    }
}
