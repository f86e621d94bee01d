//! Following the pid counter: how far it has moved since a moment, measured rather than bounded.
//!
//! A look that reads only the pids handed out since an earlier look of every pid
//! ([`crate::procset::PidFloor`]) needs the counter not to have come around since.
//! [`crate::procfs::no_wrap_within`] bounds that by time alone: the free pids at 100,000 a
//! second, 224 ms with pid_max 32,768 and 10,000 tasks, less than one look of such a table
//! takes. Read often enough, the counter itself says how far it went: between two readings
//! closer together than that bound it cannot have come around, so the distance between them
//! (forward, through the wrap) is how far it moved, and the sum of those distances is how far
//! it moved since a mark. While that sum is short of a whole cycle, every pid handed out since
//! the mark is in the cyclic range after the mark's pid.
//!
//! The bound between two readings needs the pids in use at the first (the counter steps over
//! those): every pid in use then was in use at the last look of every pid (its tasks and held
//! group and session ids, [`seed`]) or was handed out since (the distance moved). A chain begins
//! at the mark of such a look, before the look knows its count: until it does, each gap notes
//! the most pids that could have been in use at the start for the gap to be short enough, and
//! the count then either meets every one of those (the chain goes on) or not (it ends).
//!
//! One thread of the process that asks for it ([`follow`], the watchdog) reads the counter at a
//! quarter of the bound; a reading late past the bound (the thread was not scheduled, the
//! process stopped) ends the chain, and the next look of every pid starts a new one. The
//! readings cost a few µs each, one a second with the 64-bit default pid_max and about
//! twelve with 32,768; a chain no look has used for five minutes lapses, and the thread then
//! sleeps until a look of every pid starts another. Processes that do not follow (the wrapper,
//! the control commands) keep the time bound alone.

use crate::procfs;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Where the chain stood at a reading: the chain it belongs to and how far the counter had
/// moved along it. Two of the same chain give the movement between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainMark {
    epoch: u64,
    moved: u64,
    /// This reading began the chain.
    start: bool,
}

/// One reading of the pid counter and the live tasks, for the mark of a look of every pid.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    /// The last pid handed out (`ns_last_pid`).
    pub last_pid: i32,
    /// CLOCK_BOOTTIME seconds, read just before the counter.
    pub at: f64,
    /// Live tasks, threads included (/proc/loadavg).
    pub tasks: u64,
    /// The chain this reading is on, while this process follows the counter.
    pub chain: Option<ChainMark>,
}

#[derive(Debug, Clone, Copy)]
struct Chain {
    epoch: u64,
    /// The last reading: the counter, and the clock just before it was read.
    pid: i32,
    at: f64,
    /// How far the counter has moved since the chain began.
    moved: u64,
    /// At most this many pids are in use now (while `unseeded`: a guess, for the pace of
    /// the readings only).
    in_use: u64,
    /// Until the look that began the chain says how many pids were in use at its start
    /// ([`seed`]): the most that count may be for every gap so far to have been short enough.
    unseeded: Option<u64>,
    /// When a look last used the chain (CLOCK_BOOTTIME seconds): one unused for [`LAPSE`]
    /// ends, and its thread sleeps until a look of every pid begins another.
    used: f64,
}

/// How long a chain no look uses is kept read: a daemon that holds runs by scanning looks at
/// every pid on each periodic pass (30 s by default) and keeps it; one that holds none stops
/// waking for it.
const LAPSE: f64 = 300.0;

struct State {
    chain: Option<Chain>,
    epochs: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    chain: None,
    epochs: 0,
});
static WAKE: Condvar = Condvar::new();
static FOLLOWING: OnceLock<()> = OnceLock::new();

/// The pids of one cycle of the counter: it wraps from pid_max - 1 to 300 (RESERVED_PIDS).
fn cycle() -> u64 {
    (procfs::pid_max() - procfs::RESERVED_PIDS).max(1.0) as u64
}

/// How far the counter moved from `from` to `to`, forward and through the wrap, given that it
/// moved less than a whole cycle.
fn distance(from: i32, to: i32, pid_max: i64, reserved: i64) -> u64 {
    let (from, to) = (i64::from(from), i64::from(to));
    if to >= from {
        (to - from) as u64
    } else {
        ((pid_max - from) + (to - reserved)).max(0) as u64
    }
}

/// How long the counter surely takes to come around with `in_use` pids in use at the start.
fn window(in_use: u64, cycle: u64) -> f64 {
    cycle.saturating_sub(in_use) as f64 / procfs::MAX_FORKS_PER_SEC
}

