//! status.json: the run's record, and the one writer for it.
//!
//! Every key of the contract is present in every write (null where unknown). Records are replaced
//! atomically through the run dir ([`RunDir::write_status`]); a final record is durable (see
//! [`RunDir::replace`]) before it returns, and is never overwritten: writing over a final record is refused.
//! Readers get [`Error::Missing`] or [`Error::Corrupt`] for a missing or partial document and
//! must report it as such, never guess.

use crate::error::{Error, Result};
use crate::pid::{ClaimedPid, Identity, Pid};
use crate::run_dir::{caps, files, RunDir};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

/// The record's schema version.
pub const SCHEMA: u32 = 1;

/// Every key of a record, in the order [`Status`] has them (the order a record is written in).
/// Every write has each one (null where unknown): the watchdog's fast scan indexes them and the
/// tests check every record and printed record against them.
pub const KEYS: &[&str] = &[
    "schema",
    "run_id",
    "state",
    "reason",
    "exit_code",
    "term_signal",
    "argv",
    "cwd",
    "pid",
    "pgid",
    "sid",
    "start_ticks",
    "boot_id",
    "wrapper_pid",
    "wrapper_start_ticks",
    "host",
    "user",
    "uid",
    "created_at",
    "started_at",
    "ended_at",
    "cleanup",
    "error",
    "version",
    "grace_ms",
    "hup_after_ms",
    "warnings",
    "argv_b64",
    "timeout_ms",
    "labels",
    "env",
    "caller_lost_at",
    "on_disconnect",
    "launch_exit_code",
    "containment",
    "resources",
    "pty",
    "output",
    "proof",
    "lease_token_sha256",
];

/// The states of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Starting,
    Running,
    Cancelling,
    Finished,
    Cancelled,
    LaunchFailed,
    Unknown,
}

impl State {
    /// Every state, in the order of a run's life.
    pub const ALL: [State; 7] = [
        State::Starting,
        State::Running,
        State::Cancelling,
        State::Finished,
        State::Cancelled,
        State::LaunchFailed,
        State::Unknown,
    ];

    /// The words `list --state` takes: every state's, then `active` (not final) and `final`.
    pub fn filter_words() -> impl Iterator<Item = &'static str> {
        State::ALL
            .into_iter()
            .map(State::as_str)
            .chain(["active", "final"])
    }

    /// Final states are written once and never change.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            State::Finished | State::Cancelled | State::LaunchFailed | State::Unknown
        )
    }

    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Cancelling => "cancelling",
            State::Finished => "finished",
            State::Cancelled => "cancelled",
            State::LaunchFailed => "launch_failed",
            State::Unknown => "unknown",
        }
    }
}

/// What a stop did: the `cleanup` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cleanup {
    /// Signal names in the order first sent: "TERM", "HUP", "KILL".
    pub signals: Vec<String>,
    pub duration_ms: u64,
    /// Pids still alive after the KILL step and the confirmation window.
    pub survivors: Vec<ClaimedPid>,
    /// Pids that were signalled (the leftovers, when the leader exited on its own).
    #[serde(default)]
    pub signalled: Vec<ClaimedPid>,
    /// Pids that may be the run's, found where a process that left the run's cgroup could
    /// be ([`crate::escape`]), after its wrapper was lost: not signalled, named.
    #[serde(default)]
    pub escapees: Vec<ClaimedPid>,
}

