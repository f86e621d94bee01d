//! agent-run commands a test runs to completion: `agent-run --root R ARGS` and its exit code,
//! the JSON it prints, a detached run of a fixture tree, an `agent-run remote` command line, and
//! a [`Sweep`] that kills what a test's runs left behind.

use std::fs;
use std::process::{Command, Output, Stdio};

use agent_run_shared::time::parse_rfc3339;
use serde_json::Value;

use crate::ctx::T;
use crate::remote::SshServer;
use crate::workload::fixture_path;
use crate::{
    agent_run_bin, ctx, describe_output, exit_code, processes_with_env, run_with_timeout,
    wait_ready, Pinned, TestRoot,
};

/// `agent-run --root R ARGS...`, to completion.
pub fn ar(root: &TestRoot, args: &[&str]) -> Output {
    run_with_timeout(root.cmd().args(args), T * 2)
}

/// `agent-run --root R ARGS...`, which must exit `code`.
pub fn ar_code(root: &TestRoot, args: &[&str], code: i32) -> Output {
    let out = ar(root, args);
    if exit_code(&out.status) != code {
        panic!(
            "expected exit {code}\n{}",
            describe_output(&format!("{args:?}"), &out)
        );
    }
    out
}

/// The JSON document a command printed on stdout.
pub fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{}", describe_output("", out)))
}

pub fn epoch(v: &Value, key: &str) -> f64 {
    parse_rfc3339(v[key].as_str().unwrap_or_else(|| panic!("no {key} in {v}")))
        .unwrap_or_else(|| panic!("bad {key} in {v}"))
}

/// A detached run of `fixture tree ARGS` with `opts`: its ready line and the pins of the
/// wrapper and of every process of the tree.
pub struct DetachedTree {
    pub id: String,
    pub wrapper: i32,
    pub wrapper_pin: Pinned,
    pub tree: Pinned,
}

pub fn detached(root: &TestRoot, id: &str, opts: &[&str], tree: &[&str]) -> DetachedTree {
    let mut args = vec!["start", "-d"];
    args.extend(opts);
    args.push(id);
    args.push("--");
    let fx = fixture_path();
    args.push(&fx);
    args.push("tree");
    args.extend(tree);
    ar_code(root, &args, 0);
    let ready = wait_ready(&root.run_dir(id).join("stdout.log"), T);
    let st = root.status(id);
    let wrapper = st["wrapper_pid"].as_i64().unwrap_or(0) as i32;
    DetachedTree {
        id: id.to_string(),
        wrapper,
        wrapper_pin: Pinned::new(&[wrapper]),
        tree: Pinned::new(&ready.all_pids()),
    }
}

impl DetachedTree {
    /// Every process of the tree is gone (zombies count as gone).
    pub fn assert_gone(&self, root: &TestRoot, what: &str) {
        ctx(root, &self.id).wait_gone(&self.tree, what);
    }
}

// ---------------------------------------------------------------------------------------------
// remote: the version probe and --timeout

pub fn remote_cmd(srv: &SshServer, root: &TestRoot, bin: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(agent_run_bin());
    cmd.arg("remote")
        .args(srv.remote_args())
        .args(["--remote-bin", bin])
        .arg("--remote-root")
        .arg(root.root())
        .args(args)
        .env("XDG_RUNTIME_DIR", root.dir.path())
        .env_remove("AGENT_RUN_ROOT")
        .stdin(Stdio::null());
    cmd
}

/// Kills, by pid (through pidfds), whatever of this root's runs is alive when the test ends,
/// pass or fail: workloads by their `AGENT_RUN_DIR` marker, wrappers by the `--root` in their
/// argv. Declare it right after the [`TestRoot`], so it runs before the root is removed.
pub struct Sweep<'a>(pub &'a TestRoot);

impl Drop for Sweep<'_> {
    fn drop(&mut self) {
        sweep(self.0);
    }
}

/// Kills, by pid (through pidfds), whatever of the runs of `root` is alive: workloads by their
/// `AGENT_RUN_DIR` marker, wrappers by the `--root` in their argv. Never fails.
pub fn sweep(root: &TestRoot) {
    let prefix = root.root().as_os_str().as_encoded_bytes().to_vec();
    crate::kill_until_gone(50, || {
        let mut left = processes_with_env("AGENT_RUN_DIR", |v| v.starts_with(&prefix));
        left.extend(wrappers_of(root));
        left
    });
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// =============================================================================================
// -d on a run id that exists

/// Live (non-zombie) agent-run processes of this root: their argv holds `--root <root>`.
pub fn wrappers_of(root: &TestRoot) -> Vec<i32> {
    processes_with_argv(|argv| argv.iter().any(|a| *a == root.root().display().to_string()))
}

/// Live (non-zombie) processes whose argv `keep` accepts, sorted.
pub fn processes_with_argv(keep: impl Fn(&[String]) -> bool) -> Vec<i32> {
    let mut pids: Vec<i32> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| {
            let argv = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<String> = argv
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            !argv.is_empty() && keep(&argv)
        })
        .collect();
    pids.sort_unstable();
    pids
}
