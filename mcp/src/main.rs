//! `agent-run-mcp`: an MCP server over stdio that gives an AI agent cancel-safe commands on this
//! machine and on ssh hosts, through agent-run.
//!
//! The pieces: [`cli`] (options), [`host`] (a host: agent-run run here or over ssh), [`ssh`] (the
//! master connection per host), [`probe`] (a run's record and a bounded read of its logs in one
//! round trip), [`keeper`] (the runs this server leases: renewals, and the cancels of a clean
//! shutdown), [`tools`] (names, descriptions, schemas, input checks), [`view`] (the answers),
//! [`transport`] (JSON-RPC lines on stdio), [`parent`] (the client we never outlive), [`token`]
//! (the lease token) and [`server`] (the MCP handler, tasks included).
//!
//! Only this program has an async runtime (tokio, one thread); agent-run and agent-run-watchdog
//! have none.

mod cli;
mod host;
mod keeper;
mod parent;
mod probe;
mod server;
mod ssh;
mod token;
mod tools;
mod transport;
mod view;

use clap::Parser;
use cli::{Cli, LOCAL};
use host::Host;
use keeper::Keeper;
use rmcp::ServiceExt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// How long a clean shutdown waits for the cancels of its runs.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(20);

/// A message on stderr (the agent host's log of this server), in one write.
pub fn say(msg: &str) {
    let line = format!("agent-run-mcp: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// `n` random bytes from /dev/urandom, as lowercase hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The hosts the tools may name.
pub struct Hosts {
    fixed: Vec<Arc<Host>>,
    /// Hosts met through --any-host, made on first use.
    extra: Mutex<Vec<Arc<Host>>>,
    any: bool,
    ssh: Option<SshSetup>,
}

/// What every ssh host shares.
struct SshSetup {
    options: Arc<Vec<String>>,
    dir: Arc<ssh::ControlDir>,
    persist: Duration,
    bin: String,
    root: Option<String>,
}

impl SshSetup {
    fn host(&self, name: &str, index: usize) -> Arc<Host> {
        let conn = ssh::Conn::new(
            name,
            index,
            self.options.clone(),
            self.dir.clone(),
            self.persist,
        );
        Arc::new(Host::ssh(name, conn, &self.bin, self.root.as_deref()))
    }
}

impl Hosts {
    fn new(cli: &Cli) -> Result<Hosts, String> {
        let mut fixed = Vec::new();
        if !cli.no_local {
            fixed.push(Arc::new(Host::local(local_bin(cli), cli.root.clone())));
        }
        let ssh = if cli.hosts.is_empty() && !cli.any_host {
            None
        } else {
            let dir = ssh::control_dir().map_err(|e| {
                format!("cannot create a directory for the ssh control sockets: {e}")
            })?;
            Some(SshSetup {
                options: Arc::new(cli.ssh_options.clone()),
                dir: Arc::new(dir),
                persist: cli.control_persist,
                bin: cli.remote_bin.clone(),
                root: cli.remote_root.clone(),
            })
        };
        for name in &cli.hosts {
            if fixed.iter().any(|h: &Arc<Host>| &h.name == name) {
                continue;
            }
            let n = fixed.len();
            if let Some(s) = &ssh {
                fixed.push(s.host(name, n));
            }
        }
        if fixed.is_empty() && !cli.any_host {
            return Err("no host: --no-local needs at least one --host (or --any-host)".into());
        }
        Ok(Hosts {
            fixed,
            extra: Mutex::new(Vec::new()),
            any: cli.any_host,
            ssh,
        })
    }

    /// The configured hosts' names, the default first.
    pub fn names(&self) -> Vec<String> {
        self.fixed.iter().map(|h| h.name.clone()).collect()
    }

    pub fn any(&self) -> bool {
        self.any
    }

    /// Every host in use.
    pub fn all(&self) -> Vec<Arc<Host>> {
        let mut v = self.fixed.clone();
        v.extend(self.extra.lock().unwrap().iter().cloned());
        v
    }

    pub fn get(&self, name: &str) -> Option<Arc<Host>> {
        self.all().into_iter().find(|h| h.name == name)
    }

    /// The host a tool names (None: the default), or why it cannot be used.
    pub fn resolve(&self, name: Option<&str>) -> Result<Arc<Host>, String> {
        let name = match name {
            Some(n) => n,
            None => match self.fixed.first() {
                Some(h) => return Ok(h.clone()),
                None => return Err("give a host (this server has no default host)".into()),
            },
        };
        if let Some(h) = self.get(name) {
            return Ok(h);
        }
        let known = self
            .names()
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        if name == LOCAL {
            return Err(format!(
                "unknown host \"local\": this server was started with --no-local; its hosts are {known}"
            ));
        }
        match (&self.ssh, self.any, cli::bad_host(name)) {
            (Some(s), true, None) => {
                let mut extra = self.extra.lock().unwrap();
                if let Some(h) = extra.iter().find(|h| h.name == name) {
                    return Ok(h.clone());
                }
                let h = s.host(name, self.fixed.len() + extra.len());
                extra.push(h.clone());
                Ok(h)
            }
            (_, true, Some(why)) => Err(format!("bad host {name:?}: {why}")),
            _ => Err(format!(
                "unknown host {name:?}: this server's hosts are {known} (start it with --host {name} to add one)"
            )),
        }
    }

    fn remove_control_dir(&self) {
        if let Some(s) = &self.ssh {
            s.dir.remove();
        }
    }
}

/// `--agent-run`, else the agent-run beside this program, else `agent-run` on PATH.
fn local_bin(cli: &Cli) -> PathBuf {
    if let Some(p) = &cli.agent_run {
        return p.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("agent-run")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("agent-run"))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 64 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    for h in &cli.hosts {
        if let Some(why) = cli::bad_host(h) {
            say(&format!("bad --host {h:?}: {why}"));
            return ExitCode::from(64);
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(&format!("cannot start the runtime: {e}"));
            return ExitCode::from(70);
        }
    };
    let code = rt.block_on(serve(cli));
    // A blocking read of stdin (when it is not a pipe) must not hold the exit.
    rt.shutdown_timeout(Duration::from_millis(200));
    code
}

async fn serve(cli: Cli) -> ExitCode {
    let hosts = match Hosts::new(&cli) {
        Ok(h) => Arc::new(h),
        Err(e) => {
            say(&e);
            return ExitCode::from(64);
        }
    };
    let owner = match &cli.owner {
        Some(o) => o.clone(),
        None => match random_hex(6) {
            Ok(h) => format!("mcp-{h}"),
            Err(e) => {
                say(&format!("no random bytes: {e}"));
                return ExitCode::from(70);
            }
        },
    };
    let token = match &cli.owner {
        Some(o) => token::LeaseToken::of_owner(o)
            .map_err(|e| format!("cannot keep the lease token of owner {o}: {e}")),
        None => token::LeaseToken::random().map_err(|e| format!("no random bytes: {e}")),
    };
    let token = match token {
        Ok(t) => t,
        Err(e) => {
            say(&e);
            return ExitCode::from(70);
        }
    };
    let keeper = Arc::new(Keeper::new(owner.clone(), cli.lease, token));
    // First, before anything can take long: the client we never outlive.
    let parent = match parent::Parent::pin() {
        Ok(p) => p,
        Err(e) => {
            say(&format!(
                "{e}: the server ends at the EOF of its stdin only"
            ));
            None
        }
    };
    let (mut term, mut int, mut hup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(t), Ok(i), Ok(h)) => (t, i, h),
        _ => {
            say("cannot handle TERM, INT and HUP");
            return ExitCode::from(70);
        }
    };
    say(&format!(
        "serving MCP on stdio: hosts {}{}, owner {owner}, lease {}",
        hosts.names().join(", "),
        if cli.any_host {
            " (and any ssh host)"
        } else {
            ""
        },
        agent_run_shared::time::duration_arg(cli.lease)
    ));
    let renewals = tokio::spawn(keeper.clone().renew_loop(hosts.clone()));
    if cli.owner.is_some() {
        reclaim_all(&hosts, &keeper);
    }
    let handler = server::Server::new(hosts.clone(), keeper.clone(), cli.progress_every);
    let session = async {
        match handler.serve(transport::Stdio::new()).await {
            Ok(service) => match service.waiting().await {
                Ok(_) => "stdin closed".to_string(),
                Err(e) => format!("the session ended: {e}"),
            },
            Err(e) => format!("the session did not start: {e}"),
        }
    };
    let why = tokio::select! {
        why = session => why,
        _ = async { match &parent { Some(p) => p.gone().await, None => std::future::pending().await } } => {
            format!("the parent {} exited", parent.as_ref().map_or(0, |p| p.pid))
        }
        _ = term.recv() => "TERM".to_string(),
        _ = int.recv() => "INT".to_string(),
        _ = hup.recv() => "HUP".to_string(),
    };
    renewals.abort();
    shutdown(&hosts, &keeper, &why).await;
    ExitCode::SUCCESS
}

/// Take back, on every host, the runs a predecessor with this owner left running.
fn reclaim_all(hosts: &Hosts, keeper: &Arc<Keeper>) {
    for host in hosts.all() {
        let k = keeper.clone();
        tokio::spawn(async move {
            match k.reclaim(&host).await {
                Ok(0) => {}
                Ok(n) => say(&format!(
                    "took back {n} run(s) of owner {} on {}",
                    k.owner, host.name
                )),
                Err(e) => say(&format!(
                    "cannot look for the runs of owner {} on {}: {e}",
                    k.owner, host.name
                )),
            }
        });
    }
}

/// Cancel the tied runs (at most [`SHUTDOWN_WAIT`]), then stop every ssh this server started.
async fn shutdown(hosts: &Hosts, keeper: &Keeper, why: &str) {
    let owned: usize = keeper.snapshot().values().map(Vec::len).sum();
    say(&format!(
        "shutting down ({why}): cancelling the {owned} run(s) this server started (detached ones go on)"
    ));
    // A local cancel is a process of its own, in a group of its own: if the agent host kills us
    // before it answers, it still does its work. An ssh cancel is cut with us; once its command
    // has reached the host, the host's stop goes on without it, and a run it did not reach is
    // left to its lease.
    match tokio::time::timeout(SHUTDOWN_WAIT, keeper.cancel_all(hosts, SHUTDOWN_WAIT)).await {
        Ok(lines) => {
            for l in lines {
                say(&l);
            }
        }
        Err(_) => say("the cancels did not all answer in time; the local ones go on without us"),
    }
    // No ssh outlives the server: the masters go (and every channel over them); a channel still
    // running is killed when the runtime drops it.
    for h in hosts.all() {
        h.close().await;
    }
    hosts.remove_control_dir();
}