impl Chain {
    /// Take in a reading of the counter (`pid`, the clock `before` and `after` it): `false`
    /// when it came too late for the chain to go on.
    fn advance(&mut self, pid: i32, before: f64, after: f64, cycle: u64) -> bool {
        let gap = after - self.at;
        match self.unseeded.as_mut() {
            // The gap is short enough while the pids in use at the chain's start, plus those
            // handed out since, leave more free pids than the gap can hand out.
            Some(most) => {
                let handed = (gap * procfs::MAX_FORKS_PER_SEC).ceil() as u64;
                let room = cycle.saturating_sub(self.moved).saturating_sub(handed);
                if room == 0 {
                    return false;
                }
                *most = (*most).min(room - 1);
            }
            None if gap >= window(self.in_use, cycle) => return false,
            None => {}
        }
        let d = distance(
            self.pid,
            pid,
            procfs::pid_max() as i64,
            procfs::RESERVED_PIDS as i64,
        );
        self.moved += d;
        self.in_use = self.in_use.saturating_add(d);
        self.pid = pid;
        self.at = before;
        true
    }
}

/// Read the counter into the chain (if any): it goes on, or ends when the reading is late.
fn read_locked(st: &mut State) -> Option<(i32, f64)> {
    let before = crate::sys::boottime_secs();
    let pid = procfs::last_pid()?;
    let after = crate::sys::boottime_secs();
    if let Some(c) = st.chain.as_mut() {
        if !c.advance(pid, before, after, cycle()) {
            st.chain = None;
        }
    }
    Some((pid, before))
}

/// Follow the pid counter from now on in this process (idempotent): a thread reads it often
/// enough for the chain to go on while a look of every pid has started one.
pub fn follow() {
    FOLLOWING.get_or_init(|| {
        // Without the thread the chain is read only when a look asks (and so breaks at the
        // first gap past the bound): still sound, only shorter-lived.
        let _ = std::thread::Builder::new()
            .name("pid-counter".into())
            .spawn(sampler);
    });
}

fn following() -> bool {
    FOLLOWING.get().is_some()
}

fn sampler() {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let Some(c) = st.chain else {
            st = WAKE.wait(st).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        // A quarter of what is left of the bound since the last reading: three late wake-ups
        // in a row still keep the chain.
        let w = window(c.in_use, cycle());
        let pause = Duration::from_secs_f64((w / 4.0).clamp(0.001, 1.0));
        let (g, _) = WAKE
            .wait_timeout(st, pause)
            .unwrap_or_else(|e| e.into_inner());
        st = g;
        tick(&mut st);
    }
}

/// One reading of the sampler: the chain goes on, or ends when the reading is late or no look
/// has used the chain for [`LAPSE`].
fn tick(st: &mut State) {
    if st.chain.is_none() {
        return;
    }
    let _ = read_locked(st);
    if st
        .chain
        .is_some_and(|c| crate::sys::boottime_secs() - c.used > LAPSE)
    {
        st.chain = None;
    }
}

/// Note that a look uses the chain now.
fn touch(st: &mut State) {
    if let Some(c) = st.chain.as_mut() {
        c.used = crate::sys::boottime_secs();
    }
}

/// Read the counter and the live tasks for the mark of a look of every pid. While this process
/// follows the counter, the reading is on the chain, which it starts if there is none.
pub fn read() -> Option<Reading> {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let (last_pid, at) = read_locked(&mut st)?;
    let tasks = procfs::tasks()?;
    touch(&mut st);
    let chain = following().then(|| {
        let (c, start) = match st.chain {
            Some(c) => (c, false),
            None => {
                st.epochs += 1;
                let c = Chain {
                    epoch: st.epochs,
                    pid: last_pid,
                    at,
                    moved: 0,
                    // Until the look says: the tasks alone, for the pace of the readings.
                    in_use: tasks,
                    unseeded: Some(u64::MAX),
                    used: at,
                };
                st.chain = Some(c);
                WAKE.notify_all();
                (c, true)
            }
        };
        ChainMark {
            epoch: c.epoch,
            moved: c.moved,
            start,
        }
    });
    Some(Reading {
        last_pid,
        at,
        tasks,
        chain,
    })
}

/// What a look of every pid found in use at its mark (its tasks and its held group and session
/// ids). Of the look that began the chain, it decides whether every gap so far was short
/// enough (the chain goes on, or ends); of a later one, the chain's bound of the pids in use
/// tightens to it, plus what was handed out since.
pub fn seed(mark: ChainMark, in_use: u64) {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    touch(&mut st);
    let Some(c) = st.chain.as_mut().filter(|c| c.epoch == mark.epoch) else {
        return;
    };
    let since = c.moved - mark.moved;
    match c.unseeded {
        Some(most) if mark.start => {
            if in_use <= most {
                c.unseeded = None;
                c.in_use = in_use.saturating_add(since);
            } else {
                st.chain = None;
            }
        }
        // A later look's count says nothing of the chain's start.
        Some(_) => {}
        None => c.in_use = c.in_use.min(in_use.saturating_add(since)),
    }
}

