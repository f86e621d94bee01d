//! A caller that disappears (a real `sshd`, an `ssh` client without a pty, SIGKILLed while the
//! workload is silent): the run is cancelled, left to its lease, or kept, as the options say.
//!
//! Every process a test starts is pinned with a pidfd after the fixture's ready line and
//! checked in /proc; every run is final (or cancelled) before the test ends.

use std::process::{Command, Stdio};
use std::time::Duration;

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::remote::SshServer;
use agent_run_tests::tmux::shell_path;
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, fixture_bin, wait_ready,
    wait_until_dbg, Pinned, Spawned, TestRoot,
};
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// A caller that disappears: ssh without a pty, SIGKILLed while the workload is silent

/// `ssh -T HOST 'agent-run --root R OPTS ID -- fixture tree --children 1'`, its output drained.
fn ssh_caller(srv: &SshServer, root: &TestRoot, id: &str, opts: &[&str]) -> Spawned {
    let mut line = format!(
        "{} --root {} start",
        shell_path(&agent_run_bin()),
        shell_path(&root.root())
    );
    for o in opts {
        line.push(' ');
        line.push_str(o);
    }
    line.push_str(&format!(
        " {id} -- {} tree --children 1",
        shell_path(&fixture_bin())
    ));
    let mut cmd = Command::new("ssh");
    cmd.args(srv.ssh_options())
        .args(["-T", "--", &srv.host(), &line])
        .stdin(Stdio::null());
    Spawned::spawn(&mut cmd)
}

/// Start a run through ssh, wait for its tree, SIGKILL the client, and wait until the wrapper
/// has seen the loss. Returns the tree's pins and the time the client died.
fn lose_the_caller(srv: &SshServer, root: &TestRoot, id: &str, opts: &[&str]) -> (Pinned, f64) {
    let c = ctx(root, id);
    let mut client = ssh_caller(srv, root, id, opts);
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), T);
    let tree = Pinned::new(&ready.all_pids());
    // The workload is silent from here on: only the channel's hang-up can tell.
    client.child.kill().unwrap();
    let killed = agent_run_shared::time::epoch_now();
    let out = client.finish(T);
    c.eq(
        &out.status.signal_number(),
        &Some(libc::SIGKILL),
        "out.status.signal_number()",
    );
    wait_until_dbg(&format!("caller_lost_at in run {id}'s record"), T, || {
        let st = root.try_status(id)?;
        if st["caller_lost_at"].is_string() {
            Ok(())
        } else {
            Err(st.to_string())
        }
    });
    (tree, killed)
}

trait SignalNumber {
    fn signal_number(&self) -> Option<i32>;
}

impl SignalNumber for std::process::ExitStatus {
    fn signal_number(&self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(self)
    }
}

fn assert_keeps_running(root: &TestRoot, id: &str, tree: &Pinned, policy: &str) {
    let c = ctx(root, id);
    let st = root.status(id);
    c.eq(
        &(st["state"].as_str(), st["on_disconnect"].as_str()),
        &(Some("running"), Some(policy)),
        format_args!("{st:#}"),
    );
    let lost = root
        .events(id)
        .into_iter()
        .find(|e| e["event"] == "caller_lost")
        .expect("journalled");
    c.eq(&lost["policy"], policy, "lost[\"policy\"]");
    c.eq(
        &tree.alive().len(),
        &tree.pids().len(),
        "the tree must live on",
    );
}

#[test]
fn a_lost_caller_cancels_a_run_without_a_lease_by_default() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "dflt");
    let (tree, killed) = lose_the_caller(&srv, &root, "dflt", &[]);
    let st = root.wait_final("dflt", T);
    c.wait_gone(&tree, "tree");
    c.eq(
        &(
            st["state"].as_str(),
            st["reason"].as_str(),
            st["on_disconnect"].as_str(),
        ),
        &(Some("cancelled"), Some("caller_lost"), Some("cancel")),
        format_args!("{st:#}"),
    );
    let noticed = epoch(&st, "caller_lost_at") - killed;
    eprintln!(
        "the wrapper noticed the lost caller {:.0} ms after the client died",
        noticed * 1000.0
    );
    ensure!(c, noticed < 10.0, "noticed after {noticed:.1}s");
    ar_code(&root, &["wait", "dflt"], 129);
    let said = ar_code(&root, &["status", "dflt"], 0);
    let human = String::from_utf8_lossy(&said.stdout).into_owned();
    ensure!(
        c,
        human.contains("129 (caller lost"),
        "status does not say what 129 means: {human}"
    );
}

