//! cancel.json: who asked a run to stop, and why.
//!
//! `cancel`, the watchdog and the wrapper itself (a lease that ran out, a timeout) write it before
//! they signal anything, so the wrapper's record can say why it stopped. It is created once, with
//! `link(2)` from a complete temp file, and read as a file the run could have planted.

use crate::error::Result;
use crate::reason::Reason;
use crate::run_dir::{caps, files, RunDir};
use crate::sys;
use serde_json::json;

impl RunDir {
    /// Write cancel.json (who asked and why) unless one exists: created with `link(2)` from a
    /// complete temp file, so it appears whole and exactly one caller creates it. Returns whether
    /// this call created it.
    pub fn request_cancel(&self, source: &str, reason: Reason) -> Result<bool> {
        let doc = json!({
            "source": source,
            "reason": reason,
            "requested_at": crate::time::rfc3339_now(),
            "by_uid": sys::geteuid(),
            "by_pid": std::process::id(),
        });
        self.write_new(files::CANCEL, format!("{doc}\n").as_bytes())
    }

    /// The reason in cancel.json, if there is one and the contract names it (read as a file
    /// the run could have planted).
    pub fn cancel_reason(&self) -> Option<Reason> {
        let bytes = self.read_run_file(files::CANCEL, caps::CANCEL).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        v.get("reason")?.as_str().and_then(Reason::parse)
    }
}
