//! Reliability of agent-run under faults, full disks, load, and hostile neighbours.
//!
//! The standard is the seed ADR's (`docs/references.md`): name the hazard, name the causal
//! scenario, and prove with real processes that the constraint holds. The losses are the
//! contract's: a process of a run alive after its record says it is over (L-1), a record that is
//! partial, contradictory or missing (L-2), and a process that is not the run's being signalled or
//! a file outside the run dir being written (L-3).
//!
//! | hazard | scenario | tests |
//! |---|---|---|
//! | H-1 the wrapper dies mid-launch or mid-stop and the run is never finished | SIGKILL at every fault point of `agent_run_shared::fault::POINTS` | `a_wrapper_killed_at_each_fault_point_is_finished_truthfully_by_*::<point>` |
//! | H-2 a record write fails and the processes outlive the stop | ENOSPC on a 256 KiB tmpfs, during `cancel` and during TERM to the wrapper | `a_full_disk_*`, `term_to_the_wrapper_on_a_full_disk_*` |
//! | H-3 two parties finish one run (two final records, a double stop) | 200 runs, 3 cancellers per cancelled run, a watchdog daemon; 10 cancellers of one orphan | `two_hundred_concurrent_runs_*`, `ten_concurrent_cancels_*` |
//! | H-4 a symlink or a foreign record redirects a write or a signal | symlinks raced into a launch, swapped in after launch, a run dir of root probed by `nobody`, records naming `nobody`'s process | `*symlink*`, `another_user_*`, `a_forged_record_*` |
//!
//! Every process a test sees is pinned with a pidfd right after the fixture's ready line (before
//! the fault where the fault comes after it), asserted on through /proc (a zombie is dead), and
//! SIGKILLed by pid when the test ends. Waits poll to one generous deadline (two slow cores in
//! CI); nothing sleeps for correctness. status.json is parsed at every observation, and in the
//! fault tests by a background reader for the whole life of the run: it must always be a whole
//! document. Run ids start with `rel-` and are unique in this file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use agent_run_shared::fault;
use agent_run_shared::id::RunId;
use agent_run_shared::record::{State, Status};
use agent_run_shared::root::Root;
use agent_run_tests::contain::marked;
use agent_run_tests::facts::path_str;
use agent_run_tests::facts::{exclusive_cpu, shared_cpu};
use agent_run_tests::hostile::{as_nobody, NOBODY};
use agent_run_tests::wait_run;
use agent_run_tests::workload::{fx_args, start_argv};
use agent_run_tests::Reaper;
use agent_run_tests::{
    agent_run_bin, ctx, describe_output, diagnostics, ensure, exit_code, fixture_bin, parse_ready,
    proc_stat, processes_with_env, run_with_timeout, wait_child, watchdog_bin, Pinned, Ready,
    Spawned, TestRoot, FINAL_STATES, RECORD_KEYS,
};
use serde_json::Value;

/// The deadline for things that normally take milliseconds to a few seconds.
const T: Duration = Duration::from_secs(30);
/// The deadline for one agent-run command to return.
const CMD: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// CPU sharing: the load test runs alone; every other test of this file may run beside the others.

// (agent_run_tests::facts::{shared_cpu, exclusive_cpu})

// ---------------------------------------------------------------------------------------------
// Assertions that explain themselves

// ---------------------------------------------------------------------------------------------
// Commands

/// `agent-run --root <root>` with no fault armed.
fn agent_run(root: &TestRoot) -> Command {
    let mut cmd = root.cmd();
    cmd.env_remove(fault::ENV);
    cmd
}

/// Runs `agent-run --root <root> ARGS...` to completion and checks its exit code.
fn ctl<S: AsRef<str>>(root: &TestRoot, id: &str, args: &[S], want: i32) -> Output {
    let c = ctx(root, id);
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let what = format!("agent-run {}", args.join(" "));
    let out = run_with_timeout(agent_run(root).args(&args), CMD);
    let code = exit_code(&out.status);
    ensure!(
        c,
        code == want,
        "{what} exited {code}, not {want}\n{}",
        describe_output(&what, &out)
    );
    out
}

/// `agent-run-watchdog --root <root> --once --orphan-grace 0`, checked to exit 0.
fn watchdog_once(root: &TestRoot, id: &str) -> Output {
    let c = ctx(root, id);
    let what = "agent-run-watchdog --once --orphan-grace 0";
    let mut cmd = root.watchdog_cmd();
    cmd.env_remove(fault::ENV)
        .args(["--once", "--orphan-grace", "0"]);
    let out = run_with_timeout(&mut cmd, CMD);
    ensure!(
        c,
        out.status.success(),
        "{what} failed\n{}",
        describe_output(what, &out)
    );
    out
}

