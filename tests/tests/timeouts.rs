//! `--timeout`, the wrapper's and the watchdog's: a foreground run stops with 124 and says so,
//! renewals do not extend it, a stopped or killed wrapper's timeout is kept by the watchdog, and
//! `remote` passes it to the host.
//!
//! Every process a test starts is pinned with a pidfd after the fixture's ready line and
//! checked in /proc; every run is final (or cancelled) before the test ends.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::facts::ended;
use agent_run_tests::hostile::Daemon;
use agent_run_tests::remote::SshServer;
use agent_run_tests::workload::fixture_path;
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, ensure, exit_code, proc_stat, run_with_timeout,
    wait_ready, wait_until_dbg, Pinned, Spawned, TestRoot,
};

// Tests that measure lateness, or load the machine (100 runs at once), run alone; the others
// share the machine among themselves.
// (agent_run_tests::facts::{shared_cpu, exclusive_cpu})

fn ar_path() -> String {
    agent_run_bin().display().to_string()
}

/// The p-th percentile (0..=100) of `v`, nearest rank.
fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

// ---------------------------------------------------------------------------------------------
// --timeout

#[test]
fn a_timeout_stops_a_foreground_run_with_124_and_says_so() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "tmo");
    let fx = fixture_path();
    let run = Spawned::wrapper(
        &root,
        &[
            "--timeout",
            "1500ms",
            "tmo",
            "--",
            &fx,
            "tree",
            "--children",
            "2",
            "--grandchildren",
        ],
    );
    let ready = wait_ready(&root.run_dir("tmo").join("stdout.log"), T);
    let tree = Pinned::new(&ready.all_pids());
    let out = run.finish(T);
    let what = describe_output("start --timeout 1500ms", &out);
    c.eq(&exit_code(&out.status), &124, format_args!("{what}"));
    tree.wait_all_gone(T)
        .unwrap_or_else(|left| c.fail(format_args!("left after the timeout: {left:?}\n{what}")));
    let st = root.status("tmo");
    c.eq(
        &(
            st["state"].as_str(),
            st["reason"].as_str(),
            st["timeout_ms"].as_u64(),
        ),
        &(Some("cancelled"), Some("timeout"), Some(1500)),
        format_args!("{st:#}"),
    );
    let ran = epoch(&st, "ended_at") - epoch(&st, "started_at");
    ensure!(c, ran >= 1.5, "stopped {ran:.3}s after the start: early");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        stderr.contains("agent-run: timeout of 1.5s reached: stopping run tmo (TERM sent"),
        "{what}"
    );
    ensure!(
        c,
        stderr.contains("agent-run: run tmo: cancelled (timeout) after")
            && stderr.contains("exit 124"),
        "{what}"
    );
    ar_code(&root, &["wait", "tmo"], 124);
    let doc = json_of(&ar_code(&root, &["status", "--json", "tmo"], 0));
    c.eq(&doc["outcome_exit_code"], 124, "doc[\"outcome_exit_code\"]");
    let events: Vec<String> = root.event_names("tmo");
    ensure!(c, events.iter().any(|e| e == "timeout"), "{events:?}");
}

#[test]
fn renewals_do_not_extend_a_timeout() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "renewed");
    let run = detached(
        &root,
        "renewed",
        &["--lease", "1s", "--timeout", "2500ms"],
        &[],
    );
    let t0 = Instant::now();
    // The controller renews the lease all along; the timeout still ends the run.
    let st = wait_until_dbg("the final record", T, || {
        let st = root.try_status("renewed")?;
        if st["state"] == "cancelled" || st["state"] == "finished" {
            return Ok(st);
        }
        let out = ar(&root, &["renew", "renewed"]);
        if t0.elapsed() > Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!(
            "{} / renew exit {}",
            st["state"],
            exit_code(&out.status)
        ))
    });
    c.eq(&st["reason"], "timeout", format_args!("{st:#}"));
    run.assert_gone(&root, "after the timeout");
    ar_code(&root, &["wait", "renewed"], 124);
}

