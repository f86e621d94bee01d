//! The output path: pipes drained by the keeper into stdout.log/stderr.log (issue 14).
//!
//! Every idiom that reopens stdout or stderr by path keeps every byte, in the log and in the
//! stream, also when the wrapper is SIGKILLed and `cancel` or the watchdog finishes the run; the
//! cap keeps the log's beginning, a marker and its end, and counts what it dropped; `stop` ends
//! the run `cancelled`/`output_limit` with nothing left; a full tmpfs keeps other runs' records.
//! The keeper is never the run's (session, cgroup, marker) and ends by EOF, never by a signal.
//! Run ids start with `out-`.

use agent_run_tests::facts::{ended, epoch_of, make_fifo};
use agent_run_tests::{
    ctx, describe_output, ensure, proc_stat, run_with_timeout, wait_until_dbg, Ctx, Pinned,
    Spawned, TestRoot,
};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

fn run(root: &TestRoot, args: &[&str]) -> Output {
    run_with_timeout(root.cmd().args(args), LONG)
}

/// Our own `agent-run: ...` lines out of a captured stderr: the workload's bytes are left.
fn strip_messages(stderr: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = stderr;
    while !rest.is_empty() {
        let line_end = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |n| n + 1);
        let (line, tail) = rest.split_at(line_end);
        if !line.starts_with(b"agent-run: ") {
            out.extend_from_slice(line);
        }
        rest = tail;
    }
    out
}

fn log(root: &TestRoot, id: &str, name: &str) -> Vec<u8> {
    fs::read(root.run_dir(id).join(name)).unwrap_or_default()
}

/// The record `st` ended (`ended_at`) less than 1.5 s after `from` (epoch seconds).
fn ended_within_1_5_s(c: Ctx, st: &Value, from: Option<f64>, what: &str) {
    let to = epoch_of(st["ended_at"].as_str().unwrap_or_default());
    ensure!(
        c,
        matches!((from, to), (Some(a), Some(b)) if b - a < 1.5),
        "{what} (at {from:?} and {to:?})"
    );
}

fn counts(st: &Value, stream: &str) -> (u64, u64) {
    let c = &st["output"][stream];
    (
        c["written"]
            .as_u64()
            .unwrap_or_else(|| panic!("no {stream} written in {st}")),
        c["dropped"]
            .as_u64()
            .unwrap_or_else(|| panic!("no {stream} dropped in {st}")),
    )
}

/// The final record carries the keeper's own counts (`complete`), stdout's as `stdout`.
fn keepers_counts(root: &TestRoot, id: &str, stdout: (u64, u64)) {
    let c = ctx(root, id);
    let st = root.status(id);
    c.eq(
        &st["output"]["complete"],
        true,
        "st[\"output\"][\"complete\"]",
    );
    c.eq(counts(&st, "stdout"), stdout, "stdout written, dropped");
}

/// The keeper's identity from the journal's `keeper_started`.
fn keeper_of(root: &TestRoot, id: &str) -> (i32, u64) {
    let c = ctx(root, id);
    let ev = root
        .events(id)
        .into_iter()
        .find(|e| e["event"] == "keeper_started")
        .unwrap_or_else(|| c.fail(format_args!("no keeper_started event for {id}")));
    (
        ev["pid"].as_i64().unwrap() as i32,
        ev["start_ticks"].as_u64().unwrap(),
    )
}

