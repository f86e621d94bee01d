//! Black-box tests of `agent-run remote` against a real OpenSSH server on this machine.
//!
//! Each test starts its own `sshd` (generated host and user keys, a temporary authorized_keys,
//! root login by key only) and drives the built `agent-run remote` with `--ssh-option`s that
//! ignore the user's ssh config, `--remote-bin` (the same built binary) and `--remote-root` (the
//! test's run root): "the host" is this machine, so the tests assert on the host's run dir and
//! on the workload's pids directly, pinned with pidfds after the fixture's ready line.
//!
//! Network faults use two network namespaces joined by a veth pair (192.0.2.0/24, TEST-NET-1,
//! only inside namespaces the test made): the client end goes down to cut the link and up to
//! restore it. ssh's keepalive is set to 1 s x 2 there, so a cut is noticed in about 2-3 s.
//!
//! The seed article's failure path 3 (kill the local client, no remote signal) is
//! `killing_the_local_client_leaves_the_run_to_its_lease`.

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use agent_run_shared::time::parse_rfc3339;
use agent_run_tests::facts::ended;
use agent_run_tests::facts::require_root;
use agent_run_tests::remote::{
    processes_mentioning, strip_messages, wait_for_text, Netns, SshServer,
};
use agent_run_tests::workload::spew_bytes;
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, fixture_bin, wait_ready, Ctx, Pinned,
    Ready, Spawned, TestRoot,
};
use serde_json::Value;

/// The deadline for things that normally take a second or two.
const T: Duration = Duration::from_secs(30);
/// ssh keepalive for the link-cut tests: a dead link is noticed in 2-3 s.
const FAST_KEEPALIVE: [&str; 2] = [
    "--ssh-option=-oServerAliveInterval=1",
    "--ssh-option=-oServerAliveCountMax=2",
];

/// One test's world: an sshd, a run root on "the host", and where the client puts its socket.
struct World {
    srv: SshServer,
    root: TestRoot,
    net: Option<Netns>,
    xdg: PathBuf,
}

impl World {
    /// sshd on loopback.
    fn loopback() -> World {
        require_root();
        World::with(None)
    }

    /// sshd in one namespace, the client in another, a link between them to cut.
    fn split() -> World {
        require_root();
        World::with(Some(Netns::new()))
    }

    fn with(net: Option<Netns>) -> World {
        let srv = SshServer::start(net.as_ref().map(|n| n.server.as_str()));
        let root = TestRoot::new();
        let xdg = root.dir.path().join("xdg");
        fs::create_dir(&xdg).unwrap();
        World {
            srv,
            root,
            net,
            xdg,
        }
    }

    /// `agent-run remote <ssh options> --remote-bin <built> --remote-root <root> ARGS...`, in
    /// the client namespace when there is one.
    fn remote<S: Into<OsString> + Clone>(&self, args: &[S]) -> Command {
        let mut cmd = match &self.net {
            Some(net) => Netns::exec(&net.client, agent_run_bin()),
            None => Command::new(agent_run_bin()),
        };
        cmd.arg("remote")
            .args(self.srv.remote_args())
            .arg("--remote-bin")
            .arg(agent_run_bin())
            .arg("--remote-root")
            .arg(self.root.root())
            .args(args.iter().cloned().map(Into::into))
            .env("XDG_RUNTIME_DIR", &self.xdg)
            .env_remove("AGENT_RUN_ROOT")
            .stdin(Stdio::null());
        cmd
    }

    /// `remote [OPTS] HOST -- COMMAND...`.
    fn run<S: Into<OsString> + Clone>(&self, opts: &[&str], command: &[S]) -> Command {
        let mut args: Vec<OsString> = opts.iter().map(OsString::from).collect();
        args.push(self.srv.host().into());
        args.push("--".into());
        args.extend(command.iter().cloned().map(Into::into));
        self.remote(&args)
    }

    /// The options of run `id` with a lease: `--id ID --lease LEASE`, and in a split world,
    /// whose link a test cuts, ssh keepalives that notice a cut within seconds.
    fn leased<'a>(&self, id: &'a str, lease: &'a str) -> Vec<&'a str> {
        let mut opts = vec!["--id", id, "--lease", lease];
        if self.net.is_some() {
            opts.extend(FAST_KEEPALIVE);
        }
        opts
    }

    /// `remote HOST FLAG ID` (`--status`, `--cancel`, `--attach`).
    fn one_shot(&self, flag: &str, id: &str) -> Command {
        self.remote(&[self.srv.host().as_str(), flag, id])
    }

