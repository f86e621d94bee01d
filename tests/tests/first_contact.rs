//! What a new user meets first (issue 11): typos, the man page generator, the records and views
//! of runs that ended, `-d` on an existing run, `remote` with a command that fails at once or a
//! host without agent-run, the watchdog's `--once` pass over an orphan, and the docs held
//! against the binaries.
//!
//! Every test drives the real binaries and asserts on facts (the run root's contents, files a
//! command would have created, /proc, status.json), not on messages alone. Each was run against
//! the binaries of main before this change and fails there (noted per test where the reason is
//! not obvious). Run ids start with `fc-`.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use agent_run_shared::time::epoch_now;
use agent_run_tests::facts::require_root;
use agent_run_tests::first_contact::{
    contract_commands, gen_bin, help, help_has_option, markdown_commands, subcommands_in_help,
    workspace_dir, workspace_file, DocCommand,
};
use agent_run_tests::remote::{strip_messages, SshServer};
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, fixture_bin, processes_with_env,
    run_with_timeout, wait_ready, wait_until_dbg, watchdog_bin, Pinned, TestRoot,
};
use serde_json::Value;

/// The deadline for one command that normally takes well under a second.
const T: Duration = Duration::from_secs(30);

/// `agent-run --root <root> ARGS...` to completion; its exit code must be `want`.
fn ar(root: &TestRoot, args: &[&str], want: i32) -> Output {
    let mut cmd = root.cmd();
    cmd.args(args);
    let what = format!("agent-run {}", args.join(" "));
    let out = run_with_timeout(&mut cmd, T);
    assert_eq!(
        exit_code(&out.status),
        want,
        "{what}: wrong exit code\n{}",
        describe_output(&what, &out)
    );
    out
}

/// Kills, by pid (through pidfds), whatever of this root's runs is alive when the test ends,
/// pass or fail: workloads by their `AGENT_RUN_DIR` marker, wrappers by the `--root` in their
/// argv. Declare it right after the [`TestRoot`], so it runs before the root is removed.
struct Sweep<'a>(&'a TestRoot);

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        let root = self.0.root();
        let prefix = root.as_os_str().as_encoded_bytes().to_vec();
        for _ in 0..50 {
            let mut left = processes_with_env("AGENT_RUN_DIR", |v| v.starts_with(&prefix));
            left.extend(wrappers_of(self.0));
            if left.is_empty() {
                return;
            }
            let pins = Pinned::new(&left);
            for pid in pins.pids() {
                let _ = pins.signal(pid, libc::SIGKILL);
            }
            let _ = pins.wait_all_gone(Duration::from_secs(5));
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What is under the run root (nothing when it does not even exist).
fn root_entries(root: &TestRoot) -> Vec<String> {
    match fs::read_dir(root.root()) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// An executable script that records that it ran by creating `marker`.
fn marker_script(dir: &Path, name: &str, marker: &Path) -> PathBuf {
    let script = dir.join(name);
    fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    script
}

// =============================================================================================
// Typos never launch runs

/// `stop`, `kill`, `ls`, `frobnicate`, `cancle` (and a run id without `--`) exit 64, create
/// nothing under the root, run nothing (the second word is a real program that would leave a
/// marker), and suggest the near subcommand. Before: `stop X` and `kill X` made runs named stop
/// and kill that ran X; `frobnicate` exited 127; `ls` complained about a missing COMMAND.
#[test]
fn a_mistyped_subcommand_exits_64_creates_nothing_and_runs_nothing() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let marker = root.dir.path().join("it-ran");
    let prog = marker_script(root.dir.path(), "train-3", &marker);
    let prog = prog.to_str().unwrap();
    for (args, hint) in [
        (vec!["stop", prog], Some("cancel")),
        (vec!["kill", prog], Some("cancel")),
        (vec!["ls"], Some("list")),
        (vec!["frobnicate", prog], None),
        (vec!["cancle", "fc-x"], Some("cancel")),
        (vec!["fc-no-dashes", prog], None),
    ] {
        let out = ar(&root, &args, 64);
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!("agent-run: unrecognized subcommand '{}'", args[0])),
            "{args:?}: {err}"
        );
        match hint {
            Some(h) => assert!(
                err.contains(&format!("did you mean '{h}'?")),
                "{args:?}: {err}"
            ),
            None => assert!(!err.contains("did you mean"), "{args:?}: {err}"),
        }
        assert!(err.contains("RUN_ID -- COMMAND"), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: stdout {:?}",
            text(&out.stdout)
        );
        assert_eq!(
            root_entries(&root),
            Vec::<String>::new(),
            "{args:?} created runs"
        );
        assert!(!root.root().exists(), "{args:?} created the run root");
        assert!(!marker.exists(), "{args:?} ran {prog}");
    }
    let c = ctx(&root, "fc-with-dashes");
    // The implicit form with `--` still starts a run, and runs the program.
    ar(&root, &["fc-with-dashes", "--quiet", "--", prog], 0);
    ensure!(c, marker.exists(), "agent-run ID -- PROG did not run PROG");
    c.eq(
        &root.status("fc-with-dashes")["state"],
        "finished",
        "root.status(\"fc-with-dashes\")[\"state\"]",
    );
}

