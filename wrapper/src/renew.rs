//! `agent-run renew`: push a run's lease deadline (its own length, or `--lease DUR`) and wake its
//! wrapper to re-read it.
//!
//! Only the run's starter renews: the lease token (`--token`, else `$AGENT_RUN_LEASE_TOKEN`) must
//! match the run's (the record keeps its SHA-256), and the new lease.json is signed with it. The
//! wrapper, which holds the token itself, takes no lease it cannot verify. A refused renewal is
//! journalled (`renew_refused`) and exits 77.

use crate::cli::RenewArgs;
use crate::error::fail;
use crate::human;
use crate::runs::open_run;
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::lease::{Lease, LeaseToken};
use agent_run_shared::reason::Reason;
use agent_run_shared::stop::Sig;
use agent_run_shared::sys;
use agent_run_shared::time::epoch_now;
use agent_run_shared::verdict::Look;
use agent_run_shared::wrapper::signal_wrapper;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// `agent-run renew`: a line a run saying when its lease now ends. With `--json`, one run prints
/// its new lease; several (or `--all`, `--label`) print an array of
/// `{"run_id", "deadline_epoch", "lease_s"}`.
pub fn renew(root: Option<&Path>, args: RenewArgs) -> anyhow::Result<u8> {
    // The token lives in this process's memory: closed to other processes of its user.
    let _ = sys::set_non_dumpable();
    let token = match args.token.as_deref() {
        Some(t) => Some(LeaseToken::parse(t)?),
        None => LeaseToken::from_env().transpose()?,
    };
    let ids = match select::pick(root, &args.select, true)? {
        Picked::One(id) => {
            let lease = renew_one(root, &id, args.lease, token.as_ref())?;
            if args.json {
                println!("{}", brief(&lease));
            } else {
                println!("{}", renewed_line(&id, &lease, epoch_now()));
            }
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
                || open_run(root, id).is_ok_and(|d| d.read_lease().is_ok_and(|l| l.is_some()))
        })
        .collect();
    let mut batch = select::Batch::default();
    for id in &ids {
        match renew_one(root, id, args.lease, token.as_ref()) {
            Ok(l) if args.json => batch.push(
                json!({"run_id": id, "deadline_epoch": l.deadline_epoch, "lease_s": l.lease_s}),
            ),
            Ok(l) => println!("{}", renewed_line(id, &l, epoch_now())),
            Err(e) => batch.failed(id, &e),
        }
    }
    Ok(batch.finish(args.json))
}

/// What `renew` says of a run for people: `renewed ID: the lease ends at 14:03:10 UTC (in 10m)`.
fn renewed_line(id: &str, l: &Lease, now: f64) -> String {
    let secs = l.deadline_epoch.max(0.0) as u64 % 86_400;
    format!(
        "renewed {}: the lease ends at {:02}:{:02}:{:02} UTC (in {})",
        human::printable(id),
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        human::duration((l.deadline_epoch - now).round())
    )
}

/// What `renew` prints of a lease: its deadline and length (the signature is the run dir's).
fn brief(l: &Lease) -> String {
    json!({"deadline_epoch": l.deadline_epoch, "lease_s": l.lease_s}).to_string()
}

/// Renew one run's lease: now + `len` (default: the run's own lease length), signed with
/// `token`. The run must be active with a live wrapper (found by the kernel: the holder of the
/// run's lock); the wrapper's wake-up is journalled.
fn renew_one(
    root: Option<&Path>,
    run_id: &str,
    len: Option<Duration>,
    token: Option<&LeaseToken>,
) -> anyhow::Result<Lease> {
    let dir = open_run(root, run_id)?;
    let journal = dir.journal("renew");
    let refuse = |why: String| -> anyhow::Result<Lease> {
        let _ = journal.event("renew_refused", json!({"why": why}));
        fail(
            exit::NOPERM,
            format!("refusing to renew run {}: {why}", dir.id()),
        )
    };
    let look = Look::take(&dir);
    if let Some(st) = look.believed() {
        return fail(
            exit::NO_SUCH_RUN,
            format!(
                "run {} is {}: nothing to renew",
                dir.id(),
                st.state.as_str()
            ),
        );
    }
    let Some(wrapper) = look.wrapper() else {
        return fail(
            exit::NO_SUCH_RUN,
            format!(
                "run {}'s wrapper is gone: its lease cannot be renewed, and the watchdog stops it at its deadline",
                dir.id()
            ),
        );
    };
    // The record keeps the token's hash: a wrong or missing token is refused before anything
    // changes. (A record the workload rewrote can name another hash; the wrapper checks the
    // signature with the token it holds, so that renews nothing.)
    let want = look
        .record
        .as_ref()
        .ok()
        .and_then(|st| st.lease_token_sha256.clone());
    let token = match (token, &want) {
        (Some(t), Some(h)) if t.sha256() != *h => {
            return refuse("the lease token does not match the run's".into())
        }
        (None, Some(_)) => return refuse(
            "no lease token: give the one start handed out, with --token or AGENT_RUN_LEASE_TOKEN"
                .into(),
        ),
        (t, _) => t,
    };
    let len = match len {
        Some(d) => d,
        None => match dir.read_lease().ok().flatten() {
            Some(l) if l.lease_s.is_finite() && l.lease_s > 0.0 => {
                Duration::from_secs_f64(l.lease_s.min(1e9))
            }
            _ => {
                return fail(
                    exit::USAGE,
                    format!(
                        "run {} has no lease; give its length with --lease DUR",
                        dir.id()
                    ),
                )
            }
        },
    };
    let mut lease = Lease::from_now(len);
    if let Some(t) = token {
        lease = lease.sign(dir.id().as_str(), t);
    }
    dir.write_lease(&lease)?;
    let _ = journal.event(
        "renew",
        json!({"deadline_epoch": lease.deadline_epoch, "lease_s": lease.lease_s}),
    );
    // Wake the wrapper so the new lease is taken (or a shortened one enforced) at once.
    let _ = signal_wrapper(
        wrapper,
        Sig::Usr1,
        Reason::Renew,
        Some("re-read lease.json"),
        &journal,
    );
    Ok(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_renewed_line_says_when_the_lease_ends_and_in_how_long() {
        let l = Lease {
            deadline_epoch: 86_400.0 * 3.0 + 14.0 * 3600.0 + 3.0 * 60.0 + 10.0,
            ..Lease::from_now(Duration::from_secs(600))
        };
        let line = renewed_line("d1", &l, l.deadline_epoch - 600.0);
        assert_eq!(line, "renewed d1: the lease ends at 14:03:10 UTC (in 10m)");
    }
}