    /// Starts `remote --id ID` of `command` with a lease ([`World::leased`]), pins the host's
    /// workload once it is ready and waits until its ready line has come back: the run's
    /// checks, the client, the ready line and the workload.
    fn start<'a>(
        &'a self,
        id: &'a str,
        lease: &str,
        command: &[OsString],
    ) -> (Ctx<'a>, Spawned, Ready, Pinned) {
        let run = Spawned::spawn(&mut self.run(&self.leased(id, lease), command));
        let ready = wait_ready(&self.root.run_dir(id).join("stdout.log"), T);
        let workload = Pinned::new(&ready.all_pids());
        wait_for_text("ready ", T, || run.stdout_so_far());
        (ctx(&self.root, id), run, ready, workload)
    }

    /// Runs `remote HOST FLAG ID` to its end and checks its exit code.
    fn one_shot_exits(&self, flag: &str, id: &str, want: i32) -> Output {
        finish(self, id, Spawned::spawn(&mut self.one_shot(flag, id)), want)
    }

    /// The run finished with exit code `code`, and the client left nothing behind.
    fn finished_and_cleaned_up(&self, c: Ctx, id: &str, code: i64) {
        let st = self.root.status(id);
        c.eq(
            (st["state"].as_str(), st["exit_code"].as_i64()),
            (Some("finished"), Some(code)),
            format_args!("state and exit code of {st:#}"),
        );
        self.assert_client_cleaned_up();
    }

    fn net(&self) -> &Netns {
        self.net.as_ref().expect("a split world")
    }

    /// The client's private directory is gone and no ssh of ours is left.
    fn assert_client_cleaned_up(&self) {
        let xdg = self.xdg.to_str().unwrap();
        let left: Vec<_> = fs::read_dir(&self.xdg).unwrap().flatten().collect();
        assert!(left.is_empty(), "left in {xdg}: {left:?}");
        let procs = processes_mentioning(xdg);
        assert!(procs.is_empty(), "ssh processes left: {procs:?}");
    }
}

/// `fixture tree --children N`, with grandchildren when asked.
fn tree(children: u32, grandchildren: bool) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec![
        fixture_bin().into_os_string(),
        "tree".into(),
        "--children".into(),
        children.to_string().into(),
    ];
    if grandchildren {
        argv.push("--grandchildren".into());
    }
    argv
}

/// The record `st` (status.json or a one-shot's) ended in this state for this reason.
fn ended_as(c: Ctx, st: &Value, state: &str, reason: &str) {
    c.eq(
        (st["state"].as_str(), st["reason"].as_str()),
        (Some(state), Some(reason)),
        format_args!("state and reason of {st:#}"),
    );
}

/// Waits for a spawned `remote` and checks its exit code, explaining a failure in full.
fn finish(world: &World, id: &str, run: Spawned, want: i32) -> Output {
    let what = run.what.clone();
    let out = run.finish(T * 2);
    if exit_code(&out.status) != want {
        ctx(&world.root, id).fail(format_args!(
            "expected exit {want}\n{}",
            describe_output(&what, &out)
        ));
    }
    out
}

/// The record a one-shot printed on stdout.
fn record(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON record on stdout: {e}\n{}",
            describe_output("", out)
        )
    })
}

fn epoch_of(record: &Value, key: &str) -> f64 {
    parse_rfc3339(record[key].as_str().unwrap()).unwrap()
}

