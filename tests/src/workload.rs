//! Command lines of workloads and of agent-run: the fixture-tree builder every test file uses
//! (`fx("tree --children 2")`, `start_args("--detach", id, &command)`, `sh`, `logged_tree`).

use std::path::Path;

use crate::facts::path_str;
use crate::fixture_bin;

/// The fixture's options for a tree that ignores TERM and HUP everywhere (`fx(&format!("tree
/// --children 1 {DEAF}"))`): a stop takes its whole grace, up to KILL.
pub const DEAF: &str =
    "--leader-term ignore --leader-hup ignore --member-term ignore --member-hup ignore";

/// A leader that dies of TERM over one child that ignores TERM and HUP.
pub const DEAF_CHILD: &str = "tree --children 1 --member-term ignore --member-hup ignore";

/// The `fixture` binary's path as a string, for command lines.
pub fn fixture_path() -> String {
    fixture_bin().to_string_lossy().into_owned()
}

/// `fixture ARGS...`, the arguments given as one whitespace-separated string.
pub fn fx(args: &str) -> Vec<String> {
    fx_args(&args.split_whitespace().collect::<Vec<_>>())
}

/// `fixture ARGS...`, the arguments one by one (for arguments with spaces).
pub fn fx_args(args: &[&str]) -> Vec<String> {
    std::iter::once(fixture_path())
        .chain(args.iter().map(|a| a.to_string()))
        .collect()
}

/// `fixture tree OPTS... --log LOG`: a tree whose signal handlers log to `log`.
pub fn logged_tree(opts: &str, log: &Path) -> Vec<String> {
    let mut argv = fx(&format!("tree {opts}"));
    argv.extend(["--log".to_string(), path_str(log).to_string()]);
    argv
}

/// `sh -c SCRIPT ARGS...` (`$0` is the first of ARGS).
pub fn sh(script: &str, args: &[&str]) -> Vec<String> {
    ["sh", "-c", script]
        .iter()
        .chain(args)
        .map(|a| a.to_string())
        .collect()
}

/// `sh -c '"$0" count "$1"; exit CODE' FIXTURE COUNTER`: its counter file proves whether it ran.
pub fn counting(counter: &Path, code: i32) -> Vec<String> {
    let script = format!(r#""$0" count "$1"; exit {code}"#);
    sh(&script, &[&fixture_path(), path_str(counter)])
}

/// `start OPTS... ID -- COMMAND...`, the options given as one whitespace-separated string.
pub fn start_args(opts: &str, id: &str, command: &[String]) -> Vec<String> {
    start_argv(&opts.split_whitespace().collect::<Vec<_>>(), id, command)
}

/// `start OPTS... ID -- COMMAND...`, the options one by one.
pub fn start_argv(opts: &[&str], id: &str, command: &[String]) -> Vec<String> {
    let mut args = vec!["start".to_string()];
    args.extend(opts.iter().map(|o| o.to_string()));
    args.extend([id.to_string(), "--".to_string()]);
    args.extend(command.iter().cloned());
    args
}

/// Strings of string slices.
pub fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The bytes `fixture spew N` writes.
pub fn spew_bytes(n: usize) -> Vec<u8> {
    const PATTERN: &[u8; 37] = b"0123456789abcdefghijklmnopqrstuvwxyz\n";
    (0..n).map(|i| PATTERN[i % 37]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_args_puts_the_options_then_the_id_then_the_command() {
        let cmd = strings(&["sh", "-c", "exit 3"]);
        let table: [(&str, &[&str]); 3] = [
            ("", &["start", "r1", "--", "sh", "-c", "exit 3"]),
            (
                "--detach",
                &["start", "--detach", "r1", "--", "sh", "-c", "exit 3"],
            ),
            (
                " --lease  2s --quiet ",
                &[
                    "start", "--lease", "2s", "--quiet", "r1", "--", "sh", "-c", "exit 3",
                ],
            ),
        ];
        for (opts, want) in table {
            assert_eq!(start_args(opts, "r1", &cmd), strings(want), "{opts:?}");
        }
    }

    #[test]
    fn spew_bytes_repeats_the_fixtures_pattern() {
        assert_eq!(spew_bytes(0), b"");
        assert_eq!(&spew_bytes(38)[35..], b"z\n0");
    }
}