#[test]
fn a_lost_caller_leaves_a_leased_run_to_its_lease_by_default_and_keep_keeps_it() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::sharing_cpu();
    let (leased, _) = lose_the_caller(&srv, &root, "leased", &["--lease", "60s"]);
    let (kept, _) = lose_the_caller(&srv, &root, "kept", &["--on-disconnect", "keep"]);
    assert_keeps_running(&root, "leased", &leased, "keep");
    assert_keeps_running(&root, "kept", &kept, "keep");
    // Still its controller's to stop.
    ar_code(&root, &["cancel", "leased", "kept"], 0);
    ctx(&root, "leased").wait_gone(&leased, "the leased run after cancel");
    ctx(&root, "kept").wait_gone(&kept, "the kept run after cancel");
}

#[test]
fn a_lost_caller_with_a_grace_is_stopped_after_it_unless_someone_attaches_or_renews() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "grace");
    // Nobody comes back: stopped once the grace is over.
    let (gone, _) = lose_the_caller(&srv, &root, "grace", &["--on-disconnect", "2s"]);
    assert_keeps_running(&root, "grace", &gone, "2s");
    let st = root.wait_final("grace", T);
    c.wait_gone(&gone, "gone");
    c.eq(&st["reason"], "caller_lost", format_args!("{st:#}"));
    let waited = epoch(&st, "ended_at") - epoch(&st, "caller_lost_at");
    ensure!(
        c,
        waited >= 2.0,
        "stopped {waited:.3}s after the loss: before the grace was over"
    );

    // An attach within the grace keeps it.
    let (attached, _) = lose_the_caller(&srv, &root, "attached", &["--on-disconnect", "3s"]);
    let attach = Spawned::wrapper(&root, &["attach", "attached"]);
    wait_reclaimed(&root, "attached");
    // A renew does too (a lease given now).
    let (renewed, _) = lose_the_caller(&srv, &root, "renewed", &["--on-disconnect", "3s"]);
    ar_code(&root, &["renew", "renewed", "--lease", "60s"], 0);
    wait_reclaimed(&root, "renewed");
    // Past both graces, both runs still run.
    let until = epoch(&root.status("renewed"), "caller_lost_at") + 4.0;
    while agent_run_shared::time::epoch_now() < until {
        std::thread::sleep(Duration::from_millis(50));
        ctx(&root, "attached").record("the record", json!({"state": "running"}));
        ctx(&root, "renewed").record("the record", json!({"state": "running"}));
    }
    c.eq(
        &attached.alive().len(),
        &attached.pids().len(),
        "attached.alive().len()",
    );
    c.eq(
        &renewed.alive().len(),
        &renewed.pids().len(),
        "renewed.alive().len()",
    );
    ar_code(&root, &["cancel", "attached", "renewed"], 0);
    c.wait_gone(&attached, "attached");
    c.wait_gone(&renewed, "renewed");
    let out = attach.finish(T);
    c.eq(
        &exit_code(&out.status),
        &143,
        format_args!("{}", describe_output("attach", &out)),
    );
}

/// Waits until the journal of run `id` says `caller_reclaimed`.
fn wait_reclaimed(root: &TestRoot, id: &str) {
    wait_until_dbg("caller_reclaimed", T, || {
        let names = root.event_names(id);
        if names.iter().any(|n| n == "caller_reclaimed") {
            Ok(())
        } else {
            Err(names)
        }
    });
}
