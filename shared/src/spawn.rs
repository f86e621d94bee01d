//! The workload's spawn: the process made by [`sys::start_workload`] (clone3 into its cgroup,
//! or fork), then the child's report read and believed only when the child ended as one that
//! reported does.

use crate::pid::Pid;
use crate::sys::{self, ChildIo, ChildStep, Exec, SpawnError, Spawned};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// Spawn the workload: a new process, in the run's cgroup from its first instruction when
/// `cgroup` (the cgroup's directory, open O_RDONLY|O_DIRECTORY) is given, that takes `io` as
/// its stdio, changes to the working directory, resets every signal, starts a new session
/// (with `io.ctty` as its controlling terminal), marks every descriptor above stderr
/// close-on-exec and execs `exec`.
///
/// The process is made by clone3(2) with CLONE_PIDFD (its pidfd, race-free), SIGCHLD as its
/// exit signal and, with a cgroup, CLONE_INTO_CGROUP: the kernel attaches it under the read
/// side of the cgroup lock, where a migration (a write to `cgroup.procs`) takes the write side
/// and waits for an RCU grace period (milliseconds). Kernels without clone3 or without
/// CLONE_INTO_CGROUP (before 5.7: ENOSYS, E2BIG, EINVAL), seccomp profiles that refuse clone3
/// (EPERM, ENOSYS), and `force_fork` get fork(2) instead and a child that writes `0` to
/// `cgroup.procs` before its exec. Any other refusal of a clone3 into the cgroup is the
/// cgroup's ([`SpawnError::Cgroup`]; EAGAIN and ENOMEM are [`SpawnError::Fork`]).
///
/// The clone waits out the child as vfork(2) does (CLONE_VFORK, without CLONE_VM): the child
/// runs on a copy of our memory, as after fork(2), while this thread sleeps until its exec or
/// exit. The fork fallback's child runs on a copy too, unwaited. Either way it calls only
/// async-signal-safe syscalls that write nothing but its own stack: no allocation, no lock, no
/// panic. A failed step is written (step and errno) to a close-on-exec pipe, then the child
/// `_exit`s 127; the parent reads the pipe (see the body for how long it waits): nothing means
/// the exec succeeded, and so does a report after which the child did not end as a child that
/// reported does ([`Spawned::report_ignored`]): the exec'd workload wrote it.
pub fn spawn_workload(
    exec: &Exec,
    io: &ChildIo<'_>,
    cgroup: Option<BorrowedFd<'_>>,
    force_fork: bool,
) -> Result<Spawned, SpawnError> {
    let sys::Started {
        pid,
        pidfd,
        cgroup_entry,
        report_r,
        report_w,
        waited,
    } = sys::start_workload(exec, io, cgroup, force_fork)?;
    if crate::fault::armed(crate::fault::HOLD_SPAWN_REPORT) {
        // Tests: our write end stays open until something is in the pipe (at most 10 s), so a
        // workload that opens it through /proc/PPID/fd always finds it.
        sys::readable_by(report_r.as_fd(), Instant::now() + Duration::from_secs(10));
    }
    // Our copies of the child's ends: its exec (or its exit) closes the last ones.
    drop(report_w);
    // After a vfork-style clone the child has exec'd or exited: its report is in the pipe, whole,
    // or there is none, and the pipe is read without waiting. Its EOF is not waited for then:
    // the exec'd workload, running by now, can open a write end of it through /proc/PID/fd,
    // and would hold the launch (and, with its output not yet drained, itself) forever. After a
    // fork the EOF (the exec) is waited for, at most [`REPORT_WAIT`], for the same reason.
    let wait = if waited { Duration::ZERO } else { REPORT_WAIT };
    let report_ignored = match read_report(&report_r, wait) {
        None => None,
        // Bytes in the pipe are the child's report only if the child then ended as a child
        // that reported does; else the exec'd workload wrote them (see [`ended_as_reported`]),
        // and it is supervised as any workload, its bytes only journalled.
        Some(report) if !ended_as_reported(pid, pidfd.as_ref(), cgroup) => Some(report),
        Some((step, errno)) => {
            // The child `_exit`s right after its report: reap it, so a launch that never ran
            // leaves no zombie.
            drop(pidfd);
            while let Err(rustix::io::Errno::INTR) = rustix::process::waitpid(
                Some(sys::rustix_pid(pid)),
                rustix::process::WaitOptions::empty(),
            ) {}
            let e = io::Error::from_raw_os_error(errno);
            return Err(match step {
                ChildStep::Cgroup => SpawnError::Cgroup(e),
                step => SpawnError::Child(step, e),
            });
        }
    };
    Ok(Spawned {
        pid,
        pidfd,
        cgroup_entry,
        report_ignored,
    })
}

