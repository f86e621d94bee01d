//! What this build of agent-run can do, and what this host gives it: `agent-run version --json`,
//! which a controller (`agent-run remote`) reads before it starts anything.
//!
//! [`FEATURES`] names each capability of the binary; a change that adds one adds its name here
//! (and to the contract's list), nothing else. Host facts are probed, never assumed: the cgroup v2
//! mount from /proc/self/mountinfo, this process's cgroup from /proc/self/cgroup, and whether
//! this user may create a child there (what a cgroup per run needs).

use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The capabilities of this binary, by the names `version --json` reports.
pub const FEATURES: &[&str] = &[
    "cwd",
    "env",
    "labels",
    "many_ids",
    "on_disconnect",
    "suspend",
    "timeout",
    "version",
    "wait_any",
];

/// Whether this binary has a feature.
pub fn has(feature: &str) -> bool {
    FEATURES.contains(&feature)
}

/// What the host's cgroup v2 hierarchy offers this user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupProbe {
    /// Where cgroup2 is mounted (the first cgroup2 line of /proc/self/mountinfo).
    pub mount: Option<PathBuf>,
    /// This process's cgroup (the `0::` line of /proc/self/cgroup).
    pub cgroup: Option<String>,
    /// Whether this user may create a child of that cgroup.
    pub can_create_child: bool,
    /// Why not, when it may not.
    pub why: Option<String>,
}

/// The mount point and options of the first cgroup2 mount in a mountinfo text.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<(PathBuf, bool)> {
    mountinfo.lines().find_map(|line| {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS`
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        let mount = unescape_mount(fields.get(4)?);
        let read_only = fields.get(5)?.split(',').any(|o| o == "ro");
        Some((PathBuf::from(mount), read_only))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("0");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path of a /proc/PID/cgroup text (the `0::` line).
pub fn cgroup2_path_in(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// Probe this host's cgroup v2 for this process and user. Reads only; creates nothing.
pub fn probe_cgroup() -> CgroupProbe {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup2_path_in(&t));
    let mut p = CgroupProbe {
        mount: None,
        cgroup: cgroup.clone(),
        can_create_child: false,
        why: None,
    };
    let Some((mount, read_only)) = cgroup2_mount_in(&mountinfo) else {
        p.why = Some("no cgroup2 file system is mounted (/proc/self/mountinfo)".into());
        return p;
    };
    p.mount = Some(mount.clone());
    let Some(cg) = cgroup else {
        p.why =
            Some("this process has no cgroup v2 path (/proc/self/cgroup has no 0:: line)".into());
        return p;
    };
    if read_only {
        p.why = Some(format!("{} is mounted read-only", mount.display()));
        return p;
    }
    let dir = mount.join(cg.trim_start_matches('/'));
    match may_create_in(&dir) {
        Ok(()) => p.can_create_child = true,
        Err(why) => p.why = Some(why),
    }
    p
}

/// Whether this user may create a directory (a child cgroup) in `dir`: root, or the owner with
/// write and search permission, or a group or other write and search bit that applies.
fn may_create_in(dir: &Path) -> Result<(), String> {
    let md =
        std::fs::metadata(dir).map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    let uid = crate::sys::geteuid();
    if uid == 0 {
        return Ok(());
    }
    let mode = md.mode();
    let allowed = if md.uid() == uid {
        mode & 0o300 == 0o300
    } else {
        // Group membership is not worth an NSS lookup here: the other bits, or say no.
        mode & 0o003 == 0o003
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "{} belongs to uid {} (mode {:04o}): this user (uid {uid}) may not create a child there",
            dir.display(),
            md.uid(),
            mode & 0o7777
        ))
    }
}

/// `agent-run version --json`: the program, its version, the record schema it writes, its
/// features and what this host's cgroup v2 offers.
pub fn version_value() -> Value {
    let cg = probe_cgroup();
    json!({
        "program": "agent-run",
        "version": crate::VERSION,
        "schema": crate::record::SCHEMA,
        "features": FEATURES,
        "cgroup": {
            "mount": cg.mount,
            "cgroup": cg.cgroup,
            "can_create_child": cg.can_create_child,
            "why": cg.why,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_among_v1_mounts() {
        let text = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            cgroup2_mount_in(text),
            Some((PathBuf::from("/sys/fs/cgroup/unified"), false))
        );
        let ro = "41 31 0:38 / /sys/fs/cg\\040x ro,relatime shared:1 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(ro),
            Some((PathBuf::from("/sys/fs/cg x"), true))
        );
        assert_eq!(cgroup2_mount_in("1 2 0:1 / / rw - ext4 /dev/x rw\n"), None);
    }

    #[test]
    fn reads_the_unified_line_of_proc_cgroup() {
        let text = "4:memory:/x\n0::/user.slice/user-1000.slice\n";
        assert_eq!(
            cgroup2_path_in(text).as_deref(),
            Some("/user.slice/user-1000.slice")
        );
        assert_eq!(cgroup2_path_in("4:memory:/x\n"), None);
    }

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
