//! The OpenSSH client: one private master connection per host, and channels over it.
//!
//! The same approach as `agent-run remote` (wrapper/src/remote/ssh.rs), in async form: the master
//! is `ssh -o ControlMaster=yes -o ControlPersist=N -N -f HOST`, its socket in a 0700 directory of
//! ours. `-f` returns once the login is done and leaves the master in the background, in its own
//! session; we learn its pid with `-O check` and pin it with a pidfd, so liveness is a poll and
//! stopping it cannot hit a reused pid. ControlPersist makes a master whose server was killed exit
//! N after its last channel closed.
//!
//! Every ssh runs with `BatchMode=yes` and stdin from /dev/null: the server's stdin is the MCP
//! stream, and nobody is there to type a passphrase. Channels are in the server's process group
//! and are killed when the server lets go of them, so no ssh outlives the server: a signal the
//! agent host sends to the server's group reaches them, and the server stops its masters (which
//! `-f` puts in sessions of their own) at every exit it makes. After a SIGKILL of the server
//! alone, a master exits ControlPersist after its last channel.
//!
//! Option order matters: ssh keeps the first value it sees. Ours that must hold come first, then
//! the user's `--ssh-option`s, then our defaults (keepalive, connect timeout).

use agent_run_shared::pid::Pid;
use agent_run_shared::sys;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Command;

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

/// The private directory of this server's master sockets, removed at shutdown.
pub struct ControlDir {
    path: PathBuf,
}

