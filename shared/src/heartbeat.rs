//! The wrapper's heartbeat: the modification time of `<run dir>/lock`, touched every
//! [`INTERVAL`] by a thread of the wrapper for its whole life.
//!
//! A wrapper killed with SIGKILL writes nothing, so its death leaves no mark of its own; but
//! it stops beating. The last beat, read by anyone later (a `--once` pass of the watchdog from a
//! timer, a daemon that started after the death), bounds the death from above: the wrapper was
//! alive at the last beat and would have beaten again within [`INTERVAL`] (plus [`LATE`] for a
//! beat delayed on a loaded machine). The watchdog counts a lease-less orphan's grace from that
//! bound, so it never stops an orphan earlier than the grace after its wrapper died, and no
//! later than the grace plus about three seconds.
//!
//! The beat only ever decides *when* the watchdog acts on a run whose wrapper is already gone,
//! never *what* it signals. A workload can touch the file too (it runs as the same user): a
//! beat in the future is clamped to now by the reader, so it cannot move the bound past the
//! moment someone first saw the wrapper gone.
//!
//! The same thread publishes the deadline the wrapper enforces ([`Published`]): the earlier of
//! the lease it last took (signed with the run's token) and the `--timeout`, in the thread's
//! own name (`due-L1765000000`: lease, epoch seconds rounded up; `due-T...`: timeout). Only a
//! thread of the wrapper can rename it, so the workload, which can rewrite lease.json and its
//! record but cannot write a task's name in another process, cannot move it; the watchdog
//! reads it ([`published_due`]) to tell when a live wrapper is stuck past its deadline, whatever
//! lease.json says.

use crate::pid::Pid;
use crate::run_dir::{files, RunDir};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// A heartbeat whose thread is not started yet (see [`RunDir::first_beat`]).
#[derive(Debug)]
pub struct Beat {
    lock: std::fs::File,
    path: std::path::PathBuf,
}

fn touch(f: &std::fs::File) -> std::io::Result<()> {
    f.set_modified(SystemTime::now())
}

impl Beat {
    /// Touch the lock file every [`INTERVAL`] from a thread, until the process exits; the
    /// thread's name says what `published` holds, within moments of each change.
    pub fn start(self, published: Arc<Published>) -> crate::Result<()> {
        let lock = self.lock;
        std::thread::Builder::new()
            .name("heartbeat".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let _ = published.thread.set(std::thread::current());
                let mut named = 0;
                let mut next = Instant::now() + INTERVAL;
                loop {
                    let due = published.due.load(Ordering::Acquire);
                    if due != named {
                        let _ = crate::sys::set_comm(&thread_name(due));
                        named = due;
                    }
                    let now = Instant::now();
                    if now >= next {
                        let _ = touch(&lock);
                        next = now + INTERVAL;
                    }
                    std::thread::park_timeout(next.saturating_duration_since(now));
                }
            })
            .map_err(|e| crate::Error::io("start the heartbeat of", &self.path, e))?;
        Ok(())
    }
}

/// Which deadline a published one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueKind {
    Lease,
    Timeout,
}

/// The deadline the wrapper enforces, for its heartbeat thread to publish in its name.
#[derive(Debug, Default)]
pub struct Published {
    /// 0: none; else the epoch second (rounded up) shifted left once, the low bit set for a
    /// timeout.
    due: AtomicU64,
    thread: OnceLock<std::thread::Thread>,
}

