//! cgroup v2: a cgroup per run where the host gives one, so the kernel holds the run.
//!
//! Every process and thread of a cgroup is a member whatever its session, group, environment or
//! parent; `cgroup.kill` kills them all at once, new forks included; `cgroup.events` says
//! `populated 0` the moment nothing is left. This module finds the cgroup2 mount (from
//! /proc/self/mountinfo, never a fixed path), decides where a run's cgroup goes
//! ([`choose_parent`]), creates it ([`RunCgroup::create`]), checks a recorded one before anyone
//! acts on it ([`RunCgroup::verify`]), and reads and writes its files.
//!
//! Where the cgroup goes, in order: an explicit parent (`--cgroup DIR`, `AGENT_RUN_CGROUP`); the
//! wrapper's own cgroup (the `0::` line of /proc/self/cgroup) when this user may create a child
//! there and move processes into it (root; a subtree delegated to the user, or a parent an
//! operator created and chowned to the user, with the wrapper inside it). Otherwise the run is
//! held by the procfs process set ([`crate::procset`]). `off` (or `none`) asks for procfs.
//!
//! The workload never runs outside its cgroup: it is made in it, by clone3(2) with
//! CLONE_INTO_CGROUP ([`crate::spawn::spawn_workload`]); on kernels before 5.7 the forked child
//! writes `0` to `cgroup.procs` before its exec. The wrapper stays outside, so `cgroup.kill`
//! never kills it.
//!
//! What it does not do: enable controllers (no `cgroup.subtree_control` writes: a run's cgroup
//! is for holding and counting, and enabling controllers would forbid processes in the parent).

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

/// The environment variable that names the parent of a run's cgroup (or `off`).
pub const ENV: &str = "AGENT_RUN_CGROUP";

/// Set in the environment of a wrapper that [`user_scope_command`] started, so it never asks for
/// a second scope.
pub const ENV_IN_SCOPE: &str = "AGENT_RUN_IN_SCOPE";

/// For a user who is not root and has no cgroup to use, but a running systemd user manager
/// (`$XDG_RUNTIME_DIR/systemd/private`) that lingers, and `systemd-run` on PATH: the command
/// that puts a wrapper in a transient scope delegated to the user (`systemd-run --user --scope
/// -p Delegate=yes`), to which the caller appends the wrapper's own command line. The wrapper
/// then finds its own cgroup, the scope, usable. `None` when any of that is missing, inside such
/// a scope already, or when `AGENT_RUN_NO_SCOPE` is set.
///
/// Only for a user who lingers: logind stops the manager of one who does not when the last
/// login session ends, and every scope of that manager with it (the run too, a detached one
/// included). Left in its login session's scope, the run outlives the session unless logind
/// has `KillUserProcesses=yes` (the launch then warns). Tested under a real systemd
/// (tests/tests/systemd.rs; docs/safety.md, R-22).
pub fn user_scope_command(run_id: &str) -> Option<std::process::Command> {
    if crate::sys::geteuid() == 0
        || std::env::var_os(ENV_IN_SCOPE).is_some()
        || std::env::var_os("AGENT_RUN_NO_SCOPE").is_some()
    {
        return None;
    }
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")?;
    if !Path::new(&runtime).join("systemd/private").exists() {
        return None;
    }
    if !lingers(&crate::users::user_name(crate::sys::geteuid()))
        && !crate::fault::armed(crate::fault::ASSUME_LINGER)
    {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    let systemd_run = std::env::split_paths(&path)
        .map(|d| d.join("systemd-run"))
        .find(|p| p.is_file())?;
    let mut cmd = std::process::Command::new(systemd_run);
    cmd.args([
        "--user",
        "--scope",
        "--quiet",
        "--collect",
        "-p",
        "Delegate=yes",
    ])
    .arg(format!("--unit=agent-run-{run_id}-{}", std::process::id()))
    .arg("--");
    Some(cmd)
}

/// Where logind records who lingers: a file named for each such user.
const LINGER_DIR: &str = "/var/lib/systemd/linger";

/// Whether logind keeps `user`'s manager running with no login session (`loginctl
/// enable-linger`), as logind itself decides it: a file of that name in [`LINGER_DIR`].
fn lingers(user: &str) -> bool {
    !user.is_empty() && !user.contains('/') && Path::new(LINGER_DIR).join(user).exists()
}

/// The prefix of every run's cgroup name: `agent-run.<run-id>.<run dir inode, hex>`.
pub const PREFIX: &str = "agent-run.";

/// The first `cgroup2` mount of /proc/self/mountinfo, read once per process.
struct Mount {
    /// Where it is mounted.
    point: PathBuf,
    /// Its root as this process's cgroup namespace shows it: `/` for the whole hierarchy,
    /// `/../..` from inside a cgroup namespace two levels below the mount's root.
    root: String,
    /// Mounted with `nsdelegate`: cgroup namespaces are delegation boundaries, and the kernel
    /// refuses to move a process across the root of its namespace.
    nsdelegate: bool,
}

fn the_mount() -> Option<&'static Mount> {
    static MOUNT: OnceLock<Option<Mount>> = OnceLock::new();
    MOUNT
        .get_or_init(|| {
            let text = crate::procfs::read_kernel_file("/proc/self/mountinfo").ok()?;
            text.lines().find_map(parse_mount)
        })
        .as_ref()
}

