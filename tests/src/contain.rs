//! Helpers for the containment tests: the cgroup2 mount, a cgroup delegated to `nobody`, the
//! run's marked processes, and cleanup by pid of whatever a test's run left.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::hostile::NOBODY;
use crate::{poll_until, proc_stat, processes_with_env};

/// The cgroup2 mount from /proc/self/mountinfo, if the host has one.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(left.split_whitespace().nth(4)?))
    })
}

/// The cgroup of a process, as a path on the cgroup2 mount (the `0::` line).
pub fn cgroup_of(pid: i32) -> Option<PathBuf> {
    let mount = cgroup2_mount()?;
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim().trim_start_matches('/')))
}

/// Every live process whose `AGENT_RUN_DIR` is `dir` (the run's marker).
pub fn marked(dir: &Path) -> Vec<i32> {
    let want = dir.as_os_str().as_encoded_bytes().to_vec();
    processes_with_env("AGENT_RUN_DIR", |v| v == want.as_slice())
}

/// SIGKILL, by pid, every process carrying `dir`'s marker, again until none is left (a process
/// that forks in a loop is caught within a few rounds), and `extra` pids. Cleanup only.
pub fn sweep(dir: &Path, extra: &[i32]) {
    for &p in extra {
        let _ = crate::sys::pidfd_kill(p);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = marked(dir);
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        for p in left {
            let _ = crate::sys::pidfd_kill(p);
        }
    }
}

/// Sweeps a run dir's marked processes when dropped: cleanup that holds when a test panics.
pub struct SweepOnDrop(pub PathBuf);

impl Drop for SweepOnDrop {
    fn drop(&mut self) {
        sweep(&self.0, &[]);
    }
}

/// A cgroup root made and chowned to `nobody` (a delegated subtree, as an operator or systemd
/// `Delegate=yes` gives one), removed (with what is left below it) when dropped.
pub struct Delegated {
    pub path: PathBuf,
}

impl Delegated {
    pub fn new(tag: &str) -> Option<Delegated> {
        let mount = cgroup2_mount()?;
        let path = mount.join(format!("agent-run-test.{tag}.{}", std::process::id()));
        fs::create_dir(&path).ok()?;
        for f in [
            "",
            "cgroup.procs",
            "cgroup.threads",
            "cgroup.subtree_control",
        ] {
            let p = if f.is_empty() {
                path.clone()
            } else {
                path.join(f)
            };
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).ok()?;
        }
        Some(Delegated { path })
    }

    /// `program args...` as nobody, started inside the delegated cgroup (root moves the
    /// waiting process in before it execs), with its output captured.
    pub fn run_as_nobody(&self, program: &Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
        let mut cmd = crate::hostile::as_nobody(Path::new("/bin/sh"));
        cmd.arg("-c")
            .arg("read _ && exec \"$@\"")
            .arg("sh")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn a shell as nobody");
        let pid = child.id();
        // setpriv execs the shell in place: the pid is the shell's.
        fs::write(self.path.join("cgroup.procs"), pid.to_string()).expect("move into the cgroup");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("release the shell");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(out) => out.expect("wait for the nobody command"),
            Err(_) => {
                let _ = crate::sys::pidfd_kill(pid as i32);
                panic!("{} as nobody ran over 60 s", program.display());
            }
        }
    }
}

/// Remove a cgroup and every cgroup below it, deepest first, each once the kernel says it is
/// empty (`populated 0`), to one deadline. Err(what is left, and why).
pub fn remove_cgroup_tree(top: &Path, wait: Duration) -> Result<(), String> {
    let mut dirs = vec![top.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        let below: Vec<PathBuf> = fs::read_dir(&dirs[i])
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        dirs.extend(below);
        i += 1;
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    let start = Instant::now();
    for d in dirs {
        let left = wait.saturating_sub(start.elapsed());
        poll_until(left, || match fs::remove_dir(&d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!(
                "{}: {e}; {}; procs {:?}",
                d.display(),
                fs::read_to_string(d.join("cgroup.events"))
                    .unwrap_or_default()
                    .trim(),
                fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default()
            )),
            _ => Ok(()),
        })
        .map_err(|(_, why)| why)?;
    }
    Ok(())
}

impl Drop for Delegated {
    fn drop(&mut self) {
        // The run cgroup below may still be on its way out (its last process exiting, the
        // stop removing it): waited for, so that no delegated root is left behind.
        if let Err(why) = remove_cgroup_tree(&self.path, Duration::from_secs(10)) {
            eprintln!("left behind: {why}");
        }
    }
}

/// Whether `pid` is alive: some thread of it runs (a zombie main thread with live threads is
/// alive).
pub fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|s| !matches!(s.0, 'Z' | 'X') || crate::proc_threads(pid) > 1)
}

/// Waits until `probe` holds, up to `timeout`; the last value it returned otherwise.
pub fn eventually(timeout: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if probe() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `Command` for the fixture with the given arguments, stdin from /dev/null.
pub fn fixture(args: &[&str]) -> Command {
    let mut c = Command::new(crate::fixture_bin());
    c.args(args).stdin(Stdio::null());
    c
}
