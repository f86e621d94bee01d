//! The control subcommands (placeholder while [core] lands).

use crate::cli::*;
use agent_run_shared::id::RunId;
use agent_run_shared::root::{Root, RunDir};
use std::path::Path;

pub fn relaunch(_root: &Root, id: &RunId, _argv: &[String], _quiet: bool) -> anyhow::Result<u8> {
    fail(
        agent_run_shared::exit::SOFTWARE,
        format!("run {id} already exists"),
    )
}
pub fn detach_parent(_root: &Root, _dir: &RunDir, _args: &StartArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn cancel(_r: Option<&Path>, _a: CancelArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn renew(_r: Option<&Path>, _a: RenewArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn status(_r: Option<&Path>, _a: StatusArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn wait(_r: Option<&Path>, _a: WaitArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn attach(_r: Option<&Path>, _a: IdArg) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn logs(_r: Option<&Path>, _a: LogsArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn list(_r: Option<&Path>, _a: ListArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
pub fn gc(_r: Option<&Path>, _a: GcArgs) -> anyhow::Result<u8> {
    fail(70, "not yet")
}
