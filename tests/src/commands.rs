//! Child processes a test starts: spawned, drained, waited on with a deadline.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{descendants, proc_stat, sys, TestRoot};

/// `agent-run --root <root> ARGS...` started with stdout and stderr piped. The caller must drain
/// the pipes if the run writes much (or use [`Spawned`], which does).
pub fn spawn_wrapper<S: AsRef<OsStr>>(root: &TestRoot, args: &[S]) -> Child {
    let mut cmd = root.cmd();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"))
}

/// Waits for `child` until `timeout`; Ok(None) if it is still running then.
pub(crate) fn wait_deadline(
    child: &mut Child,
    timeout: Duration,
) -> io::Result<Option<ExitStatus>> {
    use std::os::fd::AsFd;
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    // The child is not reaped until we wait for it, so its pid cannot have been reused.
    if let Ok(Some(fd)) = sys::pidfd_open(child.id() as i32) {
        let start = Instant::now();
        loop {
            let remaining = timeout.saturating_sub(start.elapsed());
            let ms = remaining.as_millis().min(i32::MAX as u128) as i32;
            if sys::poll_readable(&[fd.as_fd()], ms)?[0] {
                return child.wait().map(Some);
            }
            if remaining.is_zero() {
                return Ok(None);
            }
        }
    }
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if start.elapsed() >= timeout {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for `child` with a deadline; on timeout SIGKILLs it, reaps it and panics.
pub fn wait_child(child: &mut Child, timeout: Duration) -> ExitStatus {
    match wait_deadline(child, timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "process {} still running after {timeout:?}; killed it",
                child.id()
            )
        }
        Err(e) => panic!("cannot wait for process {}: {e}", child.id()),
    }
}

/// Sends `sig` to a child that has not been waited for (so its pid is still its own).
pub fn send_signal(child: &Child, sig: i32) {
    sys::kill(child.id() as i32, sig)
        .unwrap_or_else(|e| panic!("kill({}, {sig}): {e}", child.id()));
}

/// The exit code a shell would report: the code, or 128 + the signal that killed the process.
pub fn exit_code(st: &ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// What a drained pipe has given so far.
pub type Captured = Arc<Mutex<Vec<u8>>>;

/// Reads `pipe`, if any, to its end on a thread of its own: what it has given so far, and the
/// thread.
pub fn drain(pipe: Option<impl Read + Send + 'static>) -> (Captured, Option<JoinHandle<()>>) {
    let buf = Captured::default();
    let handle = pipe.map(|mut pipe| {
        let buf = Arc::clone(&buf);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        })
    });
    (buf, handle)
}

/// A running command whose stdout and stderr are drained by threads, so it never blocks on a
/// full pipe, with a description for failure messages.
pub struct Spawned {
    /// The process. Do not `wait` on it directly; use [`Spawned::finish`].
    pub child: Child,
    /// The command, for messages.
    pub what: String,
    stdout: (Captured, Option<JoinHandle<()>>),
    stderr: (Captured, Option<JoinHandle<()>>),
    /// Python with PYTHONFAULTHANDLER=1: on timeout, SIGABRT first (it prints its stacks).
    python_stacks: bool,
}

impl Spawned {
    /// Spawns `cmd` with stdout and stderr piped and drained.
    pub fn spawn(cmd: &mut Command) -> Spawned {
        let what = format!("{cmd:?}");
        let python_stacks = cmd
            .get_envs()
            .any(|(k, v)| k == "PYTHONFAULTHANDLER" && v.is_some_and(|v| !v.is_empty()));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {what}: {e}"));
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Spawned {
            child,
            what,
            stdout,
            stderr,
            python_stacks,
        }
    }

    /// Spawns `agent-run --root <root> ARGS...`.
    pub fn wrapper<S: AsRef<OsStr>>(root: &TestRoot, args: &[S]) -> Spawned {
        Spawned::spawn(root.cmd().args(args))
    }

    /// The stdout captured so far.
    pub fn stdout_so_far(&self) -> Vec<u8> {
        self.stdout.0.lock().unwrap().clone()
    }

    /// The stderr captured so far.
    pub fn stderr_so_far(&self) -> Vec<u8> {
        self.stderr.0.lock().unwrap().clone()
    }

