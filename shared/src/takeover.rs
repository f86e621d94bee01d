//! Acting on a run from outside its wrapper: `cancel` and the watchdog.
//!
//! The wrapper holds an exclusive `flock` on `<run dir>/lock` for its whole life. Whoever else
//! takes that lock knows the wrapper is gone and becomes the one party allowed to write the final
//! record. Before anything is signalled, the record is validated ([`check_record`]): this boot,
//! this user, and a recorded process that is alive must still have its recorded start time
//! (otherwise its pid was reused, and we refuse). A live wrapper is reached through a pidfd
//! opened before its start time is checked ([`live_wrapper`]).

use crate::atomic::open_read;
use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::pid::Pid;
use crate::procfs;
use crate::record::{State, Status};
use crate::root::files;
use crate::run::{finalize, scope_of, timings_of, transition};
use crate::stop::{stop_run, Report, Sig};
use crate::sys;
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The run's lock file, opened (not yet locked).
pub struct RunLock {
    file: File,
}

impl RunLock {
    /// Open (creating, 0600, never through a symlink) `<dir>/lock`.
    pub fn open(dir: &Path) -> Result<RunLock> {
        let path = dir.join(files::LOCK);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| Error::io("open lock file", &path, e))?;
        Ok(RunLock { file })
    }

    /// Take the lock without blocking. `false`: someone (the wrapper, another canceller, the
    /// watchdog) holds it.
    pub fn try_lock(&self) -> Result<bool> {
        sys::try_lock_exclusive(self.file.as_fd()).map_err(|e| Error::io("lock", "lock file", e))
    }
}

/// Validate a record before acting on its processes. The error says what did not match.
pub fn check_record(st: &Status) -> Result<()> {
    let refuse = |why: String| Err(Error::Identity { why });
    let boot = procfs::boot_id();
    if st.boot_id != boot {
        return refuse(format!(
            "the record is from another boot ({}), this boot is {boot}",
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
    if let (Some(pid), Some(ticks)) = (st.pid.and_then(|p| Pid::new(p.into())), st.start_ticks) {
        if let Some(now) = procfs::stat(pid).filter(|s| !s.is_dead()) {
            if now.start_ticks != ticks {
                return refuse(format!(
                    "pid {pid} is alive but started at tick {}, not at tick {ticks}: it is not the run's leader",
                    now.start_ticks
                ));
            }
        }
    }
    Ok(())
}

/// The live wrapper of a record, pinned by a pidfd, or why there is none.
pub enum Wrapper {
    /// Alive, with the recorded start time, pinned.
    Alive(OwnedFd),
    /// No process with that pid (or a zombie).
    Gone,
    /// The pid is alive but is another process: never signal it.
    Reused(String),
}

/// Find the record's wrapper: pidfd first, then the start-time check, so the process checked is
/// the process we would signal.
pub fn live_wrapper(st: &Status) -> Wrapper {
    let Some(pid) = st.wrapper_pid.and_then(|p| Pid::new(p.into())) else {
        return Wrapper::Gone;
    };
    let Ok(fd) = sys::pidfd_open(pid) else {
        return Wrapper::Gone;
    };
    match procfs::stat(pid) {
        None => Wrapper::Gone,
        Some(s) if s.is_dead() => Wrapper::Gone,
        Some(s) if st.wrapper_start_ticks.is_some_and(|t| t != s.start_ticks) => {
            Wrapper::Reused(format!(
                "wrapper pid {pid} is alive but started at tick {}, not at tick {}",
                s.start_ticks,
                st.wrapper_start_ticks.unwrap_or_default()
            ))
        }
        Some(_) => Wrapper::Alive(fd),
    }
}

/// Send `sig` to a pinned wrapper.
pub fn signal_wrapper(fd: &OwnedFd, sig: Sig) -> Result<()> {
    match sys::pidfd_send_signal(fd.as_fd(), sig.number(), false) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(Error::io("signal", "wrapper", e)),
    }
}

/// Send `sig` to a record's pinned wrapper and journal it (target, signal, reason, and why when
/// given): every signal anyone sends to a run is in its journal.
pub fn signal_wrapper_journalled(
    fd: &OwnedFd,
    st: &Status,
    sig: Sig,
    reason: &str,
    why: Option<&str>,
    journal: &Journal,
) -> Result<()> {
    let mut ev = json!({
        "target": format!("pid:{}", st.wrapper_pid.unwrap_or_default()),
        "signal": sig.name(),
        "reason": reason,
    });
    if let Some(w) = why {
        ev["why"] = json!(w);
    }
    let _ = journal.event("signal", ev);
    signal_wrapper(fd, sig)
}

/// Write cancel.json (who asked and why) unless one exists: created with `link(2)` from a
/// complete temp file, so it appears whole and exactly one caller creates it. Returns whether
/// this call created it.
pub fn request_cancel(dir: &Path, source: &str, reason: &str) -> Result<bool> {
    let doc = json!({
        "source": source,
        "reason": reason,
        "requested_at": crate::time::rfc3339_now(),
        "by_uid": sys::geteuid(),
        "by_pid": std::process::id(),
    });
    crate::atomic::write_new(dir, files::CANCEL, format!("{doc}\n").as_bytes())
}

/// The reason in cancel.json, if there is one.
pub fn cancel_reason(dir: &Path) -> Option<String> {
    let mut s = String::new();
    open_read(dir, files::CANCEL)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&s).ok()?;
    Some(v.get("reason")?.as_str()?.to_string())
}

/// With the lock held and the wrapper gone: stop whatever of the run remains through the shared
/// routine and write the final record. If processes were found and stopped: `cancelled` with
/// `reason`. If nothing of the run remained: `unknown`, reason `wrapper_lost` (nobody saw how
/// it ended). Survivors: `unknown`, `survivors`.
pub fn stop_orphaned(
    dir: &Path,
    st: &mut Status,
    reason: &str,
    journal: &Journal,
) -> Result<Report> {
    let Some(scope) = scope_of(dir, st, None) else {
        // Never launched (the wrapper died while starting): nothing can be running.
        finalize(
            dir,
            st,
            State::Unknown,
            Some("wrapper_lost"),
            None,
            Some(journal),
        )?;
        return Ok(Report::default());
    };
    if st.state != State::Cancelling {
        // A record that cannot be written (a full disk) never keeps the processes alive.
        let _ = transition(dir, st, State::Cancelling, Some(reason), Some(journal));
    }
    let report = stop_run(&scope, &timings_of(st), reason, Some(journal), None);
    let (state, why) = if report.signalled.is_empty() {
        (State::Unknown, "wrapper_lost")
    } else {
        (State::Cancelled, reason)
    };
    st.exit_code = None;
    st.term_signal = None;
    finalize(dir, st, state, Some(why), Some(&report), Some(journal))?;
    Ok(report)
}

/// With the lock held, for a run dir that has no record (its wrapper died between `mkdir` and
/// its first record, before anything was spawned): write a final `unknown` record, reason
/// `wrapper_lost`, so every run dir ends with a whole, truthful document.
pub fn record_lost_launch(dir: &Path, run_id: &str, journal: &Journal) -> Result<Status> {
    let mut st = Status::blank(run_id);
    st.error = Some("the wrapper died before it wrote the run's first record".into());
    finalize(
        dir,
        &mut st,
        State::Unknown,
        Some("wrapper_lost"),
        None,
        Some(journal),
    )?;
    Ok(st)
}
