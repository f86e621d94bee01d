//! `agent-run rm ID...`: remove runs by id, as `gc` removes old ones. Only a run that is over
//! goes, and only when the kernel agrees (no live process holds its lock, its cgroup is
//! empty): a run that is not over is refused with 75 (cancel it first), and the others are
//! still removed.

use crate::cli::RmArgs;
use crate::error::{exit_code_of, fail};
use crate::runs::{open_run, read_record};
use agent_run_shared::exit;
use agent_run_shared::removal::{self, Evidence};
use std::path::Path;

/// `agent-run rm`: the exit code is 0 when every run went, else the first failure's.
pub fn rm(root: Option<&Path>, args: RmArgs) -> anyhow::Result<u8> {
    let mut evidence = Evidence::default();
    let mut code = exit::OK;
    let mut done: Vec<&str> = Vec::new();
    for id in &args.run_ids {
        if done.contains(&id.as_str()) {
            continue;
        }
        done.push(id);
        match rm_one(root, id, &mut evidence, args.dry_run) {
            Ok(()) if args.dry_run => println!("would remove {id}"),
            Ok(()) => println!("removed {id}"),
            Err(e) => {
                eprintln!("agent-run: {e:#}");
                if code == exit::OK {
                    code = exit_code_of(&e);
                }
            }
        }
    }
    Ok(code)
}

fn rm_one(
    root: Option<&Path>,
    id: &str,
    evidence: &mut Evidence,
    dry_run: bool,
) -> anyhow::Result<()> {
    let dir = open_run(root, id)?;
    let st = read_record(&dir).map_err(|e| {
        e.context(format!(
            "{id}: not removed (agent-run cancel {id} writes its record anew from the kernel's facts)"
        ))
    })?;
    if let Err(why) = removal::may_remove(&dir, &st, evidence) {
        return fail(exit::TEMPFAIL, format!("{id}: not removed: {why}"));
    }
    if dry_run {
        return Ok(());
    }
    let Some(root) = crate::runs::open_root(root)? else {
        return fail(exit::NO_SUCH_RUN, format!("no such run {id}"));
    };
    removal::remove(&root, &dir).or_else(|e| {
        fail(
            exit::SOFTWARE,
            format!("cannot remove {}: {e}", dir.path().display()),
        )
    })
}
