//! `start --detach` returns once the run is running, and a relaunch by run id replays a finished
//! run's exit code, attaches to an active one, refuses a different command (65), and runs a new id's
//! command once however many launch it at the same time.
//!
//! Every test drives the real binaries against real process trees (the `fixture` program) in its
//! own run root, and asserts on kernel facts: pids pinned with pidfds right after the fixture's
//! ready line, sessions and fds read from /proc, the run dir's files. Messages and exit codes are
//! checked too, never alone. Waits poll a probe to one deadline; every process a test sees is
//! pinned, so it is killed by pid when the test ends.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Instant;

use agent_run_tests::ctx::{ctx, Ctx};
use agent_run_tests::facts::*;
use agent_run_tests::workload::*;
use agent_run_tests::{describe_output, proc_stat, Pinned, Spawned, TestRoot};
use serde_json::json;

// =============================================================================================
// start --detach

#[test]
fn start_detach_returns_once_running_and_the_wrapper_lives_on_in_its_own_session_on_dev_null() {
    let root = TestRoot::new();
    let c = ctx(&root, "detached");
    let t0 = Instant::now();
    let run = c.start_detached("", &fx("tree --children 1"));
    eprintln!("start --detach returned in {:?}", t0.elapsed());
    c.fields(
        &run.line,
        "the detach line",
        json!({"state": "running", "pgid": run.leader}),
    );
    let st = c.status();
    c.fields(
        &st,
        "the record when start -d returned",
        json!({"state": "running", "pid": run.leader}),
    );
    let (ready, tree) = c.pin_tree();
    c.eq(ready.pid, run.leader, "the ready line's leader");
    let leads = ready.pid == ready.pgid && ready.pid == ready.sid;
    c.check(
        leads,
        format_args!("the leader does not lead its group and session: {ready:?}"),
    );

    c.all_alive(&run.wrapper_pin, "the wrapper after start -d returned");
    let wrapper = proc_stat(run.wrapper).expect("the wrapper's stat");
    let own_session = wrapper.3 != my_sid() && wrapper.3 != ready.sid;
    c.check(
        own_session,
        format_args!("the wrapper's session: {wrapper:?}, test's {}", my_sid()),
    );
    let dev_null = Some(PathBuf::from("/dev/null"));
    for fd in 0..3 {
        let link = fs::read_link(format!("/proc/{}/fd/{fd}", run.wrapper)).ok();
        c.eq(
            link,
            dev_null.clone(),
            format_args!("the detached wrapper's fd {fd}"),
        );
    }
    let stdin = fs::read_link(format!("/proc/{}/fd/0", run.leader)).ok();
    c.eq(stdin, dev_null, "the detached workload's stdin");

    c.cancel_now(&tree, "after cancel");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

#[test]
fn start_detach_of_a_missing_command_reports_launch_failed_with_127() {
    let root = TestRoot::new();
    let c = ctx(&root, "missing");
    let command = ["/nonexistent/agent-run-test".to_string()];
    let out = c.ctl(&start_args("--detach --json", c.id, &command), 127);
    c.fields(
        &c.detach_line(&out),
        "the detach line",
        json!({"state": "launch_failed"}),
    );
    c.fields(
        &c.wait_final(),
        "status.json",
        json!({"state": "launch_failed"}),
    );
    // A relaunch replays the failure; wait agrees.
    c.ctl(&start_args("--quiet", c.id, &command), 127);
    c.ctl(&["wait", c.id], 127);
}

#[test]
fn start_detach_passes_a_cwd_and_a_label_that_begin_with_a_dash_as_values() {
    let root = TestRoot::new();
    let c = ctx(&root, "dashes");
    let odd = root.dir.path().join("-odd");
    std::fs::create_dir(&odd).expect("the odd dir");
    let cwd = format!("--cwd={}", path_str(&odd));
    let command = ["/bin/pwd".to_string()];
    let mut args = vec![
        "start",
        "--detach",
        cwd.as_str(),
        "--label",
        "k=-v",
        c.id,
        "--",
    ];
    args.extend(command.iter().map(String::as_str));
    c.ctl(&args, 0);
    let st = c.wait_final();
    c.fields(
        &st,
        "status.json",
        json!({"state": "finished", "exit_code": 0, "labels": {"k": "-v"}}),
    );
    c.eq(&st["cwd"], path_str(&odd), "the recorded cwd");
    let out = std::fs::read_to_string(root.run_dir(c.id).join("stdout.log")).unwrap_or_default();
    c.eq(out.trim(), path_str(&odd), "what pwd printed");
}

// =============================================================================================
// Relaunch by run id

/// The command of `counting` (exit 3) run once in the foreground as the run of `c`: its
/// counter and its command.
fn ran_once(c: Ctx) -> (PathBuf, Vec<String>) {
    let counter = c.root.dir.path().join("counter");
    let command = counting(&counter, 3);
    c.ctl(&start_args("--quiet", c.id, &command), 3);
    c.eq(count_lines(&counter), 1, "runs after the first launch");
    (counter, command)
}

/// `sh -c SCRIPT` with `$0` a fifo made for the test to release, `$1` the fixture and `$2` the
/// counter named `counter` in the test's directory: (fifo, counter, command).
fn gated_counting(root: &TestRoot, counter: &str, script: &str) -> (PathBuf, PathBuf, Vec<String>) {
    let fifo = make_fifo(root, "go");
    let counter = root.dir.path().join(counter);
    let command = sh(
        script,
        &[path_str(&fifo), &fixture_path(), path_str(&counter)],
    );
    (fifo, counter, command)
}

/// Launches `args` again for the run of `c`, which exits `want`; then the command counted in
/// `counter` has run `runs` times in all, and status.json did not change.
fn relaunch(c: Ctx, args: &[String], want: i32, counter: &Path, runs: usize) -> Output {
    let before = c.bytes("status.json");
    let out = c.ctl(args, want);
    c.eq(
        count_lines(counter),
        runs,
        "runs of the command after the relaunch",
    );
    c.eq(c.bytes("status.json"), before, "status.json changed");
    out
}

#[test]
fn relaunch_of_a_finished_run_replays_its_exit_code_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "once");
    let (counter, command) = ran_once(c);
    let st = c.status();

    let out = relaunch(
        c,
        &start_args("--quiet --json", c.id, &command),
        3,
        &counter,
        1,
    );
    let record = first_json_object(&text(&out.stdout));
    let record = record.unwrap_or_else(|| c.fail(describe_output("no record on stdout", &out)));
    c.fields(
        &record,
        "the replayed record",
        json!({"state": "finished", "exit_code": 3}),
    );
    c.eq(
        &record["ended_at"],
        &st["ended_at"],
        "the replayed record's ended_at",
    );

    // The bare form (no `start`) is the same command.
    let mut bare = vec![c.id.to_string(), "--".to_string()];
    bare.extend(command);
    c.ctl(&bare, 3);
    c.eq(count_lines(&counter), 1, "runs after the bare relaunch");
}

