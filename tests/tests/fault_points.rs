//! A wrapper SIGKILLed at each fault point the product declares (`agent_run_shared::fault::POINTS`)
//! leaves a run that `cancel` or the watchdog finishes truthfully, and status.json is a whole
//! document at every moment (hazard H-1).
//!
//! The standard is the seed ADR's (`docs/references.md`): name the hazard, name the causal
//! scenario, and prove with real processes that the constraint holds. Every process a test sees is
//! pinned with a pidfd right after the fixture's ready line, asserted on through /proc (a zombie is
//! dead), and SIGKILLed by pid when the test ends. Run ids start with `rel-`.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use agent_run_shared::fault;
use agent_run_tests::contain::marked;
use agent_run_tests::facts::cleanup_signals;
use agent_run_tests::hazards::*;
use agent_run_tests::workload::{fx_args, start_argv};
use agent_run_tests::{ctx, describe_output, ensure, Pinned, Spawned, TestRoot, RECORD_KEYS};
use serde_json::Value;

// =============================================================================================
// 1. Fault points: the wrapper SIGKILLed at each step of a launch and of a stop.

/// How a test brings the wrapper to its fault point.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Drive {
    /// The point is on the launch path: the wrapper dies there by itself.
    Launch,
    /// The point is on the stop path: TERM the wrapper once the run is running.
    Stop,
}

/// What of the run is left when the wrapper is dead, before anyone finishes the run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Left {
    /// Nothing was ever spawned.
    NothingSpawned,
    /// The whole tree runs on, unsignalled.
    WholeTree,
    /// The leader died of the first TERM; its members (TERM and HUP ignorers) run on.
    Members,
    /// The wrapper's stop reached KILL (or completed): nothing is left.
    NothingAfterStop,
}

struct FaultCase {
    point: &'static str,
    drive: Drive,
    /// The record's state when the wrapper died; None: no status.json yet.
    at_fault: Option<&'static str>,
    left: Left,
}

/// One case per fault point, in the order of `fault::POINTS`.
const FAULT_CASES: [FaultCase; 9] = [
    FaultCase {
        point: "after_run_dir",
        drive: Drive::Launch,
        at_fault: None,
        left: Left::NothingSpawned,
    },
    FaultCase {
        point: "after_starting",
        drive: Drive::Launch,
        at_fault: Some("starting"),
        left: Left::NothingSpawned,
    },
    FaultCase {
        point: "after_spawn",
        drive: Drive::Launch,
        at_fault: Some("starting"),
        left: Left::WholeTree,
    },
    FaultCase {
        point: "before_running",
        drive: Drive::Launch,
        at_fault: Some("starting"),
        left: Left::WholeTree,
    },
    FaultCase {
        point: "after_term",
        drive: Drive::Stop,
        at_fault: Some("cancelling"),
        left: Left::Members,
    },
    FaultCase {
        point: "after_hup",
        drive: Drive::Stop,
        at_fault: Some("cancelling"),
        left: Left::Members,
    },
    FaultCase {
        point: "after_kill",
        drive: Drive::Stop,
        at_fault: Some("cancelling"),
        left: Left::NothingAfterStop,
    },
    FaultCase {
        point: "before_final",
        drive: Drive::Stop,
        at_fault: Some("cancelling"),
        left: Left::NothingAfterStop,
    },
    // status.json already exists at the first rewrite, `starting` -> `running`: the wrapper dies
    // there with half the `running` record in its temp file.
    FaultCase {
        point: "mid_record_write",
        drive: Drive::Launch,
        at_fault: Some("starting"),
        left: Left::WholeTree,
    },
];

/// Who finishes the run once its wrapper is dead.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Finisher {
    Cancel,
    Watchdog,
}

impl Finisher {
    /// The `by` of its journal lines.
    fn role(self) -> &'static str {
        match self {
            Finisher::Cancel => "cancel",
            Finisher::Watchdog => "watchdog",
        }
    }

    /// The reason of a run it found processes of and stopped.
    fn reason(self) -> &'static str {
        match self {
            Finisher::Cancel => "cancel_request",
            Finisher::Watchdog => "wrapper_lost",
        }
    }
}