/// Where the cgroup2 hierarchy is mounted, from /proc/self/mountinfo (the first `cgroup2`
/// mount); `None` when there is none. Read once per process.
pub fn mount() -> Option<&'static Path> {
    the_mount().map(|m| m.point.as_path())
}

/// Whether the cgroup2 mount has `nsdelegate` (systemd mounts it so): then a workload spawned
/// into a cgroup namespace rooted at its run's cgroup cannot move a process out of it.
pub fn nsdelegate() -> bool {
    the_mount().is_some_and(|m| m.nsdelegate)
}

/// The mount point of a mountinfo line whose filesystem type is cgroup2.
#[cfg(test)]
fn parse_mountinfo_line(line: &str) -> Option<PathBuf> {
    parse_mount(line).map(|m| m.point)
}

/// A mountinfo line whose filesystem type is cgroup2.
fn parse_mount(line: &str) -> Option<Mount> {
    // `36 35 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate`: the fields after
    // ` - ` are the type, the source and the super options; the root is field 4 and the mount
    // point field 5 (octal escapes for spaces).
    let (left, right) = line.split_once(" - ")?;
    let mut r = right.split_whitespace();
    if r.next()? != "cgroup2" {
        return None;
    }
    let options = r.nth(1).unwrap_or_default();
    let mut l = left.split_whitespace().skip(3);
    let root = unescape_octal(l.next()?);
    let point = PathBuf::from(unescape_octal(l.next()?));
    Some(Mount {
        point,
        root,
        nsdelegate: options.split(',').any(|o| o == "nsdelegate"),
    })
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub use crate::procfs::v2_path;

/// This process's own cgroup directory on the cgroup2 mount (the `0::` line).
///
/// Inside a cgroup namespace (a workload agent-run spawned as root on a host mounted with
/// `nsdelegate`: a nested run), /proc/self/cgroup and the mount's root are both relative to
/// the namespace's root, which lies `/..` levels below the mount's root: that cgroup is found
/// on the mount as the one at that depth whose `REL` holds this process.
pub fn own() -> Option<PathBuf> {
    let m = the_mount()?;
    let rel = v2_path(self_cgroup_text()?)?;
    let rel = rel.strip_suffix(" (deleted)").unwrap_or(rel);
    let rel = rel.trim_start_matches('/');
    let up = m.root.split('/').filter(|c| *c == "..").count();
    if up == 0 {
        return Some(m.point.join(rel));
    }
    in_namespace(&m.point, up, rel, crate::pid::Pid::this())
}

/// The cgroup on `mount` at `depth` below its root whose `rel` lists `pid` (see [`own`]).
fn in_namespace(mount: &Path, depth: usize, rel: &str, pid: crate::pid::Pid) -> Option<PathBuf> {
    let mut level = vec![mount.to_path_buf()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in &level {
            for (name, is_dir) in crate::procfs::dir_entries(dir).unwrap_or_default() {
                if is_dir && next.len() < WALK_CAP {
                    next.push(dir.join(name));
                }
            }
        }
        level = next;
    }
    let me = pid.get().to_string();
    level.into_iter().map(|d| d.join(rel)).find(|d| {
        crate::procfs::read_kernel_file(d.join("cgroup.procs"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == me))
    })
}

/// /proc/self/cgroup, read once per process: a launch asks for it twice (the run's parent, and
/// the host policy's look for a login session scope), and the wrapper is not moved between
/// the two. Long-lived processes (the watchdog) do not use it.
pub fn self_cgroup_text() -> Option<&'static str> {
    static TEXT: OnceLock<Option<String>> = OnceLock::new();
    TEXT.get_or_init(|| crate::procfs::read_kernel_file("/proc/self/cgroup").ok())
        .as_deref()
}

