//! [honest-stop]: the hostile-workload fuzzer.
//!
//! Random sequences of what a workload can do to its own run (forge, remove or replace its
//! files; stop, freeze or kill its wrapper; start children that hide or leave its cgroup; fork
//! for ever; renew its own lease), interleaved with the watchdog, `gc` and `status`, and ended
//! by `cancel`. After each step and at the end, the invariants:
//!
//! 1. no final word the kernel contradicts: a record agent-run believes (`status --json` says
//!    final with no note) while the run's cgroup holds a process, or while a process of the
//!    run that carries its marker lives;
//! 2. every cancel ends within the run's grace + 10 s, and exits 0;
//! 3. nothing outside the run is signalled: a bystander of the run's user (in the delegated
//!    parent, where a process that leaves the run goes) lives, and no journal names it;
//! 4. no run is left that nothing can stop: after the cancel and a watchdog pass, every
//!    process of the run is gone, except one the record names as escaped (it left the run's
//!    cgroup) or, by /proc scans alone after the wrapper is lost, one that cleared its
//!    environment and left its session (the record then says `unknown`: docs/safety.md, R-1);
//!    and `gc` never removes the dir of a run with a process alive.
//!
//! `AGENT_RUN_FUZZ_SEED` replays a run of the fuzzer (its seed is printed first),
//! `AGENT_RUN_FUZZ_ONLY=N` one sequence of it, `AGENT_RUN_FUZZ_SEQUENCES` sets how many
//! (default 200), `AGENT_RUN_FUZZ_WORKERS` how many at once (default 4).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent_run_tests::contain::{cgroup2_mount, Delegated};
use agent_run_tests::fuzz::{self, Env, Move, Sequence, Step};
use agent_run_tests::hostile::{Victim, NOBODY};
use agent_run_tests::hostile_run::{files_of, Mode, Run, Side};
use agent_run_tests::{agent_run_bin, run_with_timeout, Pinned, TestRoot};
use serde_json::Value;

/// The runs' grace: short, so each sequence is quick.
const GRACE: Duration = Duration::from_millis(300);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn the_hostile_workload_fuzzer_keeps_the_invariants() {
    let seed = env_u64("AGENT_RUN_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let count = env_u64("AGENT_RUN_FUZZ_SEQUENCES").unwrap_or(200);
    let only = env_u64("AGENT_RUN_FUZZ_ONLY");
    let workers = env_u64("AGENT_RUN_FUZZ_WORKERS").unwrap_or(4).max(1);
    let verbose = std::env::var_os("AGENT_RUN_FUZZ_VERBOSE").is_some();
    eprintln!(
        "hostile fuzzer: seed {seed}, {count} sequences (replay: AGENT_RUN_FUZZ_SEED={seed}, \
         one of them: AGENT_RUN_FUZZ_ONLY=N)"
    );
    let modes = Mode::all();
    // Nothing outside the runs is written: the system's programs and settings stay as they were.
    let system_before = system_files();
    let next = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return;
                }
                if only.is_some_and(|o| o != n) {
                    continue;
                }
                let mode = modes[(n % modes.len() as u64) as usize];
                let seq = Sequence::draw(seed, n, mode);
                let t = Instant::now();
                let played = std::panic::catch_unwind(|| play(n, &seq));
                if verbose {
                    eprintln!(
                        "{n} {:?} {:?}: {:?} in {:?}",
                        seq.mode,
                        seq.steps,
                        played.as_ref().map(|r| r.as_ref().map_err(|_| "failed")),
                        t.elapsed()
                    );
                }
                let failed = match played {
                    Ok(Ok(_)) => None,
                    Ok(Err(why)) => Some(why),
                    Err(panic) => Some(
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "a panic".into()),
                    ),
                };
                if let Some(why) = failed {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("sequence {n} {seq:?}:\n{why}"));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    let changed: Vec<&PathBuf> = {
        let after = system_files();
        system_before
            .iter()
            .filter(|(p, v)| after.get(*p) != Some(v))
            .map(|(p, _)| p)
            .collect()
    };
    if !changed.is_empty() {
        failures.push(format!("files outside every run changed: {changed:?}"));
    }
    eprintln!(
        "hostile fuzzer: {count} sequences in {:.1} s, {} failed",
        t0.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "seed {seed} (AGENT_RUN_FUZZ_SEED={seed}):\n\n{}",
        failures.join("\n\n")
    );
}

