//! [trust]: nothing a workload can write decides what gets signalled, and no file in a run dir
//! can hang or fool a reader.
//!
//! Each test plays the workload: it rewrites the run's own status.json, lease.json or
//! cancel.json, plants FIFOs, sockets, symlinks and huge files, squats on the run's lock. The
//! assertions are on the process table (the victim and the run's tree, pinned by pidfds) and
//! on the journal (no `signal` event to a process that is not the run's).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agent_run_tests::cases;
use agent_run_tests::facts::{dir_with_mode, ended};
use agent_run_tests::hostile::{
    as_nobody, edit_status, epoch_now, events_named, outcome, pin_tree, plant, signals_to,
    write_lease, Daemon, Detached, Plant, Victim, CMD, NOBODY,
};
use agent_run_tests::{
    agent_run_bin, ctx, ensure, fixture_bin, wait_until_dbg, watchdog_bin, Ctx, Pinned, TestRoot,
};
use serde_json::{json, Value};

/// Who plays controller and workload: root, or `nobody` in a root of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum User {
    Root,
    Nobody,
}

struct Side<'a> {
    root: &'a TestRoot,
    user: User,
}

/// A test's orphan `id` of root with a 1 h lease ([`Side::leased_orphan`]): its checks, its
/// side, the run and its tree.
fn root_orphan<'a>(root: &'a TestRoot, id: &'a str) -> (Ctx<'a>, Side<'a>, Detached, Pinned) {
    let side = Side::new(root, User::Root);
    let (run, tree) = side.leased_orphan(id);
    (ctx(root, id), side, run, tree)
}

/// Waits until the run of `c` is final and stopped by its lease (`lease_expired`), and its
/// `tree` gone: the record, and when it was seen final (epoch seconds).
fn stopped_by_lease(c: Ctx, tree: &Pinned, what: &str) -> (Value, f64) {
    let st = c.root.wait_final(c.id, Duration::from_secs(20));
    let ended = epoch_now();
    c.eq(&st["reason"], "lease_expired", "st[\"reason\"]");
    c.wait_gone(tree, what);
    (st, ended)
}