/// The record, key for key as the contract lists it (plus the run's stop timings, so a later
/// `cancel` or the watchdog stops the run with the timings it was started with).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub schema: u32,
    pub run_id: String,
    pub state: State,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub term_signal: Option<String>,
    pub argv: Vec<String>,
    pub cwd: String,
    /// The leader, its group and session: claims of the record (see [`ClaimedPid`]).
    pub pid: Option<ClaimedPid>,
    pub pgid: Option<ClaimedPid>,
    pub sid: Option<ClaimedPid>,
    pub start_ticks: Option<u64>,
    pub boot_id: String,
    pub wrapper_pid: Option<ClaimedPid>,
    /// The wrapper's start time (clock ticks since boot), to tell it from a reused pid.
    #[serde(default)]
    pub wrapper_start_ticks: Option<u64>,
    pub host: String,
    pub user: String,
    pub uid: u32,
    pub created_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub cleanup: Option<Cleanup>,
    pub error: Option<String>,
    pub version: String,
    /// TERM -> KILL grace of this run, in milliseconds.
    #[serde(default)]
    pub grace_ms: Option<u64>,
    /// TERM -> HUP step of this run, in milliseconds (0: no HUP step).
    #[serde(default)]
    pub hup_after_ms: Option<u64>,
    /// Host policies that may kill the run behind agent-run's back.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The exact bytes of every argument, base64 (standard, padded), when any argument is not
    /// valid UTF-8 (`argv` then holds them with U+FFFD where bytes were invalid, for display
    /// only); null when `argv` is exact.
    #[serde(default)]
    pub argv_b64: Option<Vec<String>>,
    /// The run's wall-clock limit (`--timeout`) in milliseconds, counted from `started_at`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The labels given with `--label K=V` (an engine's own job id, a team...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The names of the variables given with `-e K=V` (the values are not recorded).
    #[serde(default)]
    pub env: Vec<String>,
    /// When the foreground wrapper saw its caller go (its stdout and stderr hung up).
    #[serde(default)]
    pub caller_lost_at: Option<String>,
    /// The `--on-disconnect` policy of a foreground run: "keep", "cancel" or a duration
    /// ("30s"); null for a detached run, which has no caller to lose.
    #[serde(default)]
    pub on_disconnect: Option<String>,
    /// For `launch_failed`: the launch failure's exit code (127 not found, 126 cannot execute,
    /// 70 anything else); null otherwise. `exit_code` stays null: the leader never exited.
    #[serde(default)]
    pub launch_exit_code: Option<i32>,
    /// What holds the run's processes: a cgroup of its own (the kernel's membership), or the
    /// procfs process set. Null in records from before it was kept (procfs).
    #[serde(default)]
    pub containment: Option<Containment>,
    /// The CPU the run used and its peak memory (from its cgroup), in a final record of a run
    /// held in a cgroup; null otherwise.
    #[serde(default)]
    pub resources: Option<crate::cgroup::Resources>,
    /// Whether the workload runs on a pseudo-terminal of its own (`--pty`): then stdout.log
    /// holds everything it wrote to the terminal and stderr.log stays empty. False in records
    /// from before it was kept.
    #[serde(default)]
    pub pty: bool,
    /// What the output keeper wrote and dropped per stream, and the cap
    /// ([`crate::output::Output`]); null for a run whose keeper never started.
    #[serde(default)]
    pub output: Option<crate::output::Output>,
    /// How a final record knows that nothing of the run is left ([`Proof`]); null while the
    /// run is active, and for records from before it was kept.
    #[serde(default)]
    pub proof: Option<Proof>,
    /// The SHA-256 of the run's lease token, hex ([`crate::lease`]): `renew` checks a token
    /// against it before anything changes. Null for a run without a lease. The token itself is
    /// never in the run dir.
    #[serde(default)]
    pub lease_token_sha256: Option<String>,
}

/// How a final record knows that nothing of the run is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proof {
    /// The run's cgroup said `populated 0`: the kernel's own count of its processes.
    CgroupEmpty,
    /// The run's wrapper, a child subreaper, had no live child left and two looks at /proc
    /// found nothing of the run: every process of the run is in the wrapper's tree while the
    /// wrapper lives.
    TreeWalk,
    /// Nothing can tell: the run was held by /proc scans alone and its wrapper was lost, so a
    /// process of the run that cleared its environment and left its session is not to be found.
    Unprovable,
}

impl Proof {
    /// The record's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Proof::CgroupEmpty => "cgroup_empty",
            Proof::TreeWalk => "tree_walk",
            Proof::Unprovable => "unprovable",
        }
    }
}

/// The `containment` key: `{"mode": "cgroup" | "procfs", "cgroup": PATH | null}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Containment {
    pub mode: ContainmentMode,
    pub cgroup: Option<String>,
}