/// What the test knows of the run's processes, by what the workload said.
#[derive(Default)]
struct Known {
    /// Plain children: they carry the run's marker.
    marked: Vec<i32>,
    /// Out of the run's session with a cleared environment.
    hidden: Vec<i32>,
    /// Moved out of the run's cgroup.
    escapees: Vec<i32>,
    pins: Vec<Pinned>,
}

impl Known {
    fn take(&mut self, said: &str) {
        for line in said.lines() {
            let mut w = line.split_whitespace();
            let (Some("pid"), Some(kind), Some(pid)) = (w.next(), w.next(), w.next()) else {
                continue;
            };
            let Ok(pid) = pid.parse::<i32>() else {
                continue;
            };
            let list = match kind {
                "child" => &mut self.marked,
                "hidden" => &mut self.hidden,
                _ => &mut self.escapees,
            };
            if !list.contains(&pid) {
                list.push(pid);
                self.pins.push(Pinned::new(&[pid]));
            }
        }
    }

    fn alive(&self, pids: &[i32]) -> Vec<i32> {
        self.pins
            .iter()
            .flat_map(|p| p.alive())
            .filter(|p| pids.contains(p))
            .collect()
    }

    fn kill_all(&self) {
        for pin in &self.pins {
            for p in pin.alive() {
                let _ = pin.signal(p, libc::SIGKILL);
            }
        }
    }
}

/// Kills what a sequence left, by pid and path, whatever happened (a failing check too).
struct Leftovers<'a> {
    dir: PathBuf,
    known: &'a Mutex<Known>,
    run: Option<(Pinned, i32)>,
    keeper: Option<Pinned>,
    playground: Option<PathBuf>,
    holder: Option<PathBuf>,
}

impl Drop for Leftovers<'_> {
    fn drop(&mut self) {
        if let Ok(k) = self.known.lock() {
            k.kill_all();
        }
        if let Some((pin, wrapper)) = &self.run {
            let _ = pin.signal(*wrapper, libc::SIGKILL);
            let _ = pin.signal(*wrapper, libc::SIGCONT);
        }
        if let Some(p) = &self.playground {
            // The wrapper may sit frozen in a cgroup the workload made there.
            kill_cgroup(&p.join("ice"));
        }
        if let Some(h) = &self.holder {
            kill_cgroup(h);
        }
        agent_run_tests::contain::sweep(&self.dir, &[]);
        if let Some(k) = &self.keeper {
            for p in k.alive() {
                let _ = k.signal(p, libc::SIGKILL);
            }
        }
    }
}

