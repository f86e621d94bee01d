//! `--pty`: the workload on a pseudo-terminal of its own (issue 14, item 3).
//!
//! What is checked, on real processes and their /proc entries: a program that buffers when its
//! stdout is a file shows each line on the wrapper's stdout within 100 ms of writing it (and
//! without --pty does not: the control); stdout and stderr keep their order; `tty` names a
//! /dev/pts device that is the workload's controlling terminal (its /proc stat tty_nr); the
//! pty has the caller's terminal size and follows it (SIGWINCH), and the caller's keystrokes
//! reach the workload (raw mode: a Ctrl-C byte becomes the workload's SIGINT, not the
//! wrapper's); a pty run stopped by cancel, by its lease, by the watchdog after the wrapper was
//! SIGKILLed, and a `bash -i` (which ignores TERM), leave nothing behind and say so in the
//! record; and a dead keeper stops the run. Nothing sleeps to synchronise: every wait polls a
//! file, a pipe or /proc to a deadline.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_run_shared::pty::{self, Pty, Size};
use agent_run_tests::ctx::Ctx;
use agent_run_tests::facts::{ended, epoch_now, strs};
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, proc_stat, run_with_timeout,
    session_members, wait_child, wait_until, Pinned, Spawned, TestRoot, FINAL_STATES,
};
use serde_json::{json, Value};

/// The deadline for anything that normally takes milliseconds.
const LONG: Duration = Duration::from_secs(20);
/// Lines read from a pipe by a thread, each with the time it arrived.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<(f64, String)>>>);

impl Arrivals {
    fn read_from(mut r: impl Read + Send + 'static) -> Arrivals {
        let a = Arrivals::default();
        let lines = Arc::clone(&a.0);
        std::thread::spawn(move || {
            let mut partial = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let at = epoch_now();
                partial.extend_from_slice(&buf[..n]);
                while let Some(i) = partial.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = partial.drain(..=i).collect();
                    let text = String::from_utf8_lossy(&line)
                        .trim_end_matches(['\r', '\n'])
                        .to_string();
                    lines.lock().unwrap().push((at, text));
                }
            }
        });
        a
    }

    fn lines(&self) -> Vec<(f64, String)> {
        self.0.lock().unwrap().clone()
    }

    /// Wait until a line satisfies `pick`, and return what it gives.
    fn wait_for<T>(&self, what: &str, mut pick: impl FnMut(&str) -> Option<T>) -> T {
        wait_until(what, LONG, || {
            self.lines().iter().find_map(|(_, l)| pick(l))
        })
    }
}

/// `perl` printing four numbered lines, one a second, each with the time it was written, with
/// its ordinary buffering ($| = 0: full when stdout is a file, by line on a terminal).
const PERL_TICKS: &str = r#"$| = 0; use Time::HiRes qw(time); for my $i (1..4) { printf "perl %d %.6f\n", $i, time; sleep 1 }"#;

/// (written at, arrived at) for each of the `perl N T` lines.
fn tick_delays(lines: &[(f64, String)]) -> Vec<(f64, f64)> {
    lines
        .iter()
        .filter_map(|(at, l)| {
            let mut w = l.split_whitespace();
            (w.next()? == "perl").then_some(())?;
            w.next()?;
            Some((w.next()?.parse().ok()?, *at))
        })
        .collect()
}

/// The foreground wrapper with piped stdout read line by line as it arrives.
fn spawn_ticks(root: &TestRoot, id: &str, pty: bool) -> (Child, Arrivals) {
    let mut cmd = root.cmd();
    cmd.arg(id);
    if pty {
        cmd.arg("--pty");
    }
    cmd.args(["--", "perl", "-e", PERL_TICKS])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn agent-run");
    let arrivals = Arrivals::read_from(child.stdout.take().unwrap());
    (child, arrivals)
}

