//! Retention (`--retain DUR`): final runs that ended more than DUR ago are removed on the
//! watchdog's passes, so a root needs no cron job running `agent-run gc`.
//!
//! A run goes exactly when `agent-run gc --older-than DUR` would remove it: the same routine
//! decides ([`agent_run_shared::removal::may_remove`]: no live process holds its lock, its
//! cgroup is empty, no process of it lives where one could have gone) and removes it. Each
//! removal is one log line naming the run; a run kept although old is said once per process
//! (it is looked at again on every pass). The daemon sweeps on a thread of its own, once per
//! rescan interval: a sweep over a big root never delays a deadline.
//!
//! The sweep reads each record by a few syscalls relative to the root's fd ([`Sweep::record`]):
//! a run whose record is not final, or not old enough, is read no further.

use crate::report::log;
use agent_run_shared::removal::{self, Evidence, Kept};
use agent_run_shared::root::Root;
use agent_run_shared::sweep::Sweep;
use agent_run_shared::time::{duration_arg, epoch_now};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// What a retention sweep removed, and what it kept although old.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub removed: Vec<String>,
    pub kept: Vec<String>,
}

/// One sweep of `root`: remove every final run that ended more than `retain` ago and may be
/// removed. Each removal is logged; a run kept although old is logged unless `said` holds it
/// (it is added).
pub fn sweep(root: &Root, retain: Duration, said: &mut HashSet<String>) -> Swept {
    let now = epoch_now();
    let mut out = Swept::default();
    let names = match removal::by_inode(root) {
        Ok(n) => n,
        Err(e) => {
            log(&format!("retention: {e}"));
            return out;
        }
    };
    let mut sweep = Sweep::new(root);
    let mut evidence = Evidence::default();
    for name in names {
        // The cheap read first: only a record that says it is final and old enough is read
        // again by the careful path, which asks the kernel what holds the run.
        if let Some(s) = sweep.record(&name) {
            let r = &s.record;
            if !removal::ended_when(r.state, r.ended_at, now, retain) {
                continue;
            }
        }
        let (dir, st) = match removal::removable(root, &name, now, retain, &mut evidence) {
            Ok(Some(found)) => found,
            Ok(None) | Err(Kept::Unreadable(_)) => continue,
            Err(Kept::Held { why, ended }) => {
                if said.insert(name.clone()) {
                    log(&format!("{name}: kept although it ended at {ended}: {why}"));
                }
                out.kept.push(name);
                continue;
            }
        };
        let ended = st.ended_at.as_deref().unwrap_or("?");
        match removal::remove(root, &dir) {
            Ok(()) => {
                let past = duration_arg(retain);
                log(&format!(
                    "{name}: removed: it ended at {ended}, more than {past} ago (--retain)"
                ));
                said.remove(&name);
                out.removed.push(name);
            }
            Err(e) => {
                if said.insert(name.clone()) {
                    log(&format!(
                        "{name}: cannot remove {}: {e}",
                        dir.path().display()
                    ));
                }
                out.kept.push(name);
            }
        }
    }
    out
}

/// The daemon's retention: a thread that sweeps `root` once per `every`, the first one
/// `every` after it starts (by then the daemon holds the root's lock, or has exited).
pub fn spawn(root: PathBuf, retain: Duration, every: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("retain".into())
        .spawn(move || {
            let mut said = HashSet::new();
            loop {
                std::thread::sleep(every);
                match Root::open(&root, false) {
                    Ok(r) => {
                        sweep(&r, retain, &mut said);
                    }
                    Err(e) => log(&format!("retention: {e}")),
                }
            }
        })
        .map(|_| ())
}