// =============================================================================================
// Leases

/// `--lease 0` is refused (64) by `start`, `start -d`, `renew` and `remote`, with a message that
/// says why, and nothing is created. Before: the run started and was stopped at once.
#[test]
fn a_lease_of_zero_is_refused_with_64() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    for args in [
        &["start", "--lease", "0", "fc-l0", "--", "true"][..],
        &["--lease", "0s", "fc-l0", "--", "true"],
        &["start", "-d", "--lease", "0ms", "fc-l0", "--", "true"],
        &["remote", "--lease", "0", "nohost", "--", "true"],
    ] {
        let out = ar(&root, args, 64);
        let err = text(&out.stderr);
        assert!(
            err.starts_with("agent-run: ") && err.contains("a lease must be longer than 0"),
            "{args:?}: {err}"
        );
        assert!(!root.root().exists(), "{args:?} created the run root");
    }
    let c = ctx(&root, "fc-l1");
    ar(
        &root,
        &["-d", "--lease", "1h", "fc-l1", "--", "sleep", "300"],
        0,
    );
    let before = fs::read(root.run_dir("fc-l1").join("lease.json")).unwrap();
    let out = ar(&root, &["renew", "fc-l1", "--lease", "0"], 64);
    ensure!(
        c,
        text(&out.stderr).contains("a lease must be longer than 0"),
        "text(&out.stderr).contains(\"a lease must be longer than 0\")"
    );
    c.eq(
        &fs::read(root.run_dir("fc-l1").join("lease.json")).unwrap(),
        &before,
        "a refused renew changed lease.json",
    );
    ar(&root, &["cancel", "fc-l1"], 0);
}

/// `lease_s` is a float (a JSON number with a fraction) everywhere it is written, whatever unit
/// the lease was given in: lease.json, the journal's launch event, renew's output.
#[test]
fn lease_s_is_always_a_float() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    for (i, lease) in ["90", "2m", "1500ms", "1.5s"].into_iter().enumerate() {
        let id = format!("fc-ls{i}");
        let c = ctx(&root, &id);
        ar(
            &root,
            &["-d", "--lease", lease, &id, "--", "sleep", "300"],
            0,
        );
        let raw = fs::read_to_string(root.run_dir(&id).join("lease.json")).unwrap();
        let v: Value = serde_json::from_str(&raw).unwrap();
        ensure!(
            c,
            v["lease_s"].is_f64(),
            "--lease {lease}: lease.json {raw}"
        );
        let launch = c.events("launch").into_iter().next();
        let launch = launch.unwrap_or_else(|| c.fail("no launch event"));
        ensure!(c, launch["lease_s"].is_f64(), "--lease {lease}: {launch}");
        let out = ar(&root, &["renew", &id, "--lease", lease], 0);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        ensure!(c, v["lease_s"].is_f64(), "renew --lease {lease}: {v}");
        ar(&root, &["cancel", &id], 0);
    }
}

/// A final run shows no lease left: `status` prints no lease line, `status --json` has
/// `lease_remaining_s: null` (its deadline stays, as history), `list --json` agrees. A live run
/// still shows its lease. Before: "lease: 595.2s left" for a finished run.
#[test]
fn a_final_run_has_no_lease_left_in_status() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let c = ctx(&root, "fc-done");
    ar(&root, &["--lease", "10m", "fc-done", "--", "true"], 0);
    let v: Value =
        serde_json::from_slice(&ar(&root, &["status", "--json", "fc-done"], 0).stdout).unwrap();
    c.eq(&v["state"], "finished", "v[\"state\"]");
    ensure!(
        c,
        v["final"].as_bool().unwrap(),
        "v[\"final\"].as_bool().unwrap()"
    );
    c.eq(&v["lease_remaining_s"], &Value::Null, format_args!("{v}"));
    ensure!(c, v["lease_deadline_epoch"].is_f64(), "{v}");
    let human = text(&ar(&root, &["status", "fc-done"], 0).stdout);
    ensure!(c, !human.contains("lease:"), "{human}");
    let list: Value = serde_json::from_slice(&ar(&root, &["list", "--json"], 0).stdout).unwrap();
    c.eq(
        &list[0]["lease_remaining_s"],
        &Value::Null,
        format_args!("{list}"),
    );

    let c = ctx(&root, "fc-live");
    ar(
        &root,
        &["-d", "--lease", "10m", "fc-live", "--", "sleep", "300"],
        0,
    );
    let v: Value =
        serde_json::from_slice(&ar(&root, &["status", "--json", "fc-live"], 0).stdout).unwrap();
    let left = v["lease_remaining_s"].as_f64().unwrap_or(-1.0);
    ensure!(c, (500.0..=600.0).contains(&left), "{v}");
    ensure!(
        c,
        text(&ar(&root, &["status", "fc-live"], 0).stdout).contains("lease:"),
        "text(&ar(&root, &[\"status\", \"fc-live\"], 0).stdout).contains(\"lease:\")"
    );
    ar(&root, &["cancel", "fc-live"], 0);
}

