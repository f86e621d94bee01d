//! `agent-run-watchdog`: thin main over the `agent_run_watchdog` library.
#![forbid(unsafe_code)]

mod cli;

use agent_run_shared::root::{resolve_root, Root};
use agent_run_watchdog::{run, run_once, Options, Policy};
use clap::Parser;
use cli::Cli;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 64 } else { 0 });
        }
    };
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-run-watchdog: {e:#}");
            let code = match e.downcast_ref::<agent_run_shared::Error>() {
                Some(agent_run_shared::Error::Unsafe { .. }) => 78,
                Some(agent_run_shared::Error::Invalid { .. }) => 64,
                _ => 70,
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
        run_once(&root, &policy);
        return Ok(());
    }
    run(Options {
        root: root_path,
        scan_interval: cli.scan_interval,
        policy,
        max_parallel: 512,
        shutdown_timeout: Duration::from_secs(30),
    })
}
