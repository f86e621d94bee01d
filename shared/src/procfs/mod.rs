//! Reading /proc: one process's stat line, its signal dispositions, its environment marker, the
//! boot id, and a scan of every process.
//!
//! Nothing here signals or waits; it only reads. A process that vanishes between the directory
//! listing and the read is simply absent from the result (ENOENT/ESRCH are not errors here).
//! A zombie's stat is still readable (pgid, sid, start time); callers decide what `Z` means.
//!
//! One file per thing read: `stat` (the stat line), `process` (name, owner, cgroup),
//! `signals` (/proc/PID/status), `environ` (the marker), `locks` (/proc/locks),
//! `clock` (the boot), `scan` (every process, or the newer pids), `tree` (children
//! lists), `pids` (the pid counter).

mod clock;
mod environ;
mod locks;
mod pids;
mod process;
mod scan;
mod signals;
mod stat;
#[cfg(test)]
mod tests;
mod tree;

pub use clock::*;
pub use environ::*;
pub use locks::*;
pub use pids::*;
pub use process::*;
pub use scan::*;
pub use signals::*;
pub use stat::*;
pub use tree::*;

use crate::pid::{Identity, Pid};
pub use crate::sys::read_kernel_file;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
