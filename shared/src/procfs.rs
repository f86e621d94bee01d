//! Reading /proc: one process's stat line, its signal dispositions, its environment marker, the
//! boot id, and a scan of every process.
//!
//! Nothing here signals or waits; it only reads. A process that vanishes between the directory
//! listing and the read is simply absent from the result (ENOENT/ESRCH are not errors here).
//! A zombie's stat is still readable (pgid, sid, start time); callers decide what `Z` means.

use crate::pid::{Identity, Pid};
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

/// The fields of /proc/PID/stat that agent-run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: Pid,
    /// One-letter state: R, S, D, Z, T, t, X, I ...
    pub state: u8,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    /// Field 22: start time in clock ticks since boot.
    pub start_ticks: u64,
    /// Field 24: resident set size in pages.
    pub rss_pages: u64,
}

impl Stat {
    /// The process's identity.
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    /// Dead for our purposes: a zombie or a task being torn down. It can run no code.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x')
    }

    /// Stopped by a signal or a tracer: a TERM stays pending until it is continued.
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, b'T' | b't')
    }
}

/// Parse a /proc/PID/stat line. The command name may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = Pid::new(line[..open].trim().parse().ok()?)?;
    let rest: Vec<&str> = line.get(close + 1..)?.split_ascii_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let field = |n: usize| rest.get(n - 3).copied();
    Some(Stat {
        pid,
        state: *field(3)?.as_bytes().first()?,
        ppid: field(4)?.parse().ok()?,
        pgid: field(5)?.parse().ok()?,
        sid: field(6)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
        rss_pages: field(24)?.parse().ok()?,
    })
}

/// Read /proc/PID/stat. `None` when the process is gone (or the line cannot be parsed).
pub fn stat(pid: Pid) -> Option<Stat> {
    let mut buf = [0u8; 1024];
    let mut f = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let n = read_full(&mut f, &mut buf)?;
    parse_stat(std::str::from_utf8(&buf[..n]).ok()?)
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(n)
}

/// Signal dispositions from /proc/PID/status (`SigIgn`, `SigCgt` bitmasks, bit N-1 = signal N).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SigDispositions {
    pub ignored: u64,
    pub caught: u64,
    pub blocked: u64,
}

impl SigDispositions {
    /// Whether signal `sig` is ignored (SIG_IGN): it can run no handler for it.
    pub fn ignores(&self, sig: i32) -> bool {
        sig > 0 && sig <= 64 && self.ignored & (1u64 << (sig - 1)) != 0
    }
}

/// Read SigIgn/SigCgt/SigBlk of a process. `None` when it is gone.
pub fn sig_dispositions(pid: Pid) -> Option<SigDispositions> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut d = SigDispositions::default();
    for line in text.lines() {
        let hex = |v: &str| u64::from_str_radix(v.trim(), 16).unwrap_or(0);
        if let Some(v) = line.strip_prefix("SigIgn:") {
            d.ignored = hex(v);
        } else if let Some(v) = line.strip_prefix("SigCgt:") {
            d.caught = hex(v);
        } else if let Some(v) = line.strip_prefix("SigBlk:") {
            d.blocked = hex(v);
        }
    }
    Some(d)
}

/// The values of the given variables in a process's environment (/proc/PID/environ), in the
/// order asked; `None` for a variable that is not set. Empty when the process is gone or its
/// environment is unreadable (another user's, or a kernel thread).
pub fn environ_get(pid: Pid, names: &[&str]) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![None; names.len()];
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return out;
    };
    for kv in env.split(|&b| b == 0) {
        for (i, name) in names.iter().enumerate() {
            if kv.len() > name.len() && kv.starts_with(name.as_bytes()) && kv[name.len()] == b'=' {
                out[i] = Some(kv[name.len() + 1..].to_vec());
            }
        }
    }
    out
}

/// The owner uid of a process (owner of /proc/PID). `None` when it is gone.
pub fn uid_of(pid: Pid) -> Option<u32> {
    fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// This boot's id (/proc/sys/kernel/random/boot_id), trimmed.
pub fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The stat of every process visible in /proc (thread-group leaders only). Processes that vanish
/// during the scan are skipped.
pub fn scan() -> Vec<Stat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid = Pid::new(e.file_name().to_str()?.parse().ok()?)?;
        stat(pid)
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_a_hostile_command_name() {
        let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                    987654 1000 250 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid.get(), 4242);
        assert_eq!(s.state, b'S');
        assert_eq!((s.ppid, s.pgid, s.sid), (1, 4242, 4242));
        assert_eq!(s.start_ticks, 987654);
        assert_eq!(s.rss_pages, 250);
    }

    #[test]
    fn reads_this_process() {
        let me = stat(Pid::this()).unwrap();
        assert_eq!(me.pid, Pid::this());
        assert!(me.start_ticks > 0);
        assert!(scan().iter().any(|s| s.pid == Pid::this()));
        assert!(!boot_id().is_empty());
        assert!(sig_dispositions(Pid::this()).is_some());
    }

    #[test]
    fn sig_ignored_bit_maps_to_signal_number() {
        let d = SigDispositions {
            ignored: 0x0000000000384004,
            ..Default::default()
        };
        assert!(d.ignores(libc::SIGTERM));
        assert!(d.ignores(libc::SIGQUIT));
        assert!(!d.ignores(libc::SIGHUP));
    }
}
