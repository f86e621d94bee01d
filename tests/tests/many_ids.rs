//! Subcommands that take many run ids at once: `cancel` of a hundred runs in one call, and
//! `status`, `renew` and `wait` saying which id failed.
//!
//! Every process a test starts is pinned with a pidfd after the fixture's ready line and
//! checked in /proc; every run is final (or cancelled) before the test ends.

use std::time::{Duration, Instant};

use agent_run_tests::cli::*;
use agent_run_tests::ctx::T;
use agent_run_tests::{ctx, describe_output, ensure, exit_code, Spawned, TestRoot};

// ---------------------------------------------------------------------------------------------
// Many ids at once

#[test]
fn a_hundred_runs_are_cancelled_in_one_call() {
    let root = TestRoot::exclusive_cpu();
    const N: usize = 100;
    let runs: Vec<DetachedTree> = (0..N)
        .map(|i| {
            detached(
                &root,
                &format!("many-{i:03}"),
                &["--label", "batch=b1"],
                &["--children", "0"],
            )
        })
        .collect();
    let mut args = vec!["cancel", "--json"];
    let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
    args.extend(ids.iter().map(String::as_str));
    let t0 = Instant::now();
    let out = ar_code(&root, &args, 0);
    let took = t0.elapsed();
    eprintln!("cancel of {N} runs in one call took {took:?}");
    let doc = json_of(&out);
    let docs = doc.as_array().expect("one JSON array");
    assert_eq!(docs.len(), N, "docs.len()");
    for (d, id) in docs.iter().zip(&ids) {
        let c = ctx(&root, id);
        c.eq(&d["run_id"].as_str(), &Some(id.as_str()), "order");
        c.eq(
            &(
                d["state"].as_str(),
                d["reason"].as_str(),
                d["final"].as_bool(),
            ),
            &(Some("cancelled"), Some("cancel_request"), Some(true)),
            format_args!("{d:#}"),
        );
    }
    for r in &runs {
        r.assert_gone(&root, "after the many-id cancel");
    }
    // Concurrent: far less than 100 sequential cancels (each waits for its wrapper's stop).
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // The selector forms: nothing active is left to cancel; status sees all of them.
    let again = json_of(&ar_code(
        &root,
        &["cancel", "--json", "--label", "batch=b1"],
        0,
    ));
    assert_eq!(again, serde_json::json!([]), "again");
    let all = json_of(&ar_code(&root, &["status", "--json", "--all"], 0));
    assert_eq!(
        all.as_array().unwrap().len(),
        N,
        "all.as_array().unwrap().len()"
    );
}

#[test]
fn status_renew_and_wait_take_several_ids_and_say_which_failed() {
    let root = TestRoot::sharing_cpu();
    let c = ctx(&root, "live");
    ar_code(&root, &["done0", "--", "true"], 0);
    ar_code(&root, &["done3", "--", "sh", "-c", "exit 3"], 3);
    let live = detached(&root, "live", &["--lease", "60s"], &["--children", "0"]);

    // status: one array in the order asked, an error entry for a missing run, its code.
    let out = ar_code(&root, &["status", "--json", "done3", "nope", "done0"], 69);
    let doc = json_of(&out);
    let ids: Vec<&str> = doc
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["run_id"].as_str().unwrap())
        .collect();
    c.eq(&ids, &["done3", "nope", "done0"], "ids");
    c.eq(
        &doc[1]["error_exit_code"],
        69,
        "doc[1][\"error_exit_code\"]",
    );
    ensure!(c, doc[1]["state"].is_null(), "doc[1][\"state\"].is_null()");
    c.eq(
        &doc[0]["outcome_exit_code"],
        3,
        "doc[0][\"outcome_exit_code\"]",
    );

    // wait: all (default) exits with the first non-zero code; --any with the first final.
    ar_code(&root, &["wait", "done0", "done3"], 3);
    ar_code(&root, &["wait", "done3", "done0"], 3);
    ar_code(&root, &["wait", "--any", "done0", "live"], 0);
    let out = ar_code(&root, &["wait", "--timeout", "300ms", "done0", "live"], 75);
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("live (running)"),
        "String::from_utf8_lossy(&out.stderr).contains(\"live (running)\")"
    );
    ar_code(&root, &["wait", "nope", "live"], 69);

    // renew: the final run cannot be renewed (69), the live one is.
    let out = ar_code(
        &root,
        &["renew", "--json", "--lease", "90s", "done0", "live"],
        69,
    );
    let doc = json_of(&out);
    c.eq(
        &doc[0]["error_exit_code"],
        69,
        "doc[0][\"error_exit_code\"]",
    );
    c.eq(&doc[1]["run_id"], "live", "doc[1][\"run_id\"]");
    c.eq(&doc[1]["lease_s"], 90.0, "doc[1][\"lease_s\"]");
    let renewed = json_of(&ar_code(&root, &["renew", "--json", "--all"], 0));
    c.eq(
        &renewed.as_array().unwrap().len(),
        &1,
        format_args!("{renewed:#}"),
    );

    // wait for a run that another connection cancels: the wait --json gives its record.
    let waiter = Spawned::wrapper(&root, &["wait", "--json", "live", "done0"]);
    ar_code(&root, &["cancel", "live"], 0);
    let out = waiter.finish(T);
    c.eq(
        &exit_code(&out.status),
        &143,
        format_args!("{}", describe_output("wait", &out)),
    );
    let doc = json_of(&out);
    c.eq(&doc[0]["state"], "cancelled", "doc[0][\"state\"]");
    live.assert_gone(&root, "after the cancel");
    ar_code(&root, &["status"], 64);
}