/// The whole stdout of a command as one JSON document.
fn json_doc(root: &TestRoot, id: &str, what: &str, out: &Output) -> Value {
    let c = ctx(root, id);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        c.fail(format_args!(
            "the stdout of {what} is not one JSON document: {e}\n{}",
            describe_output(what, out)
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Observing runs

/// status.json if it exists; a file that exists but is not one whole record fails the test.
fn observe(root: &TestRoot, id: &str, when: &str) -> Option<Value> {
    let c = ctx(root, id);
    let path = root.run_dir(id).join("status.json");
    match fs::read_to_string(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => c.fail(format_args!("{when}: cannot read {}: {e}", path.display())),
        Ok(text) => Some(serde_json::from_str(&text).unwrap_or_else(|e| {
            c.fail(format_args!(
                "{when}: status.json is not a whole document ({e}): {text:?}"
            ))
        })),
    }
}

/// Waits until status.json's state is one of `states` (parsing every version it sees).
fn wait_state(root: &TestRoot, id: &str, states: &[&str]) -> Value {
    wait_run(root, id, &format!("state {states:?}"), T, || {
        let st = observe(root, id, "waiting for a state").ok_or("no status.json yet")?;
        match st["state"].as_str() {
            Some(s) if states.contains(&s) => Ok(st),
            other => Err(format!("state {other:?}")),
        }
    })
}

/// The fixture's ready line in the run's stdout.log.
fn wait_ready_line(root: &TestRoot, id: &str) -> Ready {
    let log = root.run_dir(id).join("stdout.log");
    wait_run(root, id, "the fixture's ready line", T, || {
        let text = fs::read_to_string(&log).map_err(|e| e.to_string())?;
        text.split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .find_map(parse_ready)
            .ok_or_else(|| format!("{text:?}"))
    })
}

/// A fixture tree, pinned: the leader and its members apart, and every pid's process group as
/// seen at pinning (to recognise group signals in the journal).
struct Tree {
    ready: Ready,
    leader: Pinned,
    members: Pinned,
    pgid_of: HashMap<i32, i32>,
}

impl Tree {
    fn all(&self) -> Vec<i32> {
        self.ready.all_pids()
    }

    fn alive(&self) -> Vec<i32> {
        let mut alive = self.leader.alive();
        alive.extend(self.members.alive());
        alive.sort_unstable();
        alive
    }
}

/// Waits for the ready line and pins the tree; every pid must be alive then.
fn pin_tree(root: &TestRoot, id: &str) -> Tree {
    let c = ctx(root, id);
    let ready = wait_ready_line(root, id);
    let leader = Pinned::new(&[ready.pid]);
    let members = Pinned::new(&ready.members);
    let pgid_of = ready
        .all_pids()
        .into_iter()
        .map(|p| (p, proc_stat(p).map_or(0, |s| s.2)))
        .collect();
    let tree = Tree {
        ready,
        leader,
        members,
        pgid_of,
    };
    c.eq(
        &tree.alive(),
        &sorted(tree.all()),
        "the tree right after its ready line",
    );
    tree
}

fn sorted(mut v: Vec<i32>) -> Vec<i32> {
    v.sort_unstable();
    v
}

/// Waits (one deadline) until every pinned process is gone.
fn wait_gone(root: &TestRoot, id: &str, pins: &Pinned, what: &str) {
    let c = ctx(root, id);
    if let Err(alive) = pins.wait_all_gone(T) {
        let stats: Vec<_> = alive.iter().map(|&p| (p, proc_stat(p))).collect();
        c.fail(format_args!("{what}: still alive after {T:?}: {stats:?}"));
    }
}

/// Asserts that no live process carries the run's marker.
fn assert_no_strays(root: &TestRoot, id: &str, when: &str) {
    let c = ctx(root, id);
    let strays = marked(&root.run_dir(id));
    let stats: Vec<_> = strays.iter().map(|&p| (p, proc_stat(p))).collect();
    ensure!(
        c,
        strays.is_empty(),
        "{when}: processes carrying the run's marker are alive: {stats:?}"
    );
}

fn events_by<'a>(events: &'a [Value], by: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["by"] == by).collect()
}

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// The `state` events that moved the run to a final state.
fn final_state_events(events: &[Value]) -> Vec<&Value> {
    named(events, "state")
        .into_iter()
        .filter(|e| e["to"].as_str().is_some_and(|s| FINAL_STATES.contains(&s)))
        .collect()
}

fn cleanup_pids(st: &Value, key: &str) -> BTreeSet<i32> {
    st["cleanup"][key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_i64())
                .map(|v| v as i32)
                .collect()
        })
        .unwrap_or_default()
}

fn cleanup_signals(st: &Value) -> Vec<String> {
    st["cleanup"]["signals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads status.json every 2 ms on its own thread for as long as it runs, and keeps every
/// version that was not one whole JSON document, and the sequence of states seen.
///
/// [`RecordWatch::finish`] is called once the final record is on disk; the thread reads the
/// file once more after it sees the stop request, so the last state it reports is the one on
/// disk at that moment, not whatever it happened to read up to 2 ms before the final write.
struct RecordWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Watched>>,
}

#[derive(Default, Debug)]
struct Watched {
    reads: usize,
    partial: Vec<String>,
    states: Vec<String>,
}

impl RecordWatch {
    fn start(path: PathBuf) -> RecordWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let mut seen = Watched::default();
            loop {
                // Loaded before the read: a stop request seen here is followed by one more read.
                let stopping = flag.load(Ordering::SeqCst);
                if let Ok(text) = fs::read_to_string(&path) {
                    seen.reads += 1;
                    match serde_json::from_str::<Value>(&text) {
                        Ok(v) => {
                            let state = v["state"].as_str().unwrap_or("<none>").to_string();
                            if seen.states.last() != Some(&state) {
                                seen.states.push(state);
                            }
                        }
                        Err(e) => seen.partial.push(format!("{e}: {text:?}")),
                    }
                }
                if stopping {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        });
        RecordWatch {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> Watched {
        self.stop.store(true, Ordering::SeqCst);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for RecordWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A detached run: its wrapper and leader, pinned.
struct Detached {
    wrapper: i32,
    leader: i32,
    wrapper_pin: Pinned,
}

/// `agent-run start --detach OPTS... ID -- COMMAND...`, checked: exit 0, state running.
fn start_detached(root: &TestRoot, id: &str, opts: &[&str], command: &[String]) -> Detached {
    let c = ctx(root, id);
    let mut all = vec!["--detach"];
    all.extend(opts);
    let out = ctl(root, id, &start_argv(&all, id, command), 0);
    let line = json_doc(root, id, "start --detach", &out);
    c.eq(&line["state"], "running", "the detach line");
    let st = observe(root, id, "after start --detach").expect("a record after start --detach");
    let wrapper = st["wrapper_pid"].as_i64().unwrap_or(0) as i32;
    let leader = line["pid"].as_i64().unwrap_or(0) as i32;
    ensure!(
        c,
        wrapper > 0 && leader > 0,
        "no wrapper or leader pid: {line}"
    );
    Detached {
        wrapper,
        leader,
        wrapper_pin: Pinned::new(&[wrapper]),
    }
}

/// A fixture tree with children, grandchildren and a setsid escapee, all of default dispositions.
const PLAIN_TREE: [&str; 5] = ["tree", "--children", "2", "--grandchildren", "--escapee"];

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

/// The workload of the fault tests: children, grandchildren and a setsid escapee that ignore
/// TERM and HUP (so a stop goes through every step up to KILL), under a leader that dies of TERM.
const STUBBORN_MEMBERS: [&str; 9] = [
    "tree",
    "--children",
    "2",
    "--grandchildren",
    "--escapee",
    "--member-term",
    "ignore",
    "--member-hup",
    "ignore",
];

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
    let _cpu = shared_cpu();
    let root = TestRoot::new();
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
                let out = ctl(root, id, &["cancel", id], 0);
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

// =============================================================================================
// 2. A full disk: the record cannot be written, the stop must happen anyway.

/// A 256 KiB tmpfs (mode 0700) mounted over a test's temporary dir, lazily unmounted on drop.
struct SmallTmpfs {
    at: PathBuf,
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        // Lazy: a process of a failed test may still hold a log open in it.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .stdin(Stdio::null())
            .output();
    }
}

/// Mounts the tmpfs over the TestRoot's dir (so the run root lives in it), or None, with a note
/// on stderr, when this host does not allow mounting.
fn small_tmpfs(root: &TestRoot) -> Option<SmallTmpfs> {
    let at = root.dir.path().to_path_buf();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs"])
        .arg(&at)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => Some(SmallTmpfs { at }),
        Ok(out) => {
            eprintln!(
                "note: skipping a full-disk test: cannot mount a tmpfs on {}: {}",
                at.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("note: skipping a full-disk test: cannot run mount: {e}");
            None
        }
    }
}

/// Writes `path` until the filesystem says ENOSPC, then checks that a new file cannot get a
/// single byte: the filesystem is full.
fn fill_the_disk(root: &TestRoot, id: &str, path: &Path) {
    let c = ctx(root, id);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| c.fail(format_args!("cannot create {}: {e}", path.display())));
    let chunk = vec![0x5au8; 4096];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => c.fail(format_args!("cannot fill {}: {e}", path.display())),
        }
    }
    let probe = path.with_extension("probe");
    let full = fs::File::create(&probe).and_then(|mut p| p.write_all(&chunk));
    let _ = fs::remove_file(&probe);
    ensure!(
        c,
        full.as_ref().err().and_then(io::Error::raw_os_error) == Some(libc::ENOSPC),
        "the filesystem is not full after filling it: {full:?}"
    );
}

