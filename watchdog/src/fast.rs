//! The fast path of a full pass: tell, cheaply, the run dirs that are final for sure, so that a
//! root of 100,000 finished runs costs a few relative syscalls per dir instead of the careful
//! path's absolute path walks and a full parse of every record.
//!
//! It decides one thing only: "final, nothing to do". Anything it is not sure of, it hands to
//! the careful path ([`crate::assess::assess`]: `open_run_dir`, `read_status`, the kernel's
//! checks), which decides as it always did. Per entry of the root (`getdents`, whose `d_type`
//! tells a directory without a stat):
//!
//! - the entry is a directory (`d_type`), its name a valid run id, and `statx` relative to the
//!   root's fd says it is ours, mode without group/other bits: the careful path's own checks;
//! - the record's facts come from the pass's ledger ([`crate::ledger`], `--once` only) while
//!   `statx` says status.json is still the regular file of ours they were read from (inode,
//!   size, change time); otherwise it is read:
//! - `openat2(root, "ID/status.json", O_NOFOLLOW|O_NONBLOCK, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)`:
//!   no symlink anywhere on the way, never a blocked open; `fstat`: a regular file of ours, at
//!   most [`MAX_FAST`] bytes; one `read` of `st_size + 1` bytes that must return exactly the size;
//! - a minimal scan of the document ([`scan`]): it must be one well-formed JSON object with
//!   schema 1, every key the record requires, no key we read twice, and a final `state`;
//! - no live wrapper: the record's `wrapper_pid` holds no flock (/proc/locks read once per
//!   pass, on first need: a wrapper holds its run's lock itself for its whole life, and writes
//!   its final record a moment before it exits);
//! - no live cgroup: a record held in a cgroup names `agent-run.<id>.<dir inode>` (the careful
//!   path's check), and that cgroup is gone (it is removed after the final record; each cgroup
//!   parent is listed once per pass).
//!
//! A workload can write a final record of its own while its processes live: the careful path
//! takes a parsable final record as final too, so the fast path never skips a run the careful
//! path would act on; the two checks above add what the kernel knows (the wrapper's lock, the
//! cgroup) on top, for the price of no syscall per dir. They are not proof against a workload
//! that also rewrites `wrapper_pid` and drops `containment` (comparing the lock's inode would
//! cost one more statx per dir): such a record is taken as final by the careful path too.

use crate::ledger::{Carry, Known, Ledger, RACY};
use agent_run_shared::cgroup::{name_for, write_name_for, RunCgroups};
use agent_run_shared::id::RunId;
use agent_run_shared::record::{KEYS, SCHEMA};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::rc::Rc;

/// Now minus [`RACY`], in ns since the epoch.
fn racy_before_ns() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.saturating_sub(RACY).as_nanos()).unwrap_or(i64::MAX)
}

/// The largest status.json the fast path reads (a record is about 1 KiB; argv can make it
/// larger, and then the careful path reads it).
pub const MAX_FAST: u64 = 64 << 10;

/// One entry of the root, from `getdents`.
pub struct Entry {
    pub name: String,
    /// `d_type`: `Some(true)` a directory, `Some(false)` something else, `None` unknown.
    pub is_dir: Option<bool>,
    pub ino: u64,
}

/// The entries of the root that could be run dirs (dot-names are the watchdog's own files), read
/// with `getdents` through `dirfd`. A name that is not UTF-8 is kept lossily (the careful path
/// then skips it as an invalid run id).
pub fn entries(dirfd: &OwnedFd) -> std::io::Result<Vec<Entry>> {
    let mut dir = rfs::Dir::read_from(dirfd)?;
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name.first() == Some(&b'.') {
            continue;
        }
        let is_dir = match e.file_type() {
            FileType::Directory => Some(true),
            FileType::Unknown => None,
            _ => Some(false),
        };
        out.push(Entry {
            name: String::from_utf8_lossy(name).into_owned(),
            is_dir,
            ino: e.ino(),
        });
    }
    Ok(out)
}