impl<'a> Side<'a> {
    fn new(root: &'a TestRoot, user: User) -> Side<'a> {
        if user == User::Nobody {
            // nobody must reach its root: the temp dir is root's, 0700.
            fs::set_permissions(root.dir.path(), fs::Permissions::from_mode(0o755))
                .expect("chmod the test dir");
            fs::create_dir(root.root()).expect("create nobody's root");
            fs::set_permissions(root.root(), fs::Permissions::from_mode(0o700)).expect("chmod");
            std::os::unix::fs::chown(root.root(), Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        Side { root, user }
    }

    fn program(&self, program: &Path) -> Command {
        let mut cmd = match self.user {
            User::Root => {
                let mut c = Command::new(program);
                c.stdin(std::process::Stdio::null());
                c
            }
            User::Nobody => as_nobody(program),
        };
        cmd.env_remove("AGENT_RUN_ROOT").env(
            agent_run_tests::LEASE_TOKEN_ENV,
            agent_run_tests::LEASE_TOKEN,
        );
        cmd
    }

    fn agent_run(&self) -> Command {
        let mut cmd = self.program(&agent_run_bin());
        cmd.arg("--root").arg(self.root.root());
        cmd
    }

    fn watchdog(&self) -> Command {
        let mut cmd = self.program(&watchdog_bin());
        cmd.arg("--root").arg(self.root.root());
        cmd
    }

    fn start(&self, id: &str, opts: &[&str], argv: &[&str]) -> Detached {
        Detached::start(self.root, self.agent_run(), id, opts, argv)
    }

    /// A tree leased for an hour, with a 1 s grace, whose wrapper is then SIGKILLed: the
    /// watchdog's to stop. The run and its pinned tree.
    fn leased_orphan(&self, id: &str) -> (Detached, Pinned) {
        self.leased_orphan_with(id, &[])
    }

    /// [`Side::leased_orphan`] with more start options (`--cgroup off`).
    fn leased_orphan_with(&self, id: &str, opts: &[&str]) -> (Detached, Pinned) {
        let mut all = vec!["--lease", "1h", "--grace", "1s"];
        all.extend_from_slice(opts);
        let run = self.start(id, &all, &strs(&tree()));
        let (_, tree) = pin_tree(self.root, id);
        run.kill_wrapper();
        (run, tree)
    }

    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        outcome(self.agent_run().args(args))
    }

    /// Edit the record as its owner would (root can edit nobody's files, the mode stays 0600
    /// and the owner is kept).
    fn edit(&self, dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
        edit_status(dir, f);
        if self.user == User::Nobody {
            std::os::unix::fs::chown(dir.join("status.json"), Some(NOBODY), Some(NOBODY))
                .expect("chown the edited record");
        }
    }

    /// Writes lease.json in `dir` with its deadline `secs` from now (past when negative), as
    /// the run's user; the deadline (epoch seconds).
    fn lease_in(&self, dir: &Path, secs: f64) -> f64 {
        let deadline = epoch_now() + secs;
        write_lease(dir, deadline, 1.0);
        if self.user == User::Nobody {
            std::os::unix::fs::chown(dir.join("lease.json"), Some(NOBODY), Some(NOBODY))
                .expect("chown lease");
        }
        deadline
    }
}

fn tree() -> Vec<String> {
    vec![
        fixture_bin().display().to_string(),
        "tree".into(),
        "--children".into(),
        "1".into(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn no_signal_to(root: &TestRoot, id: &str, pids: &[i32]) {
    let c = ctx(root, id);
    let sent = signals_to(root, id, pids);
    ensure!(
        c,
        sent.is_empty(),
        "signals journalled to {pids:?}: {sent:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Identity: every key required, the wrapper confirmed by the kernel

const IDENTITY_KEYS: [&str; 8] = [
    "pid",
    "pgid",
    "sid",
    "start_ticks",
    "boot_id",
    "uid",
    "wrapper_pid",
    "wrapper_start_ticks",
];

fn a_record_missing_any_identity_key_still_gets_its_run_stopped(user: User) {
    let root = TestRoot::new();
    let side = Side::new(&root, user);
    for key in IDENTITY_KEYS {
        // A live wrapper: found by the kernel (the holder of the run's lock), whatever the
        // record lacks; renewed and stopped through it.
        let id = format!("missing-{}", key.replace('_', "-"));
        let c = ctx(&root, &id);
        let run = side.start(&id, &["--lease", "1h"], &strs(&tree()));
        let (_, pins) = pin_tree(&root, &id);
        side.edit(&run.dir, |st| {
            st.remove(key);
        });
        let (code, _, err) = side.ctl(&["renew", &id, "--lease", "1h"]);
        c.eq(&code, &0, format_args!("renew without {key}: {err}"));
        let (code, _, err) = side.ctl(&["cancel", &id]);
        c.eq(&code, &0, format_args!("cancel without {key}: {err}"));
        c.wait_gone(&pins, &format!("the tree after cancel without {key}"));
        c.wait_gone(&run.wrapper_pin, "the wrapper after its stop");

        // The wrapper gone and the lease long expired: the watchdog goes by the run's cgroup
        // and marker, and signals nothing else.
        let id = format!("missing-{}-orphan", key.replace('_', "-"));
        let c = ctx(&root, &id);
        let run = side.start(&id, &["--lease", "1h"], &strs(&tree()));
        let (_, pins) = pin_tree(&root, &id);
        run.kill_wrapper();
        side.edit(&run.dir, |st| {
            st.remove(key);
        });
        side.lease_in(&run.dir, -60.0);
        let (code, _, err) = outcome(side.watchdog().args(["--once", "--orphan-grace", "0"]));
        c.eq(&code, &0, format_args!("watchdog --once: {err}"));
        c.wait_gone(
            &pins,
            &format!("the tree after the watchdog, without {key}"),
        );
        let st = root.wait_final(&id, CMD);
        ensure!(
            c,
            st["state"] == "cancelled" || st["state"] == "unknown",
            "without {key}: {st}"
        );
    }
}

cases!(a_record_missing_any_identity_key_still_gets_its_run_stopped;
    a_record_missing_any_identity_key_still_gets_its_run_stopped_as_root => User::Root,
    a_record_missing_any_identity_key_still_gets_its_run_stopped_as_nobody => User::Nobody,
);

/// A rewrite of a record, as the workload would do it.
type Forgery<'a> = dyn Fn(&mut serde_json::Map<String, Value>) + 'a;

fn a_forged_wrapper_gets_nothing_signalled(user: User) {
    let root = TestRoot::new();
    let side = Side::new(&root, user);
    // The victim belongs to the same user as the run.
    let victim = match user {
        User::Root => Victim::spawn(false),
        // A process of nobody's, outside the run.
        User::Nobody => Victim::spawn_as(NOBODY),
    };
    let forgeries: Vec<(&str, Box<Forgery<'_>>)> = vec![
        (
            "the victim's pid, no start ticks",
            Box::new(|st| {
                st.insert("wrapper_pid".into(), victim.pid.into());
                st.remove("wrapper_start_ticks");
            }),
        ),
        (
            "the victim's pid and its true start ticks",
            Box::new(|st| {
                st.insert("wrapper_pid".into(), victim.pid.into());
                st.insert("wrapper_start_ticks".into(), victim.ticks().into());
            }),
        ),
        (
            "pid 1",
            Box::new(|st| {
                st.insert("wrapper_pid".into(), 1.into());
                st.insert("wrapper_start_ticks".into(), 1.into());
            }),
        ),
    ];
    for (n, (what, forge)) in forgeries.iter().enumerate() {
        let id = format!("forged-wrapper-{n}");
        let c = ctx(&root, &id);
        let run = side.start(&id, &["--lease", "1h"], &strs(&tree()));
        let (_, tree) = pin_tree(&root, &id);
        side.edit(&run.dir, forge);
        // The wrapper is the holder of the run's lock: renewed and stopped through it, never
        // through what the record names.
        for args in [vec!["renew", &id, "--lease", "1h"], vec!["cancel", &id]] {
            let (code, _, err) = side.ctl(&args);
            c.eq(
                &code,
                &0,
                format_args!("{args:?} with a wrapper_pid of {what}: {err}"),
            );
        }
        victim.assert_alive(&format!("after renew and cancel ({what})"), &root, &id);
        c.wait_gone(&tree, "the run's tree");
        c.wait_gone(&run.wrapper_pin, "the real wrapper, after its stop");
        no_signal_to(&root, &id, &[victim.pid, 1]);
        let st = root.wait_final(&id, CMD);
        c.eq(&st["state"], "cancelled", format_args!("{what}: {st}"));
    }
    victim.assert_alive("at the end", &root, "forged-wrapper-0");
}

#[test]
fn a_record_naming_an_unrelated_process_or_pid_1_as_its_wrapper_gets_nothing_the_true_one_stops_it_as_root(
) {
    a_forged_wrapper_gets_nothing_signalled(User::Root);
}

#[test]
fn a_record_naming_an_unrelated_process_or_pid_1_as_its_wrapper_gets_nothing_the_true_one_stops_it_as_nobody(
) {
    a_forged_wrapper_gets_nothing_signalled(User::Nobody);
}

#[test]
fn a_record_rewritten_to_name_another_session_leader_lends_it_nothing_after_the_wrapper_dies() {
    let root = TestRoot::new();
    let side = Side::new(&root, User::Root);
    for (n, by) in ["cancel", "watchdog"].iter().enumerate() {
        let id = format!("forged-leader-{n}");
        let c = ctx(&root, &id);
        let run = side.start(&id, &["--lease", "1h", "--grace", "1s"], &strs(&tree()));
        // Started after the run, like the user's next login shell.
        let victim = Victim::spawn(true);
        let (_, tree) = pin_tree(&root, &id);
        run.kill_wrapper();
        let ticks = victim.ticks();
        side.edit(&run.dir, |st| {
            for k in ["pid", "pgid", "sid"] {
                st.insert(k.into(), victim.pid.into());
            }
            st.insert("start_ticks".into(), ticks.into());
        });
        if *by == "cancel" {
            let (code, out, err) = side.ctl(&["cancel", "--json", &id]);
            c.eq(&code, &0, format_args!("cancel: {err}"));
            ensure!(c, out.contains("\"unknown\""), "cancel printed {out}");
        } else {
            side.lease_in(&run.dir, -1.0);
            let (code, _, err) = outcome(side.watchdog().args(["--once"]));
            c.eq(&code, &0, format_args!("watchdog: {err}"));
        }
        let st = root.wait_final(&id, CMD);
        victim.assert_alive(&format!("after the {by}"), &root, &id);
        no_signal_to(&root, &id, &[victim.pid]);
        // The run's own processes carry its marker: they were found and stopped.
        tree.wait_all_gone(CMD)
            .unwrap_or_else(|p| c.fail(format_args!("the run's tree {p:?} survived")));
        // Nobody can vouch for the process the record now names: not cancelled, and named.
        c.eq(&st["state"], "unknown", "st[\"state\"]");
        let survivors: Vec<i64> = st["cleanup"]["survivors"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        ensure!(
            c,
            survivors.contains(&(victim.pid as i64)),
            "the unverified leader is not named: {st}"
        );
    }
}

#[test]
fn the_watchdog_as_root_never_signals_pid_1_inside_a_pid_namespace() {
    // The record names pid 1 (the namespace's init) as its wrapper, has no wrapper start ticks,
    // a dead leader and a long expired lease; every process of the namespace started after
    // the record's start_ticks. The watchdog runs inside the namespace as root.
    let root = TestRoot::new();
    let r = root.root();
    dir_with_mode(&r, 0o700);
    let id = "pid1";
    let c = ctx(&root, id);
    let dir = r.join(id);
    dir_with_mode(&dir, 0o700);
    for variant in ["no wrapper_start_ticks", "init's true start ticks"] {
        let mut rec = serde_json::json!({
            "schema": 1, "run_id": id, "state": "running", "reason": null, "exit_code": null,
            "term_signal": null, "argv": ["sleep", "1"], "cwd": "/", "pid": 4_000_000,
            "pgid": 4_000_000, "sid": 4_000_000, "start_ticks": 1,
            "boot_id": fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim(),
            "wrapper_pid": 1, "host": "h", "user": "root", "uid": 0,
            "created_at": "2026-01-01T00:00:00.000Z", "started_at": null, "ended_at": null,
            "cleanup": null, "error": null, "version": "0", "grace_ms": 500, "hup_after_ms": 100,
        });
        if variant != "no wrapper_start_ticks" {
            rec["wrapper_start_ticks"] = Value::from("__INIT_TICKS__");
        }
        let text = serde_json::to_string(&rec).unwrap();
        // Inside the namespace: start the victims, put the record in place (with init's start
        // ticks where asked), run one watchdog pass, report who is still alive.
        let script = format!(
            r#"set -u
{fx} sleep-ms 60000 & v1=$!
setsid {fx} sleep-ms 60000 & v2=$!
ticks=$(cut -d' ' -f22 /proc/1/stat)
printf '%s' '{text}' | sed "s/\"__INIT_TICKS__\"/$ticks/" > {dir}/status.json
chmod 600 {dir}/status.json
printf '{{"deadline_epoch":1,"lease_s":1}}' > {dir}/lease.json
chmod 600 {dir}/lease.json
{wd} --root {root} --once --orphan-grace 0 --slack 0s 2>{dir}/wd.err; echo "rc=$?"
for p in 1 $v1 $v2; do
  if [ -d /proc/$p ] && [ "$(cut -d' ' -f3 /proc/$p/stat)" != Z ]; then echo "alive $p"; else echo "gone $p"; fi
done
"#,
            fx = fixture_bin().display(),
            wd = watchdog_bin().display(),
            dir = dir.display(),
            root = r.display(),
        );
        let out = agent_run_tests::run_with_timeout(
            Command::new("unshare")
                .args(["--fork", "--pid", "--mount-proc", "sh", "-c"])
                .arg(&script),
            CMD,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let wd_err = fs::read_to_string(dir.join("wd.err")).unwrap_or_default();
        ensure!(c, text.contains("rc=0"), "{variant}: {text}\n{wd_err}");
        for line in text
            .lines()
            .filter(|l| l.starts_with("alive") || l.starts_with("gone"))
        {
            ensure!(
                c,
                line.starts_with("alive"),
                "{variant}: {line}\n{text}\nwatchdog: {wd_err}"
            );
        }
        c.eq(
            &text.lines().filter(|l| l.starts_with("alive")).count(),
            &3,
            format_args!("{text}"),
        );
        no_signal_to(&root, id, &[1]);
        // Nothing of the run was found (pid 1 is no wrapper, and no process carries the
        // run's marker): the record says so, never that the run was stopped.
        let st = root.status(id);
        c.fields(
            &st,
            &format!("{variant}: {st}"),
            ended("unknown", "wrapper_lost"),
        );
        let _ = fs::remove_file(dir.join("events.jsonl"));
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Only regular files are read; nothing hangs a reader

#[test]
fn fifos_sockets_symlinks_and_huge_files_in_run_dirs_hang_nothing_and_other_leases_hold() {
    let root = TestRoot::new();
    // The run whose lease must be enforced on time while the others are hostile.
    let (c, side, leased, leased_tree) = root_orphan(&root, "on-time");
    let mut planted = Vec::new();
    let mut sockets = Vec::new();
    for file in ["status.json", "lease.json", "cancel.json"] {
        for kind in Plant::ALL {
            let id = format!("{}-{kind:?}", file.trim_end_matches(".json")).to_lowercase();
            let run = side.start(&id, &["--lease", "1h", "--grace", "1s"], &strs(&tree()));
            let (_, t) = pin_tree(&root, &id);
            sockets.push(plant(&run.dir.join(file), kind));
            planted.push((file, kind, id, run, t));
        }
    }
    let mut dog = Daemon::start(side.watchdog(), &["--scan-interval", "1s"]);
    // Let the daemon meet every planted file (a rescan and the events), then let the lease
    // of the orphan run out.
    let deadline = side.lease_in(&leased.dir, 2.0);
    let (st, ended) = stopped_by_lease(c, &leased_tree, "the leased tree");
    c.eq(&st["state"], "cancelled", "st[\"state\"]");
    ensure!(
        c,
        ended - deadline < 3.0,
        "the lease was enforced {:.2}s late beside the planted files\n{}",
        ended - deadline,
        dog.stderr()
    );
    ensure!(c, dog.running(), "the daemon died: {}", dog.stderr());

    // Every reader returns, and says what is wrong.
    let t0 = Instant::now();
    let (code, out, err) = side.ctl(&["list"]);
    c.eq(&code, &0, format_args!("list: {err}"));
    ensure!(
        c,
        t0.elapsed() < Duration::from_secs(10),
        "list took {:?}",
        t0.elapsed()
    );
    for (file, kind, id, run, tree) in &planted {
        let c = ctx(&root, id);
        let t0 = Instant::now();
        let (scode, _, serr) = side.ctl(&["status", "--json", id]);
        let (ccode, _, cerr) = side.ctl(&["cancel", id, "--wait", "20s"]);
        ensure!(
            c,
            t0.elapsed() < Duration::from_secs(25),
            "{file} as {kind:?}: status+cancel took {:?}",
            t0.elapsed()
        );
        if *file == "status.json" {
            ensure!(
                c,
                err.contains(id.as_str()) || out.contains(id.as_str()),
                "list does not show {id}: {out} {err}"
            );
            ensure!(
                c,
                scode != 0,
                "status of a planted status.json ({kind:?}): both {:?}",
                scode
            );
            ensure!(
                c,
                serr.contains("status.json"),
                "status names no file: {serr}"
            );
            // The record cannot be read, but the wrapper holds the run: it is asked, ends its
            // run, and writes its record over the planted file.
            c.eq(
                &ccode,
                &0,
                format_args!("cancel with a planted status.json ({kind:?}): {cerr}"),
            );
            ensure!(
                c,
                cerr.contains("status.json"),
                "cancel names no file: {cerr}"
            );
            c.wait_gone(&run.wrapper_pin, "the wrapper, after its stop");
            c.eq(
                &root.wait_final(id, CMD)["state"],
                "cancelled",
                "the wrapper's record",
            );
        } else {
            c.eq(
                &scode,
                &0,
                format_args!("status with a planted {file} ({kind:?}): {serr}"),
            );
            c.eq(
                &ccode,
                &0,
                format_args!("cancel with a planted {file} ({kind:?}): {cerr}"),
            );
            c.record("the record", json!({"state": "cancelled"}));
        }
        tree.wait_all_gone(CMD)
            .unwrap_or_else(|p| c.fail(format_args!("{id}: {p:?} alive")));
    }
    ensure!(c, dog.running(), "the daemon died: {}", dog.stderr());
    drop(sockets);
    dog.stop_cleanly(c);
}

// ---------------------------------------------------------------------------------------------
// 3. argv byte-exact

#[test]
fn argv_that_is_not_utf8_is_stored_byte_exact_and_a_relaunch_that_differs_in_one_byte_is_refused() {
    use std::os::unix::ffi::OsStringExt;
    let root = TestRoot::new();
    let c = ctx(&root, "u2");
    let arg = |b: &[u8]| std::ffi::OsString::from_vec(b.to_vec());
    let run = |last: &[u8]| {
        let mut cmd = root.cmd();
        cmd.args(["u2", "--", "/bin/echo"]).arg(arg(last));
        outcome(&mut cmd)
    };
    let (code, out, err) = run(b"A\xff");
    c.eq(&code, &0, format_args!("{err}"));
    let _ = out;
    let log = fs::read(root.run_dir("u2").join("stdout.log")).unwrap();
    c.eq(&log, b"A\xff\n", "the workload got other bytes");
    let st = root.status("u2");
    let b64: Vec<&str> = st["argv_b64"]
        .as_array()
        .expect("argv_b64 is set for a non-UTF-8 argv")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    c.eq(&b64, &["L2Jpbi9lY2hv", "Qf8="], format_args!("{st}"));
    let (code, _, err) = run(b"A\xfe");
    c.eq(
        &code,
        &65,
        format_args!("a relaunch with other bytes must be refused: {err}"),
    );
    let (code, _, err) = run(b"A\xff");
    c.eq(
        &code,
        &0,
        format_args!("the same bytes replay the run: {err}"),
    );
    let log = fs::read(root.run_dir("u2").join("stdout.log")).unwrap();
    c.eq(&log, b"A\xff\n", "the command ran twice");
    // A UTF-8 argv keeps argv_b64 null.
    let c = ctx(&root, "plain");
    let (code, _, err) = outcome(root.cmd().args(["plain", "--", "/bin/true"]));
    c.eq(code, 0, format_args!("a plain run: {err}"));
    ensure!(
        c,
        c.status()["argv_b64"].is_null(),
        "argv_b64 of a UTF-8 argv"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Every signal journalled

#[test]
fn renew_journals_its_wake_up_signal_to_the_wrapper() {
    let root = TestRoot::new();
    let c = ctx(&root, "renewed");
    let side = Side::new(&root, User::Root);
    let run = side.start("renewed", &["--lease", "1h"], &strs(&tree()));
    let (_, tree) = pin_tree(&root, "renewed");
    let (code, _, err) = side.ctl(&["renew", "renewed", "--lease", "2h"]);
    c.eq(&code, &0, format_args!("{err}"));
    let sent = signals_to(&root, "renewed", &[run.wrapper]);
    ensure!(
        c,
        sent.iter()
            .any(|e| e["signal"] == "USR1" && e["reason"] == "renew" && e["by"] == "renew"),
        "no USR1 journalled: {sent:?}"
    );
    let (code, _, _) = side.ctl(&["cancel", "renewed"]);
    c.eq(&code, &0, "code");
    c.wait_gone(&tree, "the tree after cancel");
}

// ---------------------------------------------------------------------------------------------
// 5. Skipped runs are retried; a damaged lease is said once and its deadline kept

#[test]
fn a_run_dir_whose_mode_was_changed_is_set_back_and_its_lease_enforced_on_time() {
    let root = TestRoot::new();
    let (c, side, run, tree) = root_orphan(&root, "mode");
    let deadline = side.lease_in(&run.dir, 1.0);
    // The workload can chmod its own run dir: that never keeps it from being stopped.
    fs::set_permissions(&run.dir, fs::Permissions::from_mode(0o750)).unwrap();
    let dog = Daemon::start(side.watchdog(), &["--scan-interval", "1h"]);
    let (_, ended) = stopped_by_lease(c, &tree, "the tree after the stop");
    ensure!(
        c,
        ended - deadline < 3.0,
        "enforced {:.2}s after the deadline",
        ended - deadline
    );
    let mode = fs::metadata(&run.dir).unwrap().permissions().mode() & 0o7777;
    c.eq(&mode, &0o700, "the run dir's mode");
    ensure!(
        c,
        dog.stderr().contains("mode was 0750"),
        "the watchdog does not say it set the mode back: {}",
        dog.stderr()
    );
}

#[test]
fn a_skipped_run_is_looked_at_again_once_its_dir_is_given_back() {
    let root = TestRoot::new();
    let (c, side, run, tree) = root_orphan(&root, "hup");
    side.lease_in(&run.dir, -1.0);
    // A run dir owned by someone else is not ours to act on: skipped, nothing signalled.
    std::os::unix::fs::chown(&run.dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let dog = Daemon::start(side.watchdog(), &["--scan-interval", "1h"]);
    wait_until_dbg("the skip", CMD, || {
        let e = dog.stderr();
        if e.contains("hup: skipped") {
            Ok(())
        } else {
            Err(e)
        }
    });
    ctx(&root, "hup").all_alive(&tree, "the tree of a skipped run");
    // Give the dir back and ask the daemon to look again (the root's watch may see the change
    // too: either way, the run is stopped at once, not at the hourly rescan).
    std::os::unix::fs::chown(&run.dir, Some(0), Some(0)).unwrap();
    dog.signal(libc::SIGHUP);
    stopped_by_lease(c, &tree, "the tree after the stop");
}

#[test]
fn a_damaged_lease_is_reported_once_and_its_last_valid_deadline_is_kept() {
    let root = TestRoot::new();
    let (c, side, run, tree) = root_orphan(&root, "damaged");
    let deadline = side.lease_in(&run.dir, 3.0);
    let dog = Daemon::start(side.watchdog(), &[]);
    for garbage in [
        &b"{\"deadline_epoch\": "[..],
        &b"not json"[..],
        &b"{\"deadline_epoch\": "[..],
    ] {
        let tmp = run.dir.join(".bad.tmp");
        fs::write(&tmp, garbage).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).unwrap();
        fs::rename(&tmp, run.dir.join("lease.json")).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, ended) = stopped_by_lease(c, &tree, "the tree after the stop");
    ensure!(
        c,
        ended >= deadline - 0.05,
        "stopped {:.2}s before the kept deadline",
        deadline - ended
    );
    ensure!(
        c,
        ended - deadline < 3.0,
        "stopped {:.2}s after the kept deadline",
        ended - deadline
    );
    let log = dog.stderr();
    let said = log.matches("lease.json is damaged").count();
    ensure!(
        c,
        (1..=3).contains(&said),
        "said {said} times (once per distinct damage): {log}"
    );
    let journalled = events_named(&root, "damaged", "lease_unreadable").len();
    c.eq(
        &journalled,
        &said,
        format_args!("journal and log disagree: {log}"),
    );
}

// ---------------------------------------------------------------------------------------------
// 6. One watchdog per root

#[test]
fn a_second_watchdog_on_a_root_names_the_first_and_exits_75() {
    let root = TestRoot::new();
    let side = Side::new(&root, User::Root);
    fs::create_dir_all(root.root()).unwrap();
    let mut first = Daemon::start(side.watchdog(), &[]);
    for args in [vec![], vec!["--once"]] {
        let (code, _, err) = outcome(side.watchdog().args(&args));
        assert_eq!(code, 75, "second watchdog {args:?}: {err}");
        assert!(
            err.contains(&format!("pid {}", first.pid())),
            "the message does not name the first watchdog ({}): {err}",
            first.pid()
        );
    }
    assert!(
        first.running(),
        "the first watchdog died: {}",
        first.stderr()
    );
    let out = first.stop();
    assert!(
        out.status.success(),
        "the first watchdog on SIGTERM: {out:?}"
    );
    // Once it is gone, a new one may watch the root.
    let second = Daemon::start(side.watchdog(), &[]);
    let out = second.stop();
    assert!(
        out.status.success(),
        "the second watchdog on SIGTERM: {out:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Squatting on the lock of a dead wrapper

/// flock(1) holds the lock of a run whose wrapper is dead, while its child sleeps: the `lock`
/// file, or the run dir itself (the lock every party takes first). In a cgroup, the cgroup is
/// the run's membership: flock(1), outside it, is an outsider with or without the run's marker
/// (safety.md CS-88). Held by /proc scans alone, the marker makes it the run's own.
#[test]
fn a_squatter_on_a_dead_wrappers_lock_does_not_keep_the_run_from_being_cancelled() {
    let root = TestRoot::new();
    let side = Side::new(&root, User::Root);
    let off: &[&str] = &["--cgroup", "off"];
    let cases: [(bool, &[&str], &str); 5] = [
        (true, &[], "lock"),
        (false, &[], "lock"),
        (true, off, "lock"),
        (false, &[], "."),
        (true, off, "."),
    ];
    for (n, (marked, opts, squatted)) in cases.iter().enumerate() {
        let id = format!("squat-{n}");
        let c = ctx(&root, &id);
        let (run, tree) = side.leased_orphan_with(&id, opts);
        let runs_own = *marked && !opts.is_empty();
        let target = run.dir.join(squatted);
        let mut cmd = Command::new("flock");
        cmd.arg(&target)
            .arg(fixture_bin())
            .args(["sleep-ms", "120000"])
            .stdin(std::process::Stdio::null());
        if *marked {
            cmd.env("AGENT_RUN_ID", &id).env("AGENT_RUN_DIR", &run.dir);
        } else {
            cmd.env_remove("AGENT_RUN_ID").env_remove("AGENT_RUN_DIR");
        }
        let mut squatter = cmd.spawn().expect("spawn flock");
        let spid = squatter.id() as i32;
        let child = wait_until_dbg("flock's child", CMD, || {
            agent_run_tests::children_of(spid)
                .first()
                .copied()
                .ok_or(())
        });
        let spin = Pinned::new(&[spid, child]);
        wait_until_dbg("the squatter to hold the lock", CMD, || {
            let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
            let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&target).unwrap());
            if locks.contains(&format!(":{ino} ")) {
                Ok(())
            } else {
                Err(locks)
            }
        });
        let (code, _, err) = side.ctl(&["cancel", &id]);
        c.eq(&code, &0, format_args!("cancel of a squatted run: {err}"));
        c.wait_gone(&tree, "the run's tree");
        let st = root.status(&id);
        // By /proc scans alone, emptiness after a wrapper loss cannot be proven.
        let want = if opts.is_empty() {
            "cancelled"
        } else {
            "unknown"
        };
        c.eq(&st["state"], want, "the record's state");
        ensure!(
            c,
            !events_named(&root, &id, "lock_squatted").is_empty(),
            "the journal names no squatted lock"
        );
        if runs_own {
            // flock(1) itself is the run's too (it carries the marker): both gone.
            c.wait_gone(&spin, "the marked squatter");
        } else {
            c.eq(&spin.alive().len(), &2, "an outsider must not be signalled");
            no_signal_to(&root, &id, &[spid, child]);
        }
        let _ = spin.signal(child, libc::SIGKILL);
        let _ = spin.signal(spid, libc::SIGKILL);
        let _ = squatter.wait();
    }
}

/// The workload's forgery: status.json says the run is over (`finished` exit 0, or
/// `cancelled`), optionally with its containment pointed away from its cgroup.
fn forge_final(c: agent_run_tests::ctx::Ctx, state: &str, hide_cgroup: bool) {
    c.edit_status(|st| {
        st.insert("state".into(), state.into());
        st.insert("reason".into(), Value::Null);
        if state == "finished" {
            st.insert("exit_code".into(), 0.into());
        } else {
            st.insert("reason".into(), "cancel_request".into());
        }
        st.insert("ended_at".into(), "2026-12-02T00:00:00.000Z".into());
        if hide_cgroup {
            st.insert(
                "containment".into(),
                serde_json::json!({"mode": "procfs", "cgroup": null}),
            );
        }
    });
}

/// The run's cgroup, from the leader's /proc/PID/cgroup (a kernel fact, not the record).
fn run_cgroup(c: agent_run_tests::ctx::Ctx, leader: i32) -> std::path::PathBuf {
    let cg = agent_run_tests::contain::cgroup_of(leader)
        .unwrap_or_else(|| c.fail(format_args!("no cgroup for the leader {leader}")));
    agent_run_tests::ensure!(
        c,
        cg.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&format!("agent-run.{}.", c.id))),
        "the leader is not in a run cgroup: {cg:?}"
    );
    cg
}

#[test]
fn a_workload_that_forges_a_final_record_and_kills_its_wrapper_is_still_cancelled_whole() {
    let root = TestRoot::new();
    for (n, (state, hide)) in [("finished", false), ("cancelled", true)]
        .into_iter()
        .enumerate()
    {
        let id = format!("forged-final-{n}");
        let c = agent_run_tests::ctx::ctx(&root, &id);
        let run = c.start_running(
            "--lease 1h",
            &agent_run_tests::workload::fx("tree --children 2 --grandchildren"),
        );
        let (_, tree) = c.pin_tree();
        let cg = run_cgroup(c, run.leader);
        forge_final(c, state, hide);
        c.kill_wrapper(run.wrapper, &run.wrapper_pin);
        // The record says the run is over; the process table says otherwise.
        c.all_alive(&tree, "the tree after the forgery and the wrapper's death");
        // gc takes a final record's word only with the cgroup's: the run dir stays.
        let out = c.ctl(&["gc", "--older-than", "0s"], 0);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        agent_run_tests::ensure!(
            c,
            root.run_dir(&id).join("status.json").exists() && said.contains("holds processes"),
            "gc removed a run whose cgroup holds processes: {said}"
        );
        // status says what the record cannot; wait does not take the record's word.
        let shown = c.json(&["status", "--json", &id]);
        c.fields(
            &shown,
            "status --json",
            serde_json::json!({"state": state, "note": "but its cgroup holds processes: the record was rewritten"}),
        );
        c.ctl(&["wait", "--timeout", "300ms", &id], 75);
        c.ctl(&["cancel", &id], 0);
        c.gone_now(&tree, "after cancel returned");
        c.fields(
            &c.status(),
            "status.json",
            ended("cancelled", "cancel_request"),
        );
        let said = c.events("record_contradicted");
        c.eq(said.len(), 1, "record_contradicted events");
        c.eq(
            said[0]["recorded_state"].as_str(),
            Some(state),
            "the forged state, journalled",
        );
        agent_run_tests::ensure!(c, !cg.exists(), "the run's cgroup {cg:?} is left");
    }
}

#[test]
fn the_watchdog_stops_a_run_whose_forged_final_record_its_cgroup_contradicts() {
    let root = TestRoot::new();
    let c = agent_run_tests::ctx::ctx(&root, "forged-watchdog");
    let run = c.start_running(
        "--lease 1h",
        &agent_run_tests::workload::fx("tree --children 2"),
    );
    let (_, tree) = c.pin_tree();
    let cg = run_cgroup(c, run.leader);
    forge_final(c, "finished", true);
    c.kill_wrapper(run.wrapper, &run.wrapper_pin);
    // The orphan grace and the lease are far away: only the contradiction makes it due now.
    c.watchdog_once("1h");
    c.gone_now(&tree, "after the watchdog's pass");
    c.fields(
        &c.status(),
        "status.json",
        ended("cancelled", "wrapper_lost"),
    );
    c.eq(
        c.events("record_contradicted").len(),
        1,
        "record_contradicted events",
    );
    agent_run_tests::ensure!(c, !cg.exists(), "the run's cgroup {cg:?} is left");
    // A true final record is left alone by the next pass.
    let before = c.bytes("status.json");
    c.watchdog_once("1h");
    c.eq(
        c.bytes("status.json"),
        before,
        "a second pass rewrote the record",
    );
}

#[test]
fn a_forged_final_record_under_a_live_wrapper_is_replaced_by_the_wrappers_own_on_cancel() {
    let root = TestRoot::new();
    let c = agent_run_tests::ctx::ctx(&root, "forged-live");
    let run = c.start_running("", &agent_run_tests::workload::fx("tree --children 1"));
    let (_, tree) = c.pin_tree();
    forge_final(c, "finished", false);
    c.cancel_now(&tree, "after cancel returned");
    c.wait_gone(&run.wrapper_pin, "the wrapper");
    c.fields(
        &c.status(),
        "status.json",
        serde_json::json!({"state": "cancelled", "reason": "cancel_request", "exit_code": null}),
    );
    // The wrapper's own stop replaced the forgery (its `cancelling`, then its final record).
    let finals: Vec<Value> = c.events_where("state", |e| e["to"] == "cancelled");
    c.eq(finals.len(), 1, "final state events");
    c.eq(
        finals[0]["by"].as_str(),
        Some("wrapper"),
        "who wrote the final record",
    );
}

#[test]
fn a_workload_that_forges_its_final_record_and_exits_gets_the_wrappers_true_record_over_it() {
    let root = TestRoot::new();
    let c = agent_run_tests::ctx::ctx(&root, "forged-exit");
    // Once its record says `running` (written just after the spawn), the workload writes
    // itself a clean `finished` exit 0 (sed -i renames a new file into place, as any editor
    // would), then fails with 3.
    let script = r#"f="$AGENT_RUN_DIR/status.json"; n=0; until grep -q '"state": "running"' "$f"; do n=$((n+1)); [ $n -lt 3000 ] || exit 9; sleep 0.01; done; sed -i -e 's/"state": "running"/"state": "finished"/' -e 's/"exit_code": null/"exit_code": 0/' "$f" && grep -q '"state": "finished"' "$f" && exit 3"#;
    let argv = ["sh".to_string(), "-c".into(), script.into()];
    c.ctl(&agent_run_tests::workload::start_args("", c.id, &argv), 3);
    c.fields(
        &c.status(),
        "status.json",
        serde_json::json!({"state": "finished", "exit_code": 3}),
    );
    let said = c.events("record_contradicted");
    c.eq(said.len(), 1, "record_contradicted events");
    c.eq(
        (said[0]["by"].as_str(), said[0]["recorded_state"].as_str()),
        (Some("wrapper"), Some("finished")),
        "who found the forged record, and what it said",
    );
}