/// Asserts that an error report on a full disk is agent-run's, names status.json, and says
/// ENOSPC.
fn assert_enospc_reported(root: &TestRoot, id: &str, what: &str, out: &Output) {
    let c = ctx(root, id);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        c,
        stderr.contains("No space left on device") && stderr.contains("status.json"),
        "{what} must say that status.json could not be written (No space left on device)\n{}",
        describe_output(what, out)
    );
    ensure!(
        c,
        stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| l.starts_with("agent-run: ")),
        "every line {what} writes to stderr starts with \"agent-run: \"\n{}",
        describe_output(what, out)
    );
}

#[test]
fn a_full_disk_does_not_keep_a_cancelled_tree_alive_and_a_later_cancel_finishes_the_record() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let Some(_fs) = small_tmpfs(&root) else {
        return;
    };
    let id = "rel-disk-cancel";
    let c = ctx(&root, id);
    let watch = RecordWatch::start(root.run_dir(id).join("status.json"));
    let run = start_detached(&root, id, &["--grace", "1s"], &fx_args(&PLAIN_TREE));
    let tree = pin_tree(&root, id);
    let filler = root.dir.path().join("filler");
    fill_the_disk(&root, id, &filler);

    let what = format!("agent-run cancel {id} (disk full)");
    let out = run_with_timeout(agent_run(&root).args(["cancel", id]), CMD);
    // The tree is stopped whether or not any record can be written.
    for (pins, part) in [(&tree.leader, "leader"), (&tree.members, "members")] {
        if let Err(alive) = pins.wait_all_gone(T) {
            c.fail(format_args!(
                "the {part} {alive:?} of the run outlived a cancel on a full disk by {T:?}\n{}",
                describe_output(&what, &out)
            ));
        }
    }
    let st = observe(&root, id, "after the cancel on a full disk").expect("status.json");
    let state = st["state"].as_str().unwrap_or_default();
    if out.status.success() {
        ensure!(
            c,
            FINAL_STATES.contains(&state),
            "cancel exited 0 but the record is {state}\n{}",
            describe_output(&what, &out)
        );
    } else {
        assert_enospc_reported(&root, id, &what, &out);
        ensure!(
            c,
            ["running", "cancelling"].contains(&state) || FINAL_STATES.contains(&state),
            "the record after a failed write is {state}"
        );
    }

    fs::remove_file(&filler).expect("cannot remove the filler");
    let out = ctl(&root, id, &["cancel", id], 0);
    let printed = json_doc(&root, id, "cancel", &out);
    let st = observe(&root, id, "after the cancel with space").expect("status.json");
    c.eq(&printed["state"], &st["state"], "cancel's printed state");
    let outcome = (
        st["state"].as_str().unwrap_or_default(),
        st["reason"].as_str().unwrap_or_default(),
    );
    ensure!(
        c,
        [("cancelled", "cancel_request"), ("unknown", "wrapper_lost")].contains(&outcome),
        "the final record of a run stopped on a full disk: {outcome:?}"
    );
    wait_gone(&root, id, &run.wrapper_pin, "the wrapper");
    assert_no_strays(&root, id, "after the final record");
    c.eq(
        &final_state_events(&root.events(id)).len(),
        &1,
        "transitions to a final state",
    );
    let seen = watch.finish();
    ensure!(
        c,
        seen.partial.is_empty(),
        "status.json was seen partial: {:?}",
        seen.partial
    );
}

#[test]
fn term_to_the_wrapper_on_a_full_disk_stops_the_tree_and_exits_non_zero_naming_the_record() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let Some(_fs) = small_tmpfs(&root) else {
        return;
    };
    let id = "rel-disk-term";
    let watch = RecordWatch::start(root.run_dir(id).join("status.json"));
    let wrapper = Spawned::spawn(agent_run(&root).args(start_argv(
        &["--quiet", "--grace", "1s"],
        id,
        &fx_args(&PLAIN_TREE),
    )));
    let wrapper_pin = Pinned::new(&[wrapper.child.id() as i32]);
    wait_state(&root, id, &["running"]);
    let tree = pin_tree(&root, id);
    let filler = root.dir.path().join("filler");
    fill_the_disk(&root, id, &filler);

    wrapper.signal(libc::SIGTERM);
    let what = wrapper.what.clone();
    let out = wrapper.finish(CMD);
    ensure!(
        ctx(&root, id),
        out.status.code().is_some_and(|c| c != 0),
        "the wrapper must exit non-zero when it cannot write the final record\n{}",
        describe_output(&what, &out)
    );
    assert_enospc_reported(&root, id, &what, &out);
    // It returned after its stop: nothing of the tree may be alive now.
    let alive = tree.alive();
    ensure!(
        ctx(&root, id),
        alive.is_empty(),
        "the wrapper returned but {alive:?} of its tree are alive\n{}",
        describe_output(&what, &out)
    );
    wait_gone(&root, id, &wrapper_pin, "the wrapper");
    let st = observe(&root, id, "after the wrapper failed to write").expect("status.json");
    ensure!(
        ctx(&root, id),
        ["running", "cancelling"].contains(&st["state"].as_str().unwrap_or_default()),
        "on a full disk the old record stays: {}",
        st["state"]
    );

    fs::remove_file(&filler).expect("cannot remove the filler");
    watchdog_once(&root, id);
    let st = observe(&root, id, "after the watchdog").expect("status.json");
    ctx(&root, id).eq(
        &(st["state"].as_str(), st["reason"].as_str()),
        &(Some("unknown"), Some("wrapper_lost")),
        "nothing was left to stop, and no record says how the run ended",
    );
    assert_no_strays(&root, id, "after the final record");
    ctx(&root, id).eq(
        &final_state_events(&root.events(id)).len(),
        &1,
        "transitions to a final state",
    );
    let seen = watch.finish();
    ensure!(
        ctx(&root, id),
        seen.partial.is_empty(),
        "status.json was seen partial: {:?}",
        seen.partial
    );
}

