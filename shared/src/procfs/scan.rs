//! A scan of every process, or of the pids above a floor (listed, or probed one by one when few).

use super::*;

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
pub(super) const PROBE_MAX: i32 = 64;

/// The stat of each process (thread-group leader) whose pid is in `min..=last`. /proc/TID
/// answers for a thread too (hidden from the listing, with the thread's own stat): a pid that
/// is not its own thread group's id is skipped, as the listing would skip it.
pub(super) fn probe(min: i32, last: i32) -> Vec<Stat> {
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
pub(super) fn is_group_leader(pid: Pid) -> Option<bool> {
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
pub(super) fn tgid_of(pid: Pid) -> Option<i32> {
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

pub(super) fn scan_from(min: i32) -> Vec<Stat> {
    stat_listed(listed_pids(), min, i32::MAX)
}

/// The processes listed in /proc with a pid from `min` up to the last pid handed out once the
/// listing is done: a process that began before the listing has a pid at or below that.
pub(super) fn scan_range(min: i32) -> Vec<Stat> {
    let listed = listed_pids_from(min);
    stat_listed(listed, min, last_pid().unwrap_or(i32::MAX))
}

/// The directory offset at which /proc lists the process of pid 0 (the kernel's TGID_OFFSET:
/// FIRST_PROCESS_ENTRY, 256, then `self` and `thread-self`): its listing of processes goes up
/// by pid, and a seek to this plus a pid starts it at the first process from that pid up.
pub(super) const TGID_OFFSET: i64 = 258;

/// The pids /proc lists from `min` up: a seek of the listing straight to `min`, so a look at
/// the few pids handed out since a floor does not generate an entry for every process of a big
/// table (10,000 entries cost about 15 ms here). Where the seek does not land where it should
/// (checked once, on this process's own pid: [`seek_lands_on_pids`]), the whole listing.
pub(super) fn listed_pids_from(min: i32) -> Vec<i32> {
    if min <= 1 || !seek_lands_on_pids() {
        return listed_pids();
    }
    listed_from_offset(Some(TGID_OFFSET + i64::from(min))).unwrap_or_else(listed_pids)
}

/// The pids /proc lists (from directory offset `at` on, or all); `None` when /proc cannot be
/// read.
pub(super) fn listed_from_offset(at: Option<i64>) -> Option<Vec<i32>> {
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
pub(super) fn seek_lands_on_pids() -> bool {
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
pub(super) fn stat_listed(listed: Vec<i32>, min: i32, max: i32) -> Vec<Stat> {
    listed
        .into_iter()
        .filter(|&pid| pid >= min && pid <= max)
        .filter_map(|pid| stat(Pid::new(pid.into())?))
        .collect()
}

/// The pids /proc lists (thread-group leaders).
pub(super) fn listed_pids() -> Vec<i32> {
    listed_from_offset(None).unwrap_or_default()
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
