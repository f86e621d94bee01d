//! lease.json: `{"deadline_epoch": SECONDS_FLOAT, "lease_s": SECONDS_FLOAT}`, replaced atomically.
//!
//! `start --lease` writes it, `renew` pushes the deadline, the wrapper and the watchdog read it.
//! A lease is only a deadline: what happens when it passes is the stop routine's business.

use crate::error::{Error, Result};
use crate::run_dir::{caps, files, RunDir};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A lease: the deadline (epoch seconds) and its length.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub deadline_epoch: f64,
    pub lease_s: f64,
}

impl Lease {
    /// A lease of `len` from now.
    pub fn from_now(len: Duration) -> Lease {
        Lease {
            deadline_epoch: crate::time::epoch_now() + len.as_secs_f64(),
            lease_s: len.as_secs_f64(),
        }
    }

    /// Seconds left (negative once expired).
    pub fn remaining_s(&self) -> f64 {
        self.deadline_epoch - crate::time::epoch_now()
    }
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