// =============================================================================================
// 3. Load and races: many runs under one root, concurrent cancellers, a watchdog daemon.

/// Runs under one root in the load test (half cancelled, half finishing on their own).
const LOAD_RUNS: usize = 200;
/// Cancel processes started together for each cancelled run.
const CANCELLERS: usize = 3;

/// One run of the load test.
struct LoadRun {
    id: String,
    cancelled: bool,
    wrapper: Pinned,
    leader: Pinned,
    /// The tree's members (cancelled runs only), pinned once its ready line is there.
    members: Option<Pinned>,
    pids: Vec<i32>,
}

impl LoadRun {
    fn alive(&self) -> Vec<i32> {
        let mut alive = self.leader.alive();
        if let Some(m) = &self.members {
            alive.extend(m.alive());
        }
        alive
    }
}

/// `start --detach` one run of the load test and pin its wrapper and leader (checked against the
/// record's start time, so the pin is the leader and not a reused pid).
fn launch_load_run(root: &TestRoot, i: usize) -> LoadRun {
    let id = format!("rel-load-{i:03}");
    let c = ctx(root, &id);
    let cancelled = i % 2 == 0;
    let command = if cancelled {
        fx_args(&["tree", "--children", "1"])
    } else {
        let ms = (1500 + (i * 37) % 1501).to_string();
        fx_args(&["sleep-ms", &ms])
    };
    let out = ctl(
        root,
        &id,
        &start_argv(&["--detach", "--grace", "2s"], &id, &command),
        0,
    );
    let line = json_doc(root, &id, "start --detach", &out);
    let st = observe(root, &id, "after start --detach").expect("a record after start --detach");
    let leader = line["pid"].as_i64().unwrap_or(0) as i32;
    let wrapper = st["wrapper_pid"].as_i64().unwrap_or(0) as i32;
    let leader_pin = Pinned::new(&[leader]);
    let wrapper_pin = Pinned::new(&[wrapper]);
    let ticks = proc_stat(leader).map(|s| s.4);
    ensure!(
        c,
        ticks.is_none() || ticks == st["start_ticks"].as_u64(),
        "pid {leader} is not the run's leader any more (start ticks {ticks:?})"
    );
    LoadRun {
        id,
        cancelled,
        wrapper: wrapper_pin,
        leader: leader_pin,
        members: None,
        pids: vec![leader],
    }
}

