//! A look of every pid on a followed pid counter is the last one's older pids and a fresh read
//! of the pids handed out since (`procset::Snapshot::since`, `pid_counter`). Its own process:
//! the look shared by stops is one per process, and no other test may take one in between.

use agent_run_shared::pid::Pid;
use agent_run_shared::pid_counter;
use agent_run_shared::procfs;
use agent_run_shared::procset::Snapshot;
use std::time::Instant;

#[test]
fn a_look_after_a_followed_base_reads_the_pids_handed_out_since_and_keeps_the_older_ones() {
    pid_counter::follow();
    let base = Snapshot::take();
    let floor = base.pid_floor().expect("a look of every pid has a floor");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = Pid::new(child.id().into()).unwrap();
    let now = procfs::stat(pid).expect("the child's stat");
    let look = Snapshot::since(Instant::now(), None);
    let floor_of_look = look
        .pid_floor()
        .expect("a composite look has its base's floor");
    let found = look.stat_of(pid).copied();
    let me = look.stat_of(Pid::this()).copied();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        floor_of_look.pid, floor.pid,
        "the look was not built on the base (a new look of every pid has a later floor)"
    );
    assert!(floor_of_look.holds_now());
    let found = found.expect("the process forked after the base is in the look");
    assert_eq!(found.start_ticks, now.start_ticks);
    assert_eq!(found.ppid, now.ppid);
    assert!(
        me.is_some(),
        "an older process (this one) is kept from the base"
    );

    // The child is gone: a look begun after reads its pid afresh and does not hold it.
    let after = Snapshot::since(Instant::now(), None);
    assert_eq!(after.pid_floor().map(|f| f.pid), Some(floor.pid));
    assert!(
        after
            .stat_of(pid)
            .is_none_or(|s| s.start_ticks != now.start_ticks),
        "a process gone since is not in a later look"
    );
}
