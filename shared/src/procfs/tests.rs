use super::*;
use crate::signal::Sig;

/// A child of ours, `sleep 60`, and its pid.
fn sleeping_child() -> (std::process::Child, Pid) {
    let child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep runs");
    let pid = Pid::new(i64::from(child.id())).unwrap();
    (child, pid)
}

#[test]
fn a_stopped_process_is_seen_and_a_continued_one_is_not() {
    let (mut child, pid) = sleeping_child();
    assert!(!stopped_or_stopping(pid), "a sleeping process");
    // Pending, then state T; for a moment between the two (the signal taken, the stop not
    // yet made) neither shows, which is why callers look again.
    let within = |want: bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stopped_or_stopping(pid) != want {
            assert!(std::time::Instant::now() < deadline, "not {want} in 10 s");
            std::thread::yield_now();
        }
    };
    crate::sys::kill_process(pid, Sig::Stop).unwrap();
    within(true);
    crate::sys::kill_process(pid, Sig::Cont).unwrap();
    within(false);
    crate::sys::kill_process(pid, Sig::Kill).unwrap();
    child.wait().unwrap();
    assert!(!stopped_or_stopping(pid), "reaped");
}

#[test]
fn a_mask_says_stopping_with_urg_blocked_and_term_not() {
    let mask = |sigs: &[i32]| SigDispositions {
        blocked: sigs.iter().map(|s| 1u64 << (s - 1)).sum(),
        ..Default::default()
    };
    assert!(mask(&[libc::SIGURG]).marks_stopping());
    assert!(mask(&[libc::SIGURG, libc::SIGUSR1]).marks_stopping());
    // Every signal blocked: a wrapper around its clones, not a stop.
    assert!(!SigDispositions {
        blocked: u64::MAX,
        ..Default::default()
    }
    .marks_stopping());
    assert!(!mask(&[libc::SIGURG, libc::SIGTERM]).marks_stopping());
    assert!(!mask(&[]).marks_stopping());
    assert!(!mask(&[libc::SIGTERM]).marks_stopping());
}

#[test]
fn a_kernel_file_is_read_whole_past_the_first_buffer_and_text_only() {
    // A small /proc file in one read, and a file four times the first buffer whole.
    let status = read_kernel_file("/proc/self/status").unwrap();
    assert!(
        status.contains(&format!("Pid:\t{}\n", std::process::id())),
        "{status}"
    );
    let d = tempfile::tempdir().unwrap();
    let big: String = (0..2000).map(|i| format!("line {i:05}\n")).collect();
    assert!(big.len() > 4 * 4096);
    std::fs::write(d.path().join("big"), &big).unwrap();
    assert_eq!(read_kernel_file(d.path().join("big")).unwrap(), big);
    std::fs::write(d.path().join("bin"), [0xff, 0xfe]).unwrap();
    let e = read_kernel_file(d.path().join("bin")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(read_kernel_file(d.path().join("none")).is_err());
}

#[test]
fn a_listing_from_a_pid_starts_at_it_and_holds_every_process_from_it_up() {
    assert!(
        seek_lands_on_pids(),
        "this kernel's /proc listing seeks by pid"
    );
    let (mut child, pid) = sleeping_child();
    let pid = pid.get();
    let me = std::process::id() as i32;
    let from_child = listed_pids_from(pid);
    let past_child = listed_pids_from(pid + 1);
    let from_me = listed_pids_from(me);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        from_child.first(),
        Some(&pid),
        "{:?}",
        &from_child[..from_child.len().min(5)]
    );
    assert!(from_child.iter().all(|&p| p >= pid));
    assert!(past_child.iter().all(|&p| p > pid));
    assert_eq!(from_me.first(), Some(&me));
    if me < pid {
        assert!(
            from_me.contains(&pid),
            "the child is listed from this process's pid up"
        );
    }
    // Below pid 2, the whole listing.
    assert!(listed_pids_from(1).contains(&1) || !listed_pids().contains(&1));
}

