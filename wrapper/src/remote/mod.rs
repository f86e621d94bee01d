//! `agent-run remote`: the controller half (being built).

use crate::cli::{fail, RemoteArgs};

/// `agent-run remote`.
pub fn remote(_args: RemoteArgs) -> anyhow::Result<u8> {
    fail(
        agent_run_shared::exit::SOFTWARE,
        "agent-run remote is not implemented yet",
    )
}
