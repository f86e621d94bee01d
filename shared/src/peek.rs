//! A look at a record through serde_json, borrowed from its bytes: what a sweep over many runs
//! shows or decides on (`list`, the watchdog's pass, retention), and nothing it would have to
//! allocate. A field it reads that holds a JSON escape cannot be borrowed: the peek is refused,
//! and the caller's careful path reads the whole record (a run id, a time, a reason never
//! holds one; a label value or a cgroup path may).
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
//! On the static musl build, `list --json` over 100,000 final runs reads and parses them in
//! about half the time the whole record's parse took, mostly for the allocations it does not
//! make: musl's allocator has one lock for every thread.

use crate::pid::ClaimedPid;
use crate::record::{ContainmentMode, State, Status, SCHEMA};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Every key of the record; those with a public field are read.
#[derive(Deserialize)]
#[allow(dead_code)]
pub struct Peek<'a> {
    schema: u32,
    pub run_id: &'a str,
    pub state: State,
    #[serde(borrow, default)]
    pub reason: Option<&'a str>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(borrow, default)]
    pub term_signal: Option<&'a str>,
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
    pub created_at: &'a str,
    #[serde(borrow, default)]
    pub started_at: Option<&'a str>,
    #[serde(borrow, default)]
    pub ended_at: Option<&'a str>,
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
    #[serde(borrow, default)]
    pub labels: BTreeMap<&'a str, &'a str>,
    #[serde(default)]
    env: Option<IgnoredAny>,
    #[serde(default)]
    caller_lost_at: Option<IgnoredAny>,
    #[serde(default)]
    on_disconnect: Option<IgnoredAny>,
    #[serde(default)]
    pub launch_exit_code: Option<i32>,
    #[serde(borrow, default)]
    pub containment: Option<Containment<'a>>,
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

/// The `containment` key, borrowed.
#[derive(Deserialize)]
pub struct Containment<'a> {
    pub mode: ContainmentMode,
    #[serde(borrow)]
    pub cgroup: Option<&'a str>,
}

impl<'a> Peek<'a> {
    /// Peek at a record's bytes: `None` for what the record's parse refuses, and for an escape
    /// in a field it reads (above).
    pub fn of(bytes: &'a [u8]) -> Option<Peek<'a>> {
        let p: Peek = serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()?;
        (p.schema == SCHEMA).then_some(p)
    }

    /// The same fields of a whole record (which the careful path read).
    pub fn of_status(st: &'a Status) -> Peek<'a> {
        let i = IgnoredAny;
        Peek {
            schema: st.schema,
            run_id: &st.run_id,
            state: st.state,
            reason: st.reason.as_deref(),
            exit_code: st.exit_code,
            term_signal: st.term_signal.as_deref(),
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
            created_at: &st.created_at,
            started_at: st.started_at.as_deref(),
            ended_at: st.ended_at.as_deref(),
            cleanup: None,
            error: None,
            version: i,
            grace_ms: None,
            hup_after_ms: None,
            warnings: None,
            argv_b64: None,
            timeout_ms: None,
            labels: st.labels.iter().map(|(k, v)| (&**k, &**v)).collect(),
            env: None,
            caller_lost_at: None,
            on_disconnect: None,
            launch_exit_code: st.launch_exit_code,
            containment: st.containment.as_ref().map(|c| Containment {
                mode: c.mode,
                cgroup: c.cgroup.as_deref(),
            }),
            resources: None,
            pty: None,
            output: None,
            proof: None,
            lease_token_sha256: None,
        }
    }

    /// The exit code the record stands for, as `agent-run wait` gives it
    /// ([`crate::exit::for_outcome`]).
    pub fn outcome(&self) -> Option<u8> {
        crate::exit::for_outcome(
            self.state,
            self.term_signal,
            self.exit_code,
            self.reason,
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
                assert_eq!(c.cgroup, Some("/sys/fs/cgroup/x/agent-run.r1.1f"));
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
    /// the whole record; and the exit code they give is the record's. A field it reads that
    /// holds an escape is refused (the careful path reads that record).
    #[test]
    fn a_peeks_fields_are_the_records_from_its_bytes_or_from_the_record() {
        let mut st = record(State::Cancelled);
        st.reason = Some("lease_expired".into());
        st.exit_code = Some(3);
        st.term_signal = Some("TERM".into());
        st.pid = Some(77.into());
        st.started_at = Some("2026-12-06T10:00:00.000Z".into());
        st.ended_at = Some("2026-12-06T10:00:01.000Z".into());
        st.labels.insert("team".into(), "é b".into());
        st.launch_exit_code = Some(127);
        st.containment = Some(Held::cgroup(std::path::Path::new("/x/agent-run.r1.1f")));
        let fields = |p: &Peek| {
            let c = p
                .containment
                .as_ref()
                .map(|c| (c.mode, c.cgroup.map(str::to_owned)));
            (
                (
                    p.run_id.to_owned(),
                    p.state,
                    p.reason.map(str::to_owned),
                    p.exit_code,
                ),
                (p.term_signal.map(str::to_owned), p.pid, p.wrapper_pid),
                (p.created_at.to_owned(), p.started_at.map(str::to_owned)),
                (
                    p.ended_at.map(str::to_owned),
                    p.labels
                        .clone()
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect::<Vec<_>>(),
                ),
                (p.launch_exit_code, c, p.outcome()),
            )
        };
        let text = st.to_json();
        let peeked = fields(&Peek::of(text.as_bytes()).unwrap());
        assert_eq!(peeked, fields(&Peek::of_status(&st)));
        assert_eq!(
            peeked.0,
            (st.run_id.clone(), st.state, st.reason.clone(), Some(3))
        );
        assert_eq!(peeked.3 .1, vec![("team".to_owned(), "é b".to_owned())]);
        assert_eq!(peeked.4 .2, crate::exit::for_record(&st));
        assert_eq!(peeked.4 .2, Some(crate::exit::LEASE_EXPIRED));

        st.labels.insert("quoted".into(), "a \"b\"".into());
        let escaped = st.to_json();
        assert!(parse_status(&escaped).is_ok());
        assert!(
            Peek::of(escaped.as_bytes()).is_none(),
            "an escape in a label"
        );
    }
}
