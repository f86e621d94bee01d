//! What a launch asks for besides its command, as the command line spells it: labels
//! (`--label K=V`), environment variables (`-e K=V`), the `--on-disconnect` policy, and the label
//! selectors of `list`, `status`, `cancel`, `renew` and `wait` (`--label K=V` or `--label K`).
//! Parsing and validation only; every error names the option and says what is allowed.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::Duration;

/// The longest label key, in bytes.
pub const LABEL_KEY_MAX: usize = 128;
/// The longest label value, in bytes.
pub const LABEL_VALUE_MAX: usize = 1024;

fn invalid(what: &'static str, value: &str, why: impl Into<String>) -> Error {
    Error::Invalid {
        what,
        value: value.to_string(),
        why: why.into(),
    }
}

fn check_label_key(what: &'static str, given: &str, key: &str) -> Result<()> {
    if key.is_empty() || key.len() > LABEL_KEY_MAX {
        return Err(invalid(
            what,
            given,
            format!("the key must be 1 to {LABEL_KEY_MAX} characters"),
        ));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
    {
        return Err(invalid(
            what,
            given,
            "the key may hold only A-Z a-z 0-9 . _ - /",
        ));
    }
    Ok(())
}

/// `--label K=V`: a key of `A-Z a-z 0-9 . _ - /` (1 to 128 characters) and a value of up to
/// 1024 bytes without control characters (it may be empty and may hold `=`).
pub fn parse_label(s: &str) -> Result<(String, String)> {
    let Some((key, value)) = s.split_once('=') else {
        return Err(invalid("--label", s, "expected KEY=VALUE"));
    };
    check_label_key("--label", s, key)?;
    if value.len() > LABEL_VALUE_MAX {
        return Err(invalid(
            "--label",
            s,
            format!("the value must be at most {LABEL_VALUE_MAX} bytes"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(
            "--label",
            s,
            "the value must not hold control characters",
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

/// The labels of a launch as a map; a key given twice is refused.
pub fn labels_map(pairs: &[(String, String)]) -> Result<BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    for (k, v) in pairs {
        if m.insert(k.clone(), v.clone()).is_some() {
            return Err(invalid(
                "--label",
                &format!("{k}={v}"),
                format!("label {k} is given twice"),
            ));
        }
    }
    Ok(m)
}

/// One label condition of a selector: the key with that value, or the key with any value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelMatch {
    pub key: String,
    pub value: Option<String>,
}

impl LabelMatch {
    /// `K=V` (that value) or `K` (any value).
    pub fn parse(s: &str) -> Result<LabelMatch> {
        match s.split_once('=') {
            Some(_) => {
                let (key, value) = parse_label(s)?;
                Ok(LabelMatch {
                    key,
                    value: Some(value),
                })
            }
            None => {
                check_label_key("--label", s, s)?;
                Ok(LabelMatch {
                    key: s.to_string(),
                    value: None,
                })
            }
        }
    }

    /// Whether a run with these labels matches.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match (labels.get(&self.key), &self.value) {
            (Some(have), Some(want)) => have == want,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// Whether `labels` match every condition (an empty selector matches everything).
pub fn matches_all(selector: &[LabelMatch], labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|m| m.matches(labels))
}

/// Variables the workload's environment gets from agent-run itself: `-e` may not set them
/// (they are how the run's processes are found again).
pub const RESERVED_ENV: &[&str] = &[crate::ENV_RUN_ID, crate::ENV_RUN_DIR];

/// `-e K=V`: a name that is not empty and holds no `=`, and any value (bytes, as given).
pub fn parse_env(s: &OsStr) -> Result<(OsString, OsString)> {
    let b = s.as_bytes();
    let shown = s.to_string_lossy();
    let Some(eq) = b.iter().position(|&c| c == b'=') else {
        return Err(invalid("-e/--env", &shown, "expected NAME=VALUE"));
    };
    let (name, value) = (&b[..eq], &b[eq + 1..]);
    if name.is_empty() {
        return Err(invalid("-e/--env", &shown, "the name is empty"));
    }
    if RESERVED_ENV.iter().any(|r| r.as_bytes() == name) {
        return Err(invalid(
            "-e/--env",
            &shown,
            "agent-run sets this variable itself (it is how the run's processes are found)",
        ));
    }
    Ok((
        OsString::from_vec(name.to_vec()),
        OsString::from_vec(value.to_vec()),
    ))
}

/// What a foreground wrapper does when its caller goes away (`--on-disconnect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDisconnect {
    /// Run on, under the lease if there is one.
    Keep,
    /// Stop the run at once (reason `caller_lost`).
    Cancel,
    /// Stop it unless someone attaches or renews within the duration.
    Grace(Duration),
}

impl OnDisconnect {
    /// `keep`, `cancel`, or a duration (`30s`, `5m`, ...).
    pub fn parse(s: &str) -> Result<OnDisconnect> {
        match s {
            "keep" => Ok(OnDisconnect::Keep),
            "cancel" => Ok(OnDisconnect::Cancel),
            _ => match crate::time::parse_duration("--on-disconnect", s) {
                Ok(d) if d.is_zero() => Ok(OnDisconnect::Cancel),
                Ok(d) => Ok(OnDisconnect::Grace(d)),
                Err(_) => Err(invalid(
                    "--on-disconnect",
                    s,
                    "expected keep, cancel, or a duration to wait for an attach or a renew \
                     (e.g. 30s, 5m)",
                )),
            },
        }
    }

    /// The default: `keep` for a run with a lease (the lease is the dead man's switch its
    /// controller asked for), `cancel` without one (nobody could ever come back for it).
    pub fn default_for(leased: bool) -> OnDisconnect {
        if leased {
            OnDisconnect::Keep
        } else {
            OnDisconnect::Cancel
        }
    }

    /// The record's spelling: `keep`, `cancel`, or the duration as `parse` reads it.
    pub fn as_record(&self) -> String {
        match self {
            OnDisconnect::Keep => "keep".into(),
            OnDisconnect::Cancel => "cancel".into(),
            OnDisconnect::Grace(d) => crate::time::duration_arg(*d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_refuse_what_they_should() {
        assert_eq!(parse_label("job=42").unwrap(), ("job".into(), "42".into()));
        assert_eq!(parse_label("a/b.c=x=y").unwrap().1, "x=y");
        assert_eq!(parse_label("k=").unwrap().1, "");
        for bad in [
            "nokey",
            "=v",
            "sp ace=v",
            "k=a\nb",
            &format!("{}=v", "k".repeat(129)),
        ] {
            assert!(parse_label(bad).is_err(), "{bad:?}");
        }
        assert!(labels_map(&[("a".into(), "1".into()), ("a".into(), "2".into())]).is_err());
    }

    #[test]
    fn selectors_match_by_value_or_by_key() {
        let labels: BTreeMap<String, String> = [("job".to_string(), "42".to_string())].into();
        assert!(LabelMatch::parse("job=42").unwrap().matches(&labels));
        assert!(LabelMatch::parse("job").unwrap().matches(&labels));
        assert!(!LabelMatch::parse("job=4").unwrap().matches(&labels));
        assert!(!LabelMatch::parse("team").unwrap().matches(&labels));
        assert!(matches_all(&[], &labels));
    }

    #[test]
    fn env_pairs_split_at_the_first_equals_and_keep_our_variables() {
        let (k, v) = parse_env(OsStr::new("A=b=c")).unwrap();
        assert_eq!((k.to_str(), v.to_str()), (Some("A"), Some("b=c")));
        assert!(parse_env(OsStr::new("=x")).is_err());
        assert!(parse_env(OsStr::new("NOVALUE")).is_err());
        assert!(parse_env(OsStr::new("AGENT_RUN_ID=x")).is_err());
    }

    #[test]
    fn policies_parse_and_print_back() {
        assert_eq!(OnDisconnect::parse("keep").unwrap(), OnDisconnect::Keep);
        assert_eq!(OnDisconnect::parse("cancel").unwrap(), OnDisconnect::Cancel);
        let g = OnDisconnect::parse("90s").unwrap();
        assert_eq!(g, OnDisconnect::Grace(Duration::from_secs(90)));
        assert_eq!(OnDisconnect::parse(&g.as_record()).unwrap(), g);
        assert_eq!(OnDisconnect::parse("1500ms").unwrap().as_record(), "1500ms");
        assert!(OnDisconnect::parse("sometimes").is_err());
    }
}
