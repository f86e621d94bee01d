//! The pid counter: the last pid handed out, the tasks alive, and whether the counter can have come around since a look.

use super::*;

/// The last pid the kernel handed out in this pid namespace (/proc/sys/kernel/ns_last_pid).
pub fn last_pid() -> Option<i32> {
    read_kernel_file("/proc/sys/kernel/ns_last_pid")
        .ok()?
        .trim()
        .parse()
        .ok()
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