/// An idiom: (name, script, expected stdout.log, expected stderr.log).
type Idiom = (&'static str, String, Vec<u8>, Vec<u8>);

/// The idioms. `$F` is a 100 KiB file of known bytes.
fn idioms(f: &Path) -> Vec<Idiom> {
    let data = fs::read(f).unwrap();
    let with = |pre: &[u8], mid: &[u8], post: &[u8]| [pre, mid, post].concat();
    vec![
        (
            "> /dev/stderr",
            "echo line1 >&2; echo line2 >&2; echo 'err via /dev/stderr' > /dev/stderr; echo line4 >&2".into(),
            Vec::new(),
            b"line1\nline2\nerr via /dev/stderr\nline4\n".to_vec(),
        ),
        (
            "exec 2>/dev/stderr",
            "echo a >&2; exec 2>/dev/stderr; echo b >&2; echo c >&2".into(),
            Vec::new(),
            b"a\nb\nc\n".to_vec(),
        ),
        (
            "tee /dev/stdout",
            "echo x; echo y | tee /dev/stdout; echo z".into(),
            b"x\ny\ny\nz\n".to_vec(),
            Vec::new(),
        ),
        (
            "cp f /dev/stdout",
            format!("echo pre; cp {} /dev/stdout; echo post", f.display()),
            with(b"pre\n", &data, b"post\n"),
            Vec::new(),
        ),
        (
            "dd of=/dev/stdout",
            format!(
                "echo pre; dd if={} of=/dev/stdout bs=4096 status=none; echo post",
                f.display()
            ),
            with(b"pre\n", &data, b"post\n"),
            Vec::new(),
        ),
    ]
}

/// The [`idioms`] with `$F` written in the test's directory, each with the id of a run of its
/// own, `PREFIX-N`: (id, idiom).
fn idiom_runs(root: &TestRoot, prefix: &str) -> Vec<(String, Idiom)> {
    let f = root.dir.path().join("data");
    let bytes: Vec<u8> = (0..100 * 1024u32).map(|i| (i % 251) as u8).collect();
    fs::write(&f, bytes).unwrap();
    let ided = |(i, idiom)| (format!("{prefix}-{i}"), idiom);
    idioms(&f).into_iter().enumerate().map(ided).collect()
}

#[test]
fn every_idiom_that_reopens_stdout_or_stderr_keeps_every_byte_in_the_log_and_the_stream() {
    let root = TestRoot::new();
    for (id, (name, script, out, err)) in idiom_runs(&root, "out-idiom") {
        let c = ctx(&root, &id);
        let o = run(&root, &[&id, "--", "bash", "-c", &script]);
        let what = format!("{name}: agent-run {id}");
        c.code(&o, 0, &what);
        every_byte_once(c, name, &out, &err);
        // The stream (the wrapper's own stdout/stderr) carries the same bytes, once.
        c.eq(&o.stdout, &out, format_args!("{name}: streamed stdout"));
        c.eq(
            &strip_messages(&o.stderr),
            &err,
            format_args!("{name}: streamed stderr"),
        );
    }
}

/// The run's logs hold `out` and `err` and its final record counts every byte of them as
/// written, none dropped, with the keeper's own counts.
fn every_byte_once(c: Ctx<'_>, name: &str, out: &[u8], err: &[u8]) {
    let st = c.status();
    for (log, want) in [("stdout.log", out), ("stderr.log", err)] {
        c.eq(c.bytes(log), want, format_args!("{name}: {log}"));
    }
    c.eq(
        &st["output"]["complete"],
        true,
        format_args!("{name}: {st}"),
    );
    for (stream, want) in [("stdout", out), ("stderr", err)] {
        let counts = counts(&st, stream);
        c.eq(
            counts,
            (want.len() as u64, 0),
            format_args!("{name}: {stream} counts"),
        );
    }
}

/// Start a run that writes `script`'s first part, waits for `go`, runs the idiom, then says
/// `written` and parks; SIGKILL its wrapper before `go`.
fn killed_wrapper_run(root: &TestRoot, id: &str, idiom: &str) -> (Spawned, Pinned, PathBuf) {
    let go = root.dir.path().join(format!("{id}.go"));
    let done = root.dir.path().join(format!("{id}.done"));
    let script = format!(
        "echo before; echo before-err >&2; while [ ! -e {go} ]; do sleep 0.02; done; {idiom}; echo after; : > {done}; exec sleep 600",
        go = go.display(),
        done = done.display()
    );
    let w = Spawned::wrapper(root, &[id, "--", "bash", "-c", &script]);
    let st = wait_until_dbg("the run to be running", LONG, || {
        let st = root.try_status(id)?;
        (st["state"] == "running")
            .then_some(st.clone())
            .ok_or(st.to_string())
    });
    let leader = st["pid"].as_i64().unwrap() as i32;
    agent_run_tests::remote::wait_for_text("before-err", LONG, || w.stderr_so_far());
    let pin = Pinned::new(&[w.child.id() as i32, leader]);
    pin.signal(w.child.id() as i32, libc::SIGKILL).unwrap();
    wait_until_dbg("the wrapper to die", LONG, || {
        proc_stat(w.child.id() as i32)
            .filter(|s| s.0 != 'Z')
            .map_or(Ok(()), Err)
    });
    fs::write(&go, b"").unwrap();
    wait_until_dbg("the idiom to be written", LONG, || {
        done.exists().then_some(()).ok_or(())
    });
    (w, pin, done)
}

#[test]
fn with_the_wrapper_sigkilled_the_keeper_drains_on_and_cancel_or_the_watchdog_records_the_counts() {
    let root = TestRoot::new();
    for (i, (id, (name, script, out, err))) in idiom_runs(&root, "out-kill").into_iter().enumerate()
    {
        let c = ctx(&root, &id);
        let (w, pin, _) = killed_wrapper_run(&root, &id, &script);
        let (keeper, ticks) = keeper_of(&root, &id);
        c.eq(
            &proc_stat(keeper).map(|s| s.4),
            &Some(ticks),
            format_args!("{name}: the keeper lives"),
        );
        // Half finished by cancel, half by the watchdog.
        let o = if i % 2 == 0 {
            run(&root, &["cancel", &id])
        } else {
            run_with_timeout(
                root.watchdog_cmd().args(["--once", "--orphan-grace", "0"]),
                LONG,
            )
        };
        c.code(&o, 0, name);
        c.wait_final();
        let out = [b"before\n".as_slice(), &out, b"after\n"].concat();
        let err = [b"before-err\n".as_slice(), &err].concat();
        every_byte_once(c, name, &out, &err);
        // The stream resumes from the log: `logs` shows the same bytes.
        let o = run(&root, &["logs", &id]);
        c.eq(&o.stdout, &out, format_args!("{name}: logs"));
        // The keeper ended by EOF (its own record of it), never signalled by anyone.
        let ev = root.events(&id);
        ensure!(
            c,
            ev.iter()
                .any(|e| e["event"] == "keeper_done" && e["by_pid"] == keeper),
            "{name}: no keeper_done: {ev:?}"
        );
        ensure!(
            c,
            !ev.iter().any(|e| e["event"] == "signal"
                && e["target"].as_str() == Some(&format!("pid:{keeper}"))),
            "{name}: the keeper was signalled: {ev:?}"
        );
        let _ = w.finish(LONG);
        c.wait_gone_within(&pin, LONG, "the run's processes");
    }
}

#[test]
fn the_keeper_is_not_the_runs_and_ends_by_eof() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-keeper");
    let go = root.dir.path().join("go");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; echo bye",
        go.display()
    );
    let w = Spawned::wrapper(&root, &["out-keeper", "--", "sh", "-c", &script]);
    let st = wait_until_dbg("running", LONG, || {
        let st = root.try_status("out-keeper")?;
        (st["state"] == "running")
            .then_some(st.clone())
            .ok_or(st.to_string())
    });
    let (keeper, _) = keeper_of(&root, "out-keeper");
    let leader = st["pid"].as_i64().unwrap() as i32;
    // Its session is its first step, which may still be ahead of it when the run is recorded
    // running (it is forked after the spawn, and kept off the wrapper's CPU until its go).
    let (_, ppid, pgid, sid, _) = wait_until_dbg("the keeper's own session", LONG, || {
        match proc_stat(keeper) {
            Some(s) if s.3 == keeper => Ok(s),
            s => Err(format!("{s:?}")),
        }
    });
    c.eq(&(pgid, sid), &(keeper, keeper), "its own session and group");
    ensure!(c, sid != leader, "sid != leader: both {:?}", sid);
    c.eq(&ppid, &(w.child.id() as i32), "the wrapper's child");
    // Not in the run's cgroup: in the wrapper's.
    let cg = |p: i32| fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap_or_default();
    c.eq(
        &cg(keeper),
        &cg(w.child.id() as i32),
        "the wrapper's cgroup",
    );
    if st["containment"]["mode"] == "cgroup" {
        ensure!(
            c,
            cg(keeper) != cg(leader),
            "never the run's cgroup: both {:?}",
            cg(keeper)
        );
    }
    let env = fs::read(format!("/proc/{keeper}/environ")).unwrap();
    ensure!(
        c,
        !env.split(|&b| b == 0)
            .any(|v| v.starts_with(b"AGENT_RUN_ID=") || v.starts_with(b"AGENT_RUN_DIR=")),
        "the keeper carries no run marker"
    );
    // Its descriptors: stdio on /dev/null, the two pipes' read ends, the write end of the
    // streamer's wake-up pipe (non-blocking: a stalled streamer never blocks it), the two
    // logs; never the lock. The set is read once it is draining.
    let keeper_fds = || -> Vec<(String, u32)> {
        fs::read_dir(format!("/proc/{keeper}/fd"))
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let link = fs::read_link(e.path()).ok()?.display().to_string();
                let info = fs::read_to_string(format!(
                    "/proc/{keeper}/fdinfo/{}",
                    e.file_name().to_string_lossy()
                ))
                .ok()?;
                let flags = info
                    .lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())?;
                Some((link, flags))
            })
            .collect()
    };
    let accmode = |f: u32| f & libc::O_ACCMODE as u32;
    let count_pipes = |fds: &[(String, u32)], mode: i32| {
        fds.iter()
            .filter(|(p, f)| p.starts_with("pipe:") && accmode(*f) == mode as u32)
            .count()
    };
    let fds = wait_until_dbg("the keeper to drain", LONG, || {
        let fds = keeper_fds();
        let journal = fds.iter().any(|(p, _)| p.ends_with("/events.jsonl"));
        (journal && count_pipes(&fds, libc::O_RDONLY) == 2)
            .then_some(fds.clone())
            .ok_or(fds)
    });
    ensure!(c, !fds.iter().any(|(p, _)| p.ends_with("/lock")), "{fds:?}");
    let pipes = |mode: i32| count_pipes(&fds, mode);
    c.eq(&pipes(libc::O_RDONLY), &2, format_args!("{fds:?}"));
    c.eq(&pipes(libc::O_WRONLY), &1, format_args!("{fds:?}"));
    ensure!(
        c,
        fds.iter().any(|(p, f)| p.starts_with("pipe:")
            && accmode(*f) == libc::O_WRONLY as u32
            && f & libc::O_NONBLOCK as u32 != 0),
        "the wake-up pipe is non-blocking: {fds:?}"
    );
    c.eq(
        &fds.iter().filter(|(p, _)| p.ends_with(".log")).count(),
        &2,
        format_args!("{fds:?}"),
    );
    ensure!(
        c,
        fds.iter().any(|(p, _)| p.ends_with("/output.idx")),
        "the order index is the keeper's: {fds:?}"
    );
    c.eq(
        &fds.len(),
        &(3 + 5 + 1 + 1),
        format_args!("stdio, 5 passed, the journal, output.idx: {fds:?}"),
    );
    let pin = Pinned::new(&[keeper]);
    fs::write(&go, b"").unwrap();
    let o = w.finish(LONG);
    c.code(&o, 0, "out-keeper");
    c.wait_gone_within(&pin, LONG, "the keeper");
    c.eq(
        log(&root, "out-keeper", "stdout.log"),
        b"bye\n",
        "log(&root, \"out-keeper\", \"stdout.log\")",
    );
    ensure!(c, root
        .events("out-keeper")
        .iter()
        .any(|e| e["event"] == "keeper_done" && e["error"].is_null()), "root .events(\"out-keeper\") .iter() .any(|e| e[\"event\"] == \"keeper_done\" && e[\"error\"].is_null())");
}

