//! `version` reports the features and this host's cgroup, and `remote` refuses a host whose
//! agent-run is missing or too old, starting nothing.
//!
//! Every process a test starts is pinned with a pidfd after the fixture's ready line and
//! checked in /proc; every run is final (or cancelled) before the test ends.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::facts::strs;
use agent_run_tests::remote::SshServer;
use agent_run_tests::{describe_output, exit_code, run_with_timeout, TestRoot};

// ---------------------------------------------------------------------------------------------
// version

#[test]
fn version_reports_the_features_and_this_hosts_cgroup() {
    let root = TestRoot::sharing_cpu();
    let v = json_of(&ar_code(&root, &["version", "--json"], 0));
    assert_eq!(v["version"], agent_run_shared::VERSION, "v[\"version\"]");
    assert_eq!(v["schema"], 1, "v[\"schema\"]");
    let features = strs(&v["features"]).expect("features is an array");
    for f in [
        "timeout",
        "cwd",
        "env",
        "labels",
        "many_ids",
        "wait_any",
        "on_disconnect",
        "suspend",
    ] {
        assert!(features.contains(&f), "{f} missing from {features:?}");
    }
    // The cgroup2 mount as /proc/self/mountinfo has it, read here independently.
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = mountinfo
        .lines()
        .find(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|r| r.starts_with("cgroup2 "))
        })
        .and_then(|l| l.split_whitespace().nth(4));
    assert_eq!(v["cgroup"]["mount"].as_str(), mount, "{v:#}");
    if mount.is_some() && agent_run_shared::sys::geteuid() == 0 {
        assert_eq!(v["cgroup"]["can_create_child"], true, "{v:#}");
    }
    let human = String::from_utf8_lossy(&ar_code(&root, &["version"], 0).stdout).into_owned();
    assert!(
        human.starts_with(&format!("agent-run {}", agent_run_shared::VERSION))
            && human.contains("features: "),
        "{human}"
    );
}

/// `agent-run remote --remote-bin BIN ARGS`, which must exit 72 (the host's agent-run is
/// unusable): its stderr.
fn remote_refused(srv: &SshServer, root: &TestRoot, bin: &str, args: &[&str]) -> String {
    let out = run_with_timeout(&mut remote_cmd(srv, root, bin, args), T * 2);
    assert_eq!(
        exit_code(&out.status),
        72,
        "{}",
        describe_output("remote", &out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn remote_says_when_the_hosts_agent_run_is_missing_or_too_old_and_starts_nothing() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::sharing_cpu();
    let host = srv.host();
    let stderr = remote_refused(
        &srv,
        &root,
        "/nonexistent/agent-run",
        &["--id", "m1", &host, "--", "true"],
    );
    assert!(
        stderr.contains(&format!("agent-run is not installed on {host}"))
            && stderr.contains("/nonexistent/agent-run")
            && stderr.contains("--remote-bin"),
        "{stderr}"
    );
    assert!(
        !root.run_dir("m1").exists(),
        "!root.run_dir(\"m1\").exists()"
    );

    // An agent-run without `version` (an older one): fine for a plain launch, refused for one
    // that needs a feature it lacks.
    let old = root.dir.path().join("old-agent-run");
    let calls = root.dir.path().join("calls");
    fs::write(
        &old,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\necho 'old: unknown' >&2\nexit 64\n",
            calls.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&old, fs::Permissions::from_mode(0o755)).unwrap();
    let stderr = remote_refused(
        &srv,
        &root,
        old.to_str().unwrap(),
        &["--id", "m2", "--timeout", "5s", &host, "--", "true"],
    );
    assert!(
        stderr.contains("too old for timeout") && stderr.contains("upgrade it"),
        "{stderr}"
    );
    let calls = fs::read_to_string(&calls).unwrap();
    assert!(
        calls.lines().count() == 1 && calls.ends_with(" version --json\n"),
        "only the probe may have run: {calls:?}"
    );
}
