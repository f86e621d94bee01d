//! Who holds a flock(2), from /proc/locks.

use super::*;

/// /proc/locks read once: the flock holders of every locked inode, for a caller that asks
/// about many runs (`list`, `gc`, a watchdog pass). A lock taken or let go after the read is
/// not in it.
#[derive(Debug, Default, Clone)]
pub struct LockTable {
    held: std::collections::HashMap<(u64, u64, u64), Vec<Pid>>,
}

impl LockTable {
    /// Read /proc/locks.
    pub fn read() -> LockTable {
        let mut held: std::collections::HashMap<(u64, u64, u64), Vec<Pid>> = Default::default();
        if let Ok(text) = read_kernel_file("/proc/locks") {
            for (maj, min, ino, pid) in text.lines().filter_map(parse_lock_line) {
                // 0: a holder outside our pid namespace, which has no pid here.
                if let Some(pid) = Pid::new(pid.into()) {
                    held.entry((maj, min, ino)).or_default().push(pid);
                }
            }
        }
        LockTable { held }
    }

    /// The pids holding a flock on (device, inode).
    pub fn holders(&self, dev: u64, ino: u64) -> Vec<Pid> {
        let key = (libc::major(dev) as u64, libc::minor(dev) as u64, ino);
        self.held.get(&key).cloned().unwrap_or_default()
    }
}

/// The pids holding a `flock(2)` on the file (device, inode), from /proc/locks: the kernel's own
/// account, which no file of a run dir can forge. Waiters (`->` lines) are not holders.
///
/// /proc/locks is a seq_file: the kernel renders about a page per read(2) and finds its place
/// again by position, so lines shift when locks come and go between reads and a holder can be
/// missed (seen with 200 runs locking at once). Callers that know the lock is held and find no
/// holder look again ([`flock_holders_of_held`]); to confirm one process, ask its own fdinfo
/// ([`holds_flock`]).
pub fn flock_holders(dev: u64, ino: u64) -> Vec<i32> {
    let Ok(text) = read_kernel_file("/proc/locks") else {
        return Vec::new();
    };
    let (maj, min) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    text.lines()
        .filter_map(parse_lock_line)
        .filter(|&(m, n, i, _)| (m, n, i) == (maj, min, ino))
        .map(|(_, _, _, pid)| pid)
        .collect()
}

/// [`flock_holders`] for a lock known to be held: look a few times before answering none.
pub fn flock_holders_of_held(dev: u64, ino: u64) -> Vec<i32> {
    for _ in 0..5 {
        let h = flock_holders(dev, ino);
        if !h.is_empty() {
            return h;
        }
    }
    Vec::new()
}

/// Whether `pid` itself took and holds a `flock(2)` on the file (device, inode): one of its
/// descriptors (/proc/PID/fdinfo) carries a lock line for that inode with its own pid (a child
/// that merely inherited the descriptor shows its parent's pid there).
pub fn holds_flock(pid: Pid, dev: u64, ino: u64) -> bool {
    let (maj, min) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    fds.filter_map(|e| e.ok()).any(|e| {
        fs::read_to_string(e.path()).is_ok_and(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("lock:"))
                .filter_map(|l| parse_lock_line(l.trim_start()))
                .any(|(m, n, i, p)| (m, n, i) == (maj, min, ino) && p == pid.get())
        })
    })
}

/// One /proc/locks line, `1: FLOCK  ADVISORY  WRITE 15672 fe:00:5341426 0 EOF`, as (major,
/// minor, inode, pid) when it is a held flock.
pub(super) fn parse_lock_line(line: &str) -> Option<(u64, u64, u64, i32)> {
    let mut f = line.split_ascii_whitespace().skip(1);
    if f.next()? != "FLOCK" {
        return None; // a POSIX/OFD lock, or a "->" waiter line
    }
    let _advisory = f.next()?;
    let _mode = f.next()?;
    let pid = f.next()?.parse().ok()?;
    let mut dev = f.next()?.split(':');
    let maj = u64::from_str_radix(dev.next()?, 16).ok()?;
    let min = u64::from_str_radix(dev.next()?, 16).ok()?;
    let ino = dev.next()?.parse().ok()?;
    Some((maj, min, ino, pid))
}