#[test]
fn two_hundred_concurrent_runs_half_cancelled_by_three_cancellers_each_end_with_one_truthful_record_each(
) {
    let _cpu = exclusive_cpu();
    let started = Instant::now();
    let root = TestRoot::new();
    let diag = |runs: &[LoadRun], i: usize| diagnostics(&root, &runs[i].id);

    // The watchdog daemon races every cancel and every wrapper exit, with no orphan grace.
    let daemon = Spawned::spawn(root.watchdog_cmd().args(["--orphan-grace", "0"]));
    let daemon_pid = daemon.child.id() as i32;
    let daemon_pin = Pinned::new(&[daemon_pid]);

    // Launch from four threads at once.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut runs: Vec<LoadRun> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= LOAD_RUNS {
                            break mine;
                        }
                        mine.push((i, launch_load_run(&root, i)));
                    }
                })
            })
            .collect();
        let mut all: Vec<(usize, LoadRun)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("a launcher thread panicked"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    });
    let launched = started.elapsed();

    // Pin every member of the cancelled trees.
    for run in runs.iter_mut().filter(|r| r.cancelled) {
        let ready = wait_ready_line(&root, &run.id);
        ctx(&root, &run.id).eq(&ready.pid, &run.pids[0], "the tree's leader");
        run.members = Some(Pinned::new(&ready.members));
        run.pids.extend(&ready.members);
    }

    // Three cancellers per cancelled run, started together; their output goes to files.
    let out_dir = root.dir.path().join("cancel-out");
    fs::create_dir(&out_dir).expect("cannot create the cancel output dir");
    let mut cancellers = Reaper::default();
    let mut cancel_of: Vec<(usize, PathBuf, PathBuf)> = Vec::new();
    for (i, run) in runs.iter().enumerate().filter(|(_, r)| r.cancelled) {
        let mut batch = Vec::new();
        for k in 0..CANCELLERS {
            let out = out_dir.join(format!("{}.{k}.out", run.id));
            let err = out_dir.join(format!("{}.{k}.err", run.id));
            let mut cmd = agent_run(&root);
            cmd.args(["cancel", &run.id])
                .stdout(fs::File::create(&out).expect("cancel stdout file"))
                .stderr(fs::File::create(&err).expect("cancel stderr file"));
            batch.push(cmd);
            cancel_of.push((i, out, err));
        }
        for mut cmd in batch {
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
            cancellers.push(child);
        }
    }

    // Every run reaches one final record; the moment it is seen final, none of its processes
    // may be alive.
    let mut pending: BTreeSet<usize> = (0..runs.len()).collect();
    let mut contradictions = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pending.is_empty() {
        let mut done = Vec::new();
        for &i in &pending {
            let run = &runs[i];
            let Some(st) = observe(&root, &run.id, "while the load test runs") else {
                continue;
            };
            let state = st["state"].as_str().unwrap_or_default();
            if FINAL_STATES.contains(&state) {
                let alive = run.alive();
                if !alive.is_empty() {
                    contradictions.push((i, format!("{state} while {alive:?} alive")));
                }
                done.push(i);
            }
        }
        for i in done {
            pending.remove(&i);
        }
        if Instant::now() >= deadline {
            let i = *pending.first().expect("pending runs");
            panic!(
                "{} runs not final after {:?}: {:?}\n{}",
                pending.len(),
                started.elapsed(),
                pending.iter().map(|&i| &runs[i].id).collect::<Vec<_>>(),
                diag(&runs, i)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let all_final = started.elapsed();
    if let Some((i, what)) = contradictions.first() {
        panic!(
            "{} records contradict the process table; first {}: {what}\n{}",
            contradictions.len(),
            runs[*i].id,
            diag(&runs, *i)
        );
    }

    // Every canceller returns 0 and prints the same final record.
    let statuses: Vec<_> = cancellers
        .children_mut()
        .iter_mut()
        .map(|c| wait_child(c, CMD))
        .collect();
    let mut failures: Vec<(usize, String)> = Vec::new();
    for ((i, out, err), status) in cancel_of.iter().zip(&statuses) {
        let run = &runs[*i];
        let st = root.status(&run.id);
        let stdout = fs::read_to_string(out).unwrap_or_default();
        let stderr = fs::read_to_string(err).unwrap_or_default();
        let printed: Option<Value> = serde_json::from_str(&stdout).ok();
        let agrees = printed.as_ref().is_some_and(|p| {
            p["state"] == st["state"]
                && p["ended_at"] == st["ended_at"]
                && p["reason"] == st["reason"]
        });
        if !status.success() || !agrees {
            failures.push((
                *i,
                format!("a canceller exited {status}: stdout {stdout:?} stderr {stderr:?}"),
            ));
        }
    }

    // Exactly one final record per run, truthful, journalled once.
    for (i, run) in runs.iter().enumerate() {
        let st = root.status(&run.id);
        let outcome = (
            st["state"].as_str().unwrap_or_default().to_string(),
            st["reason"].clone(),
            st["exit_code"].clone(),
        );
        let want = if run.cancelled {
            (
                "cancelled".to_string(),
                Value::from("cancel_request"),
                Value::Null,
            )
        } else {
            ("finished".to_string(), Value::Null, Value::from(0))
        };
        if outcome != want {
            failures.push((i, format!("outcome {outcome:?}, expected {want:?}")));
        }
        let events = root.events(&run.id);
        let finals = final_state_events(&events).len();
        let takeovers = named(&events, "takeover").len();
        let by_watchdog = events_by(&events, "watchdog").len();
        if finals != 1 || takeovers != 0 || by_watchdog != 0 {
            failures.push((
                i,
                format!(
                    "{finals} final transitions, {takeovers} takeovers, {by_watchdog} watchdog \
                     lines (expected 1, 0, 0: every wrapper lived to write its record)"
                ),
            ));
        }
    }
    if let Some((i, what)) = failures.first() {
        panic!(
            "{} failures; first, run {}: {what}\nall: {:?}\n{}",
            failures.len(),
            runs[*i].id,
            failures.iter().take(20).collect::<Vec<_>>(),
            diag(&runs, *i)
        );
    }

    // No strays: no process carries a marker of this root, and every wrapper is gone.
    let prefix = root.root().as_os_str().as_encoded_bytes().to_vec();
    let strays = processes_with_env("AGENT_RUN_DIR", |v| v.starts_with(&prefix));
    assert!(
        strays.is_empty(),
        "processes carrying a marker of the load root are alive: {:?}",
        strays
            .iter()
            .map(|&p| (p, proc_stat(p)))
            .collect::<Vec<_>>()
    );
    for (i, run) in runs.iter().enumerate() {
        if let Err(alive) = run.wrapper.wait_all_gone(T) {
            panic!(
                "the wrapper {alive:?} of {} outlived its final record by {T:?}\n{}",
                run.id,
                diag(&runs, i)
            );
        }
    }

    // The daemon is still up, and TERM ends it cleanly.
    assert_eq!(daemon_pin.alive(), vec![daemon_pid], "the watchdog died");
    daemon.signal(libc::SIGTERM);
    let what = daemon.what.clone();
    let out = daemon.finish(CMD);
    assert!(
        out.status.success(),
        "the watchdog did not exit 0 on TERM\n{}",
        describe_output(&what, &out)
    );
    eprintln!(
        "load: {LOAD_RUNS} runs launched in {launched:?}, all final at {all_final:?}, \
         checked at {:?}",
        started.elapsed()
    );
}

// =============================================================================================
// 4. Hostile neighbours: symlinks in and around the run dir, another user, forged records.

/// A file outside every run dir that agent-run must never write, truncate or believe.
struct Sentinel {
    path: PathBuf,
    bytes: Vec<u8>,
    modified: SystemTime,
}

impl Sentinel {
    fn new(root: &TestRoot, bytes: &[u8]) -> Sentinel {
        let path = root.dir.path().join("sentinel");
        fs::write(&path, bytes).expect("cannot write the sentinel");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod sentinel");
        let modified = fs::metadata(&path)
            .and_then(|m| m.modified())
            .expect("sentinel mtime");
        Sentinel {
            path,
            bytes: bytes.to_vec(),
            modified,
        }
    }

    /// Asserts that the sentinel still holds its bytes and was never written to.
    fn assert_untouched(&self, root: &TestRoot, id: &str, when: &str) {
        let c = ctx(root, id);
        let now = fs::read(&self.path).unwrap_or_default();
        let modified = fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        ensure!(
            c,
            now == self.bytes && modified == Some(self.modified),
            "{when}: the sentinel {} was written through a symlink: now {:?} (mtime {modified:?})",
            self.path.display(),
            String::from_utf8_lossy(&now)
        );
    }
}

/// Replaces `dir/name` atomically with a symlink to `target`; the original (if any) is kept
/// as `name.orig`.
fn swap_for_symlink(dir: &Path, name: &str, target: &Path) {
    let path = dir.join(name);
    if fs::symlink_metadata(&path).is_ok() {
        fs::rename(&path, dir.join(format!("{name}.orig")))
            .unwrap_or_else(|e| panic!("cannot move {} away: {e}", path.display()));
    }
    symlink(target, &path).unwrap_or_else(|e| panic!("cannot plant {}: {e}", path.display()));
}

fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// A foreground run of a plain tree, running and pinned.
struct Foreground {
    proc: Spawned,
    wrapper_pin: Pinned,
    tree: Tree,
}

fn start_foreground(root: &TestRoot, id: &str, quiet: bool) -> Foreground {
    let mut opts = vec!["--grace", "1s"];
    if quiet {
        opts.push("--quiet");
    }
    let proc = Spawned::spawn(agent_run(root).args(start_argv(&opts, id, &fx_args(&PLAIN_TREE))));
    let wrapper_pin = Pinned::new(&[proc.child.id() as i32]);
    wait_state(root, id, &["running"]);
    // The journal's launch lines follow the record: a test that snapshots the journal waits.
    ctx(root, id).launched();
    let tree = pin_tree(root, id);
    Foreground {
        proc,
        wrapper_pin,
        tree,
    }
}

/// Asserts that every process of the tree and the wrapper are alive.
fn assert_untouched_run(root: &TestRoot, id: &str, tree: &Tree, wrapper: &Pinned, when: &str) {
    let c = ctx(root, id);
    c.eq(
        &tree.alive(),
        &sorted(tree.all()),
        format_args!("{when}: a process of the run is gone"),
    );
    c.eq(
        &wrapper.alive(),
        &wrapper.pids(),
        format_args!("{when}: the wrapper is gone"),
    );
}

/// Waits for a foreground wrapper and checks its exit code.
fn finish_with(root: &TestRoot, id: &str, proc: Spawned, want: i32) -> Output {
    let c = ctx(root, id);
    let what = proc.what.clone();
    let out = proc.finish(CMD);
    c.eq(
        &exit_code(&out.status),
        &want,
        format_args!("the wrapper's exit code\n{}", describe_output(&what, &out)),
    );
    out
}

/// Runs an agent-run command that must refuse: not 0, not a crash, an `agent-run: ` message.
fn refused<S: AsRef<str>>(root: &TestRoot, id: &str, args: &[S], codes: &[i32]) -> Output {
    let c = ctx(root, id);
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let what = format!("agent-run {}", args.join(" "));
    let out = run_with_timeout(agent_run(root).args(&args), CMD);
    let code = exit_code(&out.status);
    ensure!(
        c,
        codes.contains(&code) && String::from_utf8_lossy(&out.stderr).starts_with("agent-run: "),
        "{what} must refuse with one of {codes:?} and say why\n{}",
        describe_output(&what, &out)
    );
    out
}

#[test]
fn a_run_dir_planted_as_a_symlink_before_launch_is_refused_with_78_and_nothing_runs_through_it() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "rel-planted-dir";
    let c = ctx(&root, id);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(root.root())
        .expect("cannot create the root");
    let elsewhere = root.dir.path().join("elsewhere");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .expect("cannot create the target dir");
    symlink(&elsewhere, root.run_dir(id)).expect("cannot plant the run dir symlink");
    let counter = root.dir.path().join("ran");
    let command = fx_args(&["count", path_str(&counter)]);
    let dir = root.run_dir(id);

    for opts in [&[][..], &["--detach"][..]] {
        let out = refused(&root, id, &start_argv(opts, id, &command), &[78]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            c,
            opts.contains(&"--detach") || stderr.contains(path_str(&dir)),
            "the refusal must name the run dir {}: {stderr}",
            dir.display()
        );
    }
    for args in [
        vec!["cancel", id],
        vec!["status", "--json", id],
        vec!["renew", id, "--lease", "1m"],
        vec!["logs", id],
        vec!["wait", id, "--timeout", "1s"],
    ] {
        refused(&root, id, &args, &[78]);
    }
    watchdog_once(&root, id);
    let planted: Vec<_> = fs::read_dir(&elsewhere)
        .expect("the target dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    ensure!(
        c,
        planted.is_empty(),
        "files were created through the symlinked run dir: {planted:?}"
    );
    ensure!(
        c,
        !counter.exists(),
        "the command ran through a symlinked run dir"
    );
    ensure!(c, is_symlink(&dir), "the planted symlink was replaced");
}

#[test]
fn symlinks_raced_into_a_new_run_dir_during_launch_are_never_written_through() {
    const PLANTED: [&str; 9] = [
        "lock",
        "events.jsonl",
        "status.json",
        "lease.json",
        "stdout.log",
        "stderr.log",
        "pid",
        "pgid",
        "cancel.json",
    ];
    const ROUNDS_PER_FILE: usize = 3;
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let sentinel = Sentinel::new(&root, b"sentinel: agent-run must never write here\n");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(root.root())
        .expect("cannot create the root");
    // file planted -> exit code -> launches
    let mut tally: BTreeMap<&str, BTreeMap<i32, usize>> = BTreeMap::new();
    for round in 0..PLANTED.len() * ROUNDS_PER_FILE {
        let name = PLANTED[round / ROUNDS_PER_FILE];
        let id = format!("rel-race-{round:02}");
        let id = id.as_str();
        let c = ctx(&root, id);
        let dir = root.run_dir(id);
        // The racer plants one symlink from the moment the run dir exists until the launch is
        // over; one file per round, so every step of a launch meets its own planted link.
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let (stop, link, target) = (Arc::clone(&stop), dir.join(name), sentinel.path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = symlink(&target, &link);
                }
            })
        };
        let out = run_with_timeout(
            agent_run(&root).args(start_argv(
                &["--quiet", "--lease", "1h"],
                id,
                &fx_args(&["spew", "4096", "--stderr-bytes", "512"]),
            )),
            CMD,
        );
        stop.store(true, Ordering::Relaxed);
        racer.join().expect("the racer panicked");
        sentinel.assert_untouched(&root, id, &format!("round {round} ({name} planted)"));

        let code = exit_code(&out.status);
        *tally.entry(name).or_default().entry(code).or_default() += 1;
        // A status.json that is still the racer's symlink is no record of agent-run's.
        let st = if is_symlink(&dir.join("status.json")) {
            None
        } else {
            observe(&root, id, "after a raced launch")
        };
        match code {
            0 => {
                let st = st.unwrap_or_else(|| c.fail("exit 0 without a record"));
                c.eq(
                    &(st["state"].as_str(), st["exit_code"].as_i64()),
                    &(Some("finished"), Some(0)),
                    "a launch that exits 0",
                );
                let log = fs::read(dir.join("stdout.log")).unwrap_or_default();
                ensure!(
                    c,
                    !is_symlink(&dir.join("stdout.log")) && log.len() == 4096,
                    "the workload's output went elsewhere ({} bytes in stdout.log)",
                    log.len()
                );
            }
            70 | 78 => {
                ensure!(
                    c,
                    String::from_utf8_lossy(&out.stderr).starts_with("agent-run: "),
                    "a refused launch says why\n{}",
                    describe_output("start", &out)
                );
                if let Some(st) = st {
                    ensure!(
                        c,
                        FINAL_STATES.contains(&st["state"].as_str().unwrap_or_default()),
                        "a refused launch leaves a final record or none: {}",
                        st["state"]
                    );
                }
            }
            other => c.fail(format_args!(
                "a launch with {name} raced exited {other}\n{}",
                describe_output("start", &out)
            )),
        }
        assert_no_strays(&root, id, "after a raced launch");
    }
    eprintln!("symlink race: planted file -> exit code -> launches: {tally:?}");
}