/// Wrapper journal marks: event names, plus `signal:NAME` for each signal sent.
fn marks(events: &[&Value]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in events {
        let name = e["event"].as_str().unwrap_or_default();
        out.insert(name.to_string());
        if name == "signal" {
            out.insert(format!("signal:{}", e["signal"].as_str().unwrap_or("?")));
        }
    }
    out
}

/// What the wrapper's own journal lines must and must not show, per point: the proof that it
/// died where the point says.
fn wrapper_journal_rules(point: &str) -> (&'static [&'static str], &'static [&'static str]) {
    match point {
        "after_run_dir" | "after_starting" => (&[], &["launch", "spawn", "state"]),
        "after_spawn" | "before_running" | "mid_record_write" => (&["launch"], &["spawn"]),
        "after_term" | "after_hup" => (
            &["spawn", "stop_requested", "signal:TERM"],
            &["signal:KILL", "stop_end"],
        ),
        "after_kill" => (
            &["spawn", "stop_requested", "signal:TERM", "signal:KILL"],
            &["stop_end"],
        ),
        "before_final" => (&["spawn", "stop_requested", "stop_end"], &[]),
        other => panic!("no journal rules for fault point {other}"),
    }
}

/// Whether the journal names `pid` as the target of a signal sent by `by`: itself, or its group.
fn signalled_in_journal(events: &[Value], by: &str, pid: i32, pgid: i32) -> bool {
    named(events, "signal").iter().any(|e| {
        e["by"] == by
            && (e["pid"].as_i64() == Some(pid.into())
                || e["target"] == format!("pid:{pid}")
                || e["target"] == format!("group:{pgid}"))
    })
}

/// Pushes the run dir's mtime a minute into the past: what the watchdog sees of a run dir whose
/// wrapper died at `mkdir` a minute ago (it leaves younger record-less dirs to their launch).
fn age_run_dir(dir: &Path) {
    let then = SystemTime::now() - Duration::from_secs(60);
    fs::File::open(dir)
        .and_then(|f| f.set_modified(then))
        .unwrap_or_else(|e| panic!("cannot age {}: {e}", dir.display()));
}

fn fault_case(point: &str) -> &'static FaultCase {
    FAULT_CASES
        .iter()
        .find(|c| c.point == point)
        .unwrap_or_else(|| panic!("no fault case for point {point}"))
}

/// One fault test: its run root, its case, its finisher, and the record watcher.
struct FaultRun {
    root: TestRoot,
    id: String,
    case: &'static FaultCase,
    finisher: Finisher,
    watch: RecordWatch,
}

/// Start a run with `AGENT_RUN_FAULT=<point>`, bring the wrapper to the point, let it die, then
/// finish the run with `finisher` and check that the outcome is final, whole and truthful.
fn wrapper_killed_at(point: &str, finisher: Finisher) {
    let root = TestRoot::sharing_cpu();
    let id = format!("rel-fault-{point}-by-{}", finisher.role());
    let watch = RecordWatch::start(root.run_dir(&id).join("status.json"));
    let run = FaultRun {
        root,
        id,
        case: fault_case(point),
        finisher,
        watch,
    };
    let tree = run.die_at_the_point();
    run.check_what_was_left(tree.as_ref());
    let alive_before = tree.as_ref().map(Tree::alive).unwrap_or_default();
    let printed = run.finish();
    let state = run.check_final_record(printed.as_ref(), tree.as_ref(), &alive_before);
    run.check_journal(&state, tree.as_ref(), &alive_before);
    let FaultRun {
        root, id, watch, ..
    } = run;
    let c = ctx(&root, &id);
    let seen = watch.finish();
    ensure!(
        c,
        seen.partial.is_empty(),
        "status.json was seen partial {} times in {} reads: {:?}",
        seen.partial.len(),
        seen.reads,
        seen.partial.first()
    );
    c.eq(
        &seen.states.last(),
        &Some(&state),
        format_args!("the last state the watcher saw (all: {:?})", seen.states),
    );
}