/// The keeper is a fork of the wrapper without an exec: checked on /proc while it runs, it is
/// one thread, ignores INT, HUP and TERM (SIG_IGN: no handler, no mask), names itself
/// (`agent-run __keep DIR`, comm `agent-run-keep`), shares no descriptor with the wrapper but
/// the pipes' read ends, and outlives INT, HUP and TERM sent to it, draining to the end.
#[test]
fn the_forked_keeper_ignores_int_hup_term_names_itself_and_keeps_draining() {
    let root = TestRoot::new();
    let go = root.dir.path().join("go");
    let script = format!(
        "echo before; while [ ! -e {} ]; do sleep 0.02; done; echo after",
        go.display()
    );
    let w = Spawned::wrapper(&root, &["out-fork", "--", "sh", "-c", &script]);
    wait_until_dbg("running", LONG, || {
        let st = root.try_status("out-fork")?;
        (st["state"] == "running")
            .then_some(())
            .ok_or(st.to_string())
    });
    let (keeper, _) = keeper_of(&root, "out-fork");
    // Forked after the spawn and kept off the wrapper's CPU until its go, the keeper may not
    // have run its first steps yet when the run is recorded running: its title is the last of
    // them (after its signals and its name).
    let dir = root.run_dir("out-fork");
    let title = [
        b"agent-run".as_slice(),
        b"__keep",
        dir.as_os_str().as_encoded_bytes(),
    ]
    .join(&0u8);
    wait_until_dbg("the keeper's first steps", LONG, || {
        let cmdline = fs::read(format!("/proc/{keeper}/cmdline")).unwrap_or_default();
        cmdline
            .starts_with(&title)
            .then_some(())
            .ok_or(String::from_utf8_lossy(&cmdline).into_owned())
    });
    let status = fs::read_to_string(format!("/proc/{keeper}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {name} in {status}"))
    };
    let mask = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
    let bit = |sig: i32| 1u64 << (sig - 1);
    assert_eq!(field("Threads:"), "1", "{status}");
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM, libc::SIGPIPE] {
        assert_ne!(
            mask("SigIgn:") & bit(sig),
            0,
            "signal {sig} ignored: {status}"
        );
    }
    assert_eq!(mask("SigCgt:"), 0, "no handler of the wrapper's: {status}");
    assert_eq!(mask("SigBlk:"), 0, "no mask: {status}");
    let comm = fs::read_to_string(format!("/proc/{keeper}/comm")).unwrap();
    assert_eq!(comm.trim_end(), "agent-run-keep");
    let cmdline = fs::read(format!("/proc/{keeper}/cmdline")).unwrap();
    let words: Vec<&[u8]> = cmdline
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .collect();
    assert_eq!(
        words,
        [
            b"agent-run".as_slice(),
            b"__keep",
            dir.as_os_str().as_encoded_bytes()
        ],
        "{:?}",
        String::from_utf8_lossy(&cmdline)
    );
    // No descriptor of the wrapper's but the pipes (same inode), and none is its lock.
    let links = |p: u32| -> Vec<String> {
        fs::read_dir(format!("/proc/{p}/fd"))
            .unwrap()
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .map(|p| p.display().to_string())
            .collect()
    };
    let ours = links(keeper as u32);
    let wrapper = links(w.child.id());
    assert!(wrapper.iter().any(|p| p.ends_with("/lock")), "{wrapper:?}");
    for p in &ours {
        assert!(
            p == "/dev/null" || p.starts_with("pipe:") || p.starts_with(&dir.display().to_string()),
            "the keeper holds {p}: {ours:?}"
        );
        assert!(!p.ends_with("/lock"), "{ours:?}");
    }
    let pin = Pinned::new(&[keeper]);
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM] {
        pin.signal(keeper, sig).unwrap();
    }
    // Still draining: the run's next line reaches the log after the signals.
    fs::write(&go, b"").unwrap();
    let o = w.finish(LONG);
    assert!(o.status.success(), "{}", describe_output("out-fork", &o));
    pin.wait_all_gone(LONG).expect("the keeper ends by EOF");
    assert_eq!(log(&root, "out-fork", "stdout.log"), b"before\nafter\n");
    assert_eq!(root.status("out-fork")["output"]["complete"], true);
}

