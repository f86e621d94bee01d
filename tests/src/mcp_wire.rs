//! agent-run-mcp on the wire: the test writes JSON-RPC lines on the server's stdin and reads every
//! line it writes, with no SDK between. For what an SDK would hide or cannot do: a line that is
//! not JSON, the exact size of an answer, the time a call takes, a client that dies while its
//! stdin stays open.
//!
//! [`Wire::start`] runs the server as the test's child. [`Wire::behind_parent`] runs it as the
//! child of a shell (its "client"), the test holding the server's stdin: killing the shell leaves
//! the server's stdin open. Every process made here is pinned and killed, by pid, on drop.

use crate::mcp::{mcp_bin, server_under};
use crate::Pinned;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type Lines = Arc<(Mutex<Vec<String>>, Condvar)>;

/// A server and the two ends of its stdio.
pub struct Wire {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Every line the server wrote on stdout, in order, and "EOF" once it closed stdout.
    lines: Lines,
    stderr: Arc<Mutex<Vec<u8>>>,
    pins: Vec<Pinned>,
    server: i32,
    /// The shell the server runs under ([`Wire::behind_parent`]).
    parent: Option<i32>,
    next: u64,
}

impl Wire {
    /// `agent-run-mcp ARGS...` as the test's child, `env` added.
    pub fn start<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &OsStr)]) -> Wire {
        let mut cmd = Command::new(mcp_bin());
        cmd.args(args);
        Wire::spawn(cmd, env, false)
    }

    /// `agent-run-mcp ARGS...` as the child of `sh`, which the test can kill while it keeps the
    /// server's stdin open (the shell hands its stdin on through fd 3: a background job's own
    /// stdin would be /dev/null).
    pub fn behind_parent<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &OsStr)]) -> Wire {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exec 3<&0; \"$@\" <&3 3<&- & wait", "sh"])
            .arg(mcp_bin())
            .args(args);
        Wire::spawn(cmd, env, true)
    }

    fn spawn(mut cmd: Command, env: &[(&str, &OsStr)], behind: bool) -> Wire {
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (child, stdin, out, err) = crate::spawn_piped(&mut cmd);
        let lines: Lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.0.lock().unwrap().push(line);
                l.1.notify_all();
            }
            l.0.lock().unwrap().push("EOF".into());
            l.1.notify_all();
        });
        let stderr = crate::collect_lines(err);
        let first = child.id() as i32;
        let mut pins = vec![Pinned::new(&[first])];
        let (server, parent) = if behind {
            let server = server_under(first, "the server under its shell");
            pins.push(Pinned::new(&[server]));
            (server, Some(first))
        } else {
            (first, None)
        };
        Wire {
            child,
            stdin,
            lines,
            stderr,
            pins,
            server,
            parent,
            next: 1,
        }
    }

    pub fn server_pid(&self) -> i32 {
        self.server
    }

    /// The pidfd pin of the server.
    pub fn server_pin(&self) -> &Pinned {
        self.pins.last().expect("pinned")
    }

    /// SIGKILL the server's parent shell ([`Wire::behind_parent`]) and wait until it is gone; the
    /// test still holds the server's stdin.
    pub fn kill_parent(&self) {
        let sh = self.parent.expect("a server behind a parent");
        self.pins[0]
            .signal(sh, libc::SIGKILL)
            .unwrap_or_else(|e| panic!("cannot SIGKILL the shell {sh}: {e}"));
        self.pins[0]
            .wait_all_gone(Duration::from_secs(10))
            .unwrap_or_else(|left| panic!("the shell {left:?} outlived SIGKILL"));
    }

    /// What the server wrote on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Write one line (a newline is added).
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot write to the server: {e}\n{}", self.stderr()));
    }

    /// Send a request; returns its id.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_line(&msg.to_string());
        id
    }

    /// The first line after the first `skip` lines that `pick` accepts, waiting at most `timeout`:
    /// (its index, the line).
    pub fn line_where(
        &self,
        timeout: Duration,
        pick: impl Fn(&Value) -> bool,
    ) -> (usize, String, Value) {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.lines;
        let mut lines = lock.lock().unwrap();
        loop {
            for (i, l) in lines.iter().enumerate() {
                if let Ok(v) = serde_json::from_str::<Value>(l) {
                    if pick(&v) {
                        return (i, l.clone(), v);
                    }
                }
            }
            let eof = lines.last().is_some_and(|l| l == "EOF");
            let now = Instant::now();
            if eof || now >= deadline {
                let seen = lines.join("\n");
                drop(lines);
                panic!(
                    "{} waiting for a line; stdout so far:\n{seen}\nstderr:\n{}",
                    if eof { "EOF" } else { "timed out" },
                    self.stderr()
                );
            }
            lines = cv.wait_timeout(lines, deadline - now).unwrap().0;
        }
    }

    /// The answer to request `id`: (the line as written, parsed).
    pub fn answer(&self, id: u64, timeout: Duration) -> (String, Value) {
        let (_, line, v) = self.line_where(timeout, |v| {
            v["id"] == json!(id) && (v.get("result").is_some() || v.get("error").is_some())
        });
        (line, v)
    }

    /// Every line written so far, parsed (lines that are not JSON are left out).
    pub fn messages(&self) -> Vec<Value> {
        let lines = self.lines.0.lock().unwrap();
        lines
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// initialize and notifications/initialized, declaring the tasks extension when `tasks`.
    pub fn initialize(&mut self, tasks: bool) -> Value {
        let mut caps = json!({});
        if tasks {
            caps["extensions"] = json!({"io.modelcontextprotocol/tasks": {}});
        }
        let id = self.send(
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": caps,
                "clientInfo": {"name": "agent-run-tests", "version": "1"}
            }),
        );
        let (_, v) = self.answer(id, Duration::from_secs(30));
        assert!(v.get("result").is_some(), "initialize: {v}");
        self.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        v["result"].clone()
    }

    /// tools/call: (the answer's line as written, its parsed `result`). `meta` goes into
    /// `params._meta` (a progress token, say).
    pub fn call(
        &mut self,
        name: &str,
        args: Value,
        meta: Option<Value>,
        timeout: Duration,
    ) -> (String, Value) {
        let mut params = json!({"name": name, "arguments": args});
        if let Some(m) = meta {
            params["_meta"] = m;
        }
        let id = self.send("tools/call", params);
        let (line, v) = self.answer(id, timeout);
        assert!(
            v.get("result").is_some(),
            "{name}: {v}\nstderr:\n{}",
            self.stderr()
        );
        (line, v["result"].clone())
    }

    /// Close the server's stdin.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        drop(self.stdin.take());
        // Dropping the pins SIGKILLs whatever of the shell and the server is still alive.
        self.pins.clear();
        let _ = self.child.try_wait();
    }
}
