//! What the kernel says may still hold a run, read once per pass: now in the shared crate,
//! since `list`, `status --all` and `gc` read it once per sweep too ([`agent_run_shared::held`]).

pub use agent_run_shared::held::{CgroupParents, Flocks};
