//! The OpenSSH client: one private master connection per host, and channels over it. Both
//! `agent-run remote` and `agent-run-mcp` drive ssh through this module; each binary keeps only
//! its policy (option defaults, timeouts, how it reports).
//!
//! The master is started explicitly, `ssh -o ControlMaster=yes -N -f HOST`, with its socket in a
//! 0700 directory of ours ([`ControlDir`]). `-f` makes ssh authenticate in the foreground and
//! only then fork into the background with `daemon(3)`: the master runs in its own session, so a
//! Ctrl-C on a terminal never reaches it, and its socket exists by the time `ssh -f` exits 0. We
//! learn its pid once with `-O check` and pin it with a pidfd ([`Master`]): liveness is a `poll`,
//! and stopping it (TERM, then KILL) cannot hit a reused pid. `ControlPersist` makes an orphaned
//! master (we were SIGKILLed) exit that long after its last channel closed.
//!
//! Channels (`ControlMaster=no`) carry `BatchMode=yes`: if the master is gone a channel falls back
//! to a direct connection, and that one must never wait for a prompt. [`Mode`] says who may type:
//! a user at a terminal (the master may prompt; channels go in process groups of their own, since
//! a Ctrl-C is for us to handle) or nobody (a server: `BatchMode=yes` on every ssh, and every ssh
//! stays in our process group, so a signal to that group reaches them all).
//!
//! Option order matters: ssh keeps the first value it sees for an option. Ours that must hold
//! (ControlPath, ControlMaster, a server's BatchMode) come first, then the user's options, then
//! the binary's defaults (keepalives, connect timeout), which the user's options override.
//!
//! This module builds `std::process::Command`s; [`Ssh`] drives them synchronously (no async
//! runtime in the host binaries). agent-run-mcp turns the same commands into tokio ones.

mod children;
mod connection;
mod control_dir;
mod master;

pub use children::{exited, feed, wait_timeout, Children, Reply};
pub use connection::Ssh;
pub use control_dir::ControlDir;
pub use master::{Login, Master};

use crate::pid::Pid;
use crate::quote;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// How long `ssh -O check` may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is there to answer ssh's prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A user at a terminal: the master may prompt (passphrase, host key); channels run with
    /// `BatchMode=yes` after the user's options, each in a process group of its own.
    Interactive,
    /// Nobody (a server whose stdin is a protocol stream): `BatchMode=yes` on every ssh, before
    /// the user's options, and every ssh in our process group.
    Unattended,
}

/// How to reach one host: everything an ssh command line for it needs.
pub struct Link {
    /// The destination, as the user wrote it.
    pub host: String,
    /// The private directory of the control socket.
    pub dir: Arc<ControlDir>,
    /// The socket's name in `dir`.
    pub socket_name: String,
    /// The user's `-o` options (they win over `defaults`).
    pub user_options: Arc<Vec<String>>,
    /// The binary's defaults: keepalives, connect timeout.
    pub defaults: Vec<String>,
    /// The master's ControlPersist (at least a second).
    pub persist: Duration,
    pub mode: Mode,
}

