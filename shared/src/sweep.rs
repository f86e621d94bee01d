//! A sweep over every run of a root (`list`, `status --all`, `gc`, the watchdog's retention):
//! what is read once for all runs, and the cheap look at one run dir that says "final, and the
//! kernel agrees that nothing holds it".
//!
//! [`Sweep::settled`] reads a run by a few syscalls relative to the root's descriptor: one
//! `statx` of the dir (ours, a directory, mode 0700: the careful open's checks, with nothing to
//! repair), one `openat2` of `ID/status.json` that follows no symlink, one `fstat` (a regular
//! file of ours, at most [`MAX_READ`] bytes) and one `read`. A [`Peek`] at the record (it
//! refuses what the record's own parse refuses) says what it says. The kernel's facts come
//! from what the sweep reads once: the flocks of the host ([`Flocks`], /proc/locks), the run cgroups of the cgroup2 mount
//! ([`run_cgroups`]), and the `agent-run.*` children of each cgroup parent a record names
//! ([`CgroupParents`]).
//!
//! It answers one question only. Anything it is not sure of (not final, any flock that may be
//! the run's, a cgroup of the run anywhere, a dir or file it would not read the same way) is
//! `None`: the caller takes the careful path (`Root::open_run_dir`, `read_status`,
//! [`crate::verdict::Look`]), which decides as it always did and says why.

use crate::cgroup::{name_for, run_cgroups, RunCgroups};
use crate::held::{CgroupParents, Flocks};
use crate::id::RunId;
use crate::peek::Peek;
use crate::root::Root;
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};
use std::cell::OnceCell;
use std::os::fd::BorrowedFd;

/// The largest status.json a sweep reads (a record is about 1.5 KiB; a long argv makes it
/// larger, and then the careful path reads it).
pub const MAX_READ: u64 = 64 << 10;

/// What one sweep over a root reads once, and the buffer its records are read into.
pub struct Sweep<'r> {
    facts: Facts<'r>,
    buf: Vec<u8>,
}

/// The kernel's facts a sweep reads once, on first need.
struct Facts<'r> {
    root: &'r Root,
    me: u32,
    /// `None` inside: /proc/locks could not be read, so every run may be held.
    flocks: OnceCell<Option<Flocks>>,
    cgroups: OnceCell<RunCgroups>,
    parents: CgroupParents,
}

/// A record read by [`Sweep::record`]; from [`Sweep::settled`], a final one nobody holds. It
/// borrows the sweep's buffer until the next read.
pub struct Settled<'b> {
    /// The run dir's inode.
    pub dir_ino: u64,
    pub record: Peek<'b>,
}

impl<'r> Sweep<'r> {
    /// A sweep over `root`; nothing is read until asked.
    pub fn new(root: &'r Root) -> Sweep<'r> {
        let facts = Facts {
            root,
            me: rustix::process::geteuid().as_raw(),
            flocks: OnceCell::new(),
            cgroups: OnceCell::new(),
            parents: CgroupParents::default(),
        };
        Sweep {
            facts,
            buf: Vec::new(),
        }
    }

    /// The run cgroups of the cgroup2 mount, walked once per sweep (the careful path of the
    /// same sweep shares the walk).
    pub fn cgroups(&self) -> &RunCgroups {
        self.facts.cgroups()
    }

    /// The run `name`'s final record, when it is plain and the kernel agrees that nothing
    /// holds the run; `None`: the careful path decides (see the module doc).
    pub fn settled(&mut self, name: &str) -> Option<Settled<'_>> {
        let (dir_ino, n) = self.read(name)?;
        let record = Peek::of(&self.buf[..n])?;
        if !record.state.is_final() || self.facts.may_be_held(name, dir_ino, &record) {
            return None;
        }
        Some(Settled { dir_ino, record })
    }

    /// The run `name`'s record, when its dir and status.json are plain (see the module doc),
    /// whatever its state and whoever holds the run: what a caller that goes on only for
    /// some records (retention: final and old) reads first.
    pub fn record(&mut self, name: &str) -> Option<Settled<'_>> {
        let (dir_ino, n) = self.read(name)?;
        let record = Peek::of(&self.buf[..n])?;
        Some(Settled { dir_ino, record })
    }

    /// The run dir's inode and `ID/status.json` read as [`read_plain`] reads it, into the
    /// buffer: its length.
    fn read(&mut self, name: &str) -> Option<(u64, usize)> {
        if !RunId::is_valid(name) {
            return None;
        }
        let dir_ino = self.facts.run_dir_inode(name)?;
        let f = &self.facts;
        let (_, n) = read_plain(f.root.fd(), name, f.me, &mut self.buf)?;
        Some((dir_ino, n))
    }
}

