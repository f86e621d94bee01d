//! Run ids: 1 to 128 characters of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
//!
//! A [`RunId`] can only be built through [`RunId::parse`], so a value of this type is always safe
//! to use as one path component under the run root (no `/`, no `..`, no hidden names).

use crate::error::{Error, Result};
use std::fmt;

/// The longest run id the contract allows.
pub const MAX_LEN: usize = 128;

/// A validated run id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

impl RunId {
    /// Validate a run id. The error names the id and the rule it breaks.
    pub fn parse(id: &str) -> Result<RunId> {
        match why_invalid(id) {
            Some(why) => Err(Error::InvalidRunId {
                id: id.to_string(),
                why,
            }),
            None => Ok(RunId(id.to_string())),
        }
    }

    /// Whether `id` is a valid run id, without making one (a pass over 100,000 names).
    pub fn is_valid(id: &str) -> bool {
        why_invalid(id).is_none()
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The rule `id` breaks, if any.
fn why_invalid(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        return Some("it is empty");
    }
    if id.len() > MAX_LEN {
        return Some("it is longer than 128 characters");
    }
    if id.starts_with('.') || id.starts_with('-') {
        return Some("it must not start with '.' or '-'");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Some("only A-Z, a-z, 0-9, '.', '_' and '-' are allowed");
    }
    None
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_contract_alphabet() {
        for ok in ["a", "A-1", "build_7.2", "x-", "0", &"a".repeat(128)] {
            assert!(RunId::parse(ok).is_ok(), "{ok}");
            assert!(RunId::is_valid(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        let long = "a".repeat(129);
        for bad in [
            "", ".", "..", "../x", "a/b", "-x", ".hidden", &long, "é", "a b", "a\nb", "a\0b",
        ] {
            assert!(RunId::parse(bad).is_err(), "{bad:?}");
            assert!(!RunId::is_valid(bad), "{bad:?}");
        }
    }
}
