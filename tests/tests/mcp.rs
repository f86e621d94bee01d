//! Black-box tests of `agent-run-mcp` with a real MCP client: the official Python SDK (`mcp` from
//! PyPI, installed by `.ci/test` into target/ci-venv) over stdio, driven through
//! `tests/mcp/driver.py`, and a real `sshd` (the harness's `remote::SshServer`, on loopback) for
//! the remote host.
//!
//! "local" and the ssh host share the test's run root (`--root` and `--remote-root`), so a test
//! reads every run's record and logs directly and pins the workload's processes from the
//! fixture's ready line, whichever host ran it. Every assertion about stopping is on /proc
//! (pidfds of every process of the tree), not on a message.
//!
//! Figures for the report are printed with `mcp-figure:` (run with `--nocapture` to see them).

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agent_run_shared::time::{epoch_now, parse_rfc3339};
use agent_run_tests::facts::{cleanup_signals, ended, require_root};
use agent_run_tests::mcp::Client;
use agent_run_tests::mcp_wire::Wire;
use agent_run_tests::remote::{processes_mentioning, SshServer};
use agent_run_tests::workload::{fx, spew_bytes, DEAF};
use agent_run_tests::{
    agent_run_bin, ctx, ensure, fixture_bin, processes_with_env, wait_ready, wait_until, Pinned,
    TestRoot,
};
use serde_json::{json, Value};

/// The deadline for what normally takes a second or two.
const T: Duration = Duration::from_secs(30);

/// One test's world: a run root, maybe an sshd, and a private XDG_RUNTIME_DIR for the server's
/// ssh control sockets.
struct World {
    root: TestRoot,
    srv: Option<SshServer>,
    xdg: PathBuf,
}

impl World {
    fn local() -> World {
        World::with(None)
    }

    fn ssh() -> World {
        require_root();
        World::with(Some(SshServer::start(None)))
    }

    fn with(srv: Option<SshServer>) -> World {
        let root = TestRoot::new();
        let xdg = root.dir.path().join("xdg");
        fs::create_dir(&xdg).unwrap();
        World { root, srv, xdg }
    }

    /// The ssh host's name for the tools.
    fn host(&self) -> String {
        self.srv.as_ref().expect("an sshd").host()
    }

