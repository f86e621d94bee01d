//! A process's signal facts from /proc/PID/status: ignored, caught, blocked, pending, stopped; and the marks agent-run leaves in its mask.

use super::*;
use crate::signal::Sig;

/// Signal facts from /proc/PID/status (`SigIgn`, `SigCgt`, `SigBlk`, `SigPnd` | `ShdPnd`
/// bitmasks, bit N-1 = signal N; and whether `State:` is T or t), and the real uid the same
/// read gives (the kernel makes the whole file for each read: one read, not two).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SigDispositions {
    pub ignored: u64,
    pub caught: u64,
    pub blocked: u64,
    /// Pending for the thread or its process.
    pub pending: u64,
    /// Stopped by a signal or a tracer.
    pub stopped: bool,
    /// The real uid (`Uid:`, its first field).
    pub real_uid: Option<u32>,
}

impl SigDispositions {
    /// Whether signal `sig` is ignored (SIG_IGN): it can run no handler for it.
    pub fn ignores(&self, sig: Sig) -> bool {
        self.ignored & bit(sig) != 0
    }

    /// Whether signal `sig` is in the (main thread's) mask.
    pub fn blocks(&self, sig: Sig) -> bool {
        self.blocked & bit(sig) != 0
    }

    /// Whether the mask says "stopping its run" ([`crate::sys::mark_stopping`]): the mark
    /// blocked while TERM is not (the wrapper blocks every signal, for a moment, around its
    /// clones; it never blocks TERM otherwise).
    pub fn marks_stopping(&self) -> bool {
        self.blocks(crate::sys::STOPPING_MARK) && !self.blocks(Sig::Term)
    }
}

/// The bit of `sig` in a /proc mask (bit N-1 for signal N); 0 outside 1..=64.
fn bit(sig: Sig) -> u64 {
    match sig.number() {
        n @ 1..=64 => 1u64 << (n - 1),
        _ => 0,
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
    sig_dispositions(pid).is_some_and(|d| d.blocks(crate::sys::FINAL_MARK) && !d.blocks(Sig::Term))
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
        } else if let Some(v) = line.strip_prefix("Uid:") {
            d.real_uid = v
                .split_ascii_whitespace()
                .next()
                .and_then(|u| u.parse().ok());
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
