//! A look at a record through serde_json that keeps only what a sweep over many runs shows or
//! decides on (`list`, `status --all`, the watchdog's pass, retention), and allocates nothing
//! for the rest: no argv, cwd, host, output counts or resources.
//!
//! [`Peek`] lists every key of the record ([`crate::record::KEYS`]), so that the record's own
//! parse ([`crate::record::parse_status`]) and a peek refuse the same documents where it
//! matters: not UTF-8, not one whole JSON document, nested deeper than serde goes, a key
//! missing that the record requires, any key given twice (two `state` keys could otherwise be
//! read as two states), another schema. The keys a peek reads are typed as the record types
//! them; the others are checked as JSON only (a value of another type there is not looked
//! at). That gives a workload nothing: it can write a whole valid final record into its own
//! status.json, which the careful path takes as final too.
//!
//! Measured on the static musl build: `list --json` over 100,000 final runs reads and parses
//! them in about half the time the whole record's parse took, mostly for the allocations it
//! does not make (see docs/benchmarks.md).

use crate::pid::ClaimedPid;
use crate::record::{Containment, State, Status, SCHEMA};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Every key of the record; those with a public field are read.
#[derive(Deserialize)]
#[allow(dead_code)]
pub struct Peek {
    schema: u32,
    pub run_id: String,
    pub state: State,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub term_signal: Option<String>,
    argv: IgnoredAny,
    cwd: IgnoredAny,
    #[serde(default)]
    pub pid: Option<ClaimedPid>,
    #[serde(default)]
    pgid: Option<IgnoredAny>,
    #[serde(default)]
    sid: Option<IgnoredAny>,
    #[serde(default)]
    start_ticks: Option<IgnoredAny>,
    boot_id: IgnoredAny,
    pub wrapper_pid: Option<ClaimedPid>,
    #[serde(default)]
    wrapper_start_ticks: Option<IgnoredAny>,
    host: IgnoredAny,
    user: IgnoredAny,
    uid: IgnoredAny,
    pub created_at: String,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub ended_at: Option<String>,
    #[serde(default)]
    cleanup: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    version: IgnoredAny,
    #[serde(default)]
    grace_ms: Option<IgnoredAny>,
    #[serde(default)]
    hup_after_ms: Option<IgnoredAny>,
    #[serde(default)]
    warnings: Option<IgnoredAny>,
    #[serde(default)]
    argv_b64: Option<IgnoredAny>,
    #[serde(default)]
    timeout_ms: Option<IgnoredAny>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    env: Option<IgnoredAny>,
    #[serde(default)]
    caller_lost_at: Option<IgnoredAny>,
    #[serde(default)]
    on_disconnect: Option<IgnoredAny>,
    #[serde(default)]
    pub launch_exit_code: Option<i32>,
    #[serde(default)]
    pub containment: Option<Containment>,
    #[serde(default)]
    resources: Option<IgnoredAny>,
    #[serde(default)]
    pty: Option<IgnoredAny>,
    #[serde(default)]
    output: Option<IgnoredAny>,
    #[serde(default)]
    proof: Option<IgnoredAny>,
    #[serde(default)]
    lease_token_sha256: Option<IgnoredAny>,
}

impl Peek {
    /// Peek at a record's bytes: `None` for what the record's parse refuses (above).
    pub fn of(bytes: &[u8]) -> Option<Peek> {
        let p: Peek = serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()?;
        (p.schema == SCHEMA).then_some(p)
    }

    /// The same fields of a whole record (which the careful path read).
    pub fn of_status(st: Status) -> Peek {
        let i = IgnoredAny;
        Peek {
            schema: st.schema,
            run_id: st.run_id,
            state: st.state,
            reason: st.reason,
            exit_code: st.exit_code,
            term_signal: st.term_signal,
            argv: i,
            cwd: i,
            pid: st.pid,
            pgid: None,
            sid: None,
            start_ticks: None,
            boot_id: i,
            wrapper_pid: st.wrapper_pid,
            wrapper_start_ticks: None,
            host: i,
            user: i,
            uid: i,
            created_at: st.created_at,
            started_at: st.started_at,
            ended_at: st.ended_at,
            cleanup: None,
            error: None,
            version: i,
            grace_ms: None,
            hup_after_ms: None,
            warnings: None,
            argv_b64: None,
            timeout_ms: None,
            labels: st.labels,
            env: None,
            caller_lost_at: None,
            on_disconnect: None,
            launch_exit_code: st.launch_exit_code,
            containment: st.containment,
            resources: None,
            pty: None,
            output: None,
            proof: None,
            lease_token_sha256: None,
        }
    }

