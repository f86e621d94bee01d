//! The ssh hosts' connections: agent-run-mcp's policy for the shared OpenSSH driver
//! ([`agent_run_shared::ssh`]), and its async wrapping.
//!
//! Nobody is there to type a passphrase (the server's stdin is the MCP stream), so every ssh
//! runs with `BatchMode=yes` ([`Mode::Unattended`]). The shared module builds the commands; here
//! they become tokio commands that are killed when dropped. Channels stay in the server's process
//! group: a signal the agent host sends to that group reaches them, and a channel the server lets
//! go of is killed, so no ssh outlives the server. The server stops its masters (which `-f` puts
//! in sessions of their own) at every exit it makes. After a SIGKILL of the server alone, a master
//! exits ControlPersist after its last channel.

use agent_run_shared::ssh::{master_pid, Link, Master, Mode, CHECK_TIMEOUT};
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Command;

pub use agent_run_shared::ssh::ControlDir;

/// How long a login may take before the host counts as unreachable.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(40);

/// Our defaults, after the user's options (which therefore win).
const DEFAULTS: [&str; 6] = [
    "-o",
    "ServerAliveInterval=10",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ConnectTimeout=15",
];

/// The private directory of this server's master sockets.
pub fn control_dir() -> io::Result<ControlDir> {
    ControlDir::create("agent-run-mcp")
}

/// The connection to one ssh host.
pub struct Conn {
    link: Link,
    master: tokio::sync::Mutex<Option<Master>>,
}

impl Conn {
    /// Prepare; nothing is started until the first channel. `index` names the host's socket.
    pub fn new(
        host: &str,
        index: usize,
        user_options: Arc<Vec<String>>,
        dir: Arc<ControlDir>,
        persist: Duration,
    ) -> Conn {
        let link = Link {
            host: host.to_string(),
            dir,
            socket_name: format!("cm{index}"),
            user_options,
            defaults: DEFAULTS.map(String::from).to_vec(),
            persist,
            mode: Mode::Unattended,
        };
        Conn {
            link,
            master: tokio::sync::Mutex::new(None),
        }
    }

    /// A channel running `script` (one string for the remote shell) over the master.
    pub fn channel(&self, script: &[u8]) -> Command {
        killed_on_drop(self.link.channel(script))
    }

    /// Make sure a master is up (start one if there is none or it died). Err(why) names the
    /// host and what ssh said.
    pub async fn ensure(&self) -> Result<(), String> {
        let mut guard = self.master.lock().await;
        if guard.as_ref().is_some_and(Master::alive) {
            return Ok(());
        }
        *guard = None;
        let master = self
            .login()
            .await
            .map_err(|why| format!("cannot connect to {}: {why}", self.link.host))?;
        *guard = Some(master);
        Ok(())
    }

    /// Start a master, and pin it.
    async fn login(&self) -> Result<Master, String> {
        let (cmd, login) = self.link.login()?;
        let mut child = killed_on_drop(cmd)
            .spawn()
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        let status = match tokio::time::timeout(LOGIN_TIMEOUT, child.wait()).await {
            Ok(status) => status.map(Some),
            Err(_) => {
                let _ = child.kill().await;
                Ok(None)
            }
        };
        login.outcome(status, Some(LOGIN_TIMEOUT))?;
        let mut check = killed_on_drop(self.link.check());
        check.stdout(Stdio::null()).stderr(Stdio::piped());
        let pid = match tokio::time::timeout(CHECK_TIMEOUT, check.output()).await {
            Ok(Ok(out)) => master_pid(out.status.code(), &out.stderr),
            _ => None,
        };
        // One master at a time per host, so no generation is needed.
        Master::pin(pid, 0)
    }

    /// Forget a master that seems broken (a channel over it failed): the next call starts a new
    /// one. The old one, if it still runs, is stopped (TERM, then KILL), on a blocking thread.
    pub async fn reset(&self) {
        let old = self.master.lock().await.take();
        if let Some(m) = old {
            if let Ok(Err(why)) = tokio::task::spawn_blocking(move || m.stop()).await {
                crate::say(&why);
            }
        }
        self.link.remove_socket();
    }

    /// Stop the master: channels over it end.
    pub async fn close(&self) {
        self.reset().await;
    }
}

/// A tokio command of what the shared module built, killed when dropped.
fn killed_on_drop(cmd: std::process::Command) -> Command {
    let mut cmd = Command::from(cmd);
    cmd.kill_on_drop(true);
    cmd
}
