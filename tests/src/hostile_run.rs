//! A run whose workload attacks its own run: the three places it can run from (root in a
//! cgroup of its own; `nobody` held by /proc scans; `nobody` in a cgroup delegated to it), the
//! commands a controller of that user runs, and a workload script that waits for the test's
//! go, then does its damage.
//!
//! The damage is done by the workload itself, as the user it runs as: a file it makes is its
//! user's, as a real workload's would be.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::contain::{cgroup2_mount, Delegated};
use crate::hostile::{as_nobody, Detached, NOBODY};
use crate::{agent_run_bin, run_with_timeout, watchdog_bin, TestRoot};

pub use crate::modes::Mode;

/// A generous deadline for one command.
pub const CMD: Duration = Duration::from_secs(60);

/// A test's root, set up for `mode`.
pub struct Side<'a> {
    pub root: &'a TestRoot,
    pub mode: Mode,
    delegated: Option<Delegated>,
    /// In procfs mode, a cgroup of the test's the runs start in ([`Side::held`]): agent-run
    /// makes none and knows nothing of it; the test kills what is left through it.
    holder: Option<Delegated>,
    /// A directory every user reaches: the go files.
    pub shared: PathBuf,
}

impl<'a> Side<'a> {
    pub fn new(root: &'a TestRoot, mode: Mode, tag: &str) -> Side<'a> {
        fs::set_permissions(root.dir.path(), fs::Permissions::from_mode(0o755))
            .expect("chmod the test dir");
        let shared = root.dir.path().join("shared");
        fs::create_dir_all(&shared).expect("the shared dir");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).expect("chmod shared");
        if !mode.as_root() {
            fs::create_dir_all(root.root()).expect("nobody's root");
            fs::set_permissions(root.root(), fs::Permissions::from_mode(0o700)).expect("chmod");
            std::os::unix::fs::chown(root.root(), Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        let delegated = (mode == Mode::NobodyDelegated)
            .then(|| Delegated::new(tag).expect("a cgroup delegated to nobody"));
        Side {
            root,
            mode,
            delegated,
            holder: None,
            shared,
        }
    }

    /// The same, with a procfs-mode run started inside a cgroup of the test's, so that the
    /// test can kill whatever the run leaves (a pid hopper that outruns every look) by the
    /// cgroup's path.
    pub fn held(root: &'a TestRoot, mode: Mode, tag: &str) -> Side<'a> {
        let mut side = Side::new(root, mode, tag);
        if !mode.cgroup() && cgroup2_mount().is_some() {
            side.holder = Delegated::new(&format!("{tag}h"));
        }
        side
    }

    /// The cgroup a procfs-mode run was started in ([`Side::held`]).
    pub fn holder(&self) -> Option<&Path> {
        self.holder.as_ref().map(|d| d.path.as_path())
    }

    /// The delegated cgroup, in that mode.
    pub fn delegated(&self) -> Option<&Path> {
        self.delegated.as_ref().map(|d| d.path.as_path())
    }

    fn program(&self, program: &Path) -> Command {
        let mut cmd = if self.mode.as_root() {
            let mut c = Command::new(program);
            c.stdin(Stdio::null())
                .env(crate::LEASE_TOKEN_ENV, crate::LEASE_TOKEN);
            c
        } else {
            as_nobody(program)
        };
        cmd.env_remove("AGENT_RUN_ROOT");
        cmd
    }

    /// `agent-run --root R`, as the run's user.
    pub fn agent_run(&self) -> Command {
        let mut cmd = self.program(&agent_run_bin());
        cmd.arg("--root").arg(self.root.root());
        cmd
    }

    /// `agent-run-watchdog --root R`, as the run's user.
    pub fn watchdog(&self) -> Command {
        let mut cmd = self.program(&watchdog_bin());
        cmd.arg("--root").arg(self.root.root());
        cmd
    }

    /// Run `agent-run ARGS...` as the run's user: (exit code, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = run_with_timeout(self.agent_run().args(args), CMD);
        (
            crate::exit_code(&out.status),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `start -d OPTS ID -- sh -c SCRIPT`: from inside the delegated cgroup in that mode, with
    /// `--cgroup off` in procfs mode. Returns the run.
    pub fn start(&self, id: &str, opts: &[&str], script: &str) -> Run {
        let mut args: Vec<String> = vec!["start".into(), "-d".into()];
        args.extend(self.mode.opts().into_iter().map(String::from));
        args.extend(opts.iter().map(|s| s.to_string()));
        args.extend([id.into(), "--".into(), "/bin/sh".into(), "-c".into()]);
        args.push(script.into());
        let out: Output = match self.delegated.as_ref().or(self.holder.as_ref()) {
            Some(d) => {
                let mut all: Vec<std::ffi::OsString> =
                    vec!["--root".into(), self.root.root().into_os_string()];
                all.extend(args.iter().map(Into::into));
                let refs: Vec<&std::ffi::OsStr> = all.iter().map(|a| a.as_os_str()).collect();
                d.run_as_nobody(&agent_run_bin(), &refs)
            }
            None => run_with_timeout(self.agent_run().args(&args), CMD),
        };
        assert!(
            out.status.success(),
            "start {id} in {:?}: {}",
            self.mode,
            crate::describe_output("start -d", &out)
        );
        Run {
            run: Detached::from_record(self.root, id),
            go: self.shared.join(format!("{id}.go")),
            said: self.shared.join(format!("{id}.said")),
        }
    }
}

/// A started run: its ids and pins (a [`Detached`], which it derefs to), and the files the
/// workload script and the test talk through.
pub struct Run {
    pub run: Detached,
    /// The file whose creation lets the workload do its damage.
    pub go: PathBuf,
    /// Where the workload writes what it did (one line a step).
    pub said: PathBuf,
}

impl std::ops::Deref for Run {
    type Target = Detached;
    fn deref(&self) -> &Detached {
        &self.run
    }
}

impl Run {
    /// Let the workload go, and wait until it says it did `step`.
    pub fn go_and_wait(&self, step: &str) {
        fs::write(&self.go, b"go\n").expect("the go file");
        fs::set_permissions(&self.go, fs::Permissions::from_mode(0o644)).expect("chmod go");
        crate::wait_until_dbg(&format!("the workload to say {step:?}"), CMD, || {
            let said = fs::read_to_string(&self.said).unwrap_or_default();
            if said.lines().any(|l| l == step) {
                Ok(())
            } else {
                Err(said)
            }
        });
    }

    /// What the workload said it did.
    pub fn said(&self) -> String {
        fs::read_to_string(&self.said).unwrap_or_default()
    }
}

/// A workload script: TERM and HUP ignored (a stop needs its KILL), waits for the go file, runs
/// `damage` (sh, with `$AGENT_RUN_DIR`, `$GO`, `$SAID` and `say STEP` to report), then sleeps.
/// The pids of what it started go into `$SAID` as `pid NAME N` lines when it says so.
pub fn workload(run_go: &Path, said: &Path, damage: &str) -> String {
    format!(
        "trap '' TERM HUP; GO='{go}'; SAID='{said}'; say() {{ echo \"$1\" >> \"$SAID\"; }}; \
         while [ ! -e \"$GO\" ]; do sleep 0.02; done\n{damage}\nsay done\n\
         while :; do sleep 1; done",
        go = run_go.display(),
        said = said.display(),
    )
}

/// The go and said files a run `id` of `side` will use (to build its script before it starts).
pub fn files_of(side: &Side<'_>, id: &str) -> (PathBuf, PathBuf) {
    (
        side.shared.join(format!("{id}.go")),
        side.shared.join(format!("{id}.said")),
    )
}

/// The pid the workload said for `name` (`pid NAME N` lines).
pub fn said_pid(said: &str, name: &str) -> Option<i32> {
    said.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("pid") && w.next() == Some(name)).then(|| w.next()?.parse().ok())?
    })
}

/// A run's record, read as the test's root (the record is nobody's in nobody's modes).
pub fn record(root: &TestRoot, id: &str) -> Value {
    root.status(id)
}