/// Open the root for a pass (a directory, never through a symlink at its last component).
pub fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// What one pass knows about the host, gathered once: who we are, the flocks held on the
/// root's filesystem, the cgroup parents opened so far.
pub struct Pass {
    root: OwnedFd,
    me: u32,
    /// The pids holding a flock, read on first need (a pass over runs that are not final never
    /// reads /proc/locks); the inner `None`: it could not be read whole, so every wrapper counts
    /// as possibly alive.
    holders: std::cell::OnceCell<Option<Held>>,
    /// The `agent-run.*` children of each cgroup parent a record named, listed once per pass;
    /// `None`: the parent could not be listed (and exists), so no cgroup counts as gone.
    cgroups: HashMap<String, Option<HashSet<String>>>,
    buf: Vec<u8>,
    /// The ledger the pass started from, and what it learns for the next one.
    /// `None` in a pass without a ledger (the daemon's: it settles runs in memory).
    carry: Option<Carry>,
    /// Change times after this (ns since the epoch) are too recent to enter the ledger.
    racy_before_ns: i64,
    /// The cgroup parents of the ledger entries, each once.
    parents: Vec<Rc<str>>,
    /// Buffers for a run's cgroup name and its status.json's path.
    cgroup_name: String,
    path: String,
}

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

/// The fast path's answer about one run dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fast {
    /// Final, nothing to do; status.json's key ([`Settled`]), which the daemon settles it
    /// under.
    Final(Settled),
    /// Not sure: the careful path decides.
    Careful,
}

impl Pass {
    /// A pass over the root open at `root` ([`open_root`]).
    pub fn new(root: OwnedFd) -> Pass {
        Pass {
            root,
            me: rustix::process::geteuid().as_raw(),
            holders: std::cell::OnceCell::new(),
            cgroups: HashMap::new(),
            buf: Vec::with_capacity(4096),
            carry: None,
            racy_before_ns: racy_before_ns(),
            parents: Vec::new(),
            cgroup_name: String::with_capacity(64),
            path: String::with_capacity(64),
        }
    }

    /// The root this pass lists.
    pub fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// Whether the run dir `e` is final for sure ([`Fast::Final`]) or needs the careful path.
    /// `run_cgroups` is every run cgroup on the cgroup2 mount by name, walked once per pass on
    /// first need (the careful path of the same pass uses the same walk): a final record whose
    /// run still has a cgroup anywhere (a forged record may name another or none) goes to the
    /// careful path.
    pub fn classify(&mut self, e: &Entry, run_cgroups: &std::cell::OnceCell<RunCgroups>) -> Fast {
        self.final_key(e, run_cgroups).unwrap_or(Fast::Careful)
    }

    fn final_key(
        &mut self,
        e: &Entry,
        run_cgroups: &std::cell::OnceCell<RunCgroups>,
    ) -> Option<Fast> {
        if e.is_dir != Some(true) || !RunId::is_valid(&e.name) {
            return None;
        }
        // The careful path's run dir checks: ours, a directory, mode without group/other bits.
        let d = rfs::statx(
            &self.root,
            e.name.as_str(),
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::UID | StatxFlags::INO,
        )
        .ok()?;
        if FileType::from_raw_mode(d.stx_mode.into()) != FileType::Directory
            || d.stx_uid != self.me
            || u32::from(d.stx_mode) & 0o077 != 0
        {
            return None;
        }
        let dir_ino = d.stx_ino;
        // The record's facts: from the ledger while its status.json is the one they were read
        // from, else read afresh.
        let carried = match self.carry.as_mut().and_then(|c| c.find(&e.name)) {
            Some((i, k))
                if k.dir_ino == dir_ino
                    && unchanged(&self.root, &mut self.path, self.me, &e.name, k) =>
            {
                Some((i, k.wrapper_pid, k.cgroup_parent.clone()))
            }
            _ => None,
        };
        let (fresh, wrapper_pid, cgroup_parent) = match carried {
            Some((i, w, c)) => (Err(i), w, c),
            None => {
                let k = self.read_facts(&e.name, dir_ino)?;
                let (w, c) = (k.wrapper_pid, k.cgroup_parent.clone());
                (Ok(k), w, c)
            }
        };
        // A wrapper holds its run's lock for its whole life, on the run dir's own inode (the
        // record cannot name another): that inode in /proc/locks means it may be alive (it
        // writes its final record a moment before it exits). A wrapper of an earlier version
        // holds only `lock`: its pid.
        match (self.holders.get_or_init(flock_holders), wrapper_pid) {
            (None, _) => return None,
            (Some(h), _) if h.inodes.contains(&dir_ino) => return None,
            (Some(h), Some(pid)) if h.pids.contains(&pid) => return None,
            _ => {}
        }
        write_name_for(&mut self.cgroup_name, &e.name, dir_ino);
        let base = self.cgroup_name.as_str();
        let run_cgroups = run_cgroups.get_or_init(agent_run_shared::cgroup::run_cgroups);
        if run_cgroups.contains_key(base) {
            return None;
        }
        if let Some(parent) = &cgroup_parent {
            if !cgroup_gone(&mut self.cgroups, parent, base) {
                return None;
            }
        }
        let key = match fresh {
            Ok(k) => {
                let key = k.status;
                if let Some(c) = &mut self.carry {
                    c.learn(e.name.clone(), k);
                }
                key
            }
            Err(i) => {
                let c = self.carry.as_mut().expect("an entry comes from the ledger");
                c.keep(i);
                c.status_of(i)
            }
        };
        Some(Fast::Final(key))
    }

