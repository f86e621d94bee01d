//! The exit-code table of the contract, in one place. `agent-run start`, `wait`, `attach` and a
//! relaunch all map a final record to a code through [`for_record`], so they always agree.

use crate::reason::Reason;
use crate::record::{State, Status};
use crate::signal::Sig;

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

/// 128 + N: killed by signal N, or cancelled by signal N to the wrapper.
pub const SIGNAL_BASE: u8 = 128;
/// A run stopped because its caller went away (`caller_lost`): what a hangup gives, 128 + HUP.
pub const CALLER_LOST: u8 = SIGNAL_BASE + libc::SIGHUP as u8;

/// One row of the exit-code table: the code (or range), the constant that names it here, and
/// what it means (the contract's words; Markdown backticks are dropped in `--help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub code: &'static str,
    pub name: &'static str,
    pub meaning: &'static str,
    /// Only `agent-run remote` exits with it (its own `--help` explains it).
    pub remote_only: bool,
}

const fn row(code: &'static str, name: &'static str, meaning: &'static str) -> Row {
    Row {
        code,
        name,
        meaning,
        remote_only: false,
    }
}

/// THE exit-code table of `agent-run start`, `wait`, `attach` and a relaunch, in the contract's
/// order. The wrapper's `--help` shows it; packaging/gen writes it into docs/contract.md and the
/// man pages (`cargo run -p agent-run-gen`).
pub const TABLE: &[Row] = &[
    row("0-125", "OK", "the workload's own exit status"),
    row("128+N", "SIGNAL_BASE", "the workload was killed by signal N, or the run was cancelled by signal N sent to the wrapper (TERM 143, INT 130, HUP 129), or by `cancel` (143)"),
    row("124", "LEASE_EXPIRED, TIMEOUT", "the lease or the `--timeout` expired and the run was stopped (the record's `reason` says which)"),
    row("129", "CALLER_LOST", "as 128+1: also a run stopped because its caller went away (`caller_lost`)"),
    row("126", "CANNOT_EXECUTE", "the command was found but could not be executed"),
    row("127", "NOT_FOUND", "the command was not found"),
    row("64", "USAGE", "bad usage or a bad run id"),
    row("65", "DATA_MISMATCH", "the run id exists with a different command"),
    row("69", "NO_SUCH_RUN", "no such run (for the other subcommands)"),
    row("70", "SOFTWARE", "launch failed for another reason (for instance PGID != PID); for `cancel`: the run was stopped but its final record could not be written"),
    Row {
        remote_only: true,
        ..row("72", "REMOTE_BIN_MISSING", "`remote` only: agent-run could not be run on the host (the remote shell found no such program, 127, or could not execute it, 126), or it is too old for the launch (`version --json` lacks a feature it needs); nothing was started there")
    },
    row("75", "TEMPFAIL", "`wait --timeout` / `cancel --wait` ran out before the run was final, or the run's outcome is `unknown`; for `wait --idle`: the run wrote nothing for that long (it goes on); for `rm`: a run is not over (cancel it first)"),
    row("77", "NOPERM", "`renew` without the run's lease token, or a record that failed validation (`status` of a run whose record cannot be read): nothing was changed"),
    row("78", "CONFIG", "unsafe run root or run dir (owner, mode, symlink)"),
];

