//! Fields of the record a user reads first: no lease left once final, a heartbeat every second,
//! a launch failure's codes, `lease_s` always a float, and a run from a deleted directory.
//!
//! Every test drives the real binaries and asserts on facts (the run root's contents, files a
//! command would have created, /proc, status.json), not on messages alone. Run ids start with `fc-`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, run_with_timeout, wait_until_dbg, Pinned, TestRoot,
};
use serde_json::Value;

/// `lease_s` is a float (a JSON number with a fraction) everywhere it is written, whatever unit
/// the lease was given in: lease.json, the journal's launch event, renew's output.
#[test]
fn lease_s_is_always_a_float() {
    let root = TestRoot::swept();
    for (i, lease) in ["90", "2m", "1500ms", "1.5s"].into_iter().enumerate() {
        let id = format!("fc-ls{i}");
        let c = ctx(&root, &id);
        ar_code(
            &root,
            &["-d", "--lease", lease, &id, "--", "sleep", "300"],
            0,
        );
        let raw = fs::read_to_string(root.run_dir(&id).join("lease.json")).unwrap();
        let v: Value = serde_json::from_str(&raw).unwrap();
        ensure!(
            c,
            v["lease_s"].is_f64(),
            "--lease {lease}: lease.json {raw}"
        );
        let launch = c.events("launch").into_iter().next();
        let launch = launch.unwrap_or_else(|| c.fail("no launch event"));
        ensure!(c, launch["lease_s"].is_f64(), "--lease {lease}: {launch}");
        let out = ar_code(&root, &["renew", "--json", &id, "--lease", lease], 0);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        ensure!(c, v["lease_s"].is_f64(), "renew --lease {lease}: {v}");
        ar_code(&root, &["cancel", &id], 0);
    }
}

/// A final run shows no lease left: `status` prints no lease line, `status --json` has
/// `lease_remaining_s: null` (its deadline stays, as history), `list --json` agrees. A live run
/// still shows its lease. Before: "lease: 595.2s left" for a finished run.
#[test]
fn a_final_run_has_no_lease_left_in_status() {
    let root = TestRoot::swept();
    let c = ctx(&root, "fc-done");
    ar_code(&root, &["--lease", "10m", "fc-done", "--", "true"], 0);
    let v: Value =
        serde_json::from_slice(&ar_code(&root, &["status", "--json", "fc-done"], 0).stdout)
            .unwrap();
    c.eq(&v["state"], "finished", "v[\"state\"]");
    ensure!(
        c,
        v["final"].as_bool().unwrap(),
        "v[\"final\"].as_bool().unwrap()"
    );
    c.eq(&v["lease_remaining_s"], &Value::Null, format_args!("{v}"));
    ensure!(c, v["lease_deadline_epoch"].is_f64(), "{v}");
    let human = text(&ar_code(&root, &["status", "fc-done"], 0).stdout);
    ensure!(c, !human.contains("lease:"), "{human}");
    let list: Value =
        serde_json::from_slice(&ar_code(&root, &["list", "--json"], 0).stdout).unwrap();
    c.eq(
        &list[0]["lease_remaining_s"],
        &Value::Null,
        format_args!("{list}"),
    );

    let c = ctx(&root, "fc-live");
    ar_code(
        &root,
        &["-d", "--lease", "10m", "fc-live", "--", "sleep", "300"],
        0,
    );
    let v: Value =
        serde_json::from_slice(&ar_code(&root, &["status", "--json", "fc-live"], 0).stdout)
            .unwrap();
    let left = v["lease_remaining_s"].as_f64().unwrap_or(-1.0);
    ensure!(c, (500.0..=600.0).contains(&left), "{v}");
    ensure!(
        c,
        text(&ar_code(&root, &["status", "fc-live"], 0).stdout).contains("lease:"),
        "text(&ar_code(&root, &[\"status\", \"fc-live\"], 0).stdout).contains(\"lease:\")"
    );
    ar_code(&root, &["cancel", "fc-live"], 0);
}

// =============================================================================================
// launch_failed records