    /// Open, read and scan `ID/status.json`: the facts of a final record, `None` for anything
    /// else (not final, not a regular file of ours, too big, not what the careful path would
    /// read the same way, a cgroup that is not this run's).
    fn read_facts(&mut self, name: &str, dir_ino: u64) -> Option<Known> {
        self.path.clear();
        self.path.push_str(name);
        self.path.push_str("/status.json");
        let fd = rfs::openat2(
            &self.root,
            self.path.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
        let st = rfs::fstat(&fd).ok()?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
            || st.st_uid != self.me
            || st.st_size < 0
            || st.st_size as u64 > MAX_FAST
        {
            return None;
        }
        let size = st.st_size as usize;
        self.buf.clear();
        self.buf.resize(size + 1, 0);
        let n = rustix::io::read(&fd, &mut self.buf[..]).ok()?;
        if n != size {
            return None;
        }
        drop(fd);
        let doc = scan(&self.buf[..n])?;
        if !doc.is_final() {
            return None;
        }
        let cgroup_parent = match doc.cgroup {
            // This run's cgroup (`agent-run.<id>.<dir inode, hex>`) under an absolute parent;
            // any other name is not this run's, and the careful path says what it is.
            Some(cg) => {
                let (parent, base) = cg.rsplit_once('/')?;
                if base != name_for(name, dir_ino) || !parent.starts_with('/') {
                    return None;
                }
                Some(intern(&mut self.parents, parent))
            }
            // Held in a cgroup that the record does not name: let the careful path say so.
            None if doc.cgroup_mode => return None,
            None => None,
        };
        let ctime_ns = st.st_ctime * 1_000_000_000 + st.st_ctime_nsec as i64;
        let known = Known {
            dir_ino,
            status: Settled {
                ctime_ns,
                ino: st.st_ino,
            },
            size: size as u64,
            wrapper_pid: doc.wrapper_pid,
            cgroup_parent,
        };
        Some(known)
    }

    /// Start from the root's ledger ([`Ledger::load`]): the records it holds are not read again
    /// while unchanged.
    pub fn with_ledger(mut self, ledger: Ledger) -> Pass {
        for (_, k) in &ledger.entries {
            if let Some(p) = &k.cgroup_parent {
                if !self.parents.iter().any(|q| q == p) {
                    self.parents.push(Rc::clone(p));
                }
            }
        }
        self.carry = Some(Carry::new(ledger));
        self
    }

    /// The ledger for the next pass: every dir this pass found final for sure, except records
    /// changed within [`RACY`] (a rewrite in the same clock tick could keep their change
    /// time); `None` when it is the ledger the pass started from (nothing to write).
    pub fn into_ledger(self) -> Option<Ledger> {
        self.carry?.into_ledger(self.racy_before_ns)
    }
}

/// Whether `ID/status.json` is still the regular file of ours the ledger entry `k` was read
/// from: same inode, size and change time (one `statx`; `path` is a buffer).
fn unchanged(root: &OwnedFd, path: &mut String, me: u32, name: &str, k: &Known) -> bool {
    path.clear();
    path.push_str(name);
    path.push_str("/status.json");
    rfs::statx(
        root,
        path.as_str(),
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::TYPE | StatxFlags::UID | StatxFlags::INO | StatxFlags::SIZE | StatxFlags::CTIME,
    )
    .is_ok_and(|s| {
        FileType::from_raw_mode(s.stx_mode.into()) == FileType::RegularFile
            && s.stx_uid == me
            && s.stx_ino == k.status.ino
            && s.stx_size == k.size
            && s.stx_ctime.tv_sec * 1_000_000_000 + i64::from(s.stx_ctime.tv_nsec)
                == k.status.ctime_ns
    })
}

/// The one `Rc` of a cgroup parent among `parents` (a root's records name one or two).
fn intern(parents: &mut Vec<Rc<str>>, parent: &str) -> Rc<str> {
    if let Some(p) = parents.iter().find(|p| &***p == parent) {
        return Rc::clone(p);
    }
    let p: Rc<str> = Rc::from(parent);
    parents.push(Rc::clone(&p));
    p
}

/// Whether the cgroup `base` (this run's name) is gone from `parent`. Each parent is
/// listed once per pass: a cgroup made after that belongs to a run launched after it, whose
/// record is not final.
fn cgroup_gone(
    parents: &mut HashMap<String, Option<HashSet<String>>>,
    parent: &str,
    base: &str,
) -> bool {
    let children = parents
        .entry(parent.to_string())
        .or_insert_with(|| list_cgroups(parent));
    children.as_ref().is_some_and(|c| !c.contains(base))
}

/// The `agent-run.*` directories in `parent`; empty when it does not exist (a missing parent
/// has no child), `None` when it cannot be listed.
fn list_cgroups(parent: &str) -> Option<HashSet<String>> {
    let fd = match rfs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Some(HashSet::new()),
        Err(_) => return None,
    };
    let mut dir = rfs::Dir::new(fd).ok()?;
    let mut out = HashSet::new();
    while let Some(e) = dir.read() {
        let e = e.ok()?;
        let n = e.file_name().to_bytes();
        if n.starts_with(b"agent-run.") {
            out.insert(String::from_utf8_lossy(n).into_owned());
        }
    }
    Some(out)
}