/// How a run's processes are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainmentMode {
    /// A cgroup v2 of the run's own: every process and thread in it is the run's.
    Cgroup,
    /// The process group, session, wrapper descendants and marker, found in /proc.
    Procfs,
}

impl Containment {
    /// Held in `cgroup`.
    pub fn cgroup(path: &std::path::Path) -> Containment {
        Containment {
            mode: ContainmentMode::Cgroup,
            cgroup: Some(path.to_string_lossy().into_owned()),
        }
    }

    /// Held by the procfs process set.
    pub fn procfs() -> Containment {
        Containment {
            mode: ContainmentMode::Procfs,
            cgroup: None,
        }
    }
}

impl Status {
    /// The leader as the record names it: its pid and start ticks, when both are there (and
    /// the pid is positive). A claim of the record, which the workload can rewrite: only
    /// [`crate::wrapper::check_record`] and the stop's own checks against the kernel make it
    /// something to act on.
    pub fn leader(&self) -> Option<Identity> {
        Some(Identity {
            pid: self.pid?.pid()?,
            start_ticks: self.start_ticks?,
        })
    }

    /// The wrapper as the record names it: its pid and start ticks, when both are there (a
    /// claim, confirmed only by [`crate::wrapper::verify_wrapper`]).
    pub fn wrapper(&self) -> Option<Identity> {
        Some(Identity {
            pid: self.wrapper_pid?.pid()?,
            start_ticks: self.wrapper_start_ticks?,
        })
    }

    /// Name the leader: the pid and start ticks the kernel gave for the spawned workload.
    pub fn set_leader(&mut self, leader: Identity) {
        self.pid = Some(leader.pid.into());
        self.start_ticks = Some(leader.start_ticks);
    }

    /// Name the wrapper (this process, with the start ticks /proc gives for it).
    pub fn set_wrapper(&mut self, pid: Pid, start_ticks: Option<u64>) {
        self.wrapper_pid = Some(pid.into());
        self.wrapper_start_ticks = start_ticks;
    }

    /// A record for `run_id` in state `starting`, with this host, user, boot and version filled
    /// in and nothing known about the workload yet.
    pub fn blank(run_id: &str) -> Status {
        let uid = crate::sys::geteuid();
        Status {
            schema: SCHEMA,
            run_id: run_id.to_string(),
            state: State::Starting,
            reason: None,
            exit_code: None,
            term_signal: None,
            argv: Vec::new(),
            cwd: String::new(),
            pid: None,
            pgid: None,
            sid: None,
            start_ticks: None,
            boot_id: crate::procfs::boot_id(),
            wrapper_pid: None,
            wrapper_start_ticks: None,
            host: crate::sys::hostname(),
            user: crate::users::user_name(uid),
            uid,
            created_at: crate::time::rfc3339_now(),
            started_at: None,
            ended_at: None,
            cleanup: None,
            error: None,
            version: crate::VERSION.into(),
            grace_ms: None,
            hup_after_ms: None,
            warnings: Vec::new(),
            argv_b64: None,
            timeout_ms: None,
            labels: BTreeMap::new(),
            env: Vec::new(),
            caller_lost_at: None,
            on_disconnect: None,
            launch_exit_code: None,
            containment: None,
            resources: None,
            pty: false,
            output: None,
            proof: None,
            lease_token_sha256: None,
        }
    }

    /// Record the command: `argv` as strings, and `argv_b64` with the exact bytes when any
    /// argument is not valid UTF-8.
    pub fn set_argv(&mut self, argv: &[OsString]) {
        self.argv = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        self.argv_b64 = argv
            .iter()
            .any(|a| a.to_str().is_none())
            .then(|| argv.iter().map(|a| B64.encode(a.as_bytes())).collect());
    }

    /// The command's exact bytes: from `argv_b64` when present, else from `argv`. `None` when
    /// `argv_b64` does not decode or disagrees with `argv` in length (a damaged record).
    pub fn argv_bytes(&self) -> Option<Vec<Vec<u8>>> {
        match &self.argv_b64 {
            None => Some(self.argv.iter().map(|a| a.as_bytes().to_vec()).collect()),
            Some(b) if b.len() == self.argv.len() => b.iter().map(|a| B64.decode(a).ok()).collect(),
            Some(_) => None,
        }
    }

