//! events.jsonl: the append-only journal of everything anyone did to a run.
//!
//! One JSON object a line, `{"ts": RFC3339, "event": NAME, "by": ROLE, "by_pid": PID, ...}`,
//! written with one `write(2)` on an `O_APPEND` descriptor so lines from the wrapper, `cancel` and
//! the watchdog never interleave.
//!
//! The journal is diagnostics: it never stops a stop. Opening it cannot fail (a journal the
//! workload replaced with a directory, a FIFO or a symlink, or made unwritable, is a journal
//! that writes nothing and says why: [`Journal::broken`]), and a failed write is the writer's
//! to ignore.

use crate::error::{Error, Result};
use crate::run_dir::{files, RunDir};
use serde_json::{Map, Value};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    /// The file, or why it could not be opened.
    file: std::result::Result<File, String>,
    path: PathBuf,
    by: &'static str,
}

impl RunDir {
    /// Open (creating) the run's journal; `by` names the writer ("wrapper", "cancel", ...).
    /// Never fails: see [`Journal::broken`].
    pub fn journal(&self, by: &'static str) -> Journal {
        Journal {
            file: self.open_append(files::EVENTS).map_err(|e| e.to_string()),
            path: self.file(files::EVENTS),
            by,
        }
    }
}

impl Journal {
    /// Why this journal writes nothing (its file could not be opened), if it does not.
    pub fn broken(&self) -> Option<&str> {
        self.file.as_ref().err().map(String::as_str)
    }

    /// Append one event with the given fields.
    pub fn event(&self, event: &str, fields: Value) -> Result<()> {
        let file = match &self.file {
            Ok(f) => f,
            Err(why) => {
                return Err(Error::Corrupt {
                    path: self.path.clone(),
                    why: why.clone(),
                })
            }
        };
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
            if let Ok(md) = file.metadata() {
                let _ = file.set_len(md.len().saturating_sub(n as u64));
            }
            Error::io(
                "append to",
                &self.path,
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            )
        };
        loop {
            match (&*file).write(bytes) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => return Err(short(n)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("append to", &self.path, e)),
            }
        }
    }
}
