//! The OpenSSH client: one private master connection, and channels over it.
//!
//! The master is started explicitly, `ssh -o ControlMaster=yes -N -f HOST`, with its socket in a
//! 0700 directory of ours. `-f` makes ssh authenticate in the foreground (passphrase and host-key
//! prompts reach the user's terminal as usual) and only then fork into the background with
//! `daemon(3)`: the master runs in its own session, so a Ctrl-C on our terminal never reaches it,
//! and its socket exists by the time `ssh -f` exits 0. We learn its pid once with `-O check` and
//! pin it with a pidfd: liveness is a `poll`, and stopping it (TERM, then KILL) cannot hit a
//! reused pid. `ControlPersist=60` makes an orphaned master (we were SIGKILLed) exit a minute
//! after its last channel closed.
//!
//! Channels (`ControlMaster=no`) are our children, each in its own process group (a terminal's
//! Ctrl-C is for us to handle, not for them), with `BatchMode=yes`: if the master is gone a
//! channel falls back to a direct connection, and that one must never wait for a prompt.
//!
//! Option order matters: ssh keeps the first value it sees for an option. Ours that must hold
//! (ControlPath, ControlMaster) come first, then the user's `--ssh-option`s, then our defaults
//! (keepalives, connect timeout), which the user's options therefore override.
//!
//! Every child is registered ([`Children`]) until it is reaped, so [`Ssh::shutdown`] can stop
//! what is left without ever signalling a pid that was reused.

use super::children::{exited, wait_timeout, Children, Reply};
use super::say;
use agent_run_shared::pid::Pid;
use agent_run_shared::sys;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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

/// `ssh [user options] [defaults] -T -- HOST SCRIPT` without a master: for one-shot commands.
pub fn direct(host: &str, options: &[String], script: &[u8]) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args(options)
        .args(["-T", "--", host])
        .arg(super::quote::os(script.to_vec()))
        .stdin(Stdio::null());
    cmd
}

/// Our private directory for the master's socket, removed on drop.
pub struct ControlDir {
    path: PathBuf,
}

