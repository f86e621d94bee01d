//! The library behind `agent-run` and `agent-run-watchdog`.
//!
//! Every piece that more than one binary needs lives here, once: run ids ([`id`]), the run root
//! ([`root`]), the run dir and its files ([`run_dir`]: one descriptor, every file reached through
//! it), the status record ([`record`]) and its lifecycle ([`lifecycle`]), the events journal
//! ([`journal`]), leases ([`lease`]), the run's lock ([`lock`]), cancel requests
//! ([`cancel_request`]), the live wrapper ([`wrapper`]), /proc reading ([`procfs`]), the run's
//! process set ([`procset`]), signal names ([`signal`]), THE stop routine ([`stop`]) and the
//! exit-code table ([`exit`]). Raw syscalls that
//! std lacks are fenced in [`sys`], the only module allowed to use `unsafe`.
#![deny(unsafe_code)]

pub mod cancel_request;
pub mod cgroup;
pub mod error;
pub mod escape;
pub mod exit;
pub mod fault;
pub mod features;
pub mod heartbeat;
pub mod held;
pub mod hostpolicy;
pub mod id;
pub mod journal;
pub mod lease;
pub mod lifecycle;
pub mod lock;
pub mod output;
pub mod peek;
pub mod pid;
pub mod pid_counter;
pub mod procfs;
pub mod procset;
pub mod pty;
pub mod quote;
pub mod reap;
pub mod reason;
pub mod record;
pub mod removal;
pub mod root;
pub mod run_dir;
pub mod signal;
pub mod spawn;
pub mod spec;
pub mod ssh;
pub mod stop;
pub mod suspend;
pub mod sweep;
pub mod sys;
pub mod takeover;
pub mod time;
pub mod users;
pub mod verdict;
pub mod wrapper;

pub use error::{Error, Result};

/// agent-run's version, written into every record.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The environment variable that names the run in the workload's environment.
pub const ENV_RUN_ID: &str = "AGENT_RUN_ID";
/// The environment variable that holds the run dir in the workload's environment.
pub const ENV_RUN_DIR: &str = "AGENT_RUN_DIR";
/// The environment variable that overrides the default run root.
pub const ENV_ROOT: &str = "AGENT_RUN_ROOT";
