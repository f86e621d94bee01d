//! The first look of a full pass at each entry of the root: is this run dir final for sure,
//! with nothing to do? A root of 100,000 finished runs then costs a few syscalls relative to
//! the root's fd per dir, instead of the careful path's absolute path walks and lock probes.
//!
//! It decides one thing only: "final, nothing to do". Anything it is not sure of goes to the
//! careful path ([`crate::assess::assess`]: `open_run_dir`, `read_status`, the kernel's
//! checks), which decides as it always did. Per entry of the root (`getdents`, whose `d_type`
//! tells a directory without a stat):
//!
//! - the entry is a directory, its name a valid run id, and `statx` relative to the root's fd
//!   says it is ours, mode without group/other bits: the careful path's own checks;
//! - the record's facts come from the ledger ([`crate::ledger`], `--once` only) while `statx`
//!   says status.json is still the regular file of ours they were read from (inode, size,
//!   change time); otherwise it is read:
//! - `openat2(root, "ID/status.json", O_NOFOLLOW|O_NONBLOCK, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)`:
//!   no symlink anywhere on the way, never a blocked open; `fstat`: a regular file of ours, at
//!   most [`MAX_READ`] bytes; one `read` of `st_size + 1` bytes that must return exactly the
//!   size;
//! - a [`Peek`] at the record (serde_json, the fields it reads): what the careful path would
//!   refuse or read otherwise is refused, and the state must be final;
//! - no live wrapper: no flock on the run dir's inode, and none held by the record's
//!   `wrapper_pid` ([`Flocks`], /proc/locks read once per pass, on first need: a wrapper holds
//!   its run's lock for its whole life, and writes its final record a moment before it exits);
//! - no live cgroup: no run cgroup of this run on the cgroup2 mount, and a record held in a
//!   cgroup names `agent-run.<id>.<dir inode>` (the careful path's check), which is gone (it is
//!   removed after the final record; each cgroup parent is listed once per pass).
//!
//! A workload can write a final record of its own while its processes live: the careful path
//! takes a parsable final record as final too, so the pass never skips a run the careful path
//! would act on; the kernel's facts above are checked on top. They are not proof against a
//! workload that also rewrites `wrapper_pid` and drops `containment`: such a record is taken as
//! final by the careful path too.

use crate::held::{CgroupParents, Flocks};
use crate::ledger::{Carry, Known, Ledger, Settled, RACY};
use agent_run_shared::cgroup::{name_for, RunCgroups};
use agent_run_shared::id::RunId;
use agent_run_shared::peek::Peek;
use agent_run_shared::pid::ClaimedPid;
use agent_run_shared::record::ContainmentMode;
use agent_run_shared::sweep::read_plain;
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, StatxFlags};
use std::cell::OnceCell;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;

pub use agent_run_shared::sweep::MAX_READ;

pub use agent_run_shared::root::Entry;

/// The root, opened for a pass, and the entries in it that could be run dirs (a failure is
/// logged: the pass then has nothing to do).
pub fn list(root: &agent_run_shared::root::Root) -> Option<(OwnedFd, Vec<Entry>)> {
    let listed = open_root(root.path()).and_then(|fd| {
        let ents = agent_run_shared::root::entries(fd.as_fd())?;
        Ok((fd, ents))
    });
    match listed {
        Ok(l) => Some(l),
        Err(e) => {
            let root = root.path().display();
            crate::report::log(&format!("cannot list {root}: {e}"));
            None
        }
    }
}

/// Open the root for a pass (a directory, never through a symlink at its last component).
pub fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// What one pass knows about the host, gathered once: who we are, the flocks held, the cgroup
/// parents listed so far, and the ledger it started from.
pub struct Pass {
    root: OwnedFd,
    me: u32,
    /// Read on first need (a pass over runs that are not final never reads /proc/locks); the
    /// inner `None`: it could not be read whole, so every wrapper counts as possibly alive.
    flocks: OnceCell<Option<Flocks>>,
    cgroups: CgroupParents,
    /// `None` in a pass without a ledger (the daemon's: it settles runs in memory).
    carry: Option<Carry>,
    /// Change times after this (ns since the epoch) are too recent to enter the ledger.
    racy_before_ns: i64,
    /// The cgroup parents the records name, each once (a root's records name one or two).
    parents: Vec<Rc<str>>,
    /// The buffer records are read into.
    buf: Vec<u8>,
}

