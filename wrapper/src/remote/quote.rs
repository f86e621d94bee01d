//! Quoting argv for the remote shell: the routine lives in the shared crate
//! ([`agent_run_shared::quote`]), which `agent-run-mcp` uses too.

pub use agent_run_shared::quote::*;