/// Where a run's cgroup goes, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// Create the run's cgroup in this directory; `explicit` when the user named it (a failure
    /// then fails the launch instead of falling back to procfs).
    Dir { path: PathBuf, explicit: bool },
    /// No cgroup: the procfs mode, and why.
    Procfs(String),
}

/// Decide where a run's cgroup goes. `explicit` is `--cgroup` (else `$AGENT_RUN_CGROUP`):
/// `off`/`none` asks for procfs; a directory must be on the cgroup2 mount, or the launch fails
/// (an explicit ask is never quietly dropped). Without one, the wrapper's own cgroup if this
/// user may use it.
pub fn choose_parent(explicit: Option<&str>) -> Result<Parent> {
    let explicit = explicit
        .map(str::to_string)
        .or_else(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()));
    if let Some(e) = explicit {
        if e == "off" || e == "none" {
            return Ok(Parent::Procfs("asked for (off)".into()));
        }
        let path = PathBuf::from(&e);
        let Some(mount) = mount() else {
            return Err(Error::Invalid {
                what: "cgroup parent",
                value: e,
                why: "this host has no cgroup2 mount".into(),
            });
        };
        check_under(mount, &path).map_err(|why| Error::Invalid {
            what: "cgroup parent",
            value: e.clone(),
            why,
        })?;
        if !path.is_dir() || !path.join("cgroup.procs").is_file() {
            return Err(Error::Invalid {
                what: "cgroup parent",
                value: e,
                why: "it is not a cgroup directory (no cgroup.procs)".into(),
            });
        }
        if let Some(why) = unusable(&path) {
            return Err(Error::Invalid {
                what: "cgroup parent",
                value: e,
                why,
            });
        }
        return Ok(Parent::Dir {
            path,
            explicit: true,
        });
    }
    let Some(own) = own() else {
        return Ok(Parent::Procfs(if mount().is_none() {
            "this host has no cgroup2 mount".into()
        } else {
            "this process's cgroup is unknown".into()
        }));
    };
    match unusable(&own) {
        None => Ok(Parent::Dir {
            path: own,
            explicit: false,
        }),
        Some(why) => Ok(Parent::Procfs(why)),
    }
}

/// Why this user may not create run cgroups in `parent` and move its children there, if not.
/// Root may; another user needs write access to the directory and to its `cgroup.procs`, and
/// this process must be inside `parent` (the kernel moves a process only within a subtree the
/// mover may write at its top).
fn unusable(parent: &Path) -> Option<String> {
    if crate::sys::geteuid() == 0 {
        return None;
    }
    if !crate::sys::writable(parent) || !crate::sys::writable(&parent.join("cgroup.procs")) {
        return Some(format!("{} is not writable by this user", parent.display()));
    }
    match own() {
        Some(o) if o.starts_with(parent) => None,
        _ => Some(format!(
            "this process is not inside {} (a delegated parent must hold the wrapper)",
            parent.display()
        )),
    }
}

/// `path` must be the mount or lie under it, without `..`.
fn check_under(mount: &Path, path: &Path) -> std::result::Result<(), String> {
    if !path.is_absolute() {
        return Err("it must be an absolute path".into());
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err("it must not contain ..".into());
    }
    if !path.starts_with(mount) {
        return Err(format!(
            "it is not on the cgroup2 mount {}",
            mount.display()
        ));
    }
    Ok(())
}

/// The name of a run's cgroup: `agent-run.<run-id>.<run dir inode in hex>`, so two roots with
/// the same run id never share one, and a recorded path can be checked against the run.
pub fn name_for(run_id: &str, run_dir_ino: u64) -> String {
    let mut out = String::with_capacity(PREFIX.len() + run_id.len() + 17);
    write_name_for(&mut out, run_id, run_dir_ino);
    out
}

/// [`name_for`] into `out` (cleared first): a pass names 100,000 cgroups with one buffer.
pub fn write_name_for(out: &mut String, run_id: &str, run_dir_ino: u64) {
    use std::fmt::Write;
    out.clear();
    let _ = write!(out, "{PREFIX}{run_id}.{run_dir_ino:x}");
}