#[test]
fn relaunch_with_a_different_command_is_refused_with_65() {
    let root = TestRoot::new();
    let c = ctx(&root, "fixed");
    let (counter, _) = ran_once(c);
    let out = relaunch(
        c,
        &start_args("--quiet", c.id, &counting(&counter, 4)),
        65,
        &counter,
        1,
    );
    let said = text(&out.stderr);
    c.check(
        said.starts_with("agent-run: "),
        format_args!("stderr {said:?}"),
    );
}

#[test]
fn relaunch_with_detach_and_a_different_command_is_refused_with_65_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "taken");
    let counter = root.dir.path().join("counter");
    let run = c.start_detached("", &fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    let other = start_args("--detach", c.id, &counting(&counter, 0));

    // While the run is active.
    relaunch(c, &other, 65, &counter, 0);
    c.all_alive(&tree, "the run that owns the id");

    // Once the run is final.
    c.ctl(&["cancel", c.id], 0);
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    relaunch(c, &other, 65, &counter, 0);
}

#[test]
fn relaunch_with_detach_of_a_finished_run_replays_its_exit_code_and_runs_nothing() {
    let root = TestRoot::new();
    let c = ctx(&root, "once-detached");
    let (counter, command) = ran_once(c);
    relaunch(c, &start_args("--detach", c.id, &command), 3, &counter, 1);
}

#[test]
fn relaunch_of_an_active_run_attaches_and_exits_as_the_run_does() {
    let root = TestRoot::new();
    let c = ctx(&root, "active");
    let script = r#"echo started; "$1" count "$2"; read line < "$0"; echo done; exit 6"#;
    let (fifo, counter, command) = gated_counting(&root, "counter", script);
    let run = c.start_detached("", &command);
    c.wait("the workload to count", || match count_lines(&counter) {
        1 => Ok(()),
        n => Err(format!("{n} lines")),
    });

    let relaunch = Spawned::wrapper(&root, &start_args("", c.id, &command));
    let _relaunch_pin = Pinned::new(&[relaunch.child.id() as i32]);
    // Attached: it streams the output written so far.
    c.wait(
        "the relaunch to stream the run's output",
        || match relaunch.stdout_so_far() {
            out if out == b"started\n" => Ok(()),
            out => Err(format!("{:?}", text(&out))),
        },
    );
    // A different command for the same id is refused while it runs too.
    c.ctl(&start_args("", c.id, &fx("exit 0")), 65);

    c.release(&fifo);
    let out = c.finish(relaunch, 6);
    c.eq(
        text(&out.stdout),
        "started\ndone\n",
        "the attached relaunch's stdout",
    );
    c.eq(count_lines(&counter), 1, "runs of the command");
    c.record("status.json", json!({"state": "finished", "exit_code": 6}));
    c.wait_gone(&run.wrapper_pin, "the wrapper");
}

#[test]
fn simultaneous_launches_of_one_new_id_run_the_command_once_and_exit_alike() {
    let root = TestRoot::new();
    let launch_twice = |c: Ctx, args: &[String], between: &dyn Fn()| {
        let (a, b) = (Spawned::wrapper(&root, args), Spawned::wrapper(&root, args));
        let _pins = Pinned::new(&[a.child.id() as i32, b.child.id() as i32]);
        between();
        c.finish(a, 4);
        c.finish(b, 4);
    };
    // A command that ends at once: the second launch may find no record yet, a starting or
    // running one, or a final one.
    for i in 0..6 {
        let id = format!("race-{i}");
        let c = ctx(&root, &id);
        let counter = root.dir.path().join(format!("counter-{i}"));
        launch_twice(
            c,
            &start_args("--quiet", &id, &counting(&counter, 4)),
            &|| {},
        );
        c.eq(count_lines(&counter), 1, "runs of the command");
    }

    // A command that waits: the loser must attach to the winner's run.
    let c = ctx(&root, "race-slow");
    let script = r#""$1" count "$2"; read line < "$0"; exit 4"#;
    let (fifo, counter, command) = gated_counting(&root, "counter-slow", script);
    launch_twice(c, &start_args("--quiet", c.id, &command), &|| {
        c.wait("the command to count", || match count_lines(&counter) {
            0 => Err("no line yet".to_string()),
            _ => Ok(()),
        });
        c.release(&fifo);
    });
    c.eq(count_lines(&counter), 1, "runs of the command");
}
