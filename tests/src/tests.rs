//! Unit tests of the harness itself.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::run_cgroups::remove_run_cgroups;
use crate::*;

/// The cgroup2 mount, when this test may make cgroups in it (else it says so: skipped).
fn writable_cgroup2() -> Option<PathBuf> {
    let mount = contain::cgroup2_mount().filter(|m| agent_run_shared::sys::writable(m));
    if mount.is_none() {
        eprintln!("no writable cgroup2 mount on this host: nothing to check");
    }
    mount
}

/// A run dir `dir` for `id` (its record names the id), the cgroup agent-run would name for
/// it, and a fixture sleeping 60 s moved into that cgroup.
fn sleeper_in_run_cgroup(mount: &Path, dir: &Path, id: &str) -> (PathBuf, Child) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("status.json"), format!(r#"{{"run_id": "{id}"}}"#)).unwrap();
    let ino = fs::metadata(dir).unwrap().ino();
    let cg = mount.join(format!("agent-run.{id}.{ino:x}"));
    fs::create_dir(&cg).unwrap();
    let child = Command::new(fixture_bin())
        .args(["sleep-ms", "60000"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    fs::write(cg.join("cgroup.procs"), child.id().to_string()).unwrap();
    (cg, child)
}

#[test]
fn waiting_for_pids_gone_before_the_pin_returns_at_once() {
    let mut child = Command::new(fixture_bin())
        .args(["sleep-ms", "0"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    // Reaped: nothing to pin (its pid could be anyone's by now, never ours to wait on).
    let pin = Pinned::new(&[pid]);
    let took = pin.wait_all_gone(Duration::from_secs(60)).unwrap();
    assert!(took < Duration::from_secs(5), "waited {took:?} for nothing");
}

#[test]
fn the_cgroup_of_a_run_below_a_test_root_is_removed_once_empty_and_reported_while_not() {
    let Some(mount) = writable_cgroup2() else {
        return;
    };
    let root = TestRoot::new();
    // A run dir moved out of the run root, as a test that swaps a run dir leaves it: found
    // by the run_id of its record.
    let (cg, mut child) = sleeper_in_run_cgroup(&mount, &root.dir.path().join("moved"), "cg-left");
    let pin = Pinned::new(&[child.id() as i32]);

    let left = remove_run_cgroups(root.dir.path(), Duration::from_millis(200));
    let _ = pin.signal(child.id() as i32, libc::SIGKILL);
    let _ = child.wait();
    assert_eq!(left.len(), 1, "a populated cgroup is reported: {left:?}");
    assert!(left[0].contains(&child.id().to_string()), "{left:?}");
    assert!(cg.exists(), "a populated cgroup is left alone");

    let left = remove_run_cgroups(root.dir.path(), Duration::from_secs(10));
    assert_eq!(left, Vec::<String>::new(), "an empty cgroup is removed");
    assert!(!cg.exists(), "{} is still there", cg.display());
}

#[test]
fn a_failing_test_kills_what_is_left_in_its_runs_cgroups() {
    use std::os::unix::process::ExitStatusExt;
    let Some(mount) = writable_cgroup2() else {
        return;
    };
    let root = TestRoot::new();
    let (cg, mut child) = sleeper_in_run_cgroup(&mount, &root.root().join("cg-fail"), "cg-fail");
    let pid = child.id() as i32;
    let ticks = proc_stat(pid).expect("the sleeper's stat").4;
    // The root drops while the test fails: the sleeper dies with it, by its cgroup.
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _root = root;
        // An unwind as a failing assertion's, without the panic message.
        std::panic::resume_unwind(Box::new("a failing test"));
    }));
    assert!(failed.is_err());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(!alive_as(pid, ticks));
    assert!(!cg.exists(), "{} is still there", cg.display());
}

#[test]
fn parse_ready_reads_every_field() {
    let ready = parse_ready("ready pid=10 pgid=10 sid=9 members=11,12,13\n").unwrap();
    assert_eq!(
        ready,
        Ready {
            pid: 10,
            pgid: 10,
            sid: 9,
            members: vec![11, 12, 13]
        }
    );
    assert_eq!(ready.all_pids(), vec![10, 11, 12, 13]);
}

#[test]
fn parse_ready_accepts_no_members() {
    let ready = parse_ready("ready pid=10 pgid=10 sid=10 members=").unwrap();
    assert!(ready.members.is_empty());
}

#[test]
fn parse_ready_refuses_other_lines() {
    assert_eq!(parse_ready("hello"), None);
    assert_eq!(parse_ready("ready pid=10 pgid=10 sid=10"), None);
    assert_eq!(parse_ready("ready pid=x pgid=10 sid=10 members="), None);
    assert_eq!(
        parse_ready("ready pid=10 pgid=10 sid=10 members=1,,x"),
        None
    );
}

#[test]
fn proc_stat_of_self_matches_the_kernel() {
    let me = std::process::id() as i32;
    let (state, ppid, pgid, sid, start) = proc_stat(me).unwrap();
    // The main thread (whose state /proc/PID/stat shows) waits for this test's thread.
    assert!(matches!(state, 'R' | 'S'), "state {state}");
    assert_eq!(ppid, std::os::unix::process::parent_id() as i32);
    // SAFETY: getpgrp(2) and getsid(2) have no preconditions.
    let (kernel_pgid, kernel_sid) = unsafe { (libc::getpgrp(), libc::getsid(0)) };
    assert_eq!((pgid, sid), (kernel_pgid, kernel_sid));
    assert!(start > 0);
}

#[test]
fn proc_stat_of_a_missing_pid_is_none() {
    assert_eq!(proc_stat(i32::MAX), None);
}

#[test]
fn session_members_include_self() {
    let me = std::process::id() as i32;
    let sid = proc_stat(me).unwrap().3;
    assert!(session_members(sid).contains(&me));
}

#[test]
fn pinned_sees_a_child_exit() {
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = child.id() as i32;
    let pinned = Pinned::new(&[pid]);
    assert_eq!(pinned.alive(), vec![pid]);
    assert!(pinned.wait_all_gone(Duration::from_millis(20)).is_err());
    pinned.signal(pid, libc::SIGTERM).unwrap();
    // Not yet reaped: a zombie counts as gone.
    pinned.wait_all_gone(Duration::from_secs(10)).unwrap();
    assert!(pinned.alive().is_empty());
    assert_eq!(
        exit_code(&wait_child(&mut child, Duration::from_secs(10))),
        143
    );
}

#[test]
fn wait_until_returns_the_probed_value() {
    let mut n = 0;
    let got = wait_until("n to reach 3", Duration::from_secs(5), || {
        n += 1;
        (n >= 3).then_some(n)
    });
    assert_eq!(got, 3);
}

#[test]
#[should_panic(expected = "last seen: 7")]
fn wait_until_dbg_reports_the_last_thing_seen() {
    wait_until_dbg("never", Duration::from_millis(20), || Err::<(), _>(7));
}
