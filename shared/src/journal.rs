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
        (&self.file)
            .write_all(line.as_bytes())
            .map_err(|e| Error::io("append to", &self.path, e))
    }
}