/// After a fork, the longest the parent waits for the report pipe's EOF (the child's exec or
/// exit, microseconds away); past it the child is taken as spawned. Only a workload that opened
/// the pipe's write end through /proc/PPID/fd before our copy was closed makes it count.
const REPORT_WAIT: Duration = Duration::from_secs(10);

/// The longest a child that reported a failed step is waited for to end: it `_exit`s right
/// after its report, so this only counts for a report the child did not write.
const REPORTED_END_WAIT: Duration = Duration::from_secs(5);

/// Whether the child that a report came from (as far as the pipe tells) ended as one that
/// reported does: exited 127 within [`REPORTED_END_WAIT`], and nothing alive in its cgroup (or,
/// without one, in its session), since it never reached its exec. An exec'd workload of the
/// same user can open the pipe's write end through /proc/PPID/fd and write a report of its own;
/// taken for the child's, the launch would fail while the workload and what it forked ran on,
/// and the reap would wait for its exit. Without a pidfd (kernels before 5.3) the report is
/// believed, as it was.
fn ended_as_reported(pid: Pid, pidfd: Option<&OwnedFd>, cgroup: Option<BorrowedFd<'_>>) -> bool {
    let opened;
    let fd = match pidfd {
        Some(fd) => fd,
        None => match sys::pidfd_open(pid) {
            Ok(fd) => {
                opened = fd;
                &opened
            }
            Err(_) => return true,
        },
    };
    if !sys::readable_by(fd.as_fd(), Instant::now() + REPORTED_END_WAIT) {
        return false;
    }
    use rustix::process::{WaitId, WaitIdOptions};
    let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    let exited_127 = matches!(
        rustix::process::waitid(WaitId::Pid(sys::rustix_pid(pid)), opts),
        Ok(Some(st)) if st.exited() && st.exit_status() == Some(127)
    );
    if !exited_127 {
        return false;
    }
    match cgroup {
        Some(dir) => cgroup_empty(dir),
        None => !crate::procfs::scan()
            .iter()
            .any(|s| s.sid == Some(pid) && s.pid != pid),
    }
}

/// Whether the cgroup at `dir` says `populated 0` (false when it cannot be read).
fn cgroup_empty(dir: BorrowedFd<'_>) -> bool {
    use std::io::Read;
    let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(dir, "cgroup.events", flags, rustix::fs::Mode::empty()) else {
        return false;
    };
    let mut text = String::new();
    let read = std::fs::File::from(fd).take(4096).read_to_string(&mut text);
    read.is_ok() && crate::cgroup::events_populated(&text) == Some(false)
}