    /// Whether the record stands for exactly this command, byte for byte.
    pub fn same_argv(&self, argv: &[OsString]) -> bool {
        self.argv_bytes().is_some_and(|mine| {
            mine.len() == argv.len() && mine.iter().zip(argv).all(|(m, a)| m == a.as_bytes())
        })
    }

    /// When the run's `--timeout` expires (epoch seconds): `started_at` + `timeout_ms`. `None`
    /// without a timeout, or before the workload started.
    pub fn timeout_deadline_epoch(&self) -> Option<f64> {
        let started = crate::time::parse_rfc3339(self.started_at.as_deref()?)?;
        Some(started + self.timeout_ms? as f64 / 1000.0)
    }

    /// Serialize as one pretty JSON document with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a record always serializes");
        s.push('\n');
        s
    }
}

impl RunDir {
    /// Write the record atomically; fsync it when final. A final record is never overwritten.
    pub fn write_status(&self, st: &Status) -> Result<()> {
        // Only the lock holder writes, so a non-final write cannot race a final one; the check
        // guards the final write, where a mistake would rewrite history.
        if !st.state.is_final() {
            return self.write_record(st, false);
        }
        if let Ok(old) = self.read_status() {
            if old.state.is_final() {
                return Err(Error::Corrupt {
                    path: self.file(files::STATUS),
                    why: format!(
                        "the record is already final ({}); refusing to overwrite it with {}",
                        old.state.as_str(),
                        st.state.as_str()
                    ),
                });
            }
        }
        self.write_record(st, true)
    }

    /// Write a final record over a final one that the lock holder did not write: only the
    /// holder of the run's lock writes records, so a final record it finds in its way was
    /// written by something else (the workload rewrote status.json). Refused unless this
    /// process holds the run's lock (its dir's) now, by the kernel's account
    /// (/proc/self/fdinfo).
    pub fn write_final_over_forgery(&self, st: &Status) -> Result<()> {
        debug_assert!(st.state.is_final());
        let (dev, ino) = self.identity();
        if !crate::procfs::holds_flock(crate::pid::Pid::this(), dev, ino) {
            return Err(Error::Corrupt {
                path: self.file(files::STATUS),
                why: "the record is already final, and this process does not hold the run's lock"
                    .into(),
            });
        }
        self.write_record(st, true)
    }

    fn write_record(&self, st: &Status, durable: bool) -> Result<()> {
        let bytes = st.to_json().into_bytes();
        self.replace(files::STATUS, durable, |f| {
            if crate::fault::armed("mid_record_write") && self.stat_file(files::STATUS).is_some() {
                // Die with half a document in the temp file: status.json must stay whole.
                let _ = f.write_all(&bytes[..bytes.len() / 2]);
                crate::sys::kill_self();
            }
            f.write_all(&bytes)
        })
    }

    /// Read and parse the record: `Missing` when absent, `Corrupt` when not a whole valid
    /// document (or not a regular file of ours, or larger than a record can be: see
    /// [`RunDir::read_run_file`]).
    pub fn read_status(&self) -> Result<Status> {
        let bytes = self.read_run_file(files::STATUS, caps::STATUS)?;
        let path = || self.file(files::STATUS);
        let s = std::str::from_utf8(&bytes).map_err(|e| Error::Corrupt {
            path: path(),
            why: e.to_string(),
        })?;
        parse_status(s).map_err(|why| Error::Corrupt { path: path(), why })
    }
}

