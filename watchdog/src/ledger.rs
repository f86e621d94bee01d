//! The settled ledger: what one `--once` pass learnt about the run dirs it found final for
//! sure, kept in the root as `.watchdog.settled`, so that the next pass does not open, read and
//! parse a record that has not changed since: for such a dir it costs two `statx` calls (the
//! dir, as always, and its status.json) instead of four syscalls and a parse. It halves the CPU
//! of a `--once` pass over 100,000 final runs (docs/benchmarks.md).
//!
//! An entry is a record's facts that the pass ([`crate::pass`]) uses (`wrapper_pid`, the
//! cgroup parent the record names), under the status.json it read them from: its inode, size
//! and inode change time (`ctime`), and the run dir's inode. The entry counts only while all of
//! them are what `statx` says now. The change time is the kernel's: a write, a rename into place,
//! a chmod or a `utimensat` sets it to the present, and no call sets it to a chosen value.
//!
//! The file is in the root, so the workload (same uid) can rewrite it. That gives it nothing
//! it does not have already: it can write a final record into its own status.json, which the
//! pass and the careful path both take as final. What a record cannot forge is checked on
//! every pass for a ledger entry exactly as for a record read afresh: the run dir is ours with
//! mode 0700 (statx), status.json is a regular file of ours (statx), the wrapper named holds no
//! flock (/proc/locks), no run cgroup of this run exists on the cgroup2 mount (the pass's walk),
//! and the cgroup the record named is gone. A damaged, foreign, oversized or unparsable ledger
//! is ignored whole (every dir is read again) and rewritten.
//!
//! A record written within [`RACY`] of the pass is not entered: on a filesystem with coarse
//! timestamps, an in-place rewrite in the same clock tick could keep the change time the pass
//! saw (the "racy git" problem). It is read afresh until it is older.

use agent_run_shared::pid::Pid;
use agent_run_shared::root::Root;
use rustix::fs::{self as rfs, AtFlags, StatxFlags};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

/// The ledger's name in the root (dot-named: never taken for a run dir).
pub const FILE: &str = ".watchdog.settled";

/// The first line of a ledger of this format.
const MAGIC: &str = "agent-run-watchdog settled 1";

/// The largest ledger read (100,000 entries take about 6 MiB).
pub const CAP: u64 = 64 << 20;

/// How old a record's change time must be for its entry to be kept.
pub const RACY: Duration = Duration::from_secs(2);

/// What a settled run is kept under: status.json's inode and inode change time. The change time
/// is the kernel's: every write, rename into place, chmod or `utimensat` sets it to the present,
/// and no call sets it to a chosen value (mtime can be set back, so it is not the key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    pub ctime_ns: i64,
    pub ino: u64,
}

impl Settled {
    /// The key of `ID/status.json` relative to the root's fd now (one `statx`, never
    /// following a symlink at the file itself).
    pub fn of(root: &OwnedFd, name: &str) -> Option<Settled> {
        let s = rfs::statx(
            root,
            format!("{name}/status.json"),
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::CTIME | StatxFlags::INO,
        )
        .ok()?;
        Some(Settled {
            ctime_ns: s.stx_ctime.tv_sec * 1_000_000_000 + i64::from(s.stx_ctime.tv_nsec),
            ino: s.stx_ino,
        })
    }
}

/// What a pass knows of a final run dir, and under which kernel facts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// The run dir's inode.
    pub dir_ino: u64,
    /// status.json's inode and change time.
    pub status: Settled,
    /// status.json's size.
    pub size: u64,
    /// The record's `wrapper_pid`.
    pub wrapper_pid: Option<Pid>,
    /// The cgroup parent the record names (the cgroup is `PARENT/agent-run.<id>.<dir inode>`),
    /// if it names one.
    pub cgroup_parent: Option<Rc<str>>,
}

/// The entries of a ledger, by run dir name, in the order the pass met them (the order the
/// root lists them in, which the next pass meets them in again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    pub entries: Vec<(String, Known)>,
}

