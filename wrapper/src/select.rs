//! Which runs `status`, `cancel`, `renew` and `wait` act on: one run id (the output of one
//! record, as always), several ids, `--all`, or a label selector (a line or summary a run, in
//! the order asked, newest first for `--all` and `--label`; with `--json`, one JSON array in
//! that order).
//!
//! A run that cannot be acted on (no such run, unsafe, refused) does not stop the others: its
//! reason goes to stderr, its entry in the JSON array says why (`{"run_id", "state": null,
//! "error", "error_exit_code"}`), and the exit code is the first such code.

use crate::cli::Selection;
use crate::error::{exit_code_of, fail};
use crate::runs::open_root;
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::spec::matches_all;
use agent_run_shared::time::parse_rfc3339;
use serde_json::{json, Value};
use std::path::Path;

/// The runs picked.
pub enum Picked {
    /// One run id given by itself: the subcommand's single-run output.
    One(String),
    /// Several ids, or a selector: a line a run, or one JSON array for all of them.
    Many(Vec<String>),
}

/// Resolve a selection. `active_only`: with `--all` or `--label`, skip runs that are final
/// (nothing to cancel, renew or wait for).
pub fn pick(root: Option<&Path>, sel: &Selection, active_only: bool) -> anyhow::Result<Picked> {
    if !sel.all && sel.labels.is_empty() {
        let mut ids: Vec<String> = Vec::new();
        for id in &sel.run_ids {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        return match ids.len() {
            0 => fail(
                exit::USAGE,
                "no run given: name one or more run ids, or use --all or --label KEY=VALUE",
            ),
            1 if sel.run_ids.len() == 1 => Ok(Picked::One(ids.remove(0))),
            _ => Ok(Picked::Many(ids)),
        };
    }
    let Some(root) = open_root(root)? else {
        return Ok(Picked::Many(Vec::new()));
    };
    let mut found: Vec<(f64, String)> = Vec::new();
    for name in crate::runs::root_entries(&root)? {
        let picked = RunId::parse(&name)
            .map_err(|e| e.to_string())
            .and_then(|id| root.open_run_dir(&id).map_err(|e| e.to_string()))
            .and_then(|dir| dir.read_status().map_err(|e| e.to_string()));
        match picked {
            Ok(st) => {
                if matches_all(&sel.labels, &st.labels) && !(active_only && st.state.is_final()) {
                    found.push((parse_rfc3339(&st.created_at).unwrap_or(0.0), name));
                }
            }
            Err(why) => eprintln!("agent-run: {name}: skipped: {why}"),
        }
    }
    // Newest first, as `list` shows them.
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    Ok(Picked::Many(found.into_iter().map(|(_, n)| n).collect()))
}

/// The entry of a run that could not be acted on, and its exit code; the reason also goes to
/// stderr.
pub fn error_entry(id: &str, err: &anyhow::Error) -> (Value, u8) {
    let code = exit_code_of(err);
    eprintln!("agent-run: {err:#}");
    (
        json!({"run_id": id, "state": null, "error": format!("{err:#}"), "error_exit_code": code}),
        code,
    )
}

/// What a command over several runs prints with `--json` (an array, an entry a run), and its
/// exit code: that of the first run it could not act on, 0 when none.
#[derive(Default)]
pub struct Batch {
    docs: Vec<Value>,
    code: u8,
    /// Entries written as they come ([`Batch::streaming`]): whether one was written yet.
    streamed: Option<bool>,
}

impl Batch {
    /// A batch whose array is written an entry at a time as the entries come (`status --all
    /// --json` over 100,000 runs holds no 100,000 documents). The same bytes as
    /// [`Batch::finish`] prints.
    pub fn streaming() -> Batch {
        Batch {
            streamed: Some(false),
            ..Batch::default()
        }
    }

    /// A run's entry.
    pub fn push(&mut self, doc: Value) {
        match self.streamed {
            Some(first_done) => {
                let text = serde_json::to_string_pretty(&doc).expect("json serializes");
                let mut out = String::with_capacity(text.len() + text.len() / 16 + 4);
                out.push_str(if first_done { ",\n" } else { "[\n" });
                for (i, line) in text.lines().enumerate() {
                    if i > 0 {
                        out.push('\n');
                    }
                    out.push_str("  ");
                    out.push_str(line);
                }
                print!("{out}");
                self.streamed = Some(true);
            }
            None => self.docs.push(doc),
        }
    }

    /// A run that could not be acted on ([`error_entry`]).
    pub fn failed(&mut self, id: &str, err: &anyhow::Error) {
        let (doc, code) = error_entry(id, err);
        self.push(doc);
        if self.code == exit::OK {
            self.code = code;
        }
    }

    /// Prints the array when `json` (ends it, when streamed); the exit code.
    pub fn finish(self, json: bool) -> u8 {
        match (json, self.streamed) {
            (false, _) => {}
            (true, Some(true)) => println!("\n]"),
            (true, Some(false)) => println!("[]"),
            (true, None) => print_json(&Value::Array(self.docs)),
        }
        self.code
    }
}

/// Print one JSON document (pretty, with a trailing newline) on stdout.
pub fn print_json(v: &Value) {
    let mut s = serde_json::to_string_pretty(v).expect("json serializes");
    s.push('\n');
    print!("{s}");
}