#[test]
fn remote_streams_the_output_and_exits_with_the_workloads_code() {
    let w = World::loopback();
    let script = r#""$0" spew 200000 --stderr-bytes 30000 && exit 3"#;
    let fixture = fixture_bin().into_os_string();
    let run = Spawned::spawn(&mut w.run(
        &["--lease", "30s"],
        &["sh".into(), "-c".into(), script.into(), fixture],
    ));
    let out = finish(&w, "", run, 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    let id = first
        .strip_prefix("agent-run: run id ")
        .and_then(|rest| rest.strip_suffix(&format!(" on {}", w.srv.host())))
        .unwrap_or_else(|| panic!("the first line is not the run id: {first:?}"));
    let c = ctx(&w.root, id);
    ensure!(
        c,
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "id {id:?}"
    );
    ensure!(c, out.stdout == spew_bytes(200000), "stdout differs");
    ensure!(
        c,
        strip_messages(&out.stderr) == spew_bytes(30000),
        "stderr differs: {stderr}"
    );
    w.finished_and_cleaned_up(c, id, 3);
}

#[test]
fn a_workload_exiting_255_is_told_apart_from_a_failed_ssh() {
    let w = World::loopback();
    let id = "exit-255";
    let c = ctx(&w.root, id);
    let script = "echo out; echo err >&2; exit 255";
    let run = Spawned::spawn(&mut w.run(&["--id", id], &["sh", "-c", script]));
    let out = finish(&w, id, run, 255);
    c.eq(
        &out.stdout,
        b"out\n",
        format_args!("{}", describe_output("remote", &out)),
    );
    c.eq(
        strip_messages(&out.stderr),
        b"err\n",
        format_args!("{}", describe_output("remote", &out)),
    );
    let st = w.root.status(id);
    c.eq(
        &st["exit_code"].as_i64(),
        &Some(255),
        "st[\"exit_code\"].as_i64()",
    );
    w.assert_client_cleaned_up();
}

#[test]
fn a_hostile_argv_reaches_the_workload_byte_for_byte() {
    let w = World::loopback();
    let file = w.root.dir.path().join("argv");
    let hostile: Vec<&[u8]> = vec![
        b"two words",
        b"",
        b"it's",
        b"\"quoted\"",
        b"$HOME ${PATH} $(id) `id`",
        b"back\\slash\\",
        b"new\nline\n",
        b"\xff\xfe\x80 not utf-8",
        b"-n",
        b"--",
        b"-e",
        b"*",
        b"; exit 9 | & > <",
        b"'\\''",
    ];
    let mut command: Vec<OsString> = vec![
        "sh".into(),
        "-c".into(),
        r#"for a; do printf '%s\0' "$a"; done > "$0""#.into(),
        file.clone().into_os_string(),
    ];
    command.extend(hostile.iter().map(|w| OsString::from_vec(w.to_vec())));
    let run = Spawned::spawn(&mut w.run(&["--id", "hostile"], &command));
    finish(&w, "hostile", run, 0);
    let want: Vec<u8> = hostile
        .iter()
        .flat_map(|w| w.iter().copied().chain([0]))
        .collect();
    let got = fs::read(&file).unwrap();
    assert!(
        got == want,
        "argv differs:\n got {:?}\nwant {:?}",
        OsString::from_vec(got),
        OsString::from_vec(want)
    );
    // The record keeps the argv too (lossily, as strings).
    assert_eq!(
        w.root.status("hostile")["argv"][4].as_str(),
        Some("two words"),
        "w.root.status(\"hostile\")[\"argv\"][4].as_str()"
    );
    assert_eq!(
        command[3].as_bytes(),
        file.as_os_str().as_bytes(),
        "command[3].as_bytes()"
    );
}

#[test]
fn killing_the_local_client_leaves_the_run_to_its_lease() {
    let w = World::loopback();
    let (c, run, ready, workload) = w.start("client-killed", "4s", &tree(2, true));
    // The local side: `agent-run remote`, its ssh channels and its master (in a session of its
    // own, found by the control path in its command line). SIGKILL, no remote signal.
    let mut local = vec![run.child.id() as i32];
    local.extend(processes_mentioning(w.xdg.to_str().unwrap()));
    ensure!(
        c,
        local.len() >= 3,
        "expected remote, a channel and a master: {local:?}"
    );
    let pinned = Pinned::new(&local);
    for pid in &local {
        pinned.signal(*pid, libc::SIGKILL).unwrap();
    }
    c.wait_gone(&pinned, "pinned");
    let killed = agent_run_shared::time::epoch_now();
    let _ = run.finish(T);

    c.eq(
        &workload.alive(),
        &ready.all_pids(),
        "the workload must outlive its controller",
    );
    let st = w.root.wait_final(c.id, T);
    ended_as(c, &st, "cancelled", "lease_expired");
    c.wait_gone(&workload, "the workload");
    let lease: Value =
        serde_json::from_slice(&fs::read(w.root.run_dir(c.id).join("lease.json")).unwrap())
            .unwrap();
    let deadline = lease["deadline_epoch"].as_f64().unwrap();
    let ended = epoch_of(&st, "ended_at");
    ensure!(
        c,
        ended >= deadline - 0.01,
        "stopped at {ended}, before the lease deadline {deadline}"
    );
    ensure!(
        c,
        deadline > killed,
        "the last renewal came after the kill?"
    );
    ensure!(
        c,
        ended - killed < 4.0 + 5.0 + 3.0,
        "stopped {}s after the kill",
        ended - killed
    );
}

#[test]
fn a_cut_link_restored_within_the_lease_loses_and_repeats_no_byte() {
    let w = World::split();
    let id = "cut-short";
    let c = ctx(&w.root, id);
    let script = r#""$0" spew 300000 --stderr-bytes 70000 || exit 99
i=0
while [ $i -lt 80 ]; do echo "line $i"; echo "err $i" >&2; i=$((i+1)); sleep 0.05; done
exit 7"#;
    let command = [
        "sh".into(),
        "-c".into(),
        script.into(),
        fixture_bin().into_os_string(),
    ];
    let run = Spawned::spawn(&mut w.run(&w.leased(id, "20s"), &command));
    wait_for_text("line 3\n", T, || run.stdout_so_far());
    w.net().cut();
    let cut_at = Instant::now();
    // Long enough for ssh to give up on the link (2-3 s) while the workload keeps printing.
    wait_for_text("lost the stream", T, || run.stderr_so_far());
    std::thread::sleep(Duration::from_secs(5).saturating_sub(cut_at.elapsed()));
    w.net().restore();
    let out = finish(&w, id, run, 7);

    let mut want_out = spew_bytes(300000);
    let mut want_err = spew_bytes(70000);
    for i in 0..80 {
        want_out.extend(format!("line {i}\n").bytes());
        want_err.extend(format!("err {i}\n").bytes());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        stderr.contains("reconnected to"),
        "the stream was not resumed: {stderr}"
    );
    ensure!(
        c,
        out.stdout == want_out,
        "stdout differs (len {} vs {})\n{stderr}",
        out.stdout.len(),
        want_out.len()
    );
    ensure!(
        c,
        strip_messages(&out.stderr) == want_err,
        "stderr differs\n{stderr}"
    );
    w.finished_and_cleaned_up(c, id, 7);
}

#[test]
fn a_cut_link_that_outlasts_the_lease_reports_unknown() {
    let w = World::split();
    let (c, run, _, workload) = w.start("cut-long", "4s", &tree(1, false));
    w.net().cut();
    let out = finish(&w, c.id, run, 75);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        stderr.contains(&format!(
            "run {} on {}: outcome unknown",
            c.id,
            w.srv.host()
        )),
        "{stderr}"
    );
    // On the host, the lease stopped the run.
    let st = w.root.wait_final(c.id, T);
    ended_as(c, &st, "cancelled", "lease_expired");
    c.wait_gone(&workload, "the workload");
    w.net().restore();
    let status = w.one_shot_exits("--status", c.id, 124);
    let v = record(&status);
    ended_as(c, &v, "cancelled", "lease_expired");
    w.assert_client_cleaned_up();
}

