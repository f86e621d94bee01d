//! Another user can neither read nor cancel root's run, and a forged record naming another user's
//! process gets it nothing (hazard H-4).
//!
//! The standard is the seed ADR's (`docs/references.md`): name the hazard, name the causal
//! scenario, and prove with real processes that the constraint holds. Every process a test sees is
//! pinned with a pidfd right after the fixture's ready line, asserted on through /proc (a zombie is
//! dead), and SIGKILLed by pid when the test ends. Run ids start with `rel-`.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use agent_run_shared::id::RunId;
use agent_run_shared::record::{State, Status};
use agent_run_shared::root::Root;
use agent_run_tests::cases;
use agent_run_tests::facts::{path_str, private_dir};
use agent_run_tests::hazards::*;
use agent_run_tests::hostile::{as_nobody, NOBODY};
use agent_run_tests::workload::fx_args;
use agent_run_tests::Reaper;
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, fixture_bin, proc_stat,
    run_with_timeout, watchdog_bin, Pinned, TestRoot,
};
use serde_json::Value;

/// Runs `cmd` (as `nobody`) and asserts that it failed with one of `codes` (any failure when
/// `codes` is empty) and printed nothing on stdout.
fn attacker_fails(root: &TestRoot, id: &str, cmd: &mut Command, codes: &[i32]) {
    let c = ctx(root, id);
    let what = format!("{cmd:?}");
    let out = run_with_timeout(cmd, CMD);
    let code = exit_code(&out.status);
    ensure!(
        c,
        code != 0 && (codes.is_empty() || codes.contains(&code)) && out.stdout.is_empty(),
        "as nobody, {what} must fail ({codes:?}) and print nothing\n{}",
        describe_output(&what, &out)
    );
}

#[test]
fn another_user_can_neither_read_nor_cancel_a_run_of_root_even_with_agent_run_root_pointing_at_it()
{
    let root = TestRoot::sharing_cpu();
    let id = "rel-foreign";
    let c = ctx(&root, id);
    let run = start_detached(&root, id, &["--grace", "1s"], &fx_args(&PLAIN_TREE));
    let tree = pin_tree(&root, id);
    // The attacker may reach the root (0700, root's) but nothing below it.
    fs::set_permissions(root.dir.path(), fs::Permissions::from_mode(0o755))
        .expect("chmod the test dir");
    let dir = root.run_dir(id);
    let before: Vec<Vec<u8>> = ["status.json", "events.jsonl"]
        .iter()
        .map(|n| fs::read(dir.join(n)).expect("a run file"))
        .collect();
    let r = path_str(&root.root()).to_string();
    let refusals = [69, 77, 78];

    let mut cancel = as_nobody(&agent_run_bin());
    cancel.args(["--root", &r, "cancel", id]);
    attacker_fails(&root, id, &mut cancel, &refusals);
    let mut by_env = as_nobody(&agent_run_bin());
    by_env.args(["cancel", id]).env("AGENT_RUN_ROOT", &r);
    attacker_fails(&root, id, &mut by_env, &refusals);
    for args in [
        vec!["status", "--json", id],
        vec!["logs", id],
        vec!["renew", id, "--lease", "1s"],
    ] {
        let mut cmd = as_nobody(&agent_run_bin());
        cmd.arg("--root").arg(&r).args(&args);
        attacker_fails(&root, id, &mut cmd, &refusals);
    }
    for file in ["status.json", "stdout.log", "events.jsonl"] {
        let mut cat = as_nobody(Path::new("/bin/cat"));
        cat.arg(dir.join(file));
        attacker_fails(&root, id, &mut cat, &[]);
    }
    let mut watchdog = as_nobody(&watchdog_bin());
    watchdog.args(["--root", &r, "--once", "--orphan-grace", "0"]);
    attacker_fails(&root, id, &mut watchdog, &[]);
    // Its own root, with a symlink to the victim's run dir.
    let own = root.dir.path().join("attacker");
    private_dir(&own);
    symlink(&dir, own.join(id)).expect("attacker symlink");
    std::os::unix::fs::lchown(own.join(id), Some(NOBODY), Some(NOBODY)).expect("chown link");
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).expect("chown attacker root");
    let mut via_link = as_nobody(&agent_run_bin());
    via_link.args(["--root", path_str(&own), "cancel", id]);
    attacker_fails(&root, id, &mut via_link, &refusals);

    assert_untouched_run(&root, id, &tree, &run.wrapper_pin, "after the attacker");
    let after: Vec<Vec<u8>> = ["status.json", "events.jsonl"]
        .iter()
        .map(|n| fs::read(dir.join(n)).expect("a run file"))
        .collect();
    ensure!(
        c,
        before == after && !dir.join("cancel.json").exists(),
        "the attacker changed the run's record, journal or cancel.json"
    );

    ctl(&root, id, &["cancel", id], 0);
    wait_gone(&root, id, &tree.leader, "the leader after cancel");
    wait_gone(&root, id, &tree.members, "the members after cancel");
}

