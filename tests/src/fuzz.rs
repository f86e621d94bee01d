//! The hostile-workload fuzzer's pieces: a seeded random source, the moves a workload makes
//! against its own run, the steps a controller takes, and the workload script that plays the
//! moves one by one as the test hands them over.
//!
//! A sequence is drawn from a seed alone (its number mixed into the suite's seed), so a failing
//! one replays by itself: `AGENT_RUN_FUZZ_SEED=S AGENT_RUN_FUZZ_ONLY=N`.

use std::path::Path;

use crate::hostile_run::Mode;

/// SplitMix64: small, fast and good enough to pick moves; no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`, by weight.
    pub fn pick<T: Copy>(&mut self, items: &[(T, u64)]) -> T {
        let total: u64 = items.iter().map(|(_, w)| w).sum();
        let mut at = self.below(total);
        for (item, w) in items {
            if at < *w {
                return *item;
            }
            at -= w;
        }
        items[items.len() - 1].0
    }
}

/// What the workload does to its own run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    RemoveRecord,
    ForgeFinal,
    ForgeContainment,
    GarbageRecord,
    EventsFifo,
    EventsSymlink,
    LockDir,
    LockMode000,
    DirMode500,
    ForgeLease,
    GarbageLease,
    RenewItself,
    StopWrapper,
    StopWrapperAgainAndAgain,
    ContinueWrapper,
    KillWrapper,
    FreezeWrapper,
    Child,
    HiddenChild,
    LeaveCgroup,
    Hopper,
    TouchLock,
}

impl Move {
    /// The moves a workload of `mode` can make, by weight. Leaving the cgroup needs a cgroup it
    /// may write outside its own (root can write any: no supervisor on the host can hold it,
    /// see the threat model; so only the delegated mode leaves); freezing the wrapper needs one
    /// of its own to move it into.
    pub fn menu(mode: Mode) -> Vec<(Move, u64)> {
        use Move::*;
        let mut m = vec![
            (RemoveRecord, 4),
            (ForgeFinal, 6),
            (ForgeContainment, 3),
            (GarbageRecord, 3),
            (EventsFifo, 2),
            (EventsSymlink, 2),
            (LockDir, 2),
            (LockMode000, 2),
            (DirMode500, 2),
            (ForgeLease, 4),
            (GarbageLease, 2),
            (RenewItself, 2),
            (StopWrapper, 5),
            (StopWrapperAgainAndAgain, 2),
            (ContinueWrapper, 3),
            (KillWrapper, 12),
            (Child, 6),
            (HiddenChild, 10),
            (Hopper, 1),
            (TouchLock, 2),
        ];
        if mode != Mode::NobodyProcfs {
            m.push((FreezeWrapper, 2));
        }
        if mode == Mode::NobodyDelegated {
            m.push((LeaveCgroup, 4));
        }
        m
    }

    /// The move as sh, run by the workload (`$PPID` is its wrapper) with `say` to report. A
    /// child it starts is said as `pid child N` (a plain one), `pid hidden N` (out of its
    /// session, its environment cleared) or `pid escapee N` (moved out of the run's cgroup).
    pub fn script(self, env: &Env<'_>) -> String {
        let run = "\"$AGENT_RUN_DIR\"";
        let replace = |sed: &str| {
            format!("sed -e '{sed}' {run}/status.json > {run}/.f 2>/dev/null && mv -f {run}/.f {run}/status.json")
        };
        match self {
            Move::RemoveRecord => format!("rm -f {run}/status.json"),
            Move::ForgeFinal => replace(
                "s/\"state\": *\"[a-z_]*\"/\"state\": \"finished\"/; s/\"exit_code\": *null/\"exit_code\": 0/",
            ),
            Move::ForgeContainment => {
                replace("s/\"mode\": *\"cgroup\"/\"mode\": \"procfs\"/; s/\"cgroup\": *\"[^\"]*\"/\"cgroup\": null/")
            }
            Move::GarbageRecord => {
                format!("printf '{{' > {run}/.f && mv -f {run}/.f {run}/status.json")
            }
            Move::EventsFifo => format!("rm -f {run}/events.jsonl; mkfifo {run}/events.jsonl"),
            Move::EventsSymlink => {
                format!("rm -rf {run}/events.jsonl; ln -s /dev/zero {run}/events.jsonl")
            }
            Move::LockDir => format!("rm -f {run}/lock; mkdir {run}/lock"),
            Move::LockMode000 => format!("chmod 000 {run}/lock"),
            Move::DirMode500 => format!("chmod 500 {run}"),
            Move::ForgeLease => format!(
                "printf '{{\"deadline_epoch\": 9999999999, \"lease_s\": 3600}}' > {run}/.l && \
                 mv -f {run}/.l {run}/lease.json; kill -USR1 $PPID"
            ),
            Move::GarbageLease => {
                format!("printf 'garbage' > {run}/.l && mv -f {run}/.l {run}/lease.json")
            }
            Move::RenewItself => format!(
                "'{}' --root '{}' renew \"$AGENT_RUN_ID\" --lease 1h >/dev/null 2>&1",
                env.agent_run.display(),
                env.root.display()
            ),
            Move::StopWrapper => "kill -STOP $PPID".into(),
            Move::StopWrapperAgainAndAgain => {
                "(while :; do kill -STOP $PPID 2>/dev/null; sleep 0.05; done) &".into()
            }
            Move::ContinueWrapper => "kill -CONT $PPID".into(),
            Move::KillWrapper => "kill -9 $PPID".into(),
            Move::FreezeWrapper => {
                let play = env.playground.expect("a playground cgroup").display();
                format!(
                    "mkdir -p '{play}/ice' && echo $PPID > '{play}/ice/cgroup.procs' && \
                     echo 1 > '{play}/ice/cgroup.freeze'"
                )
            }
            Move::Child => "sleep 600 & say \"pid child $!\"".into(),
            Move::HiddenChild => "setsid env -i sleep 600 & say \"pid hidden $!\"".into(),
            Move::LeaveCgroup => {
                let play = env.playground.expect("a playground cgroup").display();
                format!(
                    "setsid env -i sleep 600 & c=$!; echo $c > '{play}/cgroup.procs' && \
                     say \"pid escapee $c\""
                )
            }
            Move::Hopper => format!(
                "python3 '{}' & say \"pid child $!\"",
                env.hopper.display()
            ),
            Move::TouchLock => format!("touch {run}/lock"),
        }
    }
}

