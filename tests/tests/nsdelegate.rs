//! [honest-stop]: on a cgroup2 mount with `nsdelegate` (systemd mounts it so), root's workload
//! runs in a cgroup namespace rooted at its run's cgroup, and the kernel refuses any move of
//! its processes out of it.
//!
//! This host's mount has no `nsdelegate`: each test remounts it with the option for its own
//! time and puts it back. The option is the whole hierarchy's, so these tests are alone in
//! their binary (cargo runs one test binary at a time), take turns (`ONE_AT_A_TIME`), and
//! restore the mount even when they fail. The second boots a real systemd ([systemd]), whose
//! cgroup2 mount has `nsdelegate` when the host's has it (the kernel takes the flag only from
//! the initial cgroup namespace).

use std::fs;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use agent_run_tests::contain::cgroup2_mount;
use agent_run_tests::hostile_run::{files_of, said_pid, workload, Mode, Side, CMD};
use agent_run_tests::systemd::{Boot, Systemd};
use agent_run_tests::{ctx, ensure, poll_until, Pinned, TestRoot, FINAL_STATES};

/// The mount's flags are the whole host's: one test at a time holds them.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

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
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

/// The workload of the systemd test: a child that tries to leave for the mount's top, and what
/// it saw, in /tmp/nsd-said.
const NSD_WORKLOAD: &str = "sleep infinity & c=$!
{ echo \"child $c\"
  if echo $c > /sys/fs/cgroup/cgroup.procs 2>/dev/null; then echo moved; else echo refused; fi
  echo \"cgroup $(sed -n 's/^0:://p' /proc/self/cgroup)\"
} > /tmp/nsd-said.new && mv /tmp/nsd-said.new /tmp/nsd-said
exec sleep infinity
";

#[test]
fn under_a_real_systemd_with_nsdelegate_a_root_run_cannot_leave_its_cgroup_and_cancel_leaves_nothing(
) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(ns) = NsDelegate::on() else {
        return;
    };
    let sd: Systemd = Boot::new()
        .file("/usr/local/lib/nsd-workload", NSD_WORKLOAD)
        .start();
    let why = |sd: &Systemd| format!("{}\n{}", sd.run_diagnostics(DIR), sd.diagnostics());
    const DIR: &str = "/root/.agent-runs/nsd";
    let inside = sd.sh("grep ' - cgroup2 ' /proc/self/mountinfo");
    assert!(
        inside.contains("nsdelegate"),
        "the boot's cgroup2 mount has no nsdelegate: {inside}"
    );
    // Root's run from a service with a delegated cgroup, as a root agent's would be.
    let script = "agent-run -d nsd --grace 1s -- sh /usr/local/lib/nsd-workload >/dev/null \
                  && exec sleep infinity";
    sd.ok(sd
        .root("systemd-run")
        .args([
            "--unit=holder",
            "-p",
            "Delegate=yes",
            "--setenv=HOME=/root",
            "--",
        ])
        .args(["sh", "-c", script]));
    let st = sd.wait_state(DIR, Duration::from_secs(60), |s| s == "running");
    assert_eq!(st["containment"]["mode"], "cgroup", "{}", why(&sd));
    let said = poll_until(Duration::from_secs(60), || {
        fs::read_to_string(sd.path("/tmp/nsd-said")).map_err(|e| e.to_string())
    })
    .unwrap_or_else(|(_, e)| panic!("the workload said nothing: {e}\n{}", why(&sd)));
    assert!(said.contains("refused\n"), "the move out: {said}");
    assert!(
        said.contains("cgroup /\n"),
        "the workload does not see its run's cgroup as its namespace's root: {said}"
    );
    let members: Vec<i32> = fs::read_to_string(
        sd.host_cgroup(st["containment"]["cgroup"].as_str().unwrap_or_default())
            .join("cgroup.procs"),
    )
    .unwrap_or_default()
    .lines()
    .filter_map(|l| l.parse().ok())
    .collect();
    assert_eq!(members.len(), 2, "the workload and its child: {members:?}");
    let pinned = Pinned::new(&members);
    sd.ok(sd.root("agent-run").args(["cancel", "nsd"]));
    let st = sd.wait_state(DIR, Duration::from_secs(60), |s| FINAL_STATES.contains(&s));
    assert_eq!(
        (st["state"].as_str(), st["proof"].as_str()),
        (Some("cancelled"), Some("cgroup_empty")),
        "{}",
        why(&sd)
    );
    assert!(
        pinned.wait_all_gone(Duration::from_secs(10)).is_ok(),
        "left: {:?}",
        pinned.alive()
    );
    drop(sd);
    drop(ns);
}
