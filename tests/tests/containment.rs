//! [containment]: the kernel holds the run. A cgroup v2 per run where the host gives one, and
//! in either mode never `cancelled` or `finished` while a thread of the run lives.
//!
//! Each scenario runs in both modes: `cgroup` (the default as root on a host with a cgroup2
//! mount) and `procfs` (`--cgroup off`). In cgroup mode it must stop everything and end
//! `cancelled` (or `finished` with the leftovers in `cleanup`); in procfs mode it must either do
//! that or end `unknown` naming the survivor. The assertions are on /proc: the pinned pids, the
//! tasks of a zombie leader, every process carrying the run's marker, the run's cgroup.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use agent_run_tests::contain::{
    alive, cgroup2_mount, cgroup_of, eventually, marked, sweep, Delegated,
};
use agent_run_tests::hostile::{as_nobody, epoch_now, outcome, write_lease, Detached, CMD, NOBODY};
use agent_run_tests::modes::{Mode, ROOT_MODES};
use agent_run_tests::scenario::for_each_mode_in_root;
use agent_run_tests::workload::{fixture_path, fx};
use agent_run_tests::{agent_run_bin, ctx, ensure, wait_ready, Ctx, Pinned, TestRoot};
use serde_json::Value;

/// Skip cgroup mode only when the host has no cgroup2 mount, and say so.
fn has_cgroup2(mode: Mode) -> bool {
    if !mode.available() {
        eprintln!("no cgroup2 mount on this host: the cgroup mode of this test is skipped");
        return false;
    }
    true
}

fn start<S: AsRef<std::ffi::OsStr>>(
    root: &TestRoot,
    id: &str,
    mode: Mode,
    extra: &[&str],
    argv: &[S],
) -> Detached {
    let mut opts = mode.opts();
    opts.extend(extra);
    Detached::start(root, root.cmd(), id, &opts, argv)
}

fn check_mode(root: &TestRoot, id: &str, mode: Mode) {
    let c = ctx(root, id);
    let st = root.status(id);
    c.eq(
        &st["containment"]["mode"],
        mode.recorded(),
        "st[\"containment\"][\"mode\"]",
    );
}

/// `cancel ID` exits 0.
fn cancel_ok(root: &TestRoot, id: &str) {
    let (code, _, err) = outcome(root.cmd().args(["cancel", id]));
    ctx(root, id).eq(code, 0, format_args!("cancel {id}: {err}"));
}

/// `cancel ID` exits 0, the run ends honestly (its leader watched), and what is left is swept.
fn cancel_honestly(root: &TestRoot, id: &str, mode: Mode, run: &Detached) {
    cancel_ok(root, id);
    honest(root, id, mode, "cancelled", &[run.leader]);
    sweep(&run.dir, &[]);
}

/// Waits until at least `n` processes have marked themselves as the run's.
fn wait_marked(c: Ctx<'_>, run: &Detached, n: usize) {
    ensure!(
        c,
        eventually(CMD, || marked(&run.dir).len() >= n),
        "fewer than {n} processes marked: {:?}",
        marked(&run.dir)
    );
}

