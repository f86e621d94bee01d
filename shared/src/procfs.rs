//! Reading /proc: one process's stat line, its signal dispositions, its environment marker, the
//! boot id, and a scan of every process.
//!
//! Nothing here signals or waits; it only reads. A process that vanishes between the directory
//! listing and the read is simply absent from the result (ENOENT/ESRCH are not errors here).
//! A zombie's stat is still readable (pgid, sid, start time); callers decide what `Z` means.

use crate::pid::{Identity, Pid};
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

/// The fields of /proc/PID/stat that agent-run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: Pid,
    /// One-letter state: R, S, D, Z, T, t, X, I ...
    pub state: u8,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    /// Field 22: start time in clock ticks since boot.
    pub start_ticks: u64,
    /// Field 24: resident set size in pages.
    pub rss_pages: u64,
    /// Field 20: the number of threads of the process, its exited leader included while other
    /// threads live.
    pub threads: u64,
    /// Field 9: the kernel's task flags (`PF_*`).
    pub flags: u64,
}

impl Stat {
    /// The process's identity.
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    /// Dead: no thread of it can run code. `Z` in /proc/PID/stat is the *main thread's* state:
    /// a process whose main thread called `SYS_exit` while other threads run shows `Z` with
    /// `num_threads` > 1, and is alive. Only a zombie (or a task being torn down) with no other
    /// thread is dead.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') && self.threads <= 1
    }

    /// A zombie leader whose other threads still run.
    pub fn is_zombie_leader(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') && self.threads > 1
    }

    /// Its last thread is in `do_exit` (`PF_EXITING` on a process with no other thread): it
    /// runs no more code of its own, and its files (its flocks with them) are being released.
    /// A process in that window already has no `/proc/PID/exe` (its memory map is gone) while
    /// its state is not yet `Z`. A zombie leader whose other threads run is not exiting.
    pub fn is_exiting(&self) -> bool {
        const PF_EXITING: u64 = 0x4;
        self.flags & PF_EXITING != 0 && self.threads <= 1
    }

    /// Stopped by a signal or a tracer: a TERM stays pending until it is continued.
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, b'T' | b't')
    }
}

/// Parse a /proc/PID/stat line. The command name may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = Pid::new(line[..open].trim().parse().ok()?)?;
    let rest: Vec<&str> = line.get(close + 1..)?.split_ascii_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let field = |n: usize| rest.get(n - 3).copied();
    Some(Stat {
        pid,
        state: *field(3)?.as_bytes().first()?,
        ppid: field(4)?.parse().ok()?,
        pgid: field(5)?.parse().ok()?,
        sid: field(6)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
        rss_pages: field(24)?.parse().ok()?,
        threads: field(20)?.parse().ok()?,
        flags: field(9)?.parse().ok()?,
    })
}

/// Read /proc/PID/stat. `None` when the process is gone (or the line cannot be parsed).
pub fn stat(pid: Pid) -> Option<Stat> {
    let mut buf = [0u8; 1024];
    let mut f = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let n = read_full(&mut f, &mut buf)?;
    parse_stat(std::str::from_utf8(&buf[..n]).ok()?)
}

pub use crate::sys::read_kernel_file;

/// The cgroup v2 path in the text of a /proc/PID/cgroup (its `0::` line), as the kernel wrote
/// it (a removed cgroup keeps its ` (deleted)` suffix).
pub fn v2_path(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
}

/// Read a /proc file into `buf`. The kernel makes such a file whole at the first read and
/// copies as much as fits, so a read that leaves room is all of it: the scans of every process
/// save the read that would only say EOF.
fn read_full(f: &mut fs::File, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) if n == 0 && k < buf.len() => return Some(k),
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(n)
}

/// Signal facts from /proc/PID/status (`SigIgn`, `SigCgt`, `SigBlk`, `SigPnd` | `ShdPnd`
/// bitmasks, bit N-1 = signal N; and whether `State:` is T or t).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SigDispositions {
    pub ignored: u64,
    pub caught: u64,
    pub blocked: u64,
    /// Pending for the thread or its process.
    pub pending: u64,
    /// Stopped by a signal or a tracer.
    pub stopped: bool,
}

impl SigDispositions {
    /// Whether signal `sig` is ignored (SIG_IGN): it can run no handler for it.
    pub fn ignores(&self, sig: i32) -> bool {
        sig > 0 && sig <= 64 && self.ignored & (1u64 << (sig - 1)) != 0
    }

    /// Whether signal `sig` is in the (main thread's) mask.
    pub fn blocks(&self, sig: i32) -> bool {
        sig > 0 && sig <= 64 && self.blocked & (1u64 << (sig - 1)) != 0
    }

    /// Whether the mask says "stopping its run" ([`crate::sys::mark_stopping`]): the mark
    /// blocked while TERM is not (the wrapper blocks every signal, for a moment, around its
    /// clones; it never blocks TERM otherwise).
    pub fn marks_stopping(&self) -> bool {
        self.blocks(crate::sys::STOPPING_MARK) && !self.blocks(libc::SIGTERM)
    }
}