// =============================================================================================
// launch_failed records

/// A launch failure keeps `exit_code: null` (the leader never exited) and records the launch's
/// own code in `launch_exit_code`; `start`, `wait`, a relaunch and `status --json`'s
/// `outcome_exit_code` all give that code. Before: `exit_code` was 127/126.
#[test]
fn a_launch_failure_records_launch_exit_code_and_a_null_exit_code() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let not_exec = root.dir.path().join("not-executable");
    fs::write(&not_exec, "#!/bin/sh\ntrue\n").unwrap();
    fs::set_permissions(&not_exec, fs::Permissions::from_mode(0o644)).unwrap();
    let missing = root.dir.path().join("no-such-command");
    for (id, cmd, code) in [
        ("fc-127", missing.to_str().unwrap(), 127),
        ("fc-126", not_exec.to_str().unwrap(), 126),
    ] {
        ar(&root, &["--quiet", id, "--", cmd], code);
        let st = root.status(id);
        ctx(&root, id).eq(&st["state"], "launch_failed", "st[\"state\"]");
        ctx(&root, id).eq(&st["exit_code"], &Value::Null, "st[\"exit_code\"]");
        ctx(&root, id).eq(&st["launch_exit_code"], code, "st[\"launch_exit_code\"]");
        ctx(&root, id).eq(&st["pid"], &Value::Null, "st[\"pid\"]");
        ar(&root, &["wait", id], code);
        ar(&root, &["--quiet", id, "--", cmd], code);
        let v: Value =
            serde_json::from_slice(&ar(&root, &["status", "--json", id], 0).stdout).unwrap();
        ctx(&root, id).eq(&v["outcome_exit_code"], code, "v[\"outcome_exit_code\"]");
    }
    let c = ctx(&root, "fc-ok");
    // A run that finished has a null launch_exit_code.
    ar(&root, &["fc-ok", "--", "sh", "-c", "exit 3"], 3);
    let st = root.status("fc-ok");
    c.eq(
        &(st["exit_code"].clone(), st["launch_exit_code"].clone()),
        &(3.into(), Value::Null),
        "(st[\"exit_code\"].clone(), st[\"launch_exit_code\"].clone())",
    );
}

// =============================================================================================
// The working directory

/// A run started from a directory that was deleted records the kernel's name for it
/// (`/proc/self/cwd`: "PATH (deleted)"), a string, never "", warns about it, and the workload
/// runs there (its /proc/PID/cwd says the same). Before: `"cwd": ""`.
#[test]
fn a_run_from_a_deleted_directory_records_what_the_kernel_says() {
    let root = TestRoot::new();
    let c = ctx(&root, "fc-cwd");
    let _sweep = Sweep(&root);
    let gone = root.dir.path().join("gone");
    let script = format!(
        "mkdir '{g}' && cd '{g}' && rmdir '{g}' && exec '{bin}' --root '{r}' -d fc-cwd -- sleep 300",
        g = gone.display(),
        bin = agent_run_bin().display(),
        r = root.root().display()
    );
    let out = run_with_timeout(
        Command::new("sh")
            .args(["-c", &script])
            .env_remove("AGENT_RUN_ROOT")
            .stdin(Stdio::null()),
        T,
    );
    ensure!(
        c,
        out.status.success(),
        "{}",
        describe_output(&script, &out)
    );
    let st = root.status("fc-cwd");
    let want = format!("{} (deleted)", gone.display());
    c.eq(&st["cwd"], want.as_str(), "st[\"cwd\"]");
    let warnings = st["warnings"].to_string();
    ensure!(c, warnings.contains("working directory"), "{warnings}");
    let pid = st["pid"].as_i64().unwrap();
    let pin = Pinned::new(&[pid as i32]);
    let cwd = fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
    c.eq(&cwd.to_string_lossy(), &want, "the workload's own cwd");
    ar(&root, &["cancel", "fc-cwd"], 0);
    c.wait_gone(&pin, "the workload after cancel");
}

// =============================================================================================
// -d on a run id that exists

/// Live (non-zombie) agent-run processes of this root: their argv holds `--root <root>`.
fn wrappers_of(root: &TestRoot) -> Vec<i32> {
    processes_with_argv(|argv| argv.iter().any(|a| *a == root.root().display().to_string()))
}

