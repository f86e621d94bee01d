//! What this build of agent-run can do, and what this host gives it: `agent-run version --json`,
//! which a controller (`agent-run remote`) reads before it starts anything.
//!
//! [`FEATURES`] names each capability of the binary; a change that adds one adds its name here
//! (and to the contract's list), nothing else. Host facts are probed, never assumed, through the
//! same code a launch uses ([`crate::cgroup`]).

use serde_json::{json, Value};

/// The capabilities of this binary, by the names `version --json` reports.
pub const FEATURES: &[&str] = &[
    "cgroup",
    "cwd",
    "env",
    "json_flag",
    "labels",
    "many_ids",
    "max_output",
    "on_disconnect",
    "pty",
    "suspend",
    "timeout",
    "version",
    "wait_any",
];

/// Whether this binary has a feature.
pub fn has(feature: &str) -> bool {
    FEATURES.contains(&feature)
}

/// What the host's cgroup v2 hierarchy offers this user: where it is mounted, this process's
/// cgroup, and where a run started now would be held (the same decision a launch makes:
/// [`crate::cgroup::choose_parent`]). Reads only; creates nothing.
pub fn probe_cgroup() -> Value {
    let mount = crate::cgroup::mount();
    let own = crate::cgroup::self_cgroup_text()
        .and_then(crate::cgroup::v2_path)
        .map(str::to_string);
    let (parent, why) = match crate::cgroup::choose_parent(None) {
        Ok(crate::cgroup::Parent::Dir { path, .. }) => (Some(path), None),
        Ok(crate::cgroup::Parent::Procfs(why)) => (None, Some(why)),
        Err(e) => (None, Some(e.to_string())),
    };
    json!({
        "mount": mount,
        "cgroup": own,
        "can_create_child": parent.is_some(),
        "parent": parent,
        "containment": if parent.is_some() { "cgroup" } else { "procfs" },
        "why": why,
    })
}

/// `agent-run version --json`: the program, its version, the record schema it writes, its
/// features and what this host's cgroup v2 offers.
pub fn version_value() -> Value {
    json!({
        "program": "agent-run",
        "version": crate::VERSION,
        "schema": crate::record::SCHEMA,
        "features": FEATURES,
        "cgroup": probe_cgroup(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_document_names_every_feature() {
        let v = version_value();
        assert_eq!(v["version"], crate::VERSION);
        assert!(v["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "timeout"));
        assert!(has("many_ids") && !has("teleport"));
    }
}