impl FaultRun {
    /// Starts the wrapper with the fault armed and waits for it to die of SIGKILL. Stop points:
    /// the tree is pinned before the fault, then TERM starts the stop. Launch points that got
    /// as far as spawning: the tree comes up without its wrapper and is pinned after.
    fn die_at_the_point(&self) -> Option<Tree> {
        let (root, id, point) = (&self.root, self.id.as_str(), self.case.point);
        let mut cmd = agent_run(root);
        cmd.args(start_argv(
            &["--quiet", "--grace", "1s", "--hup-after", "500ms"],
            id,
            &fx_args(&STUBBORN_MEMBERS),
        ))
        .env(fault::ENV, point);
        let wrapper = Spawned::spawn(&mut cmd);
        let wrapper_pin = Pinned::new(&[wrapper.child.id() as i32]);
        let mut tree = None;
        if self.case.drive == Drive::Stop {
            wait_state(root, id, &["running"]);
            tree = Some(pin_tree(root, id));
            wrapper.signal(libc::SIGTERM);
        }
        let what = wrapper.what.clone();
        let out = wrapper.finish(CMD);
        ctx(root, id).eq(
            &out.status.signal(),
            &Some(libc::SIGKILL),
            format_args!(
                "the wrapper must die of SIGKILL at {point}\n{}",
                describe_output(&what, &out)
            ),
        );
        wait_gone(root, id, &wrapper_pin, "the wrapper");
        if self.case.left == Left::WholeTree {
            tree = Some(pin_tree(root, id));
        }
        tree
    }

    /// The record the wrapper left (whole), and what of the run is alive, as the case says.
    fn check_what_was_left(&self, tree: Option<&Tree>) {
        let (root, id, point) = (&self.root, self.id.as_str(), self.case.point);
        let dir = root.run_dir(id);
        let left_behind = observe(root, id, "right after the fault");
        ctx(root, id).eq(
            &left_behind.as_ref().map(|st| st["state"].clone()),
            &self.case.at_fault.map(Value::from),
            format_args!("the record the wrapper left at {point}"),
        );
        if point == "mid_record_write" {
            self.check_half_written_temp_record();
        }
        match self.case.left {
            Left::NothingSpawned => {
                ensure!(
                    ctx(root, id),
                    marked(&dir).is_empty() && !dir.join("stdout.log").exists(),
                    "nothing was spawned, yet the run has processes or a workload log"
                );
            }
            Left::WholeTree => {}
            Left::Members => {
                let t = tree.expect("a pinned tree");
                wait_gone(root, id, &t.leader, "the leader after the first TERM");
                ctx(root, id).eq(
                    &sorted(t.members.alive()),
                    &sorted(t.ready.members.clone()),
                    "the members ignore TERM and HUP and must outlive the wrapper",
                );
            }
            Left::NothingAfterStop => {
                let t = tree.expect("a pinned tree");
                wait_gone(root, id, &t.leader, "the leader after the wrapper's stop");
                wait_gone(root, id, &t.members, "the members after the wrapper's stop");
            }
        }
    }