/// Live (non-zombie) processes whose argv `keep` accepts, sorted.
fn processes_with_argv(keep: impl Fn(&[String]) -> bool) -> Vec<i32> {
    let mut pids: Vec<i32> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| {
            let argv = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<String> = argv
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            !argv.is_empty() && keep(&argv)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The wrappers of this root's runs that are alive (found by their `--detached-child` argv).
fn detached_wrappers(root: &TestRoot) -> Vec<i32> {
    let root_arg = root.root().display().to_string();
    processes_with_argv(|argv| {
        argv.iter().any(|a| a == "--detached-child") && argv.contains(&root_arg)
    })
}

/// `-d` of an existing run id never runs the command again and never attaches: one JSON line
/// on stdout with the run's current state, nothing on stderr; the run's own code when it is
/// final, 0 while it is active; no second wrapper left waiting. Before: a `-d` relaunch of an
/// active run left a second wrapper process waiting for the run's end.
#[test]
fn detach_of_an_existing_run_prints_its_line_and_starts_nothing() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let c = ctx(&root, "fc-d-final");
    // Final.
    let cmd = ["fc-d-final", "--", "sh", "-c", "echo once; exit 3"];
    // Returns once the run is running (0), or already final (3) if it was that fast.
    let mut first = root.cmd();
    first.arg("-d").args(cmd);
    let first = run_with_timeout(&mut first, T);
    ensure!(
        c,
        matches!(exit_code(&first.status), 0 | 3),
        "{}",
        describe_output("the first -d", &first)
    );
    let line: Value = serde_json::from_slice(&first.stdout).unwrap();
    let st = root.wait_final("fc-d-final", T);
    c.eq(&st["exit_code"], 3, "st[\"exit_code\"]");
    let again = ar(&root, &[&["-d"][..], &cmd].concat(), 3);
    c.eq(
        &text(&again.stdout).lines().count(),
        &1,
        format_args!("{}", text(&again.stdout)),
    );
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    c.eq(&v["state"], "finished", "v[\"state\"]");
    c.eq(
        &(v["pid"].clone(), v["run_id"].clone()),
        &(line["pid"].clone(), line["run_id"].clone()),
        "(v[\"pid\"].clone(), v[\"run_id\"].clone())",
    );
    ensure!(
        c,
        again.stderr.is_empty(),
        "stderr: {}",
        text(&again.stderr)
    );
    let launches = root
        .event_names("fc-d-final")
        .iter()
        .filter(|e| *e == "launch")
        .count();
    ctx(&root, "fc-d-final").eq(&launches, &1, "launches");
    c.eq(
        fs::read_to_string(root.run_dir("fc-d-final").join("stdout.log")).unwrap(),
        "once\n",
        "fs::read_to_string(root.run_dir(\"fc-d-final\").join(\"stdout.log\")).unwrap()",
    );
    // A different command under the same id: 65, nothing printed on stdout.
    let other = ar(&root, &["-d", "fc-d-final", "--", "true"], 65);
    ensure!(c, other.stdout.is_empty(), "other.stdout.is_empty()");

    let c = ctx(&root, "fc-d-live");
    // Active.
    let cmd = ["fc-d-live", "--", "sleep", "300"];
    ar(&root, &[&["-d"][..], &cmd].concat(), 0);
    let wrapper = root.status("fc-d-live")["wrapper_pid"].as_i64().unwrap() as i32;
    let started = Instant::now();
    let again = ar(&root, &[&["-d"][..], &cmd].concat(), 0);
    ensure!(
        c,
        started.elapsed() < Duration::from_secs(10),
        "started.elapsed() < Duration::from_secs(10)"
    );
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    c.eq(&v["state"], "running", "v[\"state\"]");
    ensure!(
        c,
        again.stderr.is_empty(),
        "stderr: {}",
        text(&again.stderr)
    );
    c.eq(
        &detached_wrappers(&root),
        &vec![wrapper],
        "wrappers of this root",
    );
    let marked = processes_with_env("AGENT_RUN_ID", |v| v == b"fc-d-live");
    c.eq(
        &marked.len(),
        &1,
        format_args!("one workload process: {marked:?}"),
    );
    ar(&root, &["cancel", "fc-d-live"], 0);
}

// =============================================================================================
// agent-run-gen

/// `agent-run-gen --help`, `-h` and `--version` print and exit 0, writing nothing; a stray
/// second argument is refused (64); without an argument it writes into the workspace's
/// target/gen, not into the current directory. Before: `--help` wrote man pages under
/// `./--help/`, and no argument meant `./target/gen` of whatever directory.
#[test]
fn agent_run_gen_parses_its_arguments() {
    let cwd = tempfile::tempdir().unwrap();
    let gen = gen_bin();
    let run = |args: &[&str]| {
        let out = Command::new(&gen)
            .args(args)
            .current_dir(cwd.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (exit_code(&out.status), text(&out.stdout), text(&out.stderr))
    };
    for flag in ["--help", "-h"] {
        let (code, out, _) = run(&[flag]);
        assert_eq!(code, 0, "{flag}");
        assert!(
            out.contains("Usage: agent-run-gen [OUT_DIR]"),
            "{flag}: {out}"
        );
    }
    let (code, out, _) = run(&["--version"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("agent-run-gen {}", agent_run_shared::VERSION).as_str()
        ),
        "(code, out.trim())"
    );
    let (code, _, err) = run(&["a", "b"]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(
        fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "flags wrote files"
    );

    let (code, _, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "no argument wrote into the cwd"
    );
    let page = workspace_dir().join("target/gen/man/man1/agent-run.1");
    let age = fs::metadata(&page)
        .and_then(|m| m.modified())
        .map(|m| SystemTime::now().duration_since(m).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    assert!(
        age < Duration::from_secs(60),
        "{} was not just written",
        page.display()
    );
}

/// The man pages: a page per subcommand `agent-run --help` lists (and no page, nor a reference,
/// for `help`); every synopsis shows each option with its value (`--lease DUR`, `--root DIR`),
/// including the global `--root`; `agent-run(1)` shows the default `RUN_ID -- COMMAND` form.
#[test]
fn the_man_pages_show_every_option_with_its_value() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(gen_bin())
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        describe_output("agent-run-gen", &out)
    );
    let man1 = out_dir.path().join("man/man1");
    let top = help(&agent_run_bin(), &[]);
    let subs = subcommands_in_help(&top);
    assert!(subs.len() >= 10, "{subs:?}");
    let mut pages: BTreeSet<String> = fs::read_dir(&man1)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(pages.remove("agent-run.1"), "pages.remove(\"agent-run.1\")");
    let want: BTreeSet<String> = subs
        .iter()
        .filter(|s| *s != "help")
        .map(|s| format!("agent-run-{s}.1"))
        .collect();
    assert_eq!(pages, want, "pages");
    let roff_of = |p: &Path| fs::read_to_string(p).unwrap().replace("\\-", "-");
    let synopsis_of = |roff: &str| -> String {
        roff.split(".SH SYNOPSIS")
            .nth(1)
            .and_then(|s| s.split(".SH").next())
            .unwrap_or_default()
            .replace("\\fB", "")
            .replace("\\fI", "")
            .replace("\\fR", "")
    };
    for page in fs::read_dir(&man1).unwrap().flatten() {
        let roff = roff_of(&page.path());
        assert!(
            !roff.contains("agent-run-help"),
            "{:?} refers to agent-run-help",
            page.path()
        );
    }
    let top_syn = synopsis_of(&roff_of(&man1.join("agent-run.1")));
    assert!(top_syn.contains("[--root DIR]"), "{top_syn}");
    assert!(top_syn.contains("RUN_ID -- COMMAND [ARGS...]"), "{top_syn}");
    for sub in subs.iter().filter(|s| *s != "help") {
        let syn = synopsis_of(&roff_of(&man1.join(format!("agent-run-{sub}.1"))));
        assert!(
            syn.contains("[--root DIR]"),
            "agent-run-{sub}(1) synopsis lacks --root: {syn}"
        );
        // Every option of `--help` with a value is shown with it.
        for line in help(&agent_run_bin(), &[sub]).lines() {
            let l = line.trim_start();
            let l = l.split_once(", ").map_or(l, |(_, long)| long);
            if let Some((opt, rest)) = l.strip_prefix("--").and_then(|o| o.split_once(' ')) {
                if let Some(value) = rest.strip_prefix('<').and_then(|v| v.split_once('>')) {
                    let shown = format!("--{opt} {}", value.0);
                    assert!(
                        syn.contains(&shown),
                        "agent-run-{sub}(1): no {shown:?} in {syn}"
                    );
                }
            }
        }
    }
    let wd = synopsis_of(&roff_of(
        &out_dir.path().join("man/man8/agent-run-watchdog.8"),
    ));
    for shown in [
        "[--root DIR]",
        "[--once]",
        "[--orphan-grace DUR]",
        "[--scan-interval DUR]",
    ] {
        assert!(
            wd.contains(shown),
            "agent-run-watchdog(8): no {shown} in {wd}"
        );
    }
}

// =============================================================================================
// The docs say what the binaries do

/// The help text of the command a document line runs.
fn help_for(cmd: &DocCommand, subs: &[String]) -> String {
    match (cmd.bin.as_str(), &cmd.sub) {
        ("agent-run-watchdog", _) => help(&watchdog_bin(), &[]),
        (_, Some(sub)) => help(&agent_run_bin(), &[sub]),
        // The implicit start form: its options are start's, plus the global ones.
        (_, None) => {
            assert!(
                subs.iter().any(|s| s == "start"),
                "subs.iter().any(|s| s == \"start\")"
            );
            help(&agent_run_bin(), &["start"])
        }
    }
}

/// Every subcommand and option that docs/contract.md's command-line section and the command
/// lines of the README, docs/usage.md, agents.md, operations.md and development.md name exists
/// in the matching `--help`; every subcommand `--help` lists is in
/// the contract; every exit code of the contract's table is explained by `--help`.
#[test]
fn the_contract_and_the_readme_name_only_what_the_binaries_have() {
    let top = help(&agent_run_bin(), &[]);
    let subs = subcommands_in_help(&top);
    let contract = workspace_file("docs/contract.md");
    let readme = workspace_file("README.md");
    let from_contract = contract_commands(&contract, &subs);
    assert!(from_contract.len() >= 10, "{from_contract:?}");
    let from_readme = markdown_commands(&readme, &subs);
    let used = |cmds: &[DocCommand]| cmds.iter().map(|c| c.options.len()).sum::<usize>();
    // Not vacuous: the parsers find the commands and options the documents show.
    assert!(used(&from_contract) >= 20, "{from_contract:#?}");
    assert!(used(&from_readme) >= 20, "{from_readme:#?}");
    let mut missing = Vec::new();
    let mut docs = vec![
        ("docs/contract.md", from_contract.clone()),
        ("README.md", from_readme),
    ];
    // The reference the README links to: its command lines are held to the binaries too.
    for doc in [
        "docs/usage.md",
        "docs/agents.md",
        "docs/operations.md",
        "docs/development.md",
    ] {
        let cmds = markdown_commands(&workspace_file(doc), &subs);
        assert!(!cmds.is_empty(), "no command line found in {doc}");
        docs.push((doc, cmds));
    }
    for (doc, cmds) in docs {
        for cmd in cmds {
            let h = help_for(&cmd, &subs);
            for opt in &cmd.options {
                if !help_has_option(&h, opt) && !help_has_option(&top, opt) {
                    missing.push(format!("{doc}: {opt} in {:?}", cmd.source));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "options the binaries do not have:\n{}",
        missing.join("\n")
    );
    let in_contract: BTreeSet<String> =
        from_contract.iter().filter_map(|c| c.sub.clone()).collect();
    for sub in subs.iter().filter(|s| *s != "help") {
        assert!(
            in_contract.contains(sub),
            "the contract's command line lacks `agent-run {sub}`"
        );
    }
    // Exit codes: the contract's table rows, explained in `--help` (remote's own in its help).
    let codes_help = format!("{top}\n{}", help(&agent_run_bin(), &["remote"]));
    for row in contract.lines().filter(|l| l.starts_with("| ")) {
        let code = row.trim_start_matches("| ").split(' ').next().unwrap_or("");
        if code.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            assert!(
                codes_help.lines().any(|l| l.trim_start().starts_with(code)),
                "exit code {code} of the contract is not in --help"
            );
        }
    }
}

/// The README's test command is the one script that installs what the suite needs and runs
/// it, and `.ci/run` calls the same script.
#[test]
fn the_readme_test_command_is_the_ci_script() {
    let readme = workspace_file("README.md");
    assert!(
        readme.contains("\nbash .ci/test\n"),
        "README's test command is not `bash .ci/test`"
    );
    let ci = workspace_file(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "bash .ci/test"),
        ".ci/run does not call .ci/test"
    );
    let test = workspace_file(".ci/test");
    for pkg in [
        "openssh-server",
        "openssh-client",
        "iproute2",
        "tini",
        "hyperfine",
        "tmux",
    ] {
        assert!(test.contains(pkg), ".ci/test does not install {pkg}");
    }
    assert!(
        test.contains("cargo test --workspace"),
        "test.contains(\"cargo test --workspace\")"
    );
    let mode = fs::metadata(workspace_dir().join(".ci/test"))
        .unwrap()
        .permissions()
        .mode();
    assert!(mode & 0o111 != 0, ".ci/test is not executable");
}

/// Housekeeping: no compiled Python is tracked, and no file cites the seed documents by a path
/// outside the repository.
#[test]
fn the_repository_cites_only_what_it_holds() {
    let ws = workspace_dir();
    let gitignore = workspace_file(".gitignore");
    assert!(
        gitignore.lines().any(|l| l.trim() == "__pycache__/"),
        ".gitignore: {gitignore}"
    );
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&ws)
        .output()
        .expect("git is needed to list the repository's files");
    assert!(out.status.success(), "git ls-files: {}", text(&out.stderr));
    let files: Vec<String> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(text)
        .collect();
    assert!(files.len() > 20, "{files:?}");
    let pyc: Vec<&String> = files
        .iter()
        .filter(|f| f.ends_with(".pyc") || f.contains("__pycache__"))
        .collect();
    assert!(pyc.is_empty(), "tracked compiled Python: {pyc:?}");
    let outside = ["shared/", "seeds/"].concat();
    for f in &files {
        if let Ok(body) = fs::read_to_string(ws.join(f)) {
            assert!(
                !body.contains(&outside),
                "{f} cites {outside}, which is not in the repository"
            );
        }
    }
    assert!(
        files.iter().any(|f| f == "docs/references.md"),
        "files.iter().any(|f| f == \"docs/references.md\")"
    );
    assert!(
        files.iter().any(|f| f == "docs/contract.md"),
        "files.iter().any(|f| f == \"docs/contract.md\")"
    );
}

// =============================================================================================
// The watchdog's --once pass

/// A lease-less run whose wrapper was kill -9ed is left alone by `--once` within its orphan
/// grace and stopped by the first `--once` pass after it, counted from the wrapper's death
/// (its last heartbeat), not from the first time a pass saw it: `cancelled`, `wrapper_lost`,
/// every process gone. Before: `--once` never stopped it.
#[test]
fn watchdog_once_stops_an_orphan_past_its_orphan_grace() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let id = "fc-orphan";
    let c = ctx(&root, id);
    let fx = fixture_bin();
    let fx = fx.to_str().unwrap();
    ar(
        &root,
        &[
            "-d",
            id,
            "--",
            fx,
            "tree",
            "--children",
            "2",
            "--grandchildren",
        ],
        0,
    );
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), T);
    let tree = Pinned::new(&ready.all_pids());
    let wrapper = root.status(id)["wrapper_pid"].as_i64().unwrap() as i32;
    let wrapper_pin = Pinned::new(&[wrapper]);
    let killed_at = epoch_now();
    wrapper_pin.signal(wrapper, libc::SIGKILL).unwrap();
    c.wait_gone(&wrapper_pin, "the SIGKILLed wrapper");

    let once = |grace: &str| {
        let mut cmd = root.watchdog_cmd();
        cmd.args(["--once", "--orphan-grace", grace]);
        let out = run_with_timeout(&mut cmd, T);
        ensure!(
            c,
            out.status.success(),
            "{}",
            describe_output("agent-run-watchdog --once", &out)
        );
        out
    };
    once("1h");
    c.eq(
        &tree.alive(),
        &ready.all_pids(),
        "--once stopped the run within its grace",
    );
    c.eq(
        &root.status(id)["state"],
        "running",
        "root.status(id)[\"state\"]",
    );

    // Passes every 100 ms, as a tight timer would run them, with a 1 s orphan grace.
    let grace = 1.0;
    let stopped_at = wait_until_dbg("a --once pass that stops the orphan", T, || {
        let before = epoch_now();
        once("1s");
        match root.try_status(id) {
            Ok(st) if st["state"] != "running" => Ok(before),
            other => {
                std::thread::sleep(Duration::from_millis(100));
                Err(format!("{other:?}"))
            }
        }
    });
    let st = root.status(id);
    c.eq(
        &(st["state"].as_str(), st["reason"].as_str()),
        &(Some("cancelled"), Some("wrapper_lost")),
        "(st[\"state\"].as_str(), st[\"reason\"].as_str())",
    );
    c.wait_gone_within(&tree, Duration::from_secs(5), "the orphan's processes");
    let after = stopped_at - killed_at;
    // Never before the grace after the death; at most a heartbeat interval and its slack later.
    ensure!(
        c,
        after >= grace - 0.2,
        "stopped {after:.2} s after the wrapper died, within the 1 s grace"
    );
    let late =
        (agent_run_shared::heartbeat::INTERVAL + agent_run_shared::heartbeat::LATE).as_secs_f64();
    ensure!(
        c,
        after <= grace + late + 2.0,
        "stopped only {after:.2} s after the wrapper died"
    );
}