    /// The server's arguments: this root for "local" and, with an sshd, the ssh host with the
    /// test's options, the built agent-run and the same root there.
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut a = vec![
            "--root".to_string(),
            self.root.root().display().to_string(),
            "--agent-run".into(),
            agent_run_bin().display().to_string(),
        ];
        if let Some(srv) = &self.srv {
            a.extend(["--host".into(), srv.host()]);
            a.extend(
                srv.ssh_options()
                    .into_iter()
                    .map(|o| format!("--ssh-option={o}")),
            );
            a.extend([
                "--remote-bin".into(),
                agent_run_bin().display().to_string(),
                "--remote-root".into(),
                self.root.root().display().to_string(),
            ]);
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn client(&self, extra: &[&str], tasks: bool) -> Client {
        Client::start(
            &self.args(extra),
            &[("XDG_RUNTIME_DIR", self.xdg.as_os_str())],
            tasks,
        )
    }

    /// A fixture tree (leader, 2 children, grandchildren, a setsid escapee) as argv.
    fn tree(&self) -> Value {
        json!([
            fixture_bin(),
            "tree",
            "--children",
            "2",
            "--grandchildren",
            "--escapee"
        ])
    }

    /// Every process of run `id`, pinned, once the fixture says it is in place.
    fn pin_tree(&self, id: &str) -> Pinned {
        let ready = wait_ready(&self.root.run_dir(id).join("stdout.log"), T);
        Pinned::new(&ready.all_pids())
    }

    /// No ssh of the server is left, and its control directory is gone.
    fn assert_ssh_cleaned_up(&self, within: Duration) {
        let xdg = self.xdg.to_str().unwrap().to_string();
        wait_until("no ssh of the server left", within, || {
            processes_mentioning(&xdg).is_empty().then_some(())
        });
        let left: Vec<_> = fs::read_dir(&self.xdg).unwrap().flatten().collect();
        assert!(left.is_empty(), "left in {xdg}: {left:?}");
    }

    /// Every process carrying run `id` in its environment is gone.
    fn assert_nothing_of(&self, id: &str) {
        let left = processes_with_env("AGENT_RUN_ID", |v| v == id.as_bytes());
        ensure!(
            ctx(&self.root, id),
            left.is_empty(),
            "processes of {id} left: {left:?}"
        );
    }
}

/// RSS of a process in KiB (VmRSS).
fn rss_kib(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

#[test]
fn the_tools_are_listed_with_schemas_for_a_model() {
    let w = World::local();
    let mut c = w.client(&["--host", "build-x"], false);
    let r = c.request(json!({"op": "list_tools"}), T);
    let tools = r["tools"].as_array().expect("tools");
    let names: Vec<String> = tools.iter().map(|t| text(&t["name"])).collect();
    assert_eq!(
        names,
        ["run", "start", "status", "logs", "wait", "cancel", "list"],
        "names"
    );
    let by = |n: &str| tools.iter().find(|t| t["name"] == n).unwrap().clone();
    for t in tools {
        let desc = text(&t["description"]);
        assert!(
            desc.len() > 150,
            "{}: a description a model can act on: {desc}",
            t["name"]
        );
        let s = &t["inputSchema"];
        assert_eq!(s["type"], "object", "{t}");
        assert_eq!(s["additionalProperties"], false, "{t}");
        // The hosts this server offers are in every schema that takes one.
        assert_eq!(
            s["properties"]["host"]["enum"],
            json!(["local", "build-x"]),
            "{t}"
        );
        assert!(t["annotations"]["readOnlyHint"].is_boolean(), "{t}");
    }
    let run = by("run");
    let p = &run["inputSchema"]["properties"];
    assert_eq!(p["argv"]["type"], "array", "p[\"argv\"][\"type\"]");
    assert_eq!(
        p["argv"]["items"]["type"], "string",
        "p[\"argv\"][\"items\"][\"type\"]"
    );
    assert_eq!(p["argv"]["minItems"], 1, "p[\"argv\"][\"minItems\"]");
    for k in [
        "command",
        "cwd",
        "env",
        "timeout_s",
        "labels",
        "wait_s",
        "tail_bytes",
        "grace_s",
    ] {
        assert!(p[k].is_object(), "run lacks {k}: {p}");
        assert!(
            !text(&p[k]["description"]).is_empty(),
            "run.{k} has no description"
        );
    }
    assert!(p["detach"].is_null(), "run has no detach");
    assert!(
        text(&run["description"]).contains("run_id"),
        "text(&run[\"description\"]).contains(\"run_id\")"
    );
    let start = by("start");
    let d = &start["inputSchema"]["properties"]["detach"];
    assert_eq!(d["type"], "boolean", "d[\"type\"]");
    assert!(text(&d["description"]).contains("outlives"), "{d}");
    assert_eq!(
        by("logs")["inputSchema"]["required"],
        json!(["run_id"]),
        "by(\"logs\")[\"inputSchema\"][\"required\"]"
    );
    assert!(
        by("logs")["inputSchema"]["properties"]["offset"].is_object(),
        "by(\"logs\")[\"inputSchema\"][\"properties\"][\"offset\"].is_object()"
    );
    assert_eq!(
        by("list")["inputSchema"]["properties"]["state"]["enum"][0],
        "active",
        "by(\"list\")[\"inputSchema\"][\"properties\"][\"state\"][\"enum\"][0]"
    );
    for (n, ro) in [
        ("status", true),
        ("logs", true),
        ("list", true),
        ("wait", true),
        ("run", false),
        ("cancel", false),
    ] {
        assert_eq!(by(n)["annotations"]["readOnlyHint"], ro, "{n}");
    }
    let pid = c.server_pid();
    eprintln!(
        "mcp-figure: idle server RSS {} KiB (protocol {})",
        rss_kib(pid),
        c.protocol
    );
    c.close(T);
}

#[test]
fn run_here_returns_the_output_the_exit_code_and_the_record() {
    let w = World::local();
    let mut c = w.client(&[], false);
    let (r, err) = c.tool(
        "run",
        json!({"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"], "labels": {"task": "t-1"}, "env": {"GREETING": "hi"}, "verbose": true}),
        T,
    );
    assert!(!err, "{r}");
    let id = text(&r["run_id"]);
    let run = ctx(&w.root, &id);
    ensure!(run, id.starts_with("mcp-") && id.len() == 20, "{id}");
    run.eq(
        &(
            r["state"].as_str(),
            r["final"].as_bool(),
            r["exit_code"].as_i64(),
        ),
        &(Some("finished"), Some(true), Some(3)),
        format_args!("{r}"),
    );
    run.eq(&r["stdout"]["text"], "out\n", "r[\"stdout\"][\"text\"]");
    run.eq(&r["stderr"]["text"], "err\n", "r[\"stderr\"][\"text\"]");
    run.eq(&r["stdout"]["bytes"], 4, "r[\"stdout\"][\"bytes\"]");
    // The record is the host's own.
    let st = w.root.status(&id);
    run.eq(&st["state"], "finished", "st[\"state\"]");
    run.eq(&st["exit_code"], 3, "st[\"exit_code\"]");
    run.eq(&r["record"]["exit_code"], 3, "r[\"record\"][\"exit_code\"]");
    run.eq(
        &r["record"]["run_dir"],
        &w.root.run_dir(&id).display().to_string(),
        "r[\"record\"][\"run_dir\"]",
    );
    run.eq(&st["labels"]["task"], "t-1", "st[\"labels\"][\"task\"]");
    run.eq(
        &st["labels"]["agent-run-mcp/detached"],
        "false",
        "st[\"labels\"][\"agent-run-mcp/detached\"]",
    );
    ensure!(
        run,
        st["labels"]["agent-run-mcp/owner"]
            .as_str()
            .is_some_and(|o| !o.is_empty()),
        "st[\"labels\"][\"agent-run-mcp/owner\"] .as_str() .is_some_and(|o| !o.is_empty())"
    );
    run.eq(&st["env"], &json!(["GREETING"]), "st[\"env\"]");
    ensure!(
        run,
        !r["record"]["lease_deadline_epoch"].is_null(),
        "a tied run is leased: {r}"
    );
    run.eq(&r["tied_to_server"], true, "r[\"tied_to_server\"]");

    // A shell line, a directory, and the variable reaching the workload.
    let dir = w.root.dir.path().join("work");
    fs::create_dir(&dir).unwrap();
    let (r, err) = c.tool(
        "run",
        json!({"command": "pwd; echo \"$GREETING\"", "cwd": dir, "env": {"GREETING": "hello there"}}),
        T,
    );
    ensure!(run, !err, "{r}");
    run.eq(
        &r["stdout"]["text"],
        &format!("{}\nhello there\n", dir.display()),
        "r[\"stdout\"][\"text\"]",
    );
    run.eq(&r["exit_code"], 0, "r[\"exit_code\"]");

    // A launch failure is a tool error that still carries the record.
    let (r, err) = c.tool("run", json!({"argv": ["/no/such/program"]}), T);
    ensure!(run, err, "{r}");
    run.fields(&r, "r", json!({"state": "launch_failed", "exit_code": 127}));

    // A run still going when wait_s is up answers with its id, and wait picks it up.
    let (slow, _) = c.tool(
        "run",
        json!({"command": "sleep 2; echo late", "wait_s": 0.3}),
        T,
    );
    run.fields(&slow, "slow", json!({"state": "running", "final": false}));
    ensure!(run, text(&slow["next"]).contains("wait"), "{slow}");
    let (quick, _) = c.tool("start", json!({"command": "exit 5"}), T);
    let ids = json!([slow["run_id"], quick["run_id"]]);
    let (first, _) = c.tool(
        "wait",
        json!({"run_ids": ids, "any": true, "timeout_s": 20}),
        T,
    );
    let runs = first["runs"].as_array().unwrap();
    run.eq(
        &(runs[1]["state"].as_str(), runs[1]["exit_code"].as_i64()),
        &(Some("finished"), Some(5)),
        format_args!("{first}"),
    );
    let (all, _) = c.tool("wait", json!({"run_ids": ids, "timeout_s": 20}), T);
    let runs = all["runs"].as_array().unwrap();
    run.eq(
        &(
            runs[0]["exit_code"].as_i64(),
            runs[0]["stdout"]["text"].as_str(),
        ),
        &(Some(0), Some("late\n")),
        format_args!("{all}"),
    );

    // status and logs see the same run.
    let (s, _) = c.tool("status", json!({"run_id": id}), T);
    run.eq(&s["state"], "finished", "s[\"state\"]");
    run.eq(&s["stdout"]["bytes"], 4, "s[\"stdout\"][\"bytes\"]");
    let (l, _) = c.tool("logs", json!({"run_id": id, "stream": "stderr"}), T);
    run.fields(&l, "l", json!({"text": "err\n", "final": true}));
    c.close(T);
}

#[test]
fn run_over_sshd_returns_the_output_the_exit_code_and_the_record() {
    let w = World::ssh();
    let mut c = w.client(&[], false);
    let script = r#""$0" spew 200000 --stderr-bytes 3000; exit 4"#;
    let (r, err) = c.tool(
        "run",
        json!({"host": w.host(), "argv": ["sh", "-c", script, fixture_bin()], "tail_bytes": 65536, "verbose": true}),
        T,
    );
    assert!(!err, "{r}");
    let id = text(&r["run_id"]);
    let run = ctx(&w.root, &id);
    run.eq(&r["host"], &w.host(), "r[\"host\"]");
    run.fields(&r, "r", json!({"state": "finished", "exit_code": 4}));
    let want = spew_bytes(200000);
    run.eq(&r["stdout"]["bytes"], 200000, "r[\"stdout\"][\"bytes\"]");
    run.eq(
        &r["stdout"]["shown_from"],
        200000 - 65536,
        "r[\"stdout\"][\"shown_from\"]",
    );
    ensure!(
        run,
        r["stdout"]["text"].as_str().unwrap().as_bytes() == &want[200000 - 65536..],
        "r[\"stdout\"][\"text\"].as_str().unwrap().as_bytes() == &want[200000 - 65536..]"
    );
    ensure!(
        run,
        r["stderr"]["text"].as_str().unwrap().as_bytes() == &spew_bytes(3000)[..],
        "r[\"stderr\"][\"text\"].as_str().unwrap().as_bytes() == &spew_bytes(3000)[..]"
    );
    let st = w.root.status(&id);
    run.fields(&st, "st", json!({"state": "finished", "exit_code": 4}));
    run.eq(
        &r["record"]["run_id"],
        id.as_str(),
        "r[\"record\"][\"run_id\"]",
    );
    // Paging through the log over ssh.
    let (l, _) = c.tool(
        "logs",
        json!({"host": w.host(), "run_id": id, "offset": 0, "max_bytes": 1000}),
        T,
    );
    ensure!(
        run,
        l["text"].as_str().unwrap().as_bytes() == &want[..1000],
        "l[\"text\"].as_str().unwrap().as_bytes() == &want[..1000]"
    );
    run.eq(
        &(
            l["next_offset"].as_u64(),
            l["more"].as_bool(),
            l["size"].as_u64(),
        ),
        &(Some(1000), Some(true), Some(200000)),
        "( l[\"next_offset\"].as_u64(), l[\"more\"].as_bool(), l[\"size\"].as_u64() )",
    );
    let (l, _) = c.tool(
        "logs",
        json!({"host": w.host(), "run_id": id, "offset": 199990, "max_bytes": 1000}),
        T,
    );
    run.eq(
        &(l["text"].as_str().map(str::len), l["more"].as_bool()),
        &(Some(10), Some(false)),
        "(l[\"text\"].as_str().map(str::len), l[\"more\"].as_bool())",
    );
    // The same run through list on that host.
    let (ls, _) = c.tool("list", json!({"host": w.host(), "mine": true}), T);
    ensure!(
        run,
        ls["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["run_id"] == id.as_str()),
        "{ls}"
    );
    c.close(T);
    // A clean shutdown closed the master connection and removed its directory.
    w.assert_ssh_cleaned_up(Duration::from_secs(10));
}

#[test]
fn a_task_cancelled_through_the_protocol_stops_every_process() {
    let w = World::local();
    let mut c = w.client(&[], true);
    let call =
        c.send(json!({"op": "call", "name": "run", "args": {"argv": w.tree()}, "progress": true}));
    let r = c.reply(call, T);
    let task = &r["task"];
    assert_eq!(
        task["status"], "working",
        "a run still going after 1 s is a task: {r}"
    );
    let task_id = text(&task["taskId"]);
    let (id, host) = task_id.split_once('@').unwrap();
    let run = ctx(&w.root, id);
    run.eq(&host, &"local", "host");
    let pins = w.pin_tree(id);
    let got = c.request(json!({"op": "tasks_get", "task_id": task_id}), T);
    run.eq(&got["raw"]["status"], "working", format_args!("{got}"));
    // Cancel the task: agent-run cancel on the host, through the stop routine.
    let t0 = Instant::now();
    let e0 = epoch_now();
    let ack = c.request(json!({"op": "tasks_cancel", "task_id": task_id}), T);
    run.eq(&ack["ok"], true, format_args!("{ack}"));
    // The acknowledgement comes once the stop is confirmed: the record is final and every
    // process of the run has exited, at that moment, with no polling.
    let st = w.root.status(id);
    run.eq(
        &st["state"],
        "cancelled",
        format_args!("when tasks/cancel answered: {st}"),
    );
    pins.wait_all_gone(Duration::ZERO)
        .unwrap_or_else(|left| run.fail(format_args!("left when tasks/cancel answered: {left:?}")));
    let polled = c.request(json!({"op": "tasks_get", "task_id": task_id}), T);
    run.eq(
        &polled["raw"]["status"],
        "cancelled",
        format_args!("{polled}"),
    );
    let to_status = t0.elapsed();
    w.assert_nothing_of(id);
    run.fields(&st, "the record", ended("cancelled", "cancel_request"));
    ensure!(
        run,
        text(&polled["raw"]["statusMessage"]).contains("cancelled"),
        "{polled}"
    );
    let ended = parse_rfc3339(st["ended_at"].as_str().unwrap()).unwrap();
    eprintln!(
        "mcp-figure: tasks/cancel -> final record {:.0} ms; -> tasks/get says cancelled {:.0} ms ({} processes)",
        (ended - e0) * 1000.0,
        to_status.as_secs_f64() * 1000.0,
        pins.pids().len()
    );
    c.close(T);
}

#[test]
fn an_abandoned_run_call_cancels_its_run() {
    let w = World::local();
    let mut c = w.client(&[], false);
    let call = c.send(json!({"op": "call", "name": "run", "args": {"argv": w.tree(), "wait_s": 300}, "progress": true}));
    // The run id comes first, in the first progress notification.
    let mut seen = Vec::new();
    let id = wait_until("the run id in a progress notification", T, || {
        seen.extend(c.notifications());
        seen.iter().find_map(|n| {
            let m = text(&n["params"]["message"]);
            let rest = m.strip_prefix("run ")?;
            Some(rest.split(' ').next()?.to_string())
        })
    });
    let run = ctx(&w.root, &id);
    let pins = w.pin_tree(&id);
    // The SDK sends notifications/cancelled for a call its caller abandons.
    let t0 = epoch_now();
    c.request(json!({"op": "abort", "target": call}), T);
    run.eq(
        &c.reply(call, T)["aborted"],
        true,
        "c.reply(call, T)[\"aborted\"]",
    );
    pins.wait_all_gone(Duration::from_secs(10))
        .unwrap_or_else(|left| run.fail(format_args!("left after the abandoned call: {left:?}")));
    let st = w.root.wait_final(&id, T);
    run.fields(&st, "the record", ended("cancelled", "cancel_request"));
    let ended = parse_rfc3339(st["ended_at"].as_str().unwrap()).unwrap();
    eprintln!(
        "mcp-figure: notifications/cancelled -> final record {:.0} ms",
        (ended - t0) * 1000.0
    );
    w.assert_nothing_of(&id);
    c.close(T);
}

#[test]
fn a_killed_server_leaves_its_runs_to_their_leases() {
    let w = World::ssh();
    let lease = 2.0;
    let mut c = w.client(&["--lease", "2s", "--control-persist", "2s"], false);
    let (a, _) = c.tool("start", json!({"argv": w.tree()}), T);
    let (b, _) = c.tool("start", json!({"host": w.host(), "argv": w.tree()}), T);
    let ids = [text(&a["run_id"]), text(&b["run_id"])];
    assert_eq!(
        (a["detached"].as_bool(), a["lease_s"].as_f64()),
        (Some(false), Some(lease)),
        "{a}"
    );
    let pins: Vec<Pinned> = ids.iter().map(|id| w.pin_tree(id)).collect();
    // While the server lives, it renews: each lease is pushed past the first one's end.
    for id in &ids {
        let run = ctx(&w.root, id);
        let started = parse_rfc3339(w.root.status(id)["started_at"].as_str().unwrap()).unwrap();
        wait_until("a renewal past the first lease", T, || {
            let l: Value =
                serde_json::from_slice(&fs::read(w.root.run_dir(id).join("lease.json")).ok()?)
                    .ok()?;
            (l["deadline_epoch"].as_f64()? > started + 2.0 * lease).then_some(())
        });
        run.eq(
            &w.root.status(id)["state"],
            "running",
            "w.root.status(id)[\"state\"]",
        );
    }
    let t0 = Instant::now();
    c.kill_server();
    for (id, p) in ids.iter().zip(&pins) {
        let run = ctx(&w.root, id);
        p.wait_all_gone(Duration::from_secs(20))
            .unwrap_or_else(|left| run.fail(format_args!("{id}: left after the lease: {left:?}")));
        let st = w.root.wait_final(id, T);
        run.fields(&st, "the record", ended("cancelled", "lease_expired"));
        w.assert_nothing_of(id);
    }
    eprintln!("mcp-figure: server SIGKILLed -> both runs stopped by their hosts in {:.1} s (lease {lease} s)", t0.elapsed().as_secs_f64());
    // The master connection goes too, ControlPersist after its last channel.
    let xdg = w.xdg.to_str().unwrap().to_string();
    wait_until("the master ssh to exit", Duration::from_secs(20), || {
        processes_mentioning(&xdg).is_empty().then_some(())
    });
    drop(c);
}

#[test]
fn a_restarted_server_takes_back_and_finishes_a_run_of_its_predecessor() {
    let w = World::local();
    let owner = format!("test-{}", std::process::id());
    let args = ["--owner", owner.as_str(), "--lease", "20s"];
    let mut a = w.client(&args, false);
    // The run ends when the test says so (a file appears), not after some time.
    let (go, script) = gated(&w, "echo done; exit 7");
    let (r, _) = a.tool("start", json!({"command": script}), T);
    let id = text(&r["run_id"]);
    let run = ctx(&w.root, &id);
    wait_until("the run to start", T, || {
        fs::read_to_string(w.root.run_dir(&id).join("stdout.log"))
            .ok()
            .filter(|s| s == "started\n")
    });
    a.kill_server();
    drop(a);
    let lease_deadline = || -> Option<f64> {
        let l: Value =
            serde_json::from_slice(&fs::read(w.root.run_dir(&id).join("lease.json")).ok()?).ok()?;
        l["deadline_epoch"].as_f64()
    };
    // Nobody renews it now: this is where the host would stop it.
    let orphaned = lease_deadline().expect("a lease");
    // A new server with the same owner finds the run, takes its lease over, and waits it out.
    let mut b = w.client(&args, false);
    let (ls, _) = b.tool("list", json!({"mine": true, "state": "active"}), T);
    let found = ls["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["run_id"] == id.as_str())
        .cloned();
    let found = found.unwrap_or_else(|| run.fail(format_args!("{id} not in {ls}")));
    run.eq(
        &found["labels"]["agent-run-mcp/owner"],
        owner.as_str(),
        "found[\"labels\"][\"agent-run-mcp/owner\"]",
    );
    wait_until(
        "the new server to take the run back and renew it",
        T,
        || {
            (lease_deadline()? > orphaned + 0.5 && b.stderr().contains("took back 1 run(s)"))
                .then_some(())
        },
    );
    fs::write(&go, b"").unwrap();
    let (r, err) = b.tool(
        "wait",
        json!({"run_id": id, "timeout_s": 30}),
        Duration::from_secs(60),
    );
    ensure!(run, !err, "{r}");
    run.fields(&r, "r", json!({"state": "finished", "exit_code": 7}));
    run.eq(
        &r["stdout"]["text"],
        "started\ndone\n",
        "r[\"stdout\"][\"text\"]",
    );
    b.close(T);
}

#[test]
fn a_clean_shutdown_cancels_tied_runs_and_keeps_detached_ones() {
    let w = World::local();
    let mut a = w.client(&[], false);
    let (t, _) = a.tool("start", json!({"argv": w.tree()}), T);
    let (d, _) = a.tool(
        "start",
        json!({"argv": w.tree(), "detach": true, "timeout_s": 120, "verbose": true}),
        T,
    );
    let (tied, detached) = (text(&t["run_id"]), text(&d["run_id"]));
    let (tied_run, detached_run) = (ctx(&w.root, &tied), ctx(&w.root, &detached));
    detached_run.eq(&d["detached"], true, format_args!("the detached run: {d}"));
    ensure!(
        detached_run,
        d["record"]["lease_deadline_epoch"].is_null(),
        "a detached run has no lease: {d}"
    );
    let (tp, dp) = (w.pin_tree(&tied), w.pin_tree(&detached));
    let (took, _) = a.close(T);
    eprintln!(
        "mcp-figure: clean shutdown (stdin closed) with one tied run took {:.0} ms",
        took * 1000.0
    );
    tied_run.wait_gone_within(&tp, Duration::from_secs(10), "the tied run's tree");
    let st = tied_run.wait_final();
    let want = ended("cancelled", "cancel_request");
    tied_run.fields(&st, "the tied run's record", want);
    detached_run.all_alive(&dp, "the detached run goes on");
    detached_run.record("the detached run's record", json!({"state": "running"}));
    // Another session finds it by its label, and stops it.
    let mut b = w.client(&[], false);
    let (ls, _) = b.tool(
        "list",
        json!({"labels": {"agent-run-mcp/detached": "true"}}),
        T,
    );
    ensure!(
        detached_run,
        ls["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["run_id"] == detached.as_str()),
        "list by label: {ls}"
    );
    let (cr, err) = b.tool("cancel", json!({"run_id": detached}), T);
    ensure!(detached_run, !err, "cancel: {cr}");
    detached_run.eq(
        &cr["runs"][0]["state"],
        "cancelled",
        format_args!("cancel: {cr}"),
    );
    detached_run.wait_gone_within(&dp, Duration::from_secs(5), "the detached run's tree");
    w.assert_nothing_of(&detached);
    b.close(T);
}

#[test]
fn a_shutdown_that_outlasts_the_clients_patience_still_stops_the_run() {
    // The SDK closes the server's stdin, waits 2 s, TERMs the server's process group, waits 2 s
    // more and KILLs it. A run whose processes ignore TERM and HUP takes its whole grace (8 s) to
    // stop: the server is killed while the cancel is on its way, and the run stops all the same.
    let w = World::local();
    let mut c = w.client(&[], false);
    let tree = json!(fx(&format!("tree --children 2 {DEAF}")));
    let (r, _) = c.tool("start", json!({"argv": tree, "grace_s": 8}), T);
    let id = text(&r["run_id"]);
    let run = ctx(&w.root, &id);
    let pins = w.pin_tree(&id);
    let server = Pinned::new(&[c.server_pid()]);
    let t0 = Instant::now();
    let (_, log) = c.close(T);
    run.wait_gone_within(&server, Duration::from_secs(10), "the SDK stops the server");
    let server_gone = t0.elapsed();
    pins.wait_all_gone(Duration::from_secs(15))
        .unwrap_or_else(|left| run.fail(format_args!("left: {left:?}")));
    let st = w.root.wait_final(&id, T);
    run.fields(&st, "the record", ended("cancelled", "cancel_request"));
    ensure!(
        run,
        cleanup_signals(&st).iter().any(|s| s == "KILL"),
        "{st}"
    );
    eprintln!(
        "mcp-figure: server gone {:.1} s after stdin closed; its TERM-proof run stopped {:.1} s after",
        server_gone.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    w.assert_nothing_of(&id);
    ensure!(run, log.contains("shutting down (stdin closed)"), "{log}");
}

#[test]
fn bad_input_is_answered_with_a_tool_error_and_the_server_goes_on() {
    let w = World::local();
    // An ssh host that refuses connections (nothing listens on port 1).
    let mut c = w.client(
        &[
            "--host",
            "root@127.0.0.1",
            "--ssh-option=-p1",
            "--ssh-option=-oConnectTimeout=5",
        ],
        false,
    );
    let pid = c.server_pid();
    let idle = rss_kib(pid);
    let fixture = fixture_bin();
    let huge = "x".repeat(300 * 1024);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "run",
            json!({"host": "nope", "command": "true"}),
            "unknown host \"nope\"",
        ),
        ("run", json!({}), "give the command"),
        ("run", json!({"argv": []}), "must not be empty"),
        (
            "run",
            json!({"argv": ["true"], "command": "true"}),
            "not both",
        ),
        ("run", json!({"argv": "ls -l"}), "bad arguments for run"),
        (
            "run",
            json!({"argv": ["true"], "timeout": 5}),
            "unknown field",
        ),
        ("run", json!({"argv": ["echo", huge]}), "at most"),
        (
            "run",
            json!({"argv": ["true"], "labels": {"agent-run-mcp/owner": "x"}}),
            "server's own",
        ),
        (
            "run",
            json!({"argv": ["true"], "env": {"AGENT_RUN_ID": "x"}}),
            "AGENT_RUN_ID",
        ),
        (
            "run",
            json!({"argv": ["true"], "timeout_s": -1}),
            "timeout_s",
        ),
        ("run", json!({"argv": ["true"], "wait_s": 100000}), "wait_s"),
        (
            "run",
            json!({"argv": ["true"], "cwd": "/no/such/dir"}),
            "refused the launch",
        ),
        (
            "run",
            json!({"argv": ["true"], "detach": true}),
            "start with detach",
        ),
        ("start", json!({"argv": ["true"], "wait_s": 1}), "wait_s"),
        ("status", json!({"run_id": "../etc"}), "run id"),
        ("status", json!({"run_id": "no-such-run"}), "no-such-run"),
        (
            "status",
            json!({"run_id": "a", "run_ids": ["b"]}),
            "not both",
        ),
        (
            "logs",
            json!({"run_id": "x", "offset": 0, "max_bytes": 1_000_000_000u64}),
            "max_bytes is at most",
        ),
        (
            "logs",
            json!({"run_id": "x", "stream": "both"}),
            "stdout or stderr",
        ),
        ("list", json!({"state": "sleeping"}), "state is one of"),
        ("cancel", json!({"run_id": "no-such-run"}), "no-such-run"),
        (
            "run",
            json!({"host": "root@127.0.0.1", "command": "true"}),
            "cannot connect to root@127.0.0.1",
        ),
    ];
    for (tool, args, want) in &cases {
        let (r, err) = c.tool(tool, args.clone(), Duration::from_secs(60));
        let msg = r["text"]
            .as_str()
            .map_or_else(|| r.to_string(), str::to_string);
        assert!(err, "{tool} {args}: not an error: {msg}");
        assert!(
            msg.contains(want),
            "{tool} {args}: {msg:?} does not say {want:?}"
        );
    }
    // An unknown tool is a protocol error, still no crash.
    let r = c.call("rm", json!({}), T);
    assert_eq!(r["ok"], false, "{r}");
    // A huge output: the answer stays small, the sizes are exact.
    let n = 30_000_000u64;
    let (r, err) = c.tool(
        "run",
        json!({"argv": [fixture, "spew", n.to_string(), "--stderr-bytes", "5000000"]}),
        Duration::from_secs(120),
    );
    assert!(!err, "{r}");
    assert_eq!(
        (r["stdout"]["bytes"].as_u64(), r["stderr"]["bytes"].as_u64()),
        (Some(n), Some(5_000_000)),
        "(r[\"stdout\"][\"bytes\"].as_u64(), r[\"stderr\"][\"bytes\"].as_u64())"
    );
    assert_eq!(
        r["stdout"]["text"].as_str().unwrap().len(),
        4096,
        "r[\"stdout\"][\"text\"].as_str().unwrap().len()"
    );
    assert!(
        r.to_string().len() < 32 * 1024,
        "the answer is bounded: {} bytes",
        r.to_string().len()
    );
    let (l, _) = c.tool(
        "logs",
        json!({"run_id": r["run_id"], "offset": 1_000_000, "max_bytes": 65536}),
        T,
    );
    let want = spew_bytes(1_000_000 + 65536);
    assert!(
        l["text"].as_str().unwrap().as_bytes() == &want[1_000_000..],
        "l[\"text\"].as_str().unwrap().as_bytes() == &want[1_000_000..]"
    );
    // A workload that swaps its logs for a symlink and a FIFO: each is reported as what it is,
    // never followed, never blocked on.
    let swap = r#"ln -sf /etc/hostname "$AGENT_RUN_DIR/stdout.log"; rm -f "$AGENT_RUN_DIR/stderr.log"; mkfifo "$AGENT_RUN_DIR/stderr.log""#;
    let (r, err) = c.tool("run", json!({"command": swap}), T);
    assert!(!err, "{r}");
    assert_eq!(
        (r["stdout"]["file"].as_str(), r["stdout"]["text"].as_str()),
        (Some("symbolic link"), Some("")),
        "{r}"
    );
    assert_eq!(
        (r["stderr"]["file"].as_str(), r["stderr"]["text"].as_str()),
        (Some("fifo"), Some("")),
        "{r}"
    );
    let (l, _) = c.tool(
        "logs",
        json!({"run_id": r["run_id"], "stream": "stderr", "offset": 0}),
        T,
    );
    assert_eq!(
        (l["file"].as_str(), l["size"].as_u64()),
        (Some("fifo"), Some(0)),
        "{l}"
    );
    // Still the same server, still answering.
    assert!(c.server_alive(), "c.server_alive()");
    assert_eq!(c.server_pid(), pid, "c.server_pid()");
    let tools = c.request(json!({"op": "list_tools"}), T);
    assert_eq!(
        tools["tools"].as_array().map(Vec::len),
        Some(7),
        "tools[\"tools\"].as_array().map(Vec::len)"
    );
    eprintln!(
        "mcp-figure: server RSS idle {idle} KiB, after {} calls and a 35 MB output {} KiB",
        cases.len() + 3,
        rss_kib(pid)
    );
    c.close(T);
}

#[test]
fn a_line_that_is_not_json_is_answered_and_values_that_look_like_options_stay_values() {
    let w = World::local();
    let mut s = Wire::start(&w.args(&[]), &[("XDG_RUNTIME_DIR", w.xdg.as_os_str())]);
    // JSON-RPC 2.0: a parse error is answered, with id null.
    s.send_line("this is not JSON");
    let (_, line, e) = s.line_where(T, |v| v.get("error").is_some());
    assert_eq!(e["error"]["code"], -32700, "{line}");
    assert!(line.contains(r#""id":null"#), "id null, spelt out: {line}");
    s.initialize(false);
    s.send_line(r#"{"jsonrpc": "2.0", "id": 99, "method": "tools/li"#);
    let errors = |s: &Wire| {
        s.messages()
            .into_iter()
            .filter(|m| m["error"]["code"] == -32700 && m["id"].is_null())
            .count()
    };
    wait_until("a second parse error", T, || {
        (errors(&s) == 2).then_some(())
    });
    // Still serving.
    let id = s.send("tools/list", json!({}));
    let (_, tools) = s.answer(id, T);
    let props = &tools["result"]["tools"][0]["inputSchema"]["properties"];
    // The schema's bounds are the host's: agent-run's --grace is at most 5m, and a duration
    // is read in whole milliseconds.
    assert_eq!(props["grace_s"]["maximum"], 300.0, "{props}");
    assert_eq!(props["timeout_s"]["minimum"], 0.001, "{props}");
    assert_eq!(props["grace_s"]["minimum"], 0.001, "{props}");
    for (args, want) in [
        (
            json!({"argv": ["true"], "timeout_s": 0.0004}),
            "timeout_s must be at least 0.001",
        ),
        (json!({"argv": ["true"], "grace_s": 301}), "at most 300"),
    ] {
        let (_, r) = s.call("run", args.clone(), None, T);
        let text = text(&r["content"][0]["text"]);
        assert!(r["isError"] == true && text.contains(want), "{args}: {r}");
    }
    // A value that begins with '-' where the host would read it as an option is refused here
    // (agent-run's start -d hands --label and --cwd on as words of their own); elsewhere it is
    // passed as --opt=VALUE, one word.
    for (args, want) in [
        (
            json!({"argv": ["true"], "labels": {"-rf": "x"}}),
            "must not begin with '-'",
        ),
        (json!({"argv": ["true"], "cwd": "-C"}), "write ./-C"),
    ] {
        let (_, r) = s.call("run", args.clone(), None, T);
        let text = text(&r["content"][0]["text"]);
        assert!(r["isError"] == true && text.contains(want), "{args}: {r}");
    }
    let labels = json!({"k": "--help", "n": "-1"});
    let (_, r) = s.call(
        "run",
        json!({"argv": ["true"], "labels": labels, "grace_s": 300}),
        None,
        T,
    );
    let id = text(&r["structuredContent"]["run_id"]);
    let run = ctx(&w.root, &id);
    ensure!(run, r["isError"] != true, "{r}");
    let st = w.root.status(&id);
    for (k, v) in labels.as_object().unwrap() {
        run.eq(&st["labels"][k], v, format_args!("label {k}"));
    }
    run.eq(&st["grace_ms"], 300_000, "the grace the host took");
    // A list whose selector looks like an option.
    let (_, r) = s.call("list", json!({"labels": {"n": "-1"}}), None, T);
    run.eq(&r["structuredContent"]["count"], 1, format_args!("{r}"));
}

/// The median and the largest of `v` (ms).
fn median_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

#[test]
fn answers_carry_what_an_agent_acts_on_and_the_record_only_when_asked() {
    // Sizes are of the whole JSON-RPC answer line (the text content and structuredContent both).
    let w = World::local();
    let mut s = Wire::start(&w.args(&[]), &[("XDG_RUNTIME_DIR", w.xdg.as_os_str())]);
    s.initialize(false);
    // The first call asks the host's features once; the others are what a start costs.
    let mut took = Vec::new();
    let mut ids = Vec::new();
    let mut start_line = String::new();
    for _ in 0..11 {
        let t0 = Instant::now();
        let (line, r) = s.call(
            "start",
            json!({"argv": ["sleep", "300"], "labels": {"task": "answer-size"}}),
            None,
            T,
        );
        took.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert!(r["isError"] != true, "{r}");
        ids.push(text(&r["structuredContent"]["run_id"]));
        start_line = line;
    }
    let id = ids[0].clone();
    let run = ctx(&w.root, &id);
    let (status_line, st) = s.call("status", json!({"run_id": id}), None, T);
    let (status_verbose, stv) = s.call("status", json!({"run_id": id, "verbose": true}), None, T);
    let (start_verbose, sv) = s.call(
        "start",
        json!({"argv": ["sleep", "300"], "labels": {"task": "answer-size"}, "verbose": true}),
        None,
        T,
    );
    ids.push(text(&sv["structuredContent"]["run_id"]));
    ensure!(
        run,
        start_line.len() <= 2000,
        "start answered {} bytes: {start_line}",
        start_line.len()
    );
    ensure!(
        run,
        status_line.len() <= 1500,
        "status answered {} bytes: {status_line}",
        status_line.len()
    );
    let sc = &st["structuredContent"];
    for k in [
        "run_id",
        "host",
        "state",
        "final",
        "exit_code",
        "summary",
        "next",
        "stdout",
        "stderr",
    ] {
        ensure!(run, sc.get(k).is_some(), "status lacks {k}: {sc}");
    }
    run.eq(&sc["stdout"]["bytes"], 0, "the offset to read on from");
    ensure!(
        run,
        sc.get("record").is_none(),
        "no record by default: {sc}"
    );
    let sc = &stv["structuredContent"];
    run.eq(
        &sc["record"]["run_id"],
        id.as_str(),
        "verbose: the host's record",
    );
    run.eq(
        &sc["owned_by_this_server"],
        true,
        "verbose: who answers for it",
    );
    run.eq(
        &sv["structuredContent"]["record"]["state"],
        "running",
        "start, verbose",
    );
    let (_, c) = s.call("cancel", json!({"run_ids": ids}), None, T);
    ensure!(run, c["isError"] != true, "{c}");
    let (median, max) = median_max(took[1..].to_vec());
    eprintln!(
        "mcp-figure: local start, tools/call -> answer: median {median:.1} ms, max {max:.1} ms over {} (first, with the features probe: {:.1} ms)",
        took.len() - 1,
        took[0]
    );
    eprintln!(
        "mcp-figure: answer bytes: start {}, status {}; with verbose: start {}, status {}",
        start_line.len(),
        status_line.len(),
        start_verbose.len(),
        status_verbose.len()
    );
}

/// The progress notifications among `notes` (the driver's log), in order.
fn progress_of(notes: &[Value]) -> Vec<Value> {
    notes
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .cloned()
        .collect()
}

#[test]
fn progress_comes_at_the_configured_interval_while_a_call_waits_and_ends_with_it() {
    let w = World::local();
    let every = 1.0;
    let mut c = w.client(&["--progress-every", "1s"], false);
    // A silent run: every notification of a wait on it is the interval's.
    let (r, _) = c.tool("start", json!({"argv": ["sleep", "300"]}), T);
    let id = text(&r["run_id"]);
    let run = ctx(&w.root, &id);
    c.notifications();
    let call = c.send(json!({"op": "call", "name": "wait", "args": {"run_id": id, "timeout_s": 4.5}, "progress": true}));
    let r = c.reply(call, T);
    run.eq(
        &r["result"]["structuredContent"]["state"],
        "running",
        format_args!("{r}"),
    );
    let notes = progress_of(&c.notifications());
    ensure!(
        run,
        notes.len() >= 4,
        "a notification a second for 4.5 s: {notes:?}"
    );
    let times: Vec<f64> = notes.iter().map(|n| n["t"].as_f64().unwrap()).collect();
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let (median, max) = median_max(gaps.clone());
    // The interval is a most; a loaded machine may add a look's latency.
    ensure!(run, max <= every + 1.5, "gaps {gaps:?}");
    run.eq(
        &notes[0]["params"]["message"],
        &format!("waiting for run {id} on local"),
        "the first, at once",
    );
    let mut last = 0.0;
    for (i, n) in notes.iter().enumerate() {
        let p = &n["params"];
        let value = p["progress"].as_f64().unwrap();
        ensure!(run, value > last, "progress grows: {notes:?}");
        last = value;
        run.eq(&p["total"], 4.5, "total: the most the call waits");
        run.eq(
            &p["_meta"]["agent-run-mcp/output_bytes"],
            0,
            "the output so far",
        );
        let m = text(&p["message"]);
        let fresh = i == 0 || m.starts_with(&format!("run {id} on local: running"));
        ensure!(run, fresh && !m.contains('\n'), "{m}");
    }
    eprintln!("mcp-figure: progress with --progress-every 1s on a silent run: {} notifications in 4.5 s, gaps median {median:.2} s, max {max:.2} s", notes.len());

    // A run that writes: its notifications quote its last line and count its bytes.
    let call = c.send(json!({"op": "call", "name": "run", "args": {"command": "echo one; sleep 1.5; echo two; sleep 1.5; echo three"}, "progress": true}));
    let r = c.reply(call, T);
    let id2 = text(&r["result"]["structuredContent"]["run_id"]);
    let notes = progress_of(&c.notifications());
    let first = text(&notes[0]["params"]["message"]);
    ensure!(
        run,
        first == format!("run {id2} started on local"),
        "the run id first: {first}"
    );
    let end = notes.last().unwrap();
    ensure!(
        run,
        text(&end["params"]["message"]).contains("last line: three"),
        "{notes:?}"
    );
    run.eq(
        &end["params"]["_meta"]["agent-run-mcp/output_bytes"],
        14,
        format_args!("{end}"),
    );
    // The call has answered: nothing more comes for it, though the first run goes on.
    let (_, _) = c.tool("status", json!({"run_id": id}), T);
    wait_until("a look past the interval", T, || {
        (epoch_now() > end["t"].as_f64().unwrap() + 2.0 * every).then_some(())
    });
    let (_, _) = c.tool("status", json!({"run_id": id}), T);
    let late = progress_of(&c.notifications());
    ensure!(run, late.is_empty(), "progress after the answer: {late:?}");
    c.tool("cancel", json!({"run_id": id}), T);
    c.close(T);
}

#[test]
fn a_run_that_became_a_task_gets_no_more_progress() {
    let w = World::local();
    let mut c = w.client(&["--progress-every", "1s"], true);
    let call = c.send(json!({"op": "call", "name": "run", "args": {"command": "while :; do echo tick; sleep 0.05; done"}, "progress": true}));
    let r = c.reply(call, T);
    let task_id = text(&r["task"]["taskId"]);
    let (id, _) = task_id.split_once('@').unwrap();
    let run = ctx(&w.root, id);
    let before = progress_of(&c.notifications());
    ensure!(run, !before.is_empty(), "progress until the task: {r}");
    // The run writes on, for more than the interval twice over.
    let log = w.root.run_dir(id).join("stdout.log");
    let size = || fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let at_task = size();
    wait_until("the run to write on", T, || {
        (size() > at_task + 200).then_some(())
    });
    let got = c.request(json!({"op": "tasks_get", "task_id": task_id}), T);
    run.eq(&got["raw"]["status"], "working", format_args!("{got}"));
    let after = progress_of(&c.notifications());
    ensure!(
        run,
        after.is_empty(),
        "progress after the task answer: {after:?}"
    );
    c.request(json!({"op": "tasks_cancel", "task_id": task_id}), T);
    let st = w.root.wait_final(id, T);
    run.eq(&st["state"], "cancelled", format_args!("{st}"));
    c.close(T);
}

#[test]
fn wait_with_idle_s_returns_when_a_run_goes_quiet_and_the_run_goes_on() {
    let w = World::local();
    let mut c = w.client(&[], false);
    let (go, quiet) = gated(&w, "echo done");
    let (r, _) = c.tool("start", json!({"command": quiet}), T);
    let id = text(&r["run_id"]);
    let run = ctx(&w.root, &id);
    let t0 = Instant::now();
    let (r, err) = c.tool(
        "wait",
        json!({"run_id": id, "idle_s": 1, "timeout_s": 60}),
        T,
    );
    let took = t0.elapsed();
    ensure!(run, !err, "{r}");
    run.fields(&r, "r", json!({"state": "running", "idle": true}));
    ensure!(
        run,
        r["idle_for_s"].as_f64().is_some_and(|s| s >= 1.0),
        "{r}"
    );
    ensure!(
        run,
        took < Duration::from_secs(30),
        "idle, not the 60 s timeout: {took:?}"
    );
    ensure!(run, text(&r["next"]).starts_with("idle"), "{r}");
    run.eq(&w.root.status(&id)["state"], "running", "the run goes on");
    // Output restarts the clock: a run that writes every 50 ms is never idle for 1.5 s.
    let busy = format!(
        "while [ ! -e '{}' ]; do echo tick; sleep 0.05; done",
        go.display()
    );
    let (b, _) = c.tool("start", json!({"command": busy}), T);
    let t0 = Instant::now();
    let (r, _) = c.tool(
        "wait",
        json!({"run_id": b["run_id"], "idle_s": 1.5, "timeout_s": 4}),
        T,
    );
    ensure!(
        run,
        r.get("idle").is_none() && t0.elapsed() >= Duration::from_secs(4),
        "{r} after {:?}",
        t0.elapsed()
    );
    fs::write(&go, b"").unwrap();
    let (r, _) = c.tool(
        "wait",
        json!({"run_ids": [id, b["run_id"]], "idle_s": 30}),
        T,
    );
    let runs = r["runs"].as_array().unwrap();
    run.eq(&runs[0]["exit_code"], 0, format_args!("{r}"));
    run.eq(
        &runs[0]["stdout"]["text"],
        "started\ndone\n",
        format_args!("{r}"),
    );
    c.close(T);
}

#[test]
fn the_server_never_outlives_its_client_even_while_its_stdin_stays_open() {
    // The client (a shell here) is SIGKILLed; the test still holds the server's stdin, so no
    // EOF comes. The server sees its parent go, cancels its tied run, leaves the detached one.
    let w = World::local();
    let mut s = Wire::behind_parent(&w.args(&[]), &[("XDG_RUNTIME_DIR", w.xdg.as_os_str())]);
    s.initialize(false);
    let (_, t) = s.call("start", json!({"argv": w.tree()}), None, T);
    let (_, d) = s.call(
        "start",
        json!({"argv": w.tree(), "detach": true, "timeout_s": 120}),
        None,
        T,
    );
    let tied = text(&t["structuredContent"]["run_id"]);
    let detached = text(&d["structuredContent"]["run_id"]);
    let (tied_run, detached_run) = (ctx(&w.root, &tied), ctx(&w.root, &detached));
    let (tp, dp) = (w.pin_tree(&tied), w.pin_tree(&detached));
    let t0 = Instant::now();
    s.kill_parent();
    tied_run.wait_gone_within(s.server_pin(), T, "the server, after its client");
    let gone = t0.elapsed();
    tied_run.wait_gone_within(&tp, Duration::from_secs(10), "the tied run's tree");
    let st = tied_run.wait_final();
    let want = ended("cancelled", "cancel_request");
    tied_run.fields(&st, "the tied run's record", want);
    ensure!(
        tied_run,
        s.stderr().contains("shutting down (the parent"),
        "{}",
        s.stderr()
    );
    detached_run.all_alive(&dp, "the detached run goes on");
    eprintln!(
        "mcp-figure: client SIGKILLed, stdin held open -> server gone in {:.0} ms (its tied run cancelled)",
        gone.as_secs_f64() * 1000.0
    );
    let out = w.root.cmd().args(["cancel", &detached]).output().unwrap();
    detached_run.eq(&out.status.code(), &Some(0), "cancel of the detached run");
    detached_run.wait_gone_within(&dp, Duration::from_secs(10), "the detached run's tree");
}

#[test]
fn a_server_whose_client_dies_leaves_no_ssh_behind() {
    let w = World::ssh();
    let mut s = Wire::behind_parent(&w.args(&[]), &[("XDG_RUNTIME_DIR", w.xdg.as_os_str())]);
    s.initialize(false);
    let (_, t) = s.call(
        "start",
        json!({"host": w.host(), "argv": w.tree()}),
        None,
        T,
    );
    let id = text(&t["structuredContent"]["run_id"]);
    let run = ctx(&w.root, &id);
    let pins = w.pin_tree(&id);
    // A wait in flight: one channel busy on the host when the client dies.
    s.send(
        "tools/call",
        json!({"name": "wait", "arguments": {"host": w.host(), "run_id": id, "timeout_s": 300}}),
    );
    let xdg = w.xdg.to_str().unwrap().to_string();
    wait_until("the master and a channel", T, || {
        (processes_mentioning(&xdg).len() >= 2).then_some(())
    });
    s.kill_parent();
    run.wait_gone_within(s.server_pin(), T, "the server, after its client");
    run.wait_gone_within(&pins, Duration::from_secs(10), "the tied run's tree");
    let st = run.wait_final();
    run.fields(&st, "its record", ended("cancelled", "cancel_request"));
    w.assert_ssh_cleaned_up(Duration::from_secs(5));
}

#[test]
fn a_task_is_its_run_another_server_answers_for_it_and_a_client_without_tasks_gets_32021() {
    let w = World::local();
    let mut a = w.client(&[], true);
    // Its processes ignore TERM and HUP: its stop takes the whole grace, 3 s.
    let tree = json!(fx(&format!("tree --children 2 {DEAF}")));
    let r = a.call("run", json!({"argv": tree, "grace_s": 3}), T);
    let task_id = text(&r["task"]["taskId"]);
    let (id, _) = task_id.split_once('@').unwrap();
    let run = ctx(&w.root, id);
    // The task went out with its record on disk: readable at once.
    run.eq(
        &w.root.status(id)["state"],
        "running",
        "the record, when the task came",
    );
    let pins = w.pin_tree(id);
    a.kill_server();
    drop(a);
    // A new server knows nothing of it but the host: the task is the run.
    let mut b = w.client(&[], true);
    let got = b.request(json!({"op": "tasks_get", "task_id": task_id}), T);
    run.eq(&got["raw"]["status"], "working", format_args!("{got}"));
    ensure!(
        run,
        text(&got["raw"]["statusMessage"]).contains(&format!("run {id}: running")),
        "{got}"
    );
    let none = b.request(
        json!({"op": "tasks_get", "task_id": "mcp-0123456789abcdef@local"}),
        T,
    );
    run.eq(
        &none["error"]["code"],
        -32602,
        format_args!("no such task: {none}"),
    );
    // A client that did not declare the extension may not use tasks/*.
    let mut c = w.client(&[], false);
    for op in ["tasks_get", "tasks_cancel"] {
        let e = c.request(json!({"op": op, "task_id": task_id}), T);
        run.eq(
            &e["error"]["code"],
            -32021,
            format_args!("{op} without the capability: {e}"),
        );
    }
    run.all_alive(&pins, "its run goes on");
    // tasks/cancel answers once the stop is confirmed: after the grace, KILL, the final record.
    let ack = b.request(json!({"op": "tasks_cancel", "task_id": task_id}), T);
    run.eq(&ack["ok"], true, format_args!("{ack}"));
    let st = w.root.status(id);
    let want = ended("cancelled", "cancel_request");
    run.fields(&st, "the record when tasks/cancel answered", want);
    ensure!(
        run,
        cleanup_signals(&st).iter().any(|s| s == "KILL"),
        "{st}"
    );
    pins.wait_all_gone(Duration::ZERO)
        .unwrap_or_else(|left| run.fail(format_args!("left when tasks/cancel answered: {left:?}")));
    let got = b.request(json!({"op": "tasks_get", "task_id": task_id}), T);
    run.eq(&got["raw"]["status"], "cancelled", format_args!("{got}"));
    w.assert_nothing_of(id);
    b.close(T);
    c.close(T);
}

/// An agent-run that logs, per call, its words and the lease token its environment holds (`-`
/// for none), then execs the real one.
fn token_shim(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("calls.log");
    let shim = dir.join("agent-run-shim");
    fs::write(
        &shim,
        format!(
            "#!/bin/sh\nprintf '%s|%s\\n' \"${{AGENT_RUN_LEASE_TOKEN:--}}\" \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            agent_run_bin().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
    (shim, log)
}

/// (token, subcommand, words) of each logged call.
fn token_calls(log: &std::path::Path) -> Vec<(String, String, String)> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (token, words) = l.split_once('|')?;
            let sub = words.split(' ').find(|w| !w.starts_with("--root="))?;
            Some((token.to_string(), sub.to_string(), words.to_string()))
        })
        .collect()
}

#[test]
fn start_and_renew_get_the_servers_lease_token_in_their_environment_only() {
    use std::os::unix::fs::MetadataExt;
    let w = World::ssh();
    let (shim, log) = token_shim(w.root.dir.path());
    let state = w.root.dir.path().join("state");
    let shim_s = shim.display().to_string();
    let owner = format!("tok-{}", std::process::id());
    let mut args = w.args(&["--owner", &owner, "--lease", "3s"]);
    // The shim on both hosts ("local" and the ssh one, which is this machine).
    for (i, a) in args.clone().iter().enumerate() {
        if a == "--agent-run" || a == "--remote-bin" {
            args[i + 1] = shim_s.clone();
        }
    }
    let env = [
        ("XDG_RUNTIME_DIR", w.xdg.as_os_str()),
        ("XDG_STATE_HOME", state.as_os_str()),
    ];
    let mut c = Client::start(&args, &env, false);
    let (a, _) = c.tool("start", json!({"argv": ["sleep", "300"]}), T);
    let (b, _) = c.tool(
        "start",
        json!({"host": w.host(), "argv": ["sleep", "300"]}),
        T,
    );
    let id = text(&a["run_id"]);
    let run = ctx(&w.root, &id);
    // Renewals come every second (a third of the lease), one per host.
    wait_until("a renewal on each host", T, || {
        let calls = token_calls(&log);
        let renews = calls.iter().filter(|c| c.1 == "renew").count();
        (renews >= 4).then_some(())
    });
    let file = state.join("agent-run-mcp").join(format!("{owner}.token"));
    let token = fs::read_to_string(&file).unwrap().trim().to_string();
    run.eq(&token.len(), &32, "a 128-bit token in hex");
    let dir_mode = fs::metadata(file.parent().unwrap()).unwrap().mode() & 0o777;
    let file_mode = fs::metadata(&file).unwrap().mode() & 0o777;
    run.eq(&(dir_mode, file_mode), &(0o700, 0o600), "private");
    let calls = token_calls(&log);
    let ssh_id = text(&b["run_id"]);
    ensure!(
        run,
        calls
            .iter()
            .any(|c| c.1 == "renew" && c.2.contains(&ssh_id)),
        "a renewal over ssh: {calls:?}"
    );
    for (t, sub, words) in &calls {
        let want = if sub == "start" || sub == "renew" {
            token.as_str()
        } else {
            "-"
        };
        run.eq(&t.as_str(), &want, format_args!("the token of {words}"));
        ensure!(
            run,
            !words.contains(&token),
            "the token on a command line: {words}"
        );
    }
    // A server started again with the owner renews with the same token.
    c.kill_server();
    drop(c);
    let before = token_calls(&log).len();
    let c = Client::start(&args, &env, false);
    wait_until("the new server's renewals", T, || {
        let calls = token_calls(&log);
        calls[before..]
            .iter()
            .any(|c| c.1 == "renew" && c.0 == token)
            .then_some(())
    });
    drop(c);
    for r in [&a, &b] {
        let out = w
            .root
            .cmd()
            .args(["cancel", &text(&r["run_id"])])
            .output()
            .unwrap();
        run.eq(&out.status.code(), &Some(0), "cancel");
    }
}

/// A script that prints `started`, waits until the test creates the file GO, then runs `then`;
/// GO and the script. The run ends when the test says so, not after some time.
fn gated(w: &World, then: &str) -> (PathBuf, String) {
    let go = w.root.dir.path().join("go");
    let script = format!(
        "echo started; while [ ! -e '{}' ]; do sleep 0.05; done; {then}",
        go.display()
    );
    (go, script)
}
