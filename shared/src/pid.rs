//! Process identities that make the dangerous calls unwritable.
//!
//! [`Pid`] is always positive: `kill(0, ..)` (our own group) and `kill(-1, ..)` (everything we
//! may signal) cannot be expressed with it. [`Identity`] is a pid plus the process's start time in
//! clock ticks since boot: the pair names one process for the life of a boot, so a reused pid is
//! told apart from the process a record names.

use std::fmt;
use std::num::NonZeroI32;

/// A process id, always > 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(NonZeroI32);

impl Pid {
    /// A pid from a raw value; `None` for 0 and negative values.
    pub fn new(raw: i64) -> Option<Pid> {
        if raw <= 0 || raw > i32::MAX as i64 {
            return None;
        }
        NonZeroI32::new(raw as i32).map(Pid)
    }

    /// The raw pid, for syscalls.
    pub fn get(self) -> i32 {
        self.0.get()
    }

    /// This process.
    pub fn this() -> Pid {
        Pid::new(std::process::id() as i64).expect("getpid() is positive")
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One process for the life of a boot: pid and start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub pid: Pid,
    pub start_ticks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_negative_pids_do_not_exist() {
        assert!(Pid::new(0).is_none());
        assert!(Pid::new(-1).is_none());
        assert!(Pid::new(i64::from(i32::MAX) + 1).is_none());
        assert_eq!(Pid::new(42).unwrap().get(), 42);
    }
}