// =============================================================================================
// remote: fast failures and a host without agent-run

/// The wrapper's heartbeat, the lock's mtime, goes on beating about every second while a run
/// lasts, though its thread starts only some time after the launch (issue 17: a run that is
/// over by then, most short commands, makes no thread for it). A late start that never came
/// would leave the first beat alone, and a watchdog counting an orphan's grace from it.
#[test]
fn a_lasting_run_beats_every_second_after_the_late_start_of_its_heartbeat() {
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let id = "fc-beat";
    let c = ctx(&root, id);
    ar(&root, &["-d", id, "--", "sleep", "60"], 0);
    let lock = root.run_dir(id).join("lock");
    let mtime = || fs::metadata(&lock).and_then(|m| m.modified()).ok();
    let beat_after = |after: SystemTime| {
        wait_until_dbg("the next heartbeat (the lock's mtime)", T, || {
            match mtime() {
                Some(m) if m > after => Ok(m),
                seen => {
                    std::thread::sleep(Duration::from_millis(20));
                    Err(seen)
                }
            }
        })
    };
    let first = mtime().expect("the lock exists once -d returns");
    let second = beat_after(first);
    let third = beat_after(second);
    let gap = third.duration_since(second).unwrap_or_default();
    ensure!(
        c,
        gap >= Duration::from_millis(500) && gap <= Duration::from_secs(5),
        "two beats {gap:?} apart, not about a second"
    );
    ar(&root, &["cancel", id], 0);
    let st = root.wait_final(id, T);
    c.eq(&st["state"], "cancelled", "st[\"state\"]");
}

