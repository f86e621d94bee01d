//! The harness of agent-run's black-box tests (`tests/tests/*.rs`).
//!
//! It finds the binaries under test (built by one step before the tests, [`BUILD_STEP`]) and the `fixture` workload, gives each test its
//! own run root, waits on kernel facts instead of sleeping, and pins every process a test sees
//! with a pidfd so that it can be checked without pid-reuse races and killed, by pid, when the
//! test ends. It never signals a process by name.
//!
//! Every wait has one deadline and reports what it saw last when it runs out; every panic about a
//! run carries [`diagnostics()`] (the run dir listing, status.json, events.jsonl and log tails).
//!
//! **The one assertion style:** a check on a run goes through that run's [`Ctx`] (or another
//! [`Diagnosed`]: `ensure!(c, cond, ..)`, `c.eq(left, right, ..)`, `c.fail(..)` and the `Ctx`
//! helpers such as `c.code`, `c.fields`, `c.wait_gone`), so that its failure ends with the run
//! dir's diagnostics, and a check with no run dir to show is a plain `assert!`/`assert_eq!` with
//! a message.

pub mod ansible;
pub mod bins;
pub mod cli;
pub mod commands;
pub mod contain;
pub mod ctx;
pub mod diagnostics;
pub mod docs;
pub mod facts;
pub mod foreground;
pub mod fuzz;
pub mod hazards;
pub mod hostile;
pub mod hostile_run;
pub mod mcp;
pub mod mcp_wire;
pub mod modes;
pub mod pinned;
pub mod procs;
pub mod reachable;
pub mod reaper;
pub mod remote;
pub mod run_cgroups;
pub mod run_root;
pub mod scenario;
pub mod sys;
pub mod systemd;
pub mod tmux;
pub mod waiting;
pub mod workload;

pub use bins::*;
pub use commands::*;
pub use ctx::{ctx, Ctx, Detached, Diagnosed, Foreground};
pub use diagnostics::*;
pub use pinned::*;
pub use procs::*;
pub use reaper::Reaper;
pub use run_root::*;
pub use waiting::*;

/// One `#[test]` per case of a scenario that takes one argument, each test named:
///
/// ```text
/// cases!(starts_and_says_ready;
///     the_user_unit_starts_and_says_ready => Unit::User,
///     the_system_template_starts_and_says_ready => Unit::Template,
/// );
/// ```
///
/// For containment modes, [`mode_tests!`] also skips a mode the host cannot give.
#[macro_export]
macro_rules! cases {
    ($scenario:expr; $($(#[$attr:meta])* $name:ident => $arg:expr),+ $(,)?) => {
        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                ($scenario)($arg);
            }
        )+
    };
}

#[cfg(test)]
mod tests;