/// Whether the wrapper `pid` is stopping its run, by its main thread's signal mask (see
/// [`crate::sys::mark_stopping`]): a kernel fact, where the record's `cancelling` is a file
/// the run can write. `false` when it is gone or unreadable.
pub fn marks_stopping(pid: Pid) -> bool {
    sig_dispositions(pid).is_some_and(|d| d.marks_stopping())
}

/// Whether the wrapper `pid` wrote its run's final record itself, by its main thread's signal
/// mask (see [`crate::sys::mark_final`]). `false` when it is gone or unreadable.
pub fn marks_final(pid: Pid) -> bool {
    sig_dispositions(pid)
        .is_some_and(|d| d.blocks(crate::sys::FINAL_MARK) && !d.blocks(libc::SIGTERM))
}

/// Read SigIgn/SigCgt/SigBlk of a process. `None` when it is gone.
pub fn sig_dispositions(pid: Pid) -> Option<SigDispositions> {
    let text = read_kernel_file(format!("/proc/{pid}/status")).ok()?;
    let mut d = SigDispositions::default();
    for line in text.lines() {
        let hex = |v: &str| u64::from_str_radix(v.trim(), 16).unwrap_or(0);
        if let Some(v) = line.strip_prefix("SigIgn:") {
            d.ignored = hex(v);
        } else if let Some(v) = line.strip_prefix("SigCgt:") {
            d.caught = hex(v);
        } else if let Some(v) = line.strip_prefix("SigBlk:") {
            d.blocked = hex(v);
        } else if let Some(v) = line
            .strip_prefix("SigPnd:")
            .or_else(|| line.strip_prefix("ShdPnd:"))
        {
            d.pending |= hex(v);
        } else if let Some(v) = line.strip_prefix("State:") {
            d.stopped = matches!(v.trim_start().as_bytes().first(), Some(b'T' | b't'));
        }
    }
    Some(d)
}

/// Whether `pid` is stopped (`State:` T or t) or about to be: a stop signal (STOP, TSTP, TTIN,
/// TTOU) pending for it (`SigPnd`/`ShdPnd`), as a SIGSTOP sent to a process that has not run
/// since is. For a moment between the two (the signal taken, the stop not yet made) neither
/// shows: a caller that must not miss a stop looks again. From /proc/PID/status; `false` when
/// it is gone.
pub fn stopped_or_stopping(pid: Pid) -> bool {
    let stops: u64 = [libc::SIGSTOP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU]
        .iter()
        .map(|s| 1u64 << (s - 1))
        .sum();
    sig_dispositions(pid).is_some_and(|d| d.stopped || d.pending & stops != 0)
}

/// The values of the given variables in a process's environment (/proc/PID/environ), in the
/// order asked; `None` for a variable that is not set. Empty when the process is gone or its
/// environment is unreadable (another user's, or a kernel thread).
pub fn environ_get(pid: Pid, names: &[&str]) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![None; names.len()];
    let env = match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) if !env.is_empty() => env,
        // A zombie leader's own environ reads empty (its memory is gone with its main
        // thread); a thread that still runs shares the memory and shows it.
        _ => match live_thread_environ(pid) {
            Some(env) => env,
            None => return out,
        },
    };
    for kv in env.split(|&b| b == 0) {
        for (i, name) in names.iter().enumerate() {
            if kv.len() > name.len() && kv.starts_with(name.as_bytes()) && kv[name.len()] == b'=' {
                out[i] = Some(kv[name.len() + 1..].to_vec());
            }
        }
    }
    out
}

/// Whether this process may read `pid`'s environment at all: `false` for a process of another
/// user, or one that made itself non-dumpable (PR_SET_DUMPABLE 0, as ssh-agent does), whose
/// /proc/PID/environ its own user cannot read. A scan cannot tell whether such a process
/// carries a run's marker.
pub fn environ_unreadable(pid: Pid) -> bool {
    match fs::File::open(format!("/proc/{pid}/environ")) {
        Ok(mut f) => {
            let mut b = [0u8; 1];
            matches!(f.read(&mut b), Err(e) if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EPERM))
        }
        Err(e) => matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)),
    }
}

/// The environment of a process as one of its live threads shows it (/proc/PID/task/TID).
fn live_thread_environ(pid: Pid) -> Option<Vec<u8>> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str() != Some(&pid.to_string()))
        .find_map(|e| {
            fs::read(e.path().join("environ"))
                .ok()
                .filter(|v| !v.is_empty())
        })
}