/// Every run cgroup on the cgroup2 mount, by name (`agent-run.<run-id>.<dir inode, hex>`):
/// one walk of the tree, not descending into a run's cgroup (what is below it is the run's).
/// For telling a record that says final from a run whose cgroup still exists: where a run's
/// cgroup went is the wrapper's choice at launch (its own cgroup), so it is looked for by name,
/// never at the path the record gives (the workload can rewrite it). Bounded: at most
/// [`WALK_CAP`] directories are listed (a same-user subtree cannot make the walk endless).
pub fn run_cgroups() -> RunCgroups {
    let mut out = std::collections::HashMap::new();
    let Some(mount) = mount() else {
        return out;
    };
    let mut stack = vec![(mount.to_path_buf(), 0usize)];
    let mut listed = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        listed += 1;
        if listed > WALK_CAP {
            break;
        }
        let Ok(rd) = fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if name.starts_with(PREFIX) {
                out.entry(name.to_string()).or_insert_with(|| e.path());
            } else if depth < WALK_DEPTH {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    out
}

/// The run's cgroup, found by its name (`agent-run.<run-id>.<run dir inode>`) whatever the
/// record says: at `hint` (the path a record names) when that is the run's, else in `found` (a
/// walk a caller already made), else by one walk of the whole cgroup2 mount ([`run_cgroups`]).
/// The record can name no cgroup, another one, or say the run is held by procfs: none of that
/// hides the cgroup the wrapper made. `None` when the run has none (or it was removed).
pub fn find_run_cgroup_with(
    dir: &crate::run_dir::RunDir,
    hint: Option<&Path>,
    found: Option<&RunCgroups>,
) -> Option<RunCgroup> {
    let id = dir.id().as_str();
    let ino = dir.identity().1;
    if let Some(Ok(Some(cg))) = hint.map(|h| RunCgroup::verify(h, id, ino)) {
        return Some(cg);
    }
    let name = name_for(id, ino);
    let walked;
    let found = match found {
        Some(f) => f,
        None => {
            walked = run_cgroups();
            &walked
        }
    };
    RunCgroup::verify(found.get(&name)?, id, ino).ok().flatten()
}

/// [`find_run_cgroup_with`] with the record's path as the hint, walking the mount if needed.
pub fn find_run_cgroup(dir: &crate::run_dir::RunDir) -> Option<RunCgroup> {
    let hint = dir
        .read_status()
        .ok()
        .and_then(|st| st.containment.and_then(|c| c.cgroup).map(PathBuf::from));
    find_run_cgroup_with(dir, hint.as_deref(), None)
}

/// Thaw the cgroup at `path` and every ancestor of it on the mount that is frozen itself
/// (`cgroup.freeze` reads 1: a frozen ancestor freezes everything below it). Returns each
/// cgroup written, with the error where the write failed (one not ours to write).
pub fn thaw_all(path: &Path) -> Vec<(PathBuf, Option<String>)> {
    let Some(mount) = mount() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| p.starts_with(mount)) {
        let frozen =
            crate::procfs::read_kernel_file(p.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1");
        if frozen {
            let r = OpenOptions::new()
                .write(true)
                .open(p.join("cgroup.freeze"))
                .and_then(|mut f| f.write_all(b"0"));
            out.push((p.to_path_buf(), r.err().map(|e| e.to_string())));
        }
        at = p.parent();
    }
    out
}

/// The run cgroups of the cgroup2 mount by name ([`run_cgroups`]).
pub type RunCgroups = std::collections::HashMap<String, PathBuf>;

/// The most directories [`run_cgroups`] lists in one walk.
pub const WALK_CAP: usize = 20_000;
/// How deep [`run_cgroups`] goes below the mount.
const WALK_DEPTH: usize = 16;

/// A run's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCgroup {
    path: PathBuf,
}