#[test]
fn a_buffering_program_shows_each_line_within_100ms_under_pty_and_not_without() {
    let root = TestRoot::new();
    let (mut with, live) = spawn_ticks(&root, "live", true);
    let (mut without, buffered) = spawn_ticks(&root, "buffered", false);
    for (child, id) in [(&mut with, "live"), (&mut without, "buffered")] {
        let st = wait_child(child, LONG);
        ctx(&root, id).eq(&exit_code(&st), &0, "exit_code(&st)");
    }
    let (live_run, buffered_run) = (ctx(&root, "live"), ctx(&root, "buffered"));
    let got = tick_delays(&live.lines());
    live_run.eq(got.len(), 4, format_args!("{:?}", live.lines()));
    for (written, arrived) in &got {
        let late = arrived - written;
        ensure!(
            live_run,
            late < 0.100,
            "a line written at {written:.3} reached the wrapper's stdout {:.0} ms later: {got:?}",
            late * 1000.0
        );
    }
    // The control: without a terminal perl buffers, and the first line comes with the last.
    let ctl = tick_delays(&buffered.lines());
    buffered_run.eq(ctl.len(), 4, format_args!("{:?}", buffered.lines()));
    ensure!(
        buffered_run,
        ctl[0].1 - ctl[0].0 > 2.0,
        "without --pty the first line was not held back, so this test proves nothing: {ctl:?}"
    );
    live_run.record("the --pty run", json!({"pty": true}));
    buffered_run.record("the plain run", json!({"pty": false}));
}

#[test]
fn stdout_and_stderr_keep_their_order_and_all_go_to_stdout_log() {
    let root = TestRoot::new();
    let c = ctx(&root, "order");
    let mut cmd = root.cmd();
    cmd.args(["order", "--pty", "--", "sh", "-c"])
        .arg("for i in 1 2 3; do echo out$i; echo err$i >&2; done");
    let out = run_ok(c, &mut cmd);
    let want = b"out1\r\nerr1\r\nout2\r\nerr2\r\nout3\r\nerr3\r\n";
    c.eq(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(want),
        format_args!("{}", describe_output("agent-run order --pty", &out)),
    );
    let dir = root.run_dir("order");
    c.eq(
        std::fs::read(dir.join("stdout.log")).unwrap(),
        want,
        "std::fs::read(dir.join(\"stdout.log\")).unwrap()",
    );
    c.eq(
        std::fs::read(dir.join("stderr.log")).unwrap(),
        b"",
        "std::fs::read(dir.join(\"stderr.log\")).unwrap()",
    );
    let st = root.status("order");
    c.eq(
        &(st["state"].as_str(), st["pty"].as_bool()),
        &(Some("finished"), Some(true)),
        "(st[\"state\"].as_str(), st[\"pty\"].as_bool())",
    );
}

/// `agent-run ARGS` as the session leader of a terminal of the test's own (`setsid -c`), that
/// terminal's master kept here and read by a thread.
struct OnTerminal {
    child: Child,
    master: File,
    out: Arrivals,
}

fn on_terminal(root: &TestRoot, size: Size, args: &[&str]) -> OnTerminal {
    let t = Pty::open(size).expect("open a pty for the test");
    let slave = || Stdio::from(t.slave.try_clone().unwrap());
    let mut cmd = Command::new("setsid");
    cmd.arg("-c")
        .arg(agent_run_bin())
        .arg("--root")
        .arg(root.root())
        .args(args)
        .env_remove("AGENT_RUN_ROOT")
        .stdin(slave())
        .stdout(slave())
        .stderr(slave());
    let child = cmd.spawn().expect("spawn setsid -c agent-run");
    drop(cmd);
    let Pty { master, slave, .. } = t;
    drop(slave);
    let master = File::from(master);
    let out = Arrivals::read_from(master.try_clone().unwrap());
    OnTerminal { child, master, out }
}

/// `tty_nr` of /proc/PID/stat (field 7).
fn tty_nr(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..]
        .split_whitespace()
        .nth(4)?
        .parse()
        .ok()
}

const PERL_TERMINAL: &str = r#"$| = 1; $SIG{WINCH} = sub { print "size ", `stty size` }; print "tty ", `tty`; print "size ", `stty size`; print "pid $$\n"; sleep 1 while 1"#;