/// `CMD --quiet OPTS ID -- head -c BYTES /dev/zero` to its end within `limit`, exit 0: the
/// record.
fn write_zeros(c: Ctx, mut cmd: Command, opts: &[&str], bytes: &str, limit: Duration) -> Value {
    let args = ["--", "head", "-c", bytes, "/dev/zero"];
    cmd.arg("--quiet").args(opts).arg(c.id).args(args);
    let o = run_with_timeout(&mut cmd, limit);
    c.code(&o, 0, c.id);
    c.root.status(c.id)
}

#[test]
fn a_ten_gib_writer_against_a_small_cap_keeps_cap_plus_markers_and_counts_the_rest() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-10g");
    let cap: u64 = 1 << 20;
    // 10 GiB through a pipe takes seconds on an idle machine, minutes on two loaded cores.
    let st = write_zeros(
        c,
        root.cmd(),
        &["--max-output", "1M"],
        "10G",
        Duration::from_secs(900),
    );
    let (written, dropped) = counts(&st, "stdout");
    let ring = cap / 8;
    c.eq(&written, &(cap + ring), format_args!("{st}"));
    c.eq(&(written + dropped), &(10 << 30), format_args!("{st}"));
    c.eq(
        &st["output"]["stdout"]["capped"],
        "max_output",
        "st[\"output\"][\"stdout\"][\"capped\"]",
    );
    c.eq(&st["output"]["limit"], cap, "st[\"output\"][\"limit\"]");
    let bytes = log(&root, "out-10g", "stdout.log");
    let marker = b"\n[agent-run: stdout reached --max-output 1048576 bytes; further bytes are dropped and counted]\n";
    c.eq(
        &bytes[cap as usize..cap as usize + marker.len()],
        marker,
        "&bytes[cap as usize..cap as usize + marker.len()]",
    );
    let second = format!(
        "\n[agent-run: stdout: {dropped} bytes dropped above; the last {ring} bytes follow]\n"
    );
    let at = cap as usize + marker.len();
    c.eq(
        &&bytes[at..at + second.len()],
        &second.as_bytes(),
        "&bytes[at..at + second.len()]",
    );
    c.eq(
        &(bytes.len() as u64),
        &(written + (marker.len() + second.len()) as u64),
        "bytes.len() as u64",
    );
    ensure!(
        c,
        bytes[..cap as usize].iter().all(|&b| b == 0),
        "bytes[..cap as usize].iter().all(|&b| b == 0)"
    );
    // attach shows the same marker.
    let a = run(&root, &["attach", "out-10g"]);
    c.eq(
        &a.stdout,
        &bytes,
        "attach streams the log, markers included",
    );
}

/// A shell and its sleeper, and a writer of 4 MiB that ignores TERM and HUP, so it writes all
/// of it whatever the stop's speed, and the counts are exact: the cap, the kept tail (cap/8),
/// and the rest dropped. KILL comes only at the grace (5 s); the writer is done in
/// milliseconds. The shell and the sleeper die by the TERM.
const WRITER_DEAF_TO_TERM: &str =
    "sleep 600 & echo $$ $! > \"$1\"; (trap '' TERM HUP; exec head -c 4M /dev/zero); wait";

/// `--quiet --max-output 2M --on-output-limit=stop ID -- sh -c SCRIPT sh PIDS`, to its end:
/// SCRIPT writes its pids to "$1", the file PIDS. It must exit 143 (stopped at its cap): the
/// record, and PIDS.
fn run_capped_at_2m_with_stop(c: Ctx, script: &str) -> (Value, PathBuf) {
    let pids = c.root.dir.path().join("pids");
    let pids_arg = pids.to_str().expect("a UTF-8 temporary path");
    let opts = ["--quiet", "--max-output", "2M", "--on-output-limit=stop"];
    let args: Vec<&str> = opts
        .into_iter()
        .chain([c.id, "--", "sh", "-c", script, "sh", pids_arg])
        .collect();
    c.code(&run(c.root, &args), 143, c.id);
    (c.root.status(c.id), pids)
}