    /// The wrapper died in the middle of writing `running`: its temp file holds half a record.
    fn check_half_written_temp_record(&self) {
        let (root, id) = (&self.root, self.id.as_str());
        let dir = root.run_dir(id);
        let halves: Vec<String> = fs::read_dir(&dir)
            .expect("the run dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".status.json.") && n.ends_with(".tmp"))
            .collect();
        ensure!(
            ctx(root, id),
            halves.len() == 1,
            "one half-written temp record expected, found {halves:?}"
        );
        let half = fs::read_to_string(dir.join(&halves[0])).unwrap_or_default();
        ensure!(
            ctx(root, id),
            !half.is_empty() && serde_json::from_str::<Value>(&half).is_err(),
            "the temp record should hold half a document: {half:?}"
        );
    }

    /// Brings the run to a final record from outside; returns what `cancel` printed.
    fn finish(&self) -> Option<Value> {
        let (root, id) = (&self.root, self.id.as_str());
        match self.finisher {
            Finisher::Cancel => {
                let out = ctl(root, id, &["cancel", "--json", id], 0);
                Some(json_doc(root, id, "cancel", &out))
            }
            Finisher::Watchdog => {
                if self.case.point == "after_run_dir" {
                    // A record-less dir this young may be a launch in progress: left alone.
                    watchdog_once(root, id);
                    ensure!(
                        ctx(root, id),
                        observe(root, id, "after a watchdog pass on a young dir").is_none(),
                        "the watchdog wrote a record for a run dir seconds old"
                    );
                    age_run_dir(&root.run_dir(id));
                }
                watchdog_once(root, id);
                None
            }
        }
    }

    /// The record is final, whole and truthful, and no process of the run outlives it. Returns
    /// its state.
    fn check_final_record(
        &self,
        printed: Option<&Value>,
        tree: Option<&Tree>,
        alive_before: &[i32],
    ) -> String {
        let (root, id) = (&self.root, self.id.as_str());
        let st = observe(root, id, "after the finisher")
            .unwrap_or_else(|| ctx(root, id).fail("no status.json after the finisher"));
        for key in RECORD_KEYS {
            ensure!(
                ctx(root, id),
                st.get(key).is_some(),
                "the record has no {key:?}"
            );
        }
        ctx(root, id).eq(&st["run_id"], id, "run_id");
        let state = st["state"].as_str().unwrap_or_default();
        if let Some(p) = printed {
            for key in ["state", "reason", "ended_at", "cleanup"] {
                ctx(root, id).eq(&p[key], &st[key], format_args!("cancel's printed {key}"));
            }
        }
        let survivors: Vec<i32> = tree.map(Tree::alive).unwrap_or_default();
        ensure!(
            ctx(root, id),
            survivors.is_empty(),
            "the record is final ({state}) but pids {survivors:?} of the run are alive"
        );
        assert_no_strays(root, id, "after the final record");
        ensure!(
            ctx(root, id),
            cleanup_pids(&st, "survivors").is_empty(),
            "survivors listed in the final record"
        );
        if alive_before.is_empty() {
            ctx(root, id).eq(
                &(state, st["reason"].as_str()),
                &("unknown", Some("wrapper_lost")),
                "nothing of the run remained: the outcome is unknown",
            );
        } else {
            // The reason is the finisher's, or the one the dead wrapper's stop began with.
            let reasons = match self.case.at_fault {
                Some("cancelling") => vec![self.finisher.reason(), "signal:TERM"],
                _ => vec![self.finisher.reason()],
            };
            ensure!(
                ctx(root, id),
                state == "cancelled" && st["reason"].as_str().is_some_and(|r| reasons.contains(&r)),
                "processes remained and were stopped: the run is cancelled ({reasons:?}), not \
                 {state} ({})",
                st["reason"]
            );
            let signalled = cleanup_pids(&st, "signalled");
            let missing: Vec<&i32> = alive_before
                .iter()
                .filter(|p| !signalled.contains(p))
                .collect();
            ensure!(
                ctx(root, id),
                missing.is_empty(),
                "cleanup.signalled {signalled:?} lacks {missing:?}, alive before the finisher"
            );
            ensure!(
                ctx(root, id),
                cleanup_signals(&st).iter().any(|s| s == "KILL"),
                "TERM and HUP ignorers need KILL: cleanup.signals {:?}",
                cleanup_signals(&st)
            );
        }
        if self.case.point == "after_run_dir" {
            ensure!(
                ctx(root, id),
                st["pid"].is_null() && st["error"].as_str().is_some_and(|e| !e.is_empty()),
                "a lost launch is recorded whole: no pid, and an error saying why"
            );
        }
        state.to_string()
    }

    /// The journal parses line by line, shows the wrapper's steps up to its death and nothing
    /// after, one takeover and one final transition by the finisher, and a signal from the
    /// finisher to every process that was still alive.
    fn check_journal(&self, state: &str, tree: Option<&Tree>, alive_before: &[i32]) {
        let (root, id, point) = (&self.root, self.id.as_str(), self.case.point);
        let role = self.finisher.role();
        let events = root.events(id);
        let finals = final_state_events(&events);
        ctx(root, id).eq(&finals.len(), &1, "transitions to a final state");
        ctx(root, id).eq(
            &(finals[0]["by"].as_str(), finals[0]["to"].as_str()),
            &(Some(role), Some(state)),
            "the final transition",
        );
        let takeovers: Vec<Option<&str>> = named(&events, "takeover")
            .iter()
            .map(|e| e["by"].as_str())
            .collect();
        // A run dir without a record is taken over too: the run's marker is looked for (the
        // workload may have removed the record), and nothing is found.
        ctx(root, id).eq(&takeovers, &vec![Some(role)], "takeover events");
        let wrapper_marks = marks(&events_by(&events, "wrapper"));
        let (must, must_not) = wrapper_journal_rules(point);
        for m in must {
            ensure!(
                ctx(root, id),
                wrapper_marks.contains(*m),
                "the wrapper's journal lacks {m:?} at {point}: {wrapper_marks:?}"
            );
        }
        for m in must_not {
            ensure!(
                ctx(root, id),
                !wrapper_marks.contains(*m),
                "the wrapper's journal has {m:?}, yet it died at {point}: {wrapper_marks:?}"
            );
        }
        if point == "after_hup" {
            // The HUP step (not only the at-once HUP to TERM ignorers) was reached: at 500 ms.
            let stepped = named(&events, "signal").iter().any(|e| {
                e["by"] == "wrapper" && e["signal"] == "HUP" && e["at_ms"].as_u64() >= Some(500)
            });
            ensure!(ctx(root, id), stepped, "no HUP from the wrapper's HUP step");
        }
        if let Some(t) = tree {
            for &pid in alive_before {
                let pgid = t.pgid_of.get(&pid).copied().unwrap_or(pid);
                ensure!(
                    ctx(root, id),
                    signalled_in_journal(&events, role, pid, pgid),
                    "the journal names no signal from {role} to {pid}"
                );
            }
        }
    }
}

/// One test per fault point and finisher; `COVERED_POINTS` is what the macro generated, checked
/// against `fault::POINTS` below so that a new point cannot go untested.
macro_rules! fault_point_tests {
    ($($point:ident),+ $(,)?) => {
        const COVERED_POINTS: &[&str] = &[$(stringify!($point)),+];

        mod a_wrapper_killed_at_each_fault_point_is_finished_truthfully_by_cancel {
            $(
                #[test]
                fn $point() {
                    super::wrapper_killed_at(stringify!($point), super::Finisher::Cancel);
                }
            )+
        }

        mod a_wrapper_killed_at_each_fault_point_is_finished_truthfully_by_the_watchdog {
            $(
                #[test]
                fn $point() {
                    super::wrapper_killed_at(stringify!($point), super::Finisher::Watchdog);
                }
            )+
        }
    };
}

fault_point_tests!(
    after_run_dir,
    after_starting,
    after_spawn,
    before_running,
    after_term,
    after_hup,
    after_kill,
    before_final,
    mid_record_write,
);

#[test]
fn the_fault_tests_cover_every_fault_point_the_product_declares() {
    assert_eq!(
        COVERED_POINTS,
        fault::POINTS,
        "the fault tests and agent_run_shared::fault::POINTS disagree: add the new point to \
         fault_point_tests! and FAULT_CASES"
    );
    let cases: Vec<&str> = FAULT_CASES.iter().map(|c| c.point).collect();
    assert_eq!(
        cases,
        fault::POINTS,
        "FAULT_CASES and fault::POINTS disagree"
    );
}
