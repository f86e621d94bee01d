//! The harness of agent-run-mcp's tests: the server binary, and a real MCP client (the official
//! Python SDK, `tests/mcp/driver.py`) that the test drives with JSON lines.
//!
//! The client launches the server as its own child, as an agent host does; the test finds the
//! server's pid among the client's children (by its executable), pins both with pidfds, and
//! kills whatever is left of them, by pid, when the [`Client`] is dropped.

use crate::{children_of, proc_stat, Pinned};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The `agent-run-mcp` binary: `$AGENT_RUN_MCP_BIN`, else beside the other binaries under test
/// ([`crate::BUILD_STEP`]).
pub fn mcp_bin() -> PathBuf {
    crate::workspace_bin("AGENT_RUN_MCP_BIN", "agent-run-mcp", &["mcp", "shared"])
}

/// The Python that has the `mcp` package: `$AGENT_RUN_TEST_PYTHON`, else the suite's virtualenv
/// (`target/ci-venv`, made by `.ci/test`), else `python3` on PATH. Panics, saying how to get it,
/// when `import mcp` fails.
pub fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ci-venv/bin/python3");
        let py = std::env::var_os("AGENT_RUN_TEST_PYTHON")
            .map(PathBuf::from)
            .or_else(|| venv.is_file().then_some(venv))
            .unwrap_or_else(|| PathBuf::from("python3"));
        let ok = Command::new(&py)
            .args(["-c", "import mcp, mcp_types._types"])
            .stdin(Stdio::null())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            ok,
            "{} cannot import the MCP Python SDK: run `bash .ci/test` (it installs the PyPI packages \
             of its pip_packages list into target/ci-venv), or point AGENT_RUN_TEST_PYTHON at a \
             Python that has mcp",
            py.display()
        );
        py
    })
    .clone()
}

type Replies = Arc<(Mutex<HashMap<u64, Value>>, Condvar)>;

/// One MCP client (the Python SDK) with its server.
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: Replies,
    next: u64,
    stderr: Arc<Mutex<Vec<u8>>>,
    pins: Vec<Pinned>,
    server: i32,
    /// The protocol version the SDK negotiated.
    pub protocol: Value,
}

