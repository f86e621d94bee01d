//! What is true of a run: the kernel's facts first, its files second. The one verdict that
//! `wait`, `attach`, `status`, `list`, `cancel`, `gc`, the watchdog and (through them) the MCP
//! server go by.
//!
//! A [`Look`] reads the record (or says why it cannot), who holds the run's lock
//! ([`crate::wrapper::holder`]: its live wrapper, a party finishing it, a squatter, nobody) and
//! the run's cgroup, found by its name on the whole cgroup2 mount whatever the record says, and
//! whether it holds processes. A final record is believed ([`Look::believed`]) only when the
//! kernel agrees: its cgroup holds nothing, and no live wrapper holds the run unless that
//! wrapper says, in its signal mask, that it wrote the record itself
//! ([`crate::sys::mark_final`]), and no squatter does. Anything else is a run that goes on,
//! whatever its record says ([`Look::doubt`] says why).

use crate::cgroup::{RunCgroup, RunCgroups};
use crate::error::{Error, Result};
use crate::pid::Pid;
use crate::procfs::{self, LockTable};
use crate::record::{ContainmentMode, Status};
use crate::run_dir::RunDir;
use crate::wrapper::{holder, Holder, VerifiedWrapper};
use std::path::PathBuf;

/// What a caller that looks at many runs reads once for all of them.
#[derive(Default, Clone, Copy)]
pub struct Shared<'a> {
    /// /proc/locks, read once.
    pub locks: Option<&'a LockTable>,
    /// The run cgroups of the mount, walked once.
    pub cgroups: Option<&'a RunCgroups>,
    /// Where the run's cgroup was found before (it does not move): looked at first.
    pub cgroup: Option<&'a std::path::Path>,
}

/// The facts about one run at one moment.
#[derive(Debug)]
pub struct Look {
    /// The record as read: `Missing` or `Corrupt` when it cannot be had.
    pub record: Result<Status>,
    /// Who holds the run's lock.
    pub holder: Holder,
    /// The run's cgroup, found by its name on the mount.
    pub cgroup: Option<RunCgroup>,
    /// Whether that cgroup holds a process.
    pub populated: bool,
}

/// Why a record's word is not the whole truth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doubt {
    /// A final record while the run's cgroup holds processes: the workload wrote it.
    CgroupPopulated,
    /// A final record while the run's wrapper runs and has not written one: the workload
    /// wrote it.
    WrapperAlive(Pid),
    /// A final record while a process that is not agent-run holds the run's lock.
    Squatted(Vec<Pid>),
    /// Not final, and no live wrapper holds the run: nobody finished it yet.
    WrapperGone,
    /// The record cannot be read (missing, not a regular file, not a record).
    NoRecord(String),
}

impl Look {
    /// Look at a run now.
    pub fn take(dir: &RunDir) -> Look {
        Look::take_with(dir, dir.read_status(), &Shared::default())
    }

    /// Look at a run whose record the caller already read, with what it shares across runs.
    pub fn take_with(dir: &RunDir, record: Result<Status>, shared: &Shared<'_>) -> Look {
        let hint: Option<PathBuf> = match shared.cgroup {
            Some(p) => Some(p.to_path_buf()),
            None => record
                .as_ref()
                .ok()
                .and_then(|st| st.containment.as_ref())
                .and_then(|c| c.cgroup.as_deref())
                .map(PathBuf::from),
        };
        let cgroup = crate::cgroup::find_run_cgroup_with(dir, hint.as_deref(), shared.cgroups);
        let populated = cgroup.as_ref().is_some_and(RunCgroup::populated);
        let holder = holder(
            dir,
            dir.lock_ids(),
            shared.locks,
            cgroup.as_ref().map(|c| c.path()),
            record
                .as_ref()
                .ok()
                .and_then(Status::wrapper)
                .map(|w| w.pid),
        );
        Look {
            record,
            holder,
            cgroup,
            populated,
        }
    }

    /// The live wrapper, when it holds the run.
    pub fn wrapper(&self) -> Option<&VerifiedWrapper> {
        self.holder.wrapper()
    }

    /// The final record, when the kernel agrees that the run is over.
    pub fn believed(&self) -> Option<&Status> {
        let st = self.record.as_ref().ok()?;
        (st.state.is_final() && self.final_doubt().is_none()).then_some(st)
    }

    /// Why a final record is not believed (`None` for a record that is not final).
    fn final_doubt(&self) -> Option<Doubt> {
        if self.populated {
            return Some(Doubt::CgroupPopulated);
        }
        match &self.holder {
            Holder::Wrapper(w) if !procfs::marks_final(w.pid()) => {
                Some(Doubt::WrapperAlive(w.pid()))
            }
            // Held by something that is not agent-run: in a cgroup that is empty, nothing of
            // the run can be behind it; by /proc scans alone, it may be the run's.
            Holder::Squatter(p) if self.cgroup.is_none() => Some(Doubt::Squatted(p.clone())),
            _ => None,
        }
    }

    /// What the record cannot say by itself, if anything.
    pub fn doubt(&self) -> Option<Doubt> {
        match &self.record {
            Err(e) => Some(Doubt::NoRecord(e.to_string())),
            Ok(st) if st.state.is_final() => self.final_doubt(),
            Ok(_) => match self.holder {
                Holder::Wrapper(_) | Holder::Party(_) => None,
                Holder::Squatter(_) | Holder::Nobody => Some(Doubt::WrapperGone),
            },
        }
    }

    /// Whether the run is over by the kernel's account, even without a final record: nothing
    /// holds it and its cgroup, if any, is empty. (A run held by /proc scans alone, whose
    /// wrapper is gone, may still have processes nobody can find: see the stop's `proof`.)
    pub fn nothing_holds_it(&self) -> bool {
        !self.populated && matches!(self.holder, Holder::Nobody)
    }

    /// How the run is held, by kernel facts: `cgroup` when its cgroup exists, else what the
    /// record says (procfs when it says nothing).
    pub fn mode(&self) -> ContainmentMode {
        if self.cgroup.is_some() {
            return ContainmentMode::Cgroup;
        }
        self.record
            .as_ref()
            .ok()
            .and_then(|st| st.containment.as_ref())
            .map_or(ContainmentMode::Procfs, |c| c.mode)
    }
}

impl Doubt {
    /// The note `status` and `list` show.
    pub fn note(&self) -> String {
        match self {
            Doubt::CgroupPopulated => {
                "but its cgroup holds processes: the record was rewritten".into()
            }
            Doubt::WrapperAlive(p) => {
                format!("but its wrapper (pid {p}) is still running: the record was rewritten")
            }
            Doubt::Squatted(p) => format!(
                "but pid {} holds the run's lock and is not agent-run: the record was rewritten",
                list(p)
            ),
            Doubt::WrapperGone => "wrapper gone, not reconciled".into(),
            Doubt::NoRecord(why) => format!("no readable record ({why})"),
        }
    }

    /// The short form `list` shows.
    pub fn short(&self) -> &'static str {
        match self {
            Doubt::CgroupPopulated => "cgroup not empty",
            Doubt::WrapperAlive(_) => "wrapper running",
            Doubt::Squatted(_) => "lock squatted",
            Doubt::WrapperGone => "wrapper gone",
            Doubt::NoRecord(_) => "no record",
        }
    }
}

fn list(p: &[Pid]) -> String {
    p.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A record that is missing or unreadable, as an error a caller can branch on.
pub fn is_missing(e: &Error) -> bool {
    matches!(e, Error::Missing { .. })
}
