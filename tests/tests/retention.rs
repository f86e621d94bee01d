//! `agent-run-watchdog --retain DUR`: final runs that ended more than DUR ago are removed on the
//! watchdog's passes (`--once` and the daemon's), with `gc`'s refusals, each removal a log line
//! naming the run; without `--retain`, nothing is removed.

use agent_run_tests::cli::{detached, text, Sweep};
use agent_run_tests::contain::cgroup2_mount;
use agent_run_tests::ctx::{ctx, CMD};
use agent_run_tests::facts::{epoch_now, rfc3339};
use agent_run_tests::hostile::Daemon;
use agent_run_tests::{describe_output, run_with_timeout, wait_until, TestRoot};
use std::process::{Child, Command, Output, Stdio};

/// A run `id` that finished (exit 0) and whose record says it ended `days` ago.
fn finished_days_ago(root: &TestRoot, id: &str, days: i64) {
    let c = ctx(root, id);
    c.finished(0);
    let when = rfc3339(epoch_now() as i64 - days * 86_400);
    c.edit_status(|st| {
        for key in ["created_at", "started_at", "ended_at"] {
            st.insert(key.into(), when.clone().into());
        }
    });
}

/// `agent-run-watchdog --once ARGS...`, which must exit 0.
fn once(root: &TestRoot, args: &[&str]) -> Output {
    let mut cmd = root.watchdog_cmd();
    cmd.arg("--once").args(args);
    let out = run_with_timeout(&mut cmd, CMD);
    let what = describe_output(
        &format!("agent-run-watchdog --once {}", args.join(" ")),
        &out,
    );
    assert!(out.status.success(), "{what}");
    out
}

/// The log line that says `id` was removed, if any.
fn removal_line(log: &str, id: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains(&format!(" {id}: removed: ")))
        .map(str::to_string)
}

#[test]
fn once_with_retain_removes_final_runs_older_than_it_keeps_younger_ones_and_without_it_nothing() {
    let root = TestRoot::new();
    finished_days_ago(&root, "old", 3);
    finished_days_ago(&root, "older", 30);
    ctx(&root, "young").finished(0);
    let exists = |id: &str| root.run_dir(id).exists();

    let out = once(&root, &["--orphan-grace", "1h"]);
    for id in ["old", "older", "young"] {
        assert!(
            exists(id),
            "without --retain, {id} was removed\n{}",
            text(&out.stderr)
        );
    }
    let out = once(&root, &["--orphan-grace", "1h", "--retain", "2d"]);
    let log = text(&out.stderr);
    for id in ["old", "older"] {
        assert!(
            !exists(id),
            "{id}, older than --retain 2d, is still there\n{log}"
        );
        let line = removal_line(&log, id);
        assert!(
            line.is_some(),
            "no log line names the removal of {id}:\n{log}"
        );
    }
    assert!(exists("young"), "young, ended now, was removed:\n{log}");
    assert!(removal_line(&log, "young").is_none(), "{log}");
}

#[test]
fn the_daemon_with_retain_removes_an_old_final_run_on_its_rescan_and_logs_it() {
    let root = TestRoot::new();
    finished_days_ago(&root, "old", 3);
    ctx(&root, "young").finished(0);
    let dog = Daemon::start(
        root.watchdog_cmd(),
        &["--scan-interval", "1s", "--retain", "1d"],
    );
    let old = root.run_dir("old");
    wait_until("the daemon to remove the old run", CMD, || {
        (!old.exists()).then_some(())
    });
    let line = wait_until("the daemon's log line for the removal", CMD, || {
        removal_line(&dog.stderr(), "old")
    });
    assert!(line.contains("--retain"), "{line}");
    assert!(root.run_dir("young").exists(), "{}", dog.stderr());
    let out = dog.stop();
    assert!(
        out.status.success(),
        "{}",
        describe_output("the daemon", &out)
    );
}

/// A process holding a flock on a dir; killed by pid when dropped.
struct LockHolder(Child);

impl LockHolder {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process holding a flock on `dir`, until dropped: a copy of the fixture named agent-run,
/// as a `cancel` or another watchdog holding the run would be (the watchdog's pass leaves such
/// a run to its holder, and the retention sweep after it meets the holder).
fn hold_lock(root: &TestRoot, dir: &std::path::Path) -> LockHolder {
    use std::io::{BufRead, Write};
    let copy = agent_run_tests::fixture_as_agent_run(&root.dir.path().join("bin"));
    let mut child = Command::new(&copy)
        .arg("hold-dir-locks")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the lock holder");
    let stdin = child.stdin.as_mut().expect("stdin");
    writeln!(stdin, "{}\n", dir.display()).expect("tell the holder");
    stdin.flush().expect("flush");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("the holder's answer");
    assert_eq!(line, "locked 1\n", "the lock holder");
    LockHolder(child)
}

#[test]
fn an_old_run_whose_lock_a_live_process_holds_or_whose_cgroup_holds_a_process_is_kept() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    finished_days_ago(&root, "locked", 3);
    let holder = hold_lock(&root, &root.run_dir("locked"));
    let holder_proc = format!("/proc/{}", holder.pid());

    // A live run whose record the workload rewrote to say it ended long ago: its cgroup holds
    // its processes (and its live wrapper its lock).
    let cgroup = cgroup2_mount().is_some();
    let run = detached(&root, "held", &[], &["--children", "1"]);
    let c = ctx(&root, "held");
    let when = rfc3339(epoch_now() as i64 - 3 * 86_400);
    c.edit_status(|st| {
        st.insert("state".into(), "finished".into());
        st.insert("exit_code".into(), 0.into());
        st.insert("ended_at".into(), when.into());
    });

    let out = once(&root, &["--orphan-grace", "1h", "--retain", "1d"]);
    let log = text(&out.stderr);
    assert!(
        root.run_dir("locked").exists(),
        "the locked run was removed:\n{log}"
    );
    assert!(removal_line(&log, "locked").is_none(), "{log}");
    assert!(
        std::path::Path::new(&holder_proc).exists(),
        "the lock holder is gone:\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains(" locked: kept ")),
        "no log line says why the locked run is kept:\n{log}"
    );
    assert!(
        root.run_dir("held").exists(),
        "the held run was removed:\n{log}"
    );
    c.all_alive(
        &run.tree,
        "the held run's processes after the retention pass",
    );
    c.all_alive(
        &run.wrapper_pin,
        "the held run's wrapper after the retention pass",
    );
    let why = match cgroup {
        true => " held: kept although it ended at ",
        false => " held: kept ",
    };
    let line = log.lines().find(|l| l.contains(why));
    assert!(
        line.is_some(),
        "no log line says why the held run is kept:\n{log}"
    );
    if cgroup {
        let line = line.unwrap_or_default();
        assert!(line.contains("cgroup holds processes"), "{line}");
    }

    // Once the lock is let go, the run goes on the next pass.
    drop(holder);
    let out = once(&root, &["--orphan-grace", "1h", "--retain", "1d"]);
    let log = text(&out.stderr);
    assert!(!root.run_dir("locked").exists(), "{log}");
    assert!(removal_line(&log, "locked").is_some(), "{log}");
    c.ctl(&["cancel", "held"], 0);
    c.wait_gone(&run.tree, "the held run's processes after cancel");
}
