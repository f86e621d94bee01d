//! The Ansible collection `agentrun.remote` (integrations/ansible) on a fleet of ten managed
//! hosts, with real ansible-core (PyPI, installed by `.ci/test`) and a real sshd per host.
//!
//! Each host is an sshd of its own on a loopback port with a run root of its own; "the hosts"
//! are this machine, so every test checks each host's records on disk and the processes in
//! /proc directly. The collection is built with `ansible-galaxy collection build` and installed
//! from the tarball, as a user would. The tests run one at a time (a fleet of ten and
//! `ansible-playbook` with twenty forks already fill two cores).
//!
//! The baseline beside them: the same playbook with Ansible's own `command` + `async`, which
//! leaves every process running on the hosts when ansible-playbook is killed.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agent_run_shared::lease::LeaseToken;
use agent_run_shared::time::parse_rfc3339;
use agent_run_tests::ansible::{ansible_program, installed_collection, Fleet, Host, Play};
use agent_run_tests::ctx::T;
use agent_run_tests::facts::{count_lines, epoch_now, require_root};
use agent_run_tests::{
    alive_as, ensure, proc_stat, session_members, sys, wait_until_dbg, Diagnosed, Pinned,
};
use serde_json::{json, Value};

const HOSTS: usize = 10;
/// The deadline for a whole playbook run that should take seconds.
const PLAY: Duration = Duration::from_secs(120);

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Root, this file's lock (see [`serial`]) and a fleet of `n` hosts: what a test of a play needs.
fn serial_fleet(n: usize) -> (MutexGuard<'static, ()>, Fleet) {
    require_root();
    (serial(), Fleet::new(n))
}

/// Whether the process a record names (pid + start ticks) is alive, zombies counted as gone.
fn leader_alive(rec: &Value) -> bool {
    match (rec["pid"].as_i64(), rec["start_ticks"].as_u64()) {
        (Some(pid), Some(ticks)) => alive_as(pid as i32, ticks),
        _ => false,
    }
}

/// The wrapper a record names, alive?
fn wrapper_alive(rec: &Value) -> bool {
    let ticks = rec["wrapper_start_ticks"].as_u64();
    match (rec["wrapper_pid"].as_i64(), ticks) {
        (Some(pid), Some(ticks)) => alive_as(pid as i32, ticks),
        _ => false,
    }
}

