//! `agent-run renew`: push a run's lease deadline (its own length, or `--lease DUR`) and wake its
//! wrapper to re-read it.

use crate::cli::RenewArgs;
use crate::error::fail;
use crate::runs::{open_run, read_record};
use crate::select::{self, Picked};
use agent_run_shared::exit;
use agent_run_shared::lease::Lease;
use agent_run_shared::stop::Sig;
use agent_run_shared::wrapper::{check_record, live_wrapper, signal_wrapper, Wrapper};
use agent_run_shared::Error;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

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
                || open_run(root, id).is_ok_and(|d| d.read_lease().is_ok_and(|l| l.is_some()))
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
    let journal = dir.journal("renew")?;
    let refuse = |why: String| -> anyhow::Result<Lease> {
        let _ = journal.event("refused", json!({"why": why}));
        fail(
            exit::NOPERM,
            format!("refusing to renew run {}: {why}", dir.id()),
        )
    };
    let st = match dir.read_status() {
        Ok(st) => st,
        Err(e @ Error::Corrupt { .. }) => return refuse(e.to_string()),
        Err(_) => read_record(&dir)?,
    };
    if st.state.is_final() {
        return fail(
            exit::NO_SUCH_RUN,
            format!(
                "run {} is {}: nothing to renew",
                dir.id(),
                st.state.as_str()
            ),
        );
    }
    if let Err(e) = check_record(&st) {
        return refuse(e.to_string());
    }
    // Confirm the wrapper before anything changes: a record that names a process the kernel
    // says is not the wrapper is refused whole.
    let wrapper = match live_wrapper(&dir, &st) {
        Wrapper::Alive(w) => Some(w),
        Wrapper::Mismatch(why) => return refuse(why),
        Wrapper::Gone => None,
    };
    let len = match len {
        Some(d) => d,
        None => match dir.read_lease()? {
            Some(l) => Duration::from_secs_f64(l.lease_s),
            None => {
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
    let lease = Lease::from_now(len);
    dir.write_lease(&lease)?;
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
