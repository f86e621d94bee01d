//! The parties a record names, confirmed by the kernel: the run's live wrapper and whoever
//! holds its lock.
//!
//! Nothing in the run dir is trusted for what gets signalled: the workload can rewrite every file
//! there. Before anything is signalled,
//! - the record must hold the whole identity ([`check_record`]): this boot, this user, the
//!   wrapper's pid and start ticks, and once launched the leader's pid, pgid, sid and start
//!   ticks, with pid == pgid == sid (a missing key is a corrupt record: nothing is signalled);
//! - the wrapper is confirmed by kernel facts ([`live_wrapper`]): pinned by a pidfd, its start
//!   ticks match, it holds the run dir's lock (/proc/locks, by the lock file's inode: a workload
//!   cannot take that lock while the wrapper lives) and its executable is agent-run. Only a
//!   [`VerifiedWrapper`] can be signalled ([`signal_wrapper`]), and never pid 1 or the caller.

use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::lock::{is_agent_run_exe, RunLock};
use crate::pid::Pid;
use crate::procfs;
use crate::record::{State, Status};
use crate::run_dir::{files, RunDir};
use crate::stop::Sig;
use crate::sys;
use serde_json::json;
use std::os::fd::{AsFd, OwnedFd};

/// Validate a record before acting on its processes: the whole identity must be there and agree
/// with the kernel where the kernel can tell. The error says what did not match; a record that
/// fails is corrupt and nothing it names is signalled.
pub fn check_record(st: &Status) -> Result<()> {
    let refuse = |why: String| Err(Error::Identity { why });
    let boot = procfs::boot_id();
    if st.boot_id.is_empty() || st.boot_id != boot {
        return refuse(format!(
            "the record is from another boot ({:?}), this boot is {boot}",
            st.boot_id
        ));
    }
    let me = sys::geteuid();
    if st.uid != me {
        return refuse(format!(
            "the run belongs to uid {}, not to uid {me}",
            st.uid
        ));
    }
    let this = Pid::this().get();
    match (st.wrapper_pid, st.wrapper_start_ticks) {
        (Some(p), Some(_)) if p > 1 && p != this => {}
        (Some(p), Some(_)) => {
            return refuse(format!(
                "wrapper_pid {p} cannot be a wrapper (pid 1, or this process)"
            ))
        }
        (None, _) => return refuse("the record has no wrapper_pid".into()),
        (_, None) => return refuse("the record has no wrapper_start_ticks".into()),
    }
    let leader = [
        st.pid.map(i64::from),
        st.pgid.map(i64::from),
        st.sid.map(i64::from),
        st.start_ticks.map(|t| t as i64),
    ];
    let known = leader.iter().filter(|v| v.is_some()).count();
    match known {
        // Not launched yet (or the wrapper died before it could say): only the marker and the
        // wrapper's identity describe the run.
        0 if matches!(st.state, State::Starting | State::Cancelling) => return Ok(()),
        0 => {
            return refuse(format!(
                "a {} record must name its leader (pid, pgid, sid, start_ticks)",
                st.state.as_str()
            ))
        }
        4 => {}
        _ => return refuse(
            "the record names its leader only in part (pid, pgid, sid and start_ticks go together)"
                .into(),
        ),
    }
    let (pid, pgid, sid, ticks) = (
        st.pid.unwrap_or_default(),
        st.pgid.unwrap_or_default(),
        st.sid.unwrap_or_default(),
        st.start_ticks.unwrap_or_default(),
    );
    if pid <= 1 || pid == this || pgid != pid || sid != pid {
        return refuse(format!(
            "the leader must be its own session and group leader other than pid 1 (pid {pid}, pgid {pgid}, sid {sid})"
        ));
    }
    let wrapper_ticks = st.wrapper_start_ticks.unwrap_or_default();
    if ticks < wrapper_ticks {
        return refuse(format!(
            "the leader (tick {ticks}) cannot have started before its wrapper (tick {wrapper_ticks})"
        ));
    }
    let pid = st.leader().expect("checked: all four, pid > 1").pid;
    if let Some(now) = procfs::stat(pid).filter(|s| !s.is_dead()) {
        if now.start_ticks != ticks {
            return refuse(format!(
                "pid {pid} is alive but started at tick {}, not at tick {ticks}: it is not the run's leader",
                now.start_ticks
            ));
        }
        // A session leader can change neither its group nor its session: a live leader that is
        // not pid == pgid == sid is not the process the wrapper started.
        if now.pgid != pid.get() || now.sid != pid.get() {
            return refuse(format!(
                "pid {pid} is alive but is not its own session and group leader (pgid {}, sid {}): it is not the run's leader",
                now.pgid, now.sid
            ));
        }
    }
    Ok(())
}

