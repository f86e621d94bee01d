//! Helpers for tests that play the hostile workload: rewrite a run's files, plant FIFOs,
//! sockets, symlinks and huge files, keep an unrelated victim process alive and check it stays
//! so, act as another user.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::{fixture_bin, proc_stat, run_with_timeout, wait_ready, Pinned, TestRoot};

/// `nobody`'s uid and gid.
pub const NOBODY: u32 = 65534;

/// A generous deadline for a command under test.
pub const CMD: Duration = Duration::from_secs(30);

/// `program` run as `nobody` (setpriv), with stdin from /dev/null.
pub fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".to_string(),
        "--".to_string(),
    ])
    .arg(program)
    .env_remove("AGENT_RUN_ROOT")
    .env_remove("AGENT_RUN_FAULT")
    .env(crate::LEASE_TOKEN_ENV, crate::LEASE_TOKEN)
    .stdin(Stdio::null());
    cmd
}

/// A run started with `start --detach`, its wrapper and leader pinned.
pub struct Detached {
    pub id: String,
    pub dir: PathBuf,
    pub wrapper: i32,
    pub leader: i32,
    pub wrapper_pin: Pinned,
    pub leader_pin: Pinned,
}

/// Runs `cmd` to completion and returns (exit code, stdout, stderr).
pub fn outcome(cmd: &mut Command) -> (i32, String, String) {
    let out = run_with_timeout(cmd, CMD);
    (
        crate::exit_code(&out.status),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Detached {
    /// `agent-run --root R [agent] start -d [opts] ID -- CMD...` through `base` (a command
    /// already set up with `--root`, possibly as another user), checked to exit 0.
    pub fn start(
        root: &TestRoot,
        mut base: Command,
        id: &str,
        opts: &[&str],
        argv: &[impl AsRef<std::ffi::OsStr>],
    ) -> Detached {
        base.args(["start", "-d"])
            .args(opts)
            .arg(id)
            .arg("--")
            .args(argv);
        let out = run_with_timeout(&mut base, CMD);
        crate::ctx(root, id).code(&out, 0, "start -d");
        Detached::from_record(root, id)
    }

    /// The run `id` as its status.json names it, its wrapper and leader pinned now.
    pub fn from_record(root: &TestRoot, id: &str) -> Detached {
        let st = root.status(id);
        let wrapper = st["wrapper_pid"].as_i64().expect("wrapper_pid") as i32;
        let leader = st["pid"].as_i64().expect("pid") as i32;
        Detached {
            id: id.to_string(),
            dir: root.run_dir(id),
            wrapper,
            leader,
            wrapper_pin: Pinned::new(&[wrapper]),
            leader_pin: Pinned::new(&[leader]),
        }
    }

    /// SIGKILL the wrapper and wait until it is gone (its lock is then free).
    pub fn kill_wrapper(&self) {
        let _ = self.wrapper_pin.signal(self.wrapper, libc::SIGKILL);
        self.wrapper_pin
            .wait_all_gone(CMD)
            .unwrap_or_else(|p| panic!("wrapper {p:?} survived SIGKILL"));
    }
}

/// Rewrite a run's status.json the way the workload could: read it, change it, put it back
/// atomically (a temp file and a rename, so no reader sees half of it).
pub fn edit_status(dir: &Path, f: impl FnOnce(&mut Map<String, Value>)) {
    let path = dir.join("status.json");
    let text = fs::read_to_string(&path).expect("status.json");
    let mut v: Value = serde_json::from_str(&text).expect("status.json is JSON");
    f(v.as_object_mut().expect("status.json is an object"));
    let tmp = dir.join(".forged.tmp");
    fs::write(&tmp, serde_json::to_string_pretty(&v).unwrap()).expect("write forged record");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).expect("chmod forged record");
    fs::rename(&tmp, &path).expect("rename forged record");
}

/// An unrelated process (the fixture sleeping), pinned, killed by pid when dropped. With
/// `session_leader`, it is its own session and group leader, like a login shell.
pub struct Victim {
    child: Child,
    pub pid: i32,
    pub pin: Pinned,
}

impl Victim {
    pub fn spawn(session_leader: bool) -> Victim {
        let mut cmd = if session_leader {
            let mut c = Command::new("setsid");
            c.arg(fixture_bin());
            c
        } else {
            Command::new(fixture_bin())
        };
        cmd.args(["sleep-ms", "120000"])
            .env_remove("AGENT_RUN_ID")
            .env_remove("AGENT_RUN_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // setsid(1) execs in place when it is not a group leader (a child of ours is not).
        let child = cmd.spawn().expect("cannot spawn the victim");
        let pid = child.id() as i32;
        let pin = Pinned::new(&[pid]);
        if session_leader {
            crate::wait_until("the victim to lead its own session", CMD, || {
                proc_stat(pid).filter(|s| s.3 == pid).map(|_| ())
            });
        }
        Victim { child, pid, pin }
    }

    /// The same, as another user (setpriv), never a session leader.
    pub fn spawn_as(uid: u32) -> Victim {
        let mut cmd = as_nobody(&fixture_bin());
        assert_eq!(uid, NOBODY, "only nobody is set up");
        cmd.args(["sleep-ms", "120000"])
            .env_remove("AGENT_RUN_ID")
            .env_remove("AGENT_RUN_DIR")
            .stdout(Stdio::null());
        let child = cmd.spawn().expect("cannot spawn the victim");
        let pid = child.id() as i32;
        let pin = Pinned::new(&[pid]);
        // setpriv execs the fixture in place: wait until it has.
        crate::wait_until("the victim to run as nobody", CMD, || {
            fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .filter(|e| e.ends_with("fixture"))
                .map(|_| ())
        });
        Victim { child, pid, pin }
    }

    /// Its start time in clock ticks.
    pub fn ticks(&self) -> u64 {
        proc_stat(self.pid).expect("the victim is alive").4
    }

    /// Panics unless it is alive (not a zombie).
    pub fn assert_alive(&self, what: &str, root: &TestRoot, id: &str) {
        crate::ctx(root, id).check(
            !self.pin.alive().is_empty(),
            format_args!("the unrelated process {} is gone {what}", self.pid),
        );
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.pin.signal(self.pid, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The kinds of file a workload can plant in place of a run file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    Fifo,
    Socket,
    SymlinkToDevZero,
    HugeFile,
}

impl Plant {
    pub const ALL: [Plant; 4] = [
        Plant::Fifo,
        Plant::Socket,
        Plant::SymlinkToDevZero,
        Plant::HugeFile,
    ];
}

/// Replace `path` with a planted `kind` of file. A socket stays bound while the returned
/// listener lives.
pub fn plant(path: &Path, kind: Plant) -> Option<std::os::unix::net::UnixListener> {
    let _ = fs::remove_file(path);
    match kind {
        Plant::Fifo => {
            let st = Command::new("mkfifo")
                .arg("-m")
                .arg("600")
                .arg(path)
                .status();
            assert!(st.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
            None
        }
        Plant::Socket => Some(std::os::unix::net::UnixListener::bind(path).expect("bind a socket")),
        Plant::SymlinkToDevZero => {
            std::os::unix::fs::symlink("/dev/zero", path).expect("symlink");
            None
        }
        Plant::HugeFile => {
            let f = fs::File::create(path).expect("create the huge file");
            f.set_len(1 << 30).expect("a sparse 1 GiB file");
            fs::set_permissions(path, fs::Permissions::from_mode(0o600)).expect("chmod");
            None
        }
    }
}

/// The journal's events named `name`.
pub fn events_named(root: &TestRoot, id: &str, name: &str) -> Vec<Value> {
    root.events(id)
        .into_iter()
        .filter(|e| e["event"] == name)
        .collect()
}

/// The journal's `signal` events whose target is `pid:N` or `group:N` of a pid in `pids`.
pub fn signals_to(root: &TestRoot, id: &str, pids: &[i32]) -> Vec<Value> {
    events_named(root, id, "signal")
        .into_iter()
        .filter(|e| {
            let t = e["target"].as_str().unwrap_or_default();
            pids.iter()
                .any(|p| t == format!("pid:{p}") || t == format!("group:{p}"))
        })
        .collect()
}

/// Waits for a fixture tree's ready line in the run's stdout.log and pins the whole tree.
pub fn pin_tree(root: &TestRoot, id: &str) -> (crate::Ready, Pinned) {
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), CMD);
    let pin = Pinned::new(&ready.all_pids());
    (ready, pin)
}

/// An `agent-run-watchdog` daemon on a test's root, its stderr captured; SIGKILLed by pid if
/// the test ends without stopping it.
pub struct Daemon {
    proc: Option<crate::Spawned>,
}

impl Daemon {
    /// Start the daemon (`base`: the watchdog command with `--root`), wait until it watches.
    pub fn start(mut base: Command, args: &[&str]) -> Daemon {
        let proc = crate::Spawned::spawn(base.args(args));
        let d = Daemon { proc: Some(proc) };
        crate::wait_until_dbg("the watchdog to start watching", CMD, || {
            let err = d.stderr();
            if err.contains("watching ") {
                Ok(())
            } else {
                Err(err)
            }
        });
        d
    }

    pub fn pid(&self) -> i32 {
        self.proc.as_ref().map_or(0, |p| p.child.id() as i32)
    }

    pub fn stderr(&self) -> String {
        self.proc.as_ref().map_or_else(String::new, |p| {
            String::from_utf8_lossy(&p.stderr_so_far()).into_owned()
        })
    }

    pub fn running(&mut self) -> bool {
        self.proc
            .as_mut()
            .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)))
    }

    pub fn signal(&self, sig: i32) {
        if let Some(p) = &self.proc {
            p.signal(sig);
        }
    }

    /// SIGTERM and wait for its exit.
    pub fn stop(self) -> std::process::Output {
        self.signal(libc::SIGTERM);
        self.finish()
    }

    /// [`Daemon::stop`]; it must exit 0 (`c`'s run diagnostics come with a failure).
    pub fn stop_cleanly(self, c: crate::Ctx) -> std::process::Output {
        let out = self.stop();
        c.code(&out, 0, "the watchdog on SIGTERM");
        out
    }

    /// Waits for its exit (after a signal the test sent).
    pub fn finish(mut self) -> std::process::Output {
        self.proc.take().expect("running").finish(CMD)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.signal(libc::SIGKILL);
            let _ = p.finish(CMD);
        }
    }
}

/// Write lease.json with the given deadline (epoch seconds), as `renew` would.
pub fn write_lease(dir: &Path, deadline_epoch: f64, lease_s: f64) {
    let tmp = dir.join(".lease.test.tmp");
    fs::write(
        &tmp,
        format!("{{\"deadline_epoch\":{deadline_epoch},\"lease_s\":{lease_s}}}\n"),
    )
    .expect("write lease");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).expect("chmod lease");
    fs::rename(&tmp, dir.join("lease.json")).expect("rename lease");
}

/// Seconds since the epoch (the harness's one copy, kept here under its old path).
pub use crate::facts::epoch_now;

/// The deadline in a run's lease.json (the one its wrapper wrote).
pub fn read_lease_deadline(dir: &Path) -> f64 {
    let text = fs::read_to_string(dir.join("lease.json")).expect("lease.json");
    let v: Value = serde_json::from_str(&text).expect("a lease");
    v["deadline_epoch"].as_f64().expect("deadline_epoch")
}