/// A pass's use of the ledger it started from: its entries, each taken once when the pass
/// meets its dir, and what the pass found final, for the next ledger.
///
/// The pass meets the dirs in the order the root lists them, which is the order the last pass
/// wrote them in: the entry after the last one taken is almost always the one asked for. A
/// name out of that order (a run added or removed since) is found by an index, made on the
/// first such name. A hash lookup for every dir costs a cache miss each: a tenth of the pass.
#[derive(Default)]
pub struct Carry {
    old: Vec<(String, Option<Known>)>,
    cursor: usize,
    index: Option<HashMap<String, usize>>,
    /// Every dir found final, in the order met.
    next: Vec<(String, Known)>,
    /// Entries of the ledger kept.
    kept: usize,
}

impl Carry {
    pub fn new(ledger: Ledger) -> Carry {
        Carry {
            old: ledger
                .entries
                .into_iter()
                .map(|(n, k)| (n, Some(k)))
                .collect(),
            ..Carry::default()
        }
    }

    /// The ledger's entry for `name`, once (the pass checks it against the kernel's facts).
    pub fn take(&mut self, name: &str) -> Option<Known> {
        let i = if self.old.get(self.cursor).is_some_and(|(n, _)| n == name) {
            self.cursor
        } else {
            let old = &self.old;
            let index = self.index.get_or_insert_with(|| {
                let names = old.iter().enumerate().map(|(i, (n, _))| (n.clone(), i));
                names.rev().collect()
            });
            *index.get(name)?
        };
        self.cursor = i + 1;
        self.old[i].1.take()
    }

    /// A dir found final: from its ledger entry (`kept`), or from its record read afresh.
    pub fn note(&mut self, name: String, k: Known, kept: bool) {
        self.kept += usize::from(kept);
        self.next.push((name, k));
    }

    /// How many entries of the ledger the pass started from still held.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// The ledger for the next pass: every dir found final, in the order met, except those
    /// whose status.json changed after `racy_before_ns` ([`RACY`]); `None` when that is the
    /// ledger the pass started from (every entry kept, none added: nothing to write).
    pub fn into_ledger(self, racy_before_ns: i64) -> Option<Ledger> {
        if self.kept == self.old.len() && self.next.len() == self.kept {
            return None;
        }
        let mut entries = self.next;
        entries.retain(|(_, k)| k.status.ctime_ns <= racy_before_ns);
        Some(Ledger { entries })
    }
}

impl Ledger {
    /// The root's ledger; empty when there is none or it is not one to read (a FIFO, a
    /// symlink, not ours, too big, not parsable).
    pub fn load(root: &Root) -> Ledger {
        root.read_file(FILE, CAP)
            .ok()
            .and_then(|b| Ledger::parse(&b))
            .unwrap_or_default()
    }

    /// Write the ledger into the root (atomically; a failure only costs the next pass reads).
    pub fn store(&self, root: &Root) -> agent_run_shared::Result<()> {
        root.write_atomic(FILE, self.render().as_bytes())
    }

    /// The text of the ledger: the magic line, one `p PARENT` line per cgroup parent, then one
    /// line per entry: `NAME DIR_INO STATUS_INO CTIME_NS SIZE WRAPPER_PID|- PARENT_INDEX|-`,
    /// tab-separated. Names are run ids; parents hold no control character (the pass takes no cgroup
    /// name with one).
    pub fn render(&self) -> String {
        let mut parents: Vec<&Rc<str>> = Vec::new();
        let mut out = String::with_capacity(64 * self.entries.len() + 64);
        out.push_str(MAGIC);
        out.push('\n');
        let mut lines = String::with_capacity(64 * self.entries.len());
        for (name, k) in &self.entries {
            let parent = k.cgroup_parent.as_ref().map(|p| {
                parents.iter().position(|q| *q == p).unwrap_or_else(|| {
                    parents.push(p);
                    parents.len() - 1
                })
            });
            let _ = write!(
                lines,
                "{name}\t{}\t{}\t{}\t{}\t",
                k.dir_ino, k.status.ino, k.status.ctime_ns, k.size
            );
            match k.wrapper_pid {
                Some(p) => {
                    let _ = write!(lines, "{p}\t");
                }
                None => lines.push_str("-\t"),
            }
            match parent {
                Some(i) => {
                    let _ = writeln!(lines, "{i}");
                }
                None => lines.push_str("-\n"),
            }
        }
        for p in parents {
            let _ = writeln!(out, "p\t{p}");
        }
        out.push_str(&lines);
        out
    }

