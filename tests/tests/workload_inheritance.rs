//! What the workload inherits from the wrapper: /dev/null for closed standard fds, and no fd,
//! signal mask or ignored signal of the wrapper's own.
//!
//! Every test spawns the real `agent-run` binary on a real process tree ([`Run`], a foreground
//! run) and asserts on the process table: each pid the fixture reports is pinned with a pidfd right
//! after the handshake, so "stopped" means the kernel says so. Waits poll a kernel fact or a file
//! to one deadline; every failure prints the run's diagnostics.

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use agent_run_tests::ctx::T;
use agent_run_tests::foreground::*;
use agent_run_tests::workload::fx;
use agent_run_tests::{ctx, describe_output, ensure, fixture_bin, run_with_timeout, TestRoot};

/// Starts `cmd` the way a careless parent would: SIGINT, SIGPIPE, SIGHUP and the real-time
/// signals 32 and 33 ignored, SIGUSR1 blocked, and fd 7 open without close-on-exec.
///
/// glibc reserves signals 32 and 33 and refuses to change them through signal(3) or
/// sigaction(3), so they are set with the raw rt_sigaction(2) syscall. (cargo itself starts test
/// binaries with both ignored; setting them here makes the test the same under any runner.)
fn start_leaky(cmd: &mut Command) {
    /// `struct sigaction` as the kernel takes it (x86_64 and aarch64 layout).
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    // SAFETY: signal(2), rt_sigaction(2), sigemptyset/sigaddset(3), sigprocmask(2) and dup2(2)
    // are async-signal-safe; nothing is allocated between fork and exec. SIG_IGN runs no
    // handler, so no restorer is needed.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            let ignore = KernelSigaction {
                handler: libc::SIG_IGN,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            for sig in [32, 33] {
                let none = std::ptr::null_mut::<KernelSigaction>();
                if libc::syscall(libc::SYS_rt_sigaction, sig, &ignore, none, 8) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if libc::dup2(2, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A wrapper started with descriptors 0, 1 and 2 closed has them on /dev/null before it opens
/// anything (it starts at its own C `main`, and does what Rust's runtime start did): the
/// workload's stdin, the wrapper's own, is /dev/null, never a file of the run dir that took the
/// lowest free number. Without it, fd 0 would be the first file the wrapper opened.
#[test]
fn a_wrapper_started_with_fds_0_1_2_closed_gives_its_workload_dev_null_for_stdin() {
    let root = TestRoot::new();
    let id = "closed-std";
    let c = ctx(&root, id);
    let mut cmd = root.cmd();
    cmd.args(["--quiet", id, "--", "sh", "-c", "readlink /proc/self/fd/0"]);
    // SAFETY: close(2) is async-signal-safe; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for fd in 0..3 {
                libc::close(fd);
            }
            Ok(())
        });
    }
    let out = run_with_timeout(&mut cmd, T);
    ensure!(
        c,
        out.status.code() == Some(0),
        "{}",
        describe_output("agent-run with 0-2 closed", &out)
    );
    let st = root.status(id);
    c.fields(&st, "the record", outcome("finished", None));
    let seen = fs::read_to_string(root.run_dir(id).join("stdout.log")).unwrap_or_default();
    c.eq(&seen.trim_end(), &"/dev/null", "the workload's fd 0");
}

#[test]
fn no_fd_mask_or_ignored_signal_of_the_wrapper_leaks_into_the_workload() {
    // The control: started directly, the fixture does report what it inherited.
    let mut direct = Command::new(fixture_bin());
    direct.arg("env").stdin(Stdio::null());
    start_leaky(&mut direct);
    let control = run_with_timeout(&mut direct, T);
    let control_text = String::from_utf8_lossy(&control.stdout);
    let mask = |field: &str| {
        control_text
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_default()
    };
    let ignored = bit(libc::SIGINT) | bit(libc::SIGPIPE) | bit(libc::SIGHUP) | bit(32) | bit(33);
    let fds = control_text
        .lines()
        .find_map(|l| l.strip_prefix("fds: "))
        .unwrap_or_default();
    assert!(
        mask("SigIgn:") & ignored == ignored
            && mask("SigBlk:") & bit(libc::SIGUSR1) != 0
            && fds.split(',').any(|fd| fd == "7"),
        "the leaky start does not leak: the test proves nothing\n{}",
        describe_output("fixture env", &control)
    );

    let root = TestRoot::new();
    let mut run = Run::start_with(&root, "env", &[], &fx("env"), start_leaky);
    let c = run.c;
    run.finish(0);
    let st = run.final_record();
    c.fields(&st, "the record", outcome("finished", None));
    let dir = root.run_dir("env");
    let report = fs::read_to_string(dir.join("stdout.log")).unwrap_or_default();
    let leader = int(c, &st, "pid");
    let expected = [
        "SigIgn:\t0000000000000000".to_string(),
        "SigBlk:\t0000000000000000".to_string(),
        "fds: 0,1,2".to_string(),
        "AGENT_RUN_ID=env".to_string(),
        format!("AGENT_RUN_DIR={}", dir.display()),
        format!("pid={leader} pgid={leader} sid={leader}"),
    ];
    let missing: Vec<&String> = expected
        .iter()
        .filter(|want| !report.lines().any(|l| l == want.as_str()))
        .collect();
    ensure!(
        c,
        missing.is_empty(),
        "the workload's report lacks {missing:?}:\n{report}"
    );
}