impl Pass {
    /// A pass over the root open at `root` ([`open_root`]).
    pub fn new(root: OwnedFd) -> Pass {
        Pass {
            root,
            me: rustix::process::geteuid().as_raw(),
            flocks: OnceCell::new(),
            cgroups: CgroupParents::default(),
            carry: None,
            racy_before_ns: racy_before_ns(),
            parents: Vec::new(),
            buf: Vec::new(),
        }
    }

    /// Start from the root's ledger ([`Ledger::load`]): the records it holds are not read again
    /// while unchanged.
    pub fn with_ledger(mut self, ledger: Ledger) -> Pass {
        for (_, k) in &ledger.entries {
            if let Some(p) = &k.cgroup_parent {
                if !self.parents.contains(p) {
                    self.parents.push(Rc::clone(p));
                }
            }
        }
        self.carry = Some(Carry::new(ledger));
        self
    }

    /// The ledger for the next pass: every dir this pass found final for sure, except records
    /// changed within [`RACY`]; `None` when it is the ledger the pass started from.
    pub fn into_ledger(self) -> Option<Ledger> {
        self.carry?.into_ledger(self.racy_before_ns)
    }

    /// The root this pass lists.
    pub fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// Whether the run dir `e` is final for sure: its status.json's key ([`Settled`]), which
    /// the daemon settles it under; `None`: the careful path decides. `run_cgroups` is every
    /// run cgroup on the cgroup2 mount by name, walked once per pass on first need (the
    /// careful path of the same pass uses the same walk).
    pub fn classify(&mut self, e: &Entry, run_cgroups: &OnceCell<RunCgroups>) -> Option<Settled> {
        if e.is_dir != Some(true) || !RunId::is_valid(&e.name) {
            return None;
        }
        let dir_ino = self.run_dir_inode(&e.name)?;
        // The name of the run's cgroup: `agent-run.<id>.<dir inode, hex>`.
        let base = name_for(&e.name, dir_ino);
        let (known, kept) = match self.carried(&e.name, dir_ino) {
            Some(k) => (k, true),
            None => (self.read_known(&e.name, dir_ino, &base)?, false),
        };
        if self.may_be_held(&base, &known, run_cgroups) {
            return None;
        }
        let key = known.status;
        if let Some(c) = &mut self.carry {
            c.note(e.name.clone(), known, kept);
        }
        Some(key)
    }

    /// The careful path's run dir checks, by one `statx`: ours, a directory, mode without
    /// group/other bits. Its inode.
    fn run_dir_inode(&self, name: &str) -> Option<u64> {
        let mask = StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::UID | StatxFlags::INO;
        let d = rfs::statx(&self.root, name, AtFlags::SYMLINK_NOFOLLOW, mask).ok()?;
        let ok = FileType::from_raw_mode(d.stx_mode.into()) == FileType::Directory
            && d.stx_uid == self.me
            && u32::from(d.stx_mode) & 0o077 == 0;
        ok.then_some(d.stx_ino)
    }

    /// The ledger's entry for `name`, while its status.json is still the regular file of ours
    /// it was read from: same inode, size and change time (one `statx`).
    fn carried(&mut self, name: &str, dir_ino: u64) -> Option<Known> {
        let k = self.carry.as_mut()?.take(name)?;
        let mask = StatxFlags::TYPE
            | StatxFlags::UID
            | StatxFlags::INO
            | StatxFlags::SIZE
            | StatxFlags::CTIME;
        let path = format!("{name}/status.json");
        let s = rfs::statx(&self.root, path, AtFlags::SYMLINK_NOFOLLOW, mask).ok()?;
        let same = k.dir_ino == dir_ino
            && FileType::from_raw_mode(s.stx_mode.into()) == FileType::RegularFile
            && s.stx_uid == self.me
            && s.stx_ino == k.status.ino
            && s.stx_size == k.size
            && ctime_ns(s.stx_ctime.tv_sec, s.stx_ctime.tv_nsec.into()) == k.status.ctime_ns;
        same.then_some(k)
    }

