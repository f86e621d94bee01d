//! The second control channel: `cancel` and `renew`, plus relaunch and `--detach`.
//!
//! `cancel` never trusts a record blindly: it validates it ([`check_record`]), pins the wrapper
//! with a pidfd before checking its start time, and only then signals it. When the wrapper is gone
//! (its lock can be taken) it stops the run itself through the shared routine and writes the final
//! record. Concurrent cancels agree: exactly one creates cancel.json and signals, or takes the
//! lock; the others wait for the same final record.

use crate::cli::{fail, CancelArgs, RenewArgs, StartArgs};
use crate::human;
use crate::inspect::{self, open_run, print_record, read_record, wait_final};
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::journal::Journal;
use agent_run_shared::lease::{read_lease, write_lease, Lease};
use agent_run_shared::pty;
use agent_run_shared::record::{State, Status};
use agent_run_shared::root::Root;
use agent_run_shared::run::timings_of;
use agent_run_shared::stop::Sig;
use agent_run_shared::sys::{self, PollFd};
use agent_run_shared::takeover::{
    check_record, live_wrapper, lock_holder, record_lost_launch, request_cancel, signal_wrapper,
    stop_orphaned, LockHolder, RunLock, VerifiedWrapper, Wrapper,
};
use agent_run_shared::{procfs, Error};
use serde_json::json;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
                    docs.push(inspect::record_value(&dir, &st));
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
) -> anyhow::Result<(PathBuf, Status)> {
    cancel_one_for(root, run_id, wait, "cancel", "cancel_request")
}

