//! Progress notifications for one `run` or `wait` call that carries a progress token.
//!
//! They keep a client's idle timer alive: one at least every `--progress-every` (10 s by
//! default), and one whenever the run wrote more since the last. Each is one line for a person
//! (`message`: the run, its state, its output so far, its last line), the output bytes so far
//! (`_meta`, `agent-run-mcp/output_bytes`), and `progress`: the seconds this call has waited, of
//! `total`, the most it will wait. The spec asks `progress` to grow with every notification;
//! seconds always do, byte counts do not while a run is silent.
//!
//! None is sent once the call has answered (a `run` that became a task included: the Tasks
//! extension has no progress on tasks).

use crate::probe::{Chunk, Probe};
use rmcp::model::*;
use rmcp::service::{Peer, RoleServer};
use serde_json::{json, Map};
use std::time::{Duration, Instant};

/// The `_meta` key of the output bytes so far.
pub const OUTPUT_BYTES_KEY: &str = "agent-run-mcp/output_bytes";
/// The longest last line quoted in a message.
const LAST_LINE: usize = 160;

pub(super) struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    /// When the call began.
    t0: Instant,
    /// The most the call waits, in seconds (`total`).
    limit: f64,
    every: Duration,
    /// When the last notification went out.
    last: Option<Instant>,
    /// The last `progress` sent.
    sent: f64,
    /// The bytes of (stdout, stderr) at the last notification.
    bytes: (u64, u64),
    /// The bytes seen at the last look, and what to say of it (a heartbeat says it again).
    seen: (u64, u64),
    message: String,
}

impl Progress {
    /// `first`: the line of the first notification, sent at once.
    pub(super) fn new(
        peer: Peer<RoleServer>,
        token: ProgressToken,
        limit: Duration,
        every: Duration,
        first: String,
    ) -> Progress {
        Progress {
            peer,
            token,
            t0: Instant::now(),
            limit: limit.as_secs_f64(),
            every,
            last: None,
            sent: 0.0,
            bytes: (0, 0),
            seen: (0, 0),
            message: first,
        }
    }

    /// How long until a heartbeat is due (zero before the first notification).
    pub(super) fn until_due(&self) -> Duration {
        self.last
            .map_or(Duration::ZERO, |t| self.every.saturating_sub(t.elapsed()))
    }

    /// The heartbeat: what the last look said, again.
    pub(super) async fn beat(&mut self) {
        self.send().await;
    }

    /// A look saw `bytes` of (stdout, stderr), and `message` says it: notify now if the run
    /// wrote more since the last notification.
    pub(super) async fn saw(&mut self, bytes: (u64, u64), message: String) {
        self.seen = bytes;
        self.message = message;
        if bytes.0 + bytes.1 > self.bytes.0 + self.bytes.1 || self.until_due().is_zero() {
            self.send().await;
        }
    }

    async fn send(&mut self) {
        // Milliseconds, and always more than the last one sent.
        let secs = (self.t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let value = secs.max(self.sent + 0.001);
        let mut meta = Map::new();
        meta.insert(OUTPUT_BYTES_KEY.into(), json!(self.seen.0 + self.seen.1));
        let mut n = ProgressNotificationParam::new(self.token.clone(), value)
            .with_message(one_line(&self.message));
        n.total = (self.limit > 0.0).then_some(self.limit.max(value));
        n.meta = Some(NotificationMetaObject::from(meta));
        self.sent = value;
        self.last = Some(Instant::now());
        self.bytes = self.seen;
        let _ = self.peer.notify_progress(n).await;
    }

    /// After a look at one run (tails read): its line, naming the last line it wrote since the
    /// previous notification.
    pub(super) async fn after_look(&mut self, what: &str, p: &Probe) {
        let bytes = (p.stdout.size, p.stderr.size);
        let state = p
            .record
            .as_ref()
            .map(crate::view::summary)
            .unwrap_or_else(|(_, e)| e.clone());
        let mut msg = format!("{what}: {state}; {}", output(bytes));
        let last = if bytes.1 > self.bytes.1 && bytes.0 == self.bytes.0 {
            last_line(&p.stderr).map(|l| format!("[stderr] {l}"))
        } else if bytes.0 > self.bytes.0 {
            last_line(&p.stdout)
        } else {
            None
        };
        if let Some(l) = last {
            msg.push_str(&format!("; last line: {l}"));
        }
        self.saw(bytes, msg).await;
    }
}

/// "12,345 bytes of output (stdout 12,000, stderr 345)".
pub(super) fn output(bytes: (u64, u64)) -> String {
    format!(
        "{} bytes of output (stdout {}, stderr {})",
        bytes.0 + bytes.1,
        bytes.0,
        bytes.1
    )
}

/// The last line of a tail, cut to [`LAST_LINE`] bytes (None when it holds none).
fn last_line(c: &Chunk) -> Option<String> {
    let text = String::from_utf8_lossy(&c.data);
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    Some(crate::view::cut_to(line.to_string(), LAST_LINE))
}

/// `s` on one line: control characters (newlines included) become spaces.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_line_and_quotes_the_last_line() {
        assert_eq!(one_line("a\nb\r\tc"), "a b  c");
        let c = Chunk {
            size: 20,
            offset: 0,
            data: b"first\nsecond line\n\n".to_vec(),
            kind: "ok".into(),
        };
        assert_eq!(last_line(&c).as_deref(), Some("second line"));
        let long = Chunk {
            data: "x".repeat(500).into_bytes(),
            ..c
        };
        assert!(last_line(&long).unwrap().len() <= LAST_LINE + '…'.len_utf8());
    }
}