    /// Open, read and parse `ID/status.json`: the facts of a final record, `None` for anything
    /// else (not final, not a regular file of ours, too big, refused by the record's parse, a
    /// cgroup that is not this run's).
    fn read_known(&mut self, name: &str, dir_ino: u64, base: &str) -> Option<Known> {
        let (st, n) = read_plain(self.root.as_fd(), name, self.me, &mut self.buf)?;
        let size = n as u64;
        let record = Peek::of(&self.buf[..n])?;
        if !record.state.is_final() {
            return None;
        }
        let cgroup_parent = match record.containment {
            // This run's cgroup (`base`) under an absolute parent
            // (one the ledger can hold: no control character); any other name is not this
            // run's, and the careful path says what it is.
            Some(c) if c.mode == ContainmentMode::Cgroup => {
                let cg = c.cgroup?;
                let (parent, named) = cg.rsplit_once('/')?;
                if named != base || !parent.starts_with('/') || parent.chars().any(char::is_control)
                {
                    return None;
                }
                Some(intern(&mut self.parents, parent))
            }
            _ => None,
        };
        Some(Known {
            dir_ino,
            status: Settled {
                ctime_ns: ctime_ns(st.st_ctime, st.st_ctime_nsec as i64),
                ino: st.st_ino,
            },
            size,
            wrapper_pid: record.wrapper_pid.and_then(ClaimedPid::pid),
            cgroup_parent,
        })
    }

    /// Whether the kernel says anything may still hold the run: a flock of its wrapper (the
    /// record cannot name another inode than the run dir's own), a run cgroup of this run
    /// anywhere (a forged record may name another or none), or the cgroup the record names.
    fn may_be_held(&mut self, base: &str, k: &Known, run_cgroups: &OnceCell<RunCgroups>) -> bool {
        match self.flocks.get_or_init(Flocks::read) {
            Some(f) if !f.may_hold(k.dir_ino, k.wrapper_pid) => {}
            _ => return true,
        }
        let all = run_cgroups.get_or_init(agent_run_shared::cgroup::run_cgroups);
        if all.contains_key(base) {
            return true;
        }
        k.cgroup_parent
            .as_ref()
            .is_some_and(|p| !self.cgroups.gone(p, base))
    }
}

/// The one `Rc` of a cgroup parent among `parents`.
fn intern(parents: &mut Vec<Rc<str>>, parent: &str) -> Rc<str> {
    if let Some(p) = parents.iter().find(|p| &***p == parent) {
        return Rc::clone(p);
    }
    let p: Rc<str> = Rc::from(parent);
    parents.push(Rc::clone(&p));
    p
}

fn ctime_ns(sec: i64, nsec: i64) -> i64 {
    sec * 1_000_000_000 + nsec
}