/// Parse a record from text, checking the schema.
pub fn parse_status(s: &str) -> std::result::Result<Status, String> {
    let st: Status = serde_json::from_str(s).map_err(|e| e.to_string())?;
    if st.schema != SCHEMA {
        return Err(format!("unsupported schema {}", st.schema));
    }
    Ok(st)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Status {
        Status {
            argv: vec!["true".into()],
            cwd: "/".into(),
            boot_id: "b".into(),
            wrapper_pid: Pid::new(1).map(ClaimedPid::from),
            host: "h".into(),
            user: "u".into(),
            uid: 0,
            created_at: "2026-11-30T00:00:00.000Z".into(),
            grace_ms: Some(5000),
            hup_after_ms: Some(500),
            ..Status::blank("r1")
        }
    }

    #[test]
    fn argv_that_is_not_utf8_is_kept_byte_exact() {
        use std::os::unix::ffi::OsStringExt;
        let mut st = sample();
        let a = vec![
            OsString::from("echo"),
            OsString::from_vec(b"A\xff".to_vec()),
        ];
        let b = vec![
            OsString::from("echo"),
            OsString::from_vec(b"A\xfe".to_vec()),
        ];
        st.set_argv(&a);
        assert_eq!(st.argv, ["echo", "A\u{fffd}"]);
        let back = parse_status(&st.to_json()).unwrap();
        assert!(back.same_argv(&a));
        assert!(!back.same_argv(&b));
        assert_eq!(back.argv_bytes().unwrap()[1], b"A\xff");
        let mut plain = sample();
        plain.set_argv(&[OsString::from("true")]);
        assert!(plain.argv_b64.is_none());
        assert!(plain.same_argv(&[OsString::from("true")]));
    }

    #[test]
    fn every_key_is_written_even_when_null_and_keys_lists_them_in_order() {
        let text = sample().to_json();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut written: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut listed = KEYS.to_vec();
        written.sort_unstable();
        listed.sort_unstable();
        assert_eq!(written, listed, "the keys written are the keys listed");
        let at = |k: &str| {
            text.find(&format!("\n  \"{k}\": "))
                .expect("a top-level key")
        };
        for pair in KEYS.windows(2) {
            assert!(
                at(pair[0]) < at(pair[1]),
                "{pair:?} are written in KEYS' order"
            );
        }
    }

    #[test]
    fn a_number_that_is_no_pid_is_kept_as_written_and_refused_by_the_check() {
        let mut st = sample();
        st.state = State::Running;
        st.boot_id = crate::procfs::boot_id();
        st.uid = crate::sys::geteuid();
        st.pid = Some((-1).into());
        st.pgid = Some(0.into());
        st.sid = Some(42.into());
        st.start_ticks = Some(7);
        st.wrapper_pid = Some(0.into());
        st.wrapper_start_ticks = Some(1);
        let text = st.to_json();
        for key in [
            "\"pid\": -1,",
            "\"pgid\": 0,",
            "\"sid\": 42,",
            "\"wrapper_pid\": 0,",
        ] {
            assert!(text.contains(key), "{key} in {text}");
        }
        let back = parse_status(&text).unwrap();
        assert_eq!(back.to_json(), text, "read and written back byte for byte");
        assert_eq!((back.leader(), back.wrapper()), (None, None));
        let refused = |st: &Status| match crate::wrapper::check_record(st) {
            Err(Error::Identity { why }) => why,
            other => panic!("{other:?}"),
        };
        assert!(refused(&back).contains("wrapper_pid 0 cannot be a wrapper"));
        let mut st = back;
        st.wrapper_pid = Some(i32::MAX.into());
        assert!(refused(&st).contains("(pid -1, pgid 0, sid 42)"));
    }

    #[test]
    fn a_final_record_is_never_overwritten() {
        let (_d, rd) = crate::run_dir::temp();
        let mut st = sample();
        rd.write_status(&st).unwrap();
        st.state = State::Finished;
        st.exit_code = Some(0);
        rd.write_status(&st).unwrap();
        st.state = State::Cancelled;
        assert!(rd.write_status(&st).is_err());
        assert_eq!(rd.read_status().unwrap().state, State::Finished);
    }

    #[test]
    fn partial_documents_are_corrupt_not_guessed() {
        let (d, rd) = crate::run_dir::temp();
        assert!(matches!(rd.read_status(), Err(Error::Missing { .. })));
        let text = sample().to_json();
        std::fs::write(d.path().join("status.json"), &text[..text.len() / 2]).unwrap();
        assert!(matches!(rd.read_status(), Err(Error::Corrupt { .. })));
    }
}
