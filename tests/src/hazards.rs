//! The harness of the hazard tests (fault points, full disks, concurrent stops, symlink swaps,
//! other users): agent-run and watchdog commands, pinned fixture trees, a background reader of
//! status.json, detached runs, and the checks those tests share.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::contain::marked;
use crate::wait_run;
use crate::workload::start_argv;
use crate::{
    ctx, describe_output, ensure, exit_code, parse_ready, proc_stat, run_with_timeout, Pinned,
    Ready, TestRoot, FINAL_STATES,
};
use agent_run_shared::fault;
use serde_json::Value;

/// The deadline for things that normally take milliseconds to a few seconds.
pub const T: Duration = Duration::from_secs(30);

/// The deadline for one agent-run command to return.
pub const CMD: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// CPU sharing: the load test runs alone; every other test of this file may run beside the others.

// (agent_run_tests::facts::{shared_cpu, exclusive_cpu})

// ---------------------------------------------------------------------------------------------
// Assertions that explain themselves

// ---------------------------------------------------------------------------------------------
// Commands

/// `agent-run --root <root>` with no fault armed.
pub fn agent_run(root: &TestRoot) -> Command {
    let mut cmd = root.cmd();
    cmd.env_remove(fault::ENV);
    cmd
}

/// Runs `agent-run --root <root> ARGS...` to completion and checks its exit code.
pub fn ctl<S: AsRef<str>>(root: &TestRoot, id: &str, args: &[S], want: i32) -> Output {
    let (what, out, code) = ctl_run(root, args);
    ensure!(
        ctx(root, id),
        code == want,
        "{what} exited {code}, not {want}\n{}",
        describe_output(&what, &out)
    );
    out
}

/// Runs `agent-run --root <root> ARGS...` to completion: what ran, its output and exit code.
pub fn ctl_run<S: AsRef<str>>(root: &TestRoot, args: &[S]) -> (String, Output, i32) {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let what = format!("agent-run {}", args.join(" "));
    let out = run_with_timeout(agent_run(root).args(&args), CMD);
    let code = exit_code(&out.status);
    (what, out, code)
}

/// `agent-run-watchdog --root <root> --once --orphan-grace 0`, checked to exit 0.
pub fn watchdog_once(root: &TestRoot, id: &str) -> Output {
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
pub fn json_doc(root: &TestRoot, id: &str, what: &str, out: &Output) -> Value {
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
pub fn observe(root: &TestRoot, id: &str, when: &str) -> Option<Value> {
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
pub fn wait_state(root: &TestRoot, id: &str, states: &[&str]) -> Value {
    wait_run(root, id, &format!("state {states:?}"), T, || {
        let st = observe(root, id, "waiting for a state").ok_or("no status.json yet")?;
        match st["state"].as_str() {
            Some(s) if states.contains(&s) => Ok(st),
            other => Err(format!("state {other:?}")),
        }
    })
}

/// The fixture's ready line in the run's stdout.log.
pub fn wait_ready_line(root: &TestRoot, id: &str) -> Ready {
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
pub struct Tree {
    pub ready: Ready,
    pub leader: Pinned,
    pub members: Pinned,
    pub pgid_of: HashMap<i32, i32>,
}

impl Tree {
    pub fn all(&self) -> Vec<i32> {
        self.ready.all_pids()
    }

    pub fn alive(&self) -> Vec<i32> {
        let mut alive = self.leader.alive();
        alive.extend(self.members.alive());
        alive.sort_unstable();
        alive
    }
}

/// Waits for the ready line and pins the tree; every pid must be alive then.
pub fn pin_tree(root: &TestRoot, id: &str) -> Tree {
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

pub fn sorted(mut v: Vec<i32>) -> Vec<i32> {
    v.sort_unstable();
    v
}

/// Waits (one deadline) until every pinned process is gone.
pub fn wait_gone(root: &TestRoot, id: &str, pins: &Pinned, what: &str) {
    let c = ctx(root, id);
    if let Err(alive) = pins.wait_all_gone(T) {
        let stats: Vec<_> = alive.iter().map(|&p| (p, proc_stat(p))).collect();
        c.fail(format_args!("{what}: still alive after {T:?}: {stats:?}"));
    }
}

/// Asserts that no live process carries the run's marker.
pub fn assert_no_strays(root: &TestRoot, id: &str, when: &str) {
    let c = ctx(root, id);
    let strays = marked(&root.run_dir(id));
    let stats: Vec<_> = strays.iter().map(|&p| (p, proc_stat(p))).collect();
    ensure!(
        c,
        strays.is_empty(),
        "{when}: processes carrying the run's marker are alive: {stats:?}"
    );
}

pub fn events_by<'a>(events: &'a [Value], by: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["by"] == by).collect()
}

pub fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// The `state` events that moved the run to a final state.
pub fn final_state_events(events: &[Value]) -> Vec<&Value> {
    named(events, "state")
        .into_iter()
        .filter(|e| e["to"].as_str().is_some_and(|s| FINAL_STATES.contains(&s)))
        .collect()
}

pub fn cleanup_pids(st: &Value, key: &str) -> BTreeSet<i32> {
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

/// Reads status.json every 2 ms on its own thread for as long as it runs, and keeps every
/// version that was not one whole JSON document, and the sequence of states seen.
///
/// [`RecordWatch::finish`] is called once the final record is on disk; the thread reads the
/// file once more after it sees the stop request, so the last state it reports is the one on
/// disk at that moment, not whatever it happened to read up to 2 ms before the final write.
pub struct RecordWatch {
    pub stop: Arc<AtomicBool>,
    pub handle: Option<JoinHandle<Watched>>,
}

#[derive(Default, Debug)]
pub struct Watched {
    pub reads: usize,
    pub partial: Vec<String>,
    pub states: Vec<String>,
}

impl RecordWatch {
    pub fn start(path: PathBuf) -> RecordWatch {
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

    pub fn finish(mut self) -> Watched {
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
pub struct Detached {
    pub wrapper: i32,
    pub leader: i32,
    pub wrapper_pin: Pinned,
}

/// `agent-run start --detach OPTS... ID -- COMMAND...`, checked: exit 0, state running.
pub fn start_detached(root: &TestRoot, id: &str, opts: &[&str], command: &[String]) -> Detached {
    let c = ctx(root, id);
    let mut all = vec!["--detach", "--json"];
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
pub const PLAIN_TREE: [&str; 5] = ["tree", "--children", "2", "--grandchildren", "--escapee"];

/// The workload of the fault tests: children, grandchildren and a setsid escapee that ignore
/// TERM and HUP (so a stop goes through every step up to KILL), under a leader that dies of TERM.
pub const STUBBORN_MEMBERS: [&str; 9] = [
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

/// Asserts that every process of the tree and the wrapper are alive.
pub fn assert_untouched_run(root: &TestRoot, id: &str, tree: &Tree, wrapper: &Pinned, when: &str) {
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
