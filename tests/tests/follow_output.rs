//! Following output (issue 38 item 3, issue 40 item 4): `attach` and `logs` replay both logs in
//! the order they were written (the keeper's output.idx), `logs -f -n N` starts at the last N
//! lines and follows both logs, Ctrl-C (INT) on `attach` and `logs -f` detaches (exit 130, the
//! run goes on), `logs --offset N --max-bytes M --json` reads one log on where it stopped, and
//! a damaged or missing index falls back to each log's own order with a note, never a hang.
//! Run ids start with `fo-`.

use agent_run_shared::pty::{Pty, Size};
use agent_run_tests::cli::{ar, ar_code, detached, json_of};
use agent_run_tests::{cases, drain, exit_code, wait_child, wait_until, Spawned, TestRoot};
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// Six lines to each stream, alternating, 100 ms apart: the keeper sees each in its own round.
const ALTERNATE: &str =
    "for i in 1 2 3 4 5 6; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done";

fn alternating() -> String {
    (1..=6).map(|i| format!("out{i}\nerr{i}\n")).collect()
}

/// `agent-run --root R ARGS` with its stdout and stderr into one file: what a terminal shows.
fn merged(root: &TestRoot, args: &[&str]) -> (i32, String) {
    let path = root
        .root()
        .join(format!(".merged.{}", args.join("_").len()));
    let f = File::create(&path).unwrap();
    let mut child = root
        .cmd()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .spawn()
        .unwrap();
    let status = wait_child(&mut child, LONG);
    let text = fs::read_to_string(&path).unwrap();
    let _ = fs::remove_file(&path);
    (exit_code(&status), text)
}

/// Our own `agent-run: ...` lines.
fn notes(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .lines()
        .filter(|l| l.starts_with("agent-run: "))
        .map(String::from)
        .collect()
}

fn finished_alternating(root: &TestRoot, id: &str) {
    ar_code(
        root,
        &["start", "--quiet", id, "--", "sh", "-c", ALTERNATE],
        0,
    );
}

#[test]
fn attach_and_logs_replay_stdout_and_stderr_in_the_order_written() {
    let root = TestRoot::swept();
    finished_alternating(&root, "fo-order");
    let dir = root.run_dir("fo-order");
    // The logs hold each stream; the index (the keeper's, 0600) holds their order.
    assert_eq!(
        fs::read_to_string(dir.join("stdout.log")).unwrap(),
        "out1\nout2\nout3\nout4\nout5\nout6\n"
    );
    let mode = fs::metadata(dir.join("output.idx")).unwrap().permissions();
    assert_eq!(mode.mode() & 0o777, 0o600, "output.idx's mode");
    let (code, text) = merged(&root, &["attach", "fo-order"]);
    assert_eq!((code, text.as_str()), (0, alternating().as_str()), "attach");
    let (code, text) = merged(&root, &["logs", "fo-order"]);
    assert_eq!((code, text.as_str()), (0, alternating().as_str()), "logs");
    // Each stream to its own: stdout to stdout, stderr to stderr.
    let out = ar_code(&root, &["attach", "fo-order"], 0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "out1\nout2\nout3\nout4\nout5\nout6\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "err1\nerr2\nerr3\nerr4\nerr5\nerr6\n"
    );
    // -f -n 2 of a final run: the last two lines of each, in their order, then the end.
    let (code, text) = merged(&root, &["logs", "-f", "-n", "2", "fo-order"]);
    assert_eq!((code, text.as_str()), (0, "out5\nerr5\nout6\nerr6\n"));
    // Resuming from offsets (remote's reconnect): the rest of each, still in order.
    let (code, text) = merged(
        &root,
        &[
            "attach",
            "--stdout-from",
            "15",
            "--stderr-from",
            "10",
            "fo-order",
        ],
    );
    assert_eq!(
        (code, text.as_str()),
        (0, "err3\nout4\nerr4\nout5\nerr5\nout6\nerr6\n")
    );
}