impl Published {
    /// Publish `due` (the earliest deadline the wrapper enforces, or none).
    pub fn set(&self, due: Option<(f64, DueKind)>) {
        let v = due.map_or(0, |(epoch, kind)| {
            ((epoch.max(0.0).ceil() as u64) << 1) | u64::from(kind == DueKind::Timeout)
        });
        if self.due.swap(v, Ordering::AcqRel) != v {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

/// The heartbeat thread's name for a published value.
fn thread_name(v: u64) -> std::ffi::CString {
    let name = match v {
        0 => "heartbeat".to_string(),
        v => format!("due-{}{}", if v & 1 == 1 { 'T' } else { 'L' }, v >> 1),
    };
    std::ffi::CString::new(name).expect("no NUL in a thread name")
}

/// The deadline a thread name publishes, if it is one.
fn parse_name(name: &str) -> Option<(f64, DueKind)> {
    let rest = name.trim_end().strip_prefix("due-")?;
    let kind = match rest.as_bytes().first()? {
        b'L' => DueKind::Lease,
        b'T' => DueKind::Timeout,
        _ => return None,
    };
    let secs: u64 = rest[1..].parse().ok()?;
    Some((secs as f64, kind))
}

/// The deadline the wrapper `pid` publishes in a thread's name ([`Published`]); `None` when no
/// thread of it publishes one (a wrapper of an earlier version, or one whose threads have not
/// started yet). The caller has verified `pid` as the run's wrapper (a pidfd it holds).
pub fn published_due(pid: Pid) -> Option<(f64, DueKind)> {
    let tasks = std::path::PathBuf::from(format!("/proc/{pid}/task"));
    crate::procfs::dir_entries(&tasks)?
        .into_iter()
        .filter(|(name, is_dir)| *is_dir && name.bytes().all(|b| b.is_ascii_digit()))
        .find_map(|(tid, _)| {
            let comm = crate::procfs::read_kernel_file(tasks.join(tid).join("comm")).ok()?;
            parse_name(&comm)
        })
}

/// How often the wrapper touches its lock file.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How late a beat may be on a loaded machine and still count as on time.
pub const LATE: Duration = Duration::from_secs(2);

impl RunDir {
    /// Start beating: a thread of this process touches the run's lock file (opened here, never
    /// through a symlink) now and every [`INTERVAL`] until the process exits. The lock itself is
    /// another open file description, so this fd never holds or releases it.
    pub fn heartbeat(&self) -> crate::Result<()> {
        self.first_beat()?.start(Arc::default())
    }

    /// The first beat, now, without the thread: [`Beat::start`] starts it (the wrapper does so
    /// once its output keeper is forked, which needs a single-threaded process).
    pub fn first_beat(&self) -> crate::Result<Beat> {
        let lock = self.open_write(files::LOCK)?;
        touch(&lock).map_err(|e| crate::Error::io("touch", self.file(files::LOCK), e))?;
        Ok(Beat {
            lock,
            path: self.path().to_path_buf(),
        })
    }

    /// The latest time (epoch seconds) at which the run's wrapper can have been alive, from
    /// its last beat, clamped to `now`. `None` when there is no lock file to read.
    pub fn gone_by(&self, now: f64) -> Option<f64> {
        let beat = self.stat_file(files::LOCK)?.modified;
        Some((crate::time::epoch_of(beat) + (INTERVAL + LATE).as_secs_f64()).min(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_bounds_the_death_and_never_lies_ahead_of_now() {
        let (d, rd) = crate::run_dir::temp();
        let now = crate::time::epoch_now();
        assert_eq!(rd.gone_by(now), None);
        std::fs::write(d.path().join(files::LOCK), b"").unwrap();
        rd.heartbeat().unwrap();
        let bound = rd.gone_by(now + 100.0).unwrap();
        let slack = (INTERVAL + LATE).as_secs_f64();
        assert!(
            bound >= now + slack - 0.5 && bound <= now + slack + 1.0,
            "{bound} vs {now}"
        );
        assert_eq!(rd.gone_by(now), Some(now));
    }

    #[test]
    fn a_published_deadline_reads_back_from_the_thread_name_rounded_up() {
        for (due, name) in [
            (None, "heartbeat"),
            (Some((1765000000.2, DueKind::Lease)), "due-L1765000001"),
            (Some((1765000000.0, DueKind::Timeout)), "due-T1765000000"),
        ] {
            let p = Published::default();
            p.set(due);
            let got = thread_name(p.due.load(Ordering::Relaxed));
            assert_eq!(got.to_str().unwrap(), name);
            assert!(got.as_bytes().len() <= 15, "a task name holds 15 bytes");
            assert_eq!(
                parse_name(&format!("{name}\n")),
                due.map(|(t, k)| (t.ceil(), k))
            );
        }
        for bad in ["due-X1", "due-L", "due-L12a", "agent-run", ""] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_heartbeat_thread_publishes_in_its_name() {
        let (d, rd) = crate::run_dir::temp();
        std::fs::write(d.path().join(files::LOCK), b"").unwrap();
        let published = Arc::new(Published::default());
        rd.first_beat().unwrap().start(published.clone()).unwrap();
        published.set(Some((4102444800.0, DueKind::Lease)));
        let until = Instant::now() + Duration::from_secs(10);
        while published_due(Pid::this()) != Some((4102444800.0, DueKind::Lease)) {
            assert!(Instant::now() < until, "never published");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
