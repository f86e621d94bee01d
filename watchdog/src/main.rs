//! `agent-run-watchdog`: thin main over the `agent_run_watchdog` library.
#![forbid(unsafe_code)]

use agent_run_shared::root::{resolve_root, Root};
use agent_run_shared::time::parse_duration;
use agent_run_watchdog::{run, run_once, Options, Policy};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Expire agent-run leases nobody renews and reconcile runs whose wrapper is gone, stuck, or
/// from an earlier boot. One per user; runs in the foreground (for systemd, Type=notify).
///
/// Runs whose wrapper is alive are the wrapper's business, until its lease is past deadline +
/// grace + slack. Runs whose wrapper is gone: processes that remain are stopped when the lease
/// expires (or after --orphan-grace without a lease) and the record becomes `cancelled`; if
/// nothing remains it becomes `unknown` (`wrapper_lost`). A record from an earlier boot becomes
/// `unknown` (`host_rebooted`) and nothing is signalled. SIGTERM: finish stops in flight, exit 0.
/// SIGHUP: rescan now.
#[derive(Debug, Parser)]
#[command(name = "agent-run-watchdog", version)]
struct Cli {
    /// The run root (default: $AGENT_RUN_ROOT, else $HOME/.agent-runs)
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// One pass: act on what is due now, wait for those stops, exit
    #[arg(long)]
    once: bool,
    /// Full rescan interval (the backstop for events)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = dur("--scan-interval"))]
    scan_interval: Duration,
    /// How long the processes of a run without a lease may outlive its wrapper
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = dur("--orphan-grace"))]
    orphan_grace: Duration,
    /// How far past lease deadline + grace a live wrapper may be before the watchdog steps in
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = dur("--slack"))]
    slack: Duration,
}

fn dur(what: &'static str) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s| parse_duration(what, s).map_err(|e| e.to_string())
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
