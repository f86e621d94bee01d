use super::*;
use std::os::fd::AsFd;

#[test]
fn pidfd_of_self_can_be_opened_and_signalled() {
    // CONT to a running process: delivered, and nothing happens.
    let fd = pidfd_open(Pid::this()).unwrap();
    pidfd_send_signal(fd.as_fd(), Sig::Cont).unwrap();
    kill_process(Pid::this(), Sig::Cont).unwrap();
}

/// Whether the pidfd polls readable (its process exited) within `t`.
fn exits_within(pidfd: &OwnedFd, t: Duration) -> bool {
    let mut fds = [PollFd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let n = poll(&mut fds, Some(t)).unwrap();
    n == 1 && fds[0].revents & libc::POLLIN != 0
}

#[test]
fn a_killed_child_polls_readable_and_is_reaped_with_its_signal() {
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = Pid::new(child.id().into()).unwrap();
    let fd = pidfd_open(pid).unwrap();
    assert!(!exits_within(&fd, Duration::ZERO), "alive");
    kill_process(pid, Sig::Kill).unwrap();
    assert!(exits_within(&fd, Duration::from_secs(30)));
    assert_eq!(
        waitpid_nohang(Some(pid)).unwrap(),
        Some((pid, WaitStatus::Signaled(libc::SIGKILL)))
    );
    assert!(child.try_wait().is_err(), "already reaped");
}

/// Any child, a session leader of its own included (the run's leader is one). A wait for
/// any child would reap other tests' children: the check runs in a process of its own, this
/// test binary run again for this one test.
#[test]
fn any_child_is_reaped_in_whatever_session_it_is() {
    if std::env::var_os("AGENT_RUN_SYS_REAP_PROBE").is_some() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "exit 7"]);
        spawn_in_new_session(&mut cmd);
        // Reaped by waitpid_nohang(None): the call under test.
        #[allow(clippy::zombie_processes)]
        let child = cmd.spawn().unwrap();
        let pid = Pid::new(child.id().into()).unwrap();
        assert!(exits_within(
            &pidfd_open(pid).unwrap(),
            Duration::from_secs(30)
        ));
        assert_eq!(
            waitpid_nohang(None).unwrap(),
            Some((pid, WaitStatus::Exited(7)))
        );
        assert_eq!(
            waitpid_nohang(None).unwrap_err().raw_os_error(),
            Some(libc::ECHILD)
        );
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sys::tests::any_child_is_reaped_in_whatever_session_it_is",
        ])
        .args(["--test-threads", "1"])
        .env("AGENT_RUN_SYS_REAP_PROBE", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// Reap our child `pid` and return how it ended.
fn reap(pid: Pid) -> WaitStatus {
    let fd = pidfd_open(pid).unwrap();
    assert!(
        exits_within(&fd, Duration::from_secs(30)),
        "{pid} did not exit"
    );
    waitpid_nohang(Some(pid)).unwrap().unwrap().1
}

#[test]
fn the_fork_semantics_clone3_makes_a_child_with_its_pidfd() {
    match clone3(None, true).unwrap() {
        // SAFETY: the child of a multi-threaded process: _exit(2) at once, nothing else.
        Forked::Child => unsafe { libc::_exit(7) },
        Forked::Parent(pid, fd) => {
            assert!(fd.is_some(), "no pidfd for {pid}");
            assert_eq!(reap(pid), WaitStatus::Exited(7));
        }
    }
}

#[test]
fn a_second_open_file_description_does_not_get_the_lock() {
    let f = tempfile::tempfile().unwrap();
    let path = format!("/proc/self/fd/{}", f.as_raw_fd());
    let other = std::fs::File::open(path).unwrap();
    assert!(try_lock_exclusive(f.as_fd()).unwrap());
    assert!(!try_lock_exclusive(other.as_fd()).unwrap());
}

#[test]
fn inotify_names_the_file_renamed_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let ino = Inotify::new().unwrap();
    let wd = ino.add_watch(dir.path(), Inotify::CHANGED).unwrap();
    assert!(ino.read_events().is_empty());
    std::fs::write(dir.path().join("tmp"), b"x").unwrap();
    std::fs::rename(dir.path().join("tmp"), dir.path().join("status.json")).unwrap();
    let epoll = Epoll::new().unwrap();
    epoll.add(ino.raw_fd(), 7).unwrap();
    assert_eq!(epoll.wait(Some(Duration::from_secs(30))).unwrap(), vec![7]);
    let evs = ino.read_events();
    assert!(
        evs.iter()
            .any(|e| e.wd == wd && e.mask & libc::IN_MOVED_TO != 0 && e.name == "status.json"),
        "{evs:?}"
    );
    epoll.remove(ino.raw_fd());
    assert_eq!(epoll.wait(Some(Duration::ZERO)).unwrap(), Vec::<u64>::new());
}

#[test]
fn host_facts_are_plausible() {
    assert!(clock_ticks_per_sec() >= 100);
    let up = boottime_secs();
    let ours =
        crate::procfs::stat(Pid::this()).unwrap().start_ticks as f64 / clock_ticks_per_sec() as f64;
    assert!(
        ours <= up + 1.0,
        "started {ours}s after boot, booted {up}s ago"
    );
    assert_eq!(geteuid(), euid_from_proc());
    assert!(writable(&std::env::temp_dir()));
    assert!(!hostname().is_empty());
}

fn euid_from_proc() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    uid.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn a_new_dirs_birth_is_now_and_a_scan_begun_before_it_is_older() {
    let before = std::time::SystemTime::now() - Duration::from_secs(1);
    let d = tempfile::tempdir().unwrap();
    let f = std::fs::File::open(d.path()).unwrap();
    let born = born(f.as_fd(), &f.metadata().unwrap()).expect("a birth or change time");
    assert!(born >= before, "born {born:?} before {before:?}");
    assert!(born <= std::time::SystemTime::now());
}
