//! `agent-run cancel`: one run, several, `--all` or `--label`.
//!
//! Each run goes through the shared takeover routine ([`takeover::finish`]): a live wrapper,
//! found and confirmed by the kernel (the holder of the run's lock), is asked and given its
//! grace + 2 s; a wrapper that is gone, or does nothing with that time, is taken over and the
//! run stopped by kernel facts, whatever its files say. Concurrent cancels agree: exactly one
//! signals, or takes the lock; the others wait for the same final record.

use crate::cli::CancelArgs;
use crate::error::fail;
use crate::human;
use crate::runs::{self, open_run, print_record};
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::lifecycle::timings_of;
use agent_run_shared::reason::Reason;
use agent_run_shared::record::Status;
use agent_run_shared::run_dir::RunDir;
pub use agent_run_shared::takeover::Until;
use agent_run_shared::takeover::{self, Failure, Patience, Request};
use std::path::Path;
use std::time::{Duration, Instant};

/// How many runs `cancel` stops at once: each is a thread that signals, then waits.
const CANCEL_PARALLEL: usize = 128;

/// `agent-run cancel`: one run, several, `--all` or `--label`. Several are cancelled
/// concurrently (every wrapper is signalled before any final record is waited for). One line a
/// run; with `--json`, the final record (several runs: one JSON array).
pub fn cancel(root: Option<&Path>, args: CancelArgs) -> anyhow::Result<u8> {
    let json = args.json;
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
    let mut batch = select::Batch::default();
    for (id, r) in ids.iter().zip(results) {
        match r {
            Ok((dir, st)) => {
                if json {
                    batch.push(runs::record_value(&dir, &st));
                } else {
                    println!("{}", human::final_line(&st, colour));
                }
            }
            Err(e) => batch.failed(id, &e),
        }
    }
    Ok(batch.finish(json))
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
    let (dir, st) = cancel_one_for(
        root,
        run_id,
        wait,
        "cancel",
        Reason::CancelRequest,
        Until::Final,
    )?;
    let st = st.expect("Until::Final returns the final record");
    Ok((dir, st))
}

/// How long `cancel` waits by default: the run's grace, the 2 s a wrapper gets beyond it,
/// and a takeover's own stop and record after that.
pub fn default_wait(grace: Duration) -> Duration {
    grace + takeover::SLACK + Duration::from_secs(8)
}

/// [`cancel_one`] on behalf of `by` (the journal's and cancel.json's source) with the stop's
/// `reason`: the output keeper's `--on-output-limit=stop` asks with `output_limit` and
/// [`Until::Asked`] (then the record is `None` when the wrapper was asked). What was found
/// wrong on the way (a damaged file, a wrapper taken over) is said on stderr.
pub fn cancel_one_for(
    root: Option<&Path>,
    run_id: &str,
    wait: Option<Duration>,
    by: &'static str,
    reason: Reason,
    until: Until,
) -> anyhow::Result<(RunDir, Option<Status>)> {
    let dir = open_run(root, run_id)?;
    let grace = dir
        .read_status()
        .map(|st| timings_of(&st).grace)
        .unwrap_or_default();
    let wait = wait.unwrap_or_else(|| default_wait(grace));
    let req = Request {
        by,
        reason,
        until,
        patience: Patience::Grace,
        deadline: Instant::now() + wait,
    };
    match takeover::finish(&dir, &req) {
        Ok(done) => {
            for n in &done.notes {
                human::say(&format!("run {}: {}", dir.id(), human::printable(n)));
            }
            Ok((dir, done.record))
        }
        Err(Failure::TimedOut(msg)) => fail(exit::TEMPFAIL, format!("{msg} after {wait:?}")),
        Err(Failure::RecordFailed(msg)) => fail(exit::SOFTWARE, format!("run {}: {msg}", dir.id())),
        Err(Failure::Other(e)) => Err(e.into()),
    }
}
