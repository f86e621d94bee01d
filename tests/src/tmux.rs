//! A real terminal for the tests of people at a terminal (`tests/tests/terminal_users.rs`): a
//! tmux server of the test's own, on a private socket, with a pane of a given size, to type into
//! and read back.
//!
//! The tmux server is stopped on drop (`kill-server`, which hangs up every pane: a foreground
//! agent-run in a pane stops its run on that HUP), then killed by its pid, pinned with a pidfd,
//! if it is still there.

use super::{wait_until_dbg, Pinned};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A tmux server with one session `t`, one pane running `bash --norc --noprofile`.
pub struct Tmux {
    dir: tempfile::TempDir,
    server: Option<Pinned>,
}

impl Tmux {
    /// A `width` x `height` terminal, the shell's prompt `$ `, `extra_env` in its environment.
    pub fn new(width: u16, height: u16, extra_env: &[(&str, &str)]) -> Tmux {
        let dir = tempfile::Builder::new()
            .prefix("agent-run-tmux.")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut t = Tmux { dir, server: None };
        let mut cmd = t.tmux();
        cmd.args(["-f", "/dev/null", "new-session", "-d", "-s", "t"])
            .args(["-x", &width.to_string(), "-y", &height.to_string()])
            .args(["env", "-u", "NO_COLOR", "PS1=$ ", "HISTFILE=/dev/null"]);
        for (k, v) in extra_env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.args(["bash", "--norc", "--noprofile"]);
        t.must(&mut cmd);
        let pid = t.query("#{pid}");
        t.server = Some(Pinned::new(&[pid
            .parse()
            .unwrap_or_else(|_| panic!("tmux server pid {pid:?}"))]));
        t.wait_for("$ ", Duration::from_secs(20));
        t
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn tmux(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.arg("-S")
            .arg(self.socket())
            .env_remove("TMUX")
            .env_remove("AGENT_RUN_ROOT")
            .stdin(Stdio::null());
        cmd
    }

    fn must(&self, cmd: &mut Command) -> String {
        let out = crate::must_succeed(cmd, " (is tmux installed?)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A tmux format of the pane (`#{pane_pid}`, ...).
    pub fn query(&self, format: &str) -> String {
        self.must(
            self.tmux()
                .args(["display-message", "-p", "-t", "t", format]),
        )
        .trim()
        .to_string()
    }

    /// Type `text` literally, then Enter.
    pub fn line(&self, text: &str) {
        self.must(self.tmux().args(["send-keys", "-t", "t", "-l", text]));
        self.keys(&["Enter"]);
    }

    /// Send keys by name (`C-c`, `C-z`, `Enter`).
    pub fn keys(&self, keys: &[&str]) {
        self.must(self.tmux().args(["send-keys", "-t", "t"]).args(keys));
    }

    /// Clear the screen and the history, so later captures show only what comes next.
    pub fn clear(&self) {
        self.line("clear");
        self.must(self.tmux().args(["clear-history", "-t", "t"]));
        wait_until_dbg("a clear screen", Duration::from_secs(20), || {
            let s = self.screen(false);
            if s.trim() == "$" {
                Ok(())
            } else {
                Err(s)
            }
        });
    }

    /// What the pane shows (history included), lines joined as the terminal wrapped them;
    /// with `escapes`, the colour sequences too.
    pub fn screen(&self, escapes: bool) -> String {
        let mut cmd = self.tmux();
        cmd.args(["capture-pane", "-p", "-J", "-t", "t", "-S", "-"]);
        if escapes {
            cmd.arg("-e");
        }
        self.must(&mut cmd)
    }

    /// What the pane shows, row by row as the terminal shows them (no joining of wrapped lines).
    pub fn rows(&self) -> Vec<String> {
        self.must(
            self.tmux()
                .args(["capture-pane", "-p", "-N", "-t", "t", "-S", "-"]),
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// Wait until the pane shows `text`; return the screen.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> String {
        wait_until_dbg(&format!("{text:?} on the terminal"), timeout, || {
            let s = self.screen(false);
            if s.contains(text) {
                Ok(s)
            } else {
                Err(s)
            }
        })
    }

    /// Wait until the shell is back at its prompt (the last non-empty line is `$`).
    pub fn wait_prompt(&self, timeout: Duration) -> String {
        wait_until_dbg("the shell's prompt", timeout, || {
            let s = self.screen(false);
            let last = s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            if last.trim_end() == "$" {
                Ok(s)
            } else {
                Err(s)
            }
        })
    }

    /// Run a command line and wait until it is done (its echo, then a new prompt after it);
    /// return what it printed (the screen after the command line, without the prompt). Clears
    /// the screen first.
    pub fn run(&self, line: &str, timeout: Duration) -> String {
        self.clear();
        self.line(line);
        let s = self.wait_done(line, timeout);
        after_command(&s, line)
    }

    /// Like [`Tmux::run`], with the colour sequences kept.
    pub fn run_escaped(&self, line: &str, timeout: Duration) -> String {
        self.clear();
        self.line(line);
        self.wait_done(line, timeout);
        after_command(&self.screen(true), line)
    }

    fn wait_done(&self, line: &str, timeout: Duration) -> String {
        wait_until_dbg(&format!("{line:?} to finish"), timeout, || {
            let s = self.screen(false);
            if done_after(&s, line) {
                Ok(s)
            } else {
                Err(s)
            }
        })
    }
}

/// Whether the screen shows `line` typed (its last occurrence) and a new prompt after it.
fn done_after(screen: &str, line: &str) -> bool {
    let Some(i) = screen.rfind(line) else {
        return false;
    };
    let rest = &screen[i + line.len()..];
    rest.starts_with('\n')
        && rest
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.trim_end() == "$")
}

/// The output after the echoed command line (its last occurrence), without the final prompt.
fn after_command(screen: &str, line: &str) -> String {
    let start = screen.rfind(line).map_or(0, |i| i + line.len());
    let rest = screen[start..].trim_start_matches('\n');
    let mut lines: Vec<&str> = rest.lines().collect();
    while lines
        .last()
        .is_some_and(|l| l.trim().is_empty() || l.trim() == "$")
    {
        lines.pop();
    }
    lines.join("\n")
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").output();
        if let Some(server) = &self.server {
            if server.wait_all_gone(Duration::from_secs(5)).is_err() {
                for pid in server.alive() {
                    let _ = server.signal(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// A path as text, for command lines typed into a shell (tests use plain temporary paths).
pub fn shell_path(p: &Path) -> String {
    let s = p.display().to_string();
    assert!(
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b)),
        "path {s:?} needs quoting"
    );
    s
}
