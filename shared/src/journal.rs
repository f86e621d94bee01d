//! events.jsonl: the append-only journal of everything anyone did to a run.
//!
//! One JSON object a line, `{"ts": RFC3339, "event": NAME, "by": ROLE, "by_pid": PID, ...}`,
//! written with one `write(2)` on an `O_APPEND` descriptor so lines from the wrapper, `cancel` and
//! the watchdog never interleave. Journal failures never stop a stop: callers log and go on.

use crate::error::{Error, Result};
use crate::run_dir::{files, RunDir};
use serde_json::{Map, Value};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    by: &'static str,
}

impl RunDir {
    /// Open (creating) the run's journal; `by` names the writer ("wrapper", "cancel", ...).
    pub fn journal(&self, by: &'static str) -> Result<Journal> {
        Ok(Journal {
            file: self.open_append(files::EVENTS)?,
            path: self.file(files::EVENTS),
            by,
        })
    }
}

impl Journal {
    /// Append one event with the given fields.
    pub fn event(&self, event: &str, fields: Value) -> Result<()> {
        let mut m = Map::new();
        m.insert("ts".into(), Value::String(crate::time::rfc3339_now()));
        m.insert("event".into(), Value::String(event.into()));
        m.insert("by".into(), Value::String(self.by.into()));
        m.insert("by_pid".into(), Value::from(std::process::id()));
        if let Value::Object(extra) = fields {
            m.extend(extra);
        }
        let mut line = serde_json::to_string(&Value::Object(m)).expect("json values serialize");
        line.push('\n');
        // One write(2) (O_APPEND: the line lands whole at the end, never interleaved with another
        // writer's). A full disk can take part of it: the part is taken back, so the journal
        // holds whole lines only.
        let bytes = line.as_bytes();
        let short = |n: usize| {
            if let Ok(md) = self.file.metadata() {
                let _ = self.file.set_len(md.len().saturating_sub(n as u64));
            }
            Error::io(
                "append to",
                &self.path,
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            )
        };
        loop {
            match (&self.file).write(bytes) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => return Err(short(n)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("append to", &self.path, e)),
            }
        }
    }
}
