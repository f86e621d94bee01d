//! Facts of this process and its host: ids, limits, clocks, its own CPU time.

use super::*;

/// This process's effective uid.
pub fn geteuid() -> u32 {
    // agent-run never changes its credentials, so one call per process is enough (the watchdog
    // asks once per run dir of a pass).
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EUID.get_or_init(|| rustix::process::geteuid().as_raw())
}

/// Raise the soft open-file limit to the hard limit (a watchdog holds one pidfd per live
/// wrapper). Returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    // `None` is RLIM_INFINITY.
    let lim = rustix::process::getrlimit(Resource::Nofile);
    let (cur, max) = (
        lim.current.unwrap_or(u64::MAX),
        lim.maximum.unwrap_or(u64::MAX),
    );
    if cur < max {
        let want = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if rustix::process::setrlimit(Resource::Nofile, want).is_ok() {
            return max;
        }
    }
    cur
}

/// Whether this process may write `path` by its effective ids (faccessat(2) with AT_EACCESS).
pub fn writable(path: &std::path::Path) -> bool {
    rustix::fs::accessat(
        rustix::fs::CWD,
        path,
        rustix::fs::Access::WRITE_OK,
        rustix::fs::AtFlags::EACCESS,
    )
    .is_ok()
}

/// This host's name (the nodename of uname(2), what gethostname(2) returns).
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Clock ticks per second (sysconf(_SC_CLK_TCK), through rustix's `use-libc-auxv`), for /proc
/// start times.
pub fn clock_ticks_per_sec() -> u64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100,
        n => n,
    }
}

/// Seconds since boot (CLOCK_BOOTTIME), comparable with /proc start ticks.
pub fn boottime_secs() -> f64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// This process's own CPU so far: user and system microseconds, and minor page faults
/// (getrusage(2), RUSAGE_SELF); zeros when it fails. For the launch phases' report.
pub fn self_cpu() -> (u64, u64, u64) {
    // SAFETY: getrusage(2) writes one `rusage` into the zeroed value on our stack.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above: the pointer is to that value, alive for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0, 0, 0);
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime), us(ru.ru_stime), ru.ru_minflt as u64)
}
