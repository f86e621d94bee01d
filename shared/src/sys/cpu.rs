//! CPU affinity: which CPUs a process may run on.

use super::*;

/// The CPUs this thread may run on (sched_getaffinity(2)); `None` when it cannot be asked.
pub fn cpus_allowed() -> Option<rustix::thread::CpuSet> {
    rustix::thread::sched_getaffinity(None).ok()
}

/// Keep our helper `pid` (a child just forked, queued behind us) off the CPU this thread runs
/// on, within `allowed` (ours): a fork places the child on its parent's CPU when every CPU is
/// busy, and there it waits for the parent, which goes on working, while another CPU falls
/// idle without taking it (the idle CPU's quick balance skips a runqueue this busy). Nothing
/// when `allowed` has no other CPU. The caller gives `allowed` back ([`set_cpus_of`]) once the
/// helper has work. Returns whether the helper was moved.
pub fn keep_off_this_cpu(pid: Pid, allowed: &rustix::thread::CpuSet) -> bool {
    let cpu = rustix::thread::sched_getcpu();
    if cpu >= rustix::thread::CpuSet::MAX_CPU || !allowed.is_set(cpu) || allowed.count() < 2 {
        return false;
    }
    let mut others = *allowed;
    others.unset(cpu);
    rustix::thread::sched_setaffinity(Some(rustix_pid(pid)), &others).is_ok()
}

/// Let our helper `pid` run on the CPUs of `allowed` (sched_setaffinity(2)); errors are
/// ignored (it then runs where it was allowed to).
pub fn set_cpus_of(pid: Pid, allowed: &rustix::thread::CpuSet) {
    let _ = rustix::thread::sched_setaffinity(Some(rustix_pid(pid)), allowed);
}
