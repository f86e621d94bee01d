//! [spawn]: how the workload is made. With a cgroup it is created in it (clone3 with
//! CLONE_INTO_CGROUP) and runs not one instruction outside; a kernel without that (before 5.7,
//! or a seccomp profile that refuses clone3) gets fork and a child that writes `0` to
//! `cgroup.procs` before its exec (`AGENT_RUN_FAULT=spawn_by_fork` forces that path on any
//! kernel). On both paths: exec failures are `launch_failed` with 127 or 126 as execvp(3) would
//! find them, a cgroup that refuses the workload is 70, --cwd and -e reach the workload, and no
//! descriptor above stderr does.
//!
//! "Made in its cgroup" is the kernel's account: the workload's own /proc/self/cgroup, the
//! journal's `cgroup_entry`, and, under strace, the clone3 call that made the workload (with
//! CLONE_INTO_CGROUP) and the absence of any write to `cgroup.procs` by it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agent_run_tests::contain::cgroup2_mount;
use agent_run_tests::facts::dir_with_mode;
use agent_run_tests::hostile::{as_nobody, outcome, NOBODY};
use agent_run_tests::{agent_run_bin, diagnostics, proc_stat, wait_run, Pinned, Spawned, TestRoot};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

/// The two ways the workload is made: (name in the journal, the fault knob that forces it).
const PATHS: [(&str, Option<&str>); 2] = [("clone3", None), ("write", Some("spawn_by_fork"))];

/// `agent-run --root R ARGS...`, with the knob set when given.
fn ar(root: &TestRoot, knob: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = root.cmd();
    cmd.env_remove("AGENT_RUN_FAULT").args(args);
    if let Some(k) = knob {
        cmd.env("AGENT_RUN_FAULT", k);
    }
    cmd
}

/// The run's `spawn` journal event (Null when it has none).
fn spawn_event(root: &TestRoot, id: &str) -> Value {
    root.events(id)
        .into_iter()
        .find(|e| e["event"] == "spawn")
        .unwrap_or(Value::Null)
}

/// The recorded cgroup of a run, as /proc/PID/cgroup's `0::` line names it.
fn cgroup_line(st: &Value) -> String {
    let mount = cgroup2_mount().expect("a cgroup2 mount");
    let cg = st["containment"]["cgroup"].as_str().unwrap_or_default();
    let rel = Path::new(cg).strip_prefix(&mount).unwrap_or(Path::new(cg));
    format!("0::/{}", rel.display())
}

fn stdout_log(root: &TestRoot, id: &str) -> String {
    fs::read_to_string(root.run_dir(id).join("stdout.log")).unwrap_or_default()
}

/// Skip (saying so) when the host has no cgroup2 mount.
fn no_cgroup2() -> bool {
    if cgroup2_mount().is_none() {
        eprintln!("no cgroup2 mount on this host: skipped");
        return true;
    }
    false
}

