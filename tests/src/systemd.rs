//! A real systemd for tests: Debian 12's systemd 252 booted as PID 1 of its own pid, mount,
//! cgroup and uts namespaces, on a fresh overlay of a cached Debian root, with the agent-run
//! package of the binaries under test installed.
//!
//! [`Boot`] starts one (about a second), [`Systemd`] is a running one: commands go in through
//! `nsenter` as root ([`Systemd::root`]), as a user outside any login session ([`Systemd::user`])
//! or in a real login session through PAM and logind ([`Systemd::login`]). Each command first
//! moves itself into a cgroup of the boot's own tree (`/sys/fs/cgroup/agent-run-harness` inside),
//! so /proc/self/cgroup says where it is as on a real host, and the teardown finds it.
//!
//! How a boot is made: a cgroup of its own on the host's cgroup2 mount; in it, `unshare` makes
//! the namespaces; its child mounts the overlay (the cached root below a fresh upper dir), proc,
//! sysfs, cgroup2 (the boot's cgroup is the root of its cgroup namespace), tmpfs on /run and
//! /tmp, the host's /dev with /dev/null over its console and kmsg; then `pivot_root` (not
//! chroot: a chrooted process may not make user namespaces, which systemd's sandboxing uses) and
//! exec of `/lib/systemd/systemd --system` with `container=` set.
//!
//! Its cgroup2 mount is the host's hierarchy, seen from the boot's cgroup namespace, with the
//! host's mount flags: `nsdelegate` is there only if the host's mount has it (the kernel takes
//! that flag only from the initial cgroup namespace, and ignores it from any other, systemd's
//! own mount included).
//!
//! The teardown, on drop (a panicking test included): SIGKILL to PID 1 through its pidfd, which
//! kills every process of its pid namespace; the mount namespace, overlay and all, goes with the
//! last of them. Then the cgroups, bottom-up, once the kernel says they are empty, and the
//! overlay's directories. If the test process dies first, its child `setpriv --pdeathsig KILL`
//! kills `unshare`, and `unshare --kill-child` kills PID 1; a later test process removes the
//! directories and cgroups of boots whose process is gone.

mod image;

pub use image::{cached_root, package, SUITE, USERS};

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::contain::{cgroup2_mount, remove_cgroup_tree};
use crate::{describe_output, poll_until, run_with_timeout, sys};

/// The prefix of every boot's name: its directory under `target/systemd-test/` and its cgroup
/// on the host's cgroup2 mount are `<prefix><test process pid>-<n>`.
const PREFIX: &str = "agent-run-systemd-";

/// The cgroup inside the boot that the harness's commands run in.
pub const HARNESS_CGROUP: &str = "/sys/fs/cgroup/agent-run-harness";

/// PATH inside the boot.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a boot may take to reach `running`, and a command to finish, on a loaded machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// A boot to be: files to put in the root first, then [`Boot::start`].
pub struct Boot {
    files: Vec<(String, Vec<u8>)>,
    package: bool,
}

impl Default for Boot {
    fn default() -> Self {
        Self::new()
    }
}

impl Boot {
    /// A boot of the cached root with the agent-run package installed.
    pub fn new() -> Boot {
        Boot {
            files: Vec::new(),
            package: true,
        }
    }

    /// Put `text` at `path` (absolute, inside the root) before systemd starts, mode 0644, owned
    /// by root, as a drop-in in /etc that must be there at boot. Directories it needs are made
    /// like the root's own (mode and owner); no part of `path` may be a symlink in the root.
    pub fn file(mut self, path: &str, text: &str) -> Boot {
        assert!(path.starts_with('/'), "{path} is not absolute");
        self.files
            .push((path.to_string(), text.as_bytes().to_vec()));
        self
    }

    /// Boot without installing the agent-run package.
    pub fn without_package(mut self) -> Boot {
        self.package = false;
        self
    }

