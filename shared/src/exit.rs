//! The exit-code table of the contract, in one place. `agent-run start`, `wait`, `attach` and a
//! relaunch all map a final record to a code through [`for_record`], so they always agree.

use crate::record::{State, Status};
use crate::stop::Sig;

/// Success, or the workload's own exit status 0..=125.
pub const OK: u8 = 0;
/// The lease expired and the run was stopped.
pub const LEASE_EXPIRED: u8 = 124;
/// The run's `--timeout` expired and the run was stopped (the record's `reason` tells it from
/// an expired lease).
pub const TIMEOUT: u8 = 124;
/// The command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// Bad usage or a bad run id.
pub const USAGE: u8 = 64;
/// The run id exists with a different command.
pub const DATA_MISMATCH: u8 = 65;
/// No such run.
pub const NO_SUCH_RUN: u8 = 69;
/// Launch failed for another reason (for instance PGID != PID).
pub const SOFTWARE: u8 = 70;
/// A wait ran out before the run was final, or the outcome is unknown.
pub const TEMPFAIL: u8 = 75;
/// The run's record failed validation: refused to signal.
pub const NOPERM: u8 = 77;
/// Unsafe run root or run dir.
pub const CONFIG: u8 = 78;
/// `agent-run remote`: agent-run could not be run on the host (the remote shell found no such
/// program, or could not execute it), or it is too old for what the launch asks (`version`
/// says which features it lacks); nothing was started there.
pub const REMOTE_BIN_MISSING: u8 = 72;

/// 128 + N for a signal.
pub fn for_signal(sig: Sig) -> u8 {
    128u8.saturating_add(sig.number() as u8)
}

/// The exit code a final record stands for. `None` for a record that is not final.
pub fn for_record(st: &Status) -> Option<u8> {
    Some(match st.state {
        State::Finished => match (&st.term_signal, st.exit_code) {
            (Some(name), _) => Sig::from_name(name).map(for_signal).unwrap_or(SOFTWARE),
            (None, Some(code)) => code.clamp(0, 255) as u8,
            (None, None) => TEMPFAIL,
        },
        State::Cancelled => match st.reason.as_deref() {
            Some("lease_expired") => LEASE_EXPIRED,
            Some("timeout") => TIMEOUT,
            // The caller's channel hung up: what a hangup with a pty gives (signal:HUP).
            Some("caller_lost") => for_signal(Sig::Hup),
            Some(r) if r.starts_with("signal:") => Sig::from_name(&r["signal:".len()..])
                .map(for_signal)
                .unwrap_or(143),
            _ => for_signal(Sig::Term),
        },
        // `launch_exit_code`; records written before it existed kept the code in `exit_code`.
        State::LaunchFailed => match st.launch_exit_code.or(st.exit_code) {
            Some(c) if c == NOT_FOUND as i32 || c == CANNOT_EXECUTE as i32 => c as u8,
            _ => SOFTWARE,
        },
        State::Unknown => TEMPFAIL,
        State::Starting | State::Running | State::Cancelling => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cancelled(reason: &str) -> Status {
        let mut st = Status::blank("x");
        st.state = State::Cancelled;
        st.reason = Some(reason.into());
        st
    }

    #[test]
    fn stop_reasons_map_to_their_codes() {
        for (reason, code) in [
            ("lease_expired", 124),
            ("timeout", 124),
            ("caller_lost", 129),
            ("signal:INT", 130),
            ("signal:TERM", 143),
            ("cancel_request", 143),
            ("wrapper_lost", 143),
        ] {
            assert_eq!(for_record(&cancelled(reason)), Some(code), "{reason}");
        }
    }
}