/// The honest end: in cgroup mode `cancelled`/`finished` with nothing of the run alive; in
/// procfs mode the same, or `unknown` naming a survivor that is alive.
fn honest(root: &TestRoot, id: &str, mode: Mode, want: &str, watch: &[i32]) {
    let c = ctx(root, id);
    let st = root.wait_final(id, CMD);
    let state = st["state"].as_str().unwrap_or_default().to_string();
    let dir = root.run_dir(id);
    let alive_now: Vec<i32> = watch
        .iter()
        .copied()
        .filter(|&p| alive(p))
        .chain(marked(&dir))
        .collect();
    let survivors: Vec<i64> = st["cleanup"]["survivors"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    // A leader that exits at once (a hopper) ends the run `finished`, its leftovers stopped.
    let fine =
        state == want || (want == "cancelled" && state == "finished" && st["cleanup"].is_object());
    match (mode, state.as_str()) {
        _ if fine => ensure!(
            c,
            alive_now.is_empty(),
            "{state} while {alive_now:?} of the run are alive"
        ),
        // Held by /proc scans alone, a run whose wrapper was lost cannot be proven empty: the
        // stop says `unprovable`, and what it saw is gone.
        (Mode::RootProcfs, "unknown") if st["reason"] == "unprovable" => {
            c.eq(
                &st["proof"],
                "unprovable",
                "the proof of a run stopped by scans alone",
            );
            ensure!(
                c,
                alive_now.is_empty(),
                "unprovable while {alive_now:?} of the run are alive"
            )
        }
        (Mode::RootProcfs, "unknown") => {
            ensure!(c, !survivors.is_empty(), "unknown without a survivor named")
        }
        _ => c.fail(format_args!("ended {state}, expected {want}")),
    }
    if mode == Mode::RootCgroup {
        // The wrapper removes the cgroup right after the final record (a cancel returns, and
        // the record is read, in between).
        c.wait_wrapper_exit(&st);
        let cg = st["containment"]["cgroup"].as_str().unwrap_or_default();
        ensure!(c, !cg.is_empty(), "no cgroup recorded: {st}");
        ensure!(
            c,
            !Path::new(cg).exists() || state == "unknown",
            "the run's cgroup {cg} is left after its final record"
        );
    }
}

fn tasks(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

// ---------------------------------------------------------------------------------------------
// 1. A zombie leader with live threads

#[test]
fn a_zombie_leader_whose_thread_runs_is_stopped_by_cancel_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "zl", |mode, root, id, c| {
        let run = start(root, id, mode, &["--grace", "2s"], &fx("zombie-leader"));
        check_mode(root, id, mode);
        let leader = run.leader;
        let pin = Pinned::new(&[leader]);
        ensure!(
            c,
            eventually(CMD, || agent_run_tests::proc_stat(leader)
                .is_some_and(|s| s.0 == 'Z')
                && tasks(leader) == 2),
            "the leader never became a zombie with a live thread"
        );
        ensure!(c, alive(leader), "alive(leader)");
        let (code, out, err) = outcome(root.cmd().args(["cancel", "--json", id]));
        c.eq(&code, &0, format_args!("{err}"));
        ensure!(c, out.contains("\"cancelled\""), "{out}");
        pin.wait_all_gone(CMD)
            .unwrap_or_else(|p| c.fail(format_args!("{mode:?}: {p:?} alive")));
        ensure!(
            c,
            !alive(leader),
            "{mode:?}: the thread lives on after cancelled"
        );
        honest(root, id, mode, "cancelled", &[leader]);
        let sent = agent_run_tests::hostile::signals_to(root, id, &[leader]);
        ensure!(
            c,
            !sent.is_empty(),
            "no signal to the zombie leader's process"
        );
    });
}

#[test]
fn a_zombie_leader_left_by_a_shell_that_exits_is_stopped_before_finished_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "zlsh", |mode, root, id, c| {
        let zl_pid = root.dir.path().join("zl.pid");
        let script = format!(
            "{} zombie-leader > /dev/null & echo $! > {}; sleep 0.6; exit 0",
            fixture_path(),
            zl_pid.display()
        );
        let mut opts = mode.opts();
        opts.extend(["--grace", "2s"]);
        let (code, _, err) = outcome(
            root.cmd()
                .args(["start"])
                .args(&opts)
                .args([id, "--", "bash", "-c", &script]),
        );
        c.eq(&code, &0, format_args!("{err}"));
        let zl: i32 = fs::read_to_string(&zl_pid).unwrap().trim().parse().unwrap();
        let st = root.status(id);
        c.eq(&st["state"], "finished", "st[\"state\"]");
        ensure!(
            c,
            !alive(zl),
            "{mode:?}: the zombie leader's thread outlived a finished run"
        );
        let signalled: Vec<i64> = st["cleanup"]["signalled"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        ensure!(
            c,
            signalled.contains(&(zl as i64)),
            "{mode:?}: cleanup does not name {zl}: {st}"
        );
        sweep(&root.run_dir(id), &[zl]);
    });
}

