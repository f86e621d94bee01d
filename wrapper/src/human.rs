//! Output for people: durations in human units, commands quoted so they can be pasted back, the
//! one-line summary of a final record, and colour for states.
//!
//! Colour only on a terminal, and never when `NO_COLOR` is set to anything but the empty string
//! (no-color.org). Programs get JSON (`--json`, or a non-terminal stdout where a subcommand says
//! so); nothing here is parsed by anyone.

use agent_run_shared::exit;
use agent_run_shared::record::{State, Status};
use agent_run_shared::stop::Sig;
use agent_run_shared::time::parse_rfc3339;
use std::io::IsTerminal;

/// A message on stderr (`agent-run: ` and a newline added), in one write, and never a panic:
/// the caller's channel may be gone (EPIPE), and the wrapper must go on regardless.
pub fn say(msg: &str) {
    use std::io::Write;
    let line = format!("agent-run: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Whether stdout is a terminal.
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// Whether stderr is a terminal.
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// Whether to colour output going to a stream that is (`tty`) or is not a terminal.
pub fn colour_for(tty: bool) -> bool {
    tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// A duration in at most two units: `450ms`, `1.2s`, `42s`, `5m 3s`, `3h 5m`, `2d 3h`.
pub fn duration(secs: f64) -> String {
    let s = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
    if s < 1.0 {
        return format!("{}ms", (s * 1000.0).round() as u64);
    }
    if s < 10.0 {
        return format!("{:.1}s", (s * 10.0).floor() / 10.0);
    }
    let t = s as u64;
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit} {small}{small_unit}")
        }
    };
    match t {
        0..=59 => format!("{t}s"),
        60..=3599 => two(t / 60, "m", t % 60, "s"),
        3600..=86_399 => two(t / 3600, "h", t % 3600 / 60, "m"),
        _ => two(t / 86_400, "d", t % 86_400 / 3600, "h"),
    }
}

/// [`duration`] in whole seconds at least, for table columns: `0s`, `42s`, `5m 3s`, `2d 3h`.
pub fn duration_coarse(secs: f64) -> String {
    if secs < 60.0 {
        format!("{}s", secs.max(0.0) as u64)
    } else {
        duration(secs)
    }
}

/// Text from a record made safe for a terminal: the workload can rewrite its record, so a
/// control character (an escape sequence) is shown as `\xNN`, never sent to the terminal.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                format!("\\x{:02x}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// One word for a POSIX shell: as it is when it needs no quoting, else in single quotes
/// (`'` written `'\''`); a word with control characters in `$'...'` (bash, zsh, ksh).
pub fn shell_word(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !w.is_empty() && w.chars().all(plain) {
        return w.to_string();
    }
    if w.chars().any(char::is_control) {
        let mut out = String::from("$'");
        for c in w.chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('\'');
        return out;
    }
    format!("'{}'", w.replace('\'', "'\\''"))
}

/// A command line that a POSIX shell reads back as the same words.
pub fn shell_command(argv: &[String]) -> String {
    argv.iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The ANSI colour of a state (SGR parameters).
pub fn state_colour(st: &Status) -> &'static str {
    colour_of(st.state, exit::for_record(st))
}

/// [`state_colour`] of a record's state and the exit code it stands for.
pub fn colour_of(state: State, outcome: Option<u8>) -> &'static str {
    match state {
        State::Finished if outcome == Some(0) => "32",
        State::Finished => "31",
        State::Cancelled => "33",
        State::LaunchFailed | State::Unknown => "1;31",
        State::Starting | State::Running | State::Cancelling => "36",
    }
}

/// `text` (already padded) in the colour of the record's state, when `colour`.
pub fn paint(st: &Status, text: &str, colour: bool) -> String {
    paint_code(state_colour(st), text, colour)
}

/// `text` in the colour `code` (from [`state_colour`]), when `colour`.
pub fn paint_code(code: &str, text: &str, colour: bool) -> String {
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// How long the workload ran: started (or created) to ended, or to now while active.
pub fn run_time(st: &Status) -> Option<f64> {
    let start = parse_rfc3339(st.started_at.as_deref().unwrap_or(&st.created_at))?;
    let end = match &st.ended_at {
        Some(e) => parse_rfc3339(e)?,
        None => agent_run_shared::time::epoch_now(),
    };
    Some(end - start)
}

/// `signal: SEGV (exit 139)` for a leader killed by a signal.
pub fn signal_text(name: &str) -> String {
    match Sig::from_name(name) {
        Some(sig) => format!("{name} (exit {})", exit::for_signal(sig)),
        None => name.to_string(),
    }
}

/// One line for a final record: `run train-3: cancelled (cancel_request) after 1.2s, 3
/// processes stopped, exit 143`.
pub fn final_line(st: &Status, colour: bool) -> String {
    // Every word of a record is the workload's to write: each goes out escaped.
    let mut line = format!(
        "run {}: {}",
        printable(&st.run_id),
        paint(st, st.state.as_str(), colour)
    );
    if let Some(r) = &st.reason {
        line += &format!(" ({})", printable(r));
    }
    if let Some(e) = &st.error {
        line += &format!(": {}", printable(e));
    }
    if st.started_at.is_some() {
        if let Some(t) = run_time(st) {
            line += &format!(" after {}", duration(t));
        }
    }
    if let Some(c) = &st.cleanup {
        let mut pids = c.signalled.clone();
        pids.sort_unstable();
        pids.dedup();
        if !pids.is_empty() {
            let n = pids.len();
            line += &format!(
                ", {n} process{} stopped in {}",
                if n == 1 { "" } else { "es" },
                duration(c.duration_ms as f64 / 1000.0)
            );
        }
        if !c.survivors.is_empty() {
            line += &format!(", survivors {:?}", c.survivors);
        }
    }
    match (&st.term_signal, exit::for_record(st)) {
        // A leader that died of a signal by itself; a stopped run's code is its reason's.
        (Some(s), _) if st.state == State::Finished => {
            line += &format!(", signal {}", printable(&signal_text(s)))
        }
        (_, Some(code)) => line += &format!(", exit {code}"),
        _ => {}
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_line_escapes_every_control_character_the_record_holds() {
        let mut st = agent_run_shared::record::Status::blank("r1");
        st.state = State::Cancelled;
        st.reason = Some("\x1b]0;PWNED\x07\x1b[2J".into());
        st.error = Some("\x1b[31mred\r\n".into());
        let line = final_line(&st, false);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("\\x1b]0;PWNED"), "{line}");
    }

    #[test]
    fn durations_use_at_most_two_units() {
        assert_eq!(duration(0.45), "450ms");
        assert_eq!(duration(1.25), "1.2s");
        assert_eq!(duration(42.0), "42s");
        assert_eq!(duration(303.0), "5m 3s");
        assert_eq!(duration(300.0), "5m");
        assert_eq!(duration(3.0 * 3600.0 + 300.0), "3h 5m");
        assert_eq!(duration(2.0 * 86_400.0 + 3.0 * 3600.0 + 59.0), "2d 3h");
        assert_eq!(duration(-5.0), "0ms");
    }

    #[test]
    fn words_are_quoted_for_a_posix_shell() {
        assert_eq!(shell_word("make"), "make");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a\nb"), "$'a\\nb'");
        assert_eq!(printable("ok\x1b[31m"), "ok\\x1b[31m");
        assert_eq!(
            shell_command(&["sh".into(), "-c".into(), "echo $HOME; exit 3".into()]),
            "sh -c 'echo $HOME; exit 3'"
        );
    }
}
