//! `agent-run remote`: the controller half. It runs a command on HOST under the host's
//! agent-run, through the system's OpenSSH client, so that users' ssh config, agents, jump hosts
//! and known_hosts just work.
//!
//! - The run is named before anything happens (128 random bits unless `--id`), and the id is the
//!   first thing printed on stderr: a caller can always come back to it.
//! - The host starts it detached with a lease (`start --detach --lease`), and the output comes
//!   from `attach` on the same channel. The host's wrapper never writes to the SSH session, so a
//!   dead link cannot block it or garble the logs, and what we receive is exactly the log bytes:
//!   the counts are the offsets to resume from ([`stream`]).
//! - While the run is active the lease is renewed every third of its length, over the master.
//! - INT, TERM or HUP asks `cancel` on a fresh channel (the first one keeps streaming), prints the
//!   final record on stderr and exits as the record says: 143 for a cancel, or the workload's
//!   own code if it finished first. A second signal gives up waiting (75).
//! - A broken stream (ssh 255, a dead master, a renew that gets no answer) is resumed: reconnect
//!   with backoff, read the record, `attach` from the offsets received. If the host stays
//!   unreachable until the lease must have run out, the outcome is reported `unknown` (75) with
//!   the run id and host: the host stops the run by its lease; we do not guess how it ended.
//!
//! `--attach ID` is the same session without the launch: a controller that comes back to its
//! run streams it from the start, renews its lease and cancels it on INT/TERM/HUP.
//!
//! The pieces: [`quote`] (argv for the remote shell), [`ssh`] (our policy for the shared OpenSSH
//! driver [`agent_run_shared::ssh`], which owns the master, the channels and our ssh processes),
//! [`stream`] (the output channel), [`session`] (the event loop), [`requests`] (renew and cancel), [`resync`] (reconnect and
//! resume), and the one-shot `--status` and `--cancel` below, which need no master.

mod probe;
mod quote;
mod session;
mod ssh;
mod stream;

use crate::cli::RemoteArgs;
use crate::error::fail;
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::lease::LeaseToken;
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::time::Duration;

/// The default TERM -> KILL grace of a run, for the cancel's wait when `--grace` is not given.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// `agent-run remote`.
pub fn remote(args: RemoteArgs) -> anyhow::Result<u8> {
    if args.host.is_empty() || args.host.starts_with('-') {
        return fail(
            exit::USAGE,
            format!(
                "bad host {:?}: it must not be empty or start with -",
                args.host
            ),
        );
    }
    // The run's lease token: ours (from AGENT_RUN_LEASE_TOKEN, to come back to a run with
    // --attach and go on renewing it), else a new one for a launch.
    let token = match LeaseToken::from_env().transpose()? {
        Some(t) => Some(t),
        None if args.command.is_empty() => None,
        None => Some(LeaseToken::generate()?),
    };
    let remote = Remote {
        bin: OsString::from(&args.remote_bin),
        root: args.remote_root.clone().map(OsString::from),
        token,
    };
    let one_shot = [&args.status, &args.cancel, &args.attach]
        .into_iter()
        .flatten()
        .next();
    if one_shot.is_some() && (!args.command.is_empty() || args.id.is_some()) {
        return fail(
            exit::USAGE,
            "--status, --cancel and --attach take a run id and no --id or command",
        );
    }
    if let Some(id) = &args.status {
        return status(&args, &remote, RunId::parse(id)?.as_str());
    }
    if let Some(id) = &args.cancel {
        return cancel(&args, &remote, RunId::parse(id)?.as_str());
    }
    if let Some(id) = &args.attach {
        let id = RunId::parse(id)?;
        return session::run(&args, &remote, id.as_str(), None);
    }
    if args.command.is_empty() {
        return fail(
            exit::USAGE,
            "missing the command: remote HOST -- COMMAND [ARGS...]",
        );
    }
    let id = match &args.id {
        Some(id) => RunId::parse(id)?.as_str().to_string(),
        None => random_hex(16)?,
    };
    say(&format!("run id {id} on {}", args.host));
    let script = launch_script(&args, &remote, &id)?;
    session::run(&args, &remote, &id, Some(script))
}