/// A wrapper confirmed by kernel facts and pinned by a pidfd: the only value
/// [`signal_wrapper`] accepts.
#[derive(Debug)]
pub struct VerifiedWrapper {
    fd: OwnedFd,
    pid: Pid,
}

impl VerifiedWrapper {
    /// Its pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The pidfd (poll it for the wrapper's exit).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Hand over the pidfd.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// The live wrapper of a record, or why there is none.
#[derive(Debug)]
pub enum Wrapper {
    /// Alive, with the recorded start time, holding the run's lock, running agent-run; pinned.
    Alive(VerifiedWrapper),
    /// No process with that pid (or a dead one): whoever holds the lock, if anyone, is not it.
    Gone,
    /// The pid is alive with the recorded start time, but the kernel says it is not this run's
    /// wrapper (another executable, or it does not hold the run's lock): the record names a
    /// process that is not the run's. Never signal it.
    Mismatch(String),
}

/// Find the record's wrapper and confirm it from kernel facts: pidfd first, then the start
/// time, the executable and the lock, so the process checked is the process we would signal.
pub fn live_wrapper(dir: &RunDir, st: &Status) -> Wrapper {
    let Some(pid) = st.wrapper_pid.and_then(|p| Pid::new(p.into())) else {
        return Wrapper::Gone;
    };
    if pid.get() == 1 || pid == Pid::this() {
        return Wrapper::Mismatch(format!("wrapper_pid {pid} cannot be a wrapper"));
    }
    let Ok(fd) = sys::pidfd_open(pid) else {
        return Wrapper::Gone;
    };
    let s = match procfs::stat(pid) {
        None => return Wrapper::Gone,
        Some(s) if s.is_dead() => return Wrapper::Gone,
        Some(s) => s,
    };
    let Some(ticks) = st.wrapper_start_ticks else {
        return Wrapper::Mismatch("the record has no wrapper_start_ticks".into());
    };
    if s.start_ticks != ticks {
        // Another process has the pid now (the wrapper died and the pid was reused), or the
        // record names someone else: either way not the wrapper, and the lock tells the rest.
        return Wrapper::Gone;
    }
    // What the kernel must confirm: the executable is agent-run and the process itself holds
    // the run's lock. `Some(why)` when it does not.
    let unconfirmed = || -> Option<String> {
        match procfs::exe_name(pid) {
            Some(name) if name == "agent-run" => {}
            other => {
                return Some(format!(
                    "wrapper pid {pid} runs {}, not agent-run",
                    other.as_deref().unwrap_or("an unreadable executable")
                ))
            }
        }
        let holds = dir
            .stat_file(files::LOCK)
            .filter(|m| m.regular)
            .is_some_and(|m| procfs::holds_flock(pid, m.dev, m.ino));
        (!holds).then(|| {
            format!(
                "wrapper pid {pid} does not hold the run's lock ({})",
                dir.file(files::LOCK).display()
            )
        })
    };
    // A wrapper on its way out drops its memory (its /proc exe link) and then its descriptors
    // (the lock) a moment before it becomes a zombie: give it that moment before calling it a
    // stranger.
    if let Some(why) = unconfirmed() {
        // Only a wrapper on its way out looks like this for a moment: its exe link gone, or
        // agent-run without the lock. A live process running something else is not exiting:
        // no wait (a root of records naming such processes would cost 250 ms a run).
        if procfs::exe_name(pid).is_some_and(|name| name != "agent-run")
            && procfs::stat(pid).is_some_and(|s| !s.is_dead())
        {
            return Wrapper::Mismatch(why);
        }
        // The kernel's PF_EXITING says so outright (it is set before the memory and the
        // descriptors go); a wrapper that has let go of its lock and is not yet exiting gets
        // a moment to.
        let exiting = |pid| procfs::stat(pid).is_none_or(|s| s.is_dead() || s.is_exiting());
        if exiting(pid) || exits_within(&fd, EXITING) || exiting(pid) {
            return Wrapper::Gone;
        }
        if let Some(why) = unconfirmed() {
            // On a loaded host a wrapper can linger longer than that between its final record
            // and its exit (agent-run, the lock let go): a record that is final by now was
            // written by it. Gone signals nothing either; the caller looks at the lock and the
            // record again (a record forged final says no more than it did before the look).
            if dir.read_status().is_ok_and(|now| now.state.is_final()) {
                return Wrapper::Gone;
            }
            return Wrapper::Mismatch(why);
        }
    }
    Wrapper::Alive(VerifiedWrapper { fd, pid })
}

/// How long a live process that should hold the run's lock, and does not, gets to show it is
/// only exiting.
const EXITING: std::time::Duration = std::time::Duration::from_millis(250);

/// Whether the process behind `pidfd` exits within `t` (the pidfd polls readable).
fn exits_within(pidfd: &OwnedFd, t: std::time::Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds = [sys::PollFd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    sys::poll(&mut fds, Some(t)).is_ok_and(|n| n > 0)
}

/// Send `sig` to a verified wrapper (ESRCH, it just exited, is success).
fn send_to_wrapper(w: &VerifiedWrapper, sig: Sig) -> Result<()> {
    match sys::pidfd_send_signal(w.fd.as_fd(), sig.number(), false) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(Error::io("signal", format!("wrapper pid {}", w.pid), e)),
    }
}

/// Send `sig` to a verified wrapper and journal it (target, signal, reason, and why when given):
/// every signal anyone sends to a run is in its journal.
pub fn signal_wrapper(
    w: &VerifiedWrapper,
    sig: Sig,
    reason: &str,
    why: Option<&str>,
    journal: &Journal,
) -> Result<()> {
    let mut ev = json!({
        "target": format!("pid:{}", w.pid),
        "signal": sig.name(),
        "reason": reason,
    });
    if let Some(w) = why {
        ev["why"] = json!(w);
    }
    let result = send_to_wrapper(w, sig);
    if let Err(e) = &result {
        ev["error"] = json!(e.to_string());
    }
    let _ = journal.event("signal", ev);
    result
}

/// Who holds a run's lock, when we could not take it.
#[derive(Debug)]
pub enum LockHolder {
    /// The record's wrapper, confirmed.
    Wrapper(VerifiedWrapper),
    /// Another agent-run party (a canceller, the watchdog) is finishing the run.
    Party(Vec<i32>),
    /// Something that is not agent-run holds it: the wrapper is gone and a process squats on
    /// its lock (a workload can open the lock file once the wrapper no longer holds it).
    Squatter(Vec<i32>),
    /// The record's wrapper pid is alive but is not the wrapper the kernel shows.
    Mismatch(String),
}

/// Tell who holds a lock we could not take.
pub fn lock_holder(lock: &RunLock, dir: &RunDir, st: &Status) -> LockHolder {
    match live_wrapper(dir, st) {
        Wrapper::Alive(w) => return LockHolder::Wrapper(w),
        Wrapper::Mismatch(why) => return LockHolder::Mismatch(why),
        Wrapper::Gone => {}
    }
    let holders = lock.holders();
    // A squatter is a live holder that is not agent-run (or hides what it runs: a
    // non-dumpable process). A holder that has exited meanwhile, or is exiting, is nobody: the
    // caller looks at the lock again. An exiting process has lost /proc/PID/exe before its
    // state says `Z` (a canceller that just wrote the final record and returns): the kernel's
    // PF_EXITING tells it apart from a squatter that hides its executable. The stat is read
    // again after the exe, so a holder that began to exit in between is not taken for one.
    let staying = |pid: Pid| procfs::stat(pid).is_some_and(|s| !s.is_dead() && !s.is_exiting());
    let squatters: Vec<i32> = holders
        .iter()
        .copied()
        .filter(|&p| {
            Pid::new(p.into()).is_some_and(|pid| {
                staying(pid)
                    && !procfs::exe_name(pid).is_some_and(|n| is_agent_run_exe(&n))
                    && staying(pid)
            })
        })
        .collect();
    if squatters.is_empty() {
        LockHolder::Party(holders)
    } else {
        LockHolder::Squatter(squatters)
    }
}