/// What a move's script needs to know.
pub struct Env<'a> {
    pub agent_run: &'a Path,
    pub root: &'a Path,
    /// A cgroup the workload may write (the delegated parent, or one of the test's for root).
    pub playground: Option<&'a Path>,
    pub hopper: &'a Path,
}

/// The hopper: on TERM or HUP, fork, the parent exits, the child makes a session of its own,
/// for ever.
pub const HOPPER: &str = "import os, signal, time\n\
def hop(sig, frm):\n    while True:\n        if os.fork() > 0:\n            os._exit(0)\n        os.setsid()\n\
signal.signal(signal.SIGTERM, hop)\nsignal.signal(signal.SIGHUP, hop)\n\
while True:\n    time.sleep(1)\n";

/// What the controller does between the workload's moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The workload makes a move.
    Workload(Move),
    /// One pass of `agent-run-watchdog --once`.
    Watchdog,
    /// `agent-run gc --older-than 0s`.
    Gc,
    /// `agent-run status --json`, checked against the kernel.
    Status,
    /// `agent-run cancel`: the run ends here.
    Cancel,
}

/// A sequence: the run's options and its steps (the last one a cancel).
#[derive(Debug, Clone)]
pub struct Sequence {
    pub mode: Mode,
    pub ignores_term: bool,
    pub lease: bool,
    pub steps: Vec<Step>,
}

impl Sequence {
    /// Sequence `n` of the suite's `seed`, in `mode`.
    pub fn draw(seed: u64, n: u64, mode: Mode) -> Sequence {
        let mut rng = Rng::new(seed ^ n.wrapping_mul(0xA24B_AED4_963E_E407));
        let menu = Move::menu(mode);
        let len = 2 + rng.below(7);
        let mut steps = Vec::new();
        for _ in 0..len {
            let step = match rng.below(10) {
                0..=6 => Step::Workload(rng.pick(&menu)),
                7 => Step::Watchdog,
                8 => Step::Gc,
                _ => Step::Status,
            };
            steps.push(step);
        }
        steps.push(Step::Cancel);
        Sequence {
            mode,
            ignores_term: rng.chance(70),
            lease: rng.chance(30),
            steps,
        }
    }
}

/// The workload: TERM and HUP ignored (or not), then each move as the test hands it over
/// (`$GO.N`, sourced), each reported done (`step N`).
pub fn workload(go: &Path, said: &Path, ignores_term: bool) -> String {
    format!(
        "{trap}GO='{go}'; SAID='{said}'; say() {{ echo \"$1\" >> \"$SAID\"; }}; n=1\n\
         while :; do\n\
         while [ ! -e \"$GO.$n\" ]; do sleep 0.01; done\n\
         . \"$GO.$n\"\n\
         say \"step $n\"; n=$((n+1))\n\
         done",
        trap = if ignores_term {
            "trap '' TERM HUP; "
        } else {
            ""
        },
        go = go.display(),
        said = said.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_replays_from_its_seed_and_ends_in_a_cancel() {
        for n in 0..50 {
            let a = Sequence::draw(7, n, Mode::NobodyDelegated);
            let b = Sequence::draw(7, n, Mode::NobodyDelegated);
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            assert_eq!(a.steps.last(), Some(&Step::Cancel));
        }
        let moves = |m: Mode| -> Vec<Move> { Move::menu(m).into_iter().map(|x| x.0).collect() };
        assert!(!moves(Mode::RootCgroup).contains(&Move::LeaveCgroup));
        assert!(!moves(Mode::NobodyProcfs).contains(&Move::FreezeWrapper));
    }
}