/// `out=$(BIN start --detach --lease L [--grace G] ID -- CMD...); rc=$?; [ -n "$out" ] || exit
/// "$rc"; exec BIN attach ID`: the launch's JSON line is not output of the run; a launch that
/// was refused (a bad id, another command under this id, an unsafe root) prints no line and
/// passes its own exit code on; a run that exists, even one already over (a command that fails
/// within a millisecond, a launch failure), is always attached, so its output is streamed from
/// byte 0 of both logs and the exit code is the run's, as `attach` says.
fn launch_script(args: &RemoteArgs, remote: &Remote, id: &str) -> anyhow::Result<Vec<u8>> {
    let mut start: Vec<OsString> = ["start", "--detach", "--lease"]
        .map(OsString::from)
        .to_vec();
    start.push(millis(args.lease));
    if let Some(g) = args.grace {
        start.extend([OsString::from("--grace"), millis(g)]);
    }
    if let Some(t) = args.timeout {
        start.extend([OsString::from("--timeout"), millis(t)]);
    }
    if let Some(c) = &args.cwd {
        start.extend([OsString::from("--cwd"), c.clone()]);
    }
    for (k, v) in &args.env {
        let mut pair = k.clone();
        pair.push("=");
        pair.push(v);
        start.extend([OsString::from("--env"), pair]);
    }
    for (k, v) in &args.labels {
        start.extend([
            OsString::from("--label"),
            OsString::from(format!("{k}={v}")),
        ]);
    }
    if let Some(m) = &args.max_output {
        let size = m.0.map_or_else(|| "none".to_string(), |n| n.to_string());
        start.extend([OsString::from("--max-output"), OsString::from(size)]);
    }
    if let Some(p) = &args.on_output_limit {
        start.extend([OsString::from("--on-output-limit"), OsString::from(p)]);
    }
    if args.pty {
        // The size travels as an argument, not through `ssh -tt`: a pty on the channel would
        // merge attach's stdout and stderr, turn every \n into \r\n (the byte counts would no
        // longer be the resume offsets), put our terminal in raw mode (Ctrl-C would no longer
        // reach us as INT, the cancel) and stop our ssh children, which run in a process group
        // of their own, with SIGTTOU.
        start.push(OsString::from("--pty"));
        if let Some(size) = args.pty_size.or_else(agent_run_shared::pty::caller_size) {
            start.extend([
                OsString::from("--pty-size"),
                OsString::from(size.to_string()),
            ]);
        }
    }
    start.extend([OsString::from(id), OsString::from("--")]);
    start.extend(args.command.iter().cloned());
    let mut script = READ_TOKEN.as_bytes().to_vec();
    let assign = |words: &[OsString]| -> anyhow::Result<Vec<u8>> {
        let mut a = b"out=$(".to_vec();
        a.extend(remote.line(words)?);
        a.push(b')');
        Ok(a)
    };
    script.extend(remote.json_switch(assign(&start)?, assign(&with_json(&start))?)?);
    script.extend_from_slice(
        b"; rc=$?; unset AGENT_RUN_LEASE_TOKEN; [ -n \"$out\" ] || exit \"$rc\"; ",
    );
    script.extend(remote.exec(&["attach", id])?);
    Ok(script)
}

/// How a script that needs the run's lease token begins: it reads the token from the
/// channel's stdin into the environment of the host's agent-run (never onto a command line,
/// which every user of either host can read in /proc).
pub const READ_TOKEN: &str = "IFS= read -r AGENT_RUN_LEASE_TOKEN; export AGENT_RUN_LEASE_TOKEN; ";

/// How to call agent-run on the host.
pub struct Remote {
    bin: OsString,
    root: Option<OsString>,
    /// The run's lease token, for `start` and `renew`.
    pub token: Option<LeaseToken>,
}

/// The remote shell's codes for a program it could not find (127) or execute (126). Nothing
/// agent-run runs there returns them except `attach` of a run whose own code they are, so
/// a session asks the host about the run before it believes them.
pub fn shell_cannot_run(code: Option<i32>) -> bool {
    matches!(code, Some(126 | 127))
}

/// agent-run could not be run on the host (the remote shell's 127 or 126): say so, naming the
/// program and the host, and return [`exit::REMOTE_BIN_MISSING`], never the shell's code (it
/// would read like the workload's own).
pub fn bin_missing(host: &str, bin: &OsStr, code: Option<i32>, what: &str) -> u8 {
    let why = match code {
        Some(126) => "cannot be executed there (126)",
        _ => "was not found there (127)",
    };
    say(&format!(
        "cannot run agent-run on {host}: the remote shell says {bin:?} {why}; {what}. Install \
         agent-run on {host}, or give its path with --remote-bin PATH (ssh sessions often lack \
         ~/.local/bin in PATH)",
        bin = bin.to_string_lossy(),
    ));
    exit::REMOTE_BIN_MISSING
}