#[test]
fn a_probe_of_new_pids_finds_processes_and_skips_threads() {
    let me = Pid::this();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // /proc/thread-self is `PID/task/TID`.
        let link = fs::read_link("/proc/thread-self").unwrap();
        let tid: i32 = link.file_name().unwrap().to_str().unwrap().parse().unwrap();
        tid_tx.send(tid).unwrap();
        let _ = rx.recv();
    });
    let tid = tid_rx.recv().unwrap();
    assert!(
        stat(Pid::new(tid.into()).unwrap()).is_some(),
        "/proc/TID answers"
    );
    assert!(
        probe(tid, tid).is_empty(),
        "thread {tid} taken for a process"
    );
    // The kernel's answer, not the fallback's: pidfd_open refuses the thread.
    assert_eq!(is_group_leader(Pid::new(tid.into()).unwrap()), Some(false));
    assert_eq!(is_group_leader(me), Some(true));
    let found: Vec<Pid> = probe(me.get(), me.get()).iter().map(|s| s.pid).collect();
    assert_eq!(found, vec![me]);
    // An unreaped child is a process until its parent waits for it, as in the listing.
    let mut zombie = std::process::Command::new("true").spawn().unwrap();
    let zpid = Pid::new(zombie.id().into()).unwrap();
    // Its pidfd turns readable at its exit (it is a zombie then).
    let pidfd = crate::sys::pidfd_open(zpid).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    assert!(
        crate::sys::readable_by(std::os::fd::AsFd::as_fd(&pidfd), deadline),
        "{zpid} did not exit"
    );
    assert!(
        stat(zpid).is_some_and(|s| s.is_dead()),
        "{zpid} is a zombie"
    );
    assert_eq!(is_group_leader(zpid), Some(true));
    assert!(probe(zpid.get(), zpid.get()).iter().any(|s| s.pid == zpid));
    zombie.wait().unwrap();
    assert_eq!(
        is_group_leader(zpid),
        Some(false),
        "a reaped pid is no process"
    );
    // A child made now is in the probed range above it and in the listing alike.
    let (mut child, pid) = sleeping_child();
    let pid = pid.get();
    let probed = scan_above(Some(pid));
    assert!(
        probed.iter().any(|s| s.pid.get() == pid),
        "probe missed {pid}"
    );
    let listed = scan_from(pid);
    assert!(
        listed.iter().any(|s| s.pid.get() == pid),
        "listing missed {pid}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn a_child_of_ours_is_a_child_besides_any_other_pid() {
    let (mut child, pid) = sleeping_child();
    // Other tests' children may come and go; ours is there until we kill it.
    assert!(children_of(Pid::this()).contains(&pid));
    assert_eq!(children_besides(Pid::this()), Some(true));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!children_of(Pid::this()).contains(&pid));
}

#[test]
fn the_tree_below_us_holds_a_grandchild_by_its_own_parent_link_and_not_our_parent() {
    // sh forks sleep and waits: the sleep is our grandchild, found through sh's list.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 60 & echo $!; wait"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let sh = Pid::new(child.id().into()).unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let sleep = Pid::new(line.trim().parse::<i64>().unwrap()).unwrap();
    let tree = tree_below(Pid::this()).expect("children lists are readable here");
    let of = |p: Pid| tree.iter().find(|s| s.pid == p).copied();
    // A fork is in its parent's list before it execs; the echo came after the fork.
    let sh_stat = of(sh).expect("our child is in the tree");
    let sleep_stat = of(sleep).expect("our grandchild is in the tree");
    assert_eq!(sh_stat.ppid, Some(Pid::this()));
    assert_eq!(sleep_stat.ppid, Some(sh));
    assert!(
        tree.windows(2).all(|w| w[0].pid < w[1].pid),
        "sorted, no pid twice"
    );
    // Only what is below us: not our parent, not pid 1, not ourselves.
    let me = Pid::this();
    assert!(tree.iter().all(|s| s.pid != me && s.pid.get() != 1));
    assert!(tree.iter().all(|s| Some(s.pid) != stat(me).unwrap().ppid));
    let sleep_fd = crate::sys::pidfd_open(sleep).unwrap();
    crate::sys::pidfd_send_signal(
        std::os::fd::AsFd::as_fd(&sleep_fd),
        crate::signal::Sig::Kill,
    )
    .unwrap();
    child.wait().unwrap();
    assert!(tree_below(Pid::this()).unwrap().iter().all(|s| s.pid != sh));
}