#[test]
fn on_output_limit_stop_ends_the_run_cancelled_output_limit_with_nothing_left() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-stop");
    let (st, pids) = run_capped_at_2m_with_stop(c, WRITER_DEAF_TO_TERM);
    c.fields(&st, &format!("{st}"), ended("cancelled", "output_limit"));
    c.eq(
        &st["output"]["complete"],
        true,
        "st[\"output\"][\"complete\"]",
    );
    let (written, dropped) = counts(&st, "stdout");
    c.eq(&written, &((2 << 20) + (2 << 20) / 8), "written");
    c.eq(
        &dropped,
        &((4 << 20) - (2 << 20) - (2 << 20) / 8),
        "dropped: the writer's 4 MiB less the written",
    );
    for p in fs::read_to_string(&pids).unwrap().split_whitespace() {
        let p: i32 = p.parse().unwrap();
        ensure!(
            c,
            proc_stat(p).is_none_or(|s| s.0 == 'Z'),
            "pid {p} of the run is left"
        );
    }
    if let Some(cg) = st["containment"]["cgroup"].as_str() {
        let procs = fs::read_to_string(Path::new(cg).join("cgroup.procs")).unwrap_or_default();
        ensure!(c, procs.trim().is_empty(), "the run's cgroup holds {procs}");
    }
    let (keeper, _) = keeper_of(&root, "out-stop");
    c.wait_gone_within(&Pinned::new(&[keeper]), LONG, "the keeper");
    // The stop never touched the keeper: it asked for the stop, then ended by EOF.
    let ev = root.events("out-stop");
    ensure!(
        c,
        ev.iter()
            .any(|e| e["event"] == "signal" && e["reason"] == "output_limit"),
        "{ev:?}"
    );
    ensure!(
        c,
        !ev.iter()
            .any(|e| e["event"] == "signal"
                && e["target"].as_str() == Some(&format!("pid:{keeper}"))),
        "the keeper was signalled: {ev:?}"
    );
    ensure!(c, ev
        .iter()
        .any(|e| e["event"] == "keeper_done" && e["by_pid"] == keeper && e["error"].is_null()), "ev .iter() .any(|e| e[\"event\"] == \"keeper_done\" && e[\"by_pid\"] == keeper && e[\"error\"].is_null())");
    // The keeper asks and goes on: the final record does not wait out the wrapper's keeper
    // wait (2 s), as it did while the keeper's stop thread waited for that record.
    let at = |what: &str| {
        ev.iter()
            .find(|e| e["event"] == what)
            .and_then(|e| epoch_of(e["ts"].as_str()?))
    };
    ended_within_1_5_s(
        c,
        &st,
        at("stop_requested"),
        "the stop asked, then ended: held up by the keeper's wait",
    );
}

/// The run plants a cancel.json before its cap: the keeper's request finds one there, and it
/// still signals its wrapper (a second later, the record still saying running) instead of
/// taking the planted file for a stop under way. Without that, the run would go on to its own
/// end (`finished`, 30 s later).
#[test]
fn a_planted_cancel_request_does_not_turn_off_the_output_limit_stop() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-planted");
    let (st, pids) = run_capped_at_2m_with_stop(
        c,
        "printf x > \"$AGENT_RUN_DIR/cancel.json\"; echo $$ > \"$1\"; head -c 3M /dev/zero; exec sleep 30",
    );
    c.eq(
        &st["state"].as_str(),
        &Some("cancelled"),
        format_args!("{st}"),
    );
    let ev = root.events("out-planted");
    ensure!(
        c,
        ev.iter().any(|e| e["event"] == "signal"
            && e["by"] == "keeper"
            && e["reason"] == "output_limit"),
        "the keeper signalled its wrapper: {ev:?}"
    );
    let leader: i32 = fs::read_to_string(&pids).unwrap().trim().parse().unwrap();
    ensure!(
        c,
        proc_stat(leader).is_none_or(|s| s.0 == 'Z'),
        "the run's leader {leader} is left"
    );
}

/// Shell that sets `$k` to the keeper's pid from the run's journal. The keeper is forked after
/// the workload's spawn: its journal line may come after the workload's start.
const FIND_KEEPER: &str = r#"until grep -q '"keeper_started"' "$AGENT_RUN_DIR/events.jsonl"; do sleep 0.01; done; k=$(sed -n 's/.*"event":"keeper_started".*"pid":\([0-9]*\).*/\1/p' "$AGENT_RUN_DIR/events.jsonl")"#;

/// The run SIGKILLs its keeper and writes on. Its wrapper says so (`keeper_lost`), and the
/// record, `complete: false`, goes out at once: before, it waited 2 s for counts that a dead
/// keeper never writes, and the journal did not say why they were missing.
#[test]
fn a_keeper_the_run_killed_is_journalled_lost_and_the_record_does_not_wait_for_it() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-killed");
    let script = format!(
        r#"{FIND_KEEPER}; kill -KILL "$k"; echo "$k" > "$AGENT_RUN_DIR/../killed"; echo lost"#
    );
    let o = run(&root, &["--quiet", "out-killed", "--", "sh", "-c", &script]);
    let killed: i32 = fs::read_to_string(root.run_dir("out-killed").join("../killed"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| c.fail(describe_output("out-killed", &o)));
    let (keeper, _) = keeper_of(&root, "out-killed");
    c.eq(killed, keeper, "the pid the run killed is its keeper");
    let st = root.status("out-killed");
    c.eq(&st["output"]["complete"], false, format_args!("{st}"));
    let ev = root.events("out-killed");
    ensure!(
        c,
        ev.iter()
            .any(|e| e["event"] == "keeper_lost" && e["by"] == "wrapper" && e["pid"] == keeper),
        "no keeper_lost line: {ev:?}"
    );
    let started = epoch_of(st["started_at"].as_str().unwrap_or_default());
    ended_within_1_5_s(
        c,
        &st,
        started,
        "started, then ended: the record waited for the dead keeper",
    );
}

/// The run SIGSTOPs its keeper (its pid is in the journal), writes a line into the pipe, and
/// exits. Its wrapper finds the keeper stopped when it waits for the counts and sends it CONT,
/// its only signal ever: the line is in the log, the record complete, and the keeper gone.
/// Without it, the record waited 2 s, said `complete: false`, and the keeper stayed stopped.
#[test]
fn a_keeper_the_run_stopped_is_continued_by_its_wrapper_and_nothing_is_lost() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-stopped");
    let script = format!(r#"{FIND_KEEPER}; kill -STOP "$k" && echo "stopped $k" >&2; echo hello"#);
    let o = run(
        &root,
        &["--quiet", "out-stopped", "--", "sh", "-c", &script],
    );
    let (keeper, _) = keeper_of(&root, "out-stopped");
    let pin = Pinned::new(&[keeper]);
    c.eq(
        &o.status.code(),
        &Some(0),
        format_args!("{}", describe_output("out-stopped", &o)),
    );
    c.eq(
        log(&root, "out-stopped", "stderr.log"),
        format!("stopped {keeper}\n").into_bytes(),
        "the run stopped its keeper",
    );
    c.eq(
        log(&root, "out-stopped", "stdout.log"),
        b"hello\n".to_vec(),
        "stdout.log",
    );
    let st = root.status("out-stopped");
    c.eq(&st["output"]["complete"], true, format_args!("{st}"));
    let ev = root.events("out-stopped");
    let to_keeper: Vec<&Value> = ev
        .iter()
        .filter(|e| e["event"] == "signal" && e["target"] == format!("pid:{keeper}"))
        .collect();
    ensure!(
        c,
        to_keeper.len() == 1
            && to_keeper[0]["signal"] == "CONT"
            && to_keeper[0]["reason"] == "keeper_stopped"
            && to_keeper[0]["by"] == "wrapper",
        "the keeper's signals: {to_keeper:?}"
    );
    c.wait_gone_within(&pin, LONG, "the keeper");
}