/// Now minus [`RACY`], in ns since the epoch.
fn racy_before_ns() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.saturating_sub(RACY).as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_run_shared::pid::Pid;
    use agent_run_shared::record::{State, Status};

    fn record(state: State) -> Status {
        let mut st = Status::blank("r1");
        st.state = state;
        st
    }

    /// A root with one run dir `r1` whose status.json is `json`, and a pass over it from
    /// `ledger` that enters even a record changed a moment ago (the test waits out the clock
    /// tick instead of the racy window).
    struct Scratch {
        _tmp: tempfile::TempDir,
        root: std::path::PathBuf,
    }

    impl Scratch {
        fn new(json: impl AsRef<[u8]>) -> Scratch {
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
            std::io::Write::write_all(&mut f, json.as_ref()).unwrap();
            Scratch { _tmp: tmp, root }
        }

        fn status(&self) -> std::path::PathBuf {
            self.root.join("r1/status.json")
        }

        fn pass(&self, ledger: Ledger) -> (Option<Settled>, Pass) {
            let fd = open_root(&self.root).unwrap();
            let ents = agent_run_shared::root::entries(fd.as_fd()).unwrap();
            let mut p = Pass::new(fd).with_ledger(ledger);
            p.racy_before_ns = i64::MAX;
            let e = ents.iter().find(|e| e.name == "r1").expect("r1 is listed");
            (p.classify(e, &std::cell::OnceCell::new()), p)
        }
    }

    /// What the record's parse refuses, and a record that is not final or names a cgroup that
    /// is not this run's, is never final for the pass: the careful path says what it is.
    #[test]
    fn anything_the_careful_parse_would_refuse_or_read_otherwise_is_not_final() {
        use agent_run_shared::record::Containment;
        let good = record(State::Finished).to_json();
        let (f, _) = Scratch::new(&good).pass(Ledger::default());
        assert!(f.is_some(), "the control is not final");
        let v: serde_json::Value = serde_json::from_str(&good).unwrap();
        let mut nested = v.as_object().unwrap().clone();
        nested.remove("state");
        nested.insert("note".into(), serde_json::json!({"state": "finished"}));
        let held = |cgroup: &str| {
            let mut st = record(State::Finished);
            st.containment = Some(Containment::cgroup(Path::new(cgroup)));
            st.to_json()
        };
        let mut no_name = record(State::Finished);
        no_name.containment = Some(Containment::cgroup(Path::new("/x")));
        no_name.containment.as_mut().unwrap().cgroup = None;
        let cases: Vec<String> = vec![
            // cut in half, or with trailing junk
            good[..good.len() / 2].to_string(),
            format!("{good}x"),
            format!("{good}{{}}"),
            // a key twice (serde refuses duplicates), before or after
            good.replacen('{', "{\"state\": \"running\",", 1),
            good.replacen("\"cwd\"", "\"pid\": 1, \"cwd\"", 1),
            // another schema, a key missing, a key the pass reads of another type (the others
            // are checked as JSON only: crate::peek)
            good.replacen("\"schema\": 1", "\"schema\": 2", 1),
            good.replacen("\"schema\": 1", "\"schema\": 1.0", 1),
            good.replacen("\"run_id\"", "\"run_idx\"", 1),
            good.replacen("\"wrapper_pid\": null", "\"wrapper_pid\": \"1\"", 1),
            good.replacen("\"finished\"", "\"done\"", 1),
            // the state inside a nested object does not count
            serde_json::Value::Object(nested).to_string(),
            // a state nested deeper than serde goes
            good.replacen(
                "\"state\": \"finished\"",
                &format!("\"state\": {}1{}", "[".repeat(500), "]".repeat(500)),
                1,
            ),
            // not an object, nothing
            "[]".into(),
            String::new(),
            // not final
            record(State::Running).to_json(),
            record(State::Cancelling).to_json(),
            // held in a cgroup that is not this run's, or not named, or not absolute
            held("/sys/fs/cgroup/agent-run.r2.1f"),
            held("sys/fs/cgroup/agent-run.r1.1f"),
            no_name.to_json(),
        ];
        for c in &cases {
            assert_ne!(c, &good);
            let (f, p) = Scratch::new(c).pass(Ledger::default());
            assert_eq!(f, None, "final for the pass: {c}");
            assert!(p.into_ledger().is_none(), "entered: {c}");
        }
        // A value nested 30,000 deep in a key the pass does not read costs no stack: serde
        // skips it without recursion (the careful path then refuses it by its type).
        let deep = good.replacen(
            "\"labels\": {}",
            &format!("\"labels\": {}1{}", "[".repeat(30_000), "]".repeat(30_000)),
            1,
        );
        let _ = Scratch::new(deep).pass(Ledger::default());
        let mut bad = good.clone().into_bytes();
        let at = good.find("\"cwd\": \"").unwrap() + 8;
        bad.insert(at, 0xff);
        let (f, _) = Scratch::new(&bad).pass(Ledger::default());
        assert_eq!(f, None, "invalid UTF-8 is final for the pass");
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
        assert!(first.is_some(), "{first:?}");
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
        assert_eq!(changed, None, "the rewritten record was taken as final");
        assert_eq!(p.carry.as_ref().unwrap().kept(), 0);
        let next = p.into_ledger().expect("the entry is dropped");
        assert!(next.entries.is_empty());
    }

    /// The ledger is the workload's to rewrite: what it says is a record's claim, and the
    /// kernel's facts are checked for it as for a record read afresh.
    #[test]
    fn a_forged_ledger_entry_does_not_hide_a_wrapper_that_holds_a_lock() {
        use std::os::fd::AsFd;
        let s = Scratch::new(record(State::Finished).to_json());
        let (_, p) = s.pass(Ledger::default());
        let mut ledger = p.into_ledger().unwrap();
        let lock = std::fs::File::create(s.root.join("held")).unwrap();
        assert!(agent_run_shared::sys::try_lock_exclusive(lock.as_fd()).unwrap());
        ledger.entries[0].1.wrapper_pid = Some(Pid::this());
        let (f, p) = s.pass(ledger.clone());
        assert_eq!(f, None);
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
            assert!(f.is_some(), "read afresh: {f:?}");
            assert_eq!(
                p.carry.as_ref().unwrap().kept(),
                0,
                "a forged entry was kept"
            );
        }
    }
}
