//! Other facts of one process: its name, executable, owner and cgroup.

use super::*;

/// The cgroup v2 path in the text of a /proc/PID/cgroup (its `0::` line), as the kernel wrote
/// it (a removed cgroup keeps its ` (deleted)` suffix).
pub fn v2_path(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
}

/// The real uid of a process, from the `Uid:` line of /proc/PID/status (readable whatever the
/// process's dumpable flag; /proc/PID of a non-dumpable process belongs to root). `None` when
/// it is gone.
pub fn real_uid(pid: Pid) -> Option<u32> {
    sig_dispositions(pid)?.real_uid
}

/// A process's command name (/proc/PID/comm, trimmed): readable for every process, whatever
/// its dumpable flag. A process can set its own, so it only ever narrows a choice the kernel's
/// other facts made.
pub fn comm(pid: Pid) -> Option<String> {
    read_kernel_file(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// The cgroup v2 path of a process (the `0::` line of /proc/PID/cgroup), relative to the
/// cgroup2 mount (`/` for its root). `None` when it is gone or has none.
pub fn cgroup_of(pid: Pid) -> Option<String> {
    let text = read_kernel_file(format!("/proc/{pid}/cgroup")).ok()?;
    v2_path(&text).map(str::to_string)
}

/// The owner uid of a process (owner of /proc/PID). `None` when it is gone.
pub fn uid_of(pid: Pid) -> Option<u32> {
    fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// The file name of a process's executable (/proc/PID/exe), without a " (deleted)" suffix (a
/// wrapper whose binary was upgraded under it is still that binary). `None` when it is gone
/// or not ours to read.
pub fn exe_name(pid: Pid) -> Option<String> {
    let target = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let name = target.file_name()?.to_string_lossy().into_owned();
    Some(name.strip_suffix(" (deleted)").unwrap_or(&name).to_string())
}
