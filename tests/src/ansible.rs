//! Helpers of the Ansible collection's tests (`tests/tests/ansible.rs`): a fleet of managed hosts,
//! each an sshd of its own on a loopback port (the [`remote`](super::remote) harness) with a run
//! root of its own, and `ansible-playbook` (real ansible-core from PyPI, installed by `.ci/test`
//! into `target/ci-venv`) driving the collection built from `integrations/ansible` with
//! `ansible-galaxy collection build` and installed from its tarball.
//!
//! Everything a fleet starts lives under one temporary directory (the inventory, ansible.cfg,
//! ssh's control sockets, the hosts' run roots, Ansible's temporary files). On drop, every run
//! still active is cancelled with agent-run itself, then every process that still mentions that
//! directory on its command line or carries an `AGENT_RUN_DIR` under it is killed by pid (pinned
//! with a pidfd first), then each sshd is stopped with every process it forked.

use super::ctx::Diagnosed;
use super::remote::{processes_mentioning, SshServer};
use super::{
    agent_run_bin, processes_with_env, read_run_file, run_dir_diagnostics, Pinned, Spawned,
};
use serde_json::Value;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The notification callback that writes every task result as a JSON line.
const RESULTS_CALLBACK: &str = include_str!("../ansible/results.py");

/// The repository's root (the workspace).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// An ansible-core program (`ansible-playbook`, `ansible-galaxy`, `ansible-doc`): on PATH (where
/// `.ci/test` puts its virtualenv), else in `target/ci-venv/bin`. Panics, naming the fix, when
/// neither has it: a missing ansible-core is a failure, never a skip.
pub fn ansible_program(name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    let venv = repo_root().join("target/ci-venv/bin").join(name);
    if venv.is_file() {
        return venv;
    }
    panic!(
        "{name} not found on PATH nor in {}: the Ansible tests need ansible-core; `bash .ci/test` \
         installs it (pip, into target/ci-venv)",
        venv.display()
    );
}

/// Runs a command that must succeed; panics with its output otherwise.
fn must(cmd: &mut Command) -> Output {
    crate::must_succeed(cmd.stdin(Stdio::null()), "")
}

/// The collection, built once per test process with `ansible-galaxy collection build` and
/// installed from that tarball with `ansible-galaxy collection install`: the directory to give
/// Ansible as its collections path.
pub fn installed_collection() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = repo_root().join("target/tmp/ansible-collection");
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let home = base.join("home");
        let galaxy = ansible_program("ansible-galaxy");
        must(
            Command::new(&galaxy)
                .args(["collection", "build", "--force", "--output-path"])
                .arg(&base)
                .arg(repo_root().join("integrations/ansible"))
                .env("ANSIBLE_HOME", &home),
        );
        let tarball = base.join("agentrun-remote-0.1.0.tar.gz");
        assert!(
            tarball.is_file(),
            "ansible-galaxy collection build made no {}",
            tarball.display()
        );
        let collections = base.join("collections");
        must(
            Command::new(&galaxy)
                .args(["collection", "install", "--force", "-p"])
                .arg(&collections)
                .arg(&tarball)
                .env("ANSIBLE_HOME", &home),
        );
        collections
    })
}

/// One managed host of a [`Fleet`].
pub struct Host {
    /// The inventory name, `h01`...
    pub name: String,
    /// Its run root (given to the module as `root:`).
    pub root: PathBuf,
    /// A directory of its own for the test's files (the playbooks see it as `agentrun_dir`).
    pub dir: PathBuf,
}

/// A run on one of the fleet's hosts ([`Fleet::run`]): its checks end with its run dir's
/// diagnostics.
pub struct HostRun {
    dir: PathBuf,
}

impl Diagnosed for HostRun {
    fn diagnostics(&self) -> String {
        run_dir_diagnostics(&self.dir)
    }
}

