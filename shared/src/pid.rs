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

/// The kernel's spelling of a pid that may be absent: 0 for none, as /proc/PID/stat writes
/// the parent of a process whose parent is in another pid namespace.
pub fn raw(pid: Option<Pid>) -> i32 {
    pid.map_or(0, Pid::get)
}

/// A pid field the kernel writes 0 into for "none" (a ppid, pgid or sid in /proc/PID/stat).
/// `None` for a negative number, which the kernel never writes.
pub fn parse_or_none(s: &str) -> Option<Option<Pid>> {
    match s.parse::<i32>().ok()? {
        0 => Some(None),
        n => Pid::new(n.into()).map(Some),
    }
}

/// Serialized as its number.
impl serde::Serialize for Pid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(self.get())
    }
}

/// Read from a number; 0, negative and out-of-range numbers are refused.
impl<'de> serde::Deserialize<'de> for Pid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pid, D::Error> {
        let raw = i32::deserialize(d)?;
        Pid::new(raw.into()).ok_or_else(|| {
            serde::de::Error::invalid_value(
                serde::de::Unexpected::Signed(raw.into()),
                &"a positive pid",
            )
        })
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A pid as a record claims it. A record is the workload's to rewrite, so a pid field may
/// hold a number that names no process (0, or negative). That number is kept as written: the
/// record's validation ([`crate::wrapper::check_record`]) refuses it by name, and a rewrite of
/// the record keeps it byte for byte. [`ClaimedPid::pid`] is the way to a [`Pid`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ClaimedPid {
    Pid(Pid),
    /// 0 or a negative number.
    NotAPid(i32),
}

impl ClaimedPid {
    /// The pid, when the number is one.
    pub fn pid(self) -> Option<Pid> {
        match self {
            ClaimedPid::Pid(p) => Some(p),
            ClaimedPid::NotAPid(_) => None,
        }
    }

    /// The number as written.
    pub fn raw(self) -> i32 {
        match self {
            ClaimedPid::Pid(p) => p.get(),
            ClaimedPid::NotAPid(n) => n,
        }
    }
}

/// In the order of the numbers.
impl Ord for ClaimedPid {
    fn cmp(&self, other: &ClaimedPid) -> std::cmp::Ordering {
        self.raw().cmp(&other.raw())
    }
}

impl PartialOrd for ClaimedPid {
    fn partial_cmp(&self, other: &ClaimedPid) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl From<Pid> for ClaimedPid {
    fn from(p: Pid) -> ClaimedPid {
        ClaimedPid::Pid(p)
    }
}

/// A number as a record holds it (a test writes a forged record with it).
impl From<i32> for ClaimedPid {
    fn from(raw: i32) -> ClaimedPid {
        Pid::new(raw.into()).map_or(ClaimedPid::NotAPid(raw), ClaimedPid::Pid)
    }
}

/// The number, as a list of them printed with `{:?}` always showed.
impl fmt::Debug for ClaimedPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.raw())
    }
}

impl fmt::Display for ClaimedPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.raw())
    }
}

/// Serialized as its number.
impl serde::Serialize for ClaimedPid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(self.raw())
    }
}

/// Any number in i32's range, as a record could always hold.
impl<'de> serde::Deserialize<'de> for ClaimedPid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ClaimedPid, D::Error> {
        i32::deserialize(d).map(ClaimedPid::from)
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

    #[test]
    fn a_pid_is_its_number_in_json_and_zero_is_refused() {
        let p = Pid::new(42).unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), "42");
        assert_eq!(serde_json::from_str::<Pid>("42").unwrap(), p);
        assert!(serde_json::from_str::<Pid>("0").is_err());
        assert!(serde_json::from_str::<Pid>("-1").is_err());
    }

    #[test]
    fn a_claimed_pid_keeps_the_number_it_was_written_with() {
        for text in ["42", "0", "-1", "-2147483648"] {
            let c: ClaimedPid = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&c).unwrap(), text);
            assert_eq!(c.to_string(), text);
            assert_eq!(format!("{:?}", [c]), format!("[{text}]"));
            assert_eq!(c.pid().is_some(), text == "42", "{text}");
        }
        assert!(serde_json::from_str::<ClaimedPid>("2147483648").is_err());
        assert!(serde_json::from_str::<ClaimedPid>("\"1\"").is_err());
    }

    #[test]
    fn the_kernels_zero_is_no_pid() {
        assert_eq!(parse_or_none("0"), Some(None));
        assert_eq!(parse_or_none("7"), Some(Pid::new(7)));
        assert_eq!(parse_or_none("-1"), None);
        assert_eq!(raw(None), 0);
    }
}