/// What holds a flock, from /proc/locks: the pids (a wrapper of an earlier version holds only
/// its `lock` file) and the inodes (a wrapper holds its run dir's). It is a seq_file rendered
/// about a page per read(2), and lines shift when locks come and go between reads, so one
/// reading can miss a holder: the union of two readings is taken. `None` when it cannot be
/// read.
fn flock_holders() -> Option<Held> {
    let mut out = Held::default();
    for _ in 0..2 {
        let text = agent_run_shared::procfs::read_kernel_file("/proc/locks").ok()?;
        for line in text.lines() {
            // "1: FLOCK  ADVISORY  WRITE 15672 fe:00:5341426 0 EOF"; waiters ("->") hold nothing.
            let mut f = line.split_ascii_whitespace().skip(1);
            if f.next() != Some("FLOCK") {
                continue;
            }
            let mut f = f.skip(2);
            if let Some(pid) = f.next().and_then(|p| p.parse().ok()) {
                out.pids.insert(pid);
            }
            if let Some(ino) = f
                .next()
                .and_then(|d| d.rsplit(':').next())
                .and_then(|i| i.parse().ok())
            {
                out.inodes.insert(ino);
            }
        }
    }
    Some(out)
}

/// The flock holders of a pass ([`flock_holders`]).
#[derive(Default)]
struct Held {
    pids: HashSet<i32>,
    inodes: HashSet<u64>,
}

