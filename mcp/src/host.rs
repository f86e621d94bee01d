//! The hosts the tools act on: "local" (agent-run run directly, no shell, no ssh) and ssh hosts
//! (agent-run through the remote shell, over a private master connection).
//!
//! Everything the server asks a host is an agent-run command (`start -d`, `status --json`,
//! `renew`, `cancel`, `wait`, `list --json`, `version --json`) or a short script around them
//! ([`crate::probe`]). Every child is bounded in time and in the bytes read from it; nothing is
//! kept here that the host does not keep.

use crate::ssh::Conn;
use crate::token::{self, LeaseToken};
use agent_run_shared::quote;
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// The most we read from one child's stdout (a `list --json` of many runs fits easily).
const OUTPUT_CAP: usize = 32 << 20;
/// The most we keep of one child's stderr.
const ERROR_CAP: usize = 64 << 10;
/// How many channels may be open to one ssh host at once (sshd's MaxSessions is 10 by default).
const SSH_CHANNELS: usize = 8;
/// How many agent-run processes may run here at once for the tools.
const LOCAL_CHILDREN: usize = 32;

/// What a child said.
#[derive(Debug)]
pub struct Reply {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Reply {
    /// stderr as one line for a message (agent-run's own prefix dropped: we add ours).
    pub fn stderr_text(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.trim().trim_start_matches("agent-run: "))
            .filter(|l| !l.is_empty())
            .collect();
        let mut s = lines.join("; ");
        if s.len() > 2000 {
            let mut cut = 2000;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push('…');
        }
        s
    }

    /// The remote (or local) shell could not run agent-run: 127 not found, 126 not executable,
    /// with nothing on stdout (a launch failure of the workload prints its JSON line).
    pub fn bin_missing(&self) -> bool {
        matches!(self.code, Some(126 | 127)) && self.stdout.iter().all(u8::is_ascii_whitespace)
    }
}

/// How a call of agent-run reaches the host, beyond its words.
#[derive(Clone, Copy)]
pub enum Call<'a> {
    /// A call that ends when we stop waiting for it.
    Plain,
    /// With the lease token in agent-run's environment (`start`, `renew`), never on a command
    /// line: here in the child's environment; over ssh on the channel's stdin, which the remote
    /// shell reads into the variable before it execs agent-run.
    Leased(&'a LeaseToken),
    /// A call that must reach the host even if we stop waiting for it (the cancels of a
    /// shutdown): here, the child is not killed when its future is dropped, and is in a process
    /// group of its own. Over ssh it is killed like any channel (no ssh outlives the server);
    /// the host's stop goes on once the command has reached it.
    Lasting,
}

enum Kind {
    Local,
    Ssh(Conn),
}

/// One host.
pub struct Host {
    pub name: String,
    kind: Kind,
    bin: OsString,
    root: Option<OsString>,
    features: tokio::sync::OnceCell<Vec<String>>,
    slots: tokio::sync::Semaphore,
}

impl Host {
    /// This machine: `bin` is run directly.
    pub fn local(bin: PathBuf, root: Option<PathBuf>) -> Host {
        Host {
            name: crate::cli::LOCAL.to_string(),
            kind: Kind::Local,
            bin: bin.into_os_string(),
            root: root.map(PathBuf::into_os_string),
            features: tokio::sync::OnceCell::new(),
            slots: tokio::sync::Semaphore::new(LOCAL_CHILDREN),
        }
    }

    /// An ssh host: `bin` is looked up by the remote shell.
    pub fn ssh(name: &str, conn: Conn, bin: &str, root: Option<&str>) -> Host {
        Host {
            name: name.to_string(),
            kind: Kind::Ssh(conn),
            bin: bin.into(),
            root: root.map(OsString::from),
            features: tokio::sync::OnceCell::new(),
            slots: tokio::sync::Semaphore::new(SSH_CHANNELS),
        }
    }

    /// `BIN [--root DIR] WORDS...`.
    fn argv<S: AsRef<OsStr>>(&self, words: &[S]) -> Vec<OsString> {
        let mut all = vec![self.bin.clone()];
        if let Some(root) = &self.root {
            let mut opt = OsString::from("--root=");
            opt.push(root);
            all.push(opt);
        }
        all.extend(words.iter().map(|w| w.as_ref().to_owned()));
        all
    }

