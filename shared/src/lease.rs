//! lease.json: `{"deadline_epoch", "lease_s", "issued_ns", "auth"}`, replaced atomically; and
//! the lease token that alone may write it.
//!
//! `start --lease` writes the first lease, `renew` pushes the deadline, the wrapper and the
//! watchdog read it. A lease is only a deadline: what happens when it passes is the stop
//! routine's business.
//!
//! Only the run's starter renews its lease. `start` hands out a [`LeaseToken`] (or takes the
//! caller's, from `AGENT_RUN_LEASE_TOKEN`); the run dir keeps only its SHA-256 (the record's
//! `lease_token_sha256`), the workload's environment never holds it, and the wrapper, which
//! keeps it in memory, is non-dumpable. Every lease is signed with it ([`Lease::sign`]: an
//! HMAC-SHA256 over the run id, the deadline, the length and when it was issued), and the
//! wrapper takes no lease it cannot verify ([`Lease::verify`]) or that is older than the last
//! one it took: a workload that writes a far deadline into lease.json, or runs `agent-run
//! renew` itself, renews nothing.

use crate::error::{Error, Result};
use crate::run_dir::{caps, files, RunDir};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The environment variable that carries a lease token: to `start` (the run's token, instead
/// of a generated one) and to `renew` (instead of `--token`).
pub const ENV_TOKEN: &str = "AGENT_RUN_LEASE_TOKEN";

/// A lease: the deadline (epoch seconds) and its length, and who signed it when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub deadline_epoch: f64,
    pub lease_s: f64,
    /// When the lease was issued, ns since the epoch: a renewal is taken only when newer than
    /// the last one taken (an old lease.json put back renews nothing). 0 when unsigned.
    #[serde(default)]
    pub issued_ns: u64,
    /// HMAC-SHA256 of the lease with the run's token, hex; null for a run without a token
    /// (a run of an earlier version).
    #[serde(default)]
    pub auth: Option<String>,
}

impl Lease {
    /// A lease of `len` from now, unsigned.
    pub fn from_now(len: Duration) -> Lease {
        let on_ms = |s: f64| millis(s) as f64 / 1000.0;
        Lease {
            deadline_epoch: on_ms(crate::time::epoch_now() + len.as_secs_f64()),
            lease_s: on_ms(len.as_secs_f64()),
            issued_ns: now_ns(),
            auth: None,
        }
    }

    /// Sign the lease for `run_id` with `token`.
    pub fn sign(mut self, run_id: &str, token: &LeaseToken) -> Lease {
        self.auth = Some(hex(&self.mac(run_id, token)));
        self
    }

    /// Whether the lease carries `token`'s signature for `run_id`.
    pub fn verify(&self, run_id: &str, token: &LeaseToken) -> bool {
        use hmac::Mac;
        let Some(auth) = self.auth.as_deref().and_then(unhex) else {
            return false;
        };
        let mut m = Hmac::new_from_slice(token.0.as_bytes()).expect("HMAC takes any key");
        m.update(&self.message(run_id));
        m.verify_slice(&auth).is_ok()
    }

    fn mac(&self, run_id: &str, token: &LeaseToken) -> Vec<u8> {
        use hmac::Mac;
        let mut m = Hmac::new_from_slice(token.0.as_bytes()).expect("HMAC takes any key");
        m.update(&self.message(run_id));
        m.finalize().into_bytes().to_vec()
    }

    /// What is signed: the run, the deadline and the length in whole milliseconds (a lease is
    /// made on a millisecond, [`Lease::from_now`], so a float read back a unit in the last
    /// place off still rounds to it), and when it was issued.
    fn message(&self, run_id: &str) -> Vec<u8> {
        format!(
            "agent-run lease 1\n{run_id}\n{}\n{}\n{}\n",
            millis(self.deadline_epoch),
            millis(self.lease_s),
            self.issued_ns
        )
        .into_bytes()
    }

    /// Seconds left (negative once expired).
    pub fn remaining_s(&self) -> f64 {
        self.deadline_epoch - crate::time::epoch_now()
    }
}

type Hmac = hmac::Hmac<sha2::Sha256>;

/// A run's lease token: 16 to 256 characters of `A-Z a-z 0-9 . _ - + / = ~`. Generated, it is
/// 32 random bytes in hex.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken(String);

impl std::fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseToken(..)")
    }
}

