//! The server's command line: which hosts the tools may use, how runs are leased and labelled,
//! and how agent-run is reached on each host.

use agent_run_shared::time::parse_duration;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// The name of this machine in the tools' `host` argument.
pub const LOCAL: &str = "local";

#[derive(Debug, Parser)]
#[command(
    name = "agent-run-mcp",
    version,
    about = "An MCP server (stdio) that gives an AI agent cancel-safe commands on this machine and on ssh hosts, through agent-run",
    long_about = "An MCP server over stdio: an agent host (Claude Desktop, an IDE, an agent framework) \
        launches it and talks JSON-RPC on its stdin and stdout. Its tools (run, start, status, logs, \
        wait, cancel, list) run commands under agent-run on \"local\" (this machine, no ssh) and on \
        the hosts given with --host, through the system's OpenSSH client (your ~/.ssh/config, agent \
        and known_hosts; one private master connection per host). The server chooses run ids and \
        keeps nothing about a run that the host does not keep: a restarted server, or another agent, \
        picks a run up by its id.\n\n\
        Runs are leased: the server renews the lease of each run it started (every third of --lease); \
        if the server is killed, the host stops them when the lease runs out. When its stdin closes \
        (a clean shutdown), on TERM, INT or HUP, or when its parent (the client) exits, it cancels \
        the runs it started, except those started with detach: true, and exits.",
    after_help = "Example (the JSON an agent host uses to launch it):\n  \
        {\"mcpServers\": {\"agent-run\": {\"command\": \"agent-run-mcp\", \"args\": [\"--host\", \"build1\"]}}}"
)]
pub struct Cli {
    /// An ssh destination the tools may run commands on (repeatable). It is given to ssh as is,
    /// so a Host entry of ~/.ssh/config works (user, port, jump hosts, keys)
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,

    /// Accept any ssh destination as a tool's host, not only those given with --host
    #[arg(long)]
    pub any_host: bool,

    /// Offer no "local" host: commands run only on the ssh hosts
    #[arg(long)]
    pub no_local: bool,

    /// The lease of the runs this server starts (not detached ones): the server renews it every
    /// third of DUR; if the server dies, the host stops the run at most DUR (plus its grace)
    /// after the last renewal
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = lease)]
    pub lease: Duration,

    /// Label this server's runs agent-run-mcp/owner=NAME. A server started again with the same
    /// NAME takes back the runs of its predecessor that are still active (it renews their lease
    /// and cancels them at its own shutdown), with the owner's lease token, kept in
    /// $XDG_STATE_HOME/agent-run-mcp/NAME.token (default ~/.local/state/agent-run-mcp/).
    /// Default: a random name and token, new for each process
    #[arg(long, value_name = "NAME", value_parser = owner)]
    pub owner: Option<String>,

    /// An option for every ssh this server runs (repeatable), e.g. --ssh-option=-oUser=ci
    #[arg(long = "ssh-option", value_name = "OPT", allow_hyphen_values = true)]
    pub ssh_options: Vec<String>,

    /// agent-run on the ssh hosts (a name is looked up in the remote PATH)
    #[arg(long, value_name = "PATH", default_value = "agent-run")]
    pub remote_bin: String,

    /// The run root on the ssh hosts (default: the host's own, $AGENT_RUN_ROOT or ~/.agent-runs)
    #[arg(long, value_name = "DIR")]
    pub remote_root: Option<String>,

    /// agent-run on this machine (default: the agent-run next to this program, else on PATH)
    #[arg(long = "agent-run", value_name = "PATH")]
    pub agent_run: Option<PathBuf>,

    /// The run root on this machine (default: $AGENT_RUN_ROOT, else ~/.agent-runs)
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// The longest time between two progress notifications of a run or wait call that carries
    /// a progress token (a client whose idle timer restarts at each one then never times out
    /// while the run goes on)
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = progress_every)]
    pub progress_every: Duration,

    /// How long an ssh master connection outlives its last channel (also after this server
    /// was killed)
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = persist)]
    pub control_persist: Duration,
}

fn lease(s: &str) -> Result<Duration, String> {
    let d = parse_duration("--lease", s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) {
        return Err("the lease must be at least 1s (it is renewed every third of it)".into());
    }
    Ok(d)
}

fn persist(s: &str) -> Result<Duration, String> {
    let d = parse_duration("--control-persist", s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) {
        return Err("at least 1s".into());
    }
    Ok(d)
}

fn progress_every(s: &str) -> Result<Duration, String> {
    let d = parse_duration("--progress-every", s).map_err(|e| e.to_string())?;
    if !(Duration::from_millis(500)..=Duration::from_secs(300)).contains(&d) {
        return Err("500ms to 5m".into());
    }
    Ok(d)
}

fn owner(s: &str) -> Result<String, String> {
    if s.is_empty()
        || s.len() > 128
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err("1 to 128 characters of A-Z a-z 0-9 . _ -".into());
    }
    Ok(s.to_string())
}

/// Why a `--host` value cannot be a host, if it cannot.
pub fn bad_host(h: &str) -> Option<&'static str> {
    if h.is_empty() {
        Some("it is empty")
    } else if h == LOCAL {
        Some("\"local\" is this machine, reached without ssh")
    } else if h.starts_with('-') {
        Some("it must not start with '-'")
    } else if h.len() > 255 {
        Some("it is longer than 255 bytes")
    } else if h.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("it must not hold spaces or control characters")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["agent-run-mcp", "--progress-every", "2s"]).unwrap();
        assert_eq!(c.progress_every, Duration::from_secs(2));
        assert!(Cli::try_parse_from(["agent-run-mcp", "--progress-every", "100ms"]).is_err());
    }
}
