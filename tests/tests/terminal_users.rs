//! People on a real terminal (tmux): one-line human output beside its JSON twin, `status` and
//! `list` made for 80 columns, Ctrl-Z / `fg` of a whole run, and programs that prompt failing fast.
//!
//! Every process a test starts is pinned with a pidfd after the fixture's ready line and
//! checked in /proc; every run is final (or cancelled) before the test ends.

use std::fs;

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::tmux::{shell_path, Tmux};
use agent_run_tests::workload::fixture_path;
use agent_run_tests::{
    agent_run_bin, ctx, ensure, fixture_bin, proc_stat, wait_ready, wait_until_dbg, Ctx, Pinned,
    Ready, TestRoot,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Output for people, on a real terminal, and its JSON twin

/// A test's root (it shares the CPU), a tmux terminal of COLS x ROWS, and the shell words that
/// run the built agent-run on that root.
fn terminal(cols: u16, rows: u16) -> (TestRoot, Tmux, String) {
    let root = TestRoot::sharing_cpu();
    let agent_run = format!(
        "{} --root {}",
        shell_path(&agent_run_bin()),
        shell_path(&root.root())
    );
    (root, Tmux::new(cols, rows, &[]), agent_run)
}

/// Every one of `parts` is in `text` (a screen, or what a command said on it).
fn shows(c: Ctx, text: &str, parts: &[&str]) {
    let missing: Vec<&str> = parts
        .iter()
        .copied()
        .filter(|p| !text.contains(p))
        .collect();
    ensure!(c, missing.is_empty(), "no {missing:?} in:\n{text}");
}

/// On a clear screen of `t`, types `AR_T ID -- fixture tree TREE` (without waiting for its
/// end) and waits for the fixture's ready line: the line, and the tree pinned.
fn start_typed(t: &Tmux, ar_t: &str, root: &TestRoot, id: &str, tree: &str) -> (Ready, Pinned) {
    t.clear();
    t.line(&format!(
        "{ar_t} {id} -- {} tree {tree}",
        shell_path(&fixture_bin())
    ));
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), T);
    let pinned = Pinned::new(&ready.all_pids());
    (ready, pinned)
}

#[test]
fn cancel_and_a_final_relaunch_say_one_line_on_a_terminal_and_give_json_otherwise() {
    let (root, t, ar_t) = terminal(120, 40);
    let c = ctx(&root, "train-3");
    let run = detached(&root, "train-3", &[], &["--children", "2"]);
    let said = t.run(&format!("{ar_t} cancel train-3"), T);
    let line = said.trim();
    ensure!(
        c,
        line.starts_with("run train-3: cancelled (cancel_request) after ")
            && line.contains(", 3 processes stopped in ")
            && line.ends_with(", exit 143")
            && !line.contains('{'),
        "{said}"
    );
    run.assert_gone(&root, "after the cancel");
    // The twin: --json, on a terminal or not: the record.
    let doc = json_of(&ar_code(&root, &["cancel", "--json", "train-3"], 0));
    c.eq(
        &(doc["state"].as_str(), doc["outcome_exit_code"].as_u64()),
        &(Some("cancelled"), Some(143)),
        "(doc[\"state\"].as_str(), doc[\"outcome_exit_code\"].as_u64())",
    );
    let said = t.run(&format!("{ar_t} cancel --json train-3"), T);
    let doc: Value =
        serde_json::from_str(&said).unwrap_or_else(|e| c.fail(format_args!("{e}: {said}")));
    c.eq(&doc["run_id"], "train-3", "doc[\"run_id\"]");

    let c = ctx(&root, "fin");
    // A relaunch of a final run: one line on stderr, and with --json the record on stdout.
    let fx = fixture_path();
    ar_code(&root, &["fin", "--", &fx, "exit", "3"], 3);
    let said = t.run(
        &format!(
            "{ar_t} fin -- {} exit 3; echo code=$?",
            shell_path(&fixture_bin())
        ),
        T,
    );
    shows(
        c,
        &said,
        &[
            "agent-run: run fin: finished after ",
            ", exit 3; not running it again",
            "code=3",
        ],
    );
    ensure!(c, !said.contains('{'), "JSON on a terminal: {said}");
    let out = ar_code(&root, &["fin", "--json", "--", &fx, "exit", "3"], 3);
    let record: Value = serde_json::from_slice(&out.stdout).expect("the record on stdout");
    c.eq(&record["exit_code"], 3, "record[\"exit_code\"]");
}