/// What one `ansible-playbook` run gave.
pub struct Play {
    pub out: Output,
    pub elapsed: Duration,
    /// Every task result, as the results callback wrote it: {host, task, status, result}.
    pub results: Vec<Value>,
}

impl Play {
    /// What `ansible-playbook`, spawned by [`Fleet::spawn`] with its results in `results`, gave
    /// once it exited (within `limit`); its duration is not measured.
    pub fn finished(play: Spawned, limit: Duration, results: &Path) -> Play {
        Play {
            out: play.finish(limit),
            elapsed: Duration::ZERO,
            results: read_results(results),
        }
    }

    /// The result of task `task` on host `host`; panics listing what there is.
    pub fn result(&self, task: &str, host: &str) -> &Value {
        self.results
            .iter()
            .find(|r| r["task"] == task && r["host"] == host)
            .unwrap_or_else(|| {
                panic!(
                    "no result for task {task:?} on {host}; results: {}\n{}",
                    self.results
                        .iter()
                        .map(|r| format!("{}/{}:{}", r["task"], r["host"], r["status"]))
                        .collect::<Vec<_>>()
                        .join(" "),
                    self.describe()
                )
            })
    }

    /// ansible-playbook's exit code (-1 for a signal).
    pub fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }

    /// Its output, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "--- ansible-playbook {} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.out.status,
            self.elapsed,
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }
}

/// Ten (or n) managed hosts and a controller configuration for them.
pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub hosts: Vec<Host>,
    servers: Vec<Option<SshServer>>,
    plays: std::cell::Cell<u32>,
}

impl Fleet {
    /// `n` hosts `h01`..., each an sshd of its own on 127.0.0.1 with its own keys and run root.
    pub fn new(n: usize) -> Fleet {
        let collections = installed_collection();
        let dir = tempfile::Builder::new()
            .prefix("agent-run-ansible.")
            .tempdir()
            .expect("cannot create a temporary directory");
        let d = dir.path();
        for sub in ["cp", "home", "local-tmp", "remote-tmp", "callback_plugins"] {
            fs::create_dir_all(d.join(sub)).unwrap();
        }
        fs::write(d.join("callback_plugins/results.py"), RESULTS_CALLBACK).unwrap();
        let bin = agent_run_bin();
        let mut servers = Vec::new();
        let mut hosts = Vec::new();
        let mut inventory = String::from("[fleet]\n");
        for i in 1..=n {
            let srv = SshServer::start(None);
            let name = format!("h{i:02}");
            let hdir = d.join("hosts").join(&name);
            fs::create_dir_all(&hdir).unwrap();
            let k = srv.dir.path().display().to_string();
            inventory.push_str(&format!(
                "{name} ansible_host=127.0.0.1 ansible_port={port} ansible_user=root \
                 ansible_ssh_private_key_file={k}/user_key \
                 ansible_ssh_common_args='-F /dev/null -o UserKnownHostsFile={k}/known_hosts \
                 -o StrictHostKeyChecking=accept-new -o IdentitiesOnly=yes' \
                 agentrun_root={root} agentrun_dir={hd} agentrun_bin={bin} \
                 ansible_async_dir={hd}/async\n",
                port = srv.port,
                root = hdir.join("runs").display(),
                hd = hdir.display(),
                bin = bin.display(),
            ));
            hosts.push(Host {
                name,
                root: hdir.join("runs"),
                dir: hdir,
            });
            servers.push(Some(srv));
        }
        fs::write(d.join("inventory.ini"), inventory).unwrap();
        let cfg = format!(
            "[defaults]\ninventory = {d}/inventory.ini\ncollections_path = {c}\nforks = 20\n\
             host_key_checking = False\ngathering = explicit\n\
             interpreter_python = /usr/bin/python3\nlocal_tmp = {d}/local-tmp\n\
             remote_tmp = {d}/remote-tmp\nretry_files_enabled = False\n\
             callback_plugins = {d}/callback_plugins\ncallbacks_enabled = results\n\
             [ssh_connection]\ncontrol_path_dir = {d}/cp\npipelining = True\n",
            d = d.display(),
            c = collections.display()
        );
        fs::write(d.join("ansible.cfg"), cfg).unwrap();
        Fleet {
            dir,
            hosts,
            servers,
            plays: std::cell::Cell::new(0),
        }
    }

