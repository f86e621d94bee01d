//! The settled ledger: what one `--once` pass learnt about the run dirs it found final for
//! sure, kept in the root as `.watchdog.settled`, so that the next pass does not open, read and
//! scan a record that has not changed since: for such a dir it costs two `statx` calls (the dir,
//! as always, and its status.json) instead of five syscalls and a scan.
//!
//! An entry is a record's facts that the fast path ([`crate::fast`]) uses (`wrapper_pid`, the
//! cgroup parent the record names), under the status.json it read them from: its inode, size
//! and inode change time (`ctime`), and the run dir's inode. The entry counts only while all of
//! them are what `statx` says now. The change time is the kernel's: a write, a rename into place,
//! a chmod or a `utimensat` sets it to the present, and no call sets it to a chosen value.
//!
//! The file is in the root, so the workload (same uid) can rewrite it. That gives it nothing
//! it does not have already: it can write a final record into its own status.json, which the
//! fast path and the careful path both take as final. What a record cannot forge is checked on
//! every pass for a ledger entry exactly as for a record read afresh: the run dir is ours with
//! mode 0700 (statx), status.json is a regular file of ours (statx), the wrapper named holds no
//! flock (/proc/locks), no run cgroup of this run exists on the cgroup2 mount (the pass's walk),
//! and the cgroup the record named is gone. A damaged, foreign, oversized or unparsable ledger
//! is ignored whole (every dir is read again) and rewritten.
//!
//! A record written within [`RACY`] of the pass is not entered: on a filesystem with coarse
//! timestamps, an in-place rewrite in the same clock tick could keep the change time the pass
//! saw (the "racy git" problem). It is read afresh until it is older.

use crate::fast::Settled;
use agent_run_shared::root::Root;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
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
    pub wrapper_pid: Option<i32>,
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

/// A pass's use of the ledger it started from: its entries, matched to the dirs as the pass
/// meets them (in listing order: a cursor; a name out of order is looked up in an index made
/// then), and what the pass learns, for the next ledger.
#[derive(Default)]
pub struct Carry {
    old: Vec<(String, Known)>,
    met: Vec<bool>,
    cursor: usize,
    index: Option<NameMap<u32>>,
    /// Every dir found final, in the order met: an index into `old`, or into `fresh` with
    /// [`FRESH`] set.
    order: Vec<u32>,
    fresh: Vec<(String, Known)>,
    /// Entries of `old` kept.
    kept: usize,
}

const FRESH: u32 = 1 << 31;

impl Carry {
    pub fn new(ledger: Ledger) -> Carry {
        let n = ledger.entries.len();
        Carry {
            met: vec![false; n],
            order: Vec::with_capacity(n),
            old: ledger.entries,
            ..Carry::default()
        }
    }

    /// The ledger entry for `name` not met yet, by its index, if there is one.
    pub fn find(&mut self, name: &str) -> Option<(u32, &Known)> {
        let i = if self.old.get(self.cursor).is_some_and(|(n, _)| n == name) {
            self.cursor
        } else {
            let old = &self.old;
            let index = self.index.get_or_insert_with(|| {
                let mut m = NameMap::with_capacity_and_hasher(old.len(), Default::default());
                for (i, (n, _)) in old.iter().enumerate() {
                    m.entry(n.clone()).or_insert(i as u32);
                }
                m
            });
            *index.get(name)? as usize
        };
        if self.met[i] {
            return None;
        }
        self.met[i] = true;
        self.cursor = i + 1;
        Some((i as u32, &self.old[i].1))
    }

    /// How many entries of the ledger the pass started from still held.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// The status.json key of entry `i`.
    pub fn status_of(&self, i: u32) -> Settled {
        self.old[i as usize].1.status
    }

    /// The entry `i` ([`Carry::find`]) still holds: it goes into the next ledger.
    pub fn keep(&mut self, i: u32) {
        self.kept += 1;
        self.order.push(i);
    }

    /// A dir found final from its record read afresh.
    pub fn learn(&mut self, name: String, k: Known) {
        self.order.push(FRESH | self.fresh.len() as u32);
        self.fresh.push((name, k));
    }

    /// The ledger for the next pass: every dir found final, in the order met, except those
    /// whose status.json changed after `racy_before_ns` ([`RACY`]); `None` when that is the
    /// ledger the pass started from (every entry kept, none added: nothing to write).
    pub fn into_ledger(mut self, racy_before_ns: i64) -> Option<Ledger> {
        if self.fresh.is_empty() && self.kept == self.old.len() {
            return None;
        }
        let mut entries = Vec::with_capacity(self.order.len());
        for i in self.order {
            let (name, k) = if i & FRESH != 0 {
                std::mem::take(&mut self.fresh[(i & !FRESH) as usize])
            } else {
                std::mem::take(&mut self.old[i as usize])
            };
            if k.status.ctime_ns <= racy_before_ns {
                entries.push((name, k));
            }
        }
        Some(Ledger { entries })
    }
}

/// A map by run dir name with a cheap hash: a pass looks up 100,000 names, and SipHash's
/// protection against chosen collisions buys little against a same-user workload, which can
/// slow a pass down as well by making 100,000 run dirs.
pub type NameMap<V> = HashMap<String, V, BuildHasherDefault<NameHasher>>;

/// The hasher of [`NameMap`]: 8 bytes at a time, each mixed in with splitmix64's finalizer.
#[derive(Default)]
pub struct NameHasher(u64);

impl NameHasher {
    fn mix(&mut self, w: u64) {
        let mut z = (self.0 ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(b) ^ (rest.len() as u64) << 59);
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    fn finish(&self) -> u64 {
        self.0
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
    /// tab-separated. Names are run ids; parents hold no control character (the fast path's
    /// scan takes no string with one).
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
                p => Some(p.parse().ok()?),
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
            wrapper_pid: (i % 2 == 0).then_some(4000 + i as i32),
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