impl Client {
    /// Start the client, which starts `agent-run-mcp ARGS...` with `env` added.
    pub fn start<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &OsStr)], tasks: bool) -> Client {
        let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/driver.py");
        let mut cmd = Command::new(python());
        cmd.arg(&driver);
        if tasks {
            cmd.arg("--tasks");
        }
        cmd.arg("--").arg(mcp_bin()).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.env("PYTHONUNBUFFERED", "1");
        let (child, stdin, stdout, stderr_pipe) = crate::spawn_piped(&mut cmd);
        let replies: Replies = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
        let r = replies.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let key = if v["event"] == "ready" {
                    0
                } else {
                    v["id"].as_u64().unwrap_or(u64::MAX)
                };
                r.0.lock().unwrap().insert(key, v);
                r.1.notify_all();
            }
            r.0.lock()
                .unwrap()
                .insert(u64::MAX - 1, json!({"eof": true}));
            r.1.notify_all();
        });
        let stderr = crate::collect_lines(stderr_pipe);
        let mut c = Client {
            pins: vec![Pinned::new(&[child.id() as i32])],
            child,
            stdin,
            replies,
            next: 1,
            stderr,
            server: 0,
            protocol: Value::Null,
        };
        let ready = c.reply(0, Duration::from_secs(60));
        c.protocol = ready["protocol"].clone();
        let driver_pid = c.child.id() as i32;
        c.server = server_under(driver_pid, "the server among the client's children");
        c.pins.push(Pinned::new(&[c.server]));
        c
    }

    /// The server's pid.
    pub fn server_pid(&self) -> i32 {
        self.server
    }

    /// What the server and the client wrote on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Send one operation; returns its id.
    pub fn send(&mut self, mut op: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        op["id"] = json!(id);
        let line = format!("{op}\n");
        let stdin = self.stdin.as_mut().expect("the client's stdin is open");
        stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot write to the client: {e}\n{}", self.stderr()));
        id
    }

    /// The answer to operation `id`, waiting at most `timeout`.
    pub fn reply(&self, id: u64, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.replies;
        let mut map = lock.lock().unwrap();
        loop {
            if let Some(v) = map.remove(&id) {
                return v;
            }
            if map.contains_key(&(u64::MAX - 1)) {
                drop(map);
                panic!("the client ended before answering {id}:\n{}", self.stderr());
            }
            let now = Instant::now();
            if now >= deadline {
                drop(map);
                panic!("no answer to {id} within {timeout:?}:\n{}", self.stderr());
            }
            map = cv.wait_timeout(map, deadline - now).unwrap().0;
        }
    }

    /// Whether operation `id` has answered yet (without waiting).
    pub fn answered(&self, id: u64) -> bool {
        self.replies.0.lock().unwrap().contains_key(&id)
    }

    /// Send and wait.
    pub fn request(&mut self, op: Value, timeout: Duration) -> Value {
        let id = self.send(op);
        self.reply(id, timeout)
    }

    /// `tools/call`: the reply (`result` or `task`, or `error`).
    pub fn call(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        self.request(json!({"op": "call", "name": name, "args": args}), timeout)
    }

    /// `tools/call` that must give a tool result: (structuredContent, isError).
    pub fn tool(&mut self, name: &str, args: Value, timeout: Duration) -> (Value, bool) {
        let r = self.call(name, args.clone(), timeout);
        assert_eq!(r["ok"], true, "{name} {args}: {r}\n{}", self.stderr());
        let res = &r["result"];
        let is_error = res["isError"].as_bool().unwrap_or(false);
        let sc = res.get("structuredContent").cloned().unwrap_or_else(|| {
            // A tool error has text only.
            json!({"text": res["content"][0]["text"]})
        });
        (sc, is_error)
    }

    /// The notifications received since the last ask.
    pub fn notifications(&mut self) -> Vec<Value> {
        let r = self.request(json!({"op": "notifications"}), Duration::from_secs(30));
        r["notifications"].as_array().cloned().unwrap_or_default()
    }

    /// Leave the client cleanly: the SDK closes the server's stdin and waits for it (and, past
    /// its patience, TERMs and KILLs it). Returns how long that took (s) and everything the
    /// client and server wrote on stderr, once the client itself has exited.
    pub fn close(mut self, timeout: Duration) -> (f64, String) {
        let r = self.request(json!({"op": "close"}), timeout);
        drop(self.stdin.take());
        let _ = crate::wait_child(&mut self.child, timeout);
        (r["closed_in_s"].as_f64().unwrap_or(f64::NAN), self.stderr())
    }

    /// SIGKILL the server (through its pidfd) and wait until it is gone.
    pub fn kill_server(&self) {
        self.pins[1]
            .signal(self.server, libc::SIGKILL)
            .unwrap_or_else(|e| panic!("cannot SIGKILL the server {}: {e}", self.server));
        self.pins[1]
            .wait_all_gone(Duration::from_secs(10))
            .unwrap_or_else(|left| panic!("the server {left:?} outlived SIGKILL"));
    }

    /// Whether the server process is still alive (any thread).
    pub fn server_alive(&self) -> bool {
        proc_stat(self.server).is_some_and(|s| !matches!(s.0, 'Z' | 'X'))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        drop(self.stdin.take());
        // Dropping the pins SIGKILLs whatever of the client and its server is still alive.
        self.pins.clear();
        let _ = self.child.try_wait();
    }
}

/// Waits (10 s) until an `agent-run-mcp` process is a child of `parent`, and returns its pid.
pub(crate) fn server_under(parent: i32, what: &str) -> i32 {
    crate::wait_until(what, Duration::from_secs(10), || {
        children_of(parent).into_iter().find(|&p| {
            std::fs::read_link(format!("/proc/{p}/exe"))
                .is_ok_and(|e| e.file_name() == Some(OsStr::new("agent-run-mcp")))
        })
    })
}