    /// The host names, in order.
    pub fn names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name.clone()).collect()
    }

    /// Writes `yaml` as playbook `name`.yml and returns `ansible-playbook` for it, ready to
    /// spawn in a process group of its own (as a shell's job is, so that a test can send the
    /// group SIGINT the way a terminal's Ctrl-C does), and where its results go.
    pub fn command(&self, name: &str, yaml: &str, extra: &[&str]) -> (Command, PathBuf) {
        let d = self.dir.path();
        let book = d.join(format!("{name}.yml"));
        fs::write(&book, yaml).unwrap();
        let k = self.plays.get() + 1;
        self.plays.set(k);
        let results = d.join(format!("results-{k}-{name}.jsonl"));
        let mut cmd = Command::new(ansible_program("ansible-playbook"));
        cmd.arg(&book)
            .args(extra)
            .env("ANSIBLE_CONFIG", d.join("ansible.cfg"))
            .env("ANSIBLE_HOME", d.join("home"))
            .env("ANSIBLE_NOCOLOR", "1")
            .env("ANSIBLE_FORCE_COLOR", "0")
            // A play that hangs is sent SIGABRT before SIGKILL (Spawned::finish): its stack.
            .env("PYTHONFAULTHANDLER", "1")
            .env("AGENTRUN_TEST_RESULTS", &results)
            .env_remove("AGENT_RUN_ROOT")
            .stdin(Stdio::null())
            .process_group(0);
        (cmd, results)
    }

    /// Runs playbook `yaml` to its end (at most `limit`), and returns what it gave.
    /// [`Fleet::command`] started in the background, with `AGENTRUN_ANSIBLE_TRACE` set to
    /// `trace` if given: the process, and the file its task results go to.
    pub fn spawn(
        &self,
        name: &str,
        yaml: &str,
        extra: &[&str],
        trace: Option<&Path>,
    ) -> (Spawned, PathBuf) {
        let (mut cmd, results) = self.command(name, yaml, extra);
        if let Some(trace) = trace {
            cmd.env("AGENTRUN_ANSIBLE_TRACE", trace);
        }
        (Spawned::spawn(&mut cmd), results)
    }

    pub fn play(&self, name: &str, yaml: &str, extra: &[&str], limit: Duration) -> Play {
        let (mut cmd, results) = self.command(name, yaml, extra);
        let start = Instant::now();
        let out = super::run_with_timeout(&mut cmd, limit);
        let elapsed = start.elapsed();
        Play {
            out,
            elapsed,
            results: read_results(&results),
        }
    }

    /// The output keepers of the runs under `host`'s run root: (pid, start ticks) from each
    /// run's `keeper_started` journal event (the keeper is a run's own helper, in a session of
    /// its own: no record names it).
    pub fn keepers(&self, host: &Host) -> Vec<(i64, u64)> {
        crate::keepers_in_root(&host.root)
    }

    /// Every record (status.json) under `host`'s run root, by run id.
    pub fn records(&self, host: &Host) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        let Ok(entries) = fs::read_dir(&host.root) else {
            return out;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if id.starts_with('.') {
                continue;
            }
            let path = e.path().join("status.json");
            let text = match read_run_file(&path) {
                Ok(text) => text,
                // A run dir a moment before its first record.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => panic!("cannot read {}: {err}", path.display()),
            };
            let rec: Value = serde_json::from_slice(&text)
                .unwrap_or_else(|err| panic!("bad {}: {err}", path.display()));
            out.push((id, rec));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Processes that are the fleet's runs: an `AGENT_RUN_DIR` under the fleet's directory.
    pub fn run_processes(&self) -> Vec<i32> {
        let d = self.dir.path().as_os_str().as_bytes().to_vec();
        processes_with_env("AGENT_RUN_DIR", |v| v.starts_with(&d))
    }

    /// Everything the fleet started that is still alive, but ssh's control masters (they stay
    /// ControlPersist seconds, by Ansible's design): the runs' processes, the wrappers and every
    /// process that mentions the fleet's directory (ansible-playbook and its workers, ssh
    /// clients, agent-run commands on the hosts). (pid, command line) each.
    pub fn leftovers(&self) -> Vec<(i32, String)> {
        let mut pids = self.run_processes();
        pids.extend(processes_mentioning(&self.dir.path().display().to_string()));
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .filter_map(|pid| {
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                let text = text.trim().to_string();
                let master = text.starts_with("ssh: ") && text.ends_with("[mux]");
                (!master).then_some((pid, text))
            })
            .collect()
    }

    /// The workers and ssh clients of a running `ansible-playbook` (its descendants), pinned.
    pub fn pin_descendants(&self, pid: i32) -> Pinned {
        Pinned::new(&super::remote::descendants(pid))
    }

    /// Host `i` goes away: its sshd is stopped with every process it forked (the sessions and
    /// the commands they ran; not the runs' wrappers, which are detached from them).
    pub fn stop_sshd(&mut self, i: usize) {
        drop(self.servers[i].take());
    }

    /// The pid of host `i`'s listening sshd (its sessions, and what they run, fork from it).
    pub fn sshd_pid(&self, i: usize) -> u32 {
        self.servers[i].as_ref().expect("host's sshd is up").pid()
    }

    /// The `.ansible-fence.*` files in `host`'s run root, by name.
    pub fn fences(&self, host: &Host) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&host.root)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(".ansible-fence."))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The controller user's lease token file (the fleet's ANSIBLE_HOME is its own).
    pub fn token_file(&self) -> PathBuf {
        self.dir.path().join("home/agent-run/lease-token")
    }

    /// A path under the fleet's directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The run a host's record names (its `run_id`, which names the host too), to check it
    /// with its run dir's diagnostics.
    pub fn run(&self, rec: &Value) -> HostRun {
        let id = rec["run_id"].as_str().unwrap_or_default();
        let mut dirs = self.hosts.iter().map(|h| h.root.join(id));
        let found = dirs.clone().find(|d| d.is_dir());
        let dir = found.or_else(|| dirs.next()).unwrap_or_default();
        HostRun { dir }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Runs still active: stopped by agent-run itself (it signals by pid, after its checks).
        for h in &self.hosts {
            if h.root.is_dir() {
                let _ = Command::new(agent_run_bin())
                    .arg("--root")
                    .arg(&h.root)
                    .args(["cancel", "--all", "--json", "--wait", "10s"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .output();
            }
        }
        // Whatever is left that is the fleet's (ssh masters included), by pid.
        let d = self.dir.path().display().to_string();
        let mut pids = processes_mentioning(&d);
        pids.extend(self.run_processes());
        let me = std::process::id() as i32;
        pids.retain(|&p| p != me);
        let pinned = Pinned::new(&pids);
        drop(pinned); // SIGKILLs every pinned process still alive
                      // The sshds and every process they forked go with `servers`.
        self.servers.clear();
        // The runs' cgroups that agent-run did not remove (a run it gave up on): a test leaves
        // none behind.
        let wait = Duration::from_secs(10);
        let left: Vec<String> = (self.hosts.iter())
            .flat_map(|h| crate::run_cgroups::remove_run_cgroups(&h.dir, wait))
            .collect();
        if !left.is_empty() && !std::thread::panicking() {
            panic!("the fleet's runs left cgroups behind: {left:#?}");
        }
    }
}

/// The JSON lines the results callback wrote (none when the file is missing).
pub fn read_results(path: &Path) -> Vec<Value> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad result line {l:?}: {e}")))
        .collect()
}
