//! `--once`: one full pass over the root, acting on everything due now and waiting for those
//! stops. What it must remember between passes is in the root: the settled ledger
//! ([`crate::ledger`]) and the watch ledger ([`crate::watched`]).

use crate::act::act;
use crate::assess::{assess, Looks, Policy, Verdict};
use crate::ledger::Ledger;
use crate::pass::{self, Pass};
use crate::report::{describe, journal_once, log, report_lease_damage, report_record_damage};
use crate::watched::{self, Watched};
use agent_run_shared::root::Root;
use agent_run_shared::time::epoch_now;
use std::os::unix::fs::MetadataExt;
use std::thread;

/// One pass over the root: act on everything due now, wait for those stops, and return what
/// was done (one line per run acted on). Runs that are not due are left alone.
pub fn run_once(root: &Root, policy: &Policy) -> Vec<String> {
    let now = epoch_now();
    let looks = Looks::default();
    let mut handles = Vec::new();
    let Some((rootfd, ents)) = pass::list(root) else {
        return Vec::new();
    };
    // The ledger of the last pass: the final records it read are not read again while their
    // status.json is unchanged (crate::ledger).
    let mut pass = Pass::new(rootfd).with_ledger(Ledger::load(root));
    // What the last pass saw of the runs that are not over (crate::watched).
    let before = Watched::load(root);
    let mut after = Watched::default();
    for e in ents {
        if pass.classify(&e, &looks.cgroups).is_some() {
            continue;
        }
        let name = e.name;
        let dir_ino = dir_inode(root, &name);
        let known = dir_ino.and_then(|i| before.get(&name, i)).cloned();
        let seen = known.as_ref().map(|k| k.seen).unwrap_or_default();
        let (verdict, subject) = assess(root, &name, now, seen, policy, &looks, true);
        if let (Some(s), Some(ino)) = (&subject, dir_ino) {
            let said = known.as_ref().and_then(|k| k.lease_damage.as_deref());
            report_lease_damage(s, said);
            let said = known.as_ref().and_then(|k| k.record_damage.as_deref());
            report_record_damage(s, said);
            after.runs.insert(
                name.clone(),
                watched::Entry {
                    dir_ino: ino,
                    seen: s.seen,
                    lease_damage: s.lease_damaged.clone(),
                    record_damage: s.record_damaged.clone(),
                },
            );
        }
        match (verdict, subject) {
            (Verdict::Now(action), Some(subject)) => {
                handles.push(thread::spawn(move || {
                    describe(&subject, action, act(&subject, action))
                }));
            }
            (Verdict::Skip(why), _) => {
                log(&format!("{name}: skipped: {why}"));
                journal_once(root, &name, &why);
            }
            _ => {}
        }
    }
    if let Some(ledger) = pass.into_ledger() {
        if let Err(e) = ledger.store(root) {
            log(&format!("cannot keep the settled ledger: {e}"));
        }
    }
    if after != before {
        if let Err(e) = after.store(root) {
            log(&format!("cannot keep the watch ledger: {e}"));
        }
    }
    handles
        .into_iter()
        .filter_map(|h| h.join().ok())
        .inspect(|l| log(l))
        .collect()
}

/// The inode of the run dir `name` in the root (without following a symlink).
fn dir_inode(root: &Root, name: &str) -> Option<u64> {
    std::fs::symlink_metadata(root.path().join(name))
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| m.ino())
}