impl RunCgroup {
    /// Create the run's cgroup in `parent`. One named for this run may be left from an
    /// earlier run dir at the same path and inode whose wrapper died: an empty one is removed
    /// first; one that holds processes is refused.
    pub fn create(parent: &Path, name: &str) -> Result<RunCgroup> {
        let path = parent.join(name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                fs::remove_dir(&path).map_err(|e| Error::io("remove stale cgroup", &path, e))?;
                fs::create_dir(&path).map_err(|e| Error::io("create cgroup", &path, e))?;
            }
            Err(e) => return Err(Error::io("create cgroup", &path, e)),
        }
        Ok(RunCgroup { path })
    }

    /// A recorded cgroup, checked before anyone acts on it: on the cgroup2 mount, named for
    /// this run (its id and its run dir's inode), a directory of the caller's uid (or of root),
    /// a cgroup (it has `cgroup.procs`). `Ok(None)` when it is gone (removed after its run).
    pub fn verify(path: &Path, run_id: &str, run_dir_ino: u64) -> Result<Option<RunCgroup>> {
        let refuse = |why: String| Err(Error::Identity { why });
        let Some(mount) = mount() else {
            return refuse("the record names a cgroup, but this host has no cgroup2 mount".into());
        };
        if let Err(why) = check_under(mount, path) {
            return refuse(format!("recorded cgroup {}: {why}", path.display()));
        }
        let want = name_for(run_id, run_dir_ino);
        if path.file_name().and_then(|n| n.to_str()) != Some(want.as_str()) {
            return refuse(format!(
                "recorded cgroup {} is not named for this run ({want})",
                path.display()
            ));
        }
        let md = match fs::symlink_metadata(path) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("inspect", path, e)),
        };
        let me = crate::sys::geteuid();
        if !md.is_dir() || (md.uid() != me && md.uid() != 0) {
            return refuse(format!(
                "recorded cgroup {} is not a directory of uid {me}",
                path.display()
            ));
        }
        if !path.join("cgroup.procs").is_file() {
            return refuse(format!(
                "recorded cgroup {} is not a cgroup",
                path.display()
            ));
        }
        Ok(Some(RunCgroup {
            path: path.to_path_buf(),
        }))
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its directory, open O_RDONLY|O_DIRECTORY|O_CLOEXEC, for the workload's spawn
    /// ([`crate::spawn::spawn_workload`]: clone3's CLONE_INTO_CGROUP, or `cgroup.procs` opened
    /// through it on older kernels).
    pub fn open_dir(&self) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&self.path)
            .map_err(|e| Error::io("open", &self.path, e))
    }

    /// Every process of the cgroup and of its descendants (a nested run's cgroup), by pid.
    pub fn members(&self) -> Vec<crate::pid::Pid> {
        let mut out = Vec::new();
        collect_members(&self.path, &mut out, 0);
        out.sort();
        out.dedup();
        out
    }

    /// Whether any process of the subtree is alive (`cgroup.events`: `populated 1`). A
    /// cgroup that is gone is empty.
    pub fn populated(&self) -> bool {
        match crate::procfs::read_kernel_file(self.path.join("cgroup.events")) {
            Ok(s) => events_populated(&s) == Some(true),
            Err(_) => false,
        }
    }

    /// Whether the cgroup is frozen (`cgroup.events`: `frozen 1`), by its own `cgroup.freeze`
    /// or an ancestor's.
    pub fn frozen(&self) -> bool {
        crate::procfs::read_kernel_file(self.path.join("cgroup.events"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == "frozen 1"))
    }

    /// `cgroup.events`, opened for poll(2): it signals POLLPRI when `populated` changes.
    pub fn events_fd(&self) -> Option<File> {
        File::open(self.path.join("cgroup.events")).ok()
    }

    /// SIGKILL every process of the subtree, new forks included (`cgroup.kill`, Linux 5.14).
    pub fn kill(&self) -> std::io::Result<()> {
        OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"))
    }

    /// Freeze (or thaw) the whole subtree (`cgroup.freeze`).
    pub fn freeze(&self, frozen: bool) -> std::io::Result<()> {
        OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.freeze"))
            .and_then(|mut f| f.write_all(if frozen { b"1" } else { b"0" }))
    }

    /// The CPU the run used and its peak memory where the memory controller is there.
    pub fn resources(&self) -> Resources {
        let mut r = Resources::default();
        if let Ok(text) = crate::procfs::read_kernel_file(self.path.join("cpu.stat")) {
            for line in text.lines() {
                let mut f = line.split_whitespace();
                let (Some(k), Some(v)) = (f.next(), f.next().and_then(|v| v.parse().ok())) else {
                    continue;
                };
                match k {
                    "usage_usec" => r.cpu_usage_usec = Some(v),
                    "user_usec" => r.cpu_user_usec = Some(v),
                    "system_usec" => r.cpu_system_usec = Some(v),
                    _ => {}
                }
            }
        }
        r.memory_peak_bytes = crate::procfs::read_kernel_file(self.path.join("memory.peak"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        r
    }

    /// Remove the cgroup and the cgroups below it (a nested run's), deepest first. Fails
    /// (EBUSY) while a process is left; the caller reports it.
    pub fn remove(&self) -> std::io::Result<()> {
        remove_tree(&self.path, 0)
    }
}

fn collect_members(dir: &Path, out: &mut Vec<crate::pid::Pid>, depth: usize) {
    if let Ok(text) = crate::procfs::read_kernel_file(dir.join("cgroup.procs")) {
        out.extend(
            text.lines()
                .filter_map(|l| l.trim().parse::<i64>().ok())
                .filter_map(crate::pid::Pid::new),
        );
    }
    if depth > 64 {
        return;
    }
    for (name, is_dir) in crate::procfs::dir_entries(dir).unwrap_or_default() {
        if is_dir {
            collect_members(&dir.join(name), out, depth + 1);
        }
    }
}

fn remove_tree(dir: &Path, depth: usize) -> std::io::Result<()> {
    // Most runs make no cgroup of their own: one rmdir, no listing. A cgroup with cgroups below
    // it is EBUSY (as is one that holds a process): then the ones below go first.
    match fs::remove_dir(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.raw_os_error() != Some(libc::EBUSY) => return Err(e),
        Err(_) => {}
    }
    if depth < 64 {
        for (name, is_dir) in crate::procfs::dir_entries(dir).unwrap_or_default() {
            if is_dir {
                let _ = remove_tree(&dir.join(name), depth + 1);
            }
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// The `resources` key of a final record (from the run's cgroup).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resources {
    pub cpu_usage_usec: Option<u64>,
    pub cpu_user_usec: Option<u64>,
    pub cpu_system_usec: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
}

/// What the text of a `cgroup.events` says of `populated`: `None` when it has no such line.
pub(crate) fn events_populated(events: &str) -> Option<bool> {
    events.lines().find_map(|l| match l.trim() {
        "populated 1" => Some(true),
        "populated 0" => Some(false),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_path_is_the_0_line_of_a_cgroup_file() {
        let hybrid = "9:name=systemd:/\n8:pids:/user.slice\n0::/user.slice/x.scope\n";
        assert_eq!(v2_path(hybrid), Some("/user.slice/x.scope"));
        assert_eq!(v2_path("0::/gone (deleted)\n"), Some("/gone (deleted)"));
        assert_eq!(v2_path("8:pids:/\n"), None);
    }

    #[test]
    fn mountinfo_lines_name_the_cgroup2_mount() {
        let l = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert_eq!(
            parse_mountinfo_line(l),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let v1 = "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu";
        assert_eq!(parse_mountinfo_line(v1), None);
        let esc = r"41 31 0:38 / /mnt/with\040space rw - cgroup2 cgroup2 rw";
        assert_eq!(
            parse_mountinfo_line(esc),
            Some(PathBuf::from("/mnt/with space"))
        );
    }

    #[test]
    fn a_mount_says_its_root_and_whether_it_delegates_to_namespaces() {
        let l = "41 31 0:38 /../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot";
        let m = parse_mount(l).expect("a cgroup2 line");
        assert_eq!(m.root, "/../..");
        assert!(m.nsdelegate);
        let plain = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert!(!parse_mount(plain).expect("a cgroup2 line").nsdelegate);
    }

    #[test]
    fn inside_a_namespace_this_process_is_found_at_its_depth() {
        // The test's own cgroup, seen as if from a namespace rooted at it: depth = its depth.
        let (Some(mount), Some(own)) = (mount(), own()) else {
            return;
        };
        let rel = own.strip_prefix(mount).expect("own is on the mount");
        let depth = rel.components().count();
        if depth == 0 {
            return;
        }
        assert_eq!(
            in_namespace(mount, depth, "", crate::pid::Pid::this()),
            Some(own.clone())
        );
    }

    #[test]
    fn run_cgroup_names_carry_the_id_and_the_run_dir() {
        assert_eq!(name_for("b-7", 255), "agent-run.b-7.ff");
    }
}
