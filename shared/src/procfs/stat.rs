//! One process's stat line (/proc/PID/stat), read whole in one call.

use super::*;

/// The fields of /proc/PID/stat that agent-run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: Pid,
    /// One-letter state: R, S, D, Z, T, t, X, I ...
    pub state: u8,
    /// `None` where the kernel writes 0: for a process whose parent is in another pid
    /// namespace, and for kernel threads.
    pub ppid: Option<Pid>,
    /// `None` where the kernel writes 0 (a group or session in another pid namespace, a kernel
    /// thread).
    pub pgid: Option<Pid>,
    pub sid: Option<Pid>,
    /// Field 22: start time in clock ticks since boot.
    pub start_ticks: u64,
    /// Field 24: resident set size in pages.
    pub rss_pages: u64,
    /// Field 20: the number of threads of the process, its exited leader included while other
    /// threads live.
    pub threads: u64,
    /// Field 9: the kernel's task flags (`PF_*`).
    pub flags: u64,
}

impl Stat {
    /// The process's identity.
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    /// Dead: no thread of it can run code. `Z` in /proc/PID/stat is the *main thread's* state:
    /// a process whose main thread called `SYS_exit` while other threads run shows `Z` with
    /// `num_threads` > 1, and is alive. Only a zombie (or a task being torn down) with no other
    /// thread is dead.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') && self.threads <= 1
    }

    /// A zombie leader whose other threads still run.
    pub fn is_zombie_leader(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') && self.threads > 1
    }

    /// Its last thread is in `do_exit` (`PF_EXITING` on a process with no other thread): it
    /// runs no more code of its own, and its files (its flocks with them) are being released.
    /// A process in that window already has no `/proc/PID/exe` (its memory map is gone) while
    /// its state is not yet `Z`. A zombie leader whose other threads run is not exiting.
    pub fn is_exiting(&self) -> bool {
        const PF_EXITING: u64 = 0x4;
        self.flags & PF_EXITING != 0 && self.threads <= 1
    }

    /// Whether it leads its own process group.
    pub fn leads_group(&self) -> bool {
        self.pgid == Some(self.pid)
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
        ppid: crate::pid::parse_or_none(field(4)?)?,
        pgid: crate::pid::parse_or_none(field(5)?)?,
        sid: crate::pid::parse_or_none(field(6)?)?,
        start_ticks: field(22)?.parse().ok()?,
        rss_pages: field(24)?.parse().ok()?,
        threads: field(20)?.parse().ok()?,
        flags: field(9)?.parse().ok()?,
    })
}

/// Read /proc/PID/stat. `None` when the process is gone (or the line cannot be parsed).
pub fn stat(pid: Pid) -> Option<Stat> {
    let mut buf = [0u8; 1024];
    let mut f = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let n = read_full(&mut f, &mut buf)?;
    parse_stat(std::str::from_utf8(&buf[..n]).ok()?)
}

/// Read a /proc file into `buf`. The kernel makes such a file whole at the first read and
/// copies as much as fits, so a read that leaves room is all of it: the scans of every process
/// save the read that would only say EOF.
pub(super) fn read_full(f: &mut fs::File, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) if n == 0 && k < buf.len() => return Some(k),
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(n)
}