/// What the fast path reads of a record.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Doc<'a> {
    pub state: &'a str,
    /// `containment.mode` is `cgroup`.
    pub cgroup_mode: bool,
    /// `containment.cgroup`, when a string.
    pub cgroup: Option<&'a str>,
    /// `wrapper_pid`, when a number that fits.
    pub wrapper_pid: Option<i32>,
}

impl Doc<'_> {
    fn is_final(&self) -> bool {
        matches!(
            self.state,
            "finished" | "cancelled" | "launch_failed" | "unknown"
        )
    }
}

// Serde refuses a record that has one of its [`KEYS`] twice, so the scan does too: one bit of
// a u64 a key.
const _: () = assert!(KEYS.len() <= 64, "one bit of a u64 a key");

/// The keys a record must have (serde fails without them).
const REQUIRED: [&str; 11] = [
    "schema",
    "run_id",
    "state",
    "argv",
    "cwd",
    "boot_id",
    "host",
    "user",
    "uid",
    "created_at",
    "version",
];

/// The index of a record key in [`KEYS`] (a `match`: the compiler dispatches on the length
/// before comparing bytes).
fn field_index(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"schema" => 0,
        b"run_id" => 1,
        b"state" => 2,
        b"reason" => 3,
        b"exit_code" => 4,
        b"term_signal" => 5,
        b"argv" => 6,
        b"cwd" => 7,
        b"pid" => 8,
        b"pgid" => 9,
        b"sid" => 10,
        b"start_ticks" => 11,
        b"boot_id" => 12,
        b"wrapper_pid" => 13,
        b"wrapper_start_ticks" => 14,
        b"host" => 15,
        b"user" => 16,
        b"uid" => 17,
        b"created_at" => 18,
        b"started_at" => 19,
        b"ended_at" => 20,
        b"cleanup" => 21,
        b"error" => 22,
        b"version" => 23,
        b"grace_ms" => 24,
        b"hup_after_ms" => 25,
        b"warnings" => 26,
        b"argv_b64" => 27,
        b"timeout_ms" => 28,
        b"labels" => 29,
        b"env" => 30,
        b"caller_lost_at" => 31,
        b"on_disconnect" => 32,
        b"launch_exit_code" => 33,
        b"containment" => 34,
        b"resources" => 35,
        b"pty" => 36,
        b"output" => 37,
        b"proof" => 38,
        b"lease_token_sha256" => 39,
        _ => return None,
    })
}

fn required_mask() -> u64 {
    REQUIRED.iter().fold(0, |m, r| {
        m | 1
            << KEYS
                .iter()
                .position(|f| f == r)
                .expect("a required key is a field")
    })
}

/// Scan a record: one JSON object, well formed, schema 1, every required key, no known key
/// twice, `state` a plain string. `None` for anything else (the careful path then says what).
pub fn scan(bytes: &[u8]) -> Option<Doc<'_>> {
    // Valid UTF-8 as a whole (one pass), so no string needs checking on its own.
    std::str::from_utf8(bytes).ok()?;
    let mut p = Parser { b: bytes, i: 0 };
    let mut doc = Doc::default();
    let mut seen = 0u64;
    p.ws();
    p.eat(b'{')?;
    p.ws();
    if p.peek()? != b'}' {
        loop {
            p.ws();
            let key = p.string()?;
            p.ws();
            p.eat(b':')?;
            p.ws();
            if let Some(s) = field_index(key) {
                if seen & (1 << s) != 0 {
                    return None;
                }
                seen |= 1 << s;
            }
            match key {
                b"schema" => {
                    let v = p.number()?;
                    if v != SCHEMA.to_string().as_bytes() {
                        return None;
                    }
                }
                b"state" => {
                    doc.state = std::str::from_utf8(p.string()?).ok()?;
                }
                b"wrapper_pid" => {
                    if p.peek()? == b'n' {
                        p.literal(b"null")?;
                    } else {
                        doc.wrapper_pid =
                            Some(std::str::from_utf8(p.number()?).ok()?.parse().ok()?);
                    }
                }
                b"containment" => {
                    if p.peek()? == b'n' {
                        p.literal(b"null")?;
                    } else {
                        containment_obj(&mut p, &mut doc)?;
                    }
                }
                _ => p.value(0)?,
            }
            p.ws();
            match p.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    } else {
        p.next()?;
    }
    p.ws();
    let required = required_mask();
    if p.i != p.b.len() || seen & required != required {
        return None;
    }
    Some(doc)
}

