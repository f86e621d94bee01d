//! The parties that hold a run, confirmed by the kernel: its live wrapper, or whoever else
//! holds its lock.
//!
//! Nothing in the run dir decides who the wrapper is: the workload can rewrite, delete or
//! replace every file there. The wrapper is the process that holds the run's lock
//! ([`crate::lock`]: a `flock(2)` on the run dir's own inode, and on `lock`), by /proc/locks,
//! and that the kernel shows as a wrapper ([`verify_wrapper`]): of this user (its real uid),
//! named `agent-run`, started no later than the run dir was made (every process of the
//! workload started after), not inside the run's cgroup, and running agent-run where its
//! executable can be read (root reads it; the wrapper is non-dumpable, so its own user cannot).
//! What the record says of the wrapper (`wrapper_pid`, `wrapper_start_ticks`) only informs.
//! Only a [`VerifiedWrapper`] can be signalled ([`signal_wrapper`]), and never pid 1 or the
//! caller.
//!
//! [`check_record`] says whether the record's identity of the run's leader may be used for a
//! stop's scope; a record that fails it is stopped by the kernel's facts alone (the cgroup by
//! name, the marker), never refused.

use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::lock::{is_agent_run_exe, LockIds};
use crate::pid::{ClaimedPid, Identity, Pid};
use crate::procfs;
use crate::reason::Reason;
use crate::record::{State, Status};
use crate::run_dir::RunDir;
use crate::stop::Sig;
use crate::sys;
use serde_json::json;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