impl Facts<'_> {
    fn cgroups(&self) -> &RunCgroups {
        self.cgroups.get_or_init(run_cgroups)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.root.fd()
    }

    /// The careful open's checks of the run dir, by one `statx`: ours, a directory, mode 0700
    /// (any other mode the careful open sets back, and says so). Its inode.
    fn run_dir_inode(&self, name: &str) -> Option<u64> {
        let mask = StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::UID | StatxFlags::INO;
        let d = rfs::statx(self.fd(), name, AtFlags::SYMLINK_NOFOLLOW, mask).ok()?;
        let ok = FileType::from_raw_mode(d.stx_mode.into()) == FileType::Directory
            && d.stx_uid == self.me
            && u32::from(d.stx_mode) & 0o7777 == 0o700;
        ok.then_some(d.stx_ino)
    }

    /// Whether the kernel says anything may hold the run: a flock on its dir, on its `lock`
    /// file, or by the pid its record names as its wrapper; a run cgroup of its name anywhere
    /// on the mount, or under the parent its record names.
    fn may_be_held(&mut self, name: &str, dir_ino: u64, st: &Peek) -> bool {
        let Some(flocks) = self.flocks.get_or_init(Flocks::read) else {
            return true;
        };
        let wrapper = st.wrapper_pid.and_then(|p| p.pid());
        if flocks.may_hold(dir_ino, wrapper) {
            return true;
        }
        // The `lock` file's inode is asked only while some flock is held on the host.
        if !flocks.none() {
            let path = format!("{name}/lock");
            let lock = rfs::statx(self.fd(), path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::INO);
            if lock.is_ok_and(|l| flocks.on_inode(l.stx_ino)) {
                return true;
            }
        }
        let base = name_for(name, dir_ino);
        if self.cgroups().contains_key(&base) {
            return true;
        }
        // The cgroup the record names, where it is named for this run (a name that is not
        // this run's is no hint of where its cgroup is: the careful look ignores it too).
        let named = st.containment.as_ref().and_then(|c| c.cgroup);
        match named.and_then(|cg| cg.rsplit_once('/')) {
            Some((parent, last)) if last == base => {
                !parent.starts_with('/') || !self.parents.gone(parent, &base)
            }
            _ => false,
        }
    }
}

/// `ID/status.json` under the root `root`, opened without following a symlink anywhere: a
/// regular file of `uid`, at most [`MAX_READ`] bytes, read whole by one `read` into `buf`. Its
/// `fstat` and its length; `None` for anything else.
pub fn read_plain(
    root: BorrowedFd<'_>,
    name: &str,
    uid: u32,
    buf: &mut Vec<u8>,
) -> Option<(rfs::Stat, usize)> {
    let fd = rfs::openat2(
        root,
        format!("{name}/status.json"),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    let st = rfs::fstat(&fd).ok()?;
    let size = u64::try_from(st.st_size).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_uid != uid
        || size > MAX_READ
    {
        return None;
    }
    // One byte more than the size: a file that grew since the fstat is not read in part.
    buf.resize(size as usize + 1, 0);
    let n = rustix::io::read(&fd, &mut buf[..]).ok()?;
    (n as u64 == size).then_some((st, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{State, Status};
    use std::os::unix::fs::PermissionsExt;

    /// A root holding the run `r1` whose status.json is the record in `state`.
    fn root_with(state: State) -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("root");
        let root = Root::open(&path, true).unwrap();
        let dir = root
            .create_run_dir(&RunId::parse("r1").unwrap())
            .unwrap()
            .unwrap();
        let mut st = Status::blank("r1");
        st.state = state;
        dir.write_atomic("status.json", st.to_json().as_bytes(), false)
            .unwrap();
        (d, root)
    }

    #[test]
    fn a_plain_final_record_nobody_holds_is_settled_and_anything_else_is_not() {
        let (_d, root) = root_with(State::Finished);
        let got = Sweep::new(&root).settled("r1").map(|s| s.record.state);
        assert_eq!(got, Some(State::Finished));
        assert!(Sweep::new(&root).settled("nope").is_none());
        assert!(Sweep::new(&root).settled("../r1").is_none());

        let (_d, running) = root_with(State::Running);
        assert!(Sweep::new(&running).settled("r1").is_none());

        // A mode the careful open would set back: the careful path reads it.
        let dir = root.path().join("r1");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Sweep::new(&root).settled("r1").is_none());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();

        // A record behind a symlink is not read.
        let real = dir.join("real.json");
        std::fs::rename(dir.join("status.json"), &real).unwrap();
        std::os::unix::fs::symlink(&real, dir.join("status.json")).unwrap();
        assert!(Sweep::new(&root).settled("r1").is_none());
    }

    #[test]
    fn a_flock_on_the_run_dir_or_its_lock_file_keeps_it_from_being_settled() {
        let (_d, root) = root_with(State::Finished);
        for name in ["", "lock"] {
            let path = root.path().join("r1").join(name);
            if !name.is_empty() {
                std::fs::write(&path, b"").unwrap();
            }
            let f = std::fs::File::open(&path).unwrap();
            assert!(crate::sys::try_lock_exclusive(std::os::fd::AsFd::as_fd(&f)).unwrap());
            assert!(Sweep::new(&root).settled("r1").is_none(), "held: {name:?}");
            drop(f);
        }
        assert!(Sweep::new(&root).settled("r1").is_some());
    }
}