/// The real uid of a process, from the `Uid:` line of /proc/PID/status (readable whatever the
/// process's dumpable flag; /proc/PID of a non-dumpable process belongs to root). `None` when
/// it is gone.
pub fn real_uid(pid: Pid) -> Option<u32> {
    let text = read_kernel_file(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_ascii_whitespace().next()?.parse().ok()
}

/// A process's command name (/proc/PID/comm, trimmed): readable for every process, whatever
/// its dumpable flag. A process can set its own, so it only ever narrows a choice the kernel's
/// other facts made.
pub fn comm(pid: Pid) -> Option<String> {
    read_kernel_file(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// The cgroup v2 path of a process (the `0::` line of /proc/PID/cgroup), relative to the
/// cgroup2 mount (`/` for its root). `None` when it is gone or has none.
pub fn cgroup_of(pid: Pid) -> Option<String> {
    let text = read_kernel_file(format!("/proc/{pid}/cgroup")).ok()?;
    v2_path(&text).map(str::to_string)
}

/// The owner uid of a process (owner of /proc/PID). `None` when it is gone.
pub fn uid_of(pid: Pid) -> Option<u32> {
    fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// /proc/locks read once: the flock holders of every locked inode, for a caller that asks
/// about many runs (`list`, `gc`, a watchdog pass). A lock taken or let go after the read is
/// not in it.
#[derive(Debug, Default, Clone)]
pub struct LockTable {
    held: std::collections::HashMap<(u64, u64, u64), Vec<i32>>,
}

impl LockTable {
    /// Read /proc/locks.
    pub fn read() -> LockTable {
        let mut held: std::collections::HashMap<(u64, u64, u64), Vec<i32>> = Default::default();
        if let Ok(text) = read_kernel_file("/proc/locks") {
            for (maj, min, ino, pid) in text.lines().filter_map(parse_lock_line) {
                held.entry((maj, min, ino)).or_default().push(pid);
            }
        }
        LockTable { held }
    }

    /// The pids holding a flock on (device, inode).
    pub fn holders(&self, dev: u64, ino: u64) -> Vec<i32> {
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
fn parse_lock_line(line: &str) -> Option<(u64, u64, u64, i32)> {
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

/// The file name of a process's executable (/proc/PID/exe), without a " (deleted)" suffix (a
/// wrapper whose binary was upgraded under it is still that binary). `None` when it is gone
/// or not ours to read.
pub fn exe_name(pid: Pid) -> Option<String> {
    let target = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let name = target.file_name()?.to_string_lossy().into_owned();
    Some(name.strip_suffix(" (deleted)").unwrap_or(&name).to_string())
}

/// An epoch time as clock ticks since boot (the unit of /proc start times), 0 when it is
/// before the boot.
pub fn epoch_to_ticks(epoch: f64) -> u64 {
    let secs = (epoch - booted_at()).max(0.0);
    (secs * crate::sys::clock_ticks_per_sec() as f64) as u64
}

/// When this boot began, in epoch seconds: the wall clock minus the boot clock, read as a
/// pair close together (a pair with a preemption between its two reads, which on a loaded host
/// can last a second, would put every conversion that much off: read again, up to a few times).
fn booted_at() -> f64 {
    let mut best = (f64::INFINITY, 0.0);
    for _ in 0..8 {
        let before = crate::time::epoch_now();
        let boot = crate::sys::boottime_secs();
        let after = crate::time::epoch_now();
        if after - before < best.0 {
            best = (after - before, (before + after) / 2.0 - boot);
        }
        if after - before < 0.000_2 {
            break;
        }
    }
    best.1
}

/// This boot's id (/proc/sys/kernel/random/boot_id), trimmed.
pub fn boot_id() -> String {
    read_kernel_file("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The stat of every process visible in /proc (thread-group leaders only). Processes that vanish
/// during the scan are skipped.
pub fn scan() -> Vec<Stat> {
    scan_above(None)
}

/// [`scan`], reading only processes whose pid is `min_pid` or above and no higher than the last
/// pid handed out when the listing ends (the directory listing is cheap; each stat read is what
/// a scan costs). For a caller that knows the pid counter has not wrapped since `min_pid` was
/// handed out ([`only_newer_pids`], [`no_wrap_within`]): every process newer than that has a
/// pid in that range, and a pid above it is an older process (from before the last wrap).
pub fn scan_above(min_pid: Option<i32>) -> Vec<Stat> {
    let stats = match (min_pid, min_pid.and(last_pid())) {
        // Few pids handed out since `min`: ask for each of them instead of listing /proc (a
        // listing generates an entry for every process: most of a short run's scan at its
        // leader's exit).
        (Some(min), Some(last)) if last >= min && last - min < PROBE_MAX => probe(min, last),
        (Some(min), Some(_)) => scan_range(min),
        (_, _) => scan_from(0),
    };
    // The pid counter may have wrapped while we read: new processes then have pids below
    // `min_pid`, and only a whole scan sees them.
    match min_pid {
        Some(min) if last_pid().is_none_or(|l| l < min) => scan_from(0),
        _ => stats,
    }
}

/// How many pids [`scan_above`] asks for one by one, at most, instead of listing /proc.
const PROBE_MAX: i32 = 64;

/// The stat of each process (thread-group leader) whose pid is in `min..=last`. /proc/TID
/// answers for a thread too (hidden from the listing, with the thread's own stat): a pid that
/// is not its own thread group's id is skipped, as the listing would skip it.
fn probe(min: i32, last: i32) -> Vec<Stat> {
    (min..=last)
        .filter_map(|pid| {
            let pid = Pid::new(pid.into())?;
            match is_group_leader(pid) {
                Some(false) => None,
                Some(true) => stat(pid),
                None => stat(pid).filter(|st| tgid_of(st.pid) == Some(pid.get())),
            }
        })
        .collect()
}

/// Whether `pid` is a live (or zombie) thread group's id, by pidfd_open(2): it refuses a
/// thread that does not lead its group (EINVAL on older kernels, ENOENT on newer ones: 6.18
/// here) and a pid no task holds (ESRCH). One syscall instead of the kernel formatting
/// /proc/PID/status. `None` when the kernel cannot say (no pidfd_open, out of descriptors,
/// a limit the workload lowered through prlimit(2)): the caller reads the `Tgid:` line.
fn is_group_leader(pid: Pid) -> Option<bool> {
    match crate::sys::pidfd_open(pid) {
        Ok(_) => Some(true),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::ENOENT | libc::ESRCH)
            ) =>
        {
            Some(false)
        }
        Err(_) => None,
    }
}

/// The thread group id of task `pid` (the `Tgid:` line of /proc/PID/status).
fn tgid_of(pid: Pid) -> Option<i32> {
    let mut buf = [0u8; 4096];
    let mut f = fs::File::open(format!("/proc/{pid}/status")).ok()?;
    let n = read_full(&mut f, &mut buf)?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

fn scan_from(min: i32) -> Vec<Stat> {
    stat_listed(listed_pids(), min, i32::MAX)
}

/// The processes listed in /proc with a pid from `min` up to the last pid handed out once the
/// listing is done: a process that began before the listing has a pid at or below that.
fn scan_range(min: i32) -> Vec<Stat> {
    let listed = listed_pids_from(min);
    stat_listed(listed, min, last_pid().unwrap_or(i32::MAX))
}

/// The directory offset at which /proc lists the process of pid 0 (the kernel's TGID_OFFSET:
/// FIRST_PROCESS_ENTRY, 256, then `self` and `thread-self`): its listing of processes goes up
/// by pid, and a seek to this plus a pid starts it at the first process from that pid up.
const TGID_OFFSET: i64 = 258;

/// The pids /proc lists from `min` up: a seek of the listing straight to `min`, so a look at
/// the few pids handed out since a floor does not generate an entry for every process of a big
/// table (10,000 entries cost about 15 ms here). Where the seek does not land where it should
/// (checked once, on this process's own pid: [`seek_lands_on_pids`]), the whole listing.
fn listed_pids_from(min: i32) -> Vec<i32> {
    if min <= 1 || !seek_lands_on_pids() {
        return listed_pids();
    }
    listed_from_offset(Some(TGID_OFFSET + i64::from(min))).unwrap_or_else(listed_pids)
}

/// The pids /proc lists (from directory offset `at` on, or all); `None` when /proc cannot be
/// read.
fn listed_from_offset(at: Option<i64>) -> Option<Vec<i32>> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        "/proc",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut dir = rustix::fs::Dir::new(fd).ok()?;
    if let Some(at) = at {
        dir.seek(at).ok()?;
    }
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e.ok()?;
        if let Some(pid) = e.file_name().to_str().ok().and_then(|n| n.parse().ok()) {
            out.push(pid);
        }
    }
    Some(out)
}

/// Whether a seek of /proc's listing to [`TGID_OFFSET`] plus a pid starts at that pid: a
/// listing seeked to this process's pid begins with it, and one seeked past it does not hold it.
fn seek_lands_on_pids() -> bool {
    static LANDS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LANDS.get_or_init(|| {
        let me = std::process::id() as i32;
        let at = listed_from_offset(Some(TGID_OFFSET + i64::from(me)));
        let past = listed_from_offset(Some(TGID_OFFSET + i64::from(me) + 1));
        matches!((at, past), (Some(a), Some(p))
            if a.first() == Some(&me)
                && a.iter().all(|&x| x >= me)
                && p.iter().all(|&x| x > me))
    })
}

/// The stat of each listed pid in `min..=max`.
fn stat_listed(listed: Vec<i32>, min: i32, max: i32) -> Vec<Stat> {
    listed
        .into_iter()
        .filter(|&pid| pid >= min && pid <= max)
        .filter_map(|pid| stat(Pid::new(pid.into())?))
        .collect()
}

/// The pids /proc lists (thread-group leaders).
fn listed_pids() -> Vec<i32> {
    listed_from_offset(None).unwrap_or_default()
}

/// The children lists of each thread of `/proc/<who>` (`/proc/<who>/task/TID/children`): an
/// orphan reparented to a subreaper is the child of one of its threads. `None` when the task
/// dir cannot be listed; a list that cannot be read is an `Err`.
fn children_lists(who: &str) -> Option<impl Iterator<Item = std::io::Result<String>>> {
    let base = format!("/proc/{who}/task");
    let tasks = dir_entries(&base)?;
    Some(
        tasks
            .into_iter()
            .map(move |(tid, _)| read_kernel_file(format!("{base}/{tid}/children"))),
    )
}

/// The entries of the directory at `path` but `.` and `..`: each name (UTF-8 only: others are
/// skipped) and whether it is a directory. `None` when it cannot be listed. Read with
/// getdents64(2) into a buffer of ours, not the C library's opendir(3): musl's maps a fresh
/// page for each and unmaps it at closedir, and an unmap in a process whose memory a
/// vfork-style child ran on another CPU can wait for that CPU's TLB flush (~40 µs at a
/// launch's end here).
pub(crate) fn dir_entries(path: impl AsRef<std::path::Path>) -> Option<Vec<(String, bool)>> {
    use rustix::fs::{FileType, Mode, OFlags};
    let fd = rustix::fs::open(
        path.as_ref(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut dir = rustix::fs::Dir::new(fd).ok()?;
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e.ok()?;
        let Ok(name) = e.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match e.file_type() {
            FileType::Directory => true,
            // A filesystem that does not say (d_type unknown): ask it.
            FileType::Unknown => dir.fd().ok().is_some_and(|fd| {
                rustix::fs::statat(fd, e.file_name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            }),
            _ => false,
        };
        out.push((name.to_string(), is_dir));
    }
    Some(out)
}

/// The pids of one children list.
fn parse_children(list: &str) -> impl Iterator<Item = Pid> + '_ {
    list.split_ascii_whitespace()
        .filter_map(|p| p.parse::<i64>().ok())
        .filter_map(Pid::new)
}

/// The children of a process, from every one of its threads (/proc/PID/task/TID/children:
/// an orphan reparented to a subreaper is the child of one of its threads).
pub fn children_of(pid: Pid) -> Vec<Pid> {
    let Some(lists) = children_lists(&pid.to_string()) else {
        return Vec::new();
    };
    let mut out: Vec<Pid> = lists
        .filter_map(Result::ok)
        .flat_map(|text| parse_children(&text).collect::<Vec<_>>())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The output keeper of the live wrapper `wrapper`, known by kernel facts alone (never by the
/// journal's `keeper_started`, which the run can rewrite): the one child of the wrapper that
/// runs the wrapper's own executable (the keeper is forked, never exec'd), is named
/// `agent-run-keep`, leads a session of its own and is in the wrapper's cgroup (never the
/// run's). A stop that takes the wrapper's descendants excludes it: it is not the run's, and it
/// ends by EOF when the run's last writer is gone. None when no child, or more than one, fits
/// (then nothing is excluded, as before), or the wrapper cannot be read.
pub fn keeper_of(wrapper: Pid) -> Option<Identity> {
    let exe = |p: Pid| {
        fs::metadata(format!("/proc/{p}/exe"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let cgroup = |p: Pid| {
        read_kernel_file(format!("/proc/{p}/cgroup"))
            .ok()
            .and_then(|t| v2_path(&t).map(str::to_owned))
    };
    let (w_exe, w_cgroup) = (exe(wrapper)?, cgroup(wrapper)?);
    let mut fits = children_of(wrapper).into_iter().filter_map(|c| {
        let st = stat(c)?;
        let comm = read_kernel_file(format!("/proc/{c}/comm")).ok()?;
        let fits = st.ppid == wrapper.get()
            && st.sid == c.get()
            && comm.trim_end() == "agent-run-keep"
            && exe(c)? == w_exe
            && cgroup(c)? == w_cgroup;
        fits.then(|| st.identity())
    });
    let keeper = fits.next()?;
    fits.next().is_none().then_some(keeper)
}

/// Every process below `root` in the process tree (its children, theirs, and so on), each with
/// its stat, from the kernel's children lists: what a look at every pid would find descending
/// from `root`, for the cost of the tree, not of the process table. `None` when `root`'s own
/// lists cannot be read (a kernel without CONFIG_PROC_CHILDREN): the caller scans instead.
///
/// A list names pids: a child that exits, and whose pid is reused, between the list and its
/// stat is read as whatever has the pid now. Callers decide membership from the stats' own
/// `ppid` chain, as over a scan; the walk goes below a process only when its stat names the
/// parent whose list it came from. A process forked, or reparented, after the list it belongs
/// in was read is missed by this look, as by a scan that read its pid's slot first.
pub fn tree_below(root: Pid) -> Option<Vec<Stat>> {
    let mut queue: Vec<(Pid, i32)> = Vec::new();
    for list in children_lists(&root.to_string())? {
        queue.extend(parse_children(&list.ok()?).map(|c| (c, root.get())));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    while let Some((pid, parent)) = queue.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let Some(st) = stat(pid) else { continue };
        out.push(st);
        if st.ppid != parent {
            continue;
        }
        if let Some(lists) = children_lists(&pid.to_string()) {
            for list in lists.flatten() {
                queue.extend(parse_children(&list).map(|c| (c, pid.get())));
            }
        }
    }
    out.sort_unstable_by_key(|s| s.pid);
    Some(out)
}

/// Whether this process has a child other than `skip`, from the kernel's list of each of our
/// threads' children (`/proc/self/task/TID/children`); `None` when it cannot be read. The
/// wrapper asks at the leader's exit: its keeper is no leftover, any other child is (a
/// subreaper's pid hopper is always one of its children, even while it dodges a /proc scan).
pub fn children_besides(skip: Pid) -> Option<bool> {
    for list in children_lists("self")? {
        if parse_children(&list.ok()?).any(|p| p != skip) {
            return Some(true);
        }
    }
    Some(false)
}

/// The last pid the kernel handed out in this pid namespace (/proc/sys/kernel/ns_last_pid).
pub fn last_pid() -> Option<i32> {
    read_kernel_file("/proc/sys/kernel/ns_last_pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Clock ticks since boot now, as /proc start times count.
pub fn now_ticks() -> u64 {
    (crate::sys::boottime_secs() * crate::sys::clock_ticks_per_sec() as f64) as u64
}

/// The fastest rate at which any machine hands out pids, for [`only_newer_pids`]: far above
/// what fork(2) achieves (tens of thousands a second on a big host).
pub(crate) const MAX_FORKS_PER_SEC: f64 = 100_000.0;

/// Pids below this are never handed out again once the counter wraps (the kernel's
/// RESERVED_PIDS).
pub(crate) const RESERVED_PIDS: f64 = 300.0;

/// The live tasks (threads included) on the host: `/proc/loadavg`'s `2/183` field. Every task
/// holds a pid.
pub fn tasks() -> Option<u64> {
    read_kernel_file("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .nth(3)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

pub(crate) fn pid_max() -> f64 {
    static PID_MAX: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *PID_MAX.get_or_init(|| {
        read_kernel_file("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(32768.0)
    })
}

/// Whether the pid counter cannot have come around since a moment `age_secs` ago, when `tasks`
/// tasks were alive and `held` more pids were held by a process group or session whose leader
/// was gone. Coming around means handing out, or stepping over, every pid from
/// [`RESERVED_PIDS`] to pid_max once; the counter steps over only pids in use, and a pid in use
/// that it did not hand out since that moment was in use at it (a task, or a group's or
/// session's id). So it hands out at least `pid_max - 300 - tasks - held` pids first, at no more
/// than [`MAX_FORKS_PER_SEC`]. With the counter at or above where it was then
/// ([`last_pid`]), it has not wrapped at all, so every process that began since has a pid
/// above the last one handed out then.
pub fn no_wrap_within(age_secs: f64, tasks: u64, held: u64) -> bool {
    let free = (pid_max() - RESERVED_PIDS - tasks as f64 - held as f64).max(0.0);
    age_secs < free / MAX_FORKS_PER_SEC
}

/// Processes that started after `floor` have pids from `floor.pid` up when the pid counter has
/// not wrapped since: the last pid handed out is still above it, and too little time has passed
/// for a whole cycle of the free pids ([`no_wrap_within`]; the tasks alive now stand for those
/// alive then). Then a scan for them need not read the older pids at all. `Some(floor.pid)`
/// when that holds, else `None` (scan everything).
pub fn only_newer_pids(floor: Identity) -> Option<i32> {
    let tasks = tasks()?;
    let tps = crate::sys::clock_ticks_per_sec() as f64;
    // One tick of margin: start times are rounded down to ticks.
    let age = (now_ticks().saturating_sub(floor.start_ticks) + 1) as f64 / tps;
    if !no_wrap_within(age, tasks, 0) {
        return None;
    }
    let last = last_pid()?;
    (last >= floor.pid.get()).then_some(floor.pid.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_is_seen_and_a_continued_one_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep runs");
        let pid = Pid::new(i64::from(child.id())).unwrap();
        assert!(!stopped_or_stopping(pid), "a sleeping process");
        // Pending, then state T; for a moment between the two (the signal taken, the stop not
        // yet made) neither shows, which is why callers look again.
        let within = |want: bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while stopped_or_stopping(pid) != want {
                assert!(std::time::Instant::now() < deadline, "not {want} in 10 s");
                std::thread::yield_now();
            }
        };
        assert_eq!(send(pid, libc::SIGSTOP), 0);
        within(true);
        assert_eq!(send(pid, libc::SIGCONT), 0);
        within(false);
        assert_eq!(send(pid, libc::SIGKILL), 0);
        child.wait().unwrap();
        assert!(!stopped_or_stopping(pid), "reaped");
    }

    /// kill(2), through rustix.
    fn send(pid: Pid, sig: i32) -> i32 {
        let p = rustix::process::Pid::from_raw(pid.get()).unwrap();
        let sig = rustix::process::Signal::from_named_raw(sig).unwrap();
        match rustix::process::kill_process(p, sig) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error(),
        }
    }

    #[test]
    fn a_mask_says_stopping_with_urg_blocked_and_term_not() {
        let mask = |sigs: &[i32]| SigDispositions {
            blocked: sigs.iter().map(|s| 1u64 << (s - 1)).sum(),
            ..Default::default()
        };
        assert!(mask(&[libc::SIGURG]).marks_stopping());
        assert!(mask(&[libc::SIGURG, libc::SIGUSR1]).marks_stopping());
        // Every signal blocked: a wrapper around its clones, not a stop.
        assert!(!SigDispositions {
            blocked: u64::MAX,
            ..Default::default()
        }
        .marks_stopping());
        assert!(!mask(&[libc::SIGURG, libc::SIGTERM]).marks_stopping());
        assert!(!mask(&[]).marks_stopping());
        assert!(!mask(&[libc::SIGTERM]).marks_stopping());
    }

    #[test]
    fn a_kernel_file_is_read_whole_past_the_first_buffer_and_text_only() {
        // A small /proc file in one read, and a file four times the first buffer whole.
        let status = read_kernel_file("/proc/self/status").unwrap();
        assert!(
            status.contains(&format!("Pid:\t{}\n", std::process::id())),
            "{status}"
        );
        let d = tempfile::tempdir().unwrap();
        let big: String = (0..2000).map(|i| format!("line {i:05}\n")).collect();
        assert!(big.len() > 4 * 4096);
        std::fs::write(d.path().join("big"), &big).unwrap();
        assert_eq!(read_kernel_file(d.path().join("big")).unwrap(), big);
        std::fs::write(d.path().join("bin"), [0xff, 0xfe]).unwrap();
        let e = read_kernel_file(d.path().join("bin")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(read_kernel_file(d.path().join("none")).is_err());
    }

    #[test]
    fn a_listing_from_a_pid_starts_at_it_and_holds_every_process_from_it_up() {
        assert!(
            seek_lands_on_pids(),
            "this kernel's /proc listing seeks by pid"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let me = std::process::id() as i32;
        let from_child = listed_pids_from(pid);
        let past_child = listed_pids_from(pid + 1);
        let from_me = listed_pids_from(me);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            from_child.first(),
            Some(&pid),
            "{:?}",
            &from_child[..from_child.len().min(5)]
        );
        assert!(from_child.iter().all(|&p| p >= pid));
        assert!(past_child.iter().all(|&p| p > pid));
        assert_eq!(from_me.first(), Some(&me));
        if me < pid {
            assert!(
                from_me.contains(&pid),
                "the child is listed from this process's pid up"
            );
        }
        // Below pid 2, the whole listing.
        assert!(listed_pids_from(1).contains(&1) || !listed_pids().contains(&1));
    }

    #[test]
    fn a_probe_of_new_pids_finds_processes_and_skips_threads() {
        let me = Pid::this();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // /proc/thread-self is `PID/task/TID`.
            let link = fs::read_link("/proc/thread-self").unwrap();
            let tid: i32 = link.file_name().unwrap().to_str().unwrap().parse().unwrap();
            tid_tx.send(tid).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        assert!(
            stat(Pid::new(tid.into()).unwrap()).is_some(),
            "/proc/TID answers"
        );
        assert!(
            probe(tid, tid).is_empty(),
            "thread {tid} taken for a process"
        );
        // The kernel's answer, not the fallback's: pidfd_open refuses the thread.
        assert_eq!(is_group_leader(Pid::new(tid.into()).unwrap()), Some(false));
        assert_eq!(is_group_leader(me), Some(true));
        let found: Vec<Pid> = probe(me.get(), me.get()).iter().map(|s| s.pid).collect();
        assert_eq!(found, vec![me]);
        // An unreaped child is a process until its parent waits for it, as in the listing.
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        let zpid = Pid::new(zombie.id().into()).unwrap();
        // Its pidfd turns readable at its exit (it is a zombie then).
        let pidfd = crate::sys::pidfd_open(zpid).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        assert!(
            crate::sys::readable_by(std::os::fd::AsFd::as_fd(&pidfd), deadline),
            "{zpid} did not exit"
        );
        assert!(
            stat(zpid).is_some_and(|s| s.is_dead()),
            "{zpid} is a zombie"
        );
        assert_eq!(is_group_leader(zpid), Some(true));
        assert!(probe(zpid.get(), zpid.get()).iter().any(|s| s.pid == zpid));
        zombie.wait().unwrap();
        assert_eq!(
            is_group_leader(zpid),
            Some(false),
            "a reaped pid is no process"
        );
        // A child made now is in the probed range above it and in the listing alike.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let probed = scan_above(Some(pid));
        assert!(
            probed.iter().any(|s| s.pid.get() == pid),
            "probe missed {pid}"
        );
        let listed = scan_from(pid);
        assert!(
            listed.iter().any(|s| s.pid.get() == pid),
            "listing missed {pid}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_child_of_ours_is_a_child_besides_any_other_pid() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = Pid::new(child.id().into()).unwrap();
        // Other tests' children may come and go; ours is there until we kill it.
        assert!(children_of(Pid::this()).contains(&pid));
        assert_eq!(children_besides(Pid::this()), Some(true));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!children_of(Pid::this()).contains(&pid));
    }

    #[test]
    fn the_tree_below_us_holds_a_grandchild_by_its_own_parent_link_and_not_our_parent() {
        // sh forks sleep and waits: the sleep is our grandchild, found through sh's list.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let sh = Pid::new(child.id().into()).unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let sleep = Pid::new(line.trim().parse::<i64>().unwrap()).unwrap();
        let tree = tree_below(Pid::this()).expect("children lists are readable here");
        let of = |p: Pid| tree.iter().find(|s| s.pid == p).copied();
        // A fork is in its parent's list before it execs; the echo came after the fork.
        let sh_stat = of(sh).expect("our child is in the tree");
        let sleep_stat = of(sleep).expect("our grandchild is in the tree");
        assert_eq!(sh_stat.ppid, std::process::id() as i32);
        assert_eq!(sleep_stat.ppid, sh.get());
        assert!(
            tree.windows(2).all(|w| w[0].pid < w[1].pid),
            "sorted, no pid twice"
        );
        // Only what is below us: not our parent, not pid 1, not ourselves.
        let me = Pid::this();
        assert!(tree.iter().all(|s| s.pid != me && s.pid.get() != 1));
        assert!(tree.iter().all(|s| s.pid.get() != stat(me).unwrap().ppid));
        let sleep_fd = crate::sys::pidfd_open(sleep).unwrap();
        crate::sys::pidfd_send_signal(std::os::fd::AsFd::as_fd(&sleep_fd), libc::SIGKILL, false)
            .unwrap();
        child.wait().unwrap();
        assert!(tree_below(Pid::this()).unwrap().iter().all(|s| s.pid != sh));
    }

    #[test]
    fn parses_a_stat_line_with_a_hostile_command_name() {
        let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 1000 250 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid.get(), 4242);
        assert_eq!(s.state, b'S');
        assert_eq!((s.ppid, s.pgid, s.sid), (1, 4242, 4242));
        assert_eq!(s.start_ticks, 987654);
        assert_eq!(s.rss_pages, 250);
        assert_eq!(s.threads, 1);
        assert_eq!(s.flags, 4194560);
        assert!(!s.is_exiting());
    }

    #[test]
    fn exiting_is_pf_exiting_on_the_last_thread_only() {
        let line = |flags: u64, threads: u64| {
            format!("77 (w) R 1 77 77 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 {threads} 0 5 1000 250 0")
        };
        let at = |flags, threads| parse_stat(&line(flags, threads)).unwrap();
        assert!(at(0x400104, 1).is_exiting());
        assert!(!at(0x400100, 1).is_exiting());
        // A leader that called SYS_exit while other threads run is alive, not leaving.
        assert!(!at(0x400104, 3).is_exiting());
    }

    #[test]
    fn reads_this_process() {
        let me = stat(Pid::this()).unwrap();
        assert_eq!(me.pid, Pid::this());
        assert!(me.start_ticks > 0);
        assert!(scan().iter().any(|s| s.pid == Pid::this()));
        assert!(!boot_id().is_empty());
        assert!(sig_dispositions(Pid::this()).is_some());
    }

    #[test]
    fn lock_lines_are_parsed_and_waiters_skipped() {
        assert_eq!(
            parse_lock_line("1: FLOCK  ADVISORY  WRITE 15672 fe:00:5341426 0 EOF"),
            Some((0xfe, 0, 5341426, 15672))
        );
        assert_eq!(
            parse_lock_line("1: -> FLOCK  ADVISORY  WRITE 15673 fe:00:5341426 0 EOF"),
            None
        );
        assert_eq!(
            parse_lock_line("2: POSIX  ADVISORY  WRITE 15672 00:2e:11 0 EOF"),
            None
        );
    }

    #[test]
    fn sig_ignored_bit_maps_to_signal_number() {
        let d = SigDispositions {
            ignored: 0x0000000000384004,
            ..Default::default()
        };
        assert!(d.ignores(libc::SIGTERM));
        assert!(d.ignores(libc::SIGQUIT));
        assert!(!d.ignores(libc::SIGHUP));
    }
}