/// Validate a record's identity of the run before a stop uses it: this boot, this user, the
/// wrapper's pid and start ticks, and once launched the leader's pid, pgid, sid and start
/// ticks, with pid == pgid == sid and the leader not older than the wrapper, and a live pid of
/// that number being that leader. The error says what did not match.
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
    // The record's numbers as written: a claimed pid may be none (0, negative).
    let raw = |c: Option<ClaimedPid>| c.map(ClaimedPid::raw);
    let this = Pid::this().get();
    match (raw(st.wrapper_pid), st.wrapper_start_ticks) {
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
        raw(st.pid).map(i64::from),
        raw(st.pgid).map(i64::from),
        raw(st.sid).map(i64::from),
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
        raw(st.pid).unwrap_or_default(),
        raw(st.pgid).unwrap_or_default(),
        raw(st.sid).unwrap_or_default(),
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
        if now.pgid != Some(pid) || now.sid != Some(pid) {
            return refuse(format!(
                "pid {pid} is alive but is not its own session and group leader (pgid {}, sid {}): it is not the run's leader",
                crate::pid::raw(now.pgid),
                crate::pid::raw(now.sid)
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
    start_ticks: u64,
    /// Its signal facts as the verification read them.
    signals: procfs::SigDispositions,
}

impl VerifiedWrapper {
    /// Its pid.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Its start time in clock ticks since boot.
    pub fn start_ticks(&self) -> u64 {
        self.start_ticks
    }

    /// Its pid and start time.
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    /// Whether it was stopping its run when it was verified (its signal mask:
    /// [`procfs::SigDispositions::marks_stopping`]); a caller that acts on it reads it afresh.
    pub fn was_stopping(&self) -> bool {
        self.signals.marks_stopping()
    }

    /// The pidfd (poll it for the wrapper's exit).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Hand over the pidfd.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Whether it has exited (its pidfd is readable).
    pub fn exited(&self) -> bool {
        exits_within(&self.fd, Duration::ZERO)
    }
}

/// Who holds a run, by the kernel's account of its lock.
#[derive(Debug)]
pub enum Holder {
    /// The run's wrapper, alive and confirmed, pinned.
    Wrapper(VerifiedWrapper),
    /// An agent-run party (a `cancel`, the watchdog) holds the lock: it is finishing the run.
    Party(Vec<Pid>),
    /// Only processes that are not agent-run hold it: the wrapper is gone, and the workload
    /// (or something of the user) squats on the lock.
    Squatter(Vec<Pid>),
    /// Nobody holds it: the wrapper is gone.
    Nobody,
}

impl Holder {
    /// The wrapper, if it is the holder.
    pub fn wrapper(&self) -> Option<&VerifiedWrapper> {
        match self {
            Holder::Wrapper(w) => Some(w),
            _ => None,
        }
    }
}

/// Who holds the run: the holders of its lock (the dir's first, then `lock`'s), the first that
/// [`verify_wrapper`] confirms being the wrapper. `table` is a read of /proc/locks shared by
/// many runs (else each look reads it afresh); `cgroup` is the run's cgroup, when it has one
/// (the wrapper is never inside it); `named` is the wrapper the record names, a candidate only.
/// A holder that is exiting (it let go, or is about to) is looked at again.
pub fn holder(
    dir: &RunDir,
    ids: LockIds,
    table: Option<&procfs::LockTable>,
    cgroup: Option<&std::path::Path>,
    named: Option<Pid>,
) -> Holder {
    // Asking the lock itself is cheap and sure; /proc/locks (who holds it) only when held.
    if table.is_none() && dir.lock_held() == Some(false) {
        return Holder::Nobody;
    }
    // The wrapper the record names, when its own fdinfo shows it holding the dir's lock and the
    // kernel confirms it: the answer /proc/locks would give, without a read of /proc/locks
    // (each waits for an RCU grace period: 5 to 30 ms of every cancel and status).
    if let Some(w) = named
        .filter(|&p| table.is_none() && procfs::holds_flock(p, ids.dir.0, ids.dir.1))
        .and_then(|p| verify_wrapper(dir, p, cgroup).ok())
    {
        return Holder::Wrapper(w);
    }
    for _ in 0..3 {
        let (mut holders, file) = ids.holders(table);
        let dir_held = !holders.is_empty();
        for p in file {
            if !holders.contains(&p) {
                holders.push(p);
            }
        }
        if holders.is_empty() {
            return Holder::Nobody;
        }
        if let Some(w) = holders
            .iter()
            .find_map(|&p| verify_wrapper(dir, p, cgroup).ok())
        {
            return Holder::Wrapper(w);
        }
        // Not the wrapper: a party or a squatter. One that is exiting is nobody; look again.
        let staying = |p: Pid| procfs::stat(p).is_some_and(|s| !s.is_dead() && !s.is_exiting());
        let live: Vec<Pid> = holders.into_iter().filter(|&p| staying(p)).collect();
        if live.is_empty() {
            if table.is_some() {
                return Holder::Nobody;
            }
            continue;
        }
        let party = |p: &Pid| procfs::exe_name(*p).is_some_and(|n| is_agent_run_exe(&n));
        let (parties, squatters): (Vec<Pid>, Vec<Pid>) = live.into_iter().partition(party);
        // A party takes the dir's lock first: it holds the run. Squatters alone hold nothing.
        return if (dir_held && !parties.is_empty()) || squatters.is_empty() {
            Holder::Party(parties)
        } else {
            Holder::Squatter(squatters)
        };
    }
    Holder::Nobody
}

/// The run's live wrapper, if one holds the run (a convenience over [`holder`]).
pub fn live_wrapper(dir: &RunDir) -> Option<VerifiedWrapper> {
    let cgroup = crate::cgroup::find_run_cgroup(dir);
    match holder(
        dir,
        dir.lock_ids(),
        None,
        cgroup.as_ref().map(|c| c.path()),
        None,
    ) {
        Holder::Wrapper(w) => Some(w),
        _ => None,
    }
}

/// Confirm that `pid`, a holder of the run's lock, is the run's wrapper, from kernel facts
/// only; the pidfd is opened first, so the process checked is the one that would be signalled.
/// The error says which fact failed.
pub fn verify_wrapper(
    dir: &RunDir,
    pid: Pid,
    cgroup: Option<&std::path::Path>,
) -> std::result::Result<VerifiedWrapper, String> {
    if pid.get() == 1 || pid == Pid::this() {
        return Err(format!("pid {pid} cannot be a wrapper"));
    }
    let fd = sys::pidfd_open(pid).map_err(|e| format!("pid {pid}: {e}"))?;
    let st = procfs::stat(pid)
        .filter(|s| !s.is_dead())
        .ok_or_else(|| format!("pid {pid} is gone"))?;
    let signals = procfs::sig_dispositions(pid).ok_or_else(|| format!("pid {pid} is gone"))?;
    if signals.real_uid != Some(sys::geteuid()) {
        return Err(format!("pid {pid} is not a process of this user"));
    }
    if procfs::comm(pid).as_deref() != Some("agent-run") {
        return Err(format!("pid {pid} is not named agent-run"));
    }
    // A `cancel`, a `status`, the watchdog: holding the lock for a look or a takeover.
    if signals.blocks(sys::PARTY_MARK) && !signals.blocks(Sig::Term) {
        return Err(format!("pid {pid} is an agent-run party, not a wrapper"));
    }
    // The wrapper made the run dir: it started no later (a tick of slack for the clock
    // arithmetic). Every process of the workload started after.
    if let Some(born) = dir
        .born()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
    {
        let born = procfs::epoch_to_ticks(born.as_secs_f64());
        if st.start_ticks > born + 1 {
            return Err(format!(
                "pid {pid} started at tick {}, after the run dir was made (tick {born})",
                st.start_ticks
            ));
        }
    }
    if let (Some(cg), Some(mine)) = (cgroup, procfs::cgroup_of(pid)) {
        let mine = crate::cgroup::mount().map(|m| m.join(mine.trim_start_matches('/')));
        if mine.is_some_and(|m| m.starts_with(cg)) {
            return Err(format!("pid {pid} is inside the run's cgroup"));
        }
    }
    // Root reads every executable; the wrapper's own user cannot (it is non-dumpable).
    if let Some(name) = procfs::exe_name(pid) {
        if name != "agent-run" {
            return Err(format!("pid {pid} runs {name}, not agent-run"));
        }
    }
    Ok(VerifiedWrapper {
        fd,
        pid,
        start_ticks: st.start_ticks,
        signals,
    })
}

/// Whether the process behind `pidfd` exits within `t` (the pidfd polls readable).
fn exits_within(pidfd: &OwnedFd, t: Duration) -> bool {
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
    match sys::pidfd_send_signal(w.fd.as_fd(), sig) {
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
    reason: Reason,
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

/// Let a wrapper that cannot act run again: thaw the cgroup it is in when that cgroup is
/// frozen (the workload may have moved it into one of its own and frozen it; writable where
/// the workload's was), and CONT it when it is stopped. Journalled.
pub fn unfreeze_wrapper(w: &VerifiedWrapper, reason: Reason, journal: &Journal) {
    if let Some(cg) = procfs::cgroup_of(w.pid())
        .and_then(|rel| crate::cgroup::mount().map(|m| m.join(rel.trim_start_matches('/'))))
    {
        for (thawed, error) in crate::cgroup::thaw_all(&cg) {
            let _ = journal.event(
                "thaw",
                json!({"cgroup": thawed, "wrapper_pid": w.pid().get(), "reason": reason,
                       "error": error}),
            );
        }
    }
    if procfs::stopped_or_stopping(w.pid()) {
        let _ = signal_wrapper(
            w,
            Sig::Cont,
            reason,
            Some("the wrapper is stopped"),
            journal,
        );
    }
}

/// End a wrapper that made no progress: thaw and CONT it (a frozen or stopped process takes
/// a KILL too, but its descriptors, and so the run's lock, are let go only as it runs), KILL
/// it, and wait up to `wait` for its exit. Returns whether it exited.
pub fn kill_wrapper(
    w: &VerifiedWrapper,
    reason: Reason,
    journal: &Journal,
    wait: Duration,
) -> bool {
    unfreeze_wrapper(w, reason, journal);
    let _ = signal_wrapper(
        w,
        Sig::Kill,
        reason,
        Some("the wrapper made no progress"),
        journal,
    );
    exits_within(&w.fd, wait)
}