#[test]
fn logs_follow_from_the_last_n_lines_follows_both_logs_until_the_end() {
    let root = TestRoot::swept();
    let gate = root.root().join("gate");
    let script = format!(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; done; \
         while [ ! -e {g} ]; do sleep 0.05; done; echo out4; sleep 0.1; echo err4 >&2",
        g = gate.display()
    );
    ar_code(
        &root,
        &["start", "-d", "fo-tail", "--", "sh", "-c", &script],
        0,
    );
    let dir = root.run_dir("fo-tail");
    wait_until("three lines in each log", LONG, || {
        let full = |n: &str| {
            fs::read_to_string(dir.join(n))
                .unwrap_or_default()
                .lines()
                .count()
                == 3
        };
        (full("stdout.log") && full("stderr.log")).then_some(())
    });
    let f = Spawned::wrapper(&root, &["logs", "-f", "-n", "1", "fo-tail"]);
    // It is following (the last line of each is out), then the run writes on and ends.
    wait_until("the last line of each log copied", LONG, || {
        (f.stdout_so_far() == b"out3\n" && f.stderr_so_far() == b"err3\n").then_some(())
    });
    fs::write(&gate, b"").unwrap();
    let out = f.finish(LONG);
    assert_eq!(
        exit_code(&out.status),
        0,
        "logs -f exits 0 when the run is final"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out3\nout4\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err3\nerr4\n");
    // -n and -f together are no longer refused; --stdout picks one log.
    let out = ar_code(&root, &["logs", "-f", "-n", "2", "--stdout", "fo-tail"], 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out3\nout4\n");
    assert_eq!(out.stderr, b"");
}

/// A detached run of the fixture's tree, pinned, and a follower of it that gets INT.
fn int_detaches(args: &[&str], id: &str) {
    let root = TestRoot::swept();
    let run = detached(&root, id, &[], &[]);
    let mut argv = args.to_vec();
    argv.push(id);
    let f = Spawned::wrapper(&root, &argv);
    // Following: the ready line has been copied.
    wait_until("the ready line copied", LONG, || {
        (!f.stdout_so_far().is_empty()).then_some(())
    });
    f.signal(libc::SIGINT);
    let out = f.finish(LONG);
    assert_eq!(exit_code(&out.status), 130, "{args:?} after INT: {out:?}");
    let want = format!("agent-run: detached from {id} (still running)");
    assert_eq!(notes(&out.stderr), [want], "{args:?}'s stderr");
    // The run goes on: every process of it, and its record says so.
    assert_eq!(
        run.tree.alive(),
        run.tree.pids(),
        "the run's processes after the detach"
    );
    assert_eq!(run.wrapper_pin.alive(), [run.wrapper], "its wrapper");
    assert_eq!(root.status(id)["state"], "running");
    ar_code(&root, &["cancel", id], 0);
    run.assert_gone(&root, "after cancel");
}

cases!(|(args, id): (&[&str], &str)| int_detaches(args, id);
    int_on_attach_detaches_with_130_and_leaves_the_run_running => (&["attach"], "fo-int-attach"),
    int_on_logs_follow_detaches_with_130_and_leaves_the_run_running => (&["logs", "-f"], "fo-int-logs"),
);

#[test]
fn ctrl_c_on_attach_in_a_terminal_detaches() {
    let root = TestRoot::swept();
    let id = "fo-ctrl-c";
    let run = detached(&root, id, &[], &[]);
    let t = Pty::open(Size { cols: 80, rows: 24 }).expect("open a pty for the test");
    let slave = || Stdio::from(t.slave.try_clone().unwrap());
    // attach as the session leader of a terminal of ours, in its foreground.
    let mut child = Command::new("setsid")
        .arg("-c")
        .arg(agent_run_tests::agent_run_bin())
        .arg("--root")
        .arg(root.root())
        .args(["attach", id])
        .env_remove("AGENT_RUN_ROOT")
        .stdin(slave())
        .stdout(slave())
        .stderr(slave())
        .spawn()
        .expect("spawn setsid -c agent-run attach");
    let Pty { master, slave, .. } = t;
    drop(slave);
    let mut master = File::from(master);
    let (seen, _) = drain(Some(master.try_clone().unwrap()));
    let text = || String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    wait_until("the ready line on the terminal", LONG, || {
        text().contains("ready").then_some(())
    });
    // Ctrl-C: the terminal sends INT to its foreground group (attach, not the run).
    master.write_all(b"\x03").unwrap();
    let status = wait_child(&mut child, LONG);
    assert_eq!(exit_code(&status), 130, "attach after Ctrl-C");
    let want = format!("detached from {id} (still running)");
    wait_until("the detach message", Duration::from_secs(5), || {
        text().contains(&want).then_some(())
    });
    assert_eq!(run.tree.alive(), run.tree.pids(), "the run after Ctrl-C");
    assert_eq!(root.status(id)["state"], "running");
    ar_code(&root, &["cancel", id], 0);
    run.assert_gone(&root, "after cancel");
}

#[test]
fn logs_by_offset_reads_on_where_it_stopped_and_says_how_text_is_carried() {
    let root = TestRoot::swept();
    // 'h' 'é' (two bytes) 'l' 'l' 'o' ' ' '€' (three bytes) '\n', then a byte that is not UTF-8.
    let script = r"printf 'h\303\251llo \342\202\254\n'; printf 'x\377y' >&2";
    ar_code(
        &root,
        &["start", "--quiet", "fo-off", "--", "sh", "-c", script],
        0,
    );
    let want = "héllo €\n";
    // In pieces of 3 bytes: a character is never cut, and the text adds up.
    let mut at = 0u64;
    let mut text = String::new();
    let mut pieces = 0;
    loop {
        let at_s = at.to_string();
        let args = [
            "logs",
            "fo-off",
            "--offset",
            &at_s,
            "--max-bytes",
            "3",
            "--json",
        ];
        let doc = json_of(&ar_code(&root, &args, 0));
        assert_eq!(doc["run_id"], "fo-off");
        assert_eq!(doc["stream"], "stdout");
        assert_eq!(doc["offset"], at);
        assert_eq!(doc["size"], want.len());
        assert_eq!(doc["final"], true);
        assert_eq!(doc["state"], "finished");
        assert_eq!(doc["lossy"], false, "{doc}");
        let next = doc["next_offset"].as_u64().unwrap();
        let piece = doc["text"].as_str().unwrap();
        assert_eq!(next - at, piece.len() as u64, "{doc}");
        assert!(next > at && next - at <= 3, "{doc}");
        text.push_str(piece);
        at = next;
        pieces += 1;
        if doc["more"] == false {
            break;
        }
        assert!(pieces < 20, "no end: {doc}");
    }
    assert_eq!((text.as_str(), at), (want, want.len() as u64));
    // Without --json: the raw bytes; --stderr reads stderr.log; past the end, nothing.
    let out = ar_code(
        &root,
        &["logs", "fo-off", "--offset", "1", "--max-bytes", "2"],
        0,
    );
    assert_eq!(out.stdout, "é".as_bytes());
    let out = ar_code(&root, &["logs", "fo-off", "--offset", "1", "--stderr"], 0);
    assert_eq!(out.stdout, b"\xffy");
    let doc = json_of(&ar_code(
        &root,
        &["logs", "fo-off", "--offset", "0", "--stderr", "--json"],
        0,
    ));
    assert_eq!(
        (&doc["stream"], &doc["lossy"]),
        (&"stderr".into(), &true.into())
    );
    assert_eq!(doc["text"], "x\u{fffd}y");
    assert_eq!(
        (doc["next_offset"].as_u64(), doc["more"].as_bool()),
        (Some(3), Some(false))
    );
    let doc = json_of(&ar_code(
        &root,
        &["logs", "fo-off", "--offset", "99", "--json"],
        0,
    ));
    assert_eq!(
        (&doc["text"], doc["next_offset"].as_u64()),
        (&"".into(), Some(99))
    );
    // --offset does not go with -f or -n; --max-bytes and --json need it.
    for bad in [
        &["logs", "fo-off", "--offset", "0", "-f"][..],
        &["logs", "fo-off", "--offset", "0", "-n", "1"],
        &["logs", "fo-off", "--json"],
        &["logs", "fo-off", "--max-bytes", "5"],
        &["logs", "fo-off", "--offset", "0", "--max-bytes", "0"],
    ] {
        assert_eq!(exit_code(&ar(&root, bad).status), 64, "{bad:?}");
    }
}

#[test]
fn a_damaged_or_missing_index_falls_back_to_each_logs_own_order_with_a_note() {
    let root = TestRoot::swept();
    finished_alternating(&root, "fo-damaged");
    let idx = root.run_dir("fo-damaged").join("output.idx");
    let each = "out1\nout2\nout3\nout4\nout5\nout6\n";
    let each_err = "err1\nerr2\nerr3\nerr4\nerr5\nerr6\n";
    let check = |what: &str| -> Output {
        let out = ar_code(&root, &["attach", "fo-damaged"], 0);
        assert_eq!(String::from_utf8_lossy(&out.stdout), each, "{what}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let workload: String = err
            .lines()
            .filter(|l| !l.starts_with("agent-run: "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(workload, each_err, "{what}: {err}");
        let n = notes(&out.stderr);
        assert!(
            n.len() == 1 && n[0].contains("output.idx"),
            "{what}: one note naming output.idx: {n:?}"
        );
        out
    };
    // Garbage after the header: the records before it replay in order, the rest per stream.
    let mut bytes = fs::read(&idx).unwrap();
    bytes.truncate(16);
    bytes.extend_from_slice(b"this is not an index at all.....");
    fs::write(&idx, &bytes).unwrap();
    check("garbage");
    // Offsets past the logs' ends.
    let mut bytes = b"agent-run-idx v1".to_vec();
    bytes.extend_from_slice(&[b'o', 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
    fs::write(&idx, &bytes).unwrap();
    check("past the end");
    // Missing.
    fs::remove_file(&idx).unwrap();
    check("missing");
    // A FIFO in its place: never opened for reading blocked, never a hang.
    let made = Command::new("mkfifo").arg(&idx).status().unwrap();
    assert!(made.success());
    check("a FIFO");
    fs::remove_file(&idx).unwrap();
    // A symlink to a real index: not followed.
    std::os::unix::fs::symlink("/dev/zero", &idx).unwrap();
    check("a symlink");
}

#[test]
fn a_live_run_without_an_index_is_still_streamed_live() {
    // A run whose keeper made no index (an older agent-run's): attach does not wait for one.
    let root = TestRoot::swept();
    let id = "fo-no-index";
    let run = detached(&root, id, &[], &[]);
    fs::remove_file(root.run_dir(id).join("output.idx")).unwrap();
    let f = Spawned::wrapper(&root, &["attach", id]);
    wait_until("the ready line copied live", LONG, || {
        String::from_utf8_lossy(&f.stdout_so_far())
            .contains("ready")
            .then_some(())
    });
    f.signal(libc::SIGINT);
    let out = f.finish(LONG);
    assert_eq!(exit_code(&out.status), 130, "{out:?}");
    assert_eq!(
        run.tree.alive(),
        run.tree.pids(),
        "the run after the detach"
    );
    ar_code(&root, &["cancel", id], 0);
    run.assert_gone(&root, "after cancel");
}