/// The uid of a process (real uid, from /proc/PID/status).
fn proc_uid(pid: i32) -> Option<u32> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How a forged record gets a process of `nobody` wrong.
#[derive(Clone, Copy, Debug)]
enum Forgery {
    /// The record says the run is nobody's (uid 65534), with the process's true start time.
    OtherUsersUid,
    /// The record is root's, but its start time is not the process's.
    WrongStartTicks,
}

/// A run dir fabricated by root whose record names a live process of `nobody` (in its own
/// session, so that a stop that trusted the record would reach it): cancel must refuse with 77,
/// the watchdog must leave it, and the process must live.
fn forged_record_names_nothing_that_is_signalled(forgery: Forgery) {
    let root = TestRoot::sharing_cpu();
    let id = match forgery {
        Forgery::OtherUsersUid => "rel-forged-uid",
        Forgery::WrongStartTicks => "rel-forged-ticks",
    };
    let c = ctx(&root, id);
    let mut reaper = Reaper::default();
    let mut cmd = as_nobody(&fixture_bin());
    cmd.args(["sleep-ms", "600000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // In a session of its own: the product's spawn (setsid in pre_exec).
    agent_run_shared::sys::spawn_in_new_session(&mut cmd);
    let victim = reaper.push(cmd.spawn().expect("cannot spawn nobody's process"));
    let pin = Pinned::new(&[victim]);
    wait_until_uid(victim, NOBODY);
    let (_, _, pgid, sid, ticks) = proc_stat(victim).expect("nobody's process");

    let run_root = Root::open(&root.root(), true).expect("the run root");
    let run_dir = run_root
        .create_run_dir(&RunId::parse(id).expect("a valid id"))
        .expect("create the run dir")
        .expect("a new run dir");
    let mut st = Status::blank(id);
    st.state = State::Running;
    st.argv = vec!["sleep".into(), "600".into()];
    st.cwd = "/".into();
    st.pid = Some(victim.into());
    st.pgid = Some(pgid.into());
    st.sid = Some(sid.into());
    st.started_at = Some(agent_run_shared::time::rfc3339_now());
    st.grace_ms = Some(1000);
    st.hup_after_ms = Some(500);
    match forgery {
        Forgery::OtherUsersUid => {
            st.uid = NOBODY;
            st.user = "nobody".into();
            st.start_ticks = Some(ticks);
        }
        Forgery::WrongStartTicks => st.start_ticks = Some(ticks + 7),
    }
    run_dir.write_status(&st).expect("write the forged record");
    let record = fs::read(run_dir.path().join("status.json")).expect("the forged record");

    // The record's leader is not the run's by any kernel fact: the cancel goes by what the
    // kernel shows of the run (no wrapper holds it, no cgroup, no marker), finds nothing,
    // signals nothing, and says so.
    ctl(&root, id, &["cancel", id], 0);
    watchdog_once(&root, id);
    c.eq(
        &pin.alive(),
        &vec![victim],
        format_args!("nobody's process named by a forged record ({forgery:?}) was ended"),
    );
    let events = root.events(id);
    ensure!(
        c,
        named(&events, "signal").is_empty() && !named(&events, "record_unusable").is_empty(),
        "a forged record must be found unusable, and nothing signalled"
    );
    let now = fs::read(run_dir.path().join("status.json")).unwrap_or_default();
    let st_now: Value = serde_json::from_slice(&now).unwrap_or_default();
    ensure!(
        c,
        now != record && st_now["state"] == "unknown",
        "the forged record becomes unknown, never a claim that it was stopped: {st_now}"
    );
    drop(pin);
}

/// Waits until `pid` runs as `uid` (setpriv has switched before exec).
fn wait_until_uid(pid: i32, uid: u32) {
    agent_run_tests::wait_until(&format!("pid {pid} to run as uid {uid}"), T, || {
        let exec = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        (proc_uid(pid) == Some(uid) && exec == fixture_bin()).then_some(())
    });
}

cases!(forged_record_names_nothing_that_is_signalled;
    a_forged_record_naming_another_users_process_under_that_users_uid_gets_it_nothing => Forgery::OtherUsersUid,
    a_forged_record_naming_another_users_process_with_the_wrong_start_time_gets_it_nothing => Forgery::WrongStartTicks,
);