#[test]
fn a_run_named_like_the_keeper_mode_is_an_ordinary_run() {
    let root = TestRoot::new();
    let c = ctx(&root, "__keep");
    let o = run(&root, &["__keep", "--", "sh", "-c", "echo hi"]);
    c.code(&o, 0, "__keep");
    c.eq(&o.stdout, b"hi\n", "o.stdout");
    c.record("the record", json!({"state": "finished"}));
}

#[test]
fn a_log_slow_to_fsync_still_gets_its_counts_into_the_final_record() {
    // The keeper fsyncs the logs at EOF and then writes output.json; the wrapper waits for it
    // before its final record. With a disk slower than the wrapper's bare wait (2 s: the knob
    // makes the keeper sleep 5 s before its fsync), the wait must allow for the bytes logged,
    // or the record goes out `complete: false` and the counts are guessed from the log sizes.
    let root = TestRoot::new();
    let c = ctx(&root, "slow-fsync");
    let bytes: u64 = 128 << 20;
    let mut cmd = root.cmd();
    cmd.env("AGENT_RUN_FAULT", "slow_log_fsync");
    let st = write_zeros(c, cmd, &[], &bytes.to_string(), LONG);
    c.eq(
        &st["output"]["complete"],
        true,
        "st[\"output\"][\"complete\"]",
    );
    c.eq(counts(&st, "stdout"), (bytes, 0), "stdout written, dropped");
    c.eq(
        fs::metadata(root.run_dir("slow-fsync").join("stdout.log"))
            .map(|m| m.len())
            .ok(),
        Some(bytes),
        "stdout.log size",
    );
}

#[test]
fn bytes_forged_into_every_pipe_of_the_wrapper_do_not_send_the_final_record_out_early() {
    // The workload opens a write end of every pipe of its wrapper through /proc (same user),
    // once the keeper has started, and writes into each. The final record waits for the
    // keeper's exit, whatever a pipe carries. The keeper is slow to finish (the knob: 5 s
    // before the logs' fsync), so a record sent early would say `complete: false`.
    let root = TestRoot::new();
    let id = "out-forged-done";
    let c = ctx(&root, id);
    // One log written (the knob sleeps once per log): `grabbed N pipes` goes to stdout too.
    let bytes: u64 = 128 << 20;
    let fixture = agent_run_tests::fixture_bin();
    let script = format!(
        "until grep -q keeper_started \"$AGENT_RUN_DIR/events.jsonl\"; do :; done; exec '{}' grab-parent-pipes 4 spew {bytes} 2>&1",
        fixture.display()
    );
    let o = run_with_timeout(
        root.cmd()
            .env("AGENT_RUN_FAULT", "slow_log_fsync")
            .args(["--quiet", id, "--", "sh", "-c", &script]),
        LONG,
    );
    c.code(&o, 0, id);
    let out = log(&root, id, "stdout.log");
    let first = out.split(|&b| b == b'\n').next().unwrap_or_default();
    let first = String::from_utf8_lossy(first).into_owned();
    c.check(
        first.starts_with("grabbed ") && first != "grabbed 0 pipes",
        format_args!("the workload grabbed no pipe of its wrapper: {first:?}"),
    );
    keepers_counts(&root, id, (bytes + first.len() as u64 + 1, 0));
}

/// A small tmpfs mounted as the run root, unmounted on drop.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_tmpfs_leaves_other_runs_records_whole_and_the_writers_own_record_written() {
    if agent_run_shared::sys::geteuid() != 0 {
        return;
    }
    let root = TestRoot::new();
    let c = ctx(&root, "out-fill");
    let dir = root.root();
    fs::create_dir_all(&dir).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m,mode=0700", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs");
        return;
    }
    let _mount = Tmpfs(dir.clone());
    let go = root.dir.path().join("go");
    let other = Spawned::wrapper(
        &root,
        &[
            "--quiet",
            "out-other",
            "--",
            "sh",
            "-c",
            &format!(
                "echo hi; while [ ! -e {} ]; do sleep 0.02; done",
                go.display()
            ),
        ],
    );
    wait_until_dbg("the other run running", LONG, || {
        let st = root.try_status("out-other")?;
        (st["state"] == "running")
            .then_some(())
            .ok_or(st.to_string())
    });
    // No cap: the disk reserve is what stops the writer's log.
    let o = run(
        &root,
        &[
            "--quiet",
            "--max-output",
            "none",
            "out-fill",
            "--",
            "head",
            "-c",
            "100M",
            "/dev/zero",
        ],
    );
    c.code(&o, 0, "out-fill");
    let st = root.status("out-fill");
    c.eq(&st["state"], "finished", format_args!("{st}"));
    c.eq(
        &st["output"]["stdout"]["capped"],
        "disk_reserve",
        format_args!("{st}"),
    );
    let (written, dropped) = counts(&st, "stdout");
    c.eq(&(written + dropped), &(100 << 20), "written + dropped");
    ensure!(c, written < 40 << 20 && dropped > 0, "{st}");
    let marker = b"the disk reserve was reached";
    let bytes = log(&root, "out-fill", "stdout.log");
    ensure!(
        c,
        bytes.windows(marker.len()).any(|w| w == marker),
        "bytes.windows(marker.len()).any(|w| w == marker)"
    );
    // The other run ends with a whole final record.
    let c = ctx(&root, "out-other");
    fs::write(&go, b"").unwrap();
    let o = other.finish(LONG);
    c.code(&o, 0, "out-other");
    let st = root.status("out-other");
    c.eq(&st["state"], "finished", format_args!("{st}"));
    c.eq(&counts(&st, "stdout"), &(3, 0), "counts(&st, \"stdout\")");
}