/// `words` with `--json` after the subcommand (the first word).
fn with_json<S: AsRef<OsStr>>(words: &[S]) -> Vec<OsString> {
    let mut all: Vec<OsString> = words.iter().map(|w| w.as_ref().to_owned()).collect();
    all.insert(1.min(all.len()), OsString::from("--json"));
    all
}

impl Remote {
    /// `case $(BIN version --json) in (*"json_flag"*) JSON;; (*) PLAIN;; esac`: the host's
    /// agent-run prints JSON with `--json` when it has that feature; an older one has no such
    /// option on `start` and `renew`, and prints JSON anyway when its stdout is not a terminal
    /// (as a channel's is not). One short process on the host, no round trip.
    fn json_switch(&self, plain: Vec<u8>, json: Vec<u8>) -> anyhow::Result<Vec<u8>> {
        let mut s = b"case $(".to_vec();
        s.extend(self.line(&[OsString::from("version"), OsString::from("--json")])?);
        s.extend_from_slice(b" 2>/dev/null) in (*'\"json_flag\"'*) ");
        s.extend(json);
        s.extend_from_slice(b" ;; (*) ");
        s.extend(plain);
        s.extend_from_slice(b" ;; esac");
        Ok(s)
    }

    /// [`Remote::exec`] of a subcommand whose JSON output we read: with `--json` when the host's
    /// agent-run has it ([`Remote::json_switch`]).
    fn exec_json(&self, words: &[&str]) -> anyhow::Result<Vec<u8>> {
        self.json_switch(self.exec(words)?, self.exec(&with_json(words))?)
    }

    /// `BIN [--root DIR] WORDS...`, quoted for the remote shell.
    fn line(&self, words: &[OsString]) -> anyhow::Result<Vec<u8>> {
        let mut all = vec![self.bin.clone()];
        if let Some(root) = &self.root {
            all.extend([OsString::from("--root"), root.clone()]);
        }
        all.extend(words.iter().cloned());
        match quote::command(&all) {
            Some(line) => Ok(line),
            None => fail(exit::USAGE, "an argument holds a NUL byte"),
        }
    }

    /// `exec BIN [--root DIR] WORDS...`: the remote shell becomes agent-run, so a remote
    /// agent-run killed by a signal shows as ssh's 255 (unsure), never as a plausible code.
    fn exec<S: AsRef<OsStr>>(&self, words: &[S]) -> anyhow::Result<Vec<u8>> {
        let words: Vec<OsString> = words.iter().map(|w| w.as_ref().to_owned()).collect();
        let mut script = b"exec ".to_vec();
        script.extend(self.line(&words)?);
        Ok(script)
    }
}

/// `--status ID`: print the host's `status --json` and exit as the run did; 75 while the run is
/// not final (its outcome is not known yet).
fn status(args: &RemoteArgs, remote: &Remote, id: &str) -> anyhow::Result<u8> {
    let reply = one_shot(args, &remote.exec(&["status", "--json", id])?)?;
    if shell_cannot_run(reply.0) {
        let what = format!("nothing is known about run {id}");
        return Ok(bin_missing(&args.host, &remote.bin, reply.0, &what));
    }
    let Some(0) = reply.0 else {
        return Ok(remote_failure(args, id, reply.0));
    };
    std::io::stdout().write_all(&reply.1)?;
    let v: Value = serde_json::from_slice(&reply.1).unwrap_or_default();
    if let Some(code) = outcome(&v) {
        return Ok(code);
    }
    let state = v["state"].as_str().unwrap_or("not final");
    say(&format!("run {id} on {} is still {state}", args.host));
    Ok(exit::TEMPFAIL)
}