#[test]
fn log_and_id_files_swapped_for_symlinks_after_launch_are_never_written_through_and_cancel_still_stops_the_tree(
) {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "rel-swap-logs";
    let c = ctx(&root, id);
    let sentinel = Sentinel::new(&root, b"sentinel: secret text that must not be streamed\n");
    let run = start_foreground(&root, id, false);
    let dir = root.run_dir(id);
    for name in ["stdout.log", "stderr.log", "pid", "pgid", "events.jsonl"] {
        swap_for_symlink(&dir, name, &sentinel.path);
    }
    for args in [vec!["logs", id], vec!["logs", "--stderr", id]] {
        let out = run_with_timeout(agent_run(&root).args(&args), CMD);
        ensure!(
            c,
            !String::from_utf8_lossy(&out.stdout).contains("sentinel"),
            "`agent-run {}` printed the sentinel through a symlink\n{}",
            args.join(" "),
            describe_output("logs", &out)
        );
    }
    // The journal is a symlink now: a cancel may refuse to act on it, but must not write it.
    let first = run_with_timeout(agent_run(&root).args(["cancel", id]), CMD);
    sentinel.assert_untouched(&root, id, "after a cancel with a symlinked journal");
    if !first.status.success() {
        assert_untouched_run(
            &root,
            id,
            &run.tree,
            &run.wrapper_pin,
            "after a refused cancel",
        );
        fs::rename(dir.join("events.jsonl.orig"), dir.join("events.jsonl"))
            .expect("cannot restore the journal");
        ctl(&root, id, &["cancel", id], 0);
    }
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    let out = finish_with(&root, id, run.proc, 143);
    ensure!(
        c,
        !String::from_utf8_lossy(&out.stdout).contains("sentinel"),
        "the wrapper streamed the sentinel through the symlinked stdout.log"
    );
    sentinel.assert_untouched(&root, id, "after the run ended");
    let st = observe(&root, id, "after the run ended").expect("status.json");
    c.eq(&st["state"], "cancelled", "the final state");
    ensure!(
        c,
        !is_symlink(&dir.join("status.json")),
        "status.json is a symlink"
    );
}

