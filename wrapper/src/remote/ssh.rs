//! `agent-run remote`'s use of the shared OpenSSH driver ([`agent_run_shared::ssh`]): its policy
//! only. A user is at the terminal (the master may prompt), the master persists 60 s after its
//! last channel, and keepalives and the connect timeout scale with the lease.

use agent_run_shared::ssh::{ControlDir, Link, Mode};
use std::io;
use std::sync::Arc;
use std::time::Duration;

pub use agent_run_shared::ssh::{direct, Ssh};

/// How long an orphaned master (we were SIGKILLed) outlives its last channel.
const PERSIST: Duration = Duration::from_secs(60);

/// ssh's keepalive and connect timeout, scaled to the lease: a dead link is noticed well before
/// the lease runs out. The user's `--ssh-option`s come first and win.
pub fn default_options(lease: Duration) -> Vec<String> {
    let secs = lease.as_secs();
    let alive = (secs / 10).clamp(1, 15);
    let connect = (secs / 6).clamp(2, 30);
    vec![
        "-o".into(),
        format!("ServerAliveInterval={alive}"),
        "-o".into(),
        "ServerAliveCountMax=3".into(),
        "-o".into(),
        format!("ConnectTimeout={connect}"),
    ]
}

/// The connection to `host` (nothing is started): its control directory is made here.
pub fn new(host: &str, user_options: &[String], lease: Duration) -> io::Result<Ssh> {
    let link = Link {
        host: host.to_string(),
        dir: Arc::new(ControlDir::create("agent-run-ssh")?),
        socket_name: "cm".into(),
        user_options: Arc::new(user_options.to_vec()),
        defaults: default_options(lease),
        persist: PERSIST,
        mode: Mode::Interactive,
    };
    Ok(Ssh::new(link, super::say))
}
