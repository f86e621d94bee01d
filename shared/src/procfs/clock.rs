//! The boot: its id, when it was, and times as clock ticks since it.

use super::*;

/// An epoch time as clock ticks since boot (the unit of /proc start times), 0 when it is
/// before the boot.
pub fn epoch_to_ticks(epoch: f64) -> u64 {
    let secs = (epoch - booted_at()).max(0.0);
    (secs * crate::sys::clock_ticks_per_sec() as f64) as u64
}

/// When this boot began, in epoch seconds: the wall clock minus the boot clock, read as a
/// pair close together (a pair with a preemption between its two reads, which on a loaded host
/// can last a second, would put every conversion that much off: read again, up to a few times).
pub(super) fn booted_at() -> f64 {
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

/// Clock ticks since boot now, as /proc start times count.
pub fn now_ticks() -> u64 {
    (crate::sys::boottime_secs() * crate::sys::clock_ticks_per_sec() as f64) as u64
}