/// `agent-run remote` against our own sshd on loopback, with the host's run root under `root`.
fn remote_cmd(srv: &SshServer, root: &TestRoot, xdg: &Path, bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(agent_run_bin());
    cmd.arg("remote")
        .args(srv.remote_args())
        .arg("--remote-bin")
        .arg(bin)
        .arg("--remote-root")
        .arg(root.root())
        .args(args)
        .env("XDG_RUNTIME_DIR", xdg)
        .env_remove("AGENT_RUN_ROOT")
        .stdin(Stdio::null());
    cmd
}

/// 20 runs of a workload that prints on both streams and exits 7 within a millisecond: every
/// byte arrives every time, and the exit code is 7; the host's records agree. Before: 4 of 5
/// runs printed nothing (the launch's `|| exit` skipped `attach` once the run was final).
#[test]
fn remote_never_loses_the_output_of_a_command_that_fails_at_once() {
    require_root();
    let srv = SshServer::start(None);
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let xdg = tempfile::tempdir().unwrap();
    let script = "printf 'out 1\\nout 2\\n'; printf 'err 1\\n' >&2; exit 7";
    for i in 0..20 {
        let id = format!("fc-fast-{i}");
        let c = ctx(&root, &id);
        let mut cmd = remote_cmd(
            &srv,
            &root,
            xdg.path(),
            &agent_run_bin(),
            &["--id", &id, &srv.host(), "--", "sh", "-c", script],
        );
        let out = run_with_timeout(&mut cmd, T * 2);
        let what = format!("remote run {i}");
        c.eq(
            &exit_code(&out.status),
            &7,
            format_args!("{}", describe_output(&what, &out)),
        );
        c.eq(
            text(&out.stdout),
            "out 1\nout 2\n",
            format_args!("{}", describe_output(&what, &out)),
        );
        c.eq(
            text(&strip_messages(&out.stderr)),
            "err 1\n",
            format_args!("{}", describe_output(&what, &out)),
        );
        let st = root.status(&id);
        c.eq(
            &(st["state"].as_str(), st["exit_code"].as_i64()),
            &(Some("finished"), Some(7)),
            "(st[\"state\"].as_str(), st[\"exit_code\"].as_i64())",
        );
    }
    // A workload that is not found, and one that exits 127 itself, are the run's own 127.
    for (id, cmd) in [
        ("fc-r127-missing", vec!["/nonexistent/fc-command"]),
        ("fc-r127-own", vec!["sh", "-c", "echo before; exit 127"]),
    ] {
        let c = ctx(&root, id);
        let mut args = vec!["--id", id, "--lease", "30s"];
        let host = srv.host();
        args.push(&host);
        args.push("--");
        args.extend(cmd);
        let out = run_with_timeout(
            &mut remote_cmd(&srv, &root, xdg.path(), &agent_run_bin(), &args),
            T * 2,
        );
        c.eq(
            &exit_code(&out.status),
            &127,
            format_args!("{}", describe_output(id, &out)),
        );
        ensure!(
            c,
            !text(&out.stderr).contains("cannot run agent-run"),
            "{}",
            describe_output(id, &out)
        );
        let st = root.status(id);
        ensure!(
            c,
            matches!(st["state"].as_str(), Some("launch_failed" | "finished")),
            "{st}"
        );
    }
    assert_eq!(
        text(
            &run_with_timeout(
                &mut remote_cmd(
                    &srv,
                    &root,
                    xdg.path(),
                    &agent_run_bin(),
                    &[
                        "--id",
                        "fc-r127-own2",
                        &srv.host(),
                        "--",
                        "sh",
                        "-c",
                        "echo before; exit 127"
                    ]
                ),
                T * 2
            )
            .stdout
        ),
        "before\n", "text( &run_with_timeout( &mut remote_cmd( &srv, &root, xdg.path(), &agent_run_bin(), &[ \"--id\", \"fc-r127-own2\", &srv.host(), \"--\", \"sh\", \"-c\", \"echo before; exit 127\" ] ), T * 2 ) .stdout )"
    );
}

