//! Where a launch spends its time, under a debug switch.
//!
//! `AGENT_RUN_PHASES=/abs/path` makes the wrapper note the time at the end of each launch phase
//! (microseconds from the entry of `main`) and append, when it exits, one JSON line to that
//! file: `{"pid": N, "zero_monotonic_us": T, "phases": [{"name": "root", "us": 41}, ...]}`
//! (cumulative: a phase took its `us` minus the one before; T is CLOCK_MONOTONIC at the zero,
//! for a harness that notes the same clock around its spawn and wait). The keeper, a fork of the
//! wrapper, appends a line of its own, `"role": "keeper"`, with its marks on the same clock.
//! docs/benchmarks.md says how to read it. Unset, the normal case, it costs one getenv at start
//! and one relaxed atomic load per mark. The variable is never passed to the workload.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The variable that turns the timing on; its value is the file to append to.
pub const ENV: &str = "AGENT_RUN_PHASES";

static ON: AtomicBool = AtomicBool::new(false);
/// The clock's zero and the file to append to, once the switch is on.
static START: OnceLock<(Instant, std::ffi::OsString)> = OnceLock::new();
/// CLOCK_MONOTONIC at the clock's zero, in microseconds: a harness that noted the same clock at
/// its spawn and at its wait splits the launch into before `main`, the phases, and after.
static ZERO_MONO_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static MARKS: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());
/// Who writes the line: the wrapper, or a helper forked from it (the keeper).
static ROLE: OnceLock<&'static str> = OnceLock::new();

/// Start the clock (first thing in `main`) when the switch names an absolute path.
pub fn init() {
    let Some(v) = std::env::var_os(ENV) else {
        return;
    };
    if std::path::Path::new(&v).is_absolute() && START.set((Instant::now(), v)).is_ok() {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let us = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000;
        ZERO_MONO_US.store(us, Ordering::Relaxed);
        ON.store(true, Ordering::Relaxed);
    }
}

/// Note that the phase `name` ended now.
#[inline]
pub fn mark(name: &'static str) {
    if ON.load(Ordering::Relaxed) {
        mark_slow(name);
    }
}

#[cold]
fn mark_slow(name: &'static str) {
    let Some((t0, _)) = START.get() else { return };
    let us = t0.elapsed().as_micros() as u64;
    if let Ok(mut m) = MARKS.lock() {
        m.push((name, us));
    }
}

/// In a helper forked from the wrapper (the keeper), first thing: forget the wrapper's marks
/// and keep its zero, so the helper's own line (`"role": role`) is on the wrapper's clock.
pub fn forked(role: &'static str) {
    if ON.load(Ordering::Relaxed) {
        let _ = ROLE.set(role);
        if let Ok(mut m) = MARKS.lock() {
            m.clear();
        }
    }
}

/// Append the line (last thing before the exit). Errors are ignored: timing never fails a run.
pub fn flush() {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    mark("exit");
    let Some((_, path)) = START.get() else { return };
    let marks = MARKS.lock().map(|m| m.clone()).unwrap_or_default();
    let phases: Vec<serde_json::Value> = marks
        .iter()
        .map(|(n, us)| serde_json::json!({"name": n, "us": us}))
        .collect();
    let zero = ZERO_MONO_US.load(Ordering::Relaxed);
    let role = ROLE.get().copied().unwrap_or("wrapper");
    // This process's own CPU at its exit (a fork starts from zero): where a launch's time goes
    // when both cores are busy.
    let (user, sys, minflt) = agent_run_shared::sys::self_cpu();
    let cpu = serde_json::json!({"user_us": user, "sys_us": sys, "minflt": minflt});
    let line = serde_json::json!({"pid": std::process::id(), "role": role, "zero_monotonic_us": zero, "cpu": cpu, "phases": phases})
        .to_string()
        + "\n";
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}