/// [`cancel_one`] on behalf of `by` (the journal's and cancel.json's source) with the stop's
/// `reason`: the output keeper's `--on-output-limit=stop` asks with "output_limit".
pub fn cancel_one_for(
    root: Option<&Path>,
    run_id: &str,
    wait: Option<Duration>,
    by: &'static str,
    reason: &str,
) -> anyhow::Result<(PathBuf, Status)> {
    let dir = open_run(root, run_id)?;
    let journal = Journal::open(&dir.path, by)?;
    let lock = RunLock::open(&dir.path)?;
    let first = match agent_run_shared::record::read_status(&dir.path) {
        Ok(st) => st,
        // No record yet. If the lock is free, the wrapper has not taken it (or died before its
        // first record): holding it, we declare the launch lost, and a slow wrapper that comes
        // later finds the record and refuses to run. If it is held, the wrapper is about to
        // write its first record: wait for it.
        Err(Error::Missing { .. }) => {
            if lock.try_lock()? {
                match agent_run_shared::record::read_status(&dir.path) {
                    Err(Error::Missing { .. }) => {
                        let st = record_lost_launch(&dir.path, dir.id.as_str(), &journal)?;
                        return Ok((dir.path.clone(), st));
                    }
                    r => r?,
                }
            } else {
                inspect::read_record_waiting(&dir.path, LOST_LAUNCH_AFTER)?
            }
        }
        // A damaged record names no processes we could trust: refuse, signal nothing.
        Err(corrupt @ Error::Corrupt { .. }) => {
            let _ = journal.event("refused", json!({"why": corrupt.to_string()}));
            return fail(
                exit::NOPERM,
                format!("refusing to cancel run {}: {corrupt}", dir.id),
            );
        }
        Err(e) => return Err(e.into()),
    };
    let t = timings_of(&first);
    let wait = wait.unwrap_or(t.grace + t.confirm + Duration::from_secs(3));
    let deadline = Instant::now() + wait;
    let mut signalled_at: Option<Instant> = None;
    let mut party_since: Option<Instant> = None;
    let refuse = |why: String| -> anyhow::Error {
        let _ = journal.event("refused", json!({"why": why}));
        crate::cli::Exit(
            exit::NOPERM,
            format!("refusing to cancel run {}: {why}", dir.id),
        )
        .into()
    };
    loop {
        let mut st = match agent_run_shared::record::read_status(&dir.path) {
            Ok(st) => st,
            Err(e @ Error::Corrupt { .. }) => return Err(refuse(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        if st.state.is_final() {
            return Ok((dir.path.clone(), st));
        }
        if let Err(e) = check_record(&st) {
            return Err(refuse(e.to_string()));
        }
        if lock.try_lock()? {
            // The wrapper is gone and we hold the lock: we are the one party that finishes it.
            st = read_record(&dir.path)?;
            if !st.state.is_final() {
                check_record(&st).map_err(|e| refuse(e.to_string()))?;
                take_over(
                    &dir.path,
                    &mut st,
                    "the wrapper is gone",
                    &journal,
                    by,
                    reason,
                )?;
            }
            return Ok((dir.path.clone(), st));
        }
        let holder = lock_holder(&lock, &dir.path, &st);
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
                take_over(
                    &dir.path,
                    &mut st,
                    "the wrapper is gone; its lock is squatted",
                    &journal,
                    by,
                    reason,
                )?;
                return Ok((dir.path.clone(), st));
            }
        }
        if let Some(w) = &wrapper {
            // A cancel.json that cannot be written (a full disk) must not keep the run alive:
            // say so, and signal anyway.
            let created = request_cancel(&dir.path, by, reason).unwrap_or_else(|e| {
                eprintln!("agent-run: {e}; signalling the wrapper without it");
                true
            });
            // Exactly one caller signals: a second TERM would cut the grace short. If the
            // creator of cancel.json died before signalling, the wrapper is still `running` a
            // second later: signal it then.
            let stale = st.state == State::Running
                && signalled_at.is_some_and(|t| t.elapsed() > Duration::from_secs(1));
            if created || stale {
                signal_wrapper(w, Sig::Term, reason, None, &journal)?;
                // A stopped wrapper (SIGSTOP, a debugger let go) cannot act on the TERM: let it.
                if procfs::stat(w.pid()).is_some_and(|s| s.is_stopped()) {
                    signal_wrapper(w, Sig::Cont, reason, None, &journal)?;
                }
                signalled_at = Some(Instant::now());
            } else if signalled_at.is_none() {
                signalled_at = Some(Instant::now());
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let mut msg = format!(
                "run {} is still {} after {:?}",
                dir.id,
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
            (deadline - now).min(RECHECK),
        );
    }
}

/// Finish a run whose wrapper is gone: cancel.json, the journal, then the shared stop and the
/// final record.
fn take_over(
    dir: &Path,
    st: &mut Status,
    why: &str,
    journal: &Journal,
    by: &str,
    reason: &str,
) -> anyhow::Result<()> {
    let _ = request_cancel(dir, by, reason);
    let _ = journal.event("takeover", json!({"why": why, "state": st.state.as_str()}));
    if let Err(e) = stop_orphaned(dir, st, reason, journal) {
        // Another party may have written the final record first (a squatted lock gives no
        // exclusivity): then that record is the answer.
        match agent_run_shared::record::read_status(dir) {
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

/// `agent-run renew`: one run prints its new lease; several (or `--all`, `--label`) print an
/// array of `{"run_id", "deadline_epoch", "lease_s"}`.
pub fn renew(root: Option<&Path>, args: RenewArgs) -> anyhow::Result<u8> {
    let ids = match select::pick(root, &args.select, true)? {
        Picked::One(id) => {
            let lease = renew_one(root, &id, args.lease)?;
            println!("{}", serde_json::to_string(&lease)?);
            return Ok(exit::OK);
        }
        Picked::Many(ids) => ids,
    };
    // `--all` and `--label` renew the runs that have a lease (without --lease, a run without
    // one has nothing to renew; named by its id, it is an error).
    let selected = args.select.all || !args.select.labels.is_empty();
    let ids: Vec<String> = ids
        .into_iter()
        .filter(|id| {
            !selected
                || args.lease.is_some()
                || open_run(root, id).is_ok_and(|d| read_lease(&d.path).is_ok_and(|l| l.is_some()))
        })
        .collect();
    let mut code = exit::OK;
    let mut docs = Vec::new();
    for id in &ids {
        match renew_one(root, id, args.lease) {
            Ok(l) => docs.push(
                json!({"run_id": id, "deadline_epoch": l.deadline_epoch, "lease_s": l.lease_s}),
            ),
            Err(e) => {
                let (doc, c) = select::error_entry(id, &e);
                docs.push(doc);
                if code == exit::OK {
                    code = c;
                }
            }
        }
    }
    select::print_json(&serde_json::Value::Array(docs));
    Ok(code)
}

/// Renew one run's lease: now + `len` (default: the run's own lease length). The record must
/// hold the whole identity and name a wrapper the kernel confirms (or none alive); the
/// wrapper's wake-up is journalled.
fn renew_one(root: Option<&Path>, run_id: &str, len: Option<Duration>) -> anyhow::Result<Lease> {
    let dir = open_run(root, run_id)?;
    let journal = Journal::open(&dir.path, "renew")?;
    let refuse = |why: String| -> anyhow::Result<Lease> {
        let _ = journal.event("refused", json!({"why": why}));
        fail(
            exit::NOPERM,
            format!("refusing to renew run {}: {why}", dir.id),
        )
    };
    let st = match agent_run_shared::record::read_status(&dir.path) {
        Ok(st) => st,
        Err(e @ Error::Corrupt { .. }) => return refuse(e.to_string()),
        Err(_) => read_record(&dir.path)?,
    };
    if st.state.is_final() {
        return fail(
            exit::NO_SUCH_RUN,
            format!("run {} is {}: nothing to renew", dir.id, st.state.as_str()),
        );
    }
    if let Err(e) = check_record(&st) {
        return refuse(e.to_string());
    }
    // Confirm the wrapper before anything changes: a record that names a process the kernel
    // says is not the wrapper is refused whole.
    let wrapper = match live_wrapper(&dir.path, &st) {
        Wrapper::Alive(w) => Some(w),
        Wrapper::Mismatch(why) => return refuse(why),
        Wrapper::Gone => None,
    };
    let len = match len {
        Some(d) => d,
        None => match read_lease(&dir.path)? {
            Some(l) => Duration::from_secs_f64(l.lease_s),
            None => {
                return fail(
                    exit::USAGE,
                    format!(
                        "run {} has no lease; give its length with --lease DUR",
                        dir.id
                    ),
                )
            }
        },
    };
    let lease = Lease::from_now(len);
    write_lease(&dir.path, &lease)?;
    let _ = journal.event(
        "renew",
        json!({"deadline_epoch": lease.deadline_epoch, "lease_s": lease.lease_s}),
    );
    // Wake the wrapper so a shortened lease is enforced on time (it re-reads lease.json),
    // journalled like every signal.
    if let Some(w) = &wrapper {
        let _ = signal_wrapper(w, Sig::Usr1, "renew", Some("re-read lease.json"), &journal);
    }
    Ok(lease)
}

/// A relaunch must ask for the command the run id already stands for (65 otherwise).
fn same_command(id: &RunId, st: &Status, argv: &[OsString]) -> anyhow::Result<()> {
    // A final record with no command is a launch declared lost before anyone knew its command:
    // it stands for no command in particular, and replays its outcome (unknown) for any.
    // Compared byte for byte: two commands that differ only in bytes that are not UTF-8 are
    // two commands.
    if st.same_argv(argv) || (st.state.is_final() && st.argv.is_empty()) {
        return Ok(());
    }
    fail(
        exit::DATA_MISMATCH,
        format!(
            "run {id} exists with a different command: {:?} (asked for {:?})",
            st.argv,
            argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()
        ),
    )
}

/// Relaunch of an existing run id: never runs the command twice. In the foreground: a final run
/// prints its record on stderr and exits as it did; an active one is attached to. The wrapper
/// that `--detach` started (`detached`) found the id taken by a launch racing it: it leaves the
/// answer to its parent, which reads the record, and returns at once.
pub fn relaunch(
    root: &Root,
    id: &RunId,
    argv: &[OsString],
    quiet: bool,
    detached: bool,
) -> anyhow::Result<u8> {
    let dir = root.open_run_dir(id)?;
    let st = inspect::read_record_waiting(&dir.path, Duration::from_secs(10))?;
    same_command(id, &st, argv)?;
    if detached {
        return Ok(exit::for_record(&st).unwrap_or(exit::OK));
    }
    if st.state.is_final() {
        // A person sees what happened in one line; a program gets the record.
        if human::stderr_is_terminal() {
            let line = human::final_line(&st, human::colour_for(true));
            eprintln!("agent-run: {line}; not running it again");
        } else {
            eprint!("{}", inspect::record_json(&dir.path, &st));
        }
        return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
    }
    eprintln!(
        "agent-run: run {id} is already {}; attaching",
        st.state.as_str()
    );
    inspect::claim_lost_run(&dir);
    if quiet {
        let st = wait_final(&dir.path, None)?;
        return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
    }
    inspect::follow_to_end(&dir.path, (0, 0))
}

/// A duration as the command line parses it, without rounding (`1.5ms`, `90000ms`).
pub fn duration_arg(d: Duration) -> String {
    format!("{}ms", d.as_secs_f64() * 1000.0)
}

/// `start --detach`: start a wrapper of our own in its own session with stdio on /dev/null, and
/// return once its record says `running` (or the run is already final), printing one JSON line
/// `{"run_id","run_dir","pid","pgid","state"}` on stdout and nothing else there.
///
/// The same for a run id that exists (a relaunch, which never runs the command twice and never
/// attaches): the line with the run's current state; the exit code is the run's own when it is
/// final (as `wait` would give), else 0. A different command is refused (65). A launch failure
/// also prints its error on stderr.
pub fn detach_parent(
    root: &Root,
    id: &RunId,
    argv: &[OsString],
    args: &StartArgs,
) -> anyhow::Result<u8> {
    let dir = root.run_dir_path(id);
    // An existing run needs no wrapper of ours (it would only find the id taken).
    let mut child = match root.open_run_dir(id) {
        Ok(_) => None,
        Err(Error::Missing { .. }) => Some(spawn_detached(root, id, args)?),
        Err(e) => return Err(e.into()),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st: Option<Status> = agent_run_shared::record::read_status(&dir).ok();
        if let Some(st) = st.filter(|s| s.state != State::Starting) {
            // The id may be an earlier run's (a relaunch, or a launch that raced ours).
            same_command(id, &st, argv)?;
            let line = json!({
                "run_id": st.run_id, "run_dir": dir, "pid": st.pid, "pgid": st.pgid,
                "state": st.state.as_str(),
            });
            println!("{line}");
            let ours = child
                .as_ref()
                .is_some_and(|c| st.wrapper_pid == Some(c.id() as i32));
            if st.state.is_final() {
                if let (true, Some(e)) = (ours, &st.error) {
                    eprintln!("agent-run: {e}");
                }
                return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
            }
            return Ok(exit::OK);
        }
        if let Some(status) = child.as_mut().map(|c| c.try_wait()).transpose()?.flatten() {
            if agent_run_shared::record::read_status(&dir).is_ok() {
                // It found the id taken by a launch racing ours: that launch's record decides.
                child = None;
                continue;
            }
            // It ended before the run was running: refused input or a setup failure.
            return fail(
                status.code().map_or(exit::SOFTWARE, |c| c as u8),
                format!("the detached wrapper for run {id} exited before the run started"),
            );
        }
        if Instant::now() >= deadline {
            return fail(exit::TEMPFAIL, format!("run {id} did not start within 30s"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The wrapper of a detached run: this program, in its own session, stdio on /dev/null.
fn spawn_detached(root: &Root, id: &RunId, args: &StartArgs) -> anyhow::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--root")
        .arg(root.path())
        .arg("start")
        .arg("--quiet")
        .arg("--detached-child")
        .arg("--grace")
        .arg(duration_arg(args.grace))
        .arg("--hup-after")
        .arg(duration_arg(args.hup_after));
    if let Some(l) = args.lease {
        cmd.arg("--lease").arg(duration_arg(l));
    }
    if let Some(t) = args.timeout {
        cmd.arg("--timeout").arg(duration_arg(t));
    }
    if let Some(c) = &args.cwd {
        cmd.arg("--cwd").arg(c);
    }
    if let Some(c) = &args.cgroup {
        cmd.arg("--cgroup").arg(c);
    }
    if let Some(m) = args.max_output {
        cmd.arg("--max-output")
            .arg(m.0.map_or("none".to_string(), |b| b.to_string()));
    }
    cmd.arg("--on-output-limit").arg(&args.on_output_limit);
    for (k, v) in &args.labels {
        cmd.arg("--label").arg(format!("{k}={v}"));
    }
    if args.pty {
        // The detached wrapper has no terminal: the size is the caller's, taken now.
        let size = args
            .pty_size
            .or_else(pty::caller_size)
            .unwrap_or(pty::DEFAULT_SIZE);
        cmd.arg("--pty").arg("--pty-size").arg(size.to_string());
    }
    // The values of -e may be secrets: never on a command line (/proc/PID/cmdline is world
    // readable), but in the environment of our own detached wrapper, which passes them on.
    if args.env.is_empty() {
        cmd.env_remove(crate::launch::ENV_PASSED);
    } else {
        let passed = crate::launch::encode_env(&args.env);
        cmd.env(crate::launch::ENV_PASSED, passed);
    }
    cmd.arg(id.as_str()).arg("--").args(&args.command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    sys::spawn_in_new_session(&mut cmd);
    Ok(cmd.spawn()?)
}
