//! Progress notifications for one request.

use super::PROGRESS_TEXT;
use crate::probe::{Probe, Read};
use rmcp::model::*;
use rmcp::service::{Peer, RoleServer};

/// Progress notifications for one request: the output as it arrives.
pub(super) struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    /// Where the next read of each log starts.
    ends: [u64; 2],
    /// The last value sent (it only grows).
    sent: f64,
}

impl Progress {
    pub(super) fn new(peer: Peer<RoleServer>, token: ProgressToken) -> Progress {
        Progress {
            peer,
            token,
            ends: [0, 0],
            sent: 0.0,
        }
    }

    pub(super) async fn note(&mut self, message: String) {
        let p = ProgressNotificationParam::new(self.token.clone(), self.sent).with_message(message);
        let _ = self.peer.notify_progress(p).await;
    }

    pub(super) fn reads(&self) -> (Read, Read) {
        let r = |o| Read::From {
            offset: o,
            max: 2 * PROGRESS_TEXT as u64,
        };
        (r(self.ends[0]), r(self.ends[1]))
    }

    /// Send what is new in `p` (if anything is): progress = bytes of output so far.
    pub(super) async fn update(&mut self, p: &Probe) {
        let mut parts = Vec::new();
        for (i, (name, c)) in [("stdout", &p.stdout), ("stderr", &p.stderr)]
            .into_iter()
            .enumerate()
        {
            if c.size < self.ends[i] {
                // The log was cut (a cap, a rewrite): go on from its end.
                self.ends[i] = c.size;
                continue;
            }
            let mut text = String::from_utf8_lossy(&c.data).into_owned();
            self.ends[i] = c.end();
            // Far behind (a workload writing fast): skip to the last bytes.
            let behind = c.size.saturating_sub(self.ends[i]);
            if behind > 16 * PROGRESS_TEXT as u64 {
                self.ends[i] = c.size - PROGRESS_TEXT as u64;
                text.push_str(&format!(
                    "\n[... {} bytes not shown ...]\n",
                    behind - PROGRESS_TEXT as u64
                ));
            }
            if text.is_empty() {
                continue;
            }
            if text.len() > PROGRESS_TEXT {
                let mut cut = text.len() - PROGRESS_TEXT;
                while !text.is_char_boundary(cut) {
                    cut += 1;
                }
                text = format!("[... {cut} bytes not shown ...]{}", &text[cut..]);
            }
            parts.push(if name == "stdout" {
                text
            } else {
                format!("[stderr] {text}")
            });
        }
        let total = (p.stdout.size + p.stderr.size) as f64;
        if parts.is_empty() || total <= self.sent {
            return;
        }
        self.sent = total;
        let msg = parts.join("\n");
        let n = ProgressNotificationParam::new(self.token.clone(), total).with_message(msg);
        let _ = self.peer.notify_progress(n).await;
    }
}
