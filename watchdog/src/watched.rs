//! The watch ledger: what a `--once` pass saw of the runs that are not over, kept in the root as
//! `.watchdog.watched` for the next pass, as the daemon keeps it in memory ([`Seen`]): since
//! when a run's wrapper is known gone, since when a live wrapper is stopping its run, the last
//! lease deadline seen while the wrapper lived, and the lease.json damage already reported.
//!
//! It is what makes a pass from a timer honest about time. The heartbeat (the mtime of `lock`)
//! bounds when a wrapper died, but the workload can touch that file: it may bring the bound
//! earlier, never later than the first pass that saw the wrapper gone. Likewise a lease.json
//! the workload rewrites after its wrapper is gone never pushes the deadline past the one seen
//! while the wrapper lived.
//!
//! The file is in the root, so the workload (same uid) can rewrite it too: an entry is kept
//! only for the run dir it was made for (its inode), a damaged or foreign file is ignored and
//! rewritten, and the daemon, which keeps all of this in memory, does not read it. See
//! docs/safety.md for what a workload that rewrites it can still do.

use crate::assess::Seen;
use agent_run_shared::root::Root;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The file's name in the root (dot-named: never taken for a run dir).
pub const FILE: &str = ".watchdog.watched";

/// The largest file read.
const CAP: u64 = 16 << 20;

/// What one pass saw of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The run dir's inode: the entry is this dir's only.
    pub dir_ino: u64,
    /// What the assessment remembers, its keys beside `dir_ino`.
    #[serde(flatten)]
    pub seen: Seen,
    /// The lease.json damage reported already (reported once).
    pub lease_damage: Option<String>,
    /// The status.json damage reported already (reported once).
    #[serde(default)]
    pub record_damage: Option<String>,
}

/// The watch ledger: entries by run dir name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Watched {
    pub runs: BTreeMap<String, Entry>,
}

impl Watched {
    /// Read the root's ledger; empty when there is none or it cannot be taken for one.
    pub fn load(root: &Root) -> Watched {
        root.read_file(FILE, CAP)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The entry for `name`, if it was made for the run dir of inode `dir_ino`.
    pub fn get(&self, name: &str, dir_ino: u64) -> Option<&Entry> {
        self.runs.get(name).filter(|e| e.dir_ino == dir_ino)
    }

    /// Write it back, atomically (not fsynced: a cache of what passes saw).
    pub fn store(&self, root: &Root) -> agent_run_shared::Result<()> {
        let mut text = serde_json::to_string(self).expect("the ledger serializes");
        text.push('\n');
        root.write_atomic(FILE, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_counts_only_for_its_own_run_dir() {
        let mut w = Watched::default();
        w.runs.insert(
            "r1".into(),
            Entry {
                dir_ino: 7,
                seen: Seen {
                    orphan_since: Some(100.0),
                    ..Seen::default()
                },
                ..Entry::default()
            },
        );
        assert_eq!(
            w.get("r1", 7).and_then(|e| e.seen.orphan_since),
            Some(100.0)
        );
        assert!(
            w.get("r1", 8).is_none(),
            "a run dir made again under the same id"
        );
        let text = serde_json::to_string(&w).unwrap();
        // The remembered times are keys of the entry itself, as the ledger always had them.
        assert!(
            text.contains(r#""dir_ino":7,"orphan_since":100.0,"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Watched>(&text).unwrap(), w);
    }
}