#[test]
fn the_watchdog_stops_a_run_whose_wrapper_was_killed_at_its_timeout() {
    let root = TestRoot::exclusive_cpu();
    fs::create_dir(root.root()).unwrap();
    fs::set_permissions(root.root(), fs::Permissions::from_mode(0o700)).unwrap();
    let watchdog = Daemon::start(root.watchdog_cmd(), &["--scan-interval", "30s"]);
    const N: usize = 24;
    // Deadlines 40 ms apart from a common start, whatever the launches take: run i's timeout
    // counts from its own start. The start leaves room for N launches at three times the pace
    // of one measured now (a loaded machine launches slower), and 6 s at least.
    let t = Instant::now();
    ar_code(&root, &["--quiet", "pace", "--", "true"], 0);
    let room = (t.elapsed() * 3 * N as u32).max(Duration::from_secs(6));
    let base = Instant::now() + room;
    let runs: Vec<DetachedTree> = (0..N)
        .map(|i| {
            let due = base + Duration::from_millis(40 * i as u64);
            let timeout = format!(
                "{}ms",
                due.saturating_duration_since(Instant::now()).as_millis()
            );
            detached(&root, &format!("orphan-{i}"), &["--timeout", &timeout], &[])
        })
        .collect();
    // The wrappers die at once, before any timeout: only the watchdog is left to act.
    for r in &runs {
        r.wrapper_pin.signal(r.wrapper, libc::SIGKILL).unwrap();
        ctx(&root, &r.id).wait_gone(&r.wrapper_pin, "the SIGKILLed wrapper");
    }
    assert!(
        Instant::now() + Duration::from_millis(500) < base,
        "launching {N} runs took too long to measure anything: the machine is overloaded"
    );
    let mut lateness_ms = Vec::new();
    for r in &runs {
        let c = ctx(&root, &r.id);
        let st = root.wait_final(&r.id, T);
        c.fields(&st, "the final record", ended("cancelled", "timeout"));
        r.assert_gone(&root, "after the watchdog's stop");
        let deadline = epoch(&st, "started_at") + st["timeout_ms"].as_f64().unwrap() / 1000.0;
        // The watchdog's first word on the run: when it acted.
        let acted = root
            .events(&r.id)
            .into_iter()
            .find(|e| e["by"] == "watchdog")
            .unwrap_or_else(|| c.fail("no watchdog event"));
        let late = (epoch(&acted, "ts") - deadline) * 1000.0;
        ensure!(
            c,
            late >= -1.5,
            "run {} stopped {late:.1} ms before its timeout",
            r.id
        );
        lateness_ms.push(late);
        ar_code(&root, &["wait", &r.id], 124);
    }
    let (p50, p99) = (
        percentile(&lateness_ms, 50.0),
        percentile(&lateness_ms, 99.0),
    );
    eprintln!(
        "watchdog-enforced timeout lateness over {N} runs: p50 {p50:.1} ms, p99 {p99:.1} ms, max {:.1} ms",
        percentile(&lateness_ms, 100.0)
    );
    // The watchdog's target for deadlines (docs/benchmarks.md): p99 under 100 ms.
    assert!(p99 < 100.0, "p99 lateness {p99:.1} ms: {lateness_ms:?}");
    watchdog.stop_cleanly(ctx(&root, &runs[0].id));
}

#[test]
fn a_stopped_wrapper_past_its_timeout_is_taken_over_by_the_watchdog() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "stuck");
    fs::create_dir(root.root()).unwrap();
    fs::set_permissions(root.root(), fs::Permissions::from_mode(0o700)).unwrap();
    let watchdog = Daemon::start(root.watchdog_cmd(), &["--slack", "1s"]);
    let run = detached(
        &root,
        "stuck",
        &["--timeout", "1500ms", "--grace", "1s"],
        &["--children", "1"],
    );
    // A wrapper that cannot act (SIGSTOPped; a suspended job is the same): the timeout holds.
    run.wrapper_pin.signal(run.wrapper, libc::SIGSTOP).unwrap();
    wait_until_dbg("the wrapper stopped", T, || match proc_stat(run.wrapper) {
        Some(s) if s.0 == 'T' => Ok(()),
        other => Err(other),
    });
    let st = root.wait_final("stuck", T);
    ctx(&root, "stuck").fields(&st, "the final record", ended("cancelled", "timeout"));
    run.assert_gone(&root, "after the watchdog's takeover");
    c.wait_gone(&run.wrapper_pin, "run.wrapper pin");
    // The killed wrapper cannot remove the run's cgroup: the watchdog does.
    c.wait_cgroup_removed(&st, "after the watchdog's takeover");
    let deadline = epoch(&st, "started_at") + 1.5;
    let late = epoch(&st, "ended_at") - deadline;
    ensure!(
        c,
        late >= 2.0 - 0.001,
        "taken over {late:.3}s after the timeout: before grace + slack"
    );
    watchdog.stop_cleanly(c);
}

#[test]
fn remote_timeout_stops_the_run_on_the_host() {
    let srv = SshServer::start_as_root();
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "rt");
    let host = srv.host();
    let fx = fixture_path();
    let out = run_with_timeout(
        &mut remote_cmd(
            &srv,
            &root,
            &ar_path(),
            &[
                "--id",
                "rt",
                "--lease",
                "30s",
                "--timeout",
                "1500ms",
                "--label",
                "job=r",
                &host,
                "--",
                &fx,
                "tree",
                "--children",
                "1",
            ],
        ),
        T * 2,
    );
    c.eq(
        &exit_code(&out.status),
        &124,
        format_args!("{}", describe_output("remote --timeout", &out)),
    );
    let st = root.status("rt");
    c.eq(
        &(
            st["reason"].as_str(),
            st["timeout_ms"].as_u64(),
            st["labels"]["job"].as_str(),
        ),
        &(Some("timeout"), Some(1500), Some("r")),
        format_args!("{st:#}"),
    );
    let ran = epoch(&st, "ended_at") - epoch(&st, "started_at");
    ensure!(c, (1.5..10.0).contains(&ran), "ran {ran}");
}
