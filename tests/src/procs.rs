//! Facts about processes read from /proc: stat fields, sessions, children, environments.

use std::fs;

/// Fields of /proc/PID/stat: (state, ppid, pgid, sid, start time in clock ticks since boot).
/// None if the process does not exist or the file cannot be parsed.
pub fn proc_stat(pid: i32) -> Option<(char, i32, i32, i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state) of proc(5), so field N is fields[N - 3].
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let pgid = fields.get(2)?.parse().ok()?;
    let sid = fields.get(3)?.parse().ok()?;
    let start_ticks = fields.get(19)?.parse().ok()?;
    Some((state, ppid, pgid, sid, start_ticks))
}

/// Whether the process `pid` that started at `ticks` (a record's pid and start ticks) is alive:
/// not gone, not a zombie, not a process that reused the pid.
pub fn alive_as(pid: i32, ticks: u64) -> bool {
    proc_stat(pid).is_some_and(|s| s.4 == ticks && !matches!(s.0, 'Z' | 'X'))
}

/// The number of threads of a process (field 20 of /proc/PID/stat), 0 when it is gone.
pub fn proc_threads(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| {
            let rest = t[t.rfind(')')? + 1..].to_string();
            rest.split_whitespace().nth(17)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Every live (non-zombie) process with a stat line matching `keep`, sorted by pid.
fn live_processes(keep: impl Fn(&(char, i32, i32, i32, u64)) -> bool) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|s| !matches!(s.0, 'Z' | 'X') && keep(&s)))
        .collect();
    pids.sort_unstable();
    pids
}

/// Every non-zombie process whose session id is `sid`.
pub fn session_members(sid: i32) -> Vec<i32> {
    live_processes(|s| s.3 == sid)
}

/// Every non-zombie process whose parent is `ppid`.
pub fn children_of(ppid: i32) -> Vec<i32> {
    live_processes(|s| s.1 == ppid)
}

/// Every live descendant of `pid`, parents before children.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

/// The value of `name` in the environment `pid` was started with (`/proc/PID/environ`), or None
/// when the process is gone, unreadable, a zombie (its environ reads empty), or lacks `name`.
pub fn environ_var(pid: i32, name: &str) -> Option<Vec<u8>> {
    let bytes = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    bytes
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()).map(<[u8]>::to_vec))
}

/// Every live (non-zombie) process whose environment carries `name` with a value `keep`
/// accepts, sorted by pid: how a test finds a run's strays by its `AGENT_RUN_ID` or
/// `AGENT_RUN_DIR` marker, whatever session or parent they ended up in.
pub fn processes_with_env(name: &str, keep: impl Fn(&[u8]) -> bool) -> Vec<i32> {
    live_processes(|_| true)
        .into_iter()
        .filter(|&pid| environ_var(pid, name).is_some_and(|v| keep(&v)))
        .collect()
}