    /// The exit code `agent-run wait` gives for the record ([`crate::exit::for_outcome`]).
    pub fn exit_code_for_wait(&self) -> Option<u8> {
        crate::exit::for_outcome(
            self.state,
            self.term_signal.as_deref(),
            self.exit_code,
            self.reason.as_deref(),
            self.launch_exit_code,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{parse_status, Containment as Held, ContainmentMode, Status, KEYS};

    fn record(state: State) -> Status {
        let mut st = Status::blank("r1");
        st.state = state;
        st
    }

    #[test]
    fn a_peek_reads_what_the_records_parse_reads() {
        for state in State::ALL {
            let mut st = record(state);
            st.wrapper_pid = Some(4321.into());
            st.containment = Some(Held::cgroup(std::path::Path::new(
                "/sys/fs/cgroup/x/agent-run.r1.1f",
            )));
            st.argv = vec!["a \"quoted\" \\ arg\n".into(), "é".into()];
            for text in [st.to_json(), serde_json::to_string(&st).unwrap()] {
                let p = Peek::of(text.as_bytes()).unwrap_or_else(|| panic!("{text}"));
                assert_eq!((p.state, p.wrapper_pid), (state, Some(4321.into())));
                let c = p.containment.unwrap();
                assert_eq!(c.mode, ContainmentMode::Cgroup);
                assert_eq!(
                    c.cgroup.as_deref(),
                    Some("/sys/fs/cgroup/x/agent-run.r1.1f")
                );
            }
        }
        // An escaped state is the same state to both.
        let good = record(State::Finished).to_json();
        let escaped = good.replacen("\"finished\"", "\"fin\\u0069shed\"", 1);
        assert_eq!(parse_status(&escaped).unwrap().state, State::Finished);
        assert_eq!(Peek::of(escaped.as_bytes()).unwrap().state, State::Finished);
    }

    /// Every key of the record is one the peek knows: given twice, it is refused, as the
    /// record's parse refuses it; and each key the record requires is required.
    #[test]
    fn every_key_of_the_record_is_the_peeks_and_none_may_come_twice() {
        let good = record(State::Finished).to_json();
        let v: serde_json::Value = serde_json::from_str(&good).unwrap();
        for key in KEYS {
            let twice = good.replacen('{', &format!("{{\"{key}\": {},", v[*key]), 1);
            assert!(parse_status(&twice).is_err(), "{key}");
            assert!(
                Peek::of(twice.as_bytes()).is_none(),
                "{key} twice is peeked"
            );
            let mut m = v.as_object().unwrap().clone();
            m.remove(*key);
            let without = serde_json::Value::Object(m).to_string();
            assert_eq!(
                Peek::of(without.as_bytes()).is_some(),
                parse_status(&without).is_ok(),
                "{key} missing"
            );
        }
    }

    /// The fields a peek reads are the record's, whether peeked from its bytes or taken from
    /// the whole record; and the exit code they give is the record's.
    #[test]
    fn a_peeks_fields_are_the_records_from_its_bytes_or_from_the_record() {
        let mut st = record(State::Cancelled);
        st.reason = Some("lease_expired".into());
        st.exit_code = Some(3);
        st.term_signal = Some("TERM".into());
        st.pid = Some(77.into());
        st.started_at = Some("2026-12-06T10:00:00.000Z".into());
        st.ended_at = Some("2026-12-06T10:00:01.000Z".into());
        st.labels.insert("team".into(), "a \"b\"".into());
        st.launch_exit_code = Some(127);
        let fields = |p: &Peek| {
            (
                (p.run_id.clone(), p.state, p.reason.clone(), p.exit_code),
                (
                    p.term_signal.clone(),
                    p.pid,
                    p.wrapper_pid,
                    p.created_at.clone(),
                ),
                (p.started_at.clone(), p.ended_at.clone(), p.labels.clone()),
                (
                    p.launch_exit_code,
                    p.containment.clone(),
                    p.exit_code_for_wait(),
                ),
            )
        };
        let peeked = fields(&Peek::of(st.to_json().as_bytes()).unwrap());
        let taken = fields(&Peek::of_status(st.clone()));
        assert_eq!(peeked, taken);
        assert_eq!(
            peeked.0,
            (st.run_id.clone(), st.state, st.reason.clone(), Some(3))
        );
        assert_eq!(peeked.2 .2, st.labels);
        assert_eq!(peeked.3 .2, crate::exit::for_record(&st));
        assert_eq!(peeked.3 .2, Some(crate::exit::LEASE_EXPIRED));
    }
}