/// `--cancel ID`: the host's `cancel`, its record on stdout, its exit code (0 once final).
fn cancel(args: &RemoteArgs, remote: &Remote, id: &str) -> anyhow::Result<u8> {
    let mut words = vec!["cancel".to_string(), id.to_string()];
    if let Some(g) = args.grace {
        words.extend([
            "--wait".into(),
            format!("{}ms", (g + Duration::from_secs(10)).as_millis()),
        ]);
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let reply = one_shot(args, &remote.exec_json(&words)?)?;
    if shell_cannot_run(reply.0) {
        let what = format!("run {id} was not cancelled");
        return Ok(bin_missing(&args.host, &remote.bin, reply.0, &what));
    }
    std::io::stdout().write_all(&reply.1)?;
    match reply.0 {
        Some(c) if c != 255 => Ok(c as u8),
        code => Ok(remote_failure(args, id, code)),
    }
}

/// One command on a connection of its own (no master for a single channel); its stderr is
/// ours. (exit code, stdout).
fn one_shot(args: &RemoteArgs, script: &[u8]) -> anyhow::Result<(Option<i32>, Vec<u8>)> {
    let mut options = args.ssh_options.clone();
    options.extend(ssh::default_options(args.lease));
    let mut child = ssh::direct(&args.host, &options, script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run ssh: {e}"))?;
    let mut out = Vec::new();
    child.stdout.take().expect("piped").read_to_end(&mut out)?;
    Ok((child.wait()?.code(), out))
}

/// The exit code for a one-shot whose remote side did not answer normally.
fn remote_failure(args: &RemoteArgs, id: &str, code: Option<i32>) -> u8 {
    match code {
        Some(c) if c != 255 => c as u8,
        _ => {
            say(&format!(
                "no answer about run {id} from {} (ssh failed); its outcome is unknown here",
                args.host
            ));
            exit::TEMPFAIL
        }
    }
}

/// The exit code a record (as `status --json` prints it) maps to, if it is final.
pub fn outcome(v: &Value) -> Option<u8> {
    if v["final"].as_bool() != Some(true) {
        return None;
    }
    v["outcome_exit_code"].as_u64().map(|c| c.min(255) as u8)
}

/// A duration as agent-run parses it (not rounded: a lease of 0.4 ms is not a lease of 0).
fn millis(d: Duration) -> OsString {
    crate::launch::duration_arg(d).into()
}

/// `n` random bytes from /dev/urandom, as lowercase hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A message on stderr, in one write (so it never splits around a chunk of the run's stderr);
/// a stderr that is gone is not an error worth dying for.
pub fn say(msg: &str) {
    let line = format!("agent-run: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use std::os::unix::ffi::OsStrExt;

    fn script(extra: &[&str]) -> String {
        let mut argv = vec!["agent-run", "remote"];
        argv.extend_from_slice(extra);
        argv.extend(["host", "--", "true"]);
        let Command::Remote(crate::cli::Later(args)) = Cli::try_parse_from(argv).unwrap().command
        else {
            panic!("not remote")
        };
        let remote = Remote {
            bin: "agent-run".into(),
            root: None,
            token: None,
        };
        String::from_utf8(launch_script(&args, &remote, "id1").unwrap()).unwrap()
    }

    /// The switch, run by sh against a fake agent-run that has (or lacks) `json_flag`.
    fn switched(features: &str) -> String {
        let dir = std::env::temp_dir().join(format!("ar-switch-{}-{features}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("agent-run");
        let fake = format!(
            "#!/bin/sh\n[ \"$1\" = version ] && {{ echo '{{\"features\":[{features}]}}'; exit 0; }}\necho \"$@\"\n"
        );
        std::fs::write(&bin, fake).unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let remote = Remote {
            bin: bin.into_os_string(),
            root: None,
            token: None,
        };
        let script = remote
            .exec_json(&["cancel", "id1", "--wait", "1s"])
            .unwrap();
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(OsStr::from_bytes(&script))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn json_goes_only_to_a_host_whose_agent_run_has_json_flag() {
        assert_eq!(switched(r#""json_flag""#), "cancel --json id1 --wait 1s");
        assert_eq!(switched(r#""labels""#), "cancel id1 --wait 1s");
    }

    #[test]
    fn the_launch_reads_the_lease_token_from_stdin_and_drops_it_before_attach() {
        let s = script(&[]);
        assert!(s.starts_with(READ_TOKEN), "{s}");
        let unset = s
            .find("unset AGENT_RUN_LEASE_TOKEN")
            .expect("the token is unset");
        assert!(unset < s.find("attach").expect("attach"), "{s}");
    }

    #[test]
    fn remote_pty_passes_pty_and_the_size_to_the_hosts_start() {
        let s = script(&["--pty", "--pty-size", "100x30"]);
        assert!(
            s.contains("'--pty' '--pty-size' '100x30' 'id1' '--' 'true'"),
            "{s}"
        );
        assert!(!script(&[]).contains("--pty"));
    }

    #[test]
    fn remote_passes_the_output_cap_and_its_policy_to_the_hosts_start() {
        let s = script(&["--max-output", "2M", "--on-output-limit", "stop"]);
        assert!(
            s.contains("'--max-output' '2097152' '--on-output-limit' 'stop' 'id1'"),
            "{s}"
        );
        let s = script(&["--max-output", "none"]);
        assert!(s.contains("'--max-output' 'none' 'id1'"), "{s}");
        let s = script(&[]);
        assert!(
            !s.contains("--max-output") && !s.contains("--on-output-limit"),
            "{s}"
        );
    }
}