#[test]
fn the_pty_is_the_controlling_terminal_has_the_callers_size_follows_it_and_gets_its_keys() {
    let root = TestRoot::new();
    let c = ctx(&root, "term");
    let mut t = on_terminal(
        &root,
        Size {
            cols: 100,
            rows: 33,
        },
        &["term", "--pty", "--", "perl", "-e", PERL_TERMINAL],
    );
    let tty = t.out.wait_for("the workload's tty", |l| {
        l.strip_prefix("tty ").map(String::from)
    });
    let pid: i32 = t.out.wait_for("the workload's pid", |l| {
        l.strip_prefix("pid ")?.parse().ok()
    });
    ensure!(c, tty.starts_with("/dev/pts/"), "tty says {tty:?}");
    ensure!(
        c,
        t.out.lines().iter().any(|(_, l)| l == "size 33 100"),
        "the pty does not have the caller's size: {:?}",
        t.out.lines()
    );
    // The terminal `tty` names is the workload's controlling terminal, and not the wrapper's.
    let rdev = std::fs::metadata(&tty).unwrap().rdev();
    c.eq(&tty_nr(pid), &Some(rdev), "tty_nr(pid)");
    let st = root.status("term");
    c.eq(&st["pid"], pid, "st[\"pid\"]");
    let (_, _, pgid, sid, _) = proc_stat(pid).unwrap();
    c.eq(&(pgid, sid), &(pid, pid), "(pgid, sid)");
    ensure!(
        c,
        tty_nr(t.child.id() as i32) != Some(rdev),
        "tty_nr(t.child.id() as i32) != Some(rdev): both {:?}",
        tty_nr(t.child.id() as i32)
    );

    // The caller's terminal changes size: the workload hears of it (SIGWINCH) and sees it.
    pty::set_size(
        t.master.as_fd(),
        Size {
            cols: 120,
            rows: 40,
        },
    )
    .unwrap();
    t.out.wait_for("the new size inside", |l| {
        (l == "size 40 120").then_some(())
    });

    // Ctrl-C typed at the caller's terminal: raw mode there, so it is a byte for the workload's
    // pty, whose line discipline makes it the workload's SIGINT; the wrapper is not signalled.
    t.master.write_all(b"\x03").unwrap();
    let status = wait_child(&mut t.child, LONG);
    let st = root.wait_final("term", LONG);
    c.eq(
        &(
            st["state"].as_str(),
            st["term_signal"].as_str(),
            exit_code(&status),
        ),
        &(Some("finished"), Some("INT"), 130),
        "( st[\"state\"].as_str(), st[\"term_signal\"].as_str(), exit_code(&status) )",
    );
    // The caller's terminal is back as it was (canonical, echoing).
    ensure!(
        c,
        pty::is_cooked(t.master.as_fd()),
        "the caller's terminal was left raw"
    );
}

// ---------------------------------------------------------------------------------------------
// Stopping a pty run

/// `start -d --pty ID EXTRA -- sh -c 'echo ready; exec CMD'`, then the workload's pid once it
/// said ready.
fn start_detached(root: &TestRoot, id: &str, extra: &[&str], cmd: &str) -> i32 {
    let mut args = vec!["start", "-d", "--pty"];
    args.extend(extra);
    let script = format!("echo ready; exec {cmd}");
    args.extend([id, "--", "sh", "-c", &script]);
    ctx(root, id).ctl(&args, 0);
    wait_ready(root, id)
}

fn wait_ready(root: &TestRoot, id: &str) -> i32 {
    let log = root.run_dir(id).join("stdout.log");
    wait_until(&format!("ready in {}", log.display()), LONG, || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("ready").then_some(())
    });
    // The workload can write before the wrapper's `running` record names it.
    wait_until(&format!("a pid in {id}'s record"), LONG, || {
        root.try_status(id).ok()?["pid"].as_i64().map(|p| p as i32)
    })
}

/// Everything that belongs to the run: its session, and its keeper when the journal names one.
fn pin_run(root: &TestRoot, id: &str, sid: i32) -> Pinned {
    let c = ctx(root, id);
    let mut pids = session_members(sid);
    pids.extend(keeper_pid(root, id));
    ensure!(c, !pids.is_empty(), "!pids.is_empty()");
    Pinned::new(&pids)
}

/// The keeper's pid, from the journal's `keeper_started`.
fn keeper_pid(root: &TestRoot, id: &str) -> Option<i32> {
    root.events(id)
        .iter()
        .find(|e| e["event"] == "keeper_started")
        .and_then(|e| e["pid"].as_i64())
        .map(|p| p as i32)
}