    /// Sends `sig` to the process (not yet reaped, so the pid is still its own).
    pub fn signal(&self, sig: i32) {
        send_signal(&self.child, sig);
    }

    /// Waits for the process with a deadline, then for its output (a grandchild holding a pipe
    /// open gets at most one more second); on timeout SIGKILLs it and panics with its output.
    pub fn finish(mut self, timeout: Duration) -> Output {
        let status = match wait_deadline(&mut self.child, timeout) {
            Ok(Some(status)) => status,
            Ok(None) => {
                // What it and its descendants were doing, for the failure: state and wchan of
                // each; then, for Python with PYTHONFAULTHANDLER=1, SIGABRT (it prints every
                // thread's stack on stderr); then SIGKILL.
                let tree: Vec<String> = std::iter::once(self.child.id() as i32)
                    .chain(descendants(self.child.id() as i32))
                    .map(|p| {
                        let wchan =
                            fs::read_to_string(format!("/proc/{p}/wchan")).unwrap_or_default();
                        let cmd = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                        format!(
                            "{p} {:?} wchan {wchan}: {}",
                            proc_stat(p),
                            cmd.chars().take(160).collect::<String>()
                        )
                    })
                    .collect();
                if self.python_stacks {
                    let _ = sys::kill(self.child.id() as i32, libc::SIGABRT);
                }
                if !self.python_stacks
                    || !matches!(
                        wait_deadline(&mut self.child, Duration::from_secs(3)),
                        Ok(Some(_))
                    )
                {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                }
                // The stack reaches the drain thread through the pipe (which descendants may
                // still hold open): give it a moment.
                let until = Instant::now() + Duration::from_secs(1);
                while self.stderr.1.as_ref().is_some_and(|h| !h.is_finished())
                    && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                panic!(
                    "{} still running after {timeout:?}; killed it\n--- its processes then\n{}\n--- stdout\n{}\n--- stderr\n{}",
                    self.what,
                    tree.join("\n"),
                    String::from_utf8_lossy(&self.stdout_so_far()),
                    String::from_utf8_lossy(&self.stderr_so_far())
                );
            }
            Err(e) => panic!("cannot wait for {}: {e}", self.what),
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        for handle in [self.stdout.1.take(), self.stderr.1.take()]
            .into_iter()
            .flatten()
        {
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if handle.is_finished() {
                let _ = handle.join();
            }
        }
        Output {
            status,
            stdout: self.stdout_so_far(),
            stderr: self.stderr_so_far(),
        }
    }
}

/// Runs a command that must succeed, and returns its output; panics with its stdout and stderr
/// otherwise (`hint` says what may be missing, or is empty).
pub fn must_succeed(cmd: &mut Command, hint: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}{hint}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Reads `pipe` to its end on a thread of its own, a line at a time, into the buffer returned.
pub fn collect_lines(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let all = Arc::new(Mutex::new(Vec::new()));
    let sink = all.clone();
    std::thread::spawn(move || {
        let mut r = io::BufReader::new(pipe);
        let mut buf = Vec::new();
        while io::BufRead::read_until(&mut r, b'\n', &mut buf).is_ok_and(|n| n > 0) {
            sink.lock().unwrap().append(&mut buf);
        }
    });
    all
}

/// Spawns a command with its stdin, stdout and stderr piped, and takes the pipes.
pub fn spawn_piped(
    cmd: &mut Command,
) -> (
    Child,
    Option<std::process::ChildStdin>,
    std::process::ChildStdout,
    std::process::ChildStderr,
) {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_or_panic(cmd);
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    (child, stdin, stdout, stderr)
}

/// Spawns a command; panics naming it if it cannot be run.
pub fn spawn_or_panic(cmd: &mut Command) -> Child {
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs `cmd` to completion with a deadline, capturing its output.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    Spawned::spawn(cmd).finish(timeout)
}

/// A command's outcome for failure messages: status, exit code, stdout and stderr.
pub fn describe_output(what: &str, out: &Output) -> String {
    format!(
        "--- command {what}\n--- status {} (exit code {})\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        exit_code(&out.status),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
