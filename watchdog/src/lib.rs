//! `agent-run-watchdog`: the independent backstop. It expires leases nobody renews and reconciles
//! runs whose wrapper is gone, stuck, or from an earlier boot, always through the shared stop
//! routine and record writer.
//!
//! Event-driven: inotify on the root and on every run dir (new runs, renewed leases, records),
//! a pidfd per live wrapper in one epoll set (a wrapper that dies wakes us at once), and a
//! deadline heap for leases and orphan graces. A full rescan every `scan_interval` is only the
//! backstop. Idle, it sleeps in `epoll_wait`. Stops run on their own threads, so one stubborn
//! run's grace never delays another's.
#![forbid(unsafe_code)]

pub mod act;
pub mod assess;
pub mod daemon;
pub mod decide;
pub mod held;
pub mod ledger;
pub mod notify;
pub mod once;
pub mod pass;
pub mod report;
pub mod retain;
pub mod root_lock;
pub mod watched;

pub use assess::{Action, Policy, Seen, Verdict};
pub use daemon::{run, Options};
pub use once::run_once;
pub use root_lock::{lock_root, RootBusy, ROOT_LOCK};