impl Link {
    /// The control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join(&self.socket_name)
    }

    /// `ssh OPTIONS -T`, for the master or for a channel (see the module doc for the order).
    fn command(&self, master: bool) -> Command {
        let mut cmd = Command::new("ssh");
        let mut path = OsString::from("ControlPath=");
        path.push(self.socket());
        cmd.arg("-o").arg(path);
        if master {
            cmd.args(["-o", "ControlMaster=yes", "-o"])
                .arg(format!("ControlPersist={}", self.persist.as_secs().max(1)));
        } else {
            cmd.args(["-o", "ControlMaster=no"]);
        }
        if self.mode == Mode::Unattended {
            cmd.args(["-o", "BatchMode=yes"]);
        }
        cmd.args(self.user_options.iter()).args(&self.defaults);
        if self.mode == Mode::Interactive && !master {
            cmd.args(["-o", "BatchMode=yes"]);
            cmd.process_group(0);
        }
        cmd.arg("-T").stdin(Stdio::null());
        cmd
    }

    /// A channel running `script` (one string for the remote shell) over the master.
    pub fn channel(&self, script: &[u8]) -> Command {
        let mut cmd = self.command(false);
        cmd.args(["--", &self.host]).arg(quote::os(script.to_vec()));
        cmd
    }

    /// `ssh -O check`: its stderr names the master's pid ([`master_pid`]).
    pub fn check(&self) -> Command {
        let mut cmd = self.command(false);
        cmd.args(["-O", "check", "--", &self.host]);
        cmd
    }

    /// Get ready to start a master: remove a stale socket (the new master would refuse to
    /// listen), and open the file that gets ssh's messages. The master's command writes its
    /// stderr there, never to a pipe: it forks into the background and keeps stderr open, and
    /// nobody would wait on that pipe for ever.
    pub fn login(&self) -> Result<(Command, Login), String> {
        self.remove_socket();
        let errors = self.socket().with_extension("err");
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&errors)
            .map_err(|e| format!("cannot create {}: {e}", errors.display()))?;
        let mut cmd = self.command(true);
        cmd.args(["-N", "-f", "--", &self.host])
            .stdout(Stdio::null())
            .stderr(file);
        Ok((cmd, Login::new(errors)))
    }

    /// Remove the control socket (once its master is stopped).
    pub fn remove_socket(&self) {
        let _ = fs::remove_file(self.socket());
    }
}

/// The master's pid in what `ssh -O check` said (`Master running (pid=N)`), if it exited 0.
pub fn master_pid(code: Option<i32>, stderr: &[u8]) -> Option<Pid> {
    let text = String::from_utf8_lossy(stderr);
    let digits: String = text
        .split("pid=")
        .nth(1)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (code == Some(0))
        .then(|| Pid::new(digits.parse().ok()?))
        .flatten()
}

/// `ssh [options] -T -- HOST SCRIPT` without a master: for one-shot commands.
pub fn direct(host: &str, options: &[String], script: &[u8]) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args(options)
        .args(["-T", "--", host])
        .arg(quote::os(script.to_vec()))
        .stdin(Stdio::null());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(mode: Mode) -> Link {
        Link {
            host: "h".into(),
            dir: Arc::new(ControlDir::create("agent-run-test").unwrap()),
            socket_name: "cm".into(),
            user_options: Arc::new(vec!["-o".into(), "BatchMode=no".into()]),
            defaults: vec!["-o".into(), "ConnectTimeout=5".into()],
            persist: Duration::from_secs(60),
            mode,
        }
    }

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Where a channel's arguments hold our `BatchMode=yes` and the user's `BatchMode=no`.
    fn channel_batch_modes(l: &Link) -> (usize, usize) {
        let a = args(&l.channel(b"true"));
        let at = |opt: &str| a.iter().position(|x| x == opt);
        match (at("BatchMode=yes"), at("BatchMode=no")) {
            (Some(ours), Some(theirs)) => (ours, theirs),
            _ => panic!("a channel without both BatchMode options: {a:?}"),
        }
    }

    #[test]
    fn a_servers_batch_mode_comes_before_the_users_options() {
        let l = link(Mode::Unattended);
        let (ours, theirs) = channel_batch_modes(&l);
        assert!(ours < theirs);
        assert!(args(&l.login().unwrap().0).contains(&"BatchMode=yes".to_string()));
    }

    #[test]
    fn an_interactive_master_may_prompt_and_its_channels_may_not() {
        let l = link(Mode::Interactive);
        let (ours, theirs) = channel_batch_modes(&l);
        assert!(theirs < ours);
        let m = args(&l.login().unwrap().0);
        assert!(!m.contains(&"BatchMode=yes".to_string()), "{m:?}");
        assert!(m.contains(&"ControlPersist=60".to_string()), "{m:?}");
        assert_eq!(&m[m.len() - 4..], ["-N", "-f", "--", "h"]);
    }

    #[test]
    fn the_master_pid_is_read_from_a_successful_check_only() {
        let said = b"Master running (pid=4242)\r\n";
        assert_eq!(master_pid(Some(0), said).map(Pid::get), Some(4242));
        assert_eq!(master_pid(Some(255), said), None);
        assert_eq!(master_pid(Some(0), b"Control socket connect: gone"), None);
        assert_eq!(master_pid(Some(0), b"pid=0"), None);
    }
}
