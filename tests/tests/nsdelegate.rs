//! [honest-stop]: on a cgroup2 mount with `nsdelegate` (systemd mounts it so), root's workload
//! runs in a cgroup namespace rooted at its run's cgroup, and the kernel refuses any move of
//! its processes out of it.
//!
//! This host's mount has no `nsdelegate`: the test remounts it with the option for its own
//! time and puts it back. The option is the whole hierarchy's, so this test is alone in its
//! binary (cargo runs one test binary at a time), and restores the mount even when it fails.

use std::fs;
use std::process::Command;

use agent_run_tests::contain::cgroup2_mount;
use agent_run_tests::hostile_run::{files_of, said_pid, workload, Mode, Side, CMD};
use agent_run_tests::{ctx, ensure, Pinned, TestRoot};

/// The cgroup2 mount remounted with `nsdelegate` while this lives.
struct NsDelegate {
    mount: std::path::PathBuf,
    had: bool,
}

impl NsDelegate {
    fn on() -> Option<NsDelegate> {
        let mount = cgroup2_mount()?;
        let had = mountinfo_options(&mount).contains("nsdelegate");
        if !had {
            let ok = Command::new("mount")
                .args(["-o", "remount,nsdelegate"])
                .arg(&mount)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!(
                    "cannot remount {} with nsdelegate: not tested",
                    mount.display()
                );
                return None;
            }
        }
        Some(NsDelegate { mount, had })
    }
}

impl Drop for NsDelegate {
    fn drop(&mut self) {
        if !self.had {
            // A remount without the option takes it away (cgroup2 reads its flags anew);
            // mount(8) must not add back the options the mount has now.
            let _ = Command::new("mount")
                .args([
                    "-o",
                    "remount",
                    "--options-mode",
                    "ignore",
                    "--options-source",
                    "disable",
                ])
                .arg(&self.mount)
                .status();
        }
    }
}

/// The super options of the cgroup2 mount at `mount`, from /proc/self/mountinfo.
fn mountinfo_options(mount: &std::path::Path) -> String {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .find(|l| {
            l.contains(" - cgroup2 ")
                && l.split_whitespace().nth(4) == Some(&*mount.to_string_lossy())
        })
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|r| r.split_whitespace().nth(2))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn with_nsdelegate_roots_workload_cannot_move_a_process_out_of_its_run_cgroup() {
    let root = TestRoot::new();
    let Some(ns) = NsDelegate::on() else {
        return;
    };
    let side = Side::new(&root, Mode::RootCgroup, "nsd");
    let top = ns.mount.display().to_string();
    // The workload tries to move a child to the top of the hierarchy, and says how it went.
    let damage = format!(
        "sleep 600 & c=$!; say \"pid child $c\"; \
         if echo $c > '{top}/cgroup.procs' 2>/dev/null; then say moved; else say refused; fi; \
         say \"cgroup $(sed -n 's/^0:://p' /proc/self/cgroup)\""
    );
    let (go, said) = files_of(&side, "nsd");
    let run = side.start("nsd", &["--grace", "1s"], &workload(&go, &said, &damage));
    run.go_and_wait("done");
    let c = ctx(&root, "nsd");
    let said = run.said();
    ensure!(
        c,
        said.contains("refused"),
        "the move out was not refused: {said}"
    );
    ensure!(
        c,
        said.contains("cgroup /\n"),
        "the workload does not see its run's cgroup as its namespace's root: {said}"
    );
    let child = said_pid(&said, "child").expect("the child");
    let pin = Pinned::new(&[child]);
    run.wrapper_pin
        .signal(run.wrapper, libc::SIGKILL)
        .expect("kill the wrapper");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    let (code, _, err) = side.ctl(&["cancel", "nsd"]);
    c.eq(code, 0, format_args!("cancel: {err}"));
    c.wait_gone(&pin, "the child that could not leave");
    let st = root.wait_final("nsd", CMD);
    c.eq(
        (st["state"].as_str(), st["proof"].as_str()),
        (Some("cancelled"), Some("cgroup_empty")),
        format_args!("the record: {st}"),
    );
    drop(ns);
    ensure!(
        c,
        !mountinfo_options(&cgroup2_mount().expect("the mount")).contains("nsdelegate"),
        "the mount keeps nsdelegate after the test"
    );
}
