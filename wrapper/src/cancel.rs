//! `agent-run cancel`: one run, several, `--all` or `--label`.
//!
//! `cancel` never trusts a record blindly: it validates it ([`check_record`]), pins the wrapper
//! with a pidfd before checking its start time, and only then signals it. When the wrapper is gone
//! (its lock can be taken) it stops the run itself through the shared routine and writes the final
//! record. Concurrent cancels agree: exactly one creates cancel.json and signals, or takes the
//! lock; the others wait for the same final record.

use crate::cli::CancelArgs;
use crate::error::fail;
use crate::human;
use crate::runs::{self, open_run, print_record, read_record};
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::journal::Journal;
use agent_run_shared::lifecycle::{
    record_lost_launch, reopen_contradicted, stop_orphaned, timings_of,
};
use agent_run_shared::record::{State, Status};
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::stop::Sig;
use agent_run_shared::sys::{self, PollFd};
use agent_run_shared::wrapper::{
    check_record, lock_holder, signal_wrapper, LockHolder, VerifiedWrapper,
};
use agent_run_shared::{procfs, Error};
use serde_json::json;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long `cancel` waits for the first record of a launch that holds its lock.
const LOST_LAUNCH_AFTER: Duration = Duration::from_secs(10);

/// How many runs `cancel` stops at once: each is a thread that signals, then waits.
const CANCEL_PARALLEL: usize = 128;

/// `agent-run cancel`: one run, several, `--all` or `--label`. Several are cancelled
/// concurrently (every wrapper is signalled before any final record is waited for), and their
/// final records come back as one JSON array. On a terminal, without `--json`, one line a run.
pub fn cancel(root: Option<&Path>, args: CancelArgs) -> anyhow::Result<u8> {
    let json = args.json || !human::stdout_is_terminal();
    let colour = human::colour_for(human::stdout_is_terminal());
    let ids = match select::pick(root, &args.select, true)? {
        Picked::One(id) => {
            let (dir, st) = cancel_one(root, &id, args.wait)?;
            if json {
                print_record(&dir, &st);
            } else {
                println!("{}", human::final_line(&st, colour));
            }
            return Ok(exit::OK);
        }
        Picked::Many(ids) => ids,
    };
    let results = parallel(&ids, CANCEL_PARALLEL, |id| cancel_one(root, id, args.wait));
    let mut code = exit::OK;
    let mut docs = Vec::new();
    for (id, r) in ids.iter().zip(results) {
        match r {
            Ok((dir, st)) => {
                if json {
                    docs.push(runs::record_value(&dir, &st));
                } else {
                    println!("{}", human::final_line(&st, colour));
                }
            }
            Err(e) => {
                let (doc, c) = select::error_entry(id, &e);
                docs.push(doc);
                if code == exit::OK {
                    code = c;
                }
            }
        }
    }
    if json {
        select::print_json(&serde_json::Value::Array(docs));
    }
    Ok(code)
}

/// Run `f` over `items` on up to `width` threads; the results in the order of `items`.
pub fn parallel<T: Sync, R: Send>(items: &[T], width: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..width.min(items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item was run")
        })
        .collect()
}

/// Cancel one run and return its final record (and its run dir).
pub fn cancel_one(
    root: Option<&Path>,
    run_id: &str,
    wait: Option<Duration>,
) -> anyhow::Result<(RunDir, Status)> {
    cancel_one_for(root, run_id, wait, "cancel", "cancel_request", Until::Final)
}

/// When [`cancel_one_for`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// With the run's final record (`agent-run cancel`).
    Final,
    /// Once the stop is asked for: a live wrapper signalled (by us, or a second later when a
    /// cancel.json was there but the wrapper is not stopping), or the wrapper stopping (its
    /// signal mask says so, `procfs::marks_stopping`); a takeover still runs to its final
    /// record. The returned record may then be the live one. The output keeper asks this
    /// way: the wrapper's final record waits for the keeper's done, so a keeper that waited
    /// for that record would hold it up.
    Asked,
}