    /// `BIN [--root DIR] WORDS...` quoted for a POSIX shell. Err if a word holds a NUL byte.
    pub fn line<S: AsRef<OsStr>>(&self, words: &[S]) -> Result<Vec<u8>, String> {
        quote::command(&self.argv(words))
            .ok_or_else(|| "an argument holds a NUL byte, which no command line can carry".into())
    }

    /// The run dir of `id` as a shell word: the root given to the server, else the rule agent-run
    /// follows on the host itself ($AGENT_RUN_ROOT, else $HOME/.agent-runs).
    pub fn run_dir_word(&self, id: &str) -> Vec<u8> {
        match &self.root {
            Some(root) => {
                let mut p = root.as_bytes().to_vec();
                p.push(b'/');
                p.extend_from_slice(id.as_bytes());
                quote::quote(OsStr::from_bytes(&p))
            }
            None => {
                let mut w = b"\"${AGENT_RUN_ROOT:-$HOME/.agent-runs}\"/".to_vec();
                w.extend(quote::quote(OsStr::new(id)));
                w
            }
        }
    }

    /// Run agent-run with `words` on the host, for at most `timeout`, as `call` says.
    pub async fn agent_run<S: AsRef<OsStr>>(
        &self,
        words: &[S],
        timeout: Duration,
        call: Call<'_>,
    ) -> Result<Reply, String> {
        let (lasting, token) = match call {
            Call::Plain => (false, None),
            Call::Leased(t) => (false, Some(t)),
            Call::Lasting => (true, None),
        };
        let reply = match &self.kind {
            Kind::Local => {
                let argv = self.argv(words);
                self.execute(timeout, lasting, None, || {
                    let mut cmd = Command::new(&argv[0]);
                    cmd.args(&argv[1..]).env_remove(token::ENV);
                    if let Some(t) = token {
                        cmd.env(token::ENV, t.as_str());
                    }
                    cmd
                })
                .await?
            }
            Kind::Ssh(conn) => {
                let mut script = Vec::new();
                if token.is_some() {
                    script.extend(
                        format!("IFS= read -r {0} || exit 70\nexport {0}\n", token::ENV).bytes(),
                    );
                }
                script.extend_from_slice(b"exec ");
                script.extend(self.line(words)?);
                let stdin = token.map(|t| format!("{}\n", t.as_str()).into_bytes());
                self.execute(timeout, lasting, stdin, || conn.channel(&script))
                    .await?
            }
        };
        if reply.bin_missing() {
            return Err(self.missing_message(&reply));
        }
        Ok(reply)
    }

    /// Run a POSIX shell script on the host (`sh -c` here, the login shell over ssh).
    pub async fn script(&self, script: &[u8], timeout: Duration) -> Result<Reply, String> {
        match &self.kind {
            Kind::Local => {
                self.execute(timeout, false, None, || {
                    let mut cmd = Command::new("sh");
                    cmd.arg("-c")
                        .arg(quote::os(script.to_vec()))
                        .env_remove(token::ENV);
                    cmd
                })
                .await
            }
            Kind::Ssh(conn) => {
                self.execute(timeout, false, None, || conn.channel(script))
                    .await
            }
        }
    }