/// `cmd` runs under a seccomp filter that fails clone3(2) with `errno` and allows every other
/// call: what a kernel before 5.3 (ENOSYS), one before 5.7 (E2BIG or EINVAL for the cgroup
/// field and flag) or a container runtime's profile (EPERM, ENOSYS) answers.
fn refuse_clone3(cmd: &mut Command, errno: i32) {
    // BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K (linux/filter.h); offset 0 of
    // struct seccomp_data is the syscall number, the same for clone3 on every architecture.
    let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let filter = [
        f(0x20, 0, 0, 0),
        f(0x15, 0, 1, libc::SYS_clone3 as u32),
        f(0x06, 0, 0, libc::SECCOMP_RET_ERRNO | errno as u32),
        f(0x06, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: the closure runs in the forked child before exec and calls prctl(2) only, on a
    // filter built before the fork (the closure owns the array); nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A launch that failed with `code` before the command ran: `launch_failed`, no leader, the
/// code recorded, the run's cgroup gone; returns the recorded error.
fn assert_launch_failed(
    root: &TestRoot,
    id: &str,
    code: i32,
    got: (i32, String, String),
) -> String {
    let diag = || format!("{}\nstderr: {}", diagnostics(root, id), got.2);
    assert_eq!(got.0, code, "exit code\n{}", diag());
    let st = root.status(id);
    assert_eq!(st["state"], "launch_failed", "{}", diag());
    assert_eq!(st["launch_exit_code"], code, "{}", diag());
    assert!(
        st["pid"].is_null() && st["exit_code"].is_null(),
        "{}",
        diag()
    );
    if let Some(cg) = st["containment"]["cgroup"].as_str() {
        assert!(!Path::new(cg).exists(), "cgroup {cg} left\n{}", diag());
    }
    st["error"].as_str().unwrap_or_default().to_string()
}

/// The lines of `strace -f` output that process `pid` made.
fn straced_by(trace: &str, pid: i64) -> Vec<&str> {
    let tag = format!("{pid} ");
    trace.lines().filter(|l| l.starts_with(&tag)).collect()
}

/// The whole clone call of `strace -f` output that returned `pid`: one line, or (a vfork-style
/// clone suspends its caller) the `<unfinished ...>` line with its flags and the `resumed` one.
fn clone_that_made(trace: &str, pid: i64) -> String {
    let lines: Vec<&str> = trace.lines().collect();
    let end = format!("= {pid}");
    let at = lines
        .iter()
        .position(|l| l.contains("clone") && l.trim_end().ends_with(&end))
        .unwrap_or_else(|| panic!("no clone returned {pid}:\n{trace}"));
    let done = lines[at];
    if !done.contains("resumed>") {
        return done.to_string();
    }
    let caller = done.split_whitespace().next().unwrap_or_default();
    let started = lines[..at]
        .iter()
        .rev()
        .find(|l| {
            l.split_whitespace().next() == Some(caller)
                && l.contains("clone")
                && l.contains("<unfinished")
        })
        .unwrap_or_else(|| panic!("no start of the clone of {pid}:\n{trace}"));
    format!("{started} {done}")
}

#[test]
fn the_workload_is_made_in_its_cgroup_and_runs_no_instruction_outside_it() {
    if no_cgroup2() {
        return;
    }
    let strace = Path::new("/usr/bin/strace");
    assert!(
        strace.exists(),
        "strace is missing: bash .ci/test installs it"
    );
    let root = TestRoot::new();
    for (entry, knob) in PATHS {
        // Its first act: read its own cgroup.
        let id = format!("cg-{entry}");
        let trace = root.dir.path().join(format!("strace-{entry}"));
        let mut cmd = Command::new(strace);
        cmd.args(["-f", "-qq", "-e", "trace=clone,clone3,fork,vfork,write"])
            .args(["-e", "signal=none", "-o"])
            .arg(&trace)
            .arg(agent_run_bin())
            .arg("--root")
            .arg(root.root())
            .args(["--quiet", &id, "--", "cat", "/proc/self/cgroup"])
            .env_remove("AGENT_RUN_ROOT")
            .env_remove("AGENT_RUN_FAULT")
            .stdin(std::process::Stdio::null());
        if let Some(k) = knob {
            cmd.env("AGENT_RUN_FAULT", k);
        }
        let (code, _, err) = outcome(&mut cmd);
        let diag = || format!("{}\nstderr: {err}", diagnostics(&root, &id));
        assert_eq!(code, 0, "{}", diag());
        let st = root.status(&id);
        assert_eq!(st["containment"]["mode"], "cgroup", "{}", diag());
        let want = cgroup_line(&st);
        let out = stdout_log(&root, &id);
        assert!(
            out.lines().any(|l| l == want),
            "{entry}: the workload saw itself in\n{out}\nnot {want}\n{}",
            diag()
        );
        let ev = spawn_event(&root, &id);
        assert_eq!(ev["cgroup_entry"], entry, "{}", diag());
        // The kernel's account of how the workload was made.
        let trace = fs::read_to_string(&trace).unwrap();
        let pid = st["pid"].as_i64().expect("the record names the leader");
        let made_by = clone_that_made(&trace, pid);
        let procs_writes: Vec<&str> = straced_by(&trace, pid)
            .into_iter()
            .filter(|l| l.contains("write(") && l.contains(", \"0\", 1)"))
            .collect();
        match entry {
            "clone3" => {
                assert!(
                    made_by.contains("clone3(") && made_by.contains("CLONE_INTO_CGROUP"),
                    "made by {made_by}"
                );
                // A fork that the wrapper waits out until the exec (CLONE_VFORK), on a copy of
                // its memory (no CLONE_VM: no stack of its own, no assembly).
                assert!(
                    !made_by.contains("CLONE_VM") && made_by.contains("CLONE_VFORK"),
                    "made by {made_by}"
                );
                assert!(
                    procs_writes.is_empty(),
                    "the workload moved itself: {procs_writes:?}"
                );
            }
            _ => {
                assert!(!made_by.contains("CLONE_INTO_CGROUP"), "made by {made_by}");
                assert_eq!(procs_writes.len(), 1, "{made_by}\n{trace}");
            }
        }
    }
}

#[test]
fn refusals_of_clone3_by_old_kernels_fall_back_to_fork_and_a_cgroup_procs_write() {
    if no_cgroup2() {
        return;
    }
    let root = TestRoot::new();
    // What kernels without clone3 or CLONE_INTO_CGROUP, and seccomp profiles, answer.
    for (name, errno) in [
        ("enosys", libc::ENOSYS),
        ("e2big", libc::E2BIG),
        ("einval", libc::EINVAL),
        ("eperm", libc::EPERM),
    ] {
        let id = format!("old-{name}");
        let mut cmd = ar(
            &root,
            None,
            &["--quiet", &id, "--", "cat", "/proc/self/cgroup"],
        );
        refuse_clone3(&mut cmd, errno);
        let (code, _, err) = outcome(&mut cmd);
        assert_eq!(code, 0, "{name}: {err}\n{}", diagnostics(&root, &id));
        let st = root.status(&id);
        let out = stdout_log(&root, &id);
        assert!(out.lines().any(|l| l == cgroup_line(&st)), "{name}: {out}");
        assert_eq!(spawn_event(&root, &id)["cgroup_entry"], "write", "{name}");
    }
    // Without a cgroup the same refusal means plain fork.
    let mut cmd = ar(
        &root,
        None,
        &["--quiet", "--cgroup", "off", "nocg", "--", "true"],
    );
    refuse_clone3(&mut cmd, libc::ENOSYS);
    let (code, _, err) = outcome(&mut cmd);
    assert_eq!(code, 0, "{err}\n{}", diagnostics(&root, "nocg"));
    assert!(spawn_event(&root, "nocg")["cgroup_entry"].is_null());
    // Any other refusal of a spawn into the cgroup is the cgroup's: 70, the command never ran.
    let marker = root.dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let mut cmd = ar(&root, None, &["--quiet", "busy", "--", "sh", "-c", &touch]);
    refuse_clone3(&mut cmd, libc::EBUSY);
    let error = assert_launch_failed(&root, "busy", 70, outcome(&mut cmd));
    assert!(
        error.starts_with("cannot move the workload into its cgroup /")
            && error.ends_with("Device or resource busy (os error 16)"),
        "{error}"
    );
    assert!(!marker.exists(), "the command ran");
    // A process that cannot be made at all (no cgroup): 70, as a failed fork always was.
    let mut cmd = ar(
        &root,
        None,
        &["--quiet", "--cgroup", "off", "again", "--", "true"],
    );
    refuse_clone3(&mut cmd, libc::EAGAIN);
    let error = assert_launch_failed(&root, "again", 70, outcome(&mut cmd));
    assert!(error.starts_with("cannot execute: true: "), "{error}");
}

#[test]
fn a_cgroup_that_refuses_the_workload_fails_the_launch_with_70_on_both_paths() {
    if no_cgroup2() {
        return;
    }
    // A threaded parent: the run's cgroup made in it is "domain invalid", and no process may
    // enter it (EOPNOTSUPP), neither by clone3 nor by a write to cgroup.procs.
    let mount = cgroup2_mount().unwrap();
    let domain = mount.join(format!("agent-run-test.threaded.{}", std::process::id()));
    fs::create_dir(&domain).unwrap();
    let _cleanup = RemoveCgroups(domain.clone());
    let parent = domain.join("threads");
    fs::create_dir(&parent).unwrap();
    fs::write(parent.join("cgroup.type"), "threaded").unwrap();
    let p = parent.display().to_string();
    let root = TestRoot::new();
    for (entry, knob) in PATHS {
        let id = format!("refused-{entry}");
        let marker = root.dir.path().join(format!("ran-{entry}"));
        let touch = format!("touch {}", marker.display());
        let mut cmd = ar(
            &root,
            knob,
            &["--quiet", "--cgroup", &p, &id, "--", "sh", "-c", &touch],
        );
        let error = assert_launch_failed(&root, &id, 70, outcome(&mut cmd));
        assert!(
            error.starts_with(&format!("cannot move the workload into its cgroup {p}/"))
                && error.ends_with("(os error 95)"),
            "{entry}: {error}"
        );
        assert!(!marker.exists(), "{entry}: the command ran");
    }
    let left: Vec<PathBuf> = fs::read_dir(&parent)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// Removes a test's cgroup tree (deepest first) when dropped.
struct RemoveCgroups(PathBuf);

impl Drop for RemoveCgroups {
    fn drop(&mut self) {
        let wait = std::time::Duration::from_secs(10);
        if let Err(why) = agent_run_tests::contain::remove_cgroup_tree(&self.0, wait) {
            eprintln!("left behind: {why}");
        }
    }
}

#[test]
fn exec_failures_and_the_path_search_are_execvps_on_both_paths() {
    let root = TestRoot::new();
    let dir = root.dir.path().join("bin");
    fs::create_dir(&dir).unwrap();
    let write = |name: &str, body: &str, mode: u32| {
        let p = dir.join(name);
        fs::write(&p, body).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    };
    let marker = root.dir.path().join("ran");
    let not_exec = write(
        "not-exec",
        &format!("#!/bin/sh\ntouch {}\n", marker.display()),
        0o644,
    );
    write("found-here", "#!/bin/sh\necho found \"$@\"\n", 0o755);
    write("no-shebang", "echo via sh \"$@\"\n", 0o755);
    let path = format!("/nonexistent:{}:/usr/bin:/bin", dir.display());
    let path_env = format!("PATH={path}");
    let d = dir.display().to_string();
    for (entry, knob) in PATHS {
        let failures: [(&str, Vec<&str>, i32); 4] = [
            ("not-on-path", vec!["agent-run-test-no-such-command"], 127),
            ("no-such-path", vec!["/nonexistent/cmd"], 127),
            ("not-executable", vec![not_exec.as_str()], 126),
            ("a-directory", vec!["/tmp"], 126),
        ];
        for (what, argv, code) in failures {
            let id = format!("{what}-{entry}");
            let mut args = vec!["--quiet", id.as_str(), "--"];
            args.extend(argv);
            let error =
                assert_launch_failed(&root, &id, code, outcome(&mut ar(&root, knob, &args)));
            let want = if code == 127 {
                "command not found: "
            } else {
                "cannot execute: "
            };
            assert!(error.starts_with(want), "{id}: {error}");
        }
        assert!(!marker.exists(), "the non-executable file ran");
        // Found in the PATH of the workload's own environment (-e), run from --cwd (a relative
        // name: the chdir comes first), and a file without #! run by sh, as execvp does.
        let found: [(&str, Vec<&str>, &str); 3] = [
            (
                "by-path",
                vec!["-e", &path_env, "ID", "--", "found-here", "a"],
                "found a",
            ),
            (
                "relative",
                vec!["--cwd", &d, "ID", "--", "./found-here", "b"],
                "found b",
            ),
            (
                "sh",
                vec!["-e", &path_env, "ID", "--", "no-shebang", "c"],
                "via sh c",
            ),
        ];
        for (what, args, want) in found {
            let id = format!("{what}-{entry}");
            let args: Vec<&str> = args
                .into_iter()
                .map(|a| if a == "ID" { id.as_str() } else { a })
                .collect();
            let (code, out, err) = outcome(&mut ar(&root, knob, &args));
            assert_eq!(code, 0, "{id}: {err}\n{}", diagnostics(&root, &id));
            assert_eq!(out, format!("{want}\n"), "{id}");
            assert_eq!(root.status(&id)["state"], "finished", "{id}");
        }
    }
}

#[test]
fn a_cwd_that_cannot_be_entered_is_a_launch_failure_70_not_a_command_that_cannot_execute() {
    // As nobody, a root-only directory passes the start's check (it is a directory) but the
    // child's chdir is refused (EACCES): the command was never looked at, so not 126.
    let root = TestRoot::new();
    fs::set_permissions(root.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(root.root()).unwrap();
    std::os::unix::fs::chown(root.root(), Some(NOBODY), Some(NOBODY)).unwrap();
    let locked = root.dir.path().join("root-only");
    dir_with_mode(&locked, 0o700);
    let l = locked.display().to_string();
    for (entry, knob) in PATHS {
        let id = format!("locked-{entry}");
        let mut cmd = as_nobody(&agent_run_bin());
        cmd.args([
            "--root",
            root.root().to_str().unwrap(),
            "--cgroup",
            "off",
            "--quiet",
        ])
        .args(["--cwd", &l, &id, "--", "true"])
        .env("AGENT_RUN_NO_SCOPE", "1");
        if let Some(k) = knob {
            cmd.env("AGENT_RUN_FAULT", k);
        }
        let error = assert_launch_failed(&root, &id, 70, outcome(&mut cmd));
        assert_eq!(
            error,
            format!("cannot change to --cwd {l}: Permission denied (os error 13)"),
            "{entry}"
        );
    }
}

#[test]
fn the_workload_gets_cwd_env_and_no_descriptor_above_stderr_on_both_paths() {
    let root = TestRoot::new();
    let cwd = root.dir.path().join("work");
    fs::create_dir(&cwd).unwrap();
    for (entry, knob) in PATHS {
        for pty in [false, true] {
            let id = format!("fds-{entry}{}", if pty { "-pty" } else { "" });
            let mut cmd = ar(&root, knob, &["--quiet", "--cwd"]);
            cmd.arg(&cwd)
                .args(["-e", "FOO=bar baz", "-e", "HOME=/elsewhere"]);
            if pty {
                cmd.arg("--pty");
            }
            cmd.args([&id, "--", "sleep", "1000"])
                .env("AGENT_RUN_PHASES", root.dir.path().join("phases"));
            // The wrapper holds a descriptor of its own without close-on-exec (7, a copy of
            // its stderr): a workload that inherited it would show it.
            // SAFETY: dup2(2) only, in the forked child before exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::dup2(2, 7) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let wrapper = Spawned::spawn(&mut cmd);
            let st = wait_run(&root, &id, "running", LONG, || {
                let st = root.try_status(&id)?;
                match st["state"].as_str() {
                    Some("running") => Ok(st),
                    _ => Err(st.to_string()),
                }
            });
            let pid = st["pid"].as_i64().unwrap() as i32;
            let pin = Pinned::new(&[pid]);
            let diag = || diagnostics(&root, &id);
            // Exec'd: the leader is sleep itself, its own session.
            let stat = proc_stat(pid).expect("the leader is alive");
            assert_eq!((stat.2, stat.3), (pid, pid), "pgid, sid\n{}", diag());
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap();
            assert!(exe.ends_with("sleep"), "{exe:?}");
            // Only 0, 1 and 2 once `sleep` is settled: right after its exec the program itself
            // may hold a descriptor for a moment (setlocale reading the locale archive), while
            // one it inherited would stay for good.
            let fds_now = || {
                let mut fds: Vec<i32> = fs::read_dir(format!("/proc/{pid}/fd"))
                    .unwrap()
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect();
                fds.sort_unstable();
                fds
            };
            let settled =
                agent_run_tests::wait_until_dbg("the workload's fds to be 0, 1, 2", LONG, || {
                    let fds = fds_now();
                    if fds == [0, 1, 2] {
                        Ok(fds)
                    } else {
                        Err(fds)
                    }
                });
            assert_eq!(settled, [0, 1, 2], "{entry} pty {pty}\n{}", diag());
            let target = |fd: i32| fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
            if pty {
                let ev = root.events(&id).into_iter().find(|e| e["event"] == "pty");
                let tty = ev.and_then(|e| e["tty"].as_str().map(PathBuf::from));
                assert!(tty.is_some(), "no pty event\n{}", diag());
                for fd in 0..3 {
                    assert_eq!(Some(target(fd)), tty, "fd {fd}\n{}", diag());
                }
            } else {
                assert_eq!(target(0), Path::new("/dev/null"), "{}", diag());
                for fd in 1..3 {
                    let t = target(fd).display().to_string();
                    assert!(t.starts_with("pipe:"), "fd {fd}: {t}");
                }
            }
            assert_eq!(fs::read_link(format!("/proc/{pid}/cwd")).unwrap(), cwd);
            let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
            let vars: Vec<String> = environ
                .split(|&b| b == 0)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect();
            let dir = root.run_dir(&id).display().to_string();
            for want in [
                "FOO=bar baz".to_string(),
                "HOME=/elsewhere".to_string(),
                format!("AGENT_RUN_ID={id}"),
                format!("AGENT_RUN_DIR={dir}"),
            ] {
                assert!(vars.contains(&want), "{want} not in {vars:?}");
            }
            for gone in [
                "AGENT_RUN_FAULT=",
                "AGENT_RUN_PHASES=",
                "AGENT_RUN_PASSED_ENV=",
            ] {
                assert!(
                    !vars.iter().any(|v| v.starts_with(gone)),
                    "{gone} in {vars:?}"
                );
            }
            // The environment is sorted by name, one value each, as std's Command made it.
            let names: Vec<&str> = vars
                .iter()
                .filter(|v| !v.is_empty())
                .map(|v| v.split('=').next().unwrap_or_default())
                .collect();
            assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
            wrapper.signal(libc::SIGTERM);
            let out = wrapper.finish(LONG);
            assert_eq!(out.status.code(), Some(143), "{}", diag());
            pin.wait_all_gone(LONG)
                .unwrap_or_else(|p| panic!("{p:?} outlived the run\n{}", diag()));
        }
    }
    // The wrapper timed its launches (the variable reached the wrapper, not the workload), and
    // each keeper, its fork, appended a line of its own on the wrapper's clock.
    let phases = fs::read_to_string(root.dir.path().join("phases")).unwrap_or_default();
    let docs: Vec<Value> = phases
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |role: &str| -> Vec<&Value> { docs.iter().filter(|d| d["role"] == role).collect() };
    assert_eq!(of("wrapper").len(), 4, "{phases}");
    assert_eq!(of("keeper").len(), 4, "{phases}");
    assert_eq!(docs.len(), 8, "{phases}");
    for (role, wanted) in [
        (
            "wrapper",
            &["parse", "spawn", "running_record", "final_record", "exit"][..],
        ),
        (
            "keeper",
            &["keeper_forked", "keeper_ready", "keeper_eof", "exit"][..],
        ),
    ] {
        for doc in of(role) {
            let names: Vec<&str> = doc["phases"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|p| p["name"].as_str())
                .collect();
            for want in wanted {
                assert!(names.contains(want), "{role}: {want} not in {names:?}");
            }
            assert!(
                doc["zero_monotonic_us"].as_u64().is_some_and(|z| z > 0),
                "{doc}"
            );
        }
    }
    // A keeper's line shares its wrapper's zero: the keeper is forked, not started anew.
    for k in of("keeper") {
        assert!(
            of("wrapper")
                .iter()
                .any(|w| w["zero_monotonic_us"] == k["zero_monotonic_us"]),
            "{k}"
        );
    }
}

/// A hostile workload opens a write end of every pipe its wrapper holds, through
/// /proc/PPID/fd (same user, in the moment after its exec, which `hold_spawn_report` keeps
/// open), and writes into each a whole spawn report (`exec` failed, ENOENT), or half of one,
/// or fills each with reports (the keeper's go among them: the wrapper's byte there must not
/// block), then writes 256 KiB while it holds them. None is taken for the child's: the launch does
/// not wait for the held pipe's EOF (it deadlocked: the workload blocked on its output, which
/// nobody drained yet) nor fail, the workload runs, every byte is kept, and the journal names the
/// report it ignored. Then one that forges a report, forks and exits 127 as a failed child does:
/// its fork, alive in the run, shows the exec happened; the run is supervised like any other
/// (no `launch_failed`), and the fork is stopped. On both spawn paths.
#[test]
fn a_workload_that_forges_or_holds_the_spawn_report_neither_hangs_nor_fails_the_launch() {
    const BYTES: usize = 256 * 1024;
    let root = TestRoot::new();
    let fixture = agent_run_tests::fixture_bin().display().to_string();
    let spew: Vec<u8> = (0..BYTES)
        .map(|k| b"0123456789abcdefghijklmnopqrstuvwxyz\n"[k % 37])
        .collect();
    for (entry, knob) in PATHS {
        let knobs = match knob {
            Some(k) => format!("{k},hold_spawn_report"),
            None => "hold_spawn_report".to_string(),
        };
        for forge in ["8", "4", "fill"] {
            let id = format!("forge{forge}-{entry}");
            let args = [
                "--quiet",
                id.as_str(),
                "--",
                fixture.as_str(),
                "grab-parent-pipes",
                forge,
                "spew",
                "262144",
            ];
            let mut cmd = ar(&root, None, &args);
            let (code, _, err) = outcome(cmd.env("AGENT_RUN_FAULT", &knobs));
            let diag = || format!("{id}: {err}\n{}", diagnostics(&root, &id));
            assert_eq!(code, 0, "{}", diag());
            let st = root.status(&id);
            assert_eq!(st["state"], "finished", "{}", diag());
            assert_eq!(st["exit_code"], 0, "{}", diag());
            assert_eq!(st["output"]["stdout"]["written"], BYTES, "{}", diag());
            let log = fs::read(root.run_dir(&id).join("stdout.log")).unwrap_or_default();
            assert!(log == spew, "{id}: stdout.log holds {} bytes", log.len());
            let errlog = fs::read_to_string(root.run_dir(&id).join("stderr.log")).unwrap();
            let grabbed: usize = errlog
                .strip_prefix("grabbed ")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{id}: no count in stderr.log {errlog:?}"));
            assert!(grabbed >= 1, "{id}: the workload held no pipe of ours");
            let ignored = &spawn_event(&root, &id)["report_ignored"];
            if forge != "4" {
                assert_eq!(ignored["step"], "Exec", "{}", diag());
                assert_eq!(ignored["errno"], libc::ENOENT, "{}", diag());
            } else {
                assert!(ignored.is_null(), "{}", diag());
            }
        }
        let id = format!("orphan-{entry}");
        let args = [
            "--quiet",
            "--grace",
            "2s",
            id.as_str(),
            "--",
            fixture.as_str(),
            "grab-parent-pipes",
            "8",
            "orphan-exit-127",
        ];
        let mut cmd = ar(&root, None, &args);
        let (code, _, err) = outcome(cmd.env("AGENT_RUN_FAULT", &knobs));
        let diag = || format!("{id}: {err}\n{}", diagnostics(&root, &id));
        let st = root.status(&id);
        assert_ne!(st["state"], "launch_failed", "{}", diag());
        assert_ne!(st["launch_exit_code"], 127, "{}", diag());
        assert_eq!(st["exit_code"], 127, "{}", diag());
        let orphan: i32 = stdout_log(&root, &id)
            .trim()
            .strip_prefix("orphan pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{}", diag()));
        let leader = st["pid"].as_i64().unwrap_or_else(|| panic!("{}", diag())) as i32;
        // The fork kept the leader's session (the fixture never leaves it): none of it is left.
        let left = agent_run_tests::session_members(leader);
        assert!(
            left.is_empty(),
            "{id}: the run's session still holds {left:?} (the fork: {orphan}), exit {code}\n{}",
            diag()
        );
        if let Some(cg) = st["containment"]["cgroup"].as_str() {
            assert!(!Path::new(cg).exists(), "cgroup {cg} left\n{}", diag());
        }
        // Stopped by the shared routine, as the run's own: journalled and in the record.
        assert!(
            root.events(&id)
                .iter()
                .any(|e| e["event"] == "signal" && e["pid"] == orphan),
            "{id}: no signal journalled for the fork {orphan}\n{}",
            diag()
        );
        let signalled = st["cleanup"]["signalled"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(signalled.contains(&orphan.into()), "{}", diag());
    }
}

/// The workload fills every pipe its wrapper holds (through /proc/PPID/fd) and holds a read end
/// of each, never read, then sleeps: the keeper's go pipe among them, whose own reader (the
/// keeper) read its one byte and left. The wrapper's go byte must not block on it (TERM does
/// not interrupt a blocking write under SA_RESTART: the wrapper hung there, the run unstoppable
/// by `cancel`, until the workload let go): TERM to the wrapper stops the run, recorded
/// `cancelled` with nothing of it left.
#[test]
fn a_workload_that_fills_and_holds_its_wrappers_pipes_cannot_hang_the_wrapper() {
    let root = TestRoot::new();
    let fixture = agent_run_tests::fixture_bin().display().to_string();
    let id = "fill-hold";
    let w = Spawned::spawn(
        ar(
            &root,
            None,
            &[
                "--quiet",
                "--grace",
                "2s",
                id,
                "--",
                &fixture,
                "grab-parent-pipes",
                "fill",
                "hold",
            ],
        )
        .env("AGENT_RUN_FAULT", "hold_spawn_report"),
    );
    let leader = wait_run(&root, id, "the fixture holding the pipes", LONG, || {
        let st = root.try_status(id)?;
        let held = fs::read_to_string(root.run_dir(id).join("stderr.log")).unwrap_or_default();
        match (st["state"].as_str(), st["pid"].as_i64()) {
            (Some("running"), Some(pid)) if held.contains("holding") => Ok(pid as i32),
            _ => Err(format!("{} / {held:?}", st["state"])),
        }
    });
    let ticks = proc_stat(leader).expect("the leader's stat").4;
    let pin = Pinned::new(&[leader]);
    // The wrapper is past its go byte once it sleeps in its supervision: TERM then stops the run.
    let _ = agent_run_tests::sys::kill(w.child.id() as i32, libc::SIGTERM);
    let out = w.finish(LONG);
    let _ = pin.signal(leader, libc::SIGKILL);
    let diag = || {
        let out = agent_run_tests::describe_output(id, &out);
        format!("{out}\n{}", diagnostics(&root, id))
    };
    let st = root.status(id);
    assert_eq!(st["state"], "cancelled", "{}", diag());
    assert!(!agent_run_tests::alive_as(leader, ticks), "{}", diag());
    let left = agent_run_tests::session_members(leader);
    assert!(
        left.is_empty(),
        "the run's session holds {left:?}\n{}",
        diag()
    );
}