#[test]
fn parses_a_stat_line_with_a_hostile_command_name() {
    let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                987654 1000 250 18446744073709551615";
    let s = parse_stat(line).unwrap();
    assert_eq!(s.pid.get(), 4242);
    assert_eq!(s.state, b'S');
    let p = |n| Pid::new(n);
    assert_eq!((s.ppid, s.pgid, s.sid), (p(1), p(4242), p(4242)));
    assert_eq!(s.start_ticks, 987654);
    assert_eq!(s.rss_pages, 250);
    assert_eq!(s.threads, 1);
    assert_eq!(s.flags, 4194560);
    assert!(!s.is_exiting());
}

#[test]
fn a_parent_group_or_session_in_another_namespace_is_none() {
    // The kernel writes 0 for a parent, group or session outside our pid namespace.
    let line = "7 (init) S 0 0 0 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 5 1000 250 1";
    let s = parse_stat(line).unwrap();
    assert_eq!((s.ppid, s.pgid, s.sid), (None, None, None));
    assert!(!s.leads_group());
    let negative = "7 (x) S -1 7 7 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 5 1000 250 1";
    assert_eq!(
        parse_stat(negative),
        None,
        "the kernel never writes a negative pid"
    );
}

#[test]
fn exiting_is_pf_exiting_on_the_last_thread_only() {
    let line = |flags: u64, threads: u64| {
        format!("77 (w) R 1 77 77 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 {threads} 0 5 1000 250 0")
    };
    let at = |flags, threads| parse_stat(&line(flags, threads)).unwrap();
    assert!(at(0x400104, 1).is_exiting());
    assert!(!at(0x400100, 1).is_exiting());
    // A leader that called SYS_exit while other threads run is alive, not leaving.
    assert!(!at(0x400104, 3).is_exiting());
}

#[test]
fn reads_this_process() {
    let me = stat(Pid::this()).unwrap();
    assert_eq!(me.pid, Pid::this());
    assert!(me.start_ticks > 0);
    assert!(scan().iter().any(|s| s.pid == Pid::this()));
    assert!(!boot_id().is_empty());
    let signals = sig_dispositions(Pid::this()).unwrap();
    assert_eq!(signals.real_uid, Some(rustix::process::getuid().as_raw()));
    assert_eq!(signals.real_uid, real_uid(Pid::this()));
}

#[test]
fn lock_lines_are_parsed_and_waiters_skipped() {
    assert_eq!(
        parse_lock_line("1: FLOCK  ADVISORY  WRITE 15672 fe:00:5341426 0 EOF"),
        Some((0xfe, 0, 5341426, 15672))
    );
    assert_eq!(
        parse_lock_line("1: -> FLOCK  ADVISORY  WRITE 15673 fe:00:5341426 0 EOF"),
        None
    );
    assert_eq!(
        parse_lock_line("2: POSIX  ADVISORY  WRITE 15672 00:2e:11 0 EOF"),
        None
    );
}

#[test]
fn sig_ignored_bit_maps_to_signal_number() {
    let d = SigDispositions {
        ignored: 0x0000000000384004,
        ..Default::default()
    };
    assert!(d.ignores(Sig::Term));
    assert!(d.ignores(Sig::Quit));
    assert!(!d.ignores(Sig::Hup));
}
