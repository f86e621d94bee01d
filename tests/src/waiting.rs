//! Waits with one deadline that say what they saw last, and the fixture's `ready` line.

use std::fmt::Debug;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::diagnostics::tail;
use crate::{diagnostics, TestRoot};

/// Polls `probe` every 5 ms until it returns Some, and returns that; panics naming `what` and
/// the time waited once `timeout` has passed.
pub fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    wait_until_dbg(what, timeout, || probe().ok_or("nothing yet"))
}

/// Polls `probe` every 5 ms until it succeeds, to one deadline: Ok(what it returned), or
/// Err((time waited, the last thing it saw)). The one polling loop of the harness.
pub fn poll_until<T, D>(
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, D>,
) -> Result<T, (Duration, D)> {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(value) => return Ok(value),
            Err(seen) if start.elapsed() >= timeout => return Err((start.elapsed(), seen)),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Like [`wait_until`], but the probe says what it saw instead (`Err(seen)`), and the panic on
/// timeout reports the last thing seen.
pub fn wait_until_dbg<T, D: Debug>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<T, D>,
) -> T {
    poll_until(timeout, probe).unwrap_or_else(|(waited, seen)| {
        panic!("timed out after {waited:?} waiting for {what}; last seen: {seen:?}")
    })
}

/// Like [`wait_until_dbg`], and the panic carries the run's [`diagnostics`].
pub fn wait_run<V, D: Debug>(
    root: &TestRoot,
    id: &str,
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<V, D>,
) -> V {
    poll_until(timeout, probe).unwrap_or_else(|(waited, seen)| {
        panic!(
            "timed out after {waited:?} waiting for {what} (run {id}); last seen: {seen:?}\n{}",
            diagnostics(root, id)
        )
    })
}

/// The fixture's handshake: `ready pid=.. pgid=.. sid=.. members=a,b,c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The tree's leader.
    pub pid: i32,
    /// The leader's process group.
    pub pgid: i32,
    /// The leader's session.
    pub sid: i32,
    /// Every descendant (children, grandchildren, escapee), sorted; the leader excluded.
    pub members: Vec<i32>,
}

impl Ready {
    /// The leader and every member.
    pub fn all_pids(&self) -> Vec<i32> {
        let mut pids = vec![self.pid];
        pids.extend(&self.members);
        pids
    }
}

/// Parses a `ready ...` line; None if it is not one. Unknown keys are ignored.
pub fn parse_ready(line: &str) -> Option<Ready> {
    let rest = line.trim_end().strip_prefix("ready ")?;
    let (mut pid, mut pgid, mut sid, mut members) = (None, None, None, None);
    for field in rest.split_whitespace() {
        let (key, value) = field.split_once('=')?;
        match key {
            "pid" => pid = Some(value.parse().ok()?),
            "pgid" => pgid = Some(value.parse().ok()?),
            "sid" => sid = Some(value.parse().ok()?),
            "members" => {
                let pids: Option<Vec<i32>> = value
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse().ok())
                    .collect();
                members = Some(pids?);
            }
            _ => {}
        }
    }
    Some(Ready {
        pid: pid?,
        pgid: pgid?,
        sid: sid?,
        members: members?,
    })
}

/// Polls a file (such as a run's stdout.log) for a complete `ready ` line and parses it.
pub fn wait_ready(path: &Path, timeout: Duration) -> Ready {
    wait_until_dbg(
        &format!("a ready line in {}", path.display()),
        timeout,
        || {
            let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
            text.split_inclusive('\n')
                .filter(|line| line.ends_with('\n') && line.starts_with("ready "))
                .find_map(parse_ready)
                .ok_or_else(|| tail(path, 2000))
        },
    )
}
