//! A look at a record through serde_json with borrowed fields: what a pass decides on (the
//! state, the wrapper, the cgroup), and nothing it would have to copy.
//!
//! [`Peek`] lists every key of the record ([`agent_run_shared::record::KEYS`]), so that the
//! record's own parse ([`agent_run_shared::record::parse_status`]) and a peek refuse the same
//! documents where it matters: not UTF-8, not one whole JSON document, nested deeper than
//! serde goes, a key missing that the record requires, any key given twice (two `state`
//! keys could otherwise be read as two states), another schema. The keys the pass reads are
//! typed as the record types them; the others are checked as JSON only (a value of another
//! type there is not looked at). That gives a workload nothing: it can write a whole valid
//! final record into its own status.json, which the careful path takes as final too. A peek
//! costs two thirds of the record's parse (1.4 against 2.2 µs a record here).

use agent_run_shared::pid::ClaimedPid;
use agent_run_shared::record::{ContainmentMode, State, SCHEMA};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::borrow::Cow;

/// Every key of the record; `state`, `wrapper_pid` and `containment` are read.
#[derive(Deserialize)]
#[allow(dead_code)]
pub struct Peek<'a> {
    schema: u32,
    run_id: IgnoredAny,
    pub state: State,
    #[serde(default)]
    reason: Option<IgnoredAny>,
    #[serde(default)]
    exit_code: Option<IgnoredAny>,
    #[serde(default)]
    term_signal: Option<IgnoredAny>,
    argv: IgnoredAny,
    cwd: IgnoredAny,
    #[serde(default)]
    pid: Option<IgnoredAny>,
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
    created_at: IgnoredAny,
    #[serde(default)]
    started_at: Option<IgnoredAny>,
    #[serde(default)]
    ended_at: Option<IgnoredAny>,
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
    labels: Option<IgnoredAny>,
    #[serde(default)]
    env: Option<IgnoredAny>,
    #[serde(default)]
    caller_lost_at: Option<IgnoredAny>,
    #[serde(default)]
    on_disconnect: Option<IgnoredAny>,
    #[serde(default)]
    launch_exit_code: Option<IgnoredAny>,
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
    pub cgroup: Option<Cow<'a, str>>,
}

impl<'a> Peek<'a> {
    /// Peek at a record's bytes: `None` for what the record's parse refuses (above).
    pub fn of(bytes: &'a [u8]) -> Option<Peek<'a>> {
        let p: Peek = serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()?;
        (p.schema == SCHEMA).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_run_shared::record::{parse_status, Containment as Held, Status, KEYS};

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
}