    /// Boot, wait until `systemctl is-system-running` says `running`, install the package.
    pub fn start(self) -> Systemd {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(sweep_stale_boots);
        let lower = cached_root();
        let deb = self.package.then(package);
        let mount = cgroup2_mount().expect("the systemd tests need a cgroup2 mount on the host");
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = image::target_dir().join("systemd-test").join(&name);
        for sub in ["upper", "work", "merged"] {
            fs::create_dir_all(dir.join(sub))
                .unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.join(sub).display()));
        }
        for (path, text) in &self.files {
            write_before_boot(&dir.join("upper"), lower, path, text);
        }
        let cgroup = mount.join(&name);
        fs::create_dir(&cgroup).unwrap_or_else(|e| panic!("mkdir {}: {e}", cgroup.display()));
        let started = Instant::now();
        let unshare = spawn_pid1(&cgroup, lower, &dir);
        let mut sd = Systemd {
            name,
            dir,
            cgroup,
            pid1: 0,
            pidfd: None,
            unshare: Some(unshare),
            booted_in: Duration::ZERO,
        };
        sd.find_pid1();
        sd.wait_running();
        sd.booted_in = started.elapsed();
        sd.sh(&format!("mkdir {HARNESS_CGROUP}"));
        if let Some(deb) = deb {
            let inside = "/tmp/agent-run.deb";
            fs::copy(deb, sd.path(inside))
                .unwrap_or_else(|e| panic!("copy {} into the boot: {e}", deb.display()));
            sd.sh(&format!("dpkg -i {inside} >/dev/null && rm {inside}"));
        }
        sd
    }
}

/// `setpriv --pdeathsig KILL -- sh` that moves itself into `cgroup`, then `unshare` whose child
/// mounts the root and execs systemd. Its stdout and stderr (systemd's console) go to
/// `<dir>/console.log`.
fn spawn_pid1(cgroup: &Path, lower: &Path, dir: &Path) -> Child {
    let inner = r#"set -e
mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4"
cd "$4"
mount -t proc proc proc
mount -t sysfs sysfs sys
mount -t cgroup2 cgroup2 sys/fs/cgroup
mount -t tmpfs -o mode=0755 tmpfs run
mount -t tmpfs -o mode=1777 tmpfs tmp
mount --rbind /dev dev
mount --bind /dev/null dev/console
mount --bind /dev/null dev/kmsg
pivot_root . .
umount -l .
cd /
exec env -i container=agent-run-test /lib/systemd/systemd --system"#;
    let outer = r#"echo $$ > "$1/cgroup.procs" && shift && exec unshare --pid --fork --kill-child --mount --uts --cgroup --propagation private -- sh -c "$@""#;
    for p in [lower, dir] {
        let s = p.to_string_lossy();
        assert!(
            !s.contains([',', ':', '\\']),
            "an overlay option cannot name {s}"
        );
    }
    let console = fs::File::create(dir.join("console.log")).expect("console.log");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", "sh", "-c", outer, "sh"])
        .arg(cgroup)
        .args([inner, "boot"])
        .arg(lower)
        .arg(dir.join("upper"))
        .arg(dir.join("work"))
        .arg(dir.join("merged"))
        .stdin(Stdio::null())
        .stdout(console.try_clone().expect("console.log"))
        .stderr(console);
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"))
}

/// Write a file into the overlay's upper dir before the mount. A directory that the root has is
/// made with its mode and owner (an upper directory's own attributes are what the merged view
/// shows).
fn write_before_boot(upper: &Path, lower: &Path, path: &str, text: &[u8]) {
    let rel = Path::new(path.trim_start_matches('/'));
    let mut sub = PathBuf::new();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        sub.push(part);
        let low = fs::symlink_metadata(lower.join(&sub));
        assert!(
            !low.as_ref().is_ok_and(|m| m.file_type().is_symlink()),
            "{path}: {} is a symlink in the root; name the real path",
            sub.display()
        );
        let dir = upper.join(&sub);
        if dir.is_dir() {
            continue;
        }
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let (mode, uid, gid) = low.map_or((0o755, 0, 0), |m| (m.mode() & 0o7777, m.uid(), m.gid()));
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).expect("chmod");
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
    }
    let file = upper.join(rel);
    fs::write(&file, text).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).expect("chmod");
}

