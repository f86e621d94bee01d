//! `agent-run version [--json]`: what this binary is and can do, and what this host offers it,
//! so a controller can check a host before it starts anything (`agent-run remote` does).

use crate::cli::VersionArgs;
use agent_run_shared::{exit, features};

/// `agent-run version`.
pub fn version(args: VersionArgs) -> anyhow::Result<u8> {
    let v = features::version_value();
    if args.json {
        crate::select::print_json(&v);
        return Ok(exit::OK);
    }
    println!(
        "agent-run {} (record schema {})",
        agent_run_shared::VERSION,
        v["schema"]
    );
    println!("features: {}", features::FEATURES.join(" "));
    let cg = &v["cgroup"];
    match cg["mount"].as_str() {
        Some(mount) => {
            let can = if cg["can_create_child"] == true {
                "yes".to_string()
            } else {
                format!("no ({})", cg["why"].as_str().unwrap_or("unknown"))
            };
            println!(
                "cgroup v2: mounted at {mount}, this process in {}, may create a child: {can}",
                cg["cgroup"].as_str().unwrap_or("?")
            );
            println!(
                "runs started here are held by: {}",
                cg["containment"].as_str().unwrap_or("procfs")
            );
        }
        None => println!(
            "cgroup v2: {}",
            cg["why"].as_str().unwrap_or("not available")
        ),
    }
    Ok(exit::OK)
}