#[test]
fn logs_tail_and_a_quiet_failure_show_the_last_lines() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-tail");
    let script = "for i in $(seq 1 30); do echo out$i; echo err$i >&2; done; exit 3";
    let o = run(&root, &["--quiet", "out-tail", "--", "sh", "-c", script]);
    c.eq(&o.status.code(), &Some(3), "o.status.code()");
    let err = String::from_utf8_lossy(&o.stderr);
    let want: String = (21..=30).map(|i| format!("err{i}\n")).collect();
    ensure!(c, err.contains("the last 10 lines of its stderr"), "{err}");
    ensure!(
        c,
        err.contains(
            &root
                .run_dir("out-tail")
                .join("stderr.log")
                .display()
                .to_string()
        ),
        "{err}"
    );
    ensure!(c, err.ends_with(&want), "{err}");
    ensure!(c, o.stdout.is_empty(), "o.stdout.is_empty()");
    let o = run(&root, &["logs", "--tail", "2", "--stderr", "out-tail"]);
    c.eq(&o.stdout, b"err29\nerr30\n", "o.stdout");
    let o = run(&root, &["logs", "--tail", "1", "--stdout", "out-tail"]);
    c.eq(&o.stdout, b"out30\n", "o.stdout");
    let o = run(&root, &["logs", "-n", "1", "out-tail"]);
    let text = String::from_utf8_lossy(&o.stdout);
    ensure!(
        c,
        text.contains("stdout.log <==\nout30\n") && text.contains("stderr.log <==\nerr30\n"),
        "{text}"
    );
    // A quiet run that succeeds prints nothing.
    let c = ctx(&root, "out-ok");
    let o = run(
        &root,
        &["--quiet", "out-ok", "--", "sh", "-c", "echo e >&2"],
    );
    ensure!(
        c,
        o.status.success() && o.stderr.is_empty(),
        "{}",
        describe_output("out-ok", &o)
    );
}

#[test]
fn a_log_truncated_by_path_is_followed_again_from_its_start() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-trunc");
    let script = "echo aaaaaaaaaaaaaaaaaaaa; sleep 0.5; : > \"$AGENT_RUN_DIR/stdout.log\"; echo bb";
    let o = run(&root, &["out-trunc", "--", "sh", "-c", script]);
    c.code(&o, 0, "out-trunc");
    let err = String::from_utf8_lossy(&o.stderr);
    c.eq(
        log(&root, "out-trunc", "stdout.log"),
        b"bb\n",
        "log(&root, \"out-trunc\", \"stdout.log\")",
    );
    ensure!(
        c,
        o.stdout.ends_with(b"bb\n"),
        "{}",
        describe_output("out-trunc", &o)
    );
    ensure!(c, err.contains("stdout.log shrank"), "{err}");
}

/// `seq 1 n`'s output: every line differs, so a byte lost, doubled or moved shows.
fn seq_bytes(n: u32) -> Vec<u8> {
    (1..=n)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

/// How `got` differs from `want`, for a message (not megabytes of both).
fn first_difference(got: &[u8], want: &[u8]) -> String {
    let at = got.iter().zip(want).position(|(a, b)| a != b);
    format!(
        "{} bytes, want {}; first difference at {:?}",
        got.len(),
        want.len(),
        at.or((got.len() != want.len()).then(|| got.len().min(want.len())))
    )
}

/// About 11 MB: several of the streamer's turns and of the keeper's writeback starts.
const SEQ: u32 = 1_500_000;

#[test]
fn a_large_output_streams_every_byte_once_in_order_to_a_pipe_a_file_and_an_appended_file() {
    let root = TestRoot::new();
    let want = seq_bytes(SEQ);
    let n = SEQ.to_string();
    // A pipe read as the bytes come (sendfile into the pipe).
    let id = "out-big-pipe";
    let c = ctx(&root, id);
    let o = run(&root, &[id, "--", "seq", "1", &n]);
    c.code(&o, 0, id);
    ensure!(
        c,
        o.stdout == want,
        "{}",
        first_difference(&o.stdout, &want)
    );
    every_byte_once(c, id, &want, b"");
    // A regular file (sendfile's in-kernel copy), and one opened O_APPEND, which sendfile
    // refuses (EINVAL): the read/write copy carries it, after what the file held.
    for (id, before) in [("out-big-file", &b""[..]), ("out-big-append", b"before\n")] {
        let c = ctx(&root, id);
        let path = root.dir.path().join(format!("{id}.txt"));
        fs::write(&path, before).unwrap();
        let sink = fs::OpenOptions::new()
            .append(!before.is_empty())
            .write(true)
            .open(&path)
            .unwrap();
        let mut child = root
            .cmd()
            .args([id, "--", "seq", "1", &n])
            .stdout(sink)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let status = agent_run_tests::wait_child(&mut child, LONG);
        ensure!(c, status.success(), "{id}: {status:?}");
        let got = fs::read(&path).unwrap();
        let whole = [before, &want[..]].concat();
        ensure!(c, got == whole, "{id}: {}", first_difference(&got, &whole));
        every_byte_once(c, id, &want, b"");
    }
}

#[test]
fn a_stalled_reader_on_a_non_blocking_pipe_stalls_only_the_stream_and_gets_every_byte() {
    use std::io::Read;
    let root = TestRoot::new();
    let id = "out-stalled";
    let c = ctx(&root, id);
    let want = seq_bytes(SEQ);
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    // The caller's pipe is non-blocking (shared file description): a full pipe says EAGAIN
    // to the streamer, which must wait for room, not drop the sink or spin.
    let fl = rustix::fs::fcntl_getfl(&w).unwrap();
    rustix::fs::fcntl_setfl(&w, fl | rustix::fs::OFlags::NONBLOCK).unwrap();
    let mut child = root
        .cmd()
        .args([id, "--", "seq", "1", &SEQ.to_string()])
        .stdout(w)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Nobody reads: the workload and the keeper still finish and the record is final (the
    // stream is no part of the run), with the pipe full.
    let st = root.wait_final(id, LONG);
    c.eq(
        (&st["state"], &st["exit_code"]),
        (&Value::from("finished"), &Value::from(0)),
        "state",
    );
    c.eq(c.bytes("stdout.log"), &want[..], "stdout.log");
    // Now read it all: every byte, once, in order, then EOF when the wrapper exits.
    let mut got = Vec::new();
    fs::File::from(r).read_to_end(&mut got).unwrap();
    let status = agent_run_tests::wait_child(&mut child, LONG);
    ensure!(c, status.success(), "{status:?}");
    ensure!(c, got == want, "{}", first_difference(&got, &want));
    every_byte_once(c, id, &want, b"");
}

/// The wake-ups (voluntary and involuntary context switches) of the thread of `pid` named
/// `name`, from /proc/PID/task/TID/status.
fn thread_switches(pid: u32, name: &str) -> Option<u64> {
    for t in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = fs::read_to_string(t.path().join("status")).ok()?;
        let n = status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum();
        return Some(n);
    }
    None
}

/// Waits until the wrapper `run` has streamed exactly `want` to its stdout.
fn streamed(run: &Spawned, want: &[u8]) {
    let what = format!("{:?} streamed", String::from_utf8_lossy(want));
    wait_until_dbg(&what, LONG, || {
        let out = run.stdout_so_far();
        if out == want {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out).into_owned())
        }
    });
}

