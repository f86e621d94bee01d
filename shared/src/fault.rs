//! Fault points for tests: in debug builds, `AGENT_RUN_FAULT=<point>` makes the process SIGKILL
//! itself when it reaches that point, so tests can prove that `cancel` and the watchdog bring a
//! run to a truthful final state whatever step the wrapper died at. Release builds compile every
//! point to nothing.
//!
//! The points, in the order a run meets them: see [`POINTS`]. One knob changes a behaviour
//! instead: [`SPAWN_BY_FORK`].

/// Every fault point, in launch-then-stop order.
pub const POINTS: &[&str] = &[
    "after_run_dir",
    "after_starting",
    "after_spawn",
    "before_running",
    "after_term",
    "after_hup",
    "after_kill",
    "before_final",
    "mid_record_write",
];

/// A knob, not a point: with `AGENT_RUN_FAULT=spawn_by_fork` the workload is spawned by fork(2)
/// and moves itself into its cgroup (a write to `cgroup.procs`), as on kernels without clone3's
/// CLONE_INTO_CGROUP, so tests reach that path on any kernel. Read with [`armed`].
pub const SPAWN_BY_FORK: &str = "spawn_by_fork";

/// A knob: with `AGENT_RUN_FAULT=slow_log_fsync` the output keeper sleeps 5 s before it fsyncs
/// the logs at EOF, as on a disk slower than the wrapper's bare wait for the counts. Read with
/// [`armed`].
pub const SLOW_LOG_FSYNC: &str = "slow_log_fsync";
/// A knob: with `AGENT_RUN_FAULT=keeper_fork_fails` the output keeper's fork (made right after
/// the workload's spawn) fails, as under a fork bomb that took the last pid, so tests reach the
/// path that stops a spawned workload nobody would drain. Read with [`armed`].
pub const KEEPER_FORK_FAILS: &str = "keeper_fork_fails";

/// A knob: with `AGENT_RUN_FAULT=hold_spawn_report` the wrapper keeps its write end of the
/// spawn's report pipe open until something is in the pipe (at most 10 s), so a test workload
/// that opens it through /proc/PPID/fd, as a hostile one can in the moment after its exec,
/// always finds it. Read with [`armed`].
pub const HOLD_SPAWN_REPORT: &str = "hold_spawn_report";

/// A knob: with `AGENT_RUN_FAULT=assume_linger` the wrapper takes its user for one who lingers
/// (`loginctl enable-linger`), so a test with a stand-in `systemd-run` and no logind reaches
/// the user scope's request ([`crate::cgroup::user_scope_command`]). Read with [`armed`].
pub const ASSUME_LINGER: &str = "assume_linger";

/// A knob: with `AGENT_RUN_FAULT=slow_pass` each run dir of the watchdog's full pass takes
/// [`SLOW_PASS_STEP`] more, as in a root so big or on a disk so slow that a pass takes seconds,
/// so tests see what a deadline due in the middle of a pass waits for. Read with [`armed`].
pub const SLOW_PASS: &str = "slow_pass";

/// How much longer [`SLOW_PASS`] makes each run dir of a pass.
pub const SLOW_PASS_STEP: std::time::Duration = std::time::Duration::from_millis(50);

/// The environment variable that names the point to die at (or the knob to turn).
pub const ENV: &str = "AGENT_RUN_FAULT";

/// Die here (SIGKILL, no cleanup) if `AGENT_RUN_FAULT` names this point. Debug builds only.
#[inline]
pub fn point(name: &str) {
    #[cfg(debug_assertions)]
    {
        debug_assert!(POINTS.contains(&name), "unknown fault point {name}");
        if armed(name) {
            crate::sys::kill_self();
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// Whether `AGENT_RUN_FAULT` names this point, alone or in a comma-separated list (a point
/// and knobs; always false in release builds).
#[inline]
pub fn armed(name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        static WANT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        WANT.get_or_init(|| std::env::var(ENV).ok())
            .as_deref()
            .is_some_and(|want| want.split(',').any(|w| w == name))
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}
