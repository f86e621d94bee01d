//! The watchdog's command line (also read by the man page generator).

use agent_run_shared::time::parse_duration;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Expire agent-run leases nobody renews and reconcile runs whose wrapper is gone, stuck, or
/// from an earlier boot. One per user; runs in the foreground (for systemd, Type=notify).
///
/// Runs whose wrapper is alive are the wrapper's business, until its lease is past deadline +
/// grace + slack. Runs whose wrapper is gone: processes that remain are stopped when the lease
/// expires (or after --orphan-grace without a lease) and the record becomes `cancelled`; if
/// nothing remains it becomes `unknown` (`wrapper_lost`). A record from an earlier boot becomes
/// `unknown` (`host_rebooted`) and nothing is signalled. SIGTERM: finish stops in flight, exit 0.
/// SIGHUP: rescan now, and log when that pass is done (skipped runs are looked at again on every
/// rescan). Deadlines that fall due during a rescan are acted on at once.
///
/// One watchdog per root: it holds `<root>/.watchdog.lock`; a second one (daemon or --once)
/// names the holder's pid and exits 75. Records that do not hold the whole identity, and run
/// files that are not regular files of ours (a FIFO, a socket, a symlink, a huge file), make a
/// run corrupt: it is skipped, said once in the log and its journal, and nothing is signalled.
/// Exit codes: 0 done, 64 bad usage, 70 internal error, 75 another watchdog holds the root,
/// 78 unsafe run root.
#[derive(Debug, Parser)]
#[command(name = "agent-run-watchdog", version)]
pub struct Cli {
    /// The run root (default: $AGENT_RUN_ROOT, else $HOME/.agent-runs)
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// One pass: act on what is due now, wait for those stops, exit
    #[arg(long)]
    pub once: bool,
    /// Full rescan interval (the backstop for events)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = dur("--scan-interval"))]
    pub scan_interval: Duration,
    /// How long the processes of a run without a lease may outlive its wrapper
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = dur("--orphan-grace"))]
    pub orphan_grace: Duration,
    /// How far past lease deadline + grace a live wrapper may be before the watchdog steps in
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = dur("--slack"))]
    pub slack: Duration,
    /// Remove final runs that ended more than DUR ago (e.g. 14d), as `agent-run gc
    /// --older-than DUR` would: after a --once pass, and once per --scan-interval beside the
    /// daemon. A run whose lock a live process holds, whose cgroup holds a process, or of which
    /// a process may live on is kept. Each removal is a log line naming the run. Default: off
    /// (nothing is removed)
    #[arg(long, value_name = "DUR", value_parser = dur("--retain"))]
    pub retain: Option<Duration>,
}

pub fn dur(what: &'static str) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s| parse_duration(what, s).map_err(|e| e.to_string())
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