/// Boots of test processes that are gone (killed before their drop ran): their directories, and
/// their cgroups, emptied by `cgroup.kill` first.
fn sweep_stale_boots() {
    let dead = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .is_some_and(|pid| !Path::new("/proc").join(pid).exists())
    };
    if let Some(mount) = cgroup2_mount() {
        for e in fs::read_dir(&mount).into_iter().flatten().flatten() {
            if dead(&e.file_name().to_string_lossy()) {
                let _ = fs::write(e.path().join("cgroup.kill"), "1");
                let _ = remove_cgroup_tree(&e.path(), Duration::from_secs(10));
            }
        }
    }
    let tests = image::target_dir().join("systemd-test");
    for e in fs::read_dir(&tests).into_iter().flatten().flatten() {
        if dead(&e.file_name().to_string_lossy()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// A running systemd: see the module's doc.
pub struct Systemd {
    name: String,
    dir: PathBuf,
    cgroup: PathBuf,
    pid1: i32,
    pidfd: Option<OwnedFd>,
    unshare: Option<Child>,
    /// From the spawn of its namespaces to `is-system-running` saying `running`.
    pub booted_in: Duration,
}

impl Systemd {
    /// A boot with the agent-run package and nothing else changed ([`Boot::new`]).
    pub fn boot() -> Systemd {
        Boot::new().start()
    }

    /// The host's pid of its PID 1.
    pub fn pid1(&self) -> i32 {
        self.pid1
    }

    /// Its root cgroup, on the host's cgroup2 mount (its `/sys/fs/cgroup`).
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// Its directory on the host: the overlay's upper, work and merged dirs, console.log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A path on its cgroup2 mount (`/sys/fs/cgroup/...`, as its records name cgroups) as a path
    /// on the host's.
    pub fn host_cgroup(&self, inside: &str) -> PathBuf {
        let rel = inside
            .strip_prefix("/sys/fs/cgroup")
            .unwrap_or_else(|| panic!("{inside} is not on the boot's cgroup2 mount"));
        self.cgroup.join(rel.trim_start_matches('/'))
    }

    /// A path inside it, reachable from the host (through /proc/PID1/root).
    pub fn path(&self, inside: &str) -> PathBuf {
        Path::new("/proc")
            .join(self.pid1.to_string())
            .join("root")
            .join(inside.trim_start_matches('/'))
    }

    fn find_pid1(&mut self) {
        let unshare = self.unshare.as_ref().expect("unshare").id();
        let children = format!("/proc/{unshare}/task/{unshare}/children");
        let pid1 = poll_until(Duration::from_secs(30), || {
            let text = fs::read_to_string(&children).map_err(|e| e.to_string())?;
            text.split_whitespace()
                .next()
                .and_then(|p| p.parse::<i32>().ok())
                .ok_or(text)
        })
        .unwrap_or_else(|(_, seen)| {
            panic!(
                "unshare ({unshare}) made no PID 1: {seen:?}\n{}",
                self.console()
            )
        });
        self.pid1 = pid1;
        self.pidfd = sys::pidfd_open(pid1).expect("pidfd_open of PID 1");
        let status = fs::read_to_string(format!("/proc/{pid1}/status")).unwrap_or_default();
        assert!(
            status
                .lines()
                .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
            "process {pid1} is not PID 1 of a pid namespace:\n{status}"
        );
    }

    fn wait_running(&self) {
        let seen = poll_until(BOOT_TIMEOUT, || {
            let out = self.run(self.root("systemctl").arg("is-system-running"));
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            match state.as_str() {
                "running" => Ok(()),
                "degraded" | "maintenance" | "stopping" => Ok(()),
                _ => Err(format!(
                    "{state:?} {}",
                    String::from_utf8_lossy(&out.stderr)
                )),
            }
        });
        if let Err((waited, seen)) = seen {
            panic!(
                "systemd did not reach running in {waited:?}; last seen {seen}\n{}",
                self.diagnostics()
            );
        }
        let state = self.sh("systemctl is-system-running || true");
        assert_eq!(
            state.trim(),
            "running",
            "the boot is not clean\n{}",
            self.diagnostics()
        );
    }

    /// Moved into [`HARNESS_CGROUP`] (once the boot made it), then `nsenter` into every
    /// namespace of PID 1, its root and its working directory, with a clean environment: the
    /// start of every command. The move is made on the host's side: with `nsdelegate` on the
    /// mount, a process in the boot's cgroup namespace may not move itself in from outside.
    fn enter(&self) -> Command {
        let harness = self.host_cgroup(HARNESS_CGROUP);
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "if [ -d '{0}' ]; then echo $$ > '{0}/cgroup.procs' || exit 125; fi; exec \"$@\"",
                harness.display()
            ))
            .arg("enter")
            .args([
                "nsenter",
                "-t",
                &self.pid1.to_string(),
                "-a",
                "-r",
                "-w",
                "--",
            ])
            .args(["env", "-i", PATH, "LANG=C.UTF-8"])
            .stdin(Stdio::null());
        c
    }

    /// `program` as root inside (HOME=/root); add its arguments.
    pub fn root(&self, program: &str) -> Command {
        let mut c = self.enter();
        c.args(["env", "HOME=/root", "USER=root", "LOGNAME=root", program]);
        c
    }

    /// `program` as `user` inside, outside any login session (`runuser -u`, as a cron job or
    /// a service would run it), with the environment a login gives: HOME, USER, LOGNAME, PATH
    /// and XDG_RUNTIME_DIR (`/run/user/UID`, there while the user's manager runs).
    pub fn user(&self, user: &str, program: &str) -> Command {
        let uid = self.uid(user);
        let mut c = self.enter();
        c.args([
            "runuser",
            "-u",
            user,
            "--",
            "env",
            "-i",
            PATH,
            "LANG=C.UTF-8",
        ])
        .arg(format!("HOME=/home/{user}"))
        .arg(format!("USER={user}"))
        .arg(format!("LOGNAME={user}"))
        .arg(format!("XDG_RUNTIME_DIR=/run/user/{uid}"))
        .arg(program);
        c
    }

    /// `script` (sh) in a login session of `user` (`runuser -l`, PAM with pam_systemd: logind
    /// makes a `session-N.scope` and starts the user's manager), as an SSH login would; the
    /// session ends when the script exits.
    pub fn login(&self, user: &str, script: &str) -> Command {
        let mut c = self.enter();
        c.args(["runuser", "-l", user, "-c", script]);
        c
    }

    /// Run `cmd` to completion (a generous deadline), whatever its exit status.
    pub fn run(&self, cmd: &mut Command) -> Output {
        run_with_timeout(cmd, COMMAND_TIMEOUT)
    }

    /// Run `cmd`, which must exit 0; its stdout. Panics with its output and the boot's state.
    pub fn ok(&self, cmd: &mut Command) -> String {
        let what = format!("{cmd:?}");
        let out = self.run(cmd);
        if !out.status.success() {
            panic!("{}\n{}", describe_output(&what, &out), self.diagnostics());
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sh -c script` as root inside, which must exit 0; its stdout.
    pub fn sh(&self, script: &str) -> String {
        self.ok(self.root("sh").args(["-c", script]))
    }

    /// `sh -c script` as `user` inside ([`Systemd::user`]), which must exit 0; its stdout.
    pub fn sh_as(&self, user: &str, script: &str) -> String {
        self.ok(self.user(user, "sh").args(["-c", script]))
    }

    /// The uid of `user` in the root's /etc/passwd.
    pub fn uid(&self, user: &str) -> u32 {
        let passwd = fs::read_to_string(self.path("/etc/passwd")).expect("/etc/passwd");
        passwd
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.first() == Some(&user)).then(|| f.get(2)?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no user {user} in the root"))
    }

    /// `journalctl --no-pager ARGS...` inside, as root.
    pub fn journal(&self, args: &[&str]) -> String {
        self.ok(self.root("journalctl").arg("--no-pager").args(args))
    }

    /// `systemctl show` of `props` of a system unit.
    pub fn show(&self, unit: &str, props: &[&str]) -> BTreeMap<String, String> {
        parse_show(
            &self.ok(self
                .root("systemctl")
                .args(["show", unit, "-p", &props.join(",")])),
        )
    }

    /// `systemctl --user show` of `props` of a unit of `user`'s manager.
    pub fn show_user(&self, user: &str, unit: &str, props: &[&str]) -> BTreeMap<String, String> {
        let mut cmd = self.user(user, "systemctl");
        cmd.args(["--user", "show", unit, "-p", &props.join(",")]);
        parse_show(&self.ok(&mut cmd))
    }

    /// The host's pid of the process whose pid is `ns_pid` inside (None when there is none).
    pub fn host_pid(&self, ns_pid: i32) -> Option<i32> {
        let ours = fs::read_link(format!("/proc/{}/ns/pid", self.pid1)).ok()?;
        let entries = fs::read_dir("/proc").ok()?;
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|&p| {
                fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|ns| ns == ours)
                    && fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                        s.lines()
                            .find_map(|l| l.strip_prefix("NSpid:"))
                            .and_then(|l| l.split_whitespace().last()?.parse::<i32>().ok())
                            == Some(ns_pid)
                    })
            })
    }

    /// Whether the process whose pid is `ns_pid` inside and whose start time is `ticks` (a
    /// record's pid and start ticks) is alive: not gone, not a zombie, not a reused pid.
    pub fn alive(&self, ns_pid: i64, ticks: u64) -> bool {
        let Ok(pid) = i32::try_from(ns_pid) else {
            return false;
        };
        self.host_pid(pid)
            .is_some_and(|h| crate::alive_as(h, ticks))
    }

    /// The record of the run dir `run_dir` (a path inside), or why there is none.
    pub fn try_status(&self, run_dir: &str) -> Result<Value, String> {
        let path = self.path(run_dir).join("status.json");
        let bytes = crate::read_run_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The record of the run dir `run_dir` (a path inside).
    pub fn status(&self, run_dir: &str) -> Value {
        self.try_status(run_dir)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.run_diagnostics(run_dir)))
    }

    /// Waits, to one deadline, for the record of `run_dir` to have a state `want` accepts.
    pub fn wait_state(
        &self,
        run_dir: &str,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Value {
        poll_until(timeout, || {
            let st = self.try_status(run_dir)?;
            match st["state"].as_str() {
                Some(state) if want(state) => Ok(st),
                other => Err(format!("state {other:?}")),
            }
        })
        .unwrap_or_else(|(waited, seen)| {
            panic!(
                "{run_dir}: no wanted state after {waited:?}; last seen {seen}\n{}\n{}",
                self.run_diagnostics(run_dir),
                self.diagnostics()
            )
        })
    }

    /// The journal of the run dir `run_dir` (events.jsonl), one value per line.
    pub fn events(&self, run_dir: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.path(run_dir).join("events.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The run dir `run_dir` (a path inside) for failure messages.
    pub fn run_diagnostics(&self, run_dir: &str) -> String {
        crate::run_dir_diagnostics(&self.path(run_dir))
    }

    fn console(&self) -> String {
        fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// Its state for failure messages: is-system-running, failed units, the journal's tail,
    /// systemd's console.
    pub fn diagnostics(&self) -> String {
        let text = |cmd: &mut Command| {
            let out = run_with_timeout(cmd, Duration::from_secs(20));
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        format!(
            "--- boot {} (PID 1 is {} on the host)\n--- is-system-running: {}--- failed units\n{}--- journal (last 60 lines)\n{}--- console\n{}",
            self.name,
            self.pid1,
            text(self.root("systemctl").arg("is-system-running")),
            text(self.root("systemctl").args(["list-units", "--failed", "--no-pager"])),
            text(self.root("journalctl").args(["--no-pager", "-n", "60"])),
            self.console()
        )
    }

    /// The teardown, for Drop: what is left, if anything.
    fn teardown(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        if let Some(fd) = &self.pidfd {
            if let Err(e) = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    left.push(format!("SIGKILL to PID 1 {}: {e}", self.pid1));
                }
            }
        }
        if let Some(mut child) = self.unshare.take() {
            // unshare reaps PID 1, whose exit waits for every process of its namespace.
            match crate::commands::wait_deadline(&mut child, Duration::from_secs(60)) {
                Ok(Some(_)) => {}
                other => {
                    let _ = child.kill();
                    let _ = child.wait();
                    left.push(format!("unshare {} did not exit: {other:?}", child.id()));
                }
            }
        }
        let _ = fs::write(self.cgroup.join("cgroup.kill"), "1");
        if let Err(why) = remove_cgroup_tree(&self.cgroup, Duration::from_secs(30)) {
            left.push(format!("cgroup left: {why}"));
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            left.push(format!("cannot remove {}: {e}", self.dir.display()));
        }
        left
    }
}

/// `systemctl show`'s `KEY=VALUE` lines.
fn parse_show(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Drop for Systemd {
    /// Tears the boot down (see the module's doc). Anything left fails the test, unless it is
    /// failing already (then it is printed).
    fn drop(&mut self) {
        let left = self.teardown();
        if left.is_empty() {
            return;
        }
        let msg = format!("the boot {} left: {left:#?}", self.name);
        if std::thread::panicking() {
            eprintln!("{msg}");
        } else {
            panic!("{msg}");
        }
    }
}
