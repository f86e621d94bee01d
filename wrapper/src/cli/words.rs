//! The words before clap: a bare run id means `start`, and a mistyped subcommand gets a
//! suggestion.

use super::*;

pub(super) const SUBCOMMANDS: &[&str] = &[
    "start", "cancel", "renew", "status", "wait", "attach", "logs", "list", "gc", "rm", "remote",
    "version", "help",
];

/// Insert `start` when the first word that is not an option is not a subcommand. That word is
/// then a run id, and the implicit form requires `--` after it (only options in between): a
/// mistyped subcommand (`agent-run stop train-3`) is refused with exit 64 and a suggestion,
/// never run as a command.
pub(super) fn with_default_subcommand(mut args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let takes_value = [
        "--root",
        "--lease",
        "--grace",
        "--hup-after",
        "--timeout",
        "-C",
        "--cwd",
        "-e",
        "--env",
        "--label",
        "--on-disconnect",
        "--cgroup",
        "--max-output",
        "--on-output-limit",
        "--tail",
        "--pty-size",
    ];
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if a == "--" {
            break;
        }
        if a.starts_with('-') {
            i += if takes_value.contains(&a.as_ref()) {
                2
            } else {
                1
            };
            continue;
        }
        if SUBCOMMANDS.contains(&a.as_ref()) {
            return Ok(args);
        }
        if !implicit_start(&args[i + 1..], &takes_value) {
            return Err(unknown_subcommand(&a));
        }
        break;
    }
    let only_info = args[1..]
        .iter()
        .all(|a| matches!(a.to_str(), Some("-h" | "--help" | "-V" | "--version")));
    if args.len() > 1 && !only_info {
        args.insert(1, "start".into());
    }
    Ok(args)
}

/// After the run id of the implicit `start` form: options (and their values), then `--`.
pub(super) fn implicit_start(after_id: &[OsString], takes_value: &[&str]) -> bool {
    let mut i = 0;
    while let Some(a) = after_id.get(i).map(|a| a.to_string_lossy()) {
        if a == "--" {
            return true;
        }
        if !a.starts_with('-') {
            return false;
        }
        i += if takes_value.contains(&a.as_ref()) {
            2
        } else {
            1
        };
    }
    false
}

/// What users type for a subcommand that has another name here.
pub(super) const SYNONYMS: &[(&str, &str)] = &[
    ("stop", "cancel"),
    ("kill", "cancel"),
    ("abort", "cancel"),
    ("terminate", "cancel"),
    ("ls", "list"),
    ("ps", "list"),
    ("show", "status"),
    ("info", "status"),
    ("log", "logs"),
    ("tail", "logs"),
    ("follow", "attach"),
    ("extend", "renew"),
    ("run", "start"),
    ("exec", "start"),
    ("launch", "start"),
    ("rm", "gc"),
    ("clean", "gc"),
    ("ssh", "remote"),
];

/// The message for a first word that is neither a subcommand nor a run id followed by `--`.
pub(super) fn unknown_subcommand(word: &str) -> String {
    let mut msg = format!("unrecognized subcommand '{word}'");
    if let Some(s) = suggestion(word) {
        msg += &format!("; did you mean '{s}'?");
    }
    msg += "\nagent-run: to start a run: agent-run [OPTIONS] RUN_ID -- COMMAND [ARGS...] \
            (the subcommands: agent-run --help)";
    msg
}

/// A subcommand close to `word`: a synonym, a prefix, or one or two typos away.
pub(super) fn suggestion(word: &str) -> Option<&'static str> {
    let w = word.to_ascii_lowercase();
    if let Some((_, s)) = SYNONYMS.iter().find(|(k, _)| *k == w) {
        return Some(s);
    }
    let real = || SUBCOMMANDS.iter().copied().filter(|s| *s != "help");
    if let Some(s) = real().find(|s| s.starts_with(&w) && w.len() >= 2) {
        return Some(s);
    }
    real()
        .map(|s| (typos(&w, s), s))
        .filter(|(d, s)| *d <= 2.min(s.len() / 2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, s)| s)
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
/// neighbours each count one.
pub(super) fn typos(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}