/// The final record says cancelled for `reason`, with a confirmed cleanup, and nothing of the
/// run is left: not its session, not its keeper, not a member of its cgroup.
fn assert_stopped(root: &TestRoot, id: &str, sid: i32, pinned: &Pinned, reason: &str) -> Value {
    let c = ctx(root, id);
    let st = root.wait_final(id, LONG);
    c.fields(&st, "the final record", ended("cancelled", reason));
    c.eq(
        &st["cleanup"]["survivors"],
        &serde_json::json!([]),
        "st[\"cleanup\"][\"survivors\"]",
    );
    if let Err(alive) = pinned.wait_all_gone(LONG) {
        c.fail(format_args!("still alive: {alive:?}"));
    }
    c.eq(
        &session_members(sid),
        &Vec::<i32>::new(),
        "session_members(sid)",
    );
    if let Some(cg) = st["containment"]["cgroup"].as_str() {
        let procs = std::fs::read_to_string(format!("{cg}/cgroup.procs")).unwrap_or_default();
        ensure!(c, procs.trim().is_empty(), "cgroup {cg} holds {procs}");
    }
    c.eq(&st["pty"], true, "st[\"pty\"]");
    st
}

fn cancel(root: &TestRoot, id: &str) {
    let c = ctx(root, id);
    let mut cmd = root.cmd();
    cmd.args(["cancel", id]);
    run_ok(c, &mut cmd);
}

#[test]
fn a_detached_pty_run_stopped_by_cancel_leaves_nothing() {
    let root = TestRoot::new();
    let pid = start_detached(&root, "c", &[], "sleep 300");
    let pinned = pin_run(&root, "c", pid);
    cancel(&root, "c");
    assert_stopped(&root, "c", pid, &pinned, "cancel_request");
}

#[test]
fn a_pty_run_stopped_by_its_lease_leaves_nothing() {
    let root = TestRoot::new();
    let pid = start_detached(&root, "l", &["--lease", "1s"], "sleep 300");
    let pinned = pin_run(&root, "l", pid);
    assert_stopped(&root, "l", pid, &pinned, "lease_expired");
}

#[test]
fn an_interactive_bash_under_pty_is_cancelled_like_one_without() {
    let root = TestRoot::new();
    let pid = start_detached(&root, "bash", &[], "bash --norc --noprofile -i");
    // bash -i is at its prompt on the pty, ignoring TERM.
    wait_until("bash -i at its prompt", LONG, || {
        let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (c.trim() == "bash").then_some(())
    });
    let pinned = pin_run(&root, "bash", pid);
    cancel(&root, "bash");
    let st = assert_stopped(&root, "bash", pid, &pinned, "cancel_request");
    let signals = strs(&st["cleanup"]["signals"]).expect("cleanup.signals is an array");
    ensure!(
        ctx(&root, "bash"),
        signals.len() > 1,
        "bash -i ignores TERM, so TERM alone cannot have stopped it: {signals:?}"
    );
}

/// A foreground pty run whose wrapper is SIGKILLed; returns (workload pid, its pinned tree).
fn orphaned_pty_run(root: &TestRoot, id: &str) -> (i32, Pinned) {
    let c = ctx(root, id);
    let w = Spawned::wrapper(
        root,
        &[id, "--pty", "--", "sh", "-c", "echo ready; exec sleep 300"],
    );
    let pid = wait_ready(root, id);
    let pinned = pin_run(root, id, pid);
    w.signal(libc::SIGKILL);
    let out = w.finish(LONG);
    c.eq(
        &out.status.signal_number(),
        &Some(libc::SIGKILL),
        "out.status.signal_number()",
    );
    // The output path does not depend on the wrapper: the workload still runs, on its pty.
    ensure!(
        c,
        pinned.alive().contains(&pid),
        "the workload after its wrapper was killed"
    );
    (pid, pinned)
}

/// Runs `cmd` to completion; it must exit 0.
fn run_ok(c: Ctx<'_>, cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let out = run_with_timeout(cmd, LONG);
    c.code(&out, 0, &what);
    out
}

trait SignalNumber {
    fn signal_number(&self) -> Option<i32>;
}

impl SignalNumber for std::process::ExitStatus {
    fn signal_number(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.signal()
    }
}