impl LeaseToken {
    /// A new random token.
    pub fn generate() -> Result<LeaseToken> {
        let mut buf = [0u8; 32];
        let mut filled = 0;
        while filled < buf.len() {
            match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty())
            {
                Ok(n) => filled += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(Error::io(
                        "read random bytes for",
                        "the lease token",
                        e.into(),
                    ))
                }
            }
        }
        Ok(LeaseToken(hex(&buf)))
    }

    /// A token given by the caller, checked.
    pub fn parse(s: &str) -> Result<LeaseToken> {
        let ok = (16..=256).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-+/=~".contains(&b));
        if !ok {
            return Err(Error::Invalid {
                what: "lease token",
                value: String::new(),
                why: "a lease token is 16 to 256 characters of A-Z a-z 0-9 . _ - + / = ~".into(),
            });
        }
        Ok(LeaseToken(s.to_string()))
    }

    /// The token from the environment (`AGENT_RUN_LEASE_TOKEN`), if set and not empty.
    pub fn from_env() -> Option<Result<LeaseToken>> {
        std::env::var(ENV_TOKEN)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| LeaseToken::parse(&v))
    }

    /// The token itself, to hand to the caller.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its SHA-256, hex: what the run dir keeps.
    pub fn sha256(&self) -> String {
        use sha2::Digest;
        hex(&sha2::Sha256::digest(self.0.as_bytes()))
    }
}

/// Seconds as whole milliseconds (a non-finite value as 0: it verifies nothing).
fn millis(secs: f64) -> i64 {
    if secs.is_finite() {
        (secs * 1000.0).round() as i64
    } else {
        0
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl RunDir {
    /// Write lease.json atomically. Not fsynced: after a crash the boot id, not the lease,
    /// decides.
    pub fn write_lease(&self, lease: &Lease) -> Result<()> {
        let mut s = serde_json::to_string(lease).expect("a lease serializes");
        s.push('\n');
        self.write_atomic(files::LEASE, s.as_bytes(), false)
    }

    /// Read lease.json: `Ok(None)` when the run has no lease, `Corrupt` when it is not a whole
    /// lease.
    pub fn read_lease(&self) -> Result<Option<Lease>> {
        let path = self.file(files::LEASE);
        let bytes = match self.read_run_file(files::LEASE, caps::LEASE) {
            Ok(b) => b,
            Err(Error::Missing { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let s = std::str::from_utf8(&bytes).map_err(|e| Error::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        let l: Lease = serde_json::from_str(s).map_err(|e| Error::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        if !l.deadline_epoch.is_finite() || !l.lease_s.is_finite() || l.lease_s < 0.0 {
            return Err(Error::Corrupt {
                path,
                why: "deadline or length out of range".into(),
            });
        }
        Ok(Some(l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_verifies_only_with_its_token_its_run_and_its_values() {
        let t = LeaseToken::generate().unwrap();
        assert_eq!(t.expose().len(), 64);
        let l = Lease::from_now(Duration::from_secs(60)).sign("r1", &t);
        assert!(l.verify("r1", &t));
        assert!(!l.verify("r2", &t), "another run");
        let other = LeaseToken::parse("0123456789abcdef").unwrap();
        assert!(!l.verify("r1", &other), "another token");
        let mut far = l.clone();
        far.deadline_epoch += 3600.0;
        assert!(!far.verify("r1", &t), "a changed deadline");
        // Through JSON and back (a float may come back a unit in the last place off).
        let back: Lease = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert!(back.verify("r1", &t));
        let mut unsigned = l.clone();
        unsigned.auth = None;
        assert!(!unsigned.verify("r1", &t));
        unsigned.auth = Some("zz".into());
        assert!(!unsigned.verify("r1", &t));
    }

    #[test]
    fn a_token_is_checked_and_only_its_hash_is_shown() {
        for bad in ["", "short", "has space in it!!", &"x".repeat(257)] {
            assert!(LeaseToken::parse(bad).is_err(), "{bad:?}");
        }
        let t = LeaseToken::parse("abcdefghijklmnop").unwrap();
        assert_eq!(format!("{t:?}"), "LeaseToken(..)");
        assert_eq!(
            t.sha256(),
            "f39dac6cbaba535e2c207cd0cd8f154974223c848f727f98b3564cea569b41cf"
        );
    }
}
