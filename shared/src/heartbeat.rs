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

use crate::run_dir::{files, RunDir};
use std::time::{Duration, SystemTime};

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
    /// Touch the lock file every [`INTERVAL`] from a thread, until the process exits.
    pub fn start(self) -> crate::Result<()> {
        let lock = self.lock;
        std::thread::Builder::new()
            .name("heartbeat".into())
            .stack_size(64 * 1024)
            .spawn(move || loop {
                std::thread::sleep(INTERVAL);
                let _ = touch(&lock);
            })
            .map_err(|e| crate::Error::io("start the heartbeat of", &self.path, e))?;
        Ok(())
    }
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
        self.first_beat()?.start()
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
}