#[test]
fn ctrl_c_with_the_link_up_stops_the_remote_tree() {
    let w = World::loopback();
    let (c, run, _, workload) = w.start("int-up", "30s", &tree(2, true));
    run.signal(libc::SIGINT);
    let out = finish(&w, c.id, run, 143);
    c.wait_gone(&workload, "the workload");
    let st = w.root.status(c.id);
    ended_as(c, &st, "cancelled", "cancel_request");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // One line says how it ended; the record is not dumped.
    ensure!(
        c,
        stderr.contains("run int-up: cancelled (cancel_request) after ") && !stderr.contains('{'),
        "no one-line outcome printed: {stderr}"
    );
    w.assert_client_cleaned_up();
}

#[test]
fn ctrl_c_with_the_link_down_cancels_once_the_link_is_back() {
    let w = World::split();
    let (c, run, ready, workload) = w.start("int-down", "20s", &tree(2, false));
    // Down at the server's end: packets vanish, reconnection attempts hang to their timeout.
    w.net().blackhole();
    run.signal(libc::SIGINT);
    wait_for_text("lost the stream", T, || run.stderr_so_far());
    wait_for_text("cannot reach", T, || run.stderr_so_far());
    c.eq(
        &workload.alive(),
        &ready.all_pids(),
        "the cancel cannot have reached the host",
    );
    w.net().restore_server();
    let out = finish(&w, c.id, run, 143);
    c.wait_gone(&workload, "the workload");
    let st = w.root.status(c.id);
    c.fields(
        &st,
        &describe_output("remote", &out),
        ended("cancelled", "cancel_request"),
    );
    w.assert_client_cleaned_up();
}

#[test]
fn an_earlier_run_can_be_attached_to_queried_and_cancelled() {
    let w = World::loopback();
    let (c, first, _, workload) = w.start("earlier", "30s", &tree(1, false));
    let attached = Spawned::spawn(&mut w.one_shot("--attach", c.id));
    wait_for_text("ready ", T, || attached.stdout_so_far());

    let status = w.one_shot_exits("--status", c.id, 75);
    c.eq(
        &record(&status)["state"].as_str(),
        &Some("running"),
        "record(&status)[\"state\"].as_str()",
    );

    let cancel = w.one_shot_exits("--cancel", c.id, 0);
    c.eq(
        &record(&cancel)["state"].as_str(),
        &Some("cancelled"),
        "record(&cancel)[\"state\"].as_str()",
    );
    c.wait_gone(&workload, "the workload");

    finish(&w, c.id, first, 143);
    let out = finish(&w, c.id, attached, 143);
    ensure!(
        c,
        String::from_utf8_lossy(&out.stdout).starts_with("ready "),
        "String::from_utf8_lossy(&out.stdout).starts_with(\"ready \")"
    );
    w.one_shot_exits("--status", c.id, 143);
    w.assert_client_cleaned_up();
}