fn containment_obj<'a>(p: &mut Parser<'a>, doc: &mut Doc<'a>) -> Option<()> {
    p.eat(b'{')?;
    let (mut mode, mut cg) = (false, false);
    p.ws();
    if p.peek()? == b'}' {
        p.next();
        return None; // no mode: serde would refuse it
    }
    loop {
        p.ws();
        let key = p.string()?;
        p.ws();
        p.eat(b':')?;
        p.ws();
        match key {
            b"mode" if !mode => {
                mode = true;
                match p.string()? {
                    b"cgroup" => doc.cgroup_mode = true,
                    b"procfs" => {}
                    _ => return None,
                }
            }
            b"cgroup" if !cg => {
                cg = true;
                if p.peek()? == b'n' {
                    p.literal(b"null")?;
                } else {
                    doc.cgroup = Some(std::str::from_utf8(p.string()?).ok()?);
                }
            }
            b"mode" | b"cgroup" => return None,
            _ => p.value(1)?,
        }
        p.ws();
        match p.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    mode.then_some(())
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

/// How deep a value may nest before the scan gives up (serde_json's own limit is 128).
const MAX_DEPTH: usize = 100;

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.i += 1;
        }
    }

    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Some(())
        } else {
            None
        }
    }

    /// A string without escapes or control characters, as its raw bytes ([`scan`] checked the
    /// whole document is UTF-8, and a string ends at an ASCII quote). A string
    /// with an escape is `None` where its value matters ([`Parser::skip_string`] elsewhere).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => return None,
                c if c < 0x20 => return None,
                _ => {}
            }
        }
        Some(&self.b[start..self.i - 1])
    }

    fn skip_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    let c = self.next()?;
                    if c == b'u' {
                        for _ in 0..4 {
                            if !self.next()?.is_ascii_hexdigit() {
                                return None;
                            }
                        }
                    } else if !matches!(c, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') {
                        return None;
                    }
                }
                c if c < 0x20 => return None,
                _ => {}
            }
        }
        Some(())
    }

    /// A JSON number, as its bytes (checked against the grammar).
    fn number(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.next().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.next().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        Some(&self.b[start..self.i])
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    /// Skip one well-formed value.
    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' => {
                self.i += 1;
                self.ws();
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip_string()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.value(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.value(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => continue,
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_run_shared::record::{Containment, State, Status};

    fn record(state: State) -> Status {
        let mut st = Status::blank("r1");
        st.state = state;
        st
    }

    #[test]
    fn field_index_is_the_position_in_the_records_keys() {
        for (i, key) in KEYS.iter().enumerate() {
            assert_eq!(field_index(key.as_bytes()), Some(i), "{key}");
        }
        for other in ["", "Schema", "containment_mode", "pid "] {
            assert_eq!(field_index(other.as_bytes()), None, "{other:?}");
        }
    }

    #[test]
    fn a_record_the_wrapper_writes_scans_to_its_state_and_containment() {
        for state in [
            State::Starting,
            State::Running,
            State::Cancelling,
            State::Finished,
            State::Cancelled,
            State::LaunchFailed,
            State::Unknown,
        ] {
            let mut st = record(state);
            st.containment = Some(Containment::cgroup(Path::new(
                "/sys/fs/cgroup/x/agent-run.r1.1f",
            )));
            st.argv = vec!["a \"quoted\" \\ arg\n".into(), "é".into()];
            let json = st.to_json();
            let doc = scan(json.as_bytes()).unwrap_or_else(|| panic!("{json}"));
            assert_eq!(doc.state, state.as_str());
            assert_eq!(doc.is_final(), state.is_final());
            assert!(doc.cgroup_mode);
            assert_eq!(doc.cgroup, Some("/sys/fs/cgroup/x/agent-run.r1.1f"));
            // And compact JSON as well as the pretty one.
            let compact = serde_json::to_string(&st).unwrap();
            assert_eq!(scan(compact.as_bytes()).unwrap().state, state.as_str());
        }
        let mut st = record(State::Finished);
        st.containment = Some(Containment::procfs());
        let json = st.to_json();
        let doc = scan(json.as_bytes()).unwrap();
        assert!(!doc.cgroup_mode);
        assert_eq!(doc.cgroup, None);
    }

    #[test]
    fn anything_the_careful_parse_would_refuse_or_read_otherwise_is_not_fast() {
        let good = record(State::Finished).to_json();
        assert!(scan(good.as_bytes()).is_some());
        let v: serde_json::Value = serde_json::from_str(&good).unwrap();
        let cases: Vec<String> = vec![
            // cut in half, or with trailing junk
            good[..good.len() / 2].to_string(),
            format!("{good}x"),
            format!("{good}{{}}"),
            // a second state key (serde refuses duplicates), before or after
            good.replacen('{', "{\"state\": \"running\",", 1),
            good.replacen(
                "\"state\": \"finished\"",
                "\"state\": \"finished\", \"state\": \"running\"",
                1,
            ),
            good.replacen("\"cwd\"", "\"pid\": 1, \"cwd\"", 1),
            // an escaped state (not the plain spelling), another schema, a key missing
            good.replacen("\"finished\"", "\"fin\\u0069shed\"", 1),
            good.replacen("\"schema\": 1", "\"schema\": 2", 1),
            good.replacen("\"schema\": 1", "\"schema\": 1.0", 1),
            good.replacen("\"run_id\"", "\"run_idx\"", 1),
            // the state inside a string or a nested object does not count
            serde_json::to_string(&{
                let mut m = v.as_object().unwrap().clone();
                m.remove("state");
                m.insert("note".into(), serde_json::json!({"state": "finished"}));
                m
            })
            .unwrap(),
            // not an object, nothing, invalid UTF-8
            "[]".into(),
            String::new(),
        ];
        for c in &cases {
            assert!(scan(c.as_bytes()).is_none(), "scanned as fast: {c}");
        }
        let mut bad = good.clone().into_bytes();
        let at = good.find("\"cwd\": \"").unwrap() + 8;
        bad.insert(at, 0xff);
        assert!(scan(&bad).is_none());
        // A state nested deeper than serde would go is refused, not recursed into.
        let deep = good.replacen(
            "\"labels\": {}",
            &format!("\"labels\": {}1{}", "[".repeat(500), "]".repeat(500)),
            1,
        );
        assert!(scan(deep.as_bytes()).is_none());
    }

    /// A root with one run dir `r1` whose status.json is `json`, and a pass over it from
    /// `ledger` that enters even a record changed a moment ago (the test waits out the clock
    /// tick instead of the racy window).
    struct Scratch {
        _tmp: tempfile::TempDir,
        root: std::path::PathBuf,
    }

    impl Scratch {
        fn new(json: &str) -> Scratch {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("root");
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&root)
                .unwrap();
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(root.join("r1"))
                .unwrap();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(root.join("r1/status.json"))
                .unwrap();
            std::io::Write::write_all(&mut f, json.as_bytes()).unwrap();
            Scratch { _tmp: tmp, root }
        }

        fn status(&self) -> std::path::PathBuf {
            self.root.join("r1/status.json")
        }

        fn pass(&self, ledger: Ledger) -> (Fast, Pass) {
            let fd = open_root(&self.root).unwrap();
            let ents = entries(&fd).unwrap();
            let mut p = Pass::new(fd).with_ledger(ledger);
            p.racy_before_ns = i64::MAX;
            let e = ents.iter().find(|e| e.name == "r1").expect("r1 is listed");
            (p.classify(e, &std::cell::OnceCell::new()), p)
        }
    }

    /// The change time of a file made now, once it is past `t` (on a filesystem with coarse
    /// timestamps, a write in the same tick as `t` could carry `t` itself).
    fn wait_for_a_later_ctime(dir: &Path, t: i64) {
        use std::os::unix::fs::MetadataExt;
        let probe = dir.join("probe");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            std::fs::write(&probe, b"x").unwrap();
            let m = std::fs::metadata(&probe).unwrap();
            if m.ctime() * 1_000_000_000 + m.ctime_nsec() > t {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the clock did not tick"
            );
        }
    }

    fn ctime_ns(path: &Path) -> i64 {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path).unwrap();
        m.ctime() * 1_000_000_000 + m.ctime_nsec()
    }

    #[test]
    fn a_ledger_entry_serves_while_its_record_is_unchanged_and_a_rewrite_in_place_is_seen() {
        use std::os::unix::fs::MetadataExt;
        let done = record(State::Finished).to_json();
        let s = Scratch::new(&done);
        let (first, p) = s.pass(Ledger::default());
        assert!(matches!(first, Fast::Final(_)), "{first:?}");
        let ledger = p.into_ledger().expect("the new final dir is entered");
        assert_eq!(ledger.entries.len(), 1);
        assert_eq!(ledger.entries[0].0, "r1");

        // Unchanged: the ledger serves, the same key comes out, nothing to write.
        let (again, p) = s.pass(ledger.clone());
        assert_eq!(again, first);
        assert_eq!(p.carry.as_ref().unwrap().kept(), 1);
        assert!(p.into_ledger().is_none());

        // Rewritten in place: the same inode and size, the mtime put back. The change time
        // tells.
        let before = std::fs::metadata(s.status()).unwrap();
        wait_for_a_later_ctime(&s.root, ctime_ns(&s.status()));
        let running = done.replacen("\"finished\"", "\"running\" ", 1);
        assert_eq!(running.len(), done.len());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(s.status())
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, running.as_bytes(), 0).unwrap();
        f.set_modified(before.modified().unwrap()).unwrap();
        drop(f);
        let after = std::fs::metadata(s.status()).unwrap();
        assert_eq!(
            (after.ino(), after.len(), after.mtime(), after.mtime_nsec()),
            (
                before.ino(),
                before.len(),
                before.mtime(),
                before.mtime_nsec()
            )
        );
        let (changed, p) = s.pass(ledger);
        assert_eq!(
            changed,
            Fast::Careful,
            "the rewritten record was taken as final"
        );
        assert_eq!(p.carry.as_ref().unwrap().kept(), 0);
        let next = p.into_ledger().expect("the entry is dropped");
        assert!(next.entries.is_empty());
    }

    /// The ledger is the workload's to rewrite: what it says is a record's claim, and the
    /// kernel's facts are checked for it as for a record read afresh.
    #[test]
    fn a_forged_ledger_entry_does_not_hide_a_wrapper_that_holds_a_lock() {
        use std::os::fd::AsFd;
        let s = Scratch::new(&record(State::Finished).to_json());
        let (_, p) = s.pass(Ledger::default());
        let mut ledger = p.into_ledger().unwrap();
        let lock = std::fs::File::create(s.root.join("held")).unwrap();
        assert!(agent_run_shared::sys::try_lock_exclusive(lock.as_fd()).unwrap());
        ledger.entries[0].1.wrapper_pid = Some(std::process::id() as i32);
        let (f, p) = s.pass(ledger.clone());
        assert_eq!(f, Fast::Careful);
        assert_eq!(p.carry.as_ref().unwrap().kept(), 0);
        // A stale inode or change time is no entry either.
        drop(lock);
        for forge in [
            |k: &mut Known| k.status.ino += 1,
            |k: &mut Known| k.status.ctime_ns -= 1,
            |k: &mut Known| k.size += 1,
            |k: &mut Known| k.dir_ino += 1,
        ] {
            let mut l = ledger.clone();
            l.entries[0].1.wrapper_pid = None;
            forge(&mut l.entries[0].1);
            let (f, p) = s.pass(l);
            assert!(matches!(f, Fast::Final(_)), "read afresh: {f:?}");
            assert_eq!(
                p.carry.as_ref().unwrap().kept(),
                0,
                "a forged entry was kept"
            );
        }
    }
}
