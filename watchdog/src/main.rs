//! `agent-run-watchdog`: thin main over the `agent_run_watchdog` library.
#![forbid(unsafe_code)]

mod cli;

use agent_run_shared::exit;
use agent_run_shared::root::{resolve_root, Root};
use agent_run_watchdog::{lock_root, retain, run, run_once, Options, Policy, RootBusy};
use clap::Parser;
use cli::Cli;
use std::process::ExitCode;
use std::time::Duration;

/// Under musl, the heap the wrapper uses ([`agent_run_shared::sys::Heap`]).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: agent_run_shared::sys::Heap = agent_run_shared::sys::Heap;

fn main() -> ExitCode {
    // Never taken for a run's wrapper while it holds a run's lock (sys::PARTY_MARK).
    agent_run_shared::sys::mark_party();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-run-watchdog: {e:#}");
            let code = if e.downcast_ref::<RootBusy>().is_some() {
                exit::TEMPFAIL
            } else {
                match e.downcast_ref::<agent_run_shared::Error>() {
                    Some(agent_run_shared::Error::Unsafe { .. }) => exit::CONFIG,
                    Some(agent_run_shared::Error::Invalid { .. }) => exit::USAGE,
                    _ => exit::SOFTWARE,
                }
            };
            ExitCode::from(code)
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    let root_path = resolve_root(cli.root.as_deref())?;
    let policy = Policy {
        orphan_grace: cli.orphan_grace,
        slack: cli.slack,
    };
    if cli.once {
        let root = Root::open(&root_path, true)?;
        // A single pass beside a daemon on the same root would only race it.
        let _root_lock = lock_root(&root)?;
        run_once(&root, &policy);
        if let Some(retain) = cli.retain {
            retain::sweep(&root, retain, &mut Default::default());
        }
        return Ok(());
    }
    if let Some(retain) = cli.retain {
        retain::spawn(root_path.clone(), retain, cli.scan_interval)?;
    }
    run(Options {
        root: root_path,
        scan_interval: cli.scan_interval,
        policy,
        max_parallel: 512,
        shutdown_timeout: Duration::from_secs(30),
    })
}