    /// Spawn what `make` builds, read its output (capped), wait for it (bounded). Over ssh: make
    /// sure the master is up first, and if the channel fails (ssh's 255), start a new master and
    /// try once more; every call made this way is idempotent on agent-run's side (a relaunch of
    /// the same id and argv never runs the command twice; renew, cancel, status are repeatable).
    async fn execute(
        &self,
        timeout: Duration,
        lasting: bool,
        stdin: Option<Vec<u8>>,
        make: impl Fn() -> Command,
    ) -> Result<Reply, String> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| "the server is shutting down".to_string())?;
        let Kind::Ssh(conn) = &self.kind else {
            let mut cmd = make();
            cmd.stdin(Stdio::null())
                .process_group(0)
                .kill_on_drop(!lasting);
            return capture(cmd, timeout, &self.name, stdin.as_deref()).await;
        };
        let mut last = String::new();
        for attempt in 0..2 {
            conn.ensure().await?;
            let mut cmd = make();
            cmd.kill_on_drop(true);
            let reply = capture(cmd, timeout, &self.name, stdin.as_deref()).await?;
            if reply.code != Some(255) {
                return Ok(reply);
            }
            last = reply.stderr_text();
            if attempt == 0 {
                conn.reset().await;
            }
        }
        Err(format!(
            "cannot reach {} over ssh: {}",
            self.name,
            if last.is_empty() {
                "ssh exited 255"
            } else {
                &last
            }
        ))
    }

    /// What to say when the shell could not run agent-run (`code` 127 or 126).
    pub fn missing_message(&self, reply: &Reply) -> String {
        let bin = self.bin.to_string_lossy();
        let why = if reply.code == Some(126) {
            "cannot be executed there (126)"
        } else {
            "was not found there (127)"
        };
        let fix = match self.kind {
            Kind::Local => "install agent-run, or start the server with --agent-run PATH",
            Kind::Ssh(_) => {
                "install agent-run there, or start the server with --remote-bin PATH (ssh sessions \
                 often lack ~/.local/bin in PATH)"
            }
        };
        format!(
            "cannot run agent-run on {}: {bin:?} {why}: {fix}",
            self.name
        )
    }

    /// The host's agent-run features (`version --json`), asked once per server.
    pub async fn features(&self) -> Result<&[String], String> {
        let got = self
            .features
            .get_or_try_init(|| async {
                let reply = self
                    .agent_run(&["version", "--json"], Duration::from_secs(30), Call::Plain)
                    .await?;
                let doc: Option<Value> = (reply.code == Some(0))
                    .then(|| serde_json::from_slice(&reply.stdout).ok())
                    .flatten();
                match doc {
                    Some(v) => Ok(v["features"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default()),
                    None => Err(format!(
                        "the agent-run on {} has no `version --json` (exit {}: {}): upgrade it to {} or newer",
                        self.name,
                        reply.code.map_or("?".into(), |c| c.to_string()),
                        reply.stderr_text(),
                        agent_run_shared::VERSION
                    )),
                }
            })
            .await?;
        Ok(got)
    }

    /// Whether the host's agent-run has `feature` (false when it cannot say).
    pub async fn has(&self, feature: &str) -> bool {
        self.features()
            .await
            .is_ok_and(|have| have.iter().any(|h| h == feature))
    }

    /// What a subcommand whose JSON output we read takes after its name: `--json` when the
    /// host's agent-run has it (feature `json_flag`); nothing for an older one, which has no such
    /// option on `start` and `renew` and prints JSON anyway when its stdout is not a terminal.
    pub async fn json_flag(&self) -> Option<&'static str> {
        self.has("json_flag").await.then_some("--json")
    }

    /// Err naming what is missing when the host's agent-run lacks one of `needs`.
    pub async fn require(&self, needs: &[&str]) -> Result<(), String> {
        let have = self.features().await?;
        let missing: Vec<&str> = needs
            .iter()
            .copied()
            .filter(|n| !have.iter().any(|h| h == n))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the agent-run on {} is too old for this (it lacks: {}): upgrade it to {} or newer",
            self.name,
            missing.join(", "),
            agent_run_shared::VERSION
        ))
    }

    /// Stop the master connection, if any.
    pub async fn close(&self) {
        if let Kind::Ssh(conn) = &self.kind {
            conn.close().await;
        }
    }
}

/// Give a child `stdin` (when Some; else what `cmd` says), read its stdout and stderr (capped)
/// and wait for it, for at most `timeout`; a child still running then is killed, unless it was
/// made to last (kill_on_drop off).
async fn capture(
    mut cmd: Command,
    timeout: Duration,
    host: &str,
    stdin: Option<&[u8]>,
) -> Result<Reply, String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {program} for {host}: {e}"))?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A few bytes: the pipe takes them at once. The pipe closes here (EOF for the reader).
        pipe.write_all(bytes)
            .await
            .map_err(|e| format!("cannot write to {program} for {host}: {e}"))?;
    }
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(format!("cannot read the output of {program}"));
    };
    let work = async {
        let mut o = Vec::new();
        let mut e = Vec::new();
        let mut out_cap = (&mut out).take(OUTPUT_CAP as u64);
        let mut err_cap = (&mut err).take(ERROR_CAP as u64);
        let (ro, re) = tokio::join!(out_cap.read_to_end(&mut o), err_cap.read_to_end(&mut e));
        drop((out_cap, err_cap));
        drop((out, err));
        let status = child.wait().await;
        (ro.and(re).map(|_| (o, e)), status)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok((Ok((stdout, stderr)), Ok(status))) => Ok(Reply {
            code: status.code(),
            stdout,
            stderr,
        }),
        Ok((Err(e), _)) | Ok((_, Err(e))) => Err(format!("cannot read from {program}: {e}")),
        Err(_) => Err(format!(
            "no answer from {host} within {}s",
            timeout.as_secs_f64().ceil()
        )),
    }
}