    /// Parse a ledger; `None` for anything that is not one, whole.
    pub fn parse(bytes: &[u8]) -> Option<Ledger> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.split_terminator('\n');
        if lines.next()? != MAGIC || !text.ends_with('\n') {
            return None;
        }
        let mut parents: Vec<Rc<str>> = Vec::new();
        let mut entries = Vec::with_capacity(text.len() / 56);
        for line in lines {
            if let Some(p) = line.strip_prefix("p\t") {
                if !p.starts_with('/') || p.bytes().any(|b| b < 0x20) {
                    return None;
                }
                parents.push(Rc::from(p));
                continue;
            }
            let mut f = line.split('\t');
            let name = f.next()?;
            if !agent_run_shared::id::RunId::is_valid(name) {
                return None;
            }
            let dir_ino = f.next()?.parse().ok()?;
            let ino = f.next()?.parse().ok()?;
            let ctime_ns = f.next()?.parse().ok()?;
            let size = f.next()?.parse().ok()?;
            let wrapper_pid = match f.next()? {
                "-" => None,
                p => Some(Pid::new(p.parse::<i32>().ok()?.into())?),
            };
            let cgroup_parent = match f.next()? {
                "-" => None,
                i => Some(Rc::clone(parents.get(i.parse::<usize>().ok()?)?)),
            };
            if f.next().is_some() {
                return None;
            }
            let known = Known {
                dir_ino,
                status: Settled { ctime_ns, ino },
                size,
                wrapper_pid,
                cgroup_parent,
            };
            entries.push((name.to_string(), known));
        }
        Some(Ledger { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(i: u64, parent: Option<&Rc<str>>) -> Known {
        Known {
            dir_ino: 1000 + i,
            status: Settled {
                ctime_ns: 1_764_000_000_123_456_789 + i as i64,
                ino: 2000 + i,
            },
            size: 1400 + i,
            wrapper_pid: Pid::new(4000 + i as i64).filter(|_| i % 2 == 0),
            cgroup_parent: parent.cloned(),
        }
    }

    #[test]
    fn a_ledger_reads_back_as_it_was_written() {
        let a: Rc<str> = Rc::from("/sys/fs/cgroup/unified");
        let b: Rc<str> = Rc::from("/sys/fs/cgroup/unified/user.slice/x");
        let mut l = Ledger::default();
        for i in 0..50u64 {
            let parent = [Some(&a), Some(&b), None][i as usize % 3];
            l.entries.push((format!("run-{i}"), known(i, parent)));
        }
        let text = l.render();
        assert_eq!(text.matches("\np\t").count(), 2, "{text}");
        assert_eq!(Ledger::parse(text.as_bytes()), Some(l));
        assert_eq!(
            Ledger::parse(Ledger::default().render().as_bytes()),
            Some(Ledger::default())
        );
    }

    #[test]
    fn anything_but_a_whole_ledger_is_none() {
        let mut l = Ledger::default();
        l.entries.push(("r1".into(), known(1, None)));
        l.entries
            .push(("r2".into(), known(2, Some(&Rc::from("/sys/fs/cgroup")))));
        let good = l.render();
        assert!(Ledger::parse(good.as_bytes()).is_some());
        let line = good.lines().find(|l| l.starts_with("r1\t")).unwrap();
        let cases = [
            String::new(),
            good.replacen(MAGIC, "agent-run-watchdog settled 2", 1),
            good[..good.len() - 1].to_string(),
            good[..good.len() - 3].to_string(),
            good.replacen("r1\t", "../r1\t", 1),
            good.replacen("r1\t", ".r1\t", 1),
            good.replacen(line, &format!("{line}\t7"), 1),
            good.replacen(line, &line.replacen("\t-", "\tx", 1), 1),
            good.replacen("\t0\n", "\t9\n", 1),
            good.replacen("p\t/sys/fs/cgroup", "p\tsys/fs/cgroup", 1),
            format!("{good}\n"),
        ];
        for c in &cases {
            assert_eq!(Ledger::parse(c.as_bytes()), None, "parsed: {c:?}");
        }
        let mut bad = good.clone().into_bytes();
        bad[MAGIC.len() + 3] = 0xff;
        assert_eq!(Ledger::parse(&bad), None);
    }
}
