//! `agent-run-watchdog --once` stops an orphan past its orphan grace.
//!
//! Every test drives the real binaries and asserts on facts (the run root's contents, files a
//! command would have created, /proc, status.json), not on messages alone. Run ids start with `fc-`.

use std::time::Duration;

use agent_run_shared::time::epoch_now;
use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::facts::ended;
use agent_run_tests::{
    ctx, describe_output, ensure, fixture_bin, run_with_timeout, wait_ready, wait_until_dbg,
    Pinned, TestRoot,
};
use serde_json::json;

// =============================================================================================
// The watchdog's --once pass

/// A lease-less run whose wrapper was kill -9ed is left alone by `--once` within its orphan
/// grace and stopped by the first `--once` pass after it, counted from the wrapper's death
/// (its last heartbeat), not from the first time a pass saw it: `cancelled`, `wrapper_lost`,
/// every process gone. Before: `--once` never stopped it.
#[test]
fn watchdog_once_stops_an_orphan_past_its_orphan_grace() {
    let root = TestRoot::swept();
    let id = "fc-orphan";
    let c = ctx(&root, id);
    let fx = fixture_bin();
    let fx = fx.to_str().unwrap();
    ar_code(
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
    c.record("the record", json!({"state": "running"}));

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
    c.fields(&st, "the final record", ended("cancelled", "wrapper_lost"));
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