/// The table as `--help` shows it: one row a code, meanings wrapped to 90 columns, without the
/// remote-only rows.
pub fn help_text() -> String {
    const INDENT: usize = 9;
    const WIDTH: usize = 90;
    let mut out = String::from("Exit codes (start, wait, attach, relaunch):\n");
    for r in TABLE.iter().filter(|r| !r.remote_only) {
        let mut line = format!("  {:<6} ", r.code);
        for word in r.meaning.replace('`', "").split(' ') {
            if line.len() + 1 + word.len() > WIDTH && line.len() > INDENT {
                out.push_str(line.trim_end());
                out.push('\n');
                line = " ".repeat(INDENT);
            } else if line.len() > INDENT {
                line.push(' ');
            }
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// 128 + N for a signal.
pub fn for_signal(sig: Sig) -> u8 {
    SIGNAL_BASE.saturating_add(sig.number() as u8)
}

/// The exit code a final record stands for. `None` for a record that is not final.
pub fn for_record(st: &Status) -> Option<u8> {
    for_outcome(
        st.state,
        st.term_signal.as_deref(),
        st.exit_code,
        st.reason.as_deref(),
        st.launch_exit_code,
    )
}

/// [`for_record`] of the record's fields that decide it (a [`crate::peek::Peek`] has them).
pub fn for_outcome(
    state: State,
    term_signal: Option<&str>,
    exit_code: Option<i32>,
    reason: Option<&str>,
    launch_exit_code: Option<i32>,
) -> Option<u8> {
    Some(match state {
        State::Finished => match (term_signal, exit_code) {
            (Some(name), _) => Sig::from_name(name).map(for_signal).unwrap_or(SOFTWARE),
            (None, Some(code)) => code.clamp(0, 255) as u8,
            (None, None) => TEMPFAIL,
        },
        State::Cancelled => match reason.and_then(Reason::parse) {
            Some(Reason::LeaseExpired) => LEASE_EXPIRED,
            Some(Reason::Timeout) => TIMEOUT,
            // The caller's channel hung up: what a hangup with a pty gives (signal:HUP).
            Some(Reason::CallerLost) => CALLER_LOST,
            Some(Reason::Signal(sig)) => for_signal(sig),
            _ => for_signal(Sig::Term),
        },
        // `launch_exit_code`; records written before it existed kept the code in `exit_code`.
        State::LaunchFailed => match launch_exit_code.or(exit_code) {
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
            ("signal:SIGUSR1", 138),
            ("signal:34", 162),
            ("signal:HUP", 129),
            ("signal:KILL", 137),
            ("signal:64", 192),
            // Not a signal: the cancel's own code.
            ("signal:0", 143),
            ("signal:65", 143),
            ("signal:", 143),
            ("survivors", 143),
            ("signal:NOPE", 143),
            ("cancel_request", 143),
            ("wrapper_lost", 143),
            ("host_rebooted", 143),
            ("something a hostile record wrote", 143),
        ] {
            assert_eq!(for_record(&cancelled(reason)), Some(code), "{reason}");
        }
        let mut no_reason = cancelled("");
        no_reason.reason = None;
        assert_eq!(for_record(&no_reason), Some(143));
    }

    /// Every state, with the fields that decide its code.
    #[test]
    fn every_final_state_maps_to_one_code() {
        struct Case {
            state: State,
            exit_code: Option<i32>,
            term_signal: Option<&'static str>,
            launch_exit_code: Option<i32>,
            want: Option<u8>,
        }
        let case = |state, exit_code, term_signal, launch_exit_code, want| Case {
            state,
            exit_code,
            term_signal,
            launch_exit_code,
            want,
        };
        use State::*;
        let cases = [
            case(Finished, Some(0), None, None, Some(0)),
            case(Finished, Some(3), None, None, Some(3)),
            case(Finished, Some(125), None, None, Some(125)),
            // The workload's own 126, 127 and 255 are its codes, not a launch failure's.
            case(Finished, Some(126), None, None, Some(126)),
            case(Finished, Some(127), None, None, Some(127)),
            case(Finished, Some(255), None, None, Some(255)),
            // Out-of-range codes in a hostile record are clamped, never wrapped.
            case(Finished, Some(300), None, None, Some(255)),
            case(Finished, Some(-1), None, None, Some(0)),
            // A signal wins over an exit code.
            case(Finished, Some(0), Some("KILL"), None, Some(137)),
            case(Finished, None, Some("SIGSEGV"), None, Some(139)),
            case(Finished, None, Some("15"), None, Some(143)),
            case(Finished, None, Some("NOPE"), None, Some(SOFTWARE)),
            case(Finished, None, Some("65"), None, Some(SOFTWARE)),
            case(Finished, None, Some("0"), None, Some(SOFTWARE)),
            case(Finished, None, Some(""), None, Some(SOFTWARE)),
            case(Finished, None, Some("64"), None, Some(192)),
            case(Finished, None, Some("HUP"), None, Some(129)),
            // Cancelled: the reason decides (no reason: TERM), never the leader's signal.
            case(Cancelled, None, Some("KILL"), None, Some(143)),
            case(Cancelled, Some(0), None, None, Some(143)),
            case(Finished, None, None, None, Some(TEMPFAIL)),
            case(LaunchFailed, None, None, Some(127), Some(NOT_FOUND)),
            case(LaunchFailed, None, None, Some(126), Some(CANNOT_EXECUTE)),
            case(LaunchFailed, None, None, Some(70), Some(SOFTWARE)),
            case(LaunchFailed, None, None, Some(1), Some(SOFTWARE)),
            case(LaunchFailed, None, None, None, Some(SOFTWARE)),
            case(LaunchFailed, None, None, Some(0), Some(SOFTWARE)),
            case(LaunchFailed, None, Some("KILL"), Some(127), Some(NOT_FOUND)),
            // Records from before `launch_exit_code` kept it in `exit_code`.
            case(LaunchFailed, Some(127), None, None, Some(NOT_FOUND)),
            case(
                LaunchFailed,
                Some(127),
                None,
                Some(126),
                Some(CANNOT_EXECUTE),
            ),
            case(Unknown, Some(0), None, None, Some(TEMPFAIL)),
            case(Unknown, None, Some("KILL"), None, Some(TEMPFAIL)),
            case(Unknown, None, None, Some(127), Some(TEMPFAIL)),
            case(Starting, None, None, None, None),
            case(Running, Some(0), None, None, None),
            case(Cancelling, None, Some("TERM"), None, None),
        ];
        for c in cases {
            let mut st = Status::blank("x");
            st.state = c.state;
            st.exit_code = c.exit_code;
            st.term_signal = c.term_signal.map(String::from);
            st.launch_exit_code = c.launch_exit_code;
            assert_eq!(
                for_record(&st),
                c.want,
                "{:?} exit {:?} signal {:?} launch {:?}",
                st.state,
                c.exit_code,
                c.term_signal,
                c.launch_exit_code
            );
        }
    }

    /// Each row's constants hold its code.
    #[test]
    fn the_table_names_its_constants() {
        let value = |name: &str| match name {
            "OK" => OK,
            "SIGNAL_BASE" => SIGNAL_BASE,
            "LEASE_EXPIRED" => LEASE_EXPIRED,
            "TIMEOUT" => TIMEOUT,
            "CALLER_LOST" => CALLER_LOST,
            "CANNOT_EXECUTE" => CANNOT_EXECUTE,
            "NOT_FOUND" => NOT_FOUND,
            "USAGE" => USAGE,
            "DATA_MISMATCH" => DATA_MISMATCH,
            "NO_SUCH_RUN" => NO_SUCH_RUN,
            "SOFTWARE" => SOFTWARE,
            "REMOTE_BIN_MISSING" => REMOTE_BIN_MISSING,
            "TEMPFAIL" => TEMPFAIL,
            "NOPERM" => NOPERM,
            "CONFIG" => CONFIG,
            other => panic!("no constant {other}"),
        };
        for r in TABLE {
            let first: u8 = r.code.split(['-', '+']).next().unwrap().parse().unwrap();
            for name in r.name.split(", ") {
                assert_eq!(value(name), first, "{name} for {}", r.code);
            }
        }
        assert_eq!(CALLER_LOST, for_signal(Sig::Hup));
    }

    /// The (code, meaning) rows of the first `| code | meaning |` table after `heading`.
    fn markdown_table<'a>(doc: &'a str, heading: &str) -> Vec<(&'a str, &'a str)> {
        let section = doc.split(heading).nth(1).expect("the heading is there");
        section
            .lines()
            .skip_while(|l| !l.starts_with("| code |"))
            .skip(2)
            .take_while(|l| l.starts_with("| "))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
                (cells[0].trim(), cells[1].trim())
            })
            .collect()
    }

    /// docs/contract.md's exit-code table is this table, row for row.
    #[test]
    fn the_contract_table_is_this_table() {
        let contract = include_str!("../../docs/contract.md");
        let rows = markdown_table(contract, "\n## Exit codes");
        let ours: Vec<(&str, &str)> = TABLE.iter().map(|r| (r.code, r.meaning)).collect();
        assert_eq!(rows, ours);
    }

    #[test]
    fn the_help_shows_every_code_but_remote_only_ones_in_90_columns() {
        let help = help_text();
        for r in TABLE {
            let shown = help
                .lines()
                .any(|l| l.starts_with(&format!("  {} ", r.code)));
            assert_eq!(shown, !r.remote_only, "{}", r.code);
        }
        assert!(help.lines().all(|l| l.len() <= 90), "{help}");
        assert!(!help.contains('`'));
        assert!(
            help.contains(
                "\n         the wrapper (TERM 143, INT 130, HUP 129), or by cancel (143)\n"
            ),
            "{help}"
        );
    }
}
