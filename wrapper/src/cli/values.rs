//! The values of the command line's options, as clap reads them: durations with their
//! bounds, `-e` pairs as bytes, labels, sizes, policies and states. Each refuses a bad value
//! with the message the user sees (exit 64).

use agent_run_shared::spec::{self, LabelMatch, OnDisconnect};
use agent_run_shared::time::parse_duration;
use std::ffi::OsString;
use std::time::Duration;

/// A `--max-output` value: bytes per stream, `None` for no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxOutput(pub Option<u64>);

pub(super) fn size_arg(s: &str) -> Result<MaxOutput, String> {
    agent_run_shared::output::parse_size(s).map(MaxOutput)
}

pub(super) fn dur(what: &'static str) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s| parse_duration(what, s).map_err(|e| e.to_string())
}

/// `--grace`: at most [`agent_run_shared::stop::MAX_GRACE`], the most `cancel` and the watchdog
/// honour from a record (which the run can rewrite).
pub(super) fn grace_dur(s: &str) -> Result<Duration, String> {
    let max = agent_run_shared::stop::MAX_GRACE;
    match parse_duration("--grace", s) {
        Ok(d) if d > max => Err(format!(
            "invalid --grace {s:?}: at most {}s (what cancel and the watchdog honour)",
            max.as_secs()
        )),
        r => r.map_err(|e| e.to_string()),
    }
}

/// A duration that must be more than zero (a zero timeout or lease would stop the run at once).
pub(super) fn positive_dur(
    what: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s| match parse_duration(what, s) {
        Ok(d) if d.is_zero() => Err(format!("invalid {what} {s:?}: must be more than 0")),
        r => r.map_err(|e| e.to_string()),
    }
}

/// `-e NAME=VALUE`, read as bytes (a value need not be UTF-8).
#[derive(Clone)]
pub(super) struct EnvPair;

impl clap::builder::TypedValueParser for EnvPair {
    type Value = (OsString, OsString);

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        spec::parse_env(value).map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
        })
    }
}

pub(super) fn pty_size(s: &str) -> Result<agent_run_shared::pty::Size, String> {
    agent_run_shared::pty::Size::parse(s).ok_or_else(|| {
        format!("invalid --pty-size {s:?}: expected COLSxROWS, e.g. 120x40, both 1-65535")
    })
}

pub(super) fn label_pair(s: &str) -> Result<(String, String), String> {
    spec::parse_label(s).map_err(|e| e.to_string())
}

pub(super) fn label_match(s: &str) -> Result<LabelMatch, String> {
    LabelMatch::parse(s).map_err(|e| e.to_string())
}

pub(super) fn policy(s: &str) -> Result<OnDisconnect, String> {
    OnDisconnect::parse(s).map_err(|e| e.to_string())
}

/// A word `list --state` takes: a state of the record, `active` (not final) or `final`.
pub(super) fn state_filter(s: &str) -> Result<String, String> {
    use agent_run_shared::record::State;
    if State::filter_words().any(|w| w == s) {
        Ok(s.to_string())
    } else {
        let words: Vec<&str> = State::filter_words().collect();
        Err(format!(
            "invalid --state {s:?}: expected one of {}",
            words.join(", ")
        ))
    }
}

/// A lease length: a duration above zero (a lease of 0 would stop the run at once; a run
/// without a lease is asked for by leaving --lease out).
pub(super) fn lease_dur(s: &str) -> Result<Duration, String> {
    match parse_duration("--lease", s).map_err(|e| e.to_string())? {
        d if d.is_zero() => Err(format!(
            "a lease must be longer than 0 ({s:?} would stop the run at once); \
             leave --lease out for a run without a lease"
        )),
        d => Ok(d),
    }
}