/// Whether the counter has moved less than a whole cycle since `mark`, by a reading now on an
/// unbroken chain: every pid handed out since is then in the cyclic range after the mark's pid
/// (above it, while the counter is still at or above it).
pub fn holds(mark: ChainMark) -> bool {
    counter_if_holds(mark).is_some()
}

/// [`holds`], with the counter it read: the last pid handed out now, when the mark holds.
pub fn counter_if_holds(mark: ChainMark) -> Option<i32> {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let (pid, _) = read_locked(&mut st)?;
    touch(&mut st);
    st.chain
        .is_some_and(|c| {
            c.unseeded.is_none() && c.epoch == mark.epoch && c.moved - mark.moved < cycle()
        })
        .then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_runs_forward_through_the_wrap() {
        assert_eq!(distance(1000, 1000, 32768, 300), 0);
        assert_eq!(distance(1000, 1500, 32768, 300), 500);
        // 32767 is the last pid; the next is 300.
        assert_eq!(distance(32767, 300, 32768, 300), 1);
        assert_eq!(distance(32000, 1000, 32768, 300), 768 + 700);
    }

    /// A chain at pid 5000, at 100 s, with 10,000 pids in use.
    fn chain_at_5000(unseeded: Option<u64>) -> Chain {
        Chain {
            epoch: 1,
            pid: 5000,
            at: 100.0,
            moved: 0,
            in_use: 10_000,
            unseeded,
            used: 100.0,
        }
    }

    #[test]
    fn a_reading_later_than_the_bound_ends_the_chain_and_moves_are_summed() {
        let cycle = 32468;
        let mut c = chain_at_5000(None);
        // 22,468 free pids at 100,000 a second: 224.68 ms.
        assert!(c.advance(5100, 100.1, 100.2, cycle));
        assert_eq!((c.moved, c.in_use, c.pid), (100, 10_100, 5100));
        // Now 10,100 in use: 223.68 ms from the last reading's start.
        assert!(!c.clone().advance(5200, 100.3, 100.1 + 0.2237, cycle));
        assert!(c.advance(5200, 100.3, 100.1 + 0.2236, cycle));
        assert_eq!(c.moved, 200);
        // Nothing free: no reading is early enough.
        let mut full = Chain { in_use: cycle, ..c };
        assert!(!full.advance(5200, 100.3, 100.3, cycle));
    }

    #[test]
    fn an_unseeded_chain_notes_the_most_pids_in_use_its_gaps_allow() {
        let cycle = 32468;
        let mut c = chain_at_5000(Some(u64::MAX));
        // 125 ms: 12,500 pids could be handed out; 19,967 in use at most leave room.
        assert!(c.advance(5100, 100.125, 100.125, cycle));
        assert_eq!(c.unseeded, Some(cycle - 12_500 - 1));
        // Then 250 ms more after 100 moved: 32,468 - 100 - 25,000 - 1.
        assert!(c.advance(5200, 100.375, 100.375, cycle));
        assert_eq!(c.unseeded, Some(cycle - 100 - 25_000 - 1));
        assert_eq!(c.moved, 200);
        // A gap that alone could hand out a whole cycle ends it, seeded or not.
        assert!(!c.clone().advance(5300, 101.0, 100.875, cycle));
    }

    #[test]
    fn a_followed_counter_holds_a_mark_until_the_chain_breaks() {
        follow();
        let r = read().expect("ns_last_pid");
        let mark = r.chain.expect("following");
        seed(mark, r.tasks * 2);
        assert!(holds(mark));
        // Break the chain as a late reading would: the mark no longer holds, a new read
        // starts another chain.
        STATE.lock().unwrap().chain = None;
        assert!(!holds(mark));
        read().and_then(|r| r.chain).expect("a new chain");
        // A reading of the thread keeps a chain a look used lately, and ends one unused for
        // LAPSE.
        tick(&mut STATE.lock().unwrap());
        assert!(STATE.lock().unwrap().chain.is_some());
        STATE.lock().unwrap().chain.as_mut().unwrap().used -= LAPSE + 1.0;
        tick(&mut STATE.lock().unwrap());
        assert!(
            STATE.lock().unwrap().chain.is_none(),
            "an unused chain lapses"
        );
        let again = read().and_then(|r| r.chain).expect("a new chain");
        assert_ne!(again.epoch, mark.epoch);
        assert!(
            !holds(again),
            "a chain holds nothing before its first look's count"
        );
        seed(again, r.tasks * 2);
        assert!(holds(again));
    }
}
