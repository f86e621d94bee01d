//! The syscalls std lacks, in small functions with typed arguments, so callers stay in safe
//! code.
//!
//! Most bodies are [rustix](https://docs.rs/rustix) calls: borrowed descriptors, typed pids and
//! signals, errno as `io::Error`, kept by people who read the kernel's ABI for a living. What
//! rustix does not offer is a raw call, each block with its safety argument:
//! `pidfd_send_signal` with flags, clone3, the `rt_sigaction` reset of every signal and
//! `close_range` for `pre_exec`, SIGPIPE's default action. This is the only module of the
//! library that may use `unsafe`, and it imports nothing of the library but [`Pid`] and
//! [`Sig`]. Functions
//! marked async-signal-safe are the only ones a `pre_exec` closure may call.
//!
//! One file per concern: `signals` and `marks` (kill, masks, actions; what a process shows
//! of itself), `process` (pidfds and the reap), `host` (facts, limits), `files` (whole reads, flock), `poll` (poll, inotify, epoll), `session`
//! (what `pre_exec` may call), `spawn` and `exec` (the workload's clone3 and its child up
//! to the exec), `helper` (the keeper's fork), `heap` (the musl binaries' allocator).
#![allow(unsafe_code)]

mod exec;
mod files;
#[cfg(target_env = "musl")]
mod heap;
mod helper;
mod host;
mod marks;
mod poll;
mod process;
mod session;
mod signals;
mod spawn;
#[cfg(test)]
mod tests;

pub use exec::*;
pub use files::*;
#[cfg(target_env = "musl")]
pub use heap::*;
pub use helper::*;
pub use host::*;
pub use marks::*;
pub use poll::*;
pub use process::*;
pub use session::*;
pub use signals::*;
pub use spawn::*;

use crate::pid::Pid;
use crate::signal::Sig;
use rustix::event::{epoll, PollFlags, Timespec};
use rustix::fs::inotify;
use rustix::process::{Resource, Rlimit, Signal, WaitOptions};
use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Our positive pid as rustix's.
pub(crate) fn rustix_pid(pid: Pid) -> rustix::process::Pid {
    rustix::process::Pid::from_raw(pid.get()).expect("a Pid is positive")
}

/// A timeout as the kernel takes it; durations beyond `i64` seconds wait forever.
pub(super) fn timespec(d: Duration) -> Option<Timespec> {
    Timespec::try_from(d).ok()
}

/// A signal as rustix's typed signal. EINVAL for numbers the kernel has no signal for.
pub(super) fn signal(sig: Sig) -> io::Result<Signal> {
    let n = sig.number();
    if let Some(s) = Signal::from_named_raw(n) {
        return Ok(s);
    }
    // SAFETY: a number in the kernel's signal range (1..=64), so a valid, non-zero signal.
    // rustix's caveat about libc's reserved real-time numbers concerns signals this process
    // would block, catch or consume; these are only ever sent to other processes.
    (1..=64)
        .contains(&n)
        .then(|| unsafe { Signal::from_raw_unchecked(n) })
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The errno of the last failed call, without allocating.
pub(super) fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