/// Play one sequence: how the run ended, or what broke an invariant (with the run's
/// diagnostics).
fn play(n: u64, seq: &Sequence) -> Result<String, String> {
    let root = TestRoot::new();
    let side = Side::held(&root, seq.mode, &format!("fz{n}"));
    let own = (seq.mode == Mode::RootCgroup && cgroup2_mount().is_some())
        .then(|| Delegated::new(&format!("fzp{n}")))
        .flatten();
    let playground: Option<PathBuf> = side
        .delegated()
        .map(Path::to_path_buf)
        .or_else(|| own.as_ref().map(|d| d.path.clone()));
    let bystander = match seq.mode {
        Mode::RootCgroup => Victim::spawn(false),
        _ => Victim::spawn_as(NOBODY),
    };
    if let Some(d) = side.delegated() {
        fs::write(d.join("cgroup.procs"), bystander.pid.to_string())
            .map_err(|e| format!("move the bystander: {e}"))?;
    }
    let hopper = side.shared.join("hopper.py");
    fs::write(&hopper, fuzz::HOPPER).map_err(|e| e.to_string())?;
    let (go, said) = files_of(&side, "fz");
    let mut opts = vec!["--grace", "300ms", "--hup-after", "100ms"];
    if seq.lease {
        opts.extend(["--lease", "3s"]);
    }
    let known = Mutex::new(Known::default());
    let mut leftovers = Leftovers {
        dir: root.run_dir("fz"),
        known: &known,
        run: None,
        keeper: None,
        playground: playground.clone(),
        holder: side.holder().map(Path::to_path_buf),
    };
    let run = side.start("fz", &opts, &fuzz::workload(&go, &said, seq.ignores_term));
    leftovers.run = Some((Pinned::new(&[run.wrapper]), run.wrapper));
    // The output keeper, pinned before the workload can damage the journal that names it.
    let keeper = agent_run_tests::keepers_in_root(&root.root())
        .first()
        .map(|&(pid, _)| Pinned::new(&[pid as i32]));
    leftovers.keeper = keeper;
    let bin = agent_run_bin();
    let env = Env {
        agent_run: &bin,
        root: &root.root(),
        playground: playground.as_deref(),
        hopper: &hopper,
    };
    let mut p = Player {
        side: &side,
        run: &run,
        known: &known,
        moves: 0,
    };
    let result = seq
        .steps
        .iter()
        .try_for_each(|step| p.step(*step, &env))
        .and_then(|()| p.bystander_untouched(&bystander))
        .and_then(|()| {
            // Once every process of the run is gone, its keeper ends by EOF: a keeper that
            // stays is a process of the run left behind.
            known.lock().unwrap().kill_all();
            agent_run_tests::contain::sweep(&run.dir, &[]);
            if let Some(h) = side.holder() {
                // A pid hopper that outran the stop by /proc scans alone (docs/safety.md,
                // the record says `unknown`, checked above; gone by the test's cgroup.
                kill_cgroup(h);
                return Ok(());
            }
            match &leftovers.keeper {
                Some(k) => k
                    .wait_all_gone(Duration::from_secs(10))
                    .map(|_| ())
                    .map_err(|left| {
                        format!("the output keeper {left:?} outlived every process of the run")
                    }),
                None => Ok(()),
            }
        });
    result
        .map(|()| {
            let st = root.try_status("fz").unwrap_or_default();
            format!("{} {}", st["state"], st["reason"])
        })
        .map_err(|why| format!("{why}\n{}", agent_run_tests::diagnostics(&root, "fz")))
}

struct Player<'a> {
    side: &'a Side<'a>,
    run: &'a Run,
    known: &'a Mutex<Known>,
    moves: u32,
}

