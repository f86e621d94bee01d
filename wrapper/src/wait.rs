//! `agent-run wait`: one run, or several (all of them, or with `--any` the first to end).

use crate::cli::WaitArgs;
use crate::error::fail;
use crate::runs::{open_run, print_record, read_record, record_value, wait_final};
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::record::Status;
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::sys::Inotify;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// `agent-run wait`: one run, or several (all of them, or with `--any` the first to end).
pub fn wait(root: Option<&Path>, args: WaitArgs) -> anyhow::Result<u8> {
    let ids = match select::pick(root, &args.select, true)? {
        Picked::One(id) => {
            let dir = open_run(root, &id)?;
            let st = match args.idle {
                Some(idle) => wait_final_or_idle(&dir, idle, args.timeout)?,
                None => wait_final(&dir, args.timeout)?,
            };
            if args.json {
                print_record(&dir, &st);
            }
            return Ok(exit::for_record(&st).unwrap_or(exit::SOFTWARE));
        }
        Picked::Many(_) if args.idle.is_some() => {
            return fail(exit::USAGE, "--idle waits for one run: name one run id")
        }
        Picked::Many(ids) => ids,
    };
    // Every run must exist before the wait begins: a typo must not turn into a long wait.
    let dirs = ids
        .iter()
        .map(|id| open_run(root, id))
        .collect::<anyhow::Result<Vec<RunDir>>>()?;
    let ino = Inotify::new()?;
    for d in &dirs {
        ino.add_watch(d.path(), Inotify::CHANGED)?;
    }
    let deadline = args.timeout.map(|t| Instant::now() + t);
    loop {
        let records = dirs
            .iter()
            .map(read_record)
            .collect::<anyhow::Result<Vec<Status>>>()?;
        let done = if args.any {
            dirs.is_empty() || records.iter().any(|st| st.state.is_final())
        } else {
            records.iter().all(|st| st.state.is_final())
        };
        if done {
            if args.json {
                let docs = dirs
                    .iter()
                    .zip(&records)
                    .map(|(d, st)| record_value(d, st))
                    .collect();
                select::print_json(&Value::Array(docs));
            }
            let codes = records.iter().filter_map(exit::for_record);
            let code = if args.any {
                codes.into_iter().next()
            } else {
                codes.into_iter().find(|c| *c != exit::OK)
            };
            return Ok(code.unwrap_or(exit::OK));
        }
        let step = Duration::from_millis(500);
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    let waiting: Vec<String> = records
                        .iter()
                        .filter(|st| !st.state.is_final())
                        .map(|st| format!("{} ({})", st.run_id, st.state.as_str()))
                        .collect();
                    let waited =
                        crate::human::duration(args.timeout.unwrap_or_default().as_secs_f64());
                    return fail(
                        exit::TEMPFAIL,
                        format!(
                            "wait gave up after {waited}; still running: {}",
                            waiting.join(", ")
                        ),
                    );
                }
                step.min(d - now)
            }
            None => step,
        };
        ino.wait(step);
    }
}

/// Wait until the run is final, or has written nothing for `idle` (75, the run goes on), or
/// `timeout` (75). Silence is the logs' sizes unchanged; the keeper's writes wake the wait.
fn wait_final_or_idle(
    dir: &RunDir,
    idle: Duration,
    timeout: Option<Duration>,
) -> anyhow::Result<Status> {
    let ino = Inotify::new()?;
    ino.add_watch(dir.path(), Inotify::CHANGED | Inotify::MODIFIED)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    let sizes = || ["stdout.log", "stderr.log"].map(|f| dir.stat_file(f).map_or(0, |s| s.size));
    let (mut seen, mut since) = (sizes(), Instant::now());
    loop {
        if let Some(st) = crate::runs::believed_final(dir)? {
            return Ok(st);
        }
        let now = Instant::now();
        let now_sizes = sizes();
        if now_sizes != seen {
            (seen, since) = (now_sizes, now);
        }
        if now.duration_since(since) >= idle {
            return fail(
                exit::TEMPFAIL,
                format!(
                    "wait: {} wrote nothing for {}; it is still running",
                    dir.id(),
                    crate::human::duration(idle.as_secs_f64())
                ),
            );
        }
        if deadline.is_some_and(|d| now >= d) {
            let waited = crate::human::duration(timeout.unwrap_or_default().as_secs_f64());
            return fail(
                exit::TEMPFAIL,
                format!("wait gave up after {waited}; {} is still running", dir.id()),
            );
        }
        let mut step = (since + idle).saturating_duration_since(now);
        if let Some(d) = deadline {
            step = step.min(d.saturating_duration_since(now));
        }
        ino.wait(step.min(Duration::from_millis(500)));
    }
}