impl ControlDir {
    /// A new 0700 directory under $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp. A base whose path
    /// ssh would parse specially (spaces, `%`) or that would make a socket path too long is
    /// skipped.
    pub fn create() -> io::Result<ControlDir> {
        let bases = [
            std::env::var_os("XDG_RUNTIME_DIR"),
            std::env::var_os("TMPDIR"),
        ]
        .into_iter()
        .flatten()
        .map(PathBuf::from)
        .chain([PathBuf::from("/tmp")]);
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no usable temporary directory");
        for base in bases {
            let plain = base.to_str().is_some_and(|s| {
                s.starts_with('/')
                    && s.len() < 60
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
            });
            if !plain {
                continue;
            }
            for _ in 0..5 {
                let path = base.join(format!("agent-run-mcp.{}", crate::random_hex(6)?));
                match fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => {
                        let meta = fs::symlink_metadata(&path)?;
                        if !meta.is_dir()
                            || meta.uid() != sys::geteuid()
                            || meta.mode() & 0o077 != 0
                        {
                            return Err(io::Error::other(format!(
                                "{} is not a private directory of ours",
                                path.display()
                            )));
                        }
                        return Ok(ControlDir { path });
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        last = e;
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove the directory and what is left in it.
    pub fn remove(&self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A master we started: its pid (for messages) and a pidfd that pins it.
struct Master {
    pid: i32,
    fd: OwnedFd,
}

impl Master {
    fn alive(&self) -> bool {
        let mut fds = [sys::PollFd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // A pidfd becomes readable when the process exits.
        !matches!(sys::poll(&mut fds, Some(Duration::ZERO)), Ok(n) if n > 0)
    }
}

/// The connection to one ssh host.
pub struct Conn {
    host: String,
    user_options: Arc<Vec<String>>,
    dir: Arc<ControlDir>,
    socket: PathBuf,
    persist: Duration,
    master: tokio::sync::Mutex<Option<Master>>,
}

impl Conn {
    /// Prepare; nothing is started until the first channel.
    pub fn new(
        host: &str,
        index: usize,
        user_options: Arc<Vec<String>>,
        dir: Arc<ControlDir>,
        persist: Duration,
    ) -> Conn {
        let socket = dir.path().join(format!("cm{index}"));
        Conn {
            host: host.to_string(),
            user_options,
            dir,
            socket,
            persist,
            master: tokio::sync::Mutex::new(None),
        }
    }

    fn base(&self, master: bool) -> Command {
        let mut cmd = Command::new("ssh");
        let mut path = OsString::from("ControlPath=");
        path.push(&self.socket);
        cmd.arg("-o").arg(path);
        if master {
            cmd.args(["-o", "ControlMaster=yes", "-o"])
                .arg(format!("ControlPersist={}", self.persist.as_secs().max(1)));
        } else {
            cmd.args(["-o", "ControlMaster=no"]);
        }
        cmd.args(["-o", "BatchMode=yes"])
            .args(self.user_options.iter())
            .args(DEFAULTS)
            .arg("-T")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// A channel running `script` (one string for the remote shell) over the master.
    pub fn channel(&self, script: &[u8]) -> Command {
        let mut cmd = self.base(false);
        cmd.args(["--", &self.host])
            .arg(agent_run_shared::quote::os(script.to_vec()));
        cmd
    }

    /// Make sure a master is up (start one if there is none or it died). Err(why) names the
    /// host and what ssh said.
    pub async fn ensure(&self) -> Result<(), String> {
        let mut guard = self.master.lock().await;
        if guard.as_ref().is_some_and(Master::alive) {
            return Ok(());
        }
        *guard = None;
        // A stale socket would make the new master refuse to listen.
        let _ = fs::remove_file(&self.socket);
        let errors = self.dir.path().join(format!(
            "{}.err",
            self.socket
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
        ));
        let err_file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&errors)
            .map_err(|e| format!("cannot create {}: {e}", errors.display()))?;
        let mut cmd = self.base(true);
        // The master forks into the background and keeps stderr: it goes to a file, never to a
        // pipe we would wait on for ever.
        cmd.args(["-N", "-f", "--", &self.host])
            .stdout(Stdio::null())
            .stderr(Stdio::from(err_file));
        let mut child = cmd.spawn().map_err(|e| format!("cannot run ssh: {e}"))?;
        let status = tokio::time::timeout(LOGIN_TIMEOUT, child.wait()).await;
        let said = fs::read_to_string(&errors).unwrap_or_default();
        let _ = fs::remove_file(&errors);
        let said = said.trim().replace('\n', "; ");
        match status {
            Ok(Ok(st)) if st.success() => {}
            Ok(Ok(st)) => {
                let code = st.code().map_or("a signal".to_string(), |c| c.to_string());
                return Err(if said.is_empty() {
                    format!("cannot connect to {}: ssh exited {code}", self.host)
                } else {
                    format!("cannot connect to {}: {said}", self.host)
                });
            }
            Ok(Err(e)) => return Err(format!("cannot wait for ssh: {e}")),
            Err(_) => {
                let _ = child.kill().await;
                return Err(format!(
                    "cannot connect to {}: no login within {}s",
                    self.host,
                    LOGIN_TIMEOUT.as_secs()
                ));
            }
        }
        let pid = self.check().await.ok_or_else(|| {
            format!(
                "cannot connect to {}: the master connection did not come up (ssh -O check failed)",
                self.host
            )
        })?;
        let fd = Pid::new(pid.into())
            .ok_or(io::Error::from(io::ErrorKind::InvalidData))
            .and_then(sys::pidfd_open)
            .map_err(|e| format!("cannot pin the master ssh {pid} of {}: {e}", self.host))?;
        *guard = Some(Master { pid, fd });
        Ok(())
    }

    /// `ssh -O check`: the master's pid.
    async fn check(&self) -> Option<i32> {
        let mut cmd = self.base(false);
        cmd.args(["-O", "check", "--", &self.host])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = tokio::time::timeout(Duration::from_secs(10), cmd.output())
            .await
            .ok()?
            .ok()?;
        let text = String::from_utf8_lossy(&out.stderr);
        let digits: String = text
            .split("pid=")
            .nth(1)?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        out.status.success().then(|| digits.parse().ok()).flatten()
    }

    /// Forget a master that seems broken (a channel over it failed): the next call starts a new
    /// one. The old one, if it still runs, is stopped.
    pub async fn reset(&self) {
        let old = self.master.lock().await.take();
        if let Some(m) = old {
            stop_master(&m).await;
        }
        let _ = fs::remove_file(&self.socket);
    }

    /// Stop the master (TERM, then KILL): channels over it end.
    pub async fn close(&self) {
        self.reset().await;
    }
}

async fn stop_master(m: &Master) {
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        if !m.alive() {
            return;
        }
        if let Err(e) = sys::pidfd_send_signal(m.fd.as_fd(), sig, false) {
            if e.raw_os_error() != Some(libc::ESRCH) {
                crate::say(&format!("cannot stop the master ssh {}: {e}", m.pid));
            }
            return;
        }
        if exited(&m.fd, Duration::from_millis(500)).await {
            return;
        }
    }
}

/// Whether the process behind `pidfd` exits within `t` (a pidfd is readable once it has): a
/// poll on a blocking thread, so the runtime goes on meanwhile.
pub async fn exited(pidfd: &OwnedFd, t: Duration) -> bool {
    let Ok(fd) = pidfd.try_clone() else {
        return false;
    };
    tokio::task::spawn_blocking(move || {
        let mut fds = [sys::PollFd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        matches!(sys::poll(&mut fds, Some(t)), Ok(n) if n > 0)
    })
    .await
    .unwrap_or(false)
}