// ---------------------------------------------------------------------------------------------
// 2. A pid-hopping escapee, as nobody under a process limit

fn nobody_root(root: &TestRoot) {
    fs::set_permissions(root.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(root.root()).unwrap();
    fs::set_permissions(root.root(), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(root.root(), Some(NOBODY), Some(NOBODY)).unwrap();
}

/// `agent-run --root R ARGS...` as nobody, with at most 400 processes; in cgroup mode from
/// inside a cgroup delegated to nobody.
fn nobody_ar(root: &TestRoot, deleg: Option<&Delegated>, args: &[&str]) -> (i32, String, String) {
    let mut full: Vec<std::ffi::OsString> = vec![
        "--nproc=400".into(),
        agent_run_bin().into(),
        "--root".into(),
        root.root().into(),
    ];
    full.extend(args.iter().map(|a| a.into()));
    let prlimit = Path::new("/usr/bin/prlimit");
    let out = match deleg {
        Some(d) => {
            let a: Vec<&std::ffi::OsStr> = full.iter().map(|s| s.as_os_str()).collect();
            d.run_as_nobody(prlimit, &a)
        }
        None => agent_run_tests::run_with_timeout(as_nobody(prlimit).args(&full), CMD),
    };
    (
        agent_run_tests::exit_code(&out.status),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// As nobody, in a root of nobody's: `start -d --grace 1s MODE ID -- COMMAND...`, which must
/// succeed. In cgroup mode it starts inside a cgroup delegated to nobody (named for the id),
/// returned to be kept until the test ends.
fn start_as_nobody(root: &TestRoot, id: &str, mode: Mode, command: &[&str]) -> Option<Delegated> {
    nobody_root(root);
    let deleg = (mode == Mode::RootCgroup).then(|| Delegated::new(id).expect("delegate a cgroup"));
    let mut args = vec!["start", "-d", "--grace", "1s"];
    args.extend(mode.opts());
    args.extend([id, "--"]);
    args.extend(command);
    let (code, _, err) = nobody_ar(root, deleg.as_ref(), &args);
    ctx(root, id).eq(code, 0, format_args!("start as nobody: {err}"));
    deleg
}

#[test]
fn a_pid_hopping_escapee_as_nobody_is_stopped_or_named_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "hop", |mode, root, id, c| {
        let _sweep = agent_run_tests::contain::SweepOnDrop(root.run_dir(id));
        let deleg = start_as_nobody(root, id, mode, &[&fixture_path(), "hopper"]);
        check_mode(root, id, mode);
        if let Some(d) = &deleg {
            let cg = root.status(id)["containment"]["cgroup"]
                .as_str()
                .unwrap()
                .to_string();
            ensure!(
                c,
                Path::new(&cg).starts_with(&d.path),
                "{cg} is not under {}",
                d.path.display()
            );
        }
        // The leader hops away at once, so the run may be over already (its leftovers
        // stopped); a scan cannot be relied on to see a hopper anyway.
        let dir = root.run_dir(id);
        let (code, _, err) = nobody_ar(root, None, &["cancel", id]);
        ensure!(c, code == 0 || code == 75, "cancel: {code} {err}");
        honest(root, id, mode, "cancelled", &[]);
        sweep(&dir, &[]);
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A marked process outside the wrapper's tree at the leader's exit

#[test]
fn a_marked_process_outside_the_tree_is_stopped_when_the_leader_exits_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "outsider", |mode, root, id, c| {
        // The leader waits until the outsider runs (a gate in its run dir), then exits 0.
        let script = r#"while [ ! -e "$AGENT_RUN_DIR/gate" ]; do sleep 0.02; done; exit 0"#;
        let run = start(root, id, mode, &["--grace", "1s"], &["sh", "-c", script]);
        // Started by a helper outside the wrapper's tree, carrying the run's marker (the way
        // systemd-run --user -E, tmux -e or a job queue starts work for a run).
        let mut outsider = agent_run_tests::contain::fixture(&["sleep-ms", "600000"]);
        outsider
            .env("AGENT_RUN_ID", id)
            .env("AGENT_RUN_DIR", &run.dir)
            .stdout(std::process::Stdio::null());
        let mut child = outsider.spawn().unwrap();
        let opid = child.id() as i32;
        let pin = Pinned::new(&[opid]);
        fs::write(run.dir.join("gate"), b"").unwrap();
        let st = root.wait_final(id, CMD);
        c.eq(&st["state"], "finished", "st[\"state\"]");
        pin.wait_all_gone(CMD).unwrap_or_else(|p| {
            c.fail(format_args!(
                "{mode:?}: outsider {p:?} alive after finished"
            ))
        });
        let signalled = st["cleanup"]["signalled"].to_string();
        ensure!(
            c,
            signalled.contains(&opid.to_string()),
            "{mode:?}: cleanup: {st}"
        );
        let _ = child.wait();
    });
}

// ---------------------------------------------------------------------------------------------
// 4. Non-dumpable processes after the wrapper is gone, as nobody

#[test]
fn a_non_dumpable_daemon_after_kill_9_of_the_wrapper_is_stopped_or_named_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "nondump", |mode, root, id, c| {
        let fxs = fixture_path();
        let script = format!("{fxs} nondumpable-daemon; exec {fxs} sleep-ms 600000");
        let _deleg = start_as_nobody(root, id, mode, &["sh", "-c", &script]);
        let dir = root.run_dir(id);
        let ready = wait_ready(&dir.join("stdout.log"), CMD);
        let daemon = ready.pid;
        let dpin = Pinned::new(&[daemon]);
        ensure!(
            c,
            fs::read(format!("/proc/{daemon}/environ")).is_ok(),
            "root reads any environ"
        );
        let st = root.status(id);
        let wrapper = st["wrapper_pid"].as_i64().unwrap() as i32;
        let wpin = Pinned::new(&[wrapper]);
        let _ = wpin.signal(wrapper, libc::SIGKILL);
        c.wait_gone(&wpin, "wpin");
        let (code, _, err) = nobody_ar(root, None, &["cancel", id]);
        c.eq(&code, &0, format_args!("cancel: {err}"));
        let st = root.wait_final(id, CMD);
        match mode {
            _ if mode.cgroup() => {
                c.eq(&st["state"], "cancelled", "st[\"state\"]");
                dpin.wait_all_gone(CMD)
                    .unwrap_or_else(|p| c.fail(format_args!("daemon {p:?} alive")));
            }
            _ => {
                // Its environment is unreadable to nobody: it may be the run's. Named with the
                // processes that may have left the run, and the run is `unknown`, `unprovable`.
                if !dpin.alive().is_empty() {
                    c.eq(&st["state"], "unknown", "st[\"state\"]");
                    c.eq(&st["reason"], "unprovable", "st[\"reason\"]");
                    ensure!(
                        c,
                        st["cleanup"]["escapees"]
                            .to_string()
                            .contains(&daemon.to_string()),
                        "{st}"
                    );
                }
            }
        }
        let _ = dpin.signal(daemon, libc::SIGKILL);
        sweep(&dir, &[daemon]);
    });
}

// ---------------------------------------------------------------------------------------------
// 5. `env -i setsid` double fork after kill -9 of the wrapper: cancel, and the watchdog

#[test]
fn an_env_i_setsid_escapee_after_kill_9_of_the_wrapper_is_stopped_in_cgroup_mode() {
    if !has_cgroup2(Mode::RootCgroup) {
        return;
    }
    for by in ["cancel", "watchdog"] {
        let root = TestRoot::new();
        let id = format!("envi-{by}");
        let c = ctx(&root, &id);
        let go = root.dir.path().join("go");
        let esc = root.dir.path().join("esc.pid");
        let script = format!(
            "while [ ! -e {go} ]; do sleep 0.02; done; env -i setsid sh -c '{fx} sleep-ms 600000 & echo $! > {esc}' ; exec {fx} sleep-ms 600000",
            go = go.display(),
            esc = esc.display(),
            fx = fixture_path()
        );
        let run = start(
            &root,
            &id,
            Mode::RootCgroup,
            &["--grace", "1s", "--lease", "1h"],
            &["sh", "-c", &script],
        );
        run.kill_wrapper();
        fs::write(&go, b"").unwrap();
        ensure!(
            c,
            eventually(CMD, || fs::read_to_string(&esc)
                .is_ok_and(|s| s.ends_with('\n'))),
            "eventually(CMD, || fs::read_to_string(&esc) .is_ok_and(|s| s.ends_with('\\n')))"
        );
        let e: i32 = fs::read_to_string(&esc).unwrap().trim().parse().unwrap();
        let epin = Pinned::new(&[e]);
        // No marker, another session, its parent gone: only the cgroup knows it.
        ensure!(
            c,
            agent_run_tests::environ_var(e, "AGENT_RUN_ID").is_none(),
            "agent_run_tests::environ_var(e, \"AGENT_RUN_ID\").is_none()"
        );
        let cg = root.status(&id)["containment"]["cgroup"]
            .as_str()
            .unwrap()
            .to_string();
        c.eq(
            cgroup_of(e).unwrap(),
            Path::new(&cg),
            "the escapee left the run's cgroup",
        );
        if by == "cancel" {
            cancel_ok(&root, &id);
        } else {
            write_lease(&run.dir, epoch_now() - 1.0, 1.0);
            let (code, _, err) = outcome(root.watchdog_cmd().args(["--once"]));
            c.eq(&code, &0, format_args!("{err}"));
        }
        let st = root.wait_final(&id, CMD);
        c.eq(&st["state"], "cancelled", "st[\"state\"]");
        epin.wait_all_gone(CMD)
            .unwrap_or_else(|p| c.fail(format_args!("{by}: escapee {p:?} alive")));
        ensure!(c, !Path::new(&cg).exists(), "{by}: cgroup left");
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Another subreaper inside the run; a fork loop during the stop; a nested run

#[test]
fn a_workload_behind_its_own_subreaper_is_stopped_in_both_modes() {
    let Ok(tini) = which("tini") else {
        panic!("tini is not installed (bash .ci/test installs it)");
    };
    for_each_mode_in_root(&ROOT_MODES, "tini", |mode, root, id, c| {
        let script = format!(
            "setsid {fx} sleep-ms 600000 & {fx} tree --children 1",
            fx = fixture_path()
        );
        let run = start(
            root,
            id,
            mode,
            &["--grace", "1s"],
            &[&tini, "-s", "--", "sh", "-c", &script],
        );
        let ready = wait_ready(&run.dir.join("stdout.log"), CMD);
        let pin = Pinned::new(&ready.all_pids());
        wait_marked(c, &run, 4);
        cancel_ok(root, id);
        c.wait_gone(&pin, "pin");
        honest(root, id, mode, "cancelled", &[]);
        sweep(&run.dir, &[]);
    });
}

fn which(p: &str) -> Result<String, ()> {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {p}")])
        .output()
        .map_err(|_| ())?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if s.is_empty() {
        Err(())
    } else {
        Ok(s)
    }
}

#[test]
fn a_fork_loop_during_the_stop_is_stopped_or_named_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "forkloop", |mode, root, id, c| {
        let run = start(root, id, mode, &["--grace", "1s"], &fx("fork-loop"));
        wait_marked(c, &run, 20);
        cancel_honestly(root, id, mode, &run);
    });
}

/// Orphaned (the wrapper killed), a procfs stop looks at /proc again and again: after its first
/// look of every pid, only at the pids handed out since (while the pid counter cannot have
/// come around). A fork loop that ignores TERM and HUP makes new processes all through the
/// stop, each in a session of its own (no signal to the loop's group reaches it): each must be
/// found by those narrower looks, or it outlives a run called cancelled.
#[test]
fn a_fork_loop_after_kill_9_of_the_wrapper_is_stopped_or_named_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "orphanloop", |mode, root, id, c| {
        let run = start(
            root,
            id,
            mode,
            // A short grace: the whole stop fits in the time the narrower looks may be used
            // (a third of a second here: pid_max 32,768 at up to 100,000 forks a second).
            &["--grace", "100ms"],
            &fx("fork-loop setsid"),
        );
        wait_marked(c, &run, 20);
        run.kill_wrapper();
        let before = marked(&run.dir).len();
        ensure!(
            c,
            eventually(CMD, || marked(&run.dir).len() > before + 5),
            "the loop goes on forking without its wrapper"
        );
        cancel_honestly(root, id, mode, &run);
    });
}