impl ControlDir {
    /// A new 0700 directory under $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp. A base whose path
    /// has characters that ssh's option parser would treat specially (spaces, quotes, `%`) or
    /// that would make the socket path too long for a unix socket is skipped.
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
                let path = base.join(format!("agent-run-ssh.{}", super::random_hex(6)?));
                match fs::DirBuilder::new().mode(0o700).create(&path) {
                    Ok(()) => return ControlDir::checked(path),
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

    /// The directory we just made must be ours and private (a umask cannot widen 0700).
    fn checked(path: PathBuf) -> io::Result<ControlDir> {
        let dir = ControlDir { path };
        let meta = fs::symlink_metadata(&dir.path)?;
        if !meta.is_dir() || meta.uid() != sys::geteuid() || meta.mode() & 0o077 != 0 {
            return Err(io::Error::other(format!(
                "{} is not a private directory of ours",
                dir.path.display()
            )));
        }
        Ok(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The master: its pid (for messages), a pidfd that pins it, and which one it is (a late
/// report about an earlier master must not stop its successor).
struct Master {
    pid: i32,
    fd: OwnedFd,
    gen: u64,
}

/// The connection to one host: a master and the channels over it.
pub struct Ssh {
    pub host: String,
    user_options: Vec<String>,
    defaults: Vec<String>,
    dir: ControlDir,
    master: Mutex<Option<Master>>,
    masters: AtomicU64,
    children: Children,
}

impl Ssh {
    /// Prepare (nothing is started): the control directory is made here.
    pub fn new(host: &str, user_options: &[String], lease: Duration) -> io::Result<Ssh> {
        Ok(Ssh {
            host: host.to_string(),
            user_options: user_options.to_vec(),
            defaults: default_options(lease),
            dir: ControlDir::create()?,
            master: Mutex::new(None),
            masters: AtomicU64::new(0),
            children: Children::default(),
        })
    }

    /// The registry of our ssh processes.
    pub fn children(&self) -> &Children {
        &self.children
    }

    /// The control socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("cm")
    }

    fn base(&self, master: bool) -> Command {
        let mut cmd = Command::new("ssh");
        let mut path = OsString::from("ControlPath=");
        path.push(self.socket());
        cmd.arg("-o").arg(path);
        if master {
            cmd.args(["-o", "ControlMaster=yes", "-o", "ControlPersist=60"]);
        } else {
            cmd.args(["-o", "ControlMaster=no"]);
        }
        cmd.args(&self.user_options).args(&self.defaults);
        if !master {
            cmd.args(["-o", "BatchMode=yes"]);
            cmd.process_group(0);
        }
        cmd.arg("-T").stdin(Stdio::null());
        cmd
    }

    /// A channel running `script` (one string for the remote shell) over the master.
    pub fn channel(&self, script: &[u8]) -> Command {
        let mut cmd = self.base(false);
        cmd.args(["--", &self.host])
            .arg(super::quote::os(script.to_vec()));
        cmd
    }

    /// Start the master (replacing a dead one). `timeout` bounds the whole login (None: the
    /// user may be typing a passphrase). Ok(ssh's messages) or Err(why).
    pub fn connect(&self, timeout: Option<Duration>) -> Result<String, String> {
        self.drop_master();
        let errors = self.dir.path().join("connect.err");
        let err_file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&errors)
            .map_err(|e| format!("{}: {e}", errors.display()))?;
        let mut cmd = self.base(true);
        cmd.args(["-N", "-f", "--", &self.host])
            .stdout(Stdio::null())
            .stderr(err_file);
        let mut child = self
            .children
            .spawn(&mut cmd)
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        let status = wait_timeout(&mut child, timeout);
        self.children.reaped(&child);
        let said = fs::read_to_string(&errors).unwrap_or_default();
        let said = said.trim().to_string();
        match status {
            Ok(Some(st)) if st.success() => {}
            Ok(Some(st)) => {
                let code = st.code().map_or("a signal".to_string(), |c| c.to_string());
                return Err(if said.is_empty() {
                    format!("ssh exited {code}")
                } else {
                    said.replace('\n', "; ")
                });
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no login within {:?}", timeout.unwrap_or_default()));
            }
            Err(e) => return Err(format!("cannot wait for ssh: {e}")),
        }
        let pid = self
            .check()
            .ok_or("the master connection did not come up (ssh -O check failed)")?;
        let fd = Pid::new(pid.into())
            .ok_or(io::Error::from(io::ErrorKind::InvalidData))
            .and_then(sys::pidfd_open)
            .map_err(|e| format!("cannot pin the master ssh {pid}: {e}"))?;
        let gen = self.masters.fetch_add(1, Ordering::SeqCst) + 1;
        *self.master.lock().unwrap() = Some(Master { pid, fd, gen });
        Ok(said)
    }

    /// `ssh -O check`: the master's pid.
    fn check(&self) -> Option<i32> {
        let mut cmd = self.base(false);
        cmd.args(["-O", "check", "--", &self.host]);
        let reply = self
            .children
            .capture(cmd, None, Some(Duration::from_secs(10)));
        let text = String::from_utf8_lossy(&reply.stderr);
        let pid = text.split("pid=").nth(1)?;
        let digits: String = pid.chars().take_while(char::is_ascii_digit).collect();
        (reply.code == Some(0))
            .then(|| digits.parse().ok())
            .flatten()
    }

    /// Whether the master we started is still running.
    pub fn master_alive(&self) -> bool {
        match &*self.master.lock().unwrap() {
            Some(m) => !exited(&m.fd, Duration::ZERO),
            None => false,
        }
    }

    /// Whether the master is gone, or goes within `t`: a channel over a master that lost its
    /// link may end (255) a moment before the master itself exits.
    pub fn master_gone_within(&self, t: Duration) -> bool {
        let fd = match &*self.master.lock().unwrap() {
            Some(m) => m.fd.try_clone(),
            None => return true,
        };
        fd.is_ok_and(|fd| exited(&fd, t))
    }

    /// Which master is current (0: none yet).
    pub fn generation(&self) -> u64 {
        self.master.lock().unwrap().as_ref().map_or(0, |m| m.gen)
    }

    /// [`Ssh::drop_master`], if the current master is still generation `gen`.
    pub fn drop_master_if(&self, gen: u64) {
        if self.generation() == gen {
            self.drop_master();
        }
    }

    /// Stop the master (TERM, KILL after 500 ms) and remove its socket: every channel over it
    /// ends with 255. A master that is merely hung on a dead link goes too.
    pub fn drop_master(&self) {
        let master = self.master.lock().unwrap().take();
        if let Some(m) = master {
            for sig in [libc::SIGTERM, libc::SIGKILL] {
                if exited(&m.fd, Duration::ZERO) {
                    break;
                }
                if let Err(e) = sys::pidfd_send_signal(m.fd.as_fd(), sig, false) {
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        say(&format!("cannot stop the master ssh {}: {e}", m.pid));
                    }
                    break;
                }
                if exited(&m.fd, Duration::from_millis(500)) {
                    break;
                }
            }
        }
        // A stale socket would make the next master refuse to listen ("already exists").
        let _ = fs::remove_file(self.socket());
    }

    /// Run `script` over the master, capturing its output, for at most `timeout`.
    pub fn run(&self, script: &[u8], timeout: Option<Duration>) -> Reply {
        self.children.capture(self.channel(script), None, timeout)
    }

    /// [`Ssh::run`] with `input` on the channel's stdin (a lease token: never on a command
    /// line, which every user of either host can read in /proc).
    pub fn run_with_input(&self, script: &[u8], input: &[u8], timeout: Option<Duration>) -> Reply {
        self.children
            .capture(self.channel(script), Some(input.to_vec()), timeout)
    }

    /// Stop every child still running, then the master, and remove our directory (threads
    /// may still hold this value when the process exits, so this cannot wait for drop).
    pub fn shutdown(&self) {
        self.children.stop_all();
        self.drop_master();
        let _ = fs::remove_dir_all(self.dir.path());
    }
}

impl Drop for Ssh {
    fn drop(&mut self) {
        self.shutdown();
    }
}