#[test]
fn a_status_json_swapped_for_a_symlink_is_named_by_cancel_and_replaced_not_followed_by_the_wrapper()
{
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "rel-swap-status";
    let c = ctx(&root, id);
    let run = start_foreground(&root, id, true);
    let dir = root.run_dir(id);
    // The sentinel is a copy of the live record: believable, if anyone followed the link.
    let record = fs::read(dir.join("status.json")).expect("status.json");
    let sentinel = Sentinel::new(&root, &record);
    let tmp = dir.join(".planted.tmp");
    symlink(&sentinel.path, &tmp).expect("cannot create the symlink");
    fs::rename(&tmp, dir.join("status.json")).expect("cannot swap status.json");

    // The record cannot be read, but the wrapper holds the run's lock: it is asked. The
    // cancel names the damaged file and never follows the link.
    let out = ctl(&root, id, &["cancel", id], 0);
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("status.json"),
        "cancel must name the damaged status.json\n{}",
        describe_output("cancel", &out)
    );
    sentinel.assert_untouched(&root, id, "after the cancel");

    // The wrapper replaced the link with its own record; it never wrote through it.
    finish_with(&root, id, run.proc, 143);
    let alive = run.tree.alive();
    ensure!(
        c,
        alive.is_empty(),
        "the wrapper returned with {alive:?} alive"
    );
    sentinel.assert_untouched(&root, id, "after the wrapper's final record");
    ensure!(
        c,
        !is_symlink(&dir.join("status.json")),
        "status.json is still a symlink after the final record"
    );
    let st = observe(&root, id, "after the run ended").expect("status.json");
    c.eq(
        &(st["state"].as_str(), st["reason"].as_str()),
        &(Some("cancelled"), Some("cancel_request")),
        "the final record",
    );
}

#[test]
fn a_lock_file_swapped_for_a_symlink_is_named_and_the_run_is_still_cancelled() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "rel-swap-lock";
    let c = ctx(&root, id);
    let sentinel = Sentinel::new(&root, b"sentinel: not a lock\n");
    let run = start_foreground(&root, id, true);
    let dir = root.run_dir(id);
    swap_for_symlink(&dir, "lock", &sentinel.path);

    // The wrapper still holds the run's lock on the run dir itself: it is found, and asked.
    let out = ctl(&root, id, &["cancel", id], 0);
    ensure!(
        c,
        String::from_utf8_lossy(&out.stderr).contains("lock"),
        "cancel must name the damaged lock file\n{}",
        describe_output("cancel", &out)
    );
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    finish_with(&root, id, run.proc, 143);
    sentinel.assert_untouched(&root, id, "after the cancel");
}

#[test]
fn a_cancel_json_planted_as_a_symlink_is_neither_written_through_nor_believed() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "rel-swap-cancel-json";
    let c = ctx(&root, id);
    // Believable, were it followed: a watchdog's lease expiry.
    let sentinel = Sentinel::new(
        &root,
        b"{\"source\":\"watchdog\",\"reason\":\"lease_expired\",\"by_uid\":0}\n",
    );
    let run = start_foreground(&root, id, true);
    let dir = root.run_dir(id);
    swap_for_symlink(&dir, "cancel.json", &sentinel.path);

    let out = ctl(&root, id, &["cancel", id], 0);
    let printed = json_doc(&root, id, "cancel", &out);
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    sentinel.assert_untouched(&root, id, "after the cancel");
    c.eq(
        &(printed["state"].as_str(), printed["reason"].as_str()),
        &(Some("cancelled"), Some("cancel_request")),
        "the run was cancelled by `cancel`, whatever a symlinked cancel.json says",
    );
    finish_with(&root, id, run.proc, 143);
}