/// Read the child's report: to the end of the pipe, waiting at most `wait` in all for more
/// (zero: only what it holds now). `None` when it closed without a word (the exec succeeded, or
/// the child died before it could say anything) or said less than a report.
fn read_report(fd: &OwnedFd, wait: Duration) -> Option<(ChildStep, i32)> {
    // It cannot fail on a pipe of ours; if it did, the reads would wait for the EOF as before.
    let _ = rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK);
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 8];
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(fd, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) if sys::readable_by(fd.as_fd(), deadline) => {}
            Err(_) => break,
        }
    }
    if n != buf.len() {
        return None;
    }
    let step = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let step = ChildStep::ALL
        .into_iter()
        .find(|s| *s as u32 == step)
        .unwrap_or(ChildStep::Exec);
    Some((step, errno))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::WaitStatus;

    /// Spawn `argv` with `env` (and `cwd`) through [`spawn_workload`], stdout and stderr into
    /// one pipe; returns the spawn's result and everything the child wrote.
    fn spawn_capture(
        argv: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&std::path::Path>,
        force_fork: bool,
    ) -> (Result<Spawned, SpawnError>, String) {
        let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
        let env: Vec<_> = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
        let exec = Exec::new(&argv, &env, cwd).unwrap();
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let io = ChildIo {
            stdin: None,
            stdout: w.as_fd(),
            stderr: w.as_fd(),
            ctty: None,
            reset_signals: sys::nondefault_signals(),
            cgroupns: false,
        };
        let spawned = spawn_workload(&exec, &io, None, force_fork);
        drop(w);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut out).unwrap();
        (spawned, out)
    }

    /// Reap our child `pid` and return how it ended.
    fn reap(pid: Pid) -> WaitStatus {
        let fd = sys::pidfd_open(pid).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        assert!(sys::readable_by(fd.as_fd(), deadline), "{pid} did not exit");
        sys::waitpid_nohang(Some(pid)).unwrap().unwrap().1
    }

    #[test]
    fn the_workload_is_its_own_session_with_its_env_cwd_and_stdio_only_by_clone3_or_fork() {
        let dir = tempfile::tempdir().unwrap();
        for force_fork in [false, true] {
            let script = "pwd; echo \"$FOO\"; ls /proc/self/fd; exit 3";
            let (spawned, out) = spawn_capture(
                &["sh", "-c", script],
                &[("FOO", "bar baz"), ("PATH", "/nonexistent:/usr/bin:/bin")],
                Some(dir.path()),
                force_fork,
            );
            let child = spawned.unwrap();
            // A pidfd from the clone itself; after a fork the caller opens one.
            assert_eq!(child.pidfd.is_some(), !force_fork, "fork {force_fork}");
            assert_eq!(child.cgroup_entry, None);
            let st = crate::procfs::stat(child.pid).unwrap();
            assert_eq!((st.pgid, st.sid), (Some(child.pid), Some(child.pid)));
            assert_eq!(reap(child.pid), WaitStatus::Exited(3));
            let lines: Vec<&str> = out.lines().collect();
            // `ls /proc/self/fd` lists its own directory fd (3): nothing of ours is above 2.
            let want = [dir.path().to_str().unwrap(), "bar baz", "0", "1", "2", "3"];
            assert_eq!(lines, want, "fork {force_fork}: {out}");
        }
    }

    #[test]
    fn exec_failures_report_their_step_and_errno_as_execvp_would() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        type Case<'a> = (
            &'a [&'a str],
            &'a str,
            Option<&'a std::path::Path>,
            ChildStep,
            i32,
        );
        let cases: [Case<'_>; 5] = [
            (
                &["agent-run-no-such-command"],
                "/nonexistent:/etc",
                None,
                ChildStep::Exec,
                libc::ENOENT,
            ),
            // /etc/passwd is not executable, even for root: EACCES, remembered past the ENOENT.
            (
                &["passwd"],
                "/etc:/nonexistent",
                None,
                ChildStep::Exec,
                libc::EACCES,
            ),
            (
                &["/etc"],
                "/usr/bin:/bin",
                None,
                ChildStep::Exec,
                libc::EACCES,
            ),
            (&[""], "/usr/bin:/bin", None, ChildStep::Exec, libc::ENOENT),
            (
                &["true"],
                "/usr/bin:/bin",
                Some(&gone),
                ChildStep::Cwd,
                libc::ENOENT,
            ),
        ];
        for (argv, path, cwd, step, errno) in cases {
            for force_fork in [false, true] {
                let (spawned, out) = spawn_capture(argv, &[("PATH", path)], cwd, force_fork);
                match spawned {
                    Err(SpawnError::Child(s, e)) => {
                        assert_eq!((s, e.raw_os_error()), (step, Some(errno)), "{argv:?}")
                    }
                    other => panic!("{argv:?}: {other:?}"),
                }
                assert_eq!(out, "", "{argv:?}");
            }
        }
    }

    #[test]
    fn a_file_the_kernel_cannot_execute_is_run_by_sh_as_execvp_does() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("no-shebang");
        // Written by a child process, never through a descriptor of ours: a fork by another
        // test thread while we held one open for writing would keep the file open for writing
        // in that child until its exec, and our exec of the script would fail ETXTBSY.
        let made = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                "printf '%s\\n' 'echo \"sh ran $0 $*\"' > \"$1\" && chmod 755 \"$1\"",
                "sh",
            ])
            .arg(&script)
            .status()
            .unwrap();
        assert!(made.success(), "writing {}", script.display());
        let path = format!("/nonexistent:{}", dir.path().display());
        for argv in [vec![script.to_str().unwrap(), "a", "b"], vec!["no-shebang"]] {
            let (spawned, out) = spawn_capture(&argv, &[("PATH", &path)], None, false);
            assert_eq!(reap(spawned.unwrap().pid), WaitStatus::Exited(0));
            let args = if argv.len() > 1 { "a b" } else { "" };
            assert_eq!(
                out,
                format!("sh ran {} {args}\n", script.display()),
                "{argv:?}"
            );
        }
    }
}
