//! What every boot of [`super::Systemd`] starts from: the Debian root, built once with
//! mmdebstrap and cached under `target/systemd-root/`, and the agent-run package, built once per
//! test process from the binaries under test.
//!
//! The root's directory name carries a hash of its recipe ([`recipe`]): a changed recipe builds a
//! new root, and the old one is removed after. A build goes into a directory of its own
//! (`.build-<pid>`) and is renamed into place, so two test processes that build at once never
//! see half a root: the second rename fails and its copy is dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::{agent_run_bin, describe_output, run_with_timeout, watchdog_bin, workspace_bin};

/// The Debian release of the root: systemd 252.
pub const SUITE: &str = "bookworm";

/// The packages on top of mmdebstrap's `apt` variant: systemd as PID 1, logind (user managers,
/// sessions through PAM), the D-Bus system and user buses, and ps for diagnostics.
const INCLUDE: &str = "systemd,systemd-sysv,dbus,dbus-user-session,libpam-systemd,procps";

/// The users of the root, with their uids. No test process runs as them outside the root.
pub const USERS: [(&str, u32); 2] = [("alice", 1000), ("bob", 1001)];

/// The root's last steps, run by mmdebstrap on the host with `$1` the root: the users; no
/// getty on the host's console or tty1 (both are bound from the host's /dev); no apt or dpkg
/// timers; a journal in memory that does not read the kernel's log (the host's).
fn hooks() -> Vec<String> {
    let mut hooks: Vec<String> = USERS
        .iter()
        .map(|(name, uid)| {
            format!("chroot \"$1\" useradd --create-home --shell /bin/bash --uid {uid} {name}")
        })
        .collect();
    for unit in [
        "console-getty.service",
        "getty@tty1.service",
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "dpkg-db-backup.timer",
    ] {
        hooks.push(format!("ln -s /dev/null \"$1/etc/systemd/system/{unit}\""));
    }
    hooks.push(
        "mkdir -p \"$1/etc/systemd/journald.conf.d\" && printf '[Journal]\\nStorage=volatile\\nReadKMsg=no\\n' > \"$1/etc/systemd/journald.conf.d/agent-run-test.conf\"".into(),
    );
    hooks
}

/// Everything that decides what the root holds, as text: its hash names the cached root.
fn recipe() -> String {
    format!("{SUITE}\n{INCLUDE}\n{}", hooks().join("\n"))
}

/// FNV-1a, 64 bits: stable across Rust releases (std's hasher is not promised to be).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The workspace's `target/` directory (the parent of the binaries' profile directory).
pub(crate) fn target_dir() -> PathBuf {
    let profile = crate::bins::profile_dir();
    profile.parent().unwrap_or(&profile).to_path_buf()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cached Debian root, built on first use (about a minute, from the package registry).
pub fn cached_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let cache = target_dir().join("systemd-root");
        let name = format!("{SUITE}-{:016x}", fnv1a(&recipe()));
        let dir = cache.join(&name);
        if !dir.join("lib/systemd/systemd").is_file() {
            build_root(&cache, &dir);
        }
        remove_stale_roots(&cache, &name);
        dir
    })
}

fn build_root(cache: &Path, dir: &Path) {
    fs::create_dir_all(cache).unwrap_or_else(|e| panic!("mkdir {}: {e}", cache.display()));
    let tmp = cache.join(format!(".build-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    eprintln!(
        "building the Debian root for the systemd tests in {} (once; about a minute)",
        dir.display()
    );
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--variant=apt", &format!("--include={INCLUDE}")]);
    for hook in hooks() {
        cmd.arg(format!("--customize-hook={hook}"));
    }
    cmd.arg(SUITE).arg(&tmp);
    let out = run_with_timeout(&mut cmd, Duration::from_secs(900));
    if !out.status.success() {
        let _ = fs::remove_dir_all(&tmp);
        panic!(
            "mmdebstrap failed (it is in the packages .ci/test installs; it needs root and the \
             Debian package registry)\n{}",
            describe_output("mmdebstrap", &out)
        );
    }
    if let Err(e) = fs::rename(&tmp, dir) {
        // Another test process put its root there first: use that one.
        let _ = fs::remove_dir_all(&tmp);
        assert!(
            dir.join("lib/systemd/systemd").is_file(),
            "cannot rename {} to {}: {e}",
            tmp.display(),
            dir.display()
        );
    }
}

/// Roots of other recipes, and builds whose process is gone: only the current root stays.
fn remove_stale_roots(cache: &Path, keep: &str) {
    for entry in fs::read_dir(cache).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale = match name.strip_prefix(".build-") {
            Some(pid) => !Path::new("/proc").join(pid).exists(),
            None => name.starts_with(&format!("{SUITE}-")) && name != keep,
        };
        if stale {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// The agent-run package of the binaries under test, built once per test process by
/// `packaging/build-deb.sh --bin-dir` (the unit files and docs exactly as shipped; the debug
/// binaries stripped of their debug info).
pub fn package() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        let bins = agent_run_bin();
        let dir = bins
            .parent()
            .expect("agent-run has a directory")
            .to_path_buf();
        let gen = workspace_bin(
            "AGENT_RUN_GEN_BIN",
            "agent-run-gen",
            &["packaging/gen", "wrapper", "watchdog", "shared"],
        );
        for other in [watchdog_bin(), gen] {
            assert_eq!(
                other.parent(),
                Some(dir.as_path()),
                "build-deb.sh --bin-dir takes every binary from one directory: {} is not in {}",
                other.display(),
                dir.display()
            );
        }
        let tests = target_dir().join("systemd-test");
        let out = tests.join(format!("deb.{}", std::process::id()));
        let _ = fs::remove_dir_all(&out);
        let mut cmd = Command::new("bash");
        cmd.current_dir(workspace())
            .arg("packaging/build-deb.sh")
            .arg("--bin-dir")
            .arg(&dir)
            .arg("--out")
            .arg(&out);
        let built = run_with_timeout(&mut cmd, Duration::from_secs(300));
        assert!(
            built.status.success(),
            "{}",
            describe_output("build-deb.sh", &built)
        );
        let deb = fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .unwrap_or_else(|| panic!("build-deb.sh left no .deb in {}", out.display()));
        // One name for every test process: a rename replaces it whole, and a boot that is
        // copying the previous one keeps reading the file it opened.
        let kept = tests.join("agent-run.deb");
        fs::rename(&deb, &kept).unwrap_or_else(|e| panic!("rename {}: {e}", deb.display()));
        let _ = fs::remove_dir_all(&out);
        kept
    })
}