#[test]
fn an_unreachable_host_starts_nothing_and_says_so() {
    let w = World::loopback();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(agent_run_bin());
    cmd.arg("remote")
        .args(["--ssh-option=-F", "--ssh-option=/dev/null"])
        .arg(format!("--ssh-option=-oPort={port}"))
        .args(["--id", "never", "root@127.0.0.1", "--", "true"])
        .env("XDG_RUNTIME_DIR", &w.xdg)
        .stdin(Stdio::null());
    let out = run_out(cmd);
    assert_eq!(
        exit_code(&out.status),
        75,
        "{}",
        describe_output("remote", &out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("agent-run: run id never on root@127.0.0.1\n"),
        "{stderr}"
    );
    assert!(stderr.contains("run never was not started"), "{stderr}");
    assert!(
        !w.root.run_dir("never").exists(),
        "!w.root.run_dir(\"never\").exists()"
    );
    w.assert_client_cleaned_up();
}

fn run_out(mut cmd: Command) -> Output {
    Spawned::spawn(&mut cmd).finish(T * 2)
}

/// Not a check: the cost of `remote` over plain ssh for `true`, printed (run with --ignored
/// --nocapture).
#[test]
#[ignore]
fn latency_of_remote_over_plain_ssh() {
    let w = World::loopback();
    let opts = w.srv.ssh_options();
    let host = w.srv.host();
    let n = 15;
    let median = |mut make: Box<dyn FnMut(usize) -> Command>| {
        let mut times: Vec<f64> = (0..n)
            .map(|i| {
                let mut cmd = make(i);
                let t = Instant::now();
                let out = cmd.stdin(Stdio::null()).output().unwrap();
                assert!(out.status.success(), "{}", describe_output("", &out));
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[n / 2]
    };
    let plain = |extra: Vec<String>, script: String| {
        let (opts, host) = (opts.clone(), host.clone());
        Box::new(move |_| {
            let mut c = Command::new("ssh");
            c.args(&extra).args(&opts).arg(&host).arg(&script);
            c
        }) as Box<dyn FnMut(usize) -> Command>
    };
    let cold_plain = median(plain(vec![], "true".into()));
    let cold_remote = median(Box::new(|_| w.run(&[], &["true"])));
    // A warm master of the user's own: plain ssh over it, and what agent-run adds on the host.
    let cm = w.root.dir.path().join("user-cm");
    let master = ["-o".to_string(), format!("ControlPath={}", cm.display())];
    let mut m = Command::new("ssh");
    m.args(&master)
        .args([
            "-o",
            "ControlMaster=yes",
            "-o",
            "ControlPersist=30",
            "-N",
            "-f",
        ])
        .args(&opts)
        .arg(&host);
    assert!(
        m.status().unwrap().success(),
        "m.status().unwrap().success()"
    );
    let warm_plain = median(plain(master.to_vec(), "true".into()));
    let bin = agent_run_bin();
    let root = w.root.root();
    let warm_agent = median(Box::new(|i| {
        let script = format!(
            "'{b}' --root '{r}' start --detach --lease 60s lat{i} -- true >/dev/null || exit; exec '{b}' --root '{r}' attach lat{i}",
            b = bin.display(),
            r = root.display()
        );
        let mut c = Command::new("ssh");
        c.args(&master).args(&opts).arg(&host).arg(script);
        c
    }));
    let _ = Command::new("ssh")
        .args(&master)
        .args(["-O", "exit"])
        .args(&opts)
        .arg(&host)
        .output();
    println!("median of {n} runs of `true` (ms):");
    println!(
        "  cold: plain ssh {cold_plain:.1}, agent-run remote {cold_remote:.1}, added {:.1}",
        cold_remote - cold_plain
    );
    println!("  warm master: plain ssh {warm_plain:.1}, start --detach + attach over it {warm_agent:.1}, added {:.1}", warm_agent - warm_plain);
    println!(
        "  agent-run remote (private master, always cold) over warm plain ssh: added {:.1}",
        cold_remote - warm_plain
    );
}