/// [`cancel_one`] on behalf of `by` (the journal's and cancel.json's source) with the stop's
/// `reason`: the output keeper's `--on-output-limit=stop` asks with "output_limit", and
/// [`Until::Asked`].
pub fn cancel_one_for(
    root: Option<&Path>,
    run_id: &str,
    wait: Option<Duration>,
    by: &'static str,
    reason: &str,
    until: Until,
) -> anyhow::Result<(RunDir, Status)> {
    let dir = open_run(root, run_id)?;
    let journal = dir.journal(by)?;
    let lock = dir.lock()?;
    let first = match dir.read_status() {
        Ok(st) => st,
        // No record yet. If the lock is free, the wrapper has not taken it (or died before its
        // first record): holding it, we declare the launch lost, and a slow wrapper that comes
        // later finds the record and refuses to run. If it is held, the wrapper is about to
        // write its first record: wait for it.
        Err(Error::Missing { .. }) => {
            if lock.try_lock()? {
                match dir.read_status() {
                    Err(Error::Missing { .. }) => {
                        let st = record_lost_launch(&dir, &journal)?;
                        return Ok((dir.clone(), st));
                    }
                    r => r?,
                }
            } else {
                runs::read_record_waiting(&dir, LOST_LAUNCH_AFTER)?
            }
        }
        // A damaged record names no processes we could trust: refuse, signal nothing.
        Err(corrupt @ Error::Corrupt { .. }) => {
            let _ = journal.event("refused", json!({"why": corrupt.to_string()}));
            return fail(
                exit::NOPERM,
                format!("refusing to cancel run {}: {corrupt}", dir.id()),
            );
        }
        Err(e) => return Err(e.into()),
    };
    let t = timings_of(&first);
    let wait = wait.unwrap_or(t.grace + t.confirm + Duration::from_secs(3));
    let deadline = Instant::now() + wait;
    let mut signalled_at: Option<Instant> = None;
    let mut party_since: Option<Instant> = None;
    let mut recheck = RECHECK;
    let refuse = |why: String| -> anyhow::Error {
        let _ = journal.event("refused", json!({"why": why}));
        crate::error::Exit(
            exit::NOPERM,
            format!("refusing to cancel run {}: {why}", dir.id()),
        )
        .into()
    };
    loop {
        let mut st = match dir.read_status() {
            Ok(st) => st,
            Err(e @ Error::Corrupt { .. }) => return Err(refuse(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        // A final record is the answer, unless the run's cgroup still holds processes: then
        // the workload wrote it (and maybe killed its wrapper), and the run is stopped anyway.
        let mut contradicted = None;
        if st.state.is_final() {
            let Some(cg) = dir.contradicting_cgroup(&st, None) else {
                return Ok((dir.clone(), st));
            };
            if let Err(e) = check_record(&st) {
                return Err(refuse(e.to_string()));
            }
            if lock.try_lock()? {
                // The wrapper is gone: reopen the run as the orphan it is, and finish it.
                st = read_record(&dir)?;
                if st.state.is_final() && cg.populated() {
                    reopen_contradicted(&dir, &mut st, &cg, &journal)?;
                }
                if !st.state.is_final() {
                    check_record(&st).map_err(|e| refuse(e.to_string()))?;
                    take_over(&dir, &mut st, "the wrapper is gone", &journal, by, reason)?;
                }
                return Ok((dir.clone(), st));
            }
            // Held: a live wrapper finishes the run itself (its final record replaces this
            // one); a squatter's run is reopened below. The record's word is not the state.
            st.state = State::Running;
            contradicted = Some(cg);
        }
        if let Err(e) = check_record(&st) {
            return Err(refuse(e.to_string()));
        }
        if lock.try_lock()? {
            // The wrapper is gone and we hold the lock: we are the one party that finishes it.
            st = read_record(&dir)?;
            if !st.state.is_final() {
                check_record(&st).map_err(|e| refuse(e.to_string()))?;
                take_over(&dir, &mut st, "the wrapper is gone", &journal, by, reason)?;
            }
            return Ok((dir.clone(), st));
        }
        let holder = lock_holder(&lock, &dir, &st);
        let mut wrapper: Option<VerifiedWrapper> = None;
        match holder {
            LockHolder::Wrapper(w) => wrapper = Some(w),
            LockHolder::Mismatch(why) => return Err(refuse(why)),
            // Another canceller or the watchdog is finishing the run: wait for its record. A
            // party that took the lock says `cancelling` at once; a record that still does not
            // after PARTY_SILENT names a wrapper that is not the process holding the lock (the
            // record was rewritten): refuse.
            LockHolder::Party(pids) => {
                let since = *party_since.get_or_insert_with(Instant::now);
                if st.state != State::Cancelling && since.elapsed() > PARTY_SILENT {
                    return Err(refuse(format!(
                        "the record names wrapper pid {} (tick {}), but the run's lock is held by pid {pids:?}",
                        st.wrapper_pid.unwrap_or_default(),
                        st.wrapper_start_ticks.unwrap_or_default()
                    )));
                }
            }
            LockHolder::Squatter(pids) => {
                // The wrapper is gone and something that is not agent-run holds its lock: the
                // run's own processes can open the lock file once the wrapper no longer holds
                // it. Finish the run without the lock: the stop ends the squatter if it is the
                // run's.
                let _ = journal.event("lock_squatted", json!({"holders": pids}));
                if let Some(cg) = &contradicted {
                    reopen_contradicted(&dir, &mut st, cg, &journal)?;
                }
                take_over(
                    &dir,
                    &mut st,
                    "the wrapper is gone; its lock is squatted",
                    &journal,
                    by,
                    reason,
                )?;
                return Ok((dir.clone(), st));
            }
        }
        if let Some(w) = &wrapper {
            // A cancel.json that cannot be written (a full disk) must not keep the run alive:
            // say so, and signal anyway.
            let created = dir.request_cancel(by, reason).unwrap_or_else(|e| {
                eprintln!("agent-run: {e}; signalling the wrapper without it");
                true
            });
            // Exactly one caller signals: a second TERM would cut the grace short. If the
            // creator of cancel.json died before signalling (or the run planted the file), the
            // wrapper is still not stopping a second later: signal it then. Whether it is
            // stopping is a kernel fact (its main thread's signal mask, sys::mark_stopping),
            // not the record's state (`cancelling`, or a final one its cgroup contradicts),
            // which the run can write along with a cancel.json of its own to keep every
            // cancel from signalling.
            let stale = signalled_at.is_some_and(|t| t.elapsed() > Duration::from_secs(1))
                && !procfs::marks_stopping(w.pid());
            let mut asked = false;
            if created || stale {
                signal_wrapper(w, Sig::Term, reason, None, &journal)?;
                // A stopped wrapper (SIGSTOP, a debugger let go) cannot act on the TERM: let it.
                if procfs::stat(w.pid()).is_some_and(|s| s.is_stopped()) {
                    signal_wrapper(w, Sig::Cont, reason, None, &journal)?;
                }
                signalled_at = Some(Instant::now());
                asked = true;
            } else if signalled_at.is_none() {
                signalled_at = Some(Instant::now());
            }
            // Asked: we signalled, or the wrapper is stopping. A cancel.json that was there
            // (the run can plant one) is not a stop: the look goes on, and the stale signal
            // above comes a second later unless the wrapper is stopping by then.
            if until == Until::Asked && (asked || procfs::marks_stopping(w.pid())) {
                return Ok((dir.clone(), st));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let mut msg = format!(
                "run {} is still {} after {:?}",
                dir.id(),
                st.state.as_str(),
                wait
            );
            if wrapper.is_none() {
                let holders = lock.holders();
                msg += &format!(
                    "; its lock is held by pid {holders:?}, not by the recorded wrapper pid {}",
                    st.wrapper_pid.unwrap_or_default()
                );
            }
            return fail(exit::TEMPFAIL, msg);
        }
        wait_event(
            wrapper.as_ref().map(|w| w.fd()),
            (deadline - now).min(recheck),
        );
        recheck = (recheck * 2).min(RECHECK_MAX);
    }
}

/// Finish a run whose wrapper is gone: cancel.json, the journal, then the shared stop and the
/// final record.
fn take_over(
    dir: &RunDir,
    st: &mut Status,
    why: &str,
    journal: &Journal,
    by: &str,
    reason: &str,
) -> anyhow::Result<()> {
    let _ = dir.request_cancel(by, reason);
    let _ = journal.event("takeover", json!({"why": why, "state": st.state.as_str()}));
    if let Err(e) = stop_orphaned(dir, st, reason, journal) {
        // Another party may have written the final record first (a squatted lock gives no
        // exclusivity): then that record is the answer.
        match dir.read_status() {
            Ok(fin) if fin.state.is_final() => *st = fin,
            _ => return Err(e.into()),
        }
    }
    Ok(())
}

/// How long another party may hold a run's lock without the record saying `cancelling`.
const PARTY_SILENT: Duration = Duration::from_secs(2);

/// How often `cancel` re-reads the record while it waits. The wrapper's exit (its pidfd) is the
/// event that normally ends the wait; the re-read covers a wrapper whose exit is delayed by a
/// slow reader of its output, and the other parties (a canceller or the watchdog) that hold the
/// lock. Not inotify: closing an inotify instance costs ~10 ms on this kernel, most of the budget
/// of a cancel round trip.
const RECHECK: Duration = Duration::from_millis(20);

/// The recheck doubles after each look, up to this: a look verifies the wrapper again (its
/// stat, executable and descriptors), and one cancel of many runs waits on 128 of them at a
/// time, for as long as their stops take (tens of seconds for 1,000 runs on 2 cores): at a
/// steady 20 ms that is 6,400 looks a second. The wrapper's exit still wakes the wait at once
/// (its pidfd); a record gone final while the wrapper lingers is seen within 320 ms.
const RECHECK_MAX: Duration = Duration::from_millis(320);

/// Wait for the wrapper's exit, or `timeout`.
fn wait_event(wrapper: Option<&OwnedFd>, timeout: Duration) {
    let mut fds: Vec<PollFd> = wrapper
        .map(|fd| PollFd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .into_iter()
        .collect();
    let _ = sys::poll(&mut fds, Some(timeout));
}