/// A launch failure keeps `exit_code: null` (the leader never exited) and records the launch's
/// own code in `launch_exit_code`; `start`, `wait`, a relaunch and `status --json`'s
/// `outcome_exit_code` all give that code. Before: `exit_code` was 127/126.
#[test]
fn a_launch_failure_records_launch_exit_code_and_a_null_exit_code() {
    let root = TestRoot::swept();
    let not_exec = root.dir.path().join("not-executable");
    fs::write(&not_exec, "#!/bin/sh\ntrue\n").unwrap();
    fs::set_permissions(&not_exec, fs::Permissions::from_mode(0o644)).unwrap();
    let missing = root.dir.path().join("no-such-command");
    for (id, cmd, code) in [
        ("fc-127", missing.to_str().unwrap(), 127),
        ("fc-126", not_exec.to_str().unwrap(), 126),
    ] {
        ar_code(&root, &["--quiet", id, "--", cmd], code);
        let st = root.status(id);
        ctx(&root, id).eq(&st["state"], "launch_failed", "st[\"state\"]");
        ctx(&root, id).eq(&st["exit_code"], &Value::Null, "st[\"exit_code\"]");
        ctx(&root, id).eq(&st["launch_exit_code"], code, "st[\"launch_exit_code\"]");
        ctx(&root, id).eq(&st["pid"], &Value::Null, "st[\"pid\"]");
        ar_code(&root, &["wait", id], code);
        ar_code(&root, &["--quiet", id, "--", cmd], code);
        let v: Value =
            serde_json::from_slice(&ar_code(&root, &["status", "--json", id], 0).stdout).unwrap();
        ctx(&root, id).eq(&v["outcome_exit_code"], code, "v[\"outcome_exit_code\"]");
    }
    let c = ctx(&root, "fc-ok");
    // A run that finished has a null launch_exit_code.
    ar_code(&root, &["fc-ok", "--", "sh", "-c", "exit 3"], 3);
    let st = root.status("fc-ok");
    c.eq(
        &(st["exit_code"].clone(), st["launch_exit_code"].clone()),
        &(3.into(), Value::Null),
        "(st[\"exit_code\"].clone(), st[\"launch_exit_code\"].clone())",
    );
}

// =============================================================================================
// The working directory

/// A run started from a directory that was deleted records the kernel's name for it
/// (`/proc/self/cwd`: "PATH (deleted)"), a string, never "", warns about it, and the workload
/// runs there (its /proc/PID/cwd says the same). Before: `"cwd": ""`.
#[test]
fn a_run_from_a_deleted_directory_records_what_the_kernel_says() {
    let root = TestRoot::new();
    let c = ctx(&root, "fc-cwd");
    let _sweep = Sweep(&root);
    let gone = root.dir.path().join("gone");
    let script = format!(
        "mkdir '{g}' && cd '{g}' && rmdir '{g}' && exec '{bin}' --root '{r}' -d fc-cwd -- sleep 300",
        g = gone.display(),
        bin = agent_run_bin().display(),
        r = root.root().display()
    );
    let out = run_with_timeout(
        Command::new("sh")
            .args(["-c", &script])
            .env_remove("AGENT_RUN_ROOT")
            .stdin(Stdio::null()),
        T,
    );
    ensure!(
        c,
        out.status.success(),
        "{}",
        describe_output(&script, &out)
    );
    let st = root.status("fc-cwd");
    let want = format!("{} (deleted)", gone.display());
    c.eq(&st["cwd"], want.as_str(), "st[\"cwd\"]");
    let warnings = st["warnings"].to_string();
    ensure!(c, warnings.contains("working directory"), "{warnings}");
    let pid = st["pid"].as_i64().unwrap();
    let pin = Pinned::new(&[pid as i32]);
    let cwd = fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
    c.eq(&cwd.to_string_lossy(), &want, "the workload's own cwd");
    ar_code(&root, &["cancel", "fc-cwd"], 0);
    c.wait_gone(&pin, "the workload after cancel");
}

// =============================================================================================
// remote: fast failures and a host without agent-run

/// The wrapper's heartbeat, the lock's mtime, goes on beating about every second while a run
/// lasts, though its thread starts only some time after the launch (issue 17: a run that is
/// over by then, most short commands, makes no thread for it). A late start that never came
/// would leave the first beat alone, and a watchdog counting an orphan's grace from it.
#[test]
fn a_lasting_run_beats_every_second_after_the_late_start_of_its_heartbeat() {
    let root = TestRoot::swept();
    let id = "fc-beat";
    let c = ctx(&root, id);
    ar_code(&root, &["-d", id, "--", "sleep", "60"], 0);
    let lock = root.run_dir(id).join("lock");
    let mtime = || fs::metadata(&lock).and_then(|m| m.modified()).ok();
    let beat_after = |after: SystemTime| {
        wait_until_dbg("the next heartbeat (the lock's mtime)", T, || {
            match mtime() {
                Some(m) if m > after => Ok(m),
                seen => {
                    std::thread::sleep(Duration::from_millis(20));
                    Err(seen)
                }
            }
        })
    };
    let first = mtime().expect("the lock exists once -d returns");
    let second = beat_after(first);
    let third = beat_after(second);
    let gap = third.duration_since(second).unwrap_or_default();
    ensure!(
        c,
        gap >= Duration::from_millis(500) && gap <= Duration::from_secs(5),
        "two beats {gap:?} apart, not about a second"
    );
    ar_code(&root, &["cancel", id], 0);
    let st = root.wait_final(id, T);
    c.eq(&st["state"], "cancelled", "st[\"state\"]");
}
