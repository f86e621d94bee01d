//! `remote` when things fail at once: a command that fails at once keeps its output, and a host
//! without agent-run is named with exit 72.
//!
//! Every test drives the real binaries and asserts on facts (the run root's contents, files a
//! command would have created, /proc, status.json), not on messages alone. Run ids start with `fc-`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::remote::{strip_messages, SshServer};
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, run_with_timeout, TestRoot,
};

/// `agent-run remote` against our own sshd on loopback, with the host's run root under `root`.
fn remote_cmd(srv: &SshServer, root: &TestRoot, xdg: &Path, bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(agent_run_bin());
    cmd.arg("remote")
        .args(srv.remote_args())
        .arg("--remote-bin")
        .arg(bin)
        .arg("--remote-root")
        .arg(root.root())
        .args(args)
        .env("XDG_RUNTIME_DIR", xdg)
        .env_remove("AGENT_RUN_ROOT")
        .stdin(Stdio::null());
    cmd
}

/// 20 runs of a workload that prints on both streams and exits 7 within a millisecond: every
/// byte arrives every time, and the exit code is 7; the host's records agree. Before: 4 of 5
/// runs printed nothing (the launch's `|| exit` skipped `attach` once the run was final).
#[test]
fn remote_never_loses_the_output_of_a_command_that_fails_at_once() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::swept();
    let xdg = tempfile::tempdir().unwrap();
    let script = "printf 'out 1\\nout 2\\n'; printf 'err 1\\n' >&2; exit 7";
    for i in 0..20 {
        let id = format!("fc-fast-{i}");
        let c = ctx(&root, &id);
        let mut cmd = remote_cmd(
            &srv,
            &root,
            xdg.path(),
            &agent_run_bin(),
            &["--id", &id, &srv.host(), "--", "sh", "-c", script],
        );
        let out = run_with_timeout(&mut cmd, T * 2);
        let what = format!("remote run {i}");
        c.eq(
            &exit_code(&out.status),
            &7,
            format_args!("{}", describe_output(&what, &out)),
        );
        c.eq(
            text(&out.stdout),
            "out 1\nout 2\n",
            format_args!("{}", describe_output(&what, &out)),
        );
        c.eq(
            text(&strip_messages(&out.stderr)),
            "err 1\n",
            format_args!("{}", describe_output(&what, &out)),
        );
        let st = root.status(&id);
        c.eq(
            &(st["state"].as_str(), st["exit_code"].as_i64()),
            &(Some("finished"), Some(7)),
            "(st[\"state\"].as_str(), st[\"exit_code\"].as_i64())",
        );
    }
    // A workload that is not found, and one that exits 127 itself, are the run's own 127.
    for (id, cmd) in [
        ("fc-r127-missing", vec!["/nonexistent/fc-command"]),
        ("fc-r127-own", vec!["sh", "-c", "echo before; exit 127"]),
    ] {
        let c = ctx(&root, id);
        let mut args = vec!["--id", id, "--lease", "30s"];
        let host = srv.host();
        args.push(&host);
        args.push("--");
        args.extend(cmd);
        let out = run_with_timeout(
            &mut remote_cmd(&srv, &root, xdg.path(), &agent_run_bin(), &args),
            T * 2,
        );
        c.eq(
            &exit_code(&out.status),
            &127,
            format_args!("{}", describe_output(id, &out)),
        );
        ensure!(
            c,
            !text(&out.stderr).contains("cannot run agent-run"),
            "{}",
            describe_output(id, &out)
        );
        let st = root.status(id);
        ensure!(
            c,
            matches!(st["state"].as_str(), Some("launch_failed" | "finished")),
            "{st}"
        );
    }
    assert_eq!(
        text(
            &run_with_timeout(
                &mut remote_cmd(
                    &srv,
                    &root,
                    xdg.path(),
                    &agent_run_bin(),
                    &[
                        "--id",
                        "fc-r127-own2",
                        &srv.host(),
                        "--",
                        "sh",
                        "-c",
                        "echo before; exit 127"
                    ]
                ),
                T * 2
            )
            .stdout
        ),
        "before\n", "text( &run_with_timeout( &mut remote_cmd( &srv, &root, xdg.path(), &agent_run_bin(), &[ \"--id\", \"fc-r127-own2\", &srv.host(), \"--\", \"sh\", \"-c\", \"echo before; exit 127\" ] ), T * 2 ) .stdout )"
    );
}

/// With agent-run missing on the host, `remote` says so itself, naming the program and the
/// host, and exits 72 (not the shell's 127, which reads like the workload's); `--status` and
/// `--cancel` too. Nothing is created on the host. Before: the remote shell's "No such file or
/// directory" and 127.
#[test]
fn remote_with_agent_run_missing_on_the_host_says_so_and_exits_72() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::swept();
    let xdg = tempfile::tempdir().unwrap();
    let missing = Path::new("/nonexistent/agent-run");
    let not_exec = root.dir.path().join("agent-run-not-executable");
    fs::write(&not_exec, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&not_exec, fs::Permissions::from_mode(0o644)).unwrap();
    let host = srv.host();
    for bin in [missing, not_exec.as_path()] {
        for args in [
            vec![host.as_str(), "--", "true"],
            vec![host.as_str(), "--status", "fc-x"],
            vec![host.as_str(), "--cancel", "fc-x"],
            vec![host.as_str(), "--attach", "fc-x"],
        ] {
            let mut cmd = remote_cmd(&srv, &root, xdg.path(), bin, &args);
            let out = run_with_timeout(&mut cmd, T * 2);
            let what = format!("remote --remote-bin {} {args:?}", bin.display());
            assert_eq!(
                exit_code(&out.status),
                72,
                "{}",
                describe_output(&what, &out)
            );
            let err = text(&out.stderr);
            let said = err
                .lines()
                .find(|l| {
                    l.starts_with("agent-run: ")
                        && (l.contains("cannot run agent-run on ")
                            || l.contains("is not installed on ")
                            || l.contains("cannot be executed"))
                })
                .unwrap_or_else(|| panic!("no message of ours: {}", describe_output(&what, &out)));
            assert!(
                said.contains(&host) && said.contains(&bin.display().to_string()),
                "{said}"
            );
            assert!(said.contains("--remote-bin"), "{said}");
            assert!(!root.root().exists(), "{what} created the run root");
        }
    }
}
