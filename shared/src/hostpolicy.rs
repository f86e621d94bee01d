//! Host policies that kill runs behind agent-run's back, detected at launch.
//!
//! With systemd-logind's `KillUserProcesses=yes`, everything in an SSH login session's scope
//! (`session-N.scope`) is killed when the session ends, whatever `setsid` does (systemd issue
//! 2975). We cannot prevent it from here; we can see it coming and say so in the record and the
//! journal. Detection reads logind's configuration files (the last setting wins, drop-ins in
//! lexical order after the main file) and this process's cgroup.

use std::fs;
use std::path::Path;

/// Warnings about host policies for a run launched by this process.
pub fn launch_warnings(user: &str) -> Vec<String> {
    let cgroup = crate::cgroup::self_cgroup_text().unwrap_or_default();
    warnings_for(Path::new("/"), cgroup, user)
}

/// The same, with the config tree under `prefix` and the cgroup text given (for tests).
pub fn warnings_for(prefix: &Path, cgroup: &str, user: &str) -> Vec<String> {
    let Some(scope) = session_scope(cgroup) else {
        return Vec::new();
    };
    let cfg = logind_settings(prefix);
    // Unset: the compiled-in default, which the shipped logind.conf shows as a commented line
    // (`#KillUserProcesses=no` on Debian and Ubuntu); upstream's own default is `yes`.
    let kill = cfg
        .kill_user_processes
        .or(cfg.shipped_default)
        .unwrap_or(true);
    // logind's defaults: KillExcludeUsers=root, KillOnlyUsers= empty (everyone).
    let excluded = match &cfg.kill_exclude_users {
        Some(list) => list.iter().any(|u| u == user),
        None => user == "root",
    };
    let only = cfg
        .kill_only_users
        .as_ref()
        .is_none_or(|list| list.is_empty() || list.iter().any(|u| u == user));
    if kill && !excluded && only {
        vec![format!(
            "systemd-logind has KillUserProcesses=yes and this run was started from {scope}: \
             logind will kill it when that login session ends, whatever setsid does (systemd \
             issue 2975); see the README section on KillUserProcesses"
        )]
    } else {
        Vec::new()
    }
}

/// The login session scope this process lives in, if any (`session-12.scope`).
fn session_scope(cgroup: &str) -> Option<String> {
    cgroup
        .lines()
        .flat_map(|l| l.rsplit('/'))
        .find(|part| part.starts_with("session-") && part.ends_with(".scope"))
        .map(str::to_string)
}

#[derive(Default, Debug)]
struct Logind {
    kill_user_processes: Option<bool>,
    /// The commented `#KillUserProcesses=` line of the main file: the compiled-in default.
    shipped_default: Option<bool>,
    kill_exclude_users: Option<Vec<String>>,
    kill_only_users: Option<Vec<String>>,
}

fn logind_settings(prefix: &Path) -> Logind {
    let mut files = vec![prefix.join("etc/systemd/logind.conf")];
    let mut dropins: Vec<(String, std::path::PathBuf)> = Vec::new();
    for d in [
        "usr/lib/systemd/logind.conf.d",
        "run/systemd/logind.conf.d",
        "etc/systemd/logind.conf.d",
    ] {
        if let Ok(rd) = fs::read_dir(prefix.join(d)) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".conf") {
                    // Later directories override earlier ones for the same name.
                    dropins.retain(|(n, _)| n != &name);
                    dropins.push((name, e.path()));
                }
            }
        }
    }
    dropins.sort_by(|a, b| a.0.cmp(&b.0));
    files.extend(dropins.into_iter().map(|(_, p)| p));
    let mut out = Logind::default();
    let users = |v: &str| Some(v.split_whitespace().map(str::to_string).collect::<Vec<_>>());
    for (i, f) in files.iter().enumerate() {
        let Ok(text) = fs::read_to_string(f) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            if let Some(v) = line.strip_prefix("KillUserProcesses=") {
                out.kill_user_processes = parse_bool(v.trim());
            } else if let Some(v) = line.strip_prefix("#KillUserProcesses=") {
                if i == 0 {
                    out.shipped_default = parse_bool(v.trim());
                }
            } else if let Some(v) = line.strip_prefix("KillExcludeUsers=") {
                out.kill_exclude_users = users(v);
            } else if let Some(v) = line.strip_prefix("KillOnlyUsers=") {
                out.kill_only_users = users(v);
            }
        }
    }
    out
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "yes" | "y" | "true" | "t" | "on" => Some(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(main: &str, dropin: Option<&str>) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("etc/systemd/logind.conf.d")).unwrap();
        fs::write(d.path().join("etc/systemd/logind.conf"), main).unwrap();
        if let Some(x) = dropin {
            fs::write(d.path().join("etc/systemd/logind.conf.d/50-x.conf"), x).unwrap();
        }
        d
    }

    const SSH: &str = "0::/user.slice/user-1000.slice/session-12.scope\n";

    #[test]
    fn warns_when_logind_kills_the_session_we_run_in() {
        let d = tree("[Login]\nKillUserProcesses=yes\n", None);
        let w = warnings_for(d.path(), SSH, "alice");
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("session-12.scope"), "{w:?}");
    }

    #[test]
    fn an_unset_value_falls_back_to_the_shipped_default_then_to_upstreams_yes() {
        let d = tree("[Login]\n#KillUserProcesses=yes\n", None);
        assert_eq!(warnings_for(d.path(), SSH, "alice").len(), 1);
        let d = tree("[Login]\n", None);
        assert_eq!(warnings_for(d.path(), SSH, "alice").len(), 1);
    }

    #[test]
    fn is_quiet_when_excluded_overridden_or_not_in_a_session() {
        let d = tree(
            "[Login]\nKillUserProcesses=yes\nKillExcludeUsers=root alice\n",
            None,
        );
        assert!(warnings_for(d.path(), SSH, "alice").is_empty());
        let d = tree(
            "[Login]\nKillUserProcesses=yes\n",
            Some("[Login]\nKillUserProcesses=no\n"),
        );
        assert!(warnings_for(d.path(), SSH, "alice").is_empty());
        let d = tree("[Login]\n#KillUserProcesses=no\n", None);
        assert!(warnings_for(d.path(), SSH, "alice").is_empty());
        let d = tree("[Login]\nKillUserProcesses=yes\n", None);
        assert!(
            warnings_for(d.path(), SSH, "root").is_empty(),
            "root is excluded by default"
        );
        let d = tree("[Login]\nKillUserProcesses=yes\nKillOnlyUsers=bob\n", None);
        assert!(warnings_for(d.path(), SSH, "alice").is_empty());
        let d = tree("[Login]\nKillUserProcesses=yes\n", None);
        let service = "0::/system.slice/agent.service\n";
        assert!(warnings_for(d.path(), service, "alice").is_empty());
    }
}