/// The one record under `host`'s root whose id starts with `prefix`.
fn record_of(fleet: &Fleet, host: &Host, prefix: &str) -> (String, Value) {
    let recs: Vec<_> = fleet
        .records(host)
        .into_iter()
        .filter(|(id, _)| id.starts_with(prefix))
        .collect();
    assert_eq!(
        recs.len(),
        1,
        "{}: expected one run {prefix}*, found {:?}",
        host.name,
        recs.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    recs.into_iter().next().unwrap()
}

fn assert_nothing_left(fleet: &Fleet, what: &str) {
    wait_until_dbg(&format!("nothing left ({what})"), T, || {
        let left = fleet.leftovers();
        if left.is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
}

fn module_defaults() -> &'static str {
    "  module_defaults:\n    agentrun.remote.run:\n      binary: \"{{ agentrun_bin }}\"\n      \
     root: \"{{ agentrun_root }}\"\n"
}

// ---------------------------------------------------------------------------------------------

/// The playbook of the first test: a command on every host, then one that fails on some.
fn site(fail_hosts: &[&str]) -> String {
    let rest = format!(
        "  vars:\n    fail_hosts: {fail:?}\n  \
         tasks:\n    - name: hello\n      agentrun.remote.run:\n        argv:\n          - sh\n          \
         - -c\n          - 'echo \"$0\" >> \"$1\"; echo \"out from $0\"; echo \"err from $0\" >&2'\n          \
         - \"{{{{ inventory_hostname }}}}\"\n          - \"{{{{ agentrun_dir }}}}/count-hello\"\n    \
         - name: fail on some\n      agentrun.remote.run:\n        cmd: 'echo x >> {{{{ agentrun_dir }}}}/count-fail; \
         exit {{{{ 3 if inventory_hostname in fail_hosts else 0 }}}}'\n",
        fail = fail_hosts,
    );
    book("fleet", &rest)
}

#[test]
fn a_play_on_ten_hosts_then_a_rerun_that_runs_nothing_twice() {
    let (_serial, fleet) = serial_fleet(HOSTS);
    let fail = ["h03", "h07"];
    let site_book = site(&fail);

    let first = fleet.play("site", &site_book, &[], PLAY);
    assert_eq!(first.code(), 2, "failed hosts give 2\n{}", first.describe());
    // Ten workers wanted the controller's lease token at once, and none was there: they made
    // one, and every run has it.
    let token = fs::read_to_string(fleet.token_file()).expect("the controller's lease token");
    let token_sha = LeaseToken::parse(token.trim()).unwrap().sha256();
    for h in &fleet.hosts {
        let r = first.result("hello", &h.name);
        let res = &r["result"];
        assert_eq!(r["status"], "ok", "{}\n{}", r, first.describe());
        assert_eq!(res["changed"], true, "{r}");
        assert_eq!(res["rc"], 0, "{r}");
        assert_eq!(res["state"], "finished", "{r}");
        assert_eq!(res["stdout"], format!("out from {}\n", h.name), "{r}");
        assert_eq!(res["stderr"], format!("err from {}\n", h.name), "{r}");
        assert_eq!(
            res["stdout_lines"],
            serde_json::json!([format!("out from {}", h.name)]),
            "res[\"stdout_lines\"]"
        );
        assert_eq!(res["stdout_truncated"], false, "{r}");
        assert_eq!(res["attempt"], 1, "{r}");
        let run_id = res["run_id"].as_str().unwrap();
        assert!(
            run_id.starts_with(&format!("ans-{}-hello-", h.name)),
            "{run_id}"
        );

        // The record on the host says the same, and the process is gone.
        let (id, rec) = record_of(&fleet, h, &format!("ans-{}-hello-", h.name));
        assert_eq!(id, run_id, "id");
        let want = json!({"state": "finished", "exit_code": 0, "lease_token_sha256": token_sha});
        fleet.run(&rec).fields(&rec, "the record", want);
        let labels = json!({"ansible.host": h.name, "ansible.task": "hello",
            "ansible.play": "fleet", "agentrun.id": run_id});
        fleet
            .run(&rec)
            .fields(&rec["labels"], "the record's labels", labels);
        fleet
            .run(&rec)
            .eq(&rec["argv"][3], h.name.as_str(), format_args!("{rec}"));
        fleet.run(&rec).eq(
            &res["record"]["pid"],
            &rec["pid"],
            "res[\"record\"][\"pid\"]",
        );
        ensure!(
            fleet.run(&rec),
            rec["pid"] == rec["pgid"] && rec["pgid"] == rec["sid"],
            "its own session: {rec}"
        );
        ensure!(
            fleet.run(&rec),
            !leader_alive(&rec) && !wrapper_alive(&rec),
            "{rec}"
        );
        assert_eq!(count_lines(&h.dir.join("count-hello")), 1, "{}", h.name);

        let r = first.result("fail on some", &h.name);
        let res = &r["result"];
        let failing = fail.contains(&h.name.as_str());
        assert_eq!(
            r["status"],
            if failing { "failed" } else { "ok" },
            "{}: {r}",
            h.name
        );
        assert_eq!(res["rc"], if failing { 3 } else { 0 }, "{r}");
        assert_eq!(res["state"], "finished", "{r}");
        assert!(res.get("timedout").is_none(), "{r}");
        let (_, rec) = record_of(&fleet, h, &format!("ans-{}-fail-on-some-", h.name));
        fleet.run(&rec).eq(
            &rec["exit_code"],
            if failing { 3 } else { 0 },
            format_args!("{rec}"),
        );
        // Each module removed its fence once its run existed: gc has none to leave behind.
        assert_eq!(fleet.fences(h), Vec::<String>::new(), "{}", h.name);
    }
    assert_nothing_left(&fleet, "after the first play");

    // The same playbook again: every run is found, nothing runs twice, the same outcome.
    let again = fleet.play("site", &site_book, &[], PLAY);
    assert_eq!(again.code(), 2, "{}", again.describe());
    for h in &fleet.hosts {
        let r = again.result("hello", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(
            r["result"]["changed"], false,
            "a replay changes nothing: {r}"
        );
        assert_eq!(
            r["result"]["stdout"],
            format!("out from {}\n", h.name),
            "r[\"result\"][\"stdout\"]"
        );
        assert_eq!(
            r["result"]["run_id"],
            first.result("hello", &h.name)["result"]["run_id"],
            "r[\"result\"][\"run_id\"]"
        );
        let r = again.result("fail on some", &h.name);
        let failing = fail.contains(&h.name.as_str());
        assert_eq!(r["status"], if failing { "failed" } else { "ok" }, "{r}");
        assert_eq!(r["result"]["rc"], if failing { 3 } else { 0 }, "{r}");
        assert_eq!(r["result"]["changed"], false, "{r}");
        assert_eq!(
            count_lines(&h.dir.join("count-hello")),
            1,
            "{}: ran twice",
            h.name
        );
        assert_eq!(
            count_lines(&h.dir.join("count-fail")),
            1,
            "{}: ran twice",
            h.name
        );
        assert_eq!(fleet.records(h).len(), 2, "{}", h.name);
    }

    // Check mode with diff: the same play predicts no change; a new command would start a run
    // (changed, a diff from absent), and nothing is created on any host.
    let check_book = site_book.replace("out from", "OUT FROM");
    let check = fleet.play("check", &check_book, &["--check", "--diff"], PLAY);
    for h in &fleet.hosts {
        let r = check.result("hello", &h.name);
        assert_eq!(r["status"], "ok", "{r}\n{}", check.describe());
        assert_eq!(r["result"]["changed"], true, "{r}");
        assert_eq!(r["result"]["state"], "absent", "{r}");
        let diff = &r["result"]["diff"];
        assert!(
            diff["before"].as_str().unwrap().contains("state: absent")
                && diff["after"].as_str().unwrap().contains("OUT FROM"),
            "{r}"
        );
        let r = check.result("fail on some", &h.name);
        assert_eq!(r["result"]["changed"], false, "{r}");
        assert_eq!(
            fleet.records(h).len(),
            2,
            "{}: check mode started something",
            h.name
        );
        assert_eq!(
            count_lines(&h.dir.join("count-hello")),
            1,
            "count_lines(&h.dir.join(\"count-hello\"))"
        );
    }
    assert_nothing_left(&fleet, "after the rerun and check mode");

    // Wall time of the same ten-host play of one command, with agent-run and with Ansible's own
    // command module (both on a fresh command, so that neither replays anything).
    let timed = |module: &str, tag: &str| -> Play {
        let tasks = format!(
            "  tasks:\n    - name: timed\n      {module}:\n        \
             argv: [sh, -c, 'echo {tag} {{{{ inventory_hostname }}}}; sleep 1']\n",
        );
        let play = fleet.play(&format!("timed-{tag}"), &book("timed", &tasks), &[], PLAY);
        assert_eq!(play.code(), 0, "{}", play.describe());
        for h in &fleet.hosts {
            assert_eq!(
                play.result("timed", &h.name)["result"]["stdout"]
                    .as_str()
                    .unwrap()
                    .trim(),
                format!("{tag} {}", h.name), "play.result(\"timed\", &h.name)[\"result\"][\"stdout\"] .as_str() .unwrap() .trim()"
            );
        }
        play
    };
    let with = timed("agentrun.remote.run", "with");
    let without = timed("ansible.builtin.command", "without");
    eprintln!(
        "ansible: a 10-host play of one 1 s command: {:.2} s with agentrun.remote.run, {:.2} s \
         with ansible.builtin.command",
        with.elapsed.as_secs_f64(),
        without.elapsed.as_secs_f64()
    );
    assert_nothing_left(&fleet, "after the timed plays");
}

#[test]
fn ansible_doc_shows_the_whole_documentation() {
    let _serial = serial();
    let collections = installed_collection();
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(ansible_program("ansible-doc"))
        .arg("agentrun.remote.run")
        .env("ANSIBLE_COLLECTIONS_PATH", collections)
        .env("ANSIBLE_HOME", home.path())
        .env("ANSIBLE_NOCOLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "OPTIONS",
        "EXAMPLES",
        "RETURN VALUES",
        "state",
        "finished",
        "started",
        "status",
        "cancelled",
        "lease",
        "timeout",
        "grace",
        "labels",
        "env",
        "chdir",
        "argv",
        "cmd",
        "rerun",
        "max_output",
        "lease_token",
        "agent-run/lease-token",
        "timedout",
        "stdout_truncated",
        "check_mode",
        "diff_mode",
        "agentrun.remote.run:",
    ] {
        assert!(text.contains(want), "ansible-doc lacks {want:?}:\n{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Interruptions: Ctrl-C, SIGKILL, and the baseline with Ansible's own async

/// A playbook of one play, `name`, on every host without facts: the module defaults `md` (YAML
/// lines, or none), then `rest` (its vars, its tasks).
fn play_of(name: &str, md: &str, rest: &str) -> String {
    format!("- name: {name}\n  hosts: all\n  gather_facts: false\n{md}{rest}")
}

/// [`play_of`] with the module defaults of the built binary and root per host.
fn book(name: &str, rest: &str) -> String {
    play_of(name, module_defaults(), rest)
}

/// Waits until every host has exactly one run `prefix`* whose leader is alive and whose session
/// has at least `members` live processes; returns the records.
fn wait_all_running(
    fleet: &Fleet,
    prefix: &str,
    members: usize,
    play: &agent_run_tests::Spawned,
) -> Vec<Value> {
    wait_until_dbg("every host's run running", PLAY, || {
        let mut recs = Vec::new();
        for h in &fleet.hosts {
            let found: Vec<_> = fleet
                .records(h)
                .into_iter()
                .filter(|(id, _)| id.starts_with(prefix))
                .collect();
            let ok = match found.as_slice() {
                [(_, rec)] => {
                    rec["state"] == "running"
                        && leader_alive(rec)
                        && rec["sid"]
                            .as_i64()
                            .is_some_and(|sid| session_members(sid as i32).len() >= members)
                }
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "{}: {:?}\n--- ansible-playbook so far\n{}",
                    h.name,
                    found
                        .iter()
                        .map(|r| (&r.0, &r.1["state"]))
                        .collect::<Vec<_>>(),
                    String::from_utf8_lossy(&play.stdout_so_far())
                ));
            }
            recs.push(found[0].1.clone());
        }
        Ok(recs)
    })
}

/// Waits until the lease of each run `recs` (one a host of `hosts`, in order) ends at least
/// `secs` after the run's creation: its worker has renewed it.
fn wait_renewed(hosts: &[Host], recs: &[Value], secs: f64) {
    wait_until_dbg("a renewal on every host", PLAY, || {
        for (h, rec) in hosts.iter().zip(recs) {
            let dir = h.root.join(rec["run_id"].as_str().unwrap());
            let lease: Value = fs::read_to_string(dir.join("lease.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            let created = parse_rfc3339(rec["created_at"].as_str().unwrap()).unwrap();
            match lease["deadline_epoch"].as_f64() {
                Some(d) if d - created >= secs => {}
                other => return Err(format!("{}: deadline {other:?}, created {created}", h.name)),
            }
        }
        Ok(())
    });
}

/// Waits, to `deadline`, until every host's run `ans-*` has a final record; the records.
fn wait_all_final(fleet: &Fleet, deadline: Duration) -> Vec<Value> {
    wait_until_dbg("every run final", deadline, || {
        let mut finals = Vec::new();
        for h in &fleet.hosts {
            let (_, rec) = record_of(fleet, h, "ans-");
            if !matches!(
                rec["state"].as_str(),
                Some("cancelled" | "finished" | "unknown")
            ) {
                return Err(format!("{}: {}", h.name, rec["state"]));
            }
            finals.push(rec);
        }
        Ok(finals)
    })
}

/// The run `rec` on host `h` was cancelled for `reason`.
fn cancelled_for(fleet: &Fleet, h: &Host, rec: &Value, reason: &str) {
    let run = fleet.run(rec);
    let what = format!("{}: {rec}", h.name);
    run.eq(&rec["state"], "cancelled", &what);
    run.eq(&rec["reason"], reason, &what);
}

/// Every live process of the runs `recs` (their sessions) and their wrappers, pinned.
fn pin_runs(recs: &[Value]) -> Pinned {
    let mut pids = Vec::new();
    for rec in recs {
        pids.extend(session_members(rec["sid"].as_i64().unwrap() as i32));
        pids.push(rec["wrapper_pid"].as_i64().unwrap() as i32);
    }
    Pinned::new(&pids)
}

const LONG: &str = r#"  vars:
    plain: 'sleep 300 & sleep 300'
    # Ignores TERM and HUP (so do its children): only the KILL at the grace stops it.
    stubborn: 'trap "" TERM HUP; sleep 300 & sleep 300'
  tasks:
    - name: long
      agentrun.remote.run:
        cmd: "{{ stubborn if inventory_hostname in ['h02', 'h05', 'h08'] else plain }}"
        grace: 2s
        lease: 6s
"#;

#[test]
fn ctrl_c_of_ansible_playbook_cancels_the_run_on_every_host_within_grace() {
    let (_serial, fleet) = serial_fleet(HOSTS);
    let trace = fleet.path("trace.log");
    let (play, _results) = fleet.spawn("long", &book("long", LONG), &[], Some(&trace));
    let pgid = play.child.id() as i32;
    let recs = wait_all_running(&fleet, "ans-", 3, &play);
    let runs = pin_runs(&recs);
    // Every worker is in its poll loop (it has renewed the lease once: the start gave a deadline
    // 6 s after the launch, the first renewal comes after the module's first wait of 2 s).
    wait_renewed(&fleet.hosts, &recs, 7.0);
    let controller = fleet.pin_descendants(pgid);

    // Ctrl-C: SIGINT to the foreground process group, as the terminal sends it.
    let t0 = Instant::now();
    let t0_epoch = epoch_now();
    sys::kill_group(pgid, libc::SIGINT).expect("Ctrl-C to ansible-playbook's group");
    let grace = Duration::from_secs(2);
    // ansible-playbook waits for its workers, and they for their cancels: once it has exited,
    // every run is final, at once.
    let out = play.finish(PLAY);
    let exited = t0.elapsed();
    let finals: Vec<Value> = fleet
        .hosts
        .iter()
        .map(|h| record_of(&fleet, h, "ans-").1)
        .collect();
    // A final record means no process of the run is left (zombies count as gone).
    let gone = runs.wait_all_gone(Duration::from_millis(500));
    assert!(gone.is_ok(), "processes left: {gone:?}");
    let mut took = 0.0f64;
    let mut reached = 0.0f64;
    let hops = fs::read_to_string(&trace).unwrap_or_default();
    for (h, rec) in fleet.hosts.iter().zip(&finals) {
        fleet.run(rec).eq(
            &rec["state"],
            "cancelled",
            format_args!(
                "{}: not cancelled when ansible-playbook exited: {rec}",
                h.name
            ),
        );
        let ended = parse_rfc3339(rec["ended_at"].as_str().unwrap()).unwrap() - t0_epoch;
        took = took.max(ended);
        fleet.run(rec).eq(
            &rec["reason"],
            "cancel_request",
            format_args!("{}: {rec}", h.name),
        );
        fleet.run(rec).eq(
            &rec["cleanup"]["survivors"],
            &serde_json::json!([]),
            format_args!("{rec}"),
        );
        let signals = rec["cleanup"]["signals"].to_string();
        let stubborn = ["h02", "h05", "h08"].contains(&h.name.as_str());
        fleet.run(rec).eq(
            &signals.contains("KILL"),
            &stubborn,
            format_args!("{}: {rec}", h.name),
        );
        let cancel = fs::read_to_string(
            h.root
                .join(rec["run_id"].as_str().unwrap())
                .join("cancel.json"),
        )
        .unwrap_or_default();
        assert!(
            cancel.contains("cancel_request"),
            "{}: cancel.json {cancel}",
            h.name
        );
        // The hops of this host's cancel, in seconds after the SIGINT: the worker's signal,
        // the cancel command sent, the request on the host (cancel.json), the command's return.
        let requested = serde_json::from_str::<Value>(&cancel)
            .ok()
            .and_then(|c| parse_rfc3339(c["requested_at"].as_str()?))
            .unwrap_or_else(|| panic!("{}: no requested_at in cancel.json {cancel}", h.name))
            - t0_epoch;
        reached = reached.max(requested);
        let id = format!("ans-{}-", h.name);
        let hop = |what: &str| {
            hops.lines()
                .filter(|l| l.contains(what) && l.contains(&id))
                .filter_map(|l| l.split(' ').nth(1)?.parse::<f64>().ok())
                .next()
                .map_or(f64::NAN, |t| t - t0_epoch)
        };
        eprintln!(
            "ansible: Ctrl-C hops {}: signal {:.3} cancel sent {:.3} reached {requested:.3} \
             returned {:.3} ended {ended:.3}",
            h.name,
            hop("signal"),
            hop("cancel start"),
            hop("cancel done"),
        );
    }
    // The cancel is one remote command per host, sent the moment the worker gets the signal
    // (about 0.2 s to reach ten hosts on two cores, 0.3 s at a load of 15; a login shell that
    // sources a slow rc file made it 1-4 s).
    assert!(
        reached <= 1.0,
        "a cancel reached its host {reached:.3} s after Ctrl-C: more than 1 s"
    );
    assert!(
        took <= (grace + Duration::from_secs(2)).as_secs_f64(),
        "the last run was cancelled {took:.3} s after Ctrl-C: more than grace (2 s) + 2 s"
    );
    // ansible-playbook ends as interrupted (99), after its workers cancelled.
    assert_eq!(
        out.status.code(),
        Some(99),
        "{}",
        agent_run_tests::describe_output("ansible-playbook", &out)
    );
    assert!(
        controller.wait_all_gone(T).is_ok(),
        "workers left: {:?}",
        controller.alive()
    );
    eprintln!(
        "ansible: Ctrl-C: every cancel on its host within {reached:.3} s, every run cancelled \
         in {took:.3} s, ansible-playbook exited after {exited:?}"
    );
    assert_nothing_left(&fleet, "after Ctrl-C");

    // Running the play again would start the interrupted command afresh, as attempt 2.
    let check = fleet.play("long", &book("long", LONG), &["--check"], PLAY);
    assert_eq!(check.code(), 0, "{}", check.describe());
    for (h, rec) in fleet.hosts.iter().zip(&finals) {
        let r = check.result("long", &h.name);
        assert_eq!(r["result"]["changed"], true, "{r}");
        assert_eq!(r["result"]["attempt"], 2, "{r}");
        fleet.run(rec).eq(
            &r["result"]["run_id"],
            &format!("{}.r2", rec["run_id"].as_str().unwrap()),
            format_args!("{r}"),
        );
        assert_eq!(fleet.records(h).len(), 1, "check mode started nothing");
    }
}

/// The lease of the SIGKILL tests, and how long after the kill every run must be final: the
/// lease (counted from the last renewal, at most a poll, a third of the lease, before the kill),
/// the grace, and slack for a loaded machine.
const KILL_LEASE: Duration = Duration::from_secs(3);
const KILL_GRACE: Duration = Duration::from_secs(1);
const KILL_SLACK: Duration = Duration::from_secs(4);

fn kill_deadline() -> Duration {
    KILL_LEASE + KILL_LEASE / 3 + KILL_GRACE + KILL_SLACK
}

const LEASED: &str = r#"  tasks:
    - name: leased
      agentrun.remote.run:
        cmd: 'sleep 300 & sleep 300'
        lease: 3s
        grace: 1s
"#;

#[test]
fn sigkill_of_ansible_playbook_leaves_each_run_to_its_lease() {
    let (_serial, fleet) = serial_fleet(HOSTS);
    let (play, _results) = fleet.spawn("leased", &book("leased", LEASED), &[], None);
    let pid = play.child.id() as i32;
    let recs = wait_all_running(&fleet, "ans-", 3, &play);
    let runs = pin_runs(&recs);
    let workers = fleet.pin_descendants(pid);
    assert!(!workers.pids().is_empty(), "!workers.pids().is_empty()");

    // SIGKILL to ansible-playbook itself: no handler runs, nothing is cancelled.
    let killed_at = epoch_now();
    let t0 = Instant::now();
    play.signal(libc::SIGKILL);
    let out = play.finish(T);
    assert_eq!(out.status.code(), None, "killed by a signal");

    let finals = wait_all_final(&fleet, kill_deadline() + T);
    let took = t0.elapsed();
    assert!(runs.wait_all_gone(T).is_ok(), "left: {:?}", runs.alive());
    for (h, rec) in fleet.hosts.iter().zip(&finals) {
        cancelled_for(&fleet, h, rec, "lease_expired");
        fleet.run(rec).eq(
            &rec["cleanup"]["survivors"],
            &serde_json::json!([]),
            format_args!("{rec}"),
        );
        // Nobody renewed after the controller died (one renewal may have been on its way).
        let lease = fs::read_to_string(
            h.root
                .join(rec["run_id"].as_str().unwrap())
                .join("lease.json"),
        )
        .unwrap();
        let lease: Value = serde_json::from_str(&lease).unwrap();
        let deadline = lease["deadline_epoch"].as_f64().unwrap();
        let last_renewal = deadline - KILL_LEASE.as_secs_f64();
        ensure!(
            fleet.run(rec),
            last_renewal <= killed_at + 1.5,
            "{}: renewed {:.2} s after the controller died: {rec}",
            h.name,
            last_renewal - killed_at
        );
        let ended = parse_rfc3339(rec["ended_at"].as_str().unwrap()).unwrap() - killed_at;
        ensure!(
            fleet.run(rec),
            ended <= kill_deadline().as_secs_f64(),
            "{}: stopped {ended:.2} s after the kill: {rec}",
            h.name
        );
    }
    // The orphaned workers noticed and ended without renewing anything.
    assert!(
        workers.wait_all_gone(T).is_ok(),
        "workers left: {:?}",
        workers.alive()
    );
    eprintln!("ansible: SIGKILL: every run stopped by its 3 s lease {took:?} after the kill");
    assert_nothing_left(&fleet, "after SIGKILL");
}

/// The pids of `pids` (pid, start ticks) still alive.
fn alive_of(pids: &[(i32, u64)]) -> Vec<i32> {
    let alive = pids.iter().filter(|(pid, ticks)| alive_as(*pid, *ticks));
    alive.map(|(pid, _)| *pid).collect()
}

#[test]
fn baseline_ansible_async_leaves_every_process_running_after_sigkill() {
    let (_serial, fleet) = serial_fleet(HOSTS);
    // The same command as `leased`, with Ansible's own command module and async.
    let yaml = play_of(
        "async",
        "",
        r#"  tasks:
    - name: async
      ansible.builtin.command:
        argv: [sh, -c, 'echo $$ > "$0/workload.pid"; sleep 300 & exec sleep 300', "{{ agentrun_dir }}"]
      async: 600
      poll: 1
      # The module unpacks itself under TMPDIR and removes that on its way out, which a
      # killed module never takes: in the host's dir, the fleet's cleanup removes it.
      environment:
        TMPDIR: "{{ agentrun_dir }}"
"#,
    );
    let (play, _results) = fleet.spawn("async", &yaml, &[], None);
    let pid = play.child.id() as i32;
    let workloads: Vec<(i32, u64)> = wait_until_dbg("every host's workload running", PLAY, || {
        let mut found = Vec::new();
        for h in &fleet.hosts {
            let text = fs::read_to_string(h.dir.join("workload.pid")).unwrap_or_default();
            let Ok(p) = text.trim().parse::<i32>() else {
                return Err(format!("{}: no pid yet", h.name));
            };
            match proc_stat(p) {
                Some(s) if !matches!(s.0, 'Z' | 'X') => {
                    // The workload and its background sleep: the whole session of the command.
                    found.push((p, s.4));
                }
                _ => return Err(format!("{}: {p} not alive", h.name)),
            }
        }
        Ok(found)
    });
    let mut everything: Vec<i32> = Vec::new();
    for (p, _) in &workloads {
        let sid = proc_stat(*p).map(|s| s.3).unwrap_or(*p);
        everything.extend(session_members(sid));
        everything.push(*p);
    }
    let pinned = Pinned::new(&everything);
    let workers = fleet.pin_descendants(pid);

    play.signal(libc::SIGKILL);
    let _ = play.finish(T);
    // Observe for as long as agent-run's leases needed to stop everything (a deliberate wait:
    // the claim is that nothing happens in that time).
    std::thread::sleep(kill_deadline());
    let alive = alive_of(&workloads);
    assert_eq!(
        alive.len(),
        HOSTS,
        "with command + async, every host's process outlives the killed controller (alive: \
         {alive:?} of {workloads:?})"
    );
    eprintln!(
        "ansible: baseline: {} of {HOSTS} async processes still running {:?} after SIGKILL",
        alive.len(),
        kill_deadline()
    );
    // Clean up by pid: the workloads and their background sleeps, then the orphaned workers
    // (their async_status polls end once the jobs do).
    for p in pinned.pids() {
        let _ = pinned.signal(p, libc::SIGKILL);
    }
    assert!(pinned.wait_all_gone(T).is_ok(), "{:?}", pinned.alive());
    // The orphaned workers poll on for a controller that is gone: Ansible leaves them too.
    for p in workers.alive() {
        let _ = workers.signal(p, libc::SIGKILL);
    }
    assert!(
        workers.wait_all_gone(T).is_ok(),
        "workers left: {:?}",
        workers.alive()
    );
    assert_nothing_left(&fleet, "after the baseline's clean-up");
}

// ---------------------------------------------------------------------------------------------
// Timeouts, and a run started in one playbook and waited for in a later one

const TIMEOUTS: &str = r#"  tasks:
    - name: limited
      agentrun.remote.run:
        cmd: 'sleep 300 & sleep 300'
        timeout: 2s
        grace: 1s
      register: limited
      ignore_errors: true
    - name: tell a timeout from a failure
      ansible.builtin.assert:
        that:
          - limited is failed
          - limited is timedout
          - limited.rc == 124
          - limited.reason == 'timeout'
          - limited.timedout.period == 2
    - name: options
      agentrun.remote.run:
        cmd: 'echo "$GREETING from $(pwd)" >&2; seq 1 100000'
        chdir: "{{ agentrun_dir }}"
        env:
          GREETING: hello
        labels:
          ticket: OPS-1
        max_output: 100
    - name: looped
      agentrun.remote.run:
        cmd: "echo {{ item }}"
      loop: [one, two]
    - name: keyword
      agentrun.remote.run:
        cmd: 'sleep 300 & sleep 300'
        grace: 1s
      timeout: 3
      ignore_errors: true
"#;

#[test]
fn a_task_timeout_stops_the_run_on_every_host() {
    let (_serial, fleet) = serial_fleet(HOSTS);
    let play = fleet.play("timeouts", &book("timeouts", TIMEOUTS), &[], PLAY);
    assert_eq!(play.code(), 0, "{}", play.describe());
    let mut cancelled = 0;
    let mut not_started = Vec::new();
    for h in &fleet.hosts {
        let r = play.result("limited", &h.name);
        assert_eq!(r["status"], "failed", "{r}");
        let res = &r["result"];
        assert_eq!(res["rc"], 124, "{r}");
        assert_eq!(res["reason"], "timeout", "{r}");
        assert_eq!(res["timedout"]["period"], 2.0, "{r}");
        assert_eq!(res["timedout"]["reason"], "timeout", "{r}");
        assert_eq!(res["cancelled"], true, "{r}");
        assert_eq!(
            play.result("tell a timeout from a failure", &h.name)["status"],
            "ok",
            "play.result(\"tell a timeout from a failure\", &h.name)[\"status\"]"
        );
        let (_, rec) = record_of(&fleet, h, &format!("ans-{}-limited-", h.name));
        let want = json!({"state": "cancelled", "reason": "timeout", "timeout_ms": 2000});
        fleet.run(&rec).fields(&rec, "the record", want);
        let took = parse_rfc3339(rec["ended_at"].as_str().unwrap()).unwrap()
            - parse_rfc3339(rec["started_at"].as_str().unwrap()).unwrap();
        ensure!(
            fleet.run(&rec),
            (2.0..4.0).contains(&took),
            "{}: {took} s: {rec}",
            h.name
        );
        ensure!(fleet.run(&rec), !leader_alive(&rec), "{rec}");

        // cwd, env, labels, and bounded output that says it was cut.
        let r = play.result("options", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        let res = &r["result"];
        let full: String = (1..=100000).map(|i| format!("{i}\n")).collect();
        assert_eq!(res["stdout_truncated"], true, "{r}");
        assert_eq!(res["stdout_bytes"], full.len(), "{r}");
        assert_eq!(res["stdout"], full[full.len() - 100..], "{r}");
        assert_eq!(res["stderr_truncated"], false, "{r}");
        assert_eq!(
            res["stderr"],
            format!("hello from {}\n", h.dir.display()),
            "{r}"
        );
        assert!(res["msg"].as_str().unwrap().contains("truncated"), "{r}");
        let (_, rec) = record_of(&fleet, h, &format!("ans-{}-options-", h.name));
        fleet.run(&rec).eq(
            &rec["env"],
            &serde_json::json!(["GREETING"]),
            format_args!("{rec}"),
        );
        ensure!(
            fleet.run(&rec),
            !rec.to_string().contains("hello"),
            "no env value in the record: {rec}"
        );
        fleet
            .run(&rec)
            .eq(&rec["labels"]["ticket"], "OPS-1", format_args!("{rec}"));
        fleet.run(&rec).eq(
            &rec["cwd"],
            &h.dir.display().to_string(),
            format_args!("{rec}"),
        );

        // A loop: a run of its own for each item (the item is part of the derived id).
        let r = play.result("looped", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        let items = r["result"]["results"].as_array().unwrap();
        let outs: Vec<_> = items.iter().map(|i| i["stdout"].clone()).collect();
        assert_eq!(outs, vec!["one\n", "two\n"], "{r}");
        assert_ne!(items[0]["run_id"], items[1]["run_id"], "{r}");

        // Ansible's own task timeout: Ansible gives up on the task and cancels. The timeout (3 s)
        // comes during the task's first module call (it waits on the host for a third of the
        // lease), often before the module has got to `agent-run start` on a loaded machine: then
        // the cancel goes through the host's fence, and either the run exists and is cancelled,
        // or the module finds the cancel's mark, uses it up and starts nothing.
        let r = play.result("keyword", &h.name);
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(r["result"]["timedout"]["period"], 3, "{r}");
        let prefix = format!("ans-{}-keyword-", h.name);
        let keyword = |fleet: &Fleet| -> Vec<(String, Value)> {
            fleet
                .records(h)
                .into_iter()
                .filter(|(id, _)| id.starts_with(&prefix))
                .collect()
        };
        match keyword(&fleet).as_slice() {
            [(_, rec)] => {
                fleet
                    .run(rec)
                    .eq(&rec["state"], "cancelled", format_args!("{rec}"));
                fleet
                    .run(rec)
                    .eq(&rec["reason"], "cancel_request", format_args!("{rec}"));
                cancelled += 1;
            }
            [] => {
                let fence: Vec<_> = fs::read_dir(&h.root)
                    .map(|d| {
                        d.flatten()
                            .filter(|e| {
                                e.file_name()
                                    .to_string_lossy()
                                    .starts_with(&format!(".ansible-fence.{prefix}"))
                            })
                            .map(|e| e.path())
                            .collect()
                    })
                    .unwrap_or_default();
                // No fence at all: the module was never sent (the cancel went by label alone).
                if let [fence] = fence.as_slice() {
                    wait_until_dbg(
                        &format!("{}: the module used up the cancel's mark", h.name),
                        T,
                        || {
                            let text = fs::read_to_string(fence).unwrap_or_default();
                            let marks = serde_json::from_str::<Value>(&text)
                                .map(|v| v["cancelled"].clone())
                                .unwrap_or(Value::Null);
                            (marks == serde_json::json!({})).then_some(()).ok_or(text)
                        },
                    );
                }
                not_started.push(h);
            }
            more => panic!("{}: several runs {prefix}*: {more:?}", h.name),
        }
    }
    assert_nothing_left(&fleet, "after the timeouts");
    for h in &not_started {
        let late: Vec<_> = fleet
            .records(h)
            .into_iter()
            .filter(|(id, _)| id.starts_with(&format!("ans-{}-keyword-", h.name)))
            .collect();
        assert!(
            late.is_empty(),
            "{}: started after the cancel: {late:?}",
            h.name
        );
    }
    eprintln!(
        "ansible: task timeout: {cancelled} runs cancelled, {} never started (cancelled before \
         the run existed)",
        not_started.len()
    );
}

// ---------------------------------------------------------------------------------------------
// A cancel that comes before the run exists (the first module call is still on its way to
// `agent-run start`): the host's fence (module_utils/fence.py)

/// The task of the fence test. The module pauses (the collection's test hook) where `pause_at`
/// says for the host: `fence` before it takes the fence, `start` under it right before
/// `agent-run start`. h03 is interrupted by the task's own `timeout:` (10 s: its module must have
/// been sent by then, or there is no module to fence; it is paused long before on this machine),
/// the others by Ctrl-C. Once `quick` exists in a host's directory the command ends at once (the
/// rerun).
const FENCED: &str = r#"  environment:
    AGENTRUN_ANSIBLE_TEST_PAUSE: "{{ pause_at.get(inventory_hostname, 'none') }}:{{ agentrun_dir }}"
  tasks:
    - name: fenced
      agentrun.remote.run:
        cmd: 'echo run >> {{ agentrun_dir }}/count; [ -e {{ agentrun_dir }}/quick ] || { sleep 300 & sleep 300; }'
        grace: 1s
      timeout: "{{ 10 if inventory_hostname == 'h03' else 600 }}"
"#;

/// The run id of `host`'s paused module and its pid, once it has paused at `point`.
fn paused(host: &Host, point: &str) -> (String, i32) {
    let prefix = format!("ans-{}-fenced-", host.name);
    let suffix = format!(".{point}.paused");
    wait_until_dbg(
        &format!("{}'s module paused at {point}", host.name),
        PLAY,
        || {
            for e in fs::read_dir(&host.dir)
                .map_err(|e| e.to_string())?
                .flatten()
            {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(base) = name
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.strip_suffix(&suffix))
                {
                    if let Some(pid) = fs::read_to_string(e.path())
                        .ok()
                        .and_then(|t| t.trim().parse::<i32>().ok())
                    {
                        return Ok((format!("{prefix}{base}"), pid));
                    }
                }
            }
            Err(format!("no {prefix}*{suffix} in {}", host.dir.display()))
        },
    )
}

/// Waits for the plugin's trace line `what` (e.g. "cancel done ID"); its wall-clock time.
fn traced(trace: &std::path::Path, what: &str) -> f64 {
    wait_until_dbg(&format!("trace: {what}"), PLAY, || {
        let text = fs::read_to_string(trace).unwrap_or_default();
        text.lines()
            .find(|l| l.ends_with(what))
            .and_then(|l| l.split(' ').nth(1)?.parse::<f64>().ok())
            .ok_or_else(|| text.clone())
    })
}

/// How many processes wait (blocked in flock(2)) for the lock of `path`, as /proc/locks says:
/// `N: -> FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF`.
fn flock_waiters(path: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(ino) = fs::metadata(path).map(|m| m.ino().to_string()) else {
        return 0;
    };
    fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" -> FLOCK "))
        .filter(|l| {
            l.split_whitespace()
                .any(|w| w.matches(':').count() == 2 && w.rsplit(':').next() == Some(&ino))
        })
        .count()
}

/// The pid of the worker (the action plugin's process) that wrote trace line `what`.
fn tracer_pid(trace: &std::path::Path, what: &str) -> i32 {
    let text = fs::read_to_string(trace).unwrap_or_default();
    text.lines()
        .find(|l| l.ends_with(what))
        .and_then(|l| l.split(' ').nth(2)?.parse::<i32>().ok())
        .unwrap_or_else(|| panic!("no trace line {what:?} with a pid in:\n{text}"))
}

/// Writes a fence file `name` into `host`'s run root with `marks` ({token: epoch}), last written
/// `age` ago (its mtime).
fn plant_fence(host: &Host, name: &str, marks: Value, age: Duration) {
    let path = host.root.join(name);
    fs::write(
        &path,
        format!("{}\n", serde_json::json!({"cancelled": marks})),
    )
    .unwrap();
    let f = fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() - age).unwrap();
}

/// The cancel marks in `host`'s fence of `base`.
fn marks(host: &Host, base: &str) -> Value {
    let text = fs::read_to_string(host.root.join(format!(".ansible-fence.{base}")))
        .unwrap_or_else(|e| panic!("{}: no fence of {base}: {e}", host.name));
    serde_json::from_str::<Value>(&text).unwrap()["cancelled"].clone()
}

/// No process of `rec`'s run is alive: its session is empty, no process carries its run dir,
/// its wrapper is gone and its cgroup (if it had one) is removed or empty.
fn run_gone(host: &Host, rec: &Value) -> Result<(), String> {
    let sid = rec["sid"].as_i64().unwrap() as i32;
    let dir = host
        .root
        .join(rec["run_id"].as_str().unwrap())
        .display()
        .to_string();
    let members = session_members(sid);
    let carriers = agent_run_tests::processes_with_env("AGENT_RUN_DIR", |v| v == dir.as_bytes());
    let cgroup = rec["containment"]["cgroup"].as_str().unwrap_or_default();
    let in_cgroup = if cgroup.is_empty() {
        String::new()
    } else {
        fs::read_to_string(format!("{cgroup}/cgroup.procs")).unwrap_or_default()
    };
    if members.is_empty()
        && carriers.is_empty()
        && !leader_alive(rec)
        && !wrapper_alive(rec)
        && in_cgroup.trim().is_empty()
    {
        Ok(())
    } else {
        Err(format!(
            "{}: session {members:?}, carriers {carriers:?}, cgroup {cgroup}: {in_cgroup:?}, \
             wrapper alive {}",
            host.name,
            wrapper_alive(rec)
        ))
    }
}

#[test]
fn a_cancel_before_the_run_exists_leaves_nothing_running_and_a_rerun_works() {
    let (_serial, fleet) = serial_fleet(3);
    let (h1, h2, h3) = (&fleet.hosts[0], &fleet.hosts[1], &fleet.hosts[2]);
    let pause = r#"{"pause_at": {"h01": "fence", "h02": "start", "h03": "fence"}}"#;
    let trace = fleet.path("trace.log");
    let (play, results) = fleet.spawn(
        "fenced",
        &book("fenced", FENCED),
        &["-e", pause],
        Some(&trace),
    );
    let pgid = play.child.id() as i32;
    let (base1, pid1) = paused(h1, "fence");
    let (base2, pid2) = paused(h2, "start");
    let (base3, pid3) = paused(h3, "fence");
    let modules = Pinned::new(&[pid1, pid2, pid3]);
    let fence2 = h2.root.join(format!(".ansible-fence.{base2}"));

    // h03: the task's timeout (10 s) while its module has not taken the fence yet. The cancel
    // returns having marked this invocation, with nothing to stop.
    traced(&trace, &format!("cancel done {base3}"));
    assert!(fleet.records(h3).is_empty(), "{:?}", fleet.records(h3));
    assert_eq!(
        marks(h3, &base3).as_object().unwrap().len(),
        1,
        "marks(h3, &base3).as_object().unwrap().len()"
    );
    // The module goes on, finds the mark, starts nothing and ends: the mark is used up, and the
    // fence, empty, removed.
    fs::write(h3.dir.join(format!("{base3}.fence.go")), "").unwrap();
    let gone = Pinned::new(&[pid3]).wait_all_gone(T);
    assert!(gone.is_ok(), "h03's module still running: {gone:?}");
    assert!(fleet.records(h3).is_empty(), "{:?}", fleet.records(h3));
    assert_eq!(
        fleet.fences(h3),
        Vec::<String>::new(),
        "h03's fence is left"
    );
    assert!(!h3.dir.join("count").exists(), "h03's command ran");

    // h03's worker has delivered its result to ansible-playbook and exited before the Ctrl-C.
    // Ansible's worker dies at once on the SIGINT ansible-playbook forwards to it (its _term:
    // killpg, os._exit): landing while the worker held the results queue's write lock (in
    // FinalQueue.put, sending its result), it left that lock taken for good, and ansible-playbook
    // then blocked forever in its strategy's cleanup, putting its end mark on that queue (1 run in
    // 10: the lock's semaphore at 0 with one waiter, and h03's result never shown).
    let worker3 = Pinned::new(&[tracer_pid(&trace, &format!("cancel done {base3}"))]);
    let r3 = wait_until_dbg("h03's result in ansible-playbook", PLAY, || {
        let text = fs::read_to_string(&results).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["host"] == "h03")
            .ok_or(text)
    });
    assert_eq!(r3["status"], "failed", "{r3}");
    let gone = worker3.wait_all_gone(T);
    assert!(gone.is_ok(), "h03's worker still running: {gone:?}");

    // Ctrl-C, while h01's module has not taken the fence and h02's holds it, about to start.
    sys::kill_group(pgid, libc::SIGINT).expect("Ctrl-C to ansible-playbook's group");
    // h01: as h03.
    traced(&trace, &format!("cancel done {base1}"));
    assert!(fleet.records(h1).is_empty(), "{:?}", fleet.records(h1));
    assert_eq!(
        marks(h1, &base1).as_object().unwrap().len(),
        1,
        "marks(h1, &base1).as_object().unwrap().len()"
    );
    // h02: the cancel waits for the fence (a waiter in /proc/locks, a kernel fact)...
    wait_until_dbg(
        "h02's cancel waits for the fence",
        PLAY,
        || match flock_waiters(&fence2) {
            0 => Err(fs::read_to_string(&trace).unwrap_or_default()),
            n => Ok(n),
        },
    );
    assert!(fleet.records(h2).is_empty(), "{:?}", fleet.records(h2));
    fs::write(h1.dir.join(format!("{base1}.fence.go")), "").unwrap();
    // ...until the module has started the run and let the fence go; then the cancel finds the
    // run by its label and stops it: when the cancel returns, the run is final, nothing left.
    fs::write(h2.dir.join(format!("{base2}.start.go")), "").unwrap();
    let done2 = traced(&trace, &format!("cancel done {base2}"));
    let (id2, rec2) = record_of(&fleet, h2, &base2);
    assert_eq!(id2, base2, "id2");
    assert_eq!(rec2["state"], "cancelled", "{rec2}");
    assert_eq!(rec2["reason"], "cancel_request", "{rec2}");
    let ended = parse_rfc3339(rec2["ended_at"].as_str().unwrap()).unwrap();
    assert!(
        ended <= done2,
        "h02's run ended at {ended}, after the cancel returned at {done2}"
    );
    assert!(!leader_alive(&rec2), "{rec2}");
    wait_until_dbg("h02's run gone", T, || run_gone(h2, &rec2));
    assert_eq!(
        count_lines(&h2.dir.join("count")),
        1,
        "h02's command started once"
    );

    let gone = modules.wait_all_gone(T);
    assert!(gone.is_ok(), "modules still running: {gone:?}");
    assert!(fleet.records(h1).is_empty(), "{:?}", fleet.records(h1));
    assert!(!h1.dir.join("count").exists(), "h01's command ran");
    // No fence is left: h01's module used up its mark; h02's removed its fence once the run
    // existed, and the mark its cancel then left in a new one once its wait ended.
    for h in &fleet.hosts {
        assert_eq!(fleet.fences(h), Vec::<String>::new(), "{}", h.name);
    }
    let out = play.finish(PLAY);
    assert_ne!(out.status.code(), Some(0), "{out:?}");

    // Fences whose marks nobody came for: one nobody wrote for two days goes at the next start
    // in that root, one written just now stays.
    let token = "0123456789abcdef0123456789abcdef";
    let now = epoch_now();
    plant_fence(
        h2,
        ".ansible-fence.stale",
        serde_json::json!({ token: now - 2.0 * 86400.0 }),
        Duration::from_secs(2 * 86400),
    );
    plant_fence(
        h2,
        ".ansible-fence.fresh",
        serde_json::json!({ token: now }),
        Duration::ZERO,
    );

    // A rerun of the task (a new invocation: not refused by the old marks) runs it, once.
    for h in &fleet.hosts {
        fs::write(h.dir.join("quick"), "").unwrap();
    }
    let rerun = fleet.play(
        "fenced",
        &book("fenced", FENCED),
        &["-e", r#"{"pause_at": {}}"#],
        PLAY,
    );
    assert_eq!(rerun.code(), 0, "{}", rerun.describe());
    for (h, base, want) in [
        (h1, &base1, base1.clone()),
        (h2, &base2, format!("{base2}.r2")),
        (h3, &base3, base3.clone()),
    ] {
        let r = rerun.result("fenced", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["result"]["run_id"], want.as_str(), "{r}");
        assert_eq!(r["result"]["rc"], 0, "{r}");
        let rec: Value = fleet
            .records(h)
            .into_iter()
            .find(|(id, _)| *id == want)
            .unwrap_or_else(|| panic!("{}: no run {want}", h.name))
            .1;
        fleet
            .run(&rec)
            .eq(&rec["state"], "finished", format_args!("{rec}"));
        fleet.run(&rec).eq(
            &rec["labels"]["agentrun.id"],
            base.as_str(),
            format_args!("{rec}"),
        );
    }
    assert_eq!(
        count_lines(&h1.dir.join("count")),
        1,
        "count_lines(&h1.dir.join(\"count\"))"
    );
    assert_eq!(
        count_lines(&h2.dir.join("count")),
        2,
        "count_lines(&h2.dir.join(\"count\"))"
    );
    assert_eq!(
        count_lines(&h3.dir.join("count")),
        1,
        "count_lines(&h3.dir.join(\"count\"))"
    );
    for h in &fleet.hosts {
        let want: Vec<String> = if h.name == "h02" {
            vec![".ansible-fence.fresh".into()]
        } else {
            Vec::new()
        };
        assert_eq!(fleet.fences(h), want, "{}", h.name);
    }
    assert_nothing_left(&fleet, "after the fenced cancels and the rerun");
}

/// Installs agent-run on every host as the README says (a copy of the binary, where `binary:`
/// then points), each host into a directory of its own. The hosts share this machine's disk, so
/// the copy is made on the host (`remote_src`): the 30 MB debug binary sent ten times over sftp
/// would only cost time.
const INSTALL: &str = r#"  tasks:
    - name: the binary
      ansible.builtin.copy:
        src: "{{ agentrun_bin }}"
        remote_src: true
        dest: "{{ agentrun_dir }}/agent-run"
        mode: "0755"
"#;

/// The module defaults of the playbooks that use the installed copy.
const MD_INSTALLED: &str = "  module_defaults:\n    group/agentrun.remote.all:\n      binary: \"{{ agentrun_dir }}/agent-run\"\n      root: \"{{ agentrun_root }}\"\n";

/// The victims' own lease token (`lease_token:`), and one that is no run's.
const VICTIM_TOKEN: &str = "victim-token.0123456789+/=~";
const WRONG_TOKEN: &str = "wrong-token-0123456789abcdef";

const STARTED: &str = r#"  vars:
    victim_token: "@VICTIM@"
  tasks:
    - name: start the job
      agentrun.remote.run:
        id: job
        state: started
        lease: 5m
        cmd: 'while [ ! -e "$0/gate" ]; do sleep 0.05; done; echo done on $1'
        # sh -c CMD $0 $1
      register: job
    - name: start a victim
      agentrun.remote.run:
        id: victim
        state: started
        lease: 5m
        lease_token: "{{ victim_token }}"
        cmd: 'sleep 300 & sleep 300'
"#;

const LATER: &str = r#"  vars:
    victim_token: "@VICTIM@"
    wrong_token: "@WRONG@"
  tasks:
    - name: look at the job
      agentrun.remote.run:
        id: job
        state: status
    - name: look at the job with another token
      agentrun.remote.run:
        id: job
        state: status
        lease_token: "{{ wrong_token }}"
      ignore_errors: true
    - name: look at the victim
      agentrun.remote.run:
        id: victim
        state: status
        lease_token: "{{ victim_token }}"
    - name: cancel the victim
      agentrun.remote.run:
        id: victim
        state: cancelled
    - name: wait for the job
      agentrun.remote.run:
        id: job
        lease: 3s
"#;

/// How many lines of `path` contain `needle` (0 when it is missing).
fn count_matching(path: &std::path::Path, needle: &str) -> usize {
    fs::read_to_string(path).map_or(0, |t| t.lines().filter(|l| l.contains(needle)).count())
}

/// `/proc/PID/environ` of the process a record names, if it is still that process after the
/// read (pid and start ticks).
fn environ_of(rec: &Value) -> Option<Vec<u8>> {
    let pid = rec["pid"].as_i64()?;
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    leader_alive(rec).then_some(environ)
}

/// The words of an execve line of strace (`PID execve("PATH", ["ARG", ...], [...]) ...`): its
/// argv, unescaped enough to compare words.
fn strace_argv(line: &str) -> Vec<String> {
    let Some(at) = line.find("execve(") else {
        return Vec::new();
    };
    let rest = &line[at..];
    let Some(open) = rest.find(", [") else {
        return Vec::new();
    };
    let mut words = Vec::new();
    let mut chars = rest[open + 3..].chars();
    let mut word: Option<String> = None;
    while let Some(c) = chars.next() {
        match (&mut word, c) {
            (None, ']') => break,
            (None, '"') => word = Some(String::new()),
            (None, _) => {}
            (Some(w), '\\') => {
                if let Some(n) = chars.next() {
                    w.push(n);
                }
            }
            (Some(_), '"') => words.push(word.take().unwrap()),
            (Some(w), c) => w.push(c),
        }
    }
    words
}

/// What a host's execve calls (strace) did with the lease tokens: panics if one is on a command
/// line, twice in a call, or in the environment of anything but `agent-run start` or `renew`;
/// else the (subcommand, token) pairs seen.
fn token_uses(strace_log: &str, tokens: &[&str]) -> Vec<(String, String)> {
    let mut uses = Vec::new();
    for line in strace_log.lines().filter(|l| l.contains("execve(")) {
        for token in tokens {
            if !line.contains(token) {
                continue;
            }
            let argv = strace_argv(line);
            assert_eq!(
                line.matches(token).count(),
                1,
                "the token is on a command line: {line}"
            );
            assert!(
                line.contains(&format!("\"AGENT_RUN_LEASE_TOKEN={token}\"")),
                "the token outside AGENT_RUN_LEASE_TOKEN: {line}"
            );
            let sub = argv
                .iter()
                .find(|w| *w == "start" || *w == "renew")
                .filter(|_| argv.first().is_some_and(|a| a.ends_with("agent-run")))
                .unwrap_or_else(|| panic!("the token in the environment of {argv:?}: {line}"));
            uses.push((sub.clone(), token.to_string()));
        }
    }
    uses
}

#[test]
fn state_started_in_one_playbook_run_and_finished_in_a_later_one() {
    let (_serial, fleet) = serial_fleet(HOSTS);
    // `cmd` runs as `sh -c CMD`: give it its $0 and $1 through argv instead.
    let started = play_of("start", MD_INSTALLED, STARTED).replace(
        "        cmd: 'while [ ! -e \"$0/gate\" ]; do sleep 0.05; done; echo done on $1'\n        # sh -c CMD $0 $1\n",
        "        argv: [sh, -c, 'while [ ! -e \"$0/gate\" ]; do sleep 0.05; done; echo done on $1', \"{{ agentrun_dir }}\", \"{{ inventory_hostname }}\"]\n",
    );
    let install = play_of("install agent-run", "", INSTALL);
    let started = format!("{install}{started}").replace("@VICTIM@", VICTIM_TOKEN);
    // Every process h01's sshd runs, from now on, with its command line and its environment.
    let log = fleet.path("h01-execve.strace");
    let strace = agent_run_tests::Spawned::spawn(
        std::process::Command::new("strace")
            .args([
                "-f",
                "-v",
                "-s",
                "65535",
                "-e",
                "trace=execve",
                "-e",
                "signal=none",
                "-o",
            ])
            .arg(&log)
            .arg("-p")
            .arg(fleet.sshd_pid(0).to_string()),
    );
    wait_until_dbg("strace attached to h01's sshd", T, || {
        let err = String::from_utf8_lossy(&strace.stderr_so_far()).into_owned();
        if err.contains("attached") {
            Ok(())
        } else {
            Err(err)
        }
    });
    let first = fleet.play("start", &started, &[], PLAY);
    assert_eq!(first.code(), 0, "{}", first.describe());

    // The controller's lease token: made by the first task that needed it, 0600 in a 0700
    // directory of the controller's ANSIBLE_HOME.
    let token_file = fleet.token_file();
    let meta =
        fs::metadata(&token_file).unwrap_or_else(|e| panic!("no {}: {e}", token_file.display()));
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "{}",
        token_file.display()
    );
    let dir_meta = fs::metadata(token_file.parent().unwrap()).unwrap();
    assert_eq!(
        dir_meta.permissions().mode() & 0o777,
        0o700,
        "its directory"
    );
    let token = fs::read_to_string(&token_file).unwrap().trim().to_string();
    let token_sha = LeaseToken::parse(&token)
        .unwrap_or_else(|e| panic!("{token_file:?} holds no lease token: {e}"))
        .sha256();
    let victim_sha = LeaseToken::parse(VICTIM_TOKEN).unwrap().sha256();
    let mut deadlines = Vec::new();
    for h in &fleet.hosts {
        let r = first.result("start the job", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["result"]["changed"], true, "{r}");
        assert_eq!(r["result"]["run_id"], "job", "{r}");
        assert!(
            matches!(r["result"]["state"].as_str(), Some("running" | "starting")),
            "{r}"
        );
        assert_eq!(
            r["result"]["agent_run"]["binary"],
            h.dir.join("agent-run").display().to_string(),
            "the installed copy: {r}"
        );
        // Fire and forget: the playbook has ended, the run goes on.
        let (_, rec) = record_of(&fleet, h, "job");
        fleet
            .run(&rec)
            .eq(&rec["state"], "running", format_args!("{rec}"));
        ensure!(
            fleet.run(&rec),
            leader_alive(&rec) && wrapper_alive(&rec),
            "{rec}"
        );
        let lease: Value =
            serde_json::from_str(&fs::read_to_string(h.root.join("job/lease.json")).unwrap())
                .unwrap();
        deadlines.push(lease["deadline_epoch"].as_f64().unwrap());
        // The runs hold the hash of their token: the controller's, or the task's own; the
        // workload's environment holds neither the variable nor the token.
        let (_, victim) = record_of(&fleet, h, "victim");
        fleet.run(&rec).eq(
            &rec["lease_token_sha256"],
            token_sha.as_str(),
            format_args!("{rec}"),
        );
        fleet.run(&victim).eq(
            &victim["lease_token_sha256"],
            victim_sha.as_str(),
            format_args!("{victim}"),
        );
        for r in [&rec, &victim] {
            let env = environ_of(r).unwrap_or_else(|| panic!("{}: no leader: {r}", h.name));
            let env = String::from_utf8_lossy(&env);
            ensure!(
                fleet.run(r),
                !env.contains("AGENT_RUN_LEASE_TOKEN")
                    && !env.contains(&token)
                    && !env.contains(VICTIM_TOKEN),
                "the workload's environment: {env:?}"
            );
        }
        assert_eq!(fleet.fences(h), Vec::<String>::new(), "{}", h.name);
    }
    // Nothing of the controller is left, only the runs: every live process the fleet started is
    // a member of a run's session, a run's wrapper or its output keeper, as the records and the
    // journals name them (the session id and the start ticks in /proc/PID/stat: kernel facts,
    // read in one go per process). The runs
    // go on meanwhile (the job forks a `sleep 0.05` every 50 ms), so a process found by the scan
    // may be gone, or a zombie, by the time it is looked at: it is not left then. (Excusing the
    // runs' processes by their AGENT_RUN_DIR instead raced: a zombie has no environ to read, and
    // a `sleep 0.05` that exited between the two looks was reported.)
    let runs: Vec<Value> = fleet
        .hosts
        .iter()
        .flat_map(|h| fleet.records(h).into_iter().map(|(_, rec)| rec))
        .collect();
    assert_eq!(runs.len(), 2 * HOSTS, "a job and a victim on every host");
    // Each run's output keeper, by the pid and start ticks its wrapper journalled.
    let keepers: Vec<(i64, u64)> = fleet.hosts.iter().flat_map(|h| fleet.keepers(h)).collect();
    let left: Vec<_> = fleet
        .leftovers()
        .into_iter()
        .filter(|(pid, _)| {
            let Some((state, _, _, sid, ticks)) = proc_stat(*pid) else {
                return false; // gone since the scan
            };
            let of_a_run = runs.iter().any(|rec| {
                rec["sid"].as_i64() == Some(i64::from(sid))
                    || (rec["wrapper_pid"].as_i64() == Some(i64::from(*pid))
                        && rec["wrapper_start_ticks"].as_u64() == Some(ticks))
            }) || keepers.contains(&(i64::from(*pid), ticks));
            // The test's own strace of h01's sshd is not the fleet's.
            let ours = *pid == strace.child.id() as i32;
            !matches!(state, 'Z' | 'X') && !of_a_run && !ours
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // A later playbook: the status renews the lease, the cancel stops the victim, and the
    // finished task waits for the job (released once the victims are gone) and reports it.
    let later_book = play_of("later", MD_INSTALLED, LATER)
        .replace("@VICTIM@", VICTIM_TOKEN)
        .replace("@WRONG@", WRONG_TOKEN);
    let (later, results) = fleet.spawn("later", &later_book, &[], None);
    wait_until_dbg("every victim cancelled", PLAY, || {
        for h in &fleet.hosts {
            let (_, rec) = record_of(&fleet, h, "victim");
            if rec["state"] != "cancelled" {
                return Err(format!("{}: {}", h.name, rec["state"]));
            }
        }
        Ok(())
    });
    // The wait for the job renews it (a 3 s lease, a poll a second): two renewals on each host
    // after this point, so the plugin's own polls renewed it too, before the job may end.
    let renewals =
        |h: &Host| count_matching(&h.root.join("job/events.jsonl"), "\"event\":\"renew\"");
    let before: Vec<usize> = fleet.hosts.iter().map(renewals).collect();
    wait_until_dbg("two more renewals of every job", PLAY, || {
        for (h, n) in fleet.hosts.iter().zip(&before) {
            if renewals(h) < n + 2 {
                return Err(format!("{}: {} renewals, {n} before", h.name, renewals(h)));
            }
        }
        Ok(())
    });
    for h in &fleet.hosts {
        let (_, rec) = record_of(&fleet, h, "job");
        fleet.run(&rec).eq(
            &rec["state"],
            "running",
            format_args!("the job waits for its gate: {rec}"),
        );
        fs::write(h.dir.join("gate"), "").unwrap();
    }
    let later = Play::finished(later, PLAY, &results);
    assert_eq!(later.code(), 0, "{}", later.describe());
    for (h, before) in fleet.hosts.iter().zip(&deadlines) {
        let r = later.result("look at the job", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["result"]["state"], "running", "{r}");
        assert_eq!(r["result"]["changed"], false, "{r}");
        let renewed = r["result"]["renewed"]["deadline_epoch"]
            .as_f64()
            .unwrap_or_else(|| panic!("no renewal: {r}"));
        assert!(
            renewed > *before,
            "{}: the status renewed nothing: {r}",
            h.name
        );

        // Another token renews nothing: agent-run refuses it (77), the task says why.
        let r = later.result("look at the job with another token", &h.name);
        assert_eq!(r["status"], "failed", "{r}");
        let msg = r["result"]["msg"].as_str().unwrap_or_default();
        assert!(
            msg.contains("exit 77") && msg.contains("lease token"),
            "{r}"
        );
        let events = fs::read_to_string(h.root.join("job/events.jsonl")).unwrap();
        assert!(events.contains("renew_refused"), "{}: {events}", h.name);

        // The victim's own token renews the victim.
        let r = later.result("look at the victim", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert!(
            r["result"]["renewed"]["deadline_epoch"].as_f64().is_some(),
            "{r}"
        );

        let r = later.result("cancel the victim", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["result"]["changed"], true, "{r}");
        assert_eq!(r["result"]["state"], "cancelled", "{r}");
        assert_eq!(r["result"]["reason"], "cancel_request", "{r}");

        let r = later.result("wait for the job", &h.name);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["result"]["rc"], 0, "{r}");
        assert_eq!(
            r["result"]["stdout"],
            format!("done on {}\n", h.name),
            "{r}"
        );
        assert_eq!(r["result"]["changed"], false, "it was started earlier: {r}");
        let (_, rec) = record_of(&fleet, h, "job");
        fleet
            .run(&rec)
            .eq(&rec["state"], "finished", format_args!("{rec}"));
        assert_eq!(fleet.records(h).len(), 2, "{}", h.name);
    }

    // No token is in what the controller showed, nor on any command line on h01; each is only
    // in the environment of agent-run start and renew, and each was used there.
    for text in [
        first.describe(),
        later.describe(),
        fs::read_to_string(&results).unwrap(),
    ] {
        for t in [token.as_str(), VICTIM_TOKEN, WRONG_TOKEN] {
            assert!(
                !text.contains(t),
                "a lease token in the controller's output: {text}"
            );
        }
    }
    strace.signal(libc::SIGINT);
    let _ = strace.finish(T);
    let traced_log = fs::read_to_string(&log).unwrap();
    let uses = token_uses(&traced_log, &[&token, VICTIM_TOKEN, WRONG_TOKEN]);
    for (sub, t) in [
        ("start", token.as_str()),
        ("renew", token.as_str()),
        ("start", VICTIM_TOKEN),
        ("renew", VICTIM_TOKEN),
        ("renew", WRONG_TOKEN),
    ] {
        assert!(
            uses.iter().any(|(s, u)| s == sub && u == t),
            "no agent-run {sub} with token {t} on h01: {uses:?}"
        );
    }
    // The plugin's polls renewed through a shell that read the token from its stdin.
    assert!(
        traced_log.lines().any(|l| strace_argv(l)
            .iter()
            .any(|w| w.contains("read -r t") && w.contains("AGENT_RUN_LEASE_TOKEN=\"$t\""))),
        "no poll of the plugin on h01"
    );
    assert_nothing_left(&fleet, "after the later playbook");
}

// ---------------------------------------------------------------------------------------------
// SIGTERM of the controller, and a host that goes away (smaller fleets: these add a path each)

#[test]
fn sigterm_of_ansible_playbook_cancels_every_run_too() {
    let (_serial, fleet) = serial_fleet(3);
    let (play, _results) = fleet.spawn("long", &book("long", LONG), &[], None);
    let recs = wait_all_running(&fleet, "ans-", 3, &play);
    let runs = pin_runs(&recs);
    let workers = fleet.pin_descendants(play.child.id() as i32);
    // `kill PID`: Ansible forwards TERM to its workers and ends at once; the workers, orphans
    // now, still cancel their runs.
    let t0 = epoch_now();
    play.signal(libc::SIGTERM);
    let out = play.finish(T);
    assert_eq!(out.status.code(), None, "ended by TERM: {:?}", out.status);
    let finals = wait_all_final(&fleet, T);
    assert!(runs.wait_all_gone(T).is_ok(), "left: {:?}", runs.alive());
    for (h, rec) in fleet.hosts.iter().zip(&finals) {
        cancelled_for(&fleet, h, rec, "cancel_request");
        let ended = parse_rfc3339(rec["ended_at"].as_str().unwrap()).unwrap() - t0;
        assert!(
            ended <= 4.0,
            "{}: cancelled {ended:.2} s after TERM",
            h.name
        );
    }
    assert!(workers.wait_all_gone(T).is_ok(), "{:?}", workers.alive());
    assert_nothing_left(&fleet, "after SIGTERM");
}

/// A play `name` of one task, `name` too, whose command waits for the file `gate` in its host's
/// directory, then says `released`. `play` and `task` are more YAML lines of each.
fn gated(name: &str, play: &str, task: &str) -> String {
    let cmd = r#"'while [ ! -e "{{ agentrun_dir }}/gate" ]; do sleep 0.05; done; echo released'"#;
    let rest = format!(
        "{play}  tasks:\n    - name: {name}\n      agentrun.remote.run:\n        cmd: {cmd}\n{task}"
    );
    book(name, &rest)
}

#[test]
fn a_host_lost_mid_run_is_unreachable_and_its_run_ends_at_its_lease() {
    let (_serial, mut fleet) = serial_fleet(3);
    let lost = gated("lost", "", "        lease: 3s\n        grace: 1s\n");
    let (play, results) = fleet.spawn("lost", &lost, &[], None);
    let recs = wait_all_running(&fleet, "ans-", 1, &play);
    // Every worker is past its first wait (it renewed once), then h02's sshd goes away with
    // every session it had; the run's wrapper, detached, stays.
    wait_renewed(&fleet.hosts, &recs, 3.5);
    let lost_at = epoch_now();
    fleet.stop_sshd(1);
    // The host stops the run when the lease runs out; then the others are released.
    let (_, rec) = wait_until_dbg("h02's run final", T, || {
        let (id, rec) = record_of(&fleet, &fleet.hosts[1], "ans-");
        if rec["state"] == "cancelled" {
            Ok((id, rec))
        } else {
            Err(rec["state"].to_string())
        }
    });
    fleet
        .run(&rec)
        .eq(&rec["reason"], "lease_expired", format_args!("{rec}"));
    let ended = parse_rfc3339(rec["ended_at"].as_str().unwrap()).unwrap() - lost_at;
    ensure!(
        fleet.run(&rec),
        ended <= kill_deadline().as_secs_f64(),
        "stopped {ended:.2} s after the host was lost: {rec}"
    );
    for h in [&fleet.hosts[0], &fleet.hosts[2]] {
        fs::write(h.dir.join("gate"), "").unwrap();
    }
    let play = Play::finished(play, PLAY, &results);
    assert_eq!(
        play.code(),
        4,
        "unreachable hosts give 4\n{}",
        play.describe()
    );
    let r = play.result("lost", "h02");
    assert_eq!(r["status"], "unreachable", "{r}");
    let msg = r["result"]["msg"].as_str().unwrap_or_default();
    ensure!(
        fleet.run(&rec),
        msg.contains("lease") && msg.contains(rec["run_id"].as_str().unwrap()),
        "{r}"
    );
    for h in ["h01", "h03"] {
        let r = play.result("lost", h);
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["result"]["stdout"], "released\n", "{r}");
    }
    assert_nothing_left(&fleet, "after the lost host");
}

/// The play of the module-poll test: `su` as become (it may need a terminal, so Ansible gives
/// a command no stdin data there), a lease of 3 s and a command that waits for its gate.
fn su_play() -> String {
    gated(
        "su",
        "  become: true\n  become_method: su\n",
        "        lease: 3s\n",
    )
}

#[test]
fn where_stdin_cannot_carry_the_token_each_poll_is_a_module_and_renews() {
    let (_serial, fleet) = serial_fleet(1);
    let h = &fleet.hosts[0];
    let trace = fleet.path("trace.log");
    let (play, results) = fleet.spawn("su", &su_play(), &[], Some(&trace));
    let recs = wait_all_running(&fleet, "ans-", 1, &play);
    // The plugin's polls (modules: the trace says so) renew the lease past its first 3 s.
    let polls = wait_until_dbg("two polls by module", PLAY, || {
        let text = fs::read_to_string(&trace).unwrap_or_default();
        let n = text
            .lines()
            .filter(|l| l.contains("poll by module "))
            .count();
        if n >= 2 {
            Ok(n)
        } else {
            Err(text)
        }
    });
    wait_renewed(&fleet.hosts, &recs, 3.5);
    fs::write(h.dir.join("gate"), "").unwrap();
    let play = Play::finished(play, PLAY, &results);
    assert_eq!(play.code(), 0, "{}", play.describe());
    let r = play.result("su", &h.name);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["result"]["stdout"], "released\n", "{r}");
    let text = fs::read_to_string(&trace).unwrap_or_default();
    assert!(
        !text.lines().any(|l| l.contains(" poll ans-")),
        "a poll by shell command, with su: {text} ({polls} by module)"
    );

    // A token file others can read is refused (the token may be known), and so is a
    // lease_token agent-run would not take; nothing is asked of the host then.
    let token_file = fleet.token_file();
    fs::set_permissions(&token_file, fs::Permissions::from_mode(0o644)).unwrap();
    let run_id = recs[0]["run_id"].as_str().unwrap();
    let refused = fleet.play(
        "refused",
        &book(
            "refused",
            &format!(
                "  tasks:\n    \
             - name: readable\n      agentrun.remote.run:\n        id: {run_id}\n        \
             state: status\n      ignore_errors: true\n    \
             - name: malformed\n      agentrun.remote.run:\n        id: {run_id}\n        \
             state: status\n        lease_token: 'short'\n      ignore_errors: true\n"
            ),
        ),
        &[],
        PLAY,
    );
    assert_eq!(refused.code(), 0, "{}", refused.describe());
    let r = refused.result("readable", &h.name);
    assert_eq!(r["status"], "failed", "{r}");
    let msg = r["result"]["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("can be read by others"), "{r}");
    let r = refused.result("malformed", &h.name);
    assert_eq!(r["status"], "failed", "{r}");
    let msg = r["result"]["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("lease_token must be"), "{r}");
    assert_nothing_left(&fleet, "after the su play");
}
