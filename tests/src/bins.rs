//! The binaries under test, and the one build step that makes them.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::reachable::reachable;

/// The cargo profile directory of the running executable: `…/target/debug/deps/t-123` and
/// `…/target/debug/fixture` both give `…/target/debug`.
pub(crate) fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("cannot find the current executable");
    let dir = exe
        .parent()
        .expect("the current executable has no parent dir");
    match dir.file_name().and_then(OsStr::to_str) {
        Some("deps" | "examples") => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// The lease token the suite's commands carry ([`TestRoot::cmd`], [`hostile::as_nobody`]): the
/// tests start their runs and renew them as one controller.
pub const LEASE_TOKEN: &str = "agent-run-test-suite-lease-token";

/// The variable that carries it.
pub const LEASE_TOKEN_ENV: &str = "AGENT_RUN_LEASE_TOKEN";

/// The one build step the suite needs besides `cargo test`: cargo builds the binaries of the
/// package under test (the `fixture`), not those of the other workspace members, and a test
/// does not run cargo itself. `.ci/test` runs it before `cargo test --workspace`.
pub const BUILD_STEP: &str = "cargo build --workspace --bins";

/// The newest modification time of the files a binary is built from: `Cargo.lock`, and every
/// file below `<crate>/src` and `<crate>/Cargo.toml` of `crates` (paths from the workspace).
fn newest_source(crates: &[&str]) -> Option<(std::time::SystemTime, PathBuf)> {
    fn walk(path: &Path, newest: &mut Option<(std::time::SystemTime, PathBuf)>) {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return;
        };
        if meta.is_dir() {
            for entry in fs::read_dir(path).into_iter().flatten().flatten() {
                walk(&entry.path(), newest);
            }
        } else if let Ok(t) = meta.modified() {
            if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                *newest = Some((t, path.to_path_buf()));
            }
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newest = None;
    walk(&workspace.join("Cargo.lock"), &mut newest);
    for krate in crates {
        walk(&workspace.join(krate).join("src"), &mut newest);
        walk(&workspace.join(krate).join("Cargo.toml"), &mut newest);
    }
    newest
}

/// The newest modification time of the files cargo's dep-info file `d` (`target: dep dep ...`,
/// spaces in a path escaped with a backslash) names, and which one it is; `None` when there is no such
/// file or it names nothing. A listed file that is gone counts as changed now.
fn dep_info_newest(d: &Path) -> Option<(std::time::SystemTime, PathBuf)> {
    let text = fs::read_to_string(d).ok()?;
    let line = text.lines().next()?;
    let (_, deps) = line.split_once(": ")?;
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    let mut word = String::new();
    let mut chars = deps.chars().peekable();
    let mut paths = Vec::new();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => word.push(chars.next().unwrap_or(' ')),
            ' ' => paths.push(std::mem::take(&mut word)),
            c => word.push(c),
        }
    }
    paths.push(word);
    for p in paths.into_iter().filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        let t = fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| std::time::SystemTime::now());
        if newest.as_ref().is_none_or(|(n, _)| t > *n) {
            newest = Some((t, path));
        }
    }
    newest
}

/// A binary of another workspace member: `$VAR` if set, else `<profile dir>/NAME`, which must
/// exist and be newer than every source file of `crates` (else the test would check an old
/// build). Panics naming [`BUILD_STEP`] when it is missing or stale. A copy every user reaches
/// when others cannot reach it ([`reachable`]).
pub fn workspace_bin(var: &str, name: &str, crates: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return reachable(PathBuf::from(path));
    }
    let profile = profile_dir();
    let path = profile.join(name);
    let release = if profile.file_name() == Some(OsStr::new("release")) {
        " --release"
    } else {
        ""
    };
    let fix = format!(
        "run `{BUILD_STEP}{release}` before the tests (`bash .ci/test` does), or set {var}"
    );
    let built = fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{} is missing ({e}): {fix}", path.display()));
    // Cargo's dep-info file beside the binary lists exactly the sources it was built from (a
    // file of a crate the binary does not use never makes it stale); without one, every file of
    // `crates` counts.
    let newest =
        dep_info_newest(&profile.join(format!("{name}.d"))).or_else(|| newest_source(crates));
    if let Some((newest, source)) = newest {
        if newest > built {
            panic!(
                "{} is older than {}: {fix}",
                path.display(),
                source.display()
            );
        }
    }
    reachable(path)
}

/// The `agent-run` binary: `$AGENT_RUN_BIN`, else `<profile dir>/agent-run` ([`BUILD_STEP`]).
pub fn agent_run_bin() -> PathBuf {
    workspace_bin("AGENT_RUN_BIN", "agent-run", &["wrapper", "shared"])
}

/// The `agent-run-watchdog` binary: `$AGENT_RUN_WATCHDOG_BIN`, else beside the tests.
pub fn watchdog_bin() -> PathBuf {
    workspace_bin(
        "AGENT_RUN_WATCHDOG_BIN",
        "agent-run-watchdog",
        &["watchdog", "shared"],
    )
}

/// The fixture under the name `agent-run` in `dir` (a process the exe check takes for an
/// agent-run party). A hard link where it can be: a fresh copy is a file just written, and a
/// test thread that forks meanwhile holds its write descriptor until its child execs, so an
/// exec of the copy fails with ETXTBSY ("Text file busy"). A copy only across file systems.
pub fn fixture_as_agent_run(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("a bin dir");
    let named = dir.join("agent-run");
    if !named.exists() && std::fs::hard_link(fixture_bin(), &named).is_err() {
        std::fs::copy(fixture_bin(), &named).expect("copy the fixture");
    }
    named
}

/// The `fixture` workload: `$AGENT_RUN_FIXTURE_BIN`, else `<profile dir>/fixture` (cargo
/// builds it before it runs this package's tests: it is a binary of this package). A copy
/// every user reaches when others cannot reach it ([`reachable`]).
pub fn fixture_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("AGENT_RUN_FIXTURE_BIN") {
        return reachable(PathBuf::from(path));
    }
    let beside = profile_dir().join("fixture");
    assert!(
        beside.is_file(),
        "{} is missing: cargo builds it for `cargo test -p agent-run-tests`",
        beside.display()
    );
    reachable(beside)
}