#[test]
fn a_foreground_run_says_on_stderr_why_it_stops() {
    let (root, t, ar_t) = terminal(120, 40);
    let ctrl_c = || t.keys(&["C-c"]);
    let cancel = || drop(ar_code(&root, &["cancel", "fg-cancel"], 0));
    let neither = || {};
    // Each run and its options, what stops it (Ctrl-C, a cancel from another connection, or
    // neither: its timeout, its lease), and what the terminal then shows.
    let stops = [
        (
            "fg-int",
            "",
            &ctrl_c as &dyn Fn(),
            &[
                "agent-run: INT: stopping run fg-int (TERM sent; again to KILL)",
                "agent-run: run fg-int: cancelled (signal:INT) after ",
                ", exit 130",
            ][..],
        ),
        (
            "fg-cancel",
            "",
            &cancel,
            &[
                "agent-run: cancel requested from another connection: stopping run fg-cancel (TERM sent)",
                "exit 143",
            ],
        ),
        (
            "fg-timeout",
            "--timeout 1s",
            &neither,
            &[
                "agent-run: timeout of 1.0s reached: stopping run fg-timeout",
                "cancelled (timeout)",
                "exit 124",
            ],
        ),
        (
            "fg-lease",
            "--lease 1s",
            &neither,
            &[
                "agent-run: the lease expired without a renewal: stopping run fg-lease",
                "exit 124",
            ],
        ),
    ];
    for (id, opts, stop, says) in stops {
        let c = ctx(&root, id);
        let (_, tree) = start_typed(&t, &format!("{ar_t} {opts}"), &root, id, "--children 1");
        stop();
        let screen = t.wait_prompt(T);
        c.wait_gone(&tree, "tree");
        shows(c, &screen, says);
    }
    ctx(&root, "fg-int").record("the record", json!({"reason": "signal:INT"}));
}

