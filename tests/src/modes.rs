//! The containment modes a scenario runs in, and [`for_each_mode`], which runs one scenario in
//! each mode this host can give.
//!
//! A mode is who the workload runs as and what holds it: root in a cgroup of its own, root held
//! by /proc scans alone (`--cgroup off`), `nobody` held by /proc scans, `nobody` in a cgroup
//! delegated to it (the README's operator setup). A mode that needs a cgroup2 mount is skipped,
//! with a line on stderr, on a host without one.

use crate::contain::cgroup2_mount;

/// Who the workload runs as, and what holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Root, held in a cgroup of its own (the default as root on a cgroup2 host).
    RootCgroup,
    /// Root, held by /proc scans alone (`--cgroup off`).
    RootProcfs,
    /// `nobody`, held by /proc scans alone (`--cgroup off`).
    NobodyProcfs,
    /// `nobody`, in a cgroup delegated to it.
    NobodyDelegated,
}

/// Root's two modes: what `--cgroup` chooses between.
pub const ROOT_MODES: [Mode; 2] = [Mode::RootCgroup, Mode::RootProcfs];

/// The three places a hostile workload runs from (docs/safety.md, section B4).
pub const WORKLOAD_MODES: [Mode; 3] = [Mode::RootCgroup, Mode::NobodyProcfs, Mode::NobodyDelegated];

impl Mode {
    /// Every place a workload runs from that this host can give.
    pub fn all() -> Vec<Mode> {
        WORKLOAD_MODES
            .into_iter()
            .filter(|m| m.available())
            .collect()
    }

    /// Whether the run is held in a cgroup.
    pub fn cgroup(self) -> bool {
        matches!(self, Mode::RootCgroup | Mode::NobodyDelegated)
    }

    /// Whether the workload runs as root.
    pub fn as_root(self) -> bool {
        matches!(self, Mode::RootCgroup | Mode::RootProcfs)
    }

    /// Whether this host can give the mode: a cgroup needs a cgroup2 mount.
    pub fn available(self) -> bool {
        !self.cgroup() || cgroup2_mount().is_some()
    }

    /// The options of `agent-run start` that choose the mode.
    pub fn opts(self) -> Vec<&'static str> {
        if self.cgroup() {
            vec![]
        } else {
            vec!["--cgroup", "off"]
        }
    }

    /// The `containment.mode` a run in this mode records.
    pub fn recorded(self) -> &'static str {
        if self.cgroup() {
            "cgroup"
        } else {
            "procfs"
        }
    }

    /// A short lowercase name for run ids and messages.
    pub fn tag(self) -> &'static str {
        match self {
            Mode::RootCgroup => "cgroup",
            Mode::RootProcfs => "procfs",
            Mode::NobodyProcfs => "nobody-procfs",
            Mode::NobodyDelegated => "nobody-delegated",
        }
    }
}

/// Runs `scenario` once in each of `modes` that this host can give, in order. A mode it cannot
/// give is skipped with a line on stderr; each run starts with a line naming its mode, so a
/// failure's output says which mode failed.
pub fn for_each_mode(modes: &[Mode], mut scenario: impl FnMut(Mode)) {
    for &mode in modes {
        if !mode.available() {
            eprintln!("no cgroup2 mount on this host: mode {mode:?} is skipped");
            continue;
        }
        eprintln!("--- mode {mode:?}");
        scenario(mode);
    }
}

/// One `#[test]` per mode for a scenario that takes the [`Mode`]:
///
/// ```text
/// mode_tests!(a_damaged_run_file_never_stops_a_stop;
///     a_damaged_run_file_never_stops_a_stop_as_root => RootCgroup,
///     a_damaged_run_file_never_stops_a_stop_as_nobody_in_procfs_mode => NobodyProcfs,
/// );
/// ```
///
/// Each test runs its mode through [`for_each_mode`], so a mode the host cannot give passes
/// with a line on stderr.
#[macro_export]
macro_rules! mode_tests {
    ($scenario:expr; $($(#[$attr:meta])* $name:ident => $mode:ident),+ $(,)?) => {
        $crate::cases!(|mode| $crate::modes::for_each_mode(&[mode], $scenario);
            $($(#[$attr])* $name => $crate::modes::Mode::$mode),+
        );
    };
}