impl Player<'_> {
    fn step(&mut self, step: Step, env: &Env<'_>) -> Result<(), String> {
        match step {
            Step::Workload(m) => self.workload(m, env),
            Step::Watchdog => {
                let out = run_with_timeout(
                    self.side
                        .watchdog()
                        .args(["--once", "--orphan-grace", "0", "--slack", "1s"]),
                    fuzz_cmd(),
                );
                if !out.status.success() {
                    return Err(format!(
                        "watchdog --once: {}",
                        agent_run_tests::describe_output("watchdog", &out)
                    ));
                }
                self.status_agrees()
            }
            Step::Gc => {
                let (code, _, err) = self.side.ctl(&["gc", "--older-than", "0s"]);
                if code != 0 {
                    return Err(format!("gc exited {code}: {err}"));
                }
                if !self.run.dir.exists() {
                    // By /proc scans alone, one that hid is not found by anyone.
                    let alive = self.alive_run_processes(self.side.mode == Mode::NobodyProcfs);
                    if !alive.is_empty() {
                        return Err(format!("gc removed the run dir while {alive:?} live"));
                    }
                }
                Ok(())
            }
            Step::Status => self.status_agrees(),
            Step::Cancel => self.cancel(),
        }
    }

    /// Hand the workload its next move and wait until it says it made it (or is gone).
    fn workload(&mut self, m: Move, env: &Env<'_>) -> Result<(), String> {
        if self.run.leader_pin.alive().is_empty() {
            if std::env::var_os("AGENT_RUN_FUZZ_VERBOSE").is_some() {
                eprintln!("  the workload is gone before {m:?}: {}", self.run.said());
            }
            return Ok(());
        }
        self.moves += 1;
        let n = self.moves;
        let file = PathBuf::from(format!("{}.{n}", self.run.go.display()));
        let tmp = PathBuf::from(format!("{}.tmp", file.display()));
        fs::write(&tmp, m.script(env)).map_err(|e| e.to_string())?;
        fs::rename(&tmp, &file).map_err(|e| e.to_string())?;
        let done = format!("step {n}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let said = self.run.said();
            self.known.lock().unwrap().take(&said);
            if said.lines().any(|l| l == done) || self.run.leader_pin.alive().is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the workload never made move {n} ({m:?}): {said}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Invariant 1: what `status --json` believes final, the kernel does not contradict.
    fn status_agrees(&self) -> Result<(), String> {
        let (code, out, err) = self.side.ctl(&["status", "--json", "fz"]);
        if code != 0 {
            // A record the workload removed or garbled: nothing is believed (77 with what the
            // kernel says; 69 once nothing of the run is there).
            return if matches!(code, 69 | 77) {
                Ok(())
            } else {
                Err(format!("status exited {code}: {err}"))
            };
        }
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("status --json: {e}"))?;
        if v["final"] != true || !v["note"].is_null() {
            return Ok(());
        }
        if let Some(cg) = self.run_cgroup() {
            if populated(&cg) {
                return Err(format!(
                    "status believes {} while {} holds processes",
                    v["state"],
                    cg.display()
                ));
            }
        }
        // By /proc scans alone, a record forged after the wrapper is lost is believed by
        // status (only cancel and gc ask the marker): docs/safety.md, R-14.
        let procfs_orphan =
            self.side.mode == Mode::NobodyProcfs && self.run.wrapper_pin.alive().is_empty();
        let alive = {
            let k = self.known.lock().unwrap();
            k.alive(&k.marked)
        };
        if !procfs_orphan && !alive.is_empty() {
            return Err(format!(
                "status believes {} while its processes {alive:?} live",
                v["state"]
            ));
        }
        Ok(())
    }

    /// Invariants 2 and 4: the cancel, and what is left after it and a watchdog pass.
    fn cancel(&self) -> Result<(), String> {
        let t0 = Instant::now();
        let (code, _, err) = self.side.ctl(&["cancel", "fz"]);
        let took = t0.elapsed();
        if code == 69 && !self.run.dir.exists() {
            // gc removed it, once the run was over: nothing of it may be left.
            let alive = self.alive_run_processes(self.side.mode == Mode::NobodyProcfs);
            return match alive.is_empty() {
                true => Ok(()),
                false => Err(format!("no run dir left, and {alive:?} live")),
            };
        }
        if code != 0 {
            return Err(format!("cancel exited {code} after {took:?}: {err}"));
        }
        if took > GRACE + Duration::from_secs(10) {
            return Err(format!("cancel took {took:?}: more than grace + 10 s"));
        }
        let _ = run_with_timeout(
            self.side
                .watchdog()
                .args(["--once", "--orphan-grace", "0", "--slack", "1s"]),
            fuzz_cmd(),
        );
        let st = agent_run_tests::wait_until_dbg("a final record", fuzz_cmd(), || {
            let st = self.side.root.try_status("fz")?;
            match st["state"].as_str() {
                Some("finished" | "cancelled" | "launch_failed" | "unknown") => Ok(st),
                _ => Err(st.to_string()),
            }
        });
        let state = st["state"].as_str().unwrap_or_default().to_string();
        // Zombies are reaped by whoever is their parent: a moment.
        let pins: Vec<i32> = self.run.leader_pin.pids();
        let _ = self.run.leader_pin.wait_all_gone(Duration::from_secs(5));
        let alive = self.alive_run_processes(false);
        let leader_alive = !self.run.leader_pin.alive().is_empty();
        if let Some(cg) = self.run_cgroup().filter(|c| populated(c)) {
            return Err(format!("{} holds processes after the cancel", cg.display()));
        }
        if leader_alive {
            return Err(format!("the run's leader {pins:?} lives after the cancel"));
        }
        if state != "unknown" && !alive.is_empty() {
            return Err(format!("the record says {state} while {alive:?} live"));
        }
        // What carries the run's marker, known to the test or not (a hopper's newest one).
        let marked = agent_run_tests::contain::marked(&self.run.dir);
        if state != "unknown" && !marked.is_empty() {
            return Err(format!(
                "the record says {state} while {marked:?} carry the run's marker"
            ));
        }
        let k = self.known.lock().unwrap();
        let named: Vec<i64> = st["cleanup"]["escapees"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        for p in alive {
            let excused = if k.escapees.contains(&p) {
                named.contains(&i64::from(p))
            } else {
                k.hidden.contains(&p) && self.side.mode == Mode::NobodyProcfs
            };
            if !excused {
                return Err(format!(
                    "{p} of the run lives after the cancel, and the record does not say why: {st}"
                ));
            }
        }
        Ok(())
    }

    /// Invariant 3.
    fn bystander_untouched(&self, bystander: &Victim) -> Result<(), String> {
        if bystander.pin.alive().is_empty() {
            return Err(format!("the bystander {} is dead", bystander.pid));
        }
        let events = agent_run_tests::read_run_file(&self.run.dir.join("events.jsonl"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        for line in events.lines() {
            let Ok(e) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if e["event"] == "signal" && e["pid"].as_i64() == Some(i64::from(bystander.pid)) {
                return Err(format!("the bystander was signalled: {line}"));
            }
        }
        Ok(())
    }

    /// The run's processes the test knows of that are alive, its leader first: those that
    /// carry its marker, and unless `marked_only` those that hid or left its cgroup too.
    fn alive_run_processes(&self, marked_only: bool) -> Vec<i32> {
        let k = self.known.lock().unwrap();
        let mut pids = k.marked.clone();
        if !marked_only {
            pids.extend(&k.hidden);
            pids.extend(&k.escapees);
        }
        let mut alive = self.run.leader_pin.alive();
        alive.extend(k.alive(&pids));
        alive
    }

    /// The run's cgroup, found by its name on the mount (whatever the record says).
    fn run_cgroup(&self) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let mount = cgroup2_mount()?;
        let ino = fs::metadata(&self.run.dir).ok()?.ino();
        let name = format!("agent-run.fz.{ino:x}");
        find_dir(&mount, &name, 0)
    }
}

/// Size, modification time and inode of each file directly in /usr/bin, /usr/sbin and /etc.
fn system_files() -> std::collections::BTreeMap<PathBuf, (u64, i64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    for dir in ["/usr/bin", "/usr/sbin", "/etc"] {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            if let Ok(m) = fs::symlink_metadata(e.path()) {
                out.insert(e.path(), (m.size(), m.mtime(), m.ino()));
            }
        }
    }
    out
}

/// The generous deadline of one command in a sequence.
fn fuzz_cmd() -> Duration {
    Duration::from_secs(60)
}

/// Thaw and kill a cgroup of the test's, and wait until it is empty.
fn kill_cgroup(cg: &Path) {
    let _ = fs::write(cg.join("cgroup.freeze"), "0");
    let _ = fs::write(cg.join("cgroup.kill"), "1");
    agent_run_tests::contain::eventually(Duration::from_secs(10), || !populated(cg));
}

fn populated(cg: &Path) -> bool {
    fs::read_to_string(cg.join("cgroup.events"))
        .is_ok_and(|e| e.lines().any(|l| l.trim() == "populated 1"))
}

fn find_dir(at: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    if depth > 8 {
        return None;
    }
    for e in fs::read_dir(at).ok()?.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if e.file_name() == name {
            return Some(e.path());
        }
        if let Some(p) = find_dir(&e.path(), name, depth + 1) {
            return Some(p);
        }
    }
    None
}