#[test]
fn status_on_a_terminal_quotes_the_command_and_names_the_signal() {
    let (root, t, ar_t) = terminal(120, 50);
    let c = ctx(&root, "segv");
    let fx = fixture_path();
    ar_code(&root, &["segv", "--", &fx, "signal", "11"], 139);
    let said = t.run(&format!("{ar_t} status segv"), T);
    ensure!(c, said.starts_with("run segv: finished"), "{said}");
    ensure!(c, said.contains("  signal:     SEGV (exit 139)"), "{said}");
    ensure!(
        c,
        said.contains(&format!("  command:    {fx} signal 11")),
        "{said}"
    );
    ensure!(
        c,
        said.contains("  started:    ") && said.contains(" ago)"),
        "{said}"
    );
    ensure!(c, said.contains("  ran:        "), "{said}");
    let doc = json_of(&ar_code(&root, &["status", "--json", "segv"], 0));
    c.eq(
        &(
            doc["term_signal"].as_str(),
            doc["outcome_exit_code"].as_u64(),
        ),
        &(Some("SEGV"), Some(139)),
        "( doc[\"term_signal\"].as_str(), doc[\"outcome_exit_code\"].as_u64() )",
    );
    // The record is the workload's to rewrite: what it holds never reaches a terminal raw.
    let path = root.run_dir("segv").join("status.json");
    let mut forged: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    forged["reason"] = "x\u{1b}[2Jy".into();
    forged["cwd"] = "/\u{1b}]0;owned\u{7}".into();
    fs::write(&path, serde_json::to_string(&forged).unwrap()).unwrap();
    for args in [&["status", "segv"][..], &["list"][..]] {
        let shown = String::from_utf8_lossy(&ar_code(&root, args, 0).stdout).into_owned();
        ensure!(
            c,
            !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
            "{shown:?}"
        );
        ensure!(c, shown.contains("x\\x1b[2Jy"), "{shown:?}");
    }

    let c = ctx(&root, "quoted");
    // A running run: the command quoted so that it can be pasted back, the time it has run.
    let script = r#"echo "it's a b"; exec "$0" tree --children 0"#;
    ar_code(
        &root,
        &[
            "-d",
            "--timeout",
            "1h",
            "--label",
            "job=7",
            "quoted",
            "--",
            "sh",
            "-c",
            script,
            &fx,
        ],
        0,
    );
    let ready = wait_ready(&root.run_dir("quoted").join("stdout.log"), T);
    let tree = Pinned::new(&ready.all_pids());
    let said = t.run(&format!("{ar_t} status quoted"), T);
    let want =
        format!(r#"  command:    sh -c 'echo "it'\''s a b"; exec "$0" tree --children 0' {fx}"#);
    ensure!(c, said.contains(&want), "{said}\nwanted {want}");
    ensure!(
        c,
        said.contains("  elapsed:    ") && said.contains("  timeout:    1h (59m"),
        "{said}"
    );
    ensure!(c, said.contains("  labels:     job=7"), "{said}");
    // Pasted back into the shell, the quoted command line runs the same words.
    let pasted = want.trim_start().trim_start_matches("command:").trim();
    let echo = t.run(&format!("printf '<%s>' {pasted}; echo"), T);
    ensure!(
        c,
        echo.starts_with(r#"<sh><-c><echo "it's a b"; exec "$0" tree --children 0><"#),
        "{echo}"
    );
    c.cancel_now(&tree, "the tree after cancel");
}

#[test]
fn list_on_a_terminal_is_newest_first_fits_80_columns_and_is_coloured_unless_no_color() {
    let (root, t, ar_t) = terminal(80, 50);
    let c = ctx(&root, "live");
    let fx = fixture_path();
    ar_code(&root, &["ok-run", "--", "true"], 0);
    ar_code(&root, &["failing", "--", "sh", "-c", "exit 3"], 3);
    ar_code(
        &root,
        &[
            "--timeout",
            "200ms",
            "timed-out-with-a-long-name-3f9c0e6b2d",
            "--",
            &fx,
            "tree",
            "--children",
            "0",
        ],
        124,
    );
    let live = detached(&root, "live", &["--lease", "10m"], &["--children", "0"]);

    t.run(&format!("{ar_t} list"), T);
    let rows = t.rows();
    let table: Vec<&String> = rows
        .iter()
        .skip_while(|r| !r.starts_with("RUN_ID"))
        .take(5)
        .collect();
    for r in &table {
        ensure!(
            c,
            r.chars().count() <= 80,
            "a row longer than 80 columns: {r:?}\n{rows:#?}"
        );
    }
    let order: Vec<&str> = table
        .iter()
        .skip(1)
        .filter_map(|r| r.split_whitespace().next())
        .collect();
    c.eq(
        &order,
        &[
            "live",
            "timed-out-with-a-long-name-3f9c0e6b2d",
            "failing",
            "ok-run",
        ],
        format_args!("{rows:#?}"),
    );
    // EXIT is the code `wait` gives, as --json's outcome_exit_code says.
    let doc = json_of(&ar_code(&root, &["list", "--json"], 0));
    for r in table.iter().skip(1) {
        let id = r.split_whitespace().next().unwrap();
        let entry = doc
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["run_id"] == id)
            .unwrap();
        let exit = r.split_whitespace().last().unwrap();
        let want = entry["outcome_exit_code"]
            .as_u64()
            .map_or("-".to_string(), |c| c.to_string());
        ctx(&root, id).eq(exit, &want, format_args!("{r}"));
    }
    // -n and --state.
    let said = t.run(&format!("{ar_t} list -n 1 --state final"), T);
    c.eq(&said.lines().count(), &2, format_args!("{said}"));
    ensure!(
        c,
        said.lines().nth(1).unwrap().starts_with("timed-out-with"),
        "{said}"
    );

    // Colour on the terminal; none with NO_COLOR, none when stdout is not a terminal.
    let coloured = t.run_escaped(&format!("{ar_t} list"), T);
    ensure!(
        c,
        coloured.contains("\x1b[32mfinished\x1b[0m")
            || coloured.contains("\x1b[32mfinished\x1b[39m"),
        "{coloured:?}"
    );
    ensure!(c, coloured.contains("\x1b[31mfinished"), "{coloured:?}");
    let plain = t.run_escaped(&format!("NO_COLOR=1 {ar_t} list"), T);
    ensure!(c, !plain.contains("\x1b["), "{plain:?}");
    let piped = ar_code(&root, &["list"], 0);
    ensure!(
        c,
        !String::from_utf8_lossy(&piped.stdout).contains('\x1b'),
        "!String::from_utf8_lossy(&piped.stdout).contains('\\x1b')"
    );
    ar_code(&root, &["cancel", "live"], 0);
    live.assert_gone(&root, "after the cancel");
}

#[test]
fn ctrl_z_suspends_every_process_of_the_run_and_fg_resumes_them() {
    let (root, t, ar_t) = terminal(120, 40);
    let c = ctx(&root, "zz");
    let (ready, tree) = start_typed(&t, &ar_t, &root, "zz", "--children 2 --grandchildren");
    let pids = ready.all_pids();
    c.eq(&pids.len(), &5, format_args!("{ready:?}"));
    let wrapper = root.status("zz")["wrapper_pid"].as_i64().unwrap() as i32;
    let wrapper_pin = Pinned::new(&[wrapper]);
    let states = |want: &dyn Fn(char) -> bool| {
        let all: Vec<i32> = pids.iter().copied().chain([wrapper]).collect();
        wait_until_dbg("the states of the run's processes", T, || {
            let seen: Vec<(i32, char)> = all
                .iter()
                .map(|&p| (p, proc_stat(p).map_or('?', |s| s.0)))
                .collect();
            if seen.iter().all(|(_, s)| want(*s)) {
                Ok(())
            } else {
                Err(seen)
            }
        })
    };

    t.keys(&["C-z"]);
    states(&|s| s == 'T');
    let screen = t.wait_for("Stopped", T);
    ensure!(
        c,
        screen.contains("agent-run: run zz suspended (5 processes stopped); fg resumes it"),
        "{screen}"
    );
    c.record("the record", json!({"state": "running"}));

    t.line("fg");
    states(&|s| s != 'T');
    t.wait_for("agent-run: run zz resumed", T);
    let names = root.event_names("zz");
    ensure!(
        c,
        names.contains(&"suspended".to_string()) && names.contains(&"resumed".to_string()),
        "{names:?}"
    );
    let stops = root
        .events("zz")
        .into_iter()
        .filter(|e| e["event"] == "signal" && e["reason"] == "suspend")
        .count();
    ensure!(c, stops >= 1, "no STOP journalled");

    // Still the run it was: Ctrl-C stops all of it.
    t.keys(&["C-c"]);
    t.wait_prompt(T);
    c.wait_gone(&tree, "tree");
    c.wait_gone(&wrapper_pin, "wrapper pin");
    c.record("the record", json!({"reason": "signal:INT"}));
}

#[test]
fn programs_that_prompt_fail_fast_instead_of_waiting_for_a_terminal() {
    let (root, t, ar_t) = terminal(120, 40);
    // On a real terminal, in the foreground: the workload has no controlling terminal (its own
    // session), so a prompt on /dev/tty fails at once; with stdin from /dev/null, so does `read`.
    let said = t.run(
        &format!(
            "{ar_t} tty-prompt -- sh -c 'read -r x </dev/tty; echo tty=$?' </dev/null; \
             {ar_t} stdin-prompt -- sh -c 'read -r x; echo read=$?' </dev/null"
        ),
        T,
    );
    assert!(said.contains("tty=") && !said.contains("tty=0"), "{said}");
    assert!(said.contains("read=1"), "{said}");
    let c = ctx(&root, "bg-prompt");
    // Detached: stdin is /dev/null already.
    ar_code(
        &root,
        &[
            "-d",
            "bg-prompt",
            "--",
            "sh",
            "-c",
            "read -r x; echo read=$?",
        ],
        0,
    );
    let st = root.wait_final("bg-prompt", T);
    c.eq(&st["exit_code"], 0, format_args!("{st:#}"));
    let log = fs::read_to_string(root.run_dir("bg-prompt").join("stdout.log")).unwrap();
    c.eq(&log, "read=1\n", "log");
}