/// With agent-run missing on the host, `remote` says so itself, naming the program and the
/// host, and exits 72 (not the shell's 127, which reads like the workload's); `--status` and
/// `--cancel` too. Nothing is created on the host. Before: the remote shell's "No such file or
/// directory" and 127.
#[test]
fn remote_with_agent_run_missing_on_the_host_says_so_and_exits_72() {
    require_root();
    let srv = SshServer::start(None);
    let root = TestRoot::new();
    let _sweep = Sweep(&root);
    let xdg = tempfile::tempdir().unwrap();
    let missing = Path::new("/nonexistent/agent-run");
    let not_exec = root.dir.path().join("agent-run-not-executable");
    fs::write(&not_exec, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&not_exec, fs::Permissions::from_mode(0o644)).unwrap();
    let host = srv.host();
    for bin in [missing, not_exec.as_path()] {
        for args in [
            vec![host.as_str(), "--", "true"],
            vec![host.as_str(), "--status", "fc-x"],
            vec![host.as_str(), "--cancel", "fc-x"],
            vec![host.as_str(), "--attach", "fc-x"],
        ] {
            let mut cmd = remote_cmd(&srv, &root, xdg.path(), bin, &args);
            let out = run_with_timeout(&mut cmd, T * 2);
            let what = format!("remote --remote-bin {} {args:?}", bin.display());
            assert_eq!(
                exit_code(&out.status),
                72,
                "{}",
                describe_output(&what, &out)
            );
            let err = text(&out.stderr);
            let said = err
                .lines()
                .find(|l| {
                    l.starts_with("agent-run: ")
                        && (l.contains("cannot run agent-run on ")
                            || l.contains("is not installed on ")
                            || l.contains("cannot be executed"))
                })
                .unwrap_or_else(|| panic!("no message of ours: {}", describe_output(&what, &out)));
            assert!(
                said.contains(&host) && said.contains(&bin.display().to_string()),
                "{said}"
            );
            assert!(said.contains("--remote-bin"), "{said}");
            assert!(!root.root().exists(), "{what} created the run root");
        }
    }
}