#[test]
fn the_streamer_sleeps_while_the_run_is_quiet_and_wakes_when_its_log_grows() {
    let root = TestRoot::new();
    let id = "out-idle";
    let c = ctx(&root, id);
    let fifo = make_fifo(&root, "out-idle.go");
    let script = format!("echo ready; read x < '{}'; echo after", fifo.display());
    let run = Spawned::wrapper(&root, &[id, "--", "sh", "-c", &script]);
    let pid = run.child.id();
    streamed(&run, b"ready\n");
    let before = thread_switches(pid, "agent-run-strm").expect("the streaming thread is named");
    // It waits on the keeper's wake-up pipe, not on inotify: closing an inotify instance waits
    // for an SRCU grace period in the kernel, which the wrapper's exit would pay (ms a run).
    let inotify: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| l.contains("inotify"))
        .collect();
    ensure!(
        c,
        inotify.is_empty(),
        "the wrapper holds inotify instances: {inotify:?}"
    );
    // A window in which the run writes nothing (it waits on the FIFO): a streamer that polls
    // on a timer wakes a dozen times in it, one that waits on the keeper's pipe not at all.
    std::thread::sleep(Duration::from_secs(1));
    let idle = thread_switches(pid, "agent-run-strm").expect("the streaming thread") - before;
    fs::write(&fifo, b"go\n").unwrap();
    streamed(&run, b"ready\nafter\n");
    let o = run.finish(LONG);
    c.code(&o, 0, id);
    ensure!(
        c,
        idle <= 2,
        "the streaming thread woke {idle} times in 1 s of silence"
    );
}

/// The keeper is forked right after the workload's spawn. When that fork fails (a fork bomb
/// can take the last pid in that moment; here a test knob refuses it), the spawned workload,
/// whose output nobody would drain, is stopped by the shared routine before it runs on: the
/// launch fails with 70, the record says `launch_failed`, and nothing of the run's session or
/// cgroup is left in the process table.
#[test]
fn a_keeper_that_cannot_be_forked_after_the_spawn_stops_the_workload_and_fails_the_launch() {
    let root = TestRoot::new();
    let c = ctx(&root, "no-keeper");
    let o = run_with_timeout(
        root.cmd()
            .env("AGENT_RUN_FAULT", "keeper_fork_fails")
            .args([
                "--quiet",
                "--grace",
                "2s",
                "no-keeper",
                "--",
                "sh",
                "-c",
                "sleep 300 & sleep 300 & wait",
            ]),
        LONG,
    );
    c.eq(
        &o.status.code(),
        &Some(70),
        format_args!("{}", describe_output("no-keeper", &o)),
    );
    let st = root.status("no-keeper");
    c.eq(&st["state"], "launch_failed", "st[\"state\"]");
    let leader = st["pid"].as_i64().map(|p| p as i32);
    ensure!(
        c,
        leader.is_some(),
        "the record names the spawned leader: {st}"
    );
    let (leader, ticks) = (leader.unwrap(), st["start_ticks"].as_u64());
    ensure!(
        c,
        ticks.is_some(),
        "the record names the leader's start: {st}"
    );
    ensure!(
        c,
        !agent_run_tests::alive_as(leader, ticks.unwrap()),
        "the leader {leader} outlived a failed launch"
    );
    ensure!(
        c,
        root.events("no-keeper")
            .iter()
            .any(|e| e["event"] == "signal" && e["reason"] == "launch_failed"),
        "the stop is journalled: {:?}",
        root.events("no-keeper")
    );
    let left = agent_run_tests::session_members(leader);
    ensure!(c, left.is_empty(), "the run's session still holds {left:?}");
    if let Some(cg) = st["containment"]["cgroup"].as_str() {
        ensure!(c, !Path::new(cg).exists(), "the run's cgroup {cg} is left");
    }
}

/// The run can make its log any size for free (`truncate -s`, a sparse file): the wrapper's
/// live copy stops at what the keeper can have written under the cap (the cap, the kept tail,
/// the markers), with a note, instead of streaming the run's 64 MiB (it streamed gigabytes,
/// past the cap, long after the final record). The record is the keeper's: nothing written.
#[test]
fn a_log_the_run_extends_itself_is_not_streamed_past_what_the_keeper_can_have_written() {
    let root = TestRoot::new();
    let c = ctx(&root, "out-sparse");
    let script = r#"truncate -s 64M "$AGENT_RUN_DIR/stdout.log""#;
    let o = c.ctl(&["--max-output", "1M", c.id, "--", "sh", "-c", script], 0);
    let most = 1_048_576 + 131_072 + 65_536;
    ensure!(
        c,
        o.stdout.len() <= most,
        "streamed {} bytes of a log the keeper wrote nothing into (at most {most})",
        o.stdout.len()
    );
    ensure!(
        c,
        String::from_utf8_lossy(&o.stderr).contains("more than the keeper can have written"),
        "no note: {}",
        describe_output(c.id, &o)
    );
    let st = c.status();
    c.eq(&st["state"], "finished", format_args!("{st}"));
    c.eq(&st["output"]["stdout"]["written"], 0, format_args!("{st}"));
}