#[test]
fn stopping_an_outer_run_stops_a_nested_run_and_its_cgroup_in_both_modes() {
    for_each_mode_in_root(&ROOT_MODES, "outer", |mode, root, id, c| {
        let inner_root = root.dir.path().join("inner-runs");
        let ar = agent_run_bin().display().to_string();
        let ir = inner_root.display().to_string();
        let run = start(
            root,
            id,
            mode,
            &["--grace", "2s"],
            &[
                &ar,
                "--root",
                &ir,
                "inner",
                "--",
                &fixture_path(),
                "tree",
                "--children",
                "1",
            ],
        );
        let ready = wait_ready(&inner_root.join("inner").join("stdout.log"), CMD);
        let pin = Pinned::new(&ready.all_pids());
        let inner_st: Value = serde_json::from_str(
            &fs::read_to_string(inner_root.join("inner/status.json")).unwrap(),
        )
        .unwrap();
        if mode == Mode::RootCgroup {
            let outer_cg = root.status(id)["containment"]["cgroup"]
                .as_str()
                .unwrap()
                .to_string();
            let inner_cg = inner_st["containment"]["cgroup"]
                .as_str()
                .unwrap()
                .to_string();
            ensure!(
                c,
                Path::new(&inner_cg).starts_with(&outer_cg),
                "inner {inner_cg} not under outer {outer_cg}"
            );
        }
        cancel_ok(root, id);
        pin.wait_all_gone(CMD)
            .unwrap_or_else(|p| c.fail(format_args!("{mode:?}: inner {p:?} alive")));
        honest(root, id, mode, "cancelled", &[run.leader]);
    });
}