#[test]
fn a_pty_run_whose_wrapper_was_killed_is_stopped_by_the_watchdog_and_leaves_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "wd");
    let (pid, pinned) = orphaned_pty_run(&root, "wd");
    let mut cmd = root.watchdog_cmd();
    cmd.args(["--once", "--orphan-grace", "0s"]);
    run_ok(c, &mut cmd);
    let st = root.wait_final("wd", LONG);
    ensure!(
        c,
        FINAL_STATES.contains(&st["state"].as_str().unwrap()),
        "FINAL_STATES.contains(&st[\"state\"].as_str().unwrap())"
    );
    assert_stopped(
        &root,
        "wd",
        pid,
        &pinned,
        st["reason"].as_str().unwrap_or("?"),
    );
}

#[test]
fn a_pty_run_whose_wrapper_was_killed_is_stopped_by_cancel_and_leaves_nothing() {
    let root = TestRoot::new();
    let (pid, pinned) = orphaned_pty_run(&root, "wc");
    cancel(&root, "wc");
    assert_stopped(&root, "wc", pid, &pinned, "cancel_request");
}

/// The keeper's pid from the journal, checked against /proc (it is `agent-run __keep`), pinned.
fn pinned_keeper(root: &TestRoot, id: &str) -> (i32, Pinned) {
    let c = ctx(root, id);
    let k = keeper_pid(root, id).unwrap_or_else(|| c.fail("no keeper_started"));
    let pinned = Pinned::new(&[k]);
    // Forked after the spawn, the keeper names itself in its first steps, which may still be
    // ahead of it when the run is recorded running.
    c.wait("the keeper to name itself", || {
        let cmdline = std::fs::read(format!("/proc/{k}/cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).any(|w| w == b"__keep") {
            Ok(())
        } else {
            Err(format!(
                "pid {k} is not (yet) the keeper: {:?}",
                String::from_utf8_lossy(&cmdline)
            ))
        }
    });
    (k, pinned)
}

#[test]
fn a_dead_keeper_stops_the_pty_run_with_a_reason_and_leaves_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "kl");
    let w = Spawned::wrapper(
        &root,
        &[
            "kl",
            "--pty",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 300",
        ],
    );
    let pid = wait_ready(&root, "kl");
    let pinned = pin_run(&root, "kl", pid);
    let (k, keeper) = pinned_keeper(&root, "kl");
    keeper.signal(k, libc::SIGKILL).unwrap();
    let out = w.finish(LONG);
    let st = assert_stopped(&root, "kl", pid, &pinned, "keeper_lost");
    c.eq(&exit_code(&out.status), &143, format_args!("{st}"));
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("output keeper"),
        "the wrapper did not say why: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = root.event_names("kl");
    ensure!(
        c,
        names.iter().filter(|n| *n == "keeper_lost").count() == 1,
        "one keeper_lost line (the stop's reason, not again at the record): {names:?}"
    );
}

#[test]
fn closing_the_master_hangs_up_the_session_with_no_one_left_to_stop_it() {
    // The wrapper is SIGKILLed, then the keeper: the last descriptor of the master is closed
    // and the kernel hangs up the pty. SIGHUP reaches the session, which ends by itself.
    let root = TestRoot::new();
    let c = ctx(&root, "hup");
    let (pid, pinned) = orphaned_pty_run(&root, "hup");
    let (k, keeper) = pinned_keeper(&root, "hup");
    keeper.signal(k, libc::SIGKILL).unwrap();
    if let Err(alive) = pinned.wait_all_gone(LONG) {
        c.fail(format_args!(
            "the session outlived its pty's master: {alive:?}"
        ));
    }
    c.eq(
        &session_members(pid),
        &Vec::<i32>::new(),
        "session_members(pid)",
    );
    // Nobody stopped it, so nobody can claim a cleanup: the record says what is known.
    let mut cmd = root.cmd();
    cmd.args(["cancel", "hup"]);
    let out = run_with_timeout(&mut cmd, LONG);
    c.eq(
        &exit_code(&out.status),
        &0,
        format_args!("{}", describe_output("cancel", &out)),
    );
    let st = root.wait_final("hup", LONG);
    ensure!(
        c,
        ["unknown", "cancelled"].contains(&st["state"].as_str().unwrap_or("")),
        "{st}"
    );
}
