//! `start --detach`: a wrapper of our own in its own session; the caller gets one line (one JSON
//! line with `--json`).

use super::relaunch::same_command;
use super::*;

/// The variable through which `start --detach` hands the `-e` pairs to its detached wrapper
/// (never on a command line: /proc/PID/cmdline is world readable). Removed from the workload's
/// environment.
pub const ENV_PASSED: &str = "AGENT_RUN_PASSED_ENV";

/// `-e` pairs as one environment value: each `NAME=VALUE` in hex, comma-separated.
pub fn encode_env(pairs: &[(OsString, OsString)]) -> String {
    use std::os::unix::ffi::OsStrExt;
    pairs
        .iter()
        .map(|(k, v)| {
            let mut b = k.as_bytes().to_vec();
            b.push(b'=');
            b.extend_from_slice(v.as_bytes());
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The pairs [`encode_env`] wrote, validated as `-e` validates them.
pub(super) fn decode_env(s: &std::ffi::OsStr) -> anyhow::Result<Vec<(OsString, OsString)>> {
    use std::os::unix::ffi::OsStringExt;
    let bad = || anyhow::anyhow!("the environment passed to the detached wrapper is damaged");
    let s = s.to_str().ok_or_else(bad)?;
    let mut out = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        if item.len() % 2 != 0 {
            return Err(bad());
        }
        let bytes = (0..item.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&item[i..i + 2], 16).map_err(|_| bad()))
            .collect::<anyhow::Result<Vec<u8>>>()?;
        out.push(agent_run_shared::spec::parse_env(&OsString::from_vec(
            bytes,
        ))?);
    }
    Ok(out)
}

/// A duration as the command line parses it, without rounding (`1.5ms`, `90000ms`).
pub fn duration_arg(d: Duration) -> String {
    format!("{}ms", d.as_secs_f64() * 1000.0)
}

/// `start --detach`: start a wrapper of our own in its own session with stdio on /dev/null, and
/// return once its record says `running` (or the run is already final), printing on stdout
/// `started ID (pid N); agent-run attach ID to follow` and, when this start made the run's lease
/// token, a line that says it ([`said`]); with `--json`, one JSON line
/// `{"run_id","run_dir","pid","pgid","state","lease_token"}` and nothing else there.
///
/// The same for a run id that exists (a relaunch, which never runs the command twice and never
/// attaches): the line with the run's current state; the exit code is the run's own when it is
/// final (as `wait` would give), else 0. A different command is refused (65). A launch failure
/// also prints its error on stderr.
pub fn detach_parent(
    root: &Root,
    id: &RunId,
    argv: &[OsString],
    args: &StartArgs,
    token: Option<&Token>,
) -> anyhow::Result<u8> {
    let path = root.run_dir_path(id);
    // An existing run needs no wrapper of ours (it would only find the id taken).
    let mut dir = None;
    let mut child = match root.open_run_dir(id) {
        Ok(d) => {
            dir = Some(d);
            None
        }
        Err(Error::Missing { .. }) => Some(spawn_detached(root, id, args, token)?),
        Err(e) => return Err(e.into()),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The detached wrapper makes the dir: held from the first look that finds it.
        if dir.is_none() {
            dir = root.open_run_dir(id).ok();
        }
        let read = || dir.as_ref().and_then(|d| d.read_status().ok());
        let st: Option<Status> = read();
        if let Some(st) = st.filter(|s| s.state != State::Starting) {
            // The id may be an earlier run's (a relaunch, or a launch that raced ours).
            same_command(id, &st, argv)?;
            let ours = child.as_ref().is_some_and(|c| {
                st.wrapper_pid.and_then(ClaimedPid::pid) == Pid::new(c.id().into())
            });
            // The token goes to the one who started the run, never to a relaunch's caller.
            let token = token.filter(|_| ours);
            if args.json {
                let line = json!({
                    "run_id": st.run_id, "run_dir": path, "pid": st.pid, "pgid": st.pgid,
                    "state": st.state.as_str(), "lease_token": token.map(|t| t.token.expose()),
                });
                println!("{line}");
            } else {
                print!("{}", said(&st, ours, token.filter(|t| t.handed_out)));
            }
            if st.state.is_final() {
                if let (true, Some(e)) = (ours, &st.error) {
                    eprintln!("agent-run: {e}");
                }
                return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
            }
            return Ok(exit::OK);
        }
        if let Some(status) = child.as_mut().map(|c| c.try_wait()).transpose()?.flatten() {
            if read().is_some() {
                // It found the id taken by a launch racing ours: that launch's record decides.
                child = None;
                continue;
            }
            // It ended before the run was running: refused input or a setup failure.
            return fail(
                status.code().map_or(exit::SOFTWARE, |c| c as u8),
                format!("the detached wrapper for run {id} exited before the run started"),
            );
        }
        if Instant::now() >= deadline {
            return fail(exit::TEMPFAIL, format!("run {id} did not start within 30s"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What `start -d` says for people: `started ID (pid N); agent-run attach ID to follow` for the
/// run it started, `run ID is already STATE (pid N); ...` for one that was there, the final line
/// for a run that is over; then the lease token it made (the caller's only copy), if any.
fn said(st: &Status, ours: bool, token: Option<&Token>) -> String {
    let id = human::printable(&st.run_id);
    let pid = st.pid.map_or("?".to_string(), |p| p.to_string());
    let mut out = if st.state.is_final() {
        human::final_line(st, human::colour_for(human::stdout_is_terminal()))
    } else if ours {
        format!("started {id} (pid {pid}); agent-run attach {id} to follow")
    } else {
        format!(
            "run {id} is already {} (pid {pid}); agent-run attach {id} to follow",
            st.state.as_str()
        )
    };
    out.push('\n');
    if let Some(t) = token {
        let t = t.token.expose();
        out.push_str(&format!(
            "lease token: {t} (renew: AGENT_RUN_LEASE_TOKEN={t} agent-run renew {id})\n"
        ));
    }
    out
}

/// The wrapper of a detached run: this program, in its own session, stdio on /dev/null.
pub(super) fn spawn_detached(
    root: &Root,
    id: &RunId,
    args: &StartArgs,
    token: Option<&Token>,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--root")
        .arg(root.path())
        .arg("start")
        .arg("--quiet")
        .arg("--detached-child")
        .arg("--grace")
        .arg(duration_arg(args.grace))
        .arg("--hup-after")
        .arg(duration_arg(args.hup_after));
    if let Some(l) = args.lease {
        cmd.arg("--lease").arg(duration_arg(l));
    }
    if let Some(t) = args.timeout {
        cmd.arg("--timeout").arg(duration_arg(t));
    }
    // `--opt=value`, one word: a value that begins with '-' is still a value.
    if let Some(c) = &args.cwd {
        let mut word = std::ffi::OsString::from("--cwd=");
        word.push(c);
        cmd.arg(word);
    }
    if let Some(c) = &args.cgroup {
        cmd.arg("--cgroup").arg(c);
    }
    if let Some(m) = args.max_output {
        cmd.arg("--max-output")
            .arg(m.0.map_or("none".to_string(), |b| b.to_string()));
    }
    cmd.arg("--on-output-limit").arg(&args.on_output_limit);
    for (k, v) in &args.labels {
        cmd.arg(format!("--label={k}={v}"));
    }
    if args.pty {
        // The detached wrapper has no terminal: the size is the caller's, taken now.
        let size = args
            .pty_size
            .or_else(pty::caller_size)
            .unwrap_or(pty::DEFAULT_SIZE);
        cmd.arg("--pty").arg("--pty-size").arg(size.to_string());
    }
    // The values of -e may be secrets: never on a command line (/proc/PID/cmdline is world
    // readable), but in the environment of our own detached wrapper, which passes them on.
    // The lease token likewise: in the environment of our detached wrapper, which drops it
    // from the workload's.
    match token {
        Some(t) => cmd.env(ENV_TOKEN, t.token.expose()),
        None => cmd.env_remove(ENV_TOKEN),
    };
    if args.env.is_empty() {
        cmd.env_remove(ENV_PASSED);
    } else {
        let passed = encode_env(&args.env);
        cmd.env(ENV_PASSED, passed);
    }
    cmd.arg(id.as_str()).arg("--").args(&args.command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    sys::spawn_in_new_session(&mut cmd);
    Ok(cmd.spawn()?)
}