// ---------------------------------------------------------------------------------------------
// 7. The cgroup itself: recorded, checked, resources, choice of parent

#[test]
fn a_record_naming_a_cgroup_that_is_not_the_runs_kills_nothing_else_and_the_runs_own_is_stopped() {
    if !has_cgroup2(Mode::RootCgroup) {
        return;
    }
    let root = TestRoot::new();
    let victim_run = start(
        &root,
        "victim",
        Mode::RootCgroup,
        &[],
        &fx("tree --children 1"),
    );
    let vready = wait_ready(&victim_run.dir.join("stdout.log"), CMD);
    let vpin = Pinned::new(&vready.all_pids());
    let victim_cg = root.status("victim")["containment"]["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    let mount = cgroup2_mount().unwrap().display().to_string();
    for (i, forged) in [victim_cg.as_str(), mount.as_str(), "/tmp"]
        .iter()
        .enumerate()
    {
        // The record's cgroup is only a hint: the run's own is found by its name, and the
        // forged one is never written to.
        let id = format!("forger-{i}");
        let run = start(&root, &id, Mode::RootCgroup, &[], &fx("tree --children 1"));
        let c = ctx(&root, &id);
        let (_, pins) = c.pin_tree();
        run.kill_wrapper();
        agent_run_tests::hostile::edit_status(&run.dir, |st| {
            st.insert(
                "containment".into(),
                serde_json::json!({"mode": "cgroup", "cgroup": forged}),
            );
        });
        let (code, _, err) = outcome(root.cmd().args(["cancel", &id]));
        c.eq(code, 0, format_args!("a record naming {forged}: {err}"));
        ctx(&root, "victim").all_alive(&vpin, "the other run's processes");
        c.wait_gone(&pins, "the run's own tree, stopped by its own cgroup");
        let st = c.status();
        c.eq(&st["state"], "cancelled", "the run's state");
        c.eq(&st["proof"], "cgroup_empty", "how emptiness was shown");
        sweep(&run.dir, &[run.leader]);
    }
    let (code, _, err) = outcome(root.cmd().args(["cancel", "victim"]));
    ctx(&root, "victim").eq(code, 0, format_args!("cancel victim: {err}"));
}

#[test]
fn the_final_record_carries_the_cpu_the_run_used_and_an_explicit_parent_is_checked() {
    if !has_cgroup2(Mode::RootCgroup) {
        return;
    }
    let root = TestRoot::new();
    let (code, _, err) = outcome(root.cmd().args([
        "cpu",
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
    ]));
    let c = ctx(&root, "cpu");
    c.eq(code, 0, format_args!("the cpu run: {err}"));
    let st = c.status();
    c.eq(&st["containment"]["mode"], "cgroup", "the containment mode");
    let used = st["resources"]["cpu_usage_usec"].as_u64().unwrap_or(0);
    ensure!(c, used > 10_000, "cpu_usage_usec {used}");
    // An explicit parent that is not a cgroup: 64, nothing created.
    let c = ctx(&root, "badcg");
    for bad in ["/tmp", "relative/dir", "/sys/fs/cgroup/../etc"] {
        let (code, _, err) = outcome(root.cmd().args(["--cgroup", bad, "badcg", "--", "true"]));
        c.eq(code, 64, format_args!("--cgroup {bad}: {err}"));
        ensure!(c, !c.file("").exists(), "--cgroup {bad} made a run dir");
    }
    // off: the procfs mode, said in the record.
    let c = ctx(&root, "nocg");
    let (code, _, err) = outcome(root.cmd().args(["--cgroup", "off", "nocg", "--", "true"]));
    c.eq(code, 0, format_args!("--cgroup off: {err}"));
    let st = c.status();
    c.eq(&st["containment"]["mode"], "procfs", "the containment mode");
    ensure!(c, st["resources"].is_null(), "a procfs run has resources");
    // An explicit parent of our own.
    let parent = cgroup2_mount()
        .unwrap()
        .join(format!("agent-run-test.parent.{}", std::process::id()));
    fs::create_dir(&parent).unwrap();
    let p = parent.display().to_string();
    let (code, out, err) =
        outcome(
            root.cmd()
                .args(["--cgroup", &p, "inparent", "--", "cat", "/proc/self/cgroup"]),
        );
    let c = ctx(&root, "inparent");
    c.eq(code, 0, format_args!("--cgroup {p}: {err}"));
    ensure!(
        c,
        out.contains(&format!(
            "0::/{}/agent-run.inparent.",
            parent.file_name().unwrap().to_string_lossy()
        )),
        "the run's /proc/self/cgroup: {out}"
    );
    ensure!(
        c,
        fs::read_dir(&parent)
            .unwrap()
            .filter_map(|e| e.ok())
            .all(|e| !e.file_type().unwrap().is_dir()),
        "the run's cgroup is left"
    );
    fs::remove_dir(&parent).unwrap();
}

#[test]
fn a_lingering_user_without_a_cgroup_but_with_a_systemd_user_manager_asks_systemd_run_for_a_delegated_scope(
) {
    // A stand-in systemd-run records how it was asked and runs the command it was given (a
    // real one would first move the process into the new scope: tests/tests/systemd.rs has
    // that). No logind here: the debug build's knob `assume_linger` says nobody lingers.
    let root = TestRoot::new();
    nobody_root(&root);
    let tools = root.dir.path().join("bin");
    fs::create_dir(&tools).unwrap();
    let asked = root.dir.path().join("asked");
    fs::write(&asked, b"").unwrap();
    std::os::unix::fs::chown(&asked, Some(NOBODY), Some(NOBODY)).unwrap();
    fs::write(
        tools.join("systemd-run"),
        format!(
            "#!/bin/sh\necho \"$@\" > {}\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n",
            asked.display()
        ),
    )
    .unwrap();
    fs::set_permissions(tools.join("systemd-run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&tools, fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = root.dir.path().join("xdg");
    fs::create_dir_all(runtime.join("systemd")).unwrap();
    fs::write(runtime.join("systemd/private"), b"").unwrap();
    let mut cmd = as_nobody(&agent_run_bin());
    cmd.env("PATH", format!("{}:/usr/bin:/bin", tools.display()))
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("AGENT_RUN_FAULT", "assume_linger")
        .env_remove("AGENT_RUN_CGROUP")
        .arg("--root")
        .arg(root.root())
        .args(["scoped", "--", "true"]);
    let (code, _, err) = outcome(&mut cmd);
    let c = ctx(&root, "scoped");
    c.eq(code, 0, format_args!("{err}"));
    let asked = fs::read_to_string(&asked).unwrap();
    ensure!(
        c,
        asked.starts_with(
            "--user --scope --quiet --collect -p Delegate=yes --unit=agent-run-scoped-"
        ) && asked.contains(&format!("-- {} --root", agent_run_bin().display())),
        "systemd-run was asked: {asked:?}"
    );
    let st = c.status();
    c.eq(&st["state"], "finished", "the state");
    // The stand-in gave no scope: the wrapper inside it did not ask again, and is procfs.
    c.eq(&st["containment"]["mode"], "procfs", "the containment mode");
    // Root never asks (it has its own cgroup); neither does AGENT_RUN_NO_SCOPE, nor a user
    // who does not linger (here nobody, without the knob: there is no
    // /var/lib/systemd/linger/nobody), whose manager logind stops with the last session.
    for (id, knob) in [
        ("unscoped", Some("AGENT_RUN_NO_SCOPE")),
        ("unlingering", None),
    ] {
        let mut cmd = as_nobody(&agent_run_bin());
        cmd.env("PATH", format!("{}:/usr/bin:/bin", tools.display()))
            .env("XDG_RUNTIME_DIR", &runtime)
            .env_remove("AGENT_RUN_CGROUP")
            .arg("--root")
            .arg(root.root())
            .args([id, "--", "true"]);
        match knob {
            Some(var) => cmd.env(var, "1").env("AGENT_RUN_FAULT", "assume_linger"),
            None => cmd.env_remove("AGENT_RUN_FAULT"),
        };
        fs::write(root.dir.path().join("asked"), b"").unwrap();
        let (code, _, err) = outcome(&mut cmd);
        let c = ctx(&root, id);
        c.eq(code, 0, format_args!("{err}"));
        let asked = fs::read_to_string(root.dir.path().join("asked")).unwrap();
        ensure!(c, asked.is_empty(), "systemd-run was asked: {asked:?}");
        c.eq(
            &c.status()["containment"]["mode"],
            "procfs",
            "the containment mode",
        );
    }
}