#[test]
fn a_run_dir_swapped_for_a_symlink_after_launch_makes_cancel_exit_78_and_signal_nothing() {
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let victim_root = TestRoot::new();
    let id = "rel-swap-dir";
    let c = ctx(&root, id);
    let victim_id = "rel-swap-dir-victim";
    let run = start_foreground(&root, id, true);
    let victim = start_foreground(&victim_root, victim_id, true);
    let victim_events = fs::read(victim_root.run_dir(victim_id).join("events.jsonl"))
        .expect("the victim's journal");
    let dir = root.run_dir(id);
    let moved = root.dir.path().join("moved");
    fs::rename(&dir, &moved).expect("cannot move the run dir");

    for target in [moved.clone(), victim_root.run_dir(victim_id)] {
        symlink(&target, &dir).expect("cannot plant the run dir symlink");
        let out = refused(&root, id, &["cancel", id], &[78]);
        ensure!(
            c,
            String::from_utf8_lossy(&out.stderr).contains(path_str(&dir)),
            "the refusal must name {}\n{}",
            dir.display(),
            describe_output("cancel", &out)
        );
        assert_untouched_run(
            &root,
            id,
            &run.tree,
            &run.wrapper_pin,
            &format!("after cancel through a symlink to {}", target.display()),
        );
        assert_untouched_run(
            &victim_root,
            victim_id,
            &victim.tree,
            &victim.wrapper_pin,
            "the victim, after a cancel through a symlink",
        );
        fs::remove_file(&dir).expect("cannot remove the symlink");
    }
    ctx(&victim_root, victim_id).eq(
        &fs::read(victim_root.run_dir(victim_id).join("events.jsonl")).unwrap_or_default(),
        &victim_events,
        "the victim's journal changed",
    );
    ensure!(
        ctx(&victim_root, victim_id),
        !victim_root.run_dir(victim_id).join("cancel.json").exists(),
        "a cancel through a symlink wrote the victim's cancel.json"
    );

    fs::rename(&moved, &dir).expect("cannot move the run dir back");
    ctl(&root, id, &["cancel", id], 0);
    wait_gone(&root, id, &run.tree.leader, "the leader after cancel");
    wait_gone(&root, id, &run.tree.members, "the members after cancel");
    finish_with(&root, id, run.proc, 143);
    ctl(&victim_root, victim_id, &["cancel", victim_id], 0);
    finish_with(&victim_root, victim_id, victim.proc, 143);
}

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
    let _cpu = shared_cpu();
    let root = TestRoot::new();
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
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&own)
        .expect("attacker root");
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
    let _cpu = shared_cpu();
    let root = TestRoot::new();
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
    st.pid = Some(victim);
    st.pgid = Some(pgid);
    st.sid = Some(sid);
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

#[test]
fn a_forged_record_naming_another_users_process_under_that_users_uid_gets_it_nothing() {
    forged_record_names_nothing_that_is_signalled(Forgery::OtherUsersUid);
}

#[test]
fn a_forged_record_naming_another_users_process_with_the_wrong_start_time_gets_it_nothing() {
    forged_record_names_nothing_that_is_signalled(Forgery::WrongStartTicks);
}

// =============================================================================================
// 5. Concurrent final writes: ten cancels of one orphaned run.

#[test]
fn ten_concurrent_cancels_of_a_run_whose_wrapper_was_kill_9ed_take_it_over_once_and_agree() {
    const CANCELS: usize = 10;
    let _cpu = shared_cpu();
    let root = TestRoot::new();
    let id = "rel-crowd";
    let c = ctx(&root, id);
    // Members that ignore TERM and HUP keep the takeover's stop busy until KILL at 1 s, so the
    // other nine cancels meet a held lock.
    let run = start_detached(&root, id, &["--grace", "1s"], &fx_args(&STUBBORN_MEMBERS));
    let tree = pin_tree(&root, id);
    c.eq(&tree.ready.pid, &run.leader, "the tree's leader");
    run.wrapper_pin
        .signal(run.wrapper, libc::SIGKILL)
        .expect("cannot SIGKILL the wrapper");
    wait_gone(&root, id, &run.wrapper_pin, "the SIGKILLed wrapper");
    c.eq(
        &tree.alive(),
        &sorted(tree.all()),
        "the tree outlives its wrapper",
    );

    let gate = Barrier::new(CANCELS);
    let outs: Vec<Output> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CANCELS)
            .map(|_| {
                s.spawn(|| {
                    let mut cmd = agent_run(&root);
                    cmd.args(["cancel", id]);
                    gate.wait();
                    run_with_timeout(&mut cmd, CMD)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a cancel thread panicked"))
            .collect()
    });

    let alive = tree.alive();
    ensure!(
        c,
        alive.is_empty(),
        "every cancel returned but {alive:?} of the run are alive"
    );
    let st = root.status(id);
    c.eq(
        &(st["state"].as_str(), st["reason"].as_str()),
        &(Some("cancelled"), Some("cancel_request")),
        "the final record",
    );
    let signalled = cleanup_pids(&st, "signalled");
    ensure!(
        c,
        tree.all().iter().all(|p| signalled.contains(p)),
        "cleanup.signalled {signalled:?} lacks members of {:?}",
        tree.all()
    );
    for (i, out) in outs.iter().enumerate() {
        c.eq(
            &exit_code(&out.status),
            &0,
            format_args!("cancel #{i}\n{}", describe_output("cancel", out)),
        );
        let printed = json_doc(&root, id, "cancel", out);
        for key in ["state", "reason", "ended_at", "cleanup", "exit_code"] {
            c.eq(&printed[key], &st[key], format_args!("cancel #{i}: {key}"));
        }
    }
    let events = root.events(id);
    c.eq(&named(&events, "takeover").len(), &1, "takeovers");
    c.eq(
        &final_state_events(&events).len(),
        &1,
        "transitions to a final state",
    );
    c.eq(&named(&events, "stop_begin").len(), &1, "stop_begin events");
    ensure!(
        c,
        named(&events, "refused").is_empty(),
        "a cancel refused the run"
    );
    ensure!(
        c,
        cancel_json_count(&root.run_dir(id)) == 1,
        "cancel.json must exist exactly once"
    );
    assert_no_strays(&root, id, "after the final record");
}

/// 1 if cancel.json exists, 0 otherwise (and leftover temp files count against it).
fn cancel_json_count(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains("cancel"))
                .count()
        })
        .unwrap_or(0)
}
