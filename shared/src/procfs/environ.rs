//! A process's environment (/proc/PID/environ): the run's marker variables.

use super::*;

/// The values of the given variables in a process's environment (/proc/PID/environ), in the
/// order asked; `None` for a variable that is not set. Empty when the process is gone or its
/// environment is unreadable (another user's, or a kernel thread).
pub fn environ_get(pid: Pid, names: &[&str]) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![None; names.len()];
    let env = match fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) if !env.is_empty() => env,
        // A zombie leader's own environ reads empty (its memory is gone with its main
        // thread); a thread that still runs shares the memory and shows it.
        _ => match live_thread_environ(pid) {
            Some(env) => env,
            None => return out,
        },
    };
    for kv in env.split(|&b| b == 0) {
        for (i, name) in names.iter().enumerate() {
            if kv.len() > name.len() && kv.starts_with(name.as_bytes()) && kv[name.len()] == b'=' {
                out[i] = Some(kv[name.len() + 1..].to_vec());
            }
        }
    }
    out
}

/// Whether this process may read `pid`'s environment at all: `false` for a process of another
/// user, or one that made itself non-dumpable (PR_SET_DUMPABLE 0, as ssh-agent does), whose
/// /proc/PID/environ its own user cannot read. A scan cannot tell whether such a process
/// carries a run's marker.
pub fn environ_unreadable(pid: Pid) -> bool {
    match fs::File::open(format!("/proc/{pid}/environ")) {
        Ok(mut f) => {
            let mut b = [0u8; 1];
            matches!(f.read(&mut b), Err(e) if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EPERM))
        }
        Err(e) => matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)),
    }
}

/// The environment of a process as one of its live threads shows it (/proc/PID/task/TID).
pub(super) fn live_thread_environ(pid: Pid) -> Option<Vec<u8>> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str() != Some(&pid.to_string()))
        .find_map(|e| {
            fs::read(e.path().join("environ"))
                .ok()
                .filter(|v| !v.is_empty())
        })
}
