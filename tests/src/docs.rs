//! Helpers for `tests/tests/docs_match_binaries.rs`: the man page generator, `--help` texts, and the
//! command lines the README and the contract show, read back so a test can hold them against
//! the binaries.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workspace root (the directory holding README.md and docs/).
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A file of the workspace, as text; panics naming it if it cannot be read.
pub fn workspace_file(rel: &str) -> String {
    let path = workspace_dir().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `agent-run-gen`: `$AGENT_RUN_GEN_BIN`, else beside the binaries under test
/// ([`crate::BUILD_STEP`]).
pub fn gen_bin() -> PathBuf {
    crate::workspace_bin(
        "AGENT_RUN_GEN_BIN",
        "agent-run-gen",
        &["packaging/gen", "wrapper", "watchdog", "shared"],
    )
}

/// `BIN ARGS... --help`, which must exit 0; its stdout.
pub fn help(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .arg("--help")
        .env_remove("AGENT_RUN_ROOT")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {args:?} --help exited {}: {}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands `agent-run --help` lists (its `Commands:` section).
pub fn subcommands_in_help(top_help: &str) -> Vec<String> {
    top_help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Whether a `--help` text documents option `opt` (`--lease`, `-d`) as an option of its own.
pub fn help_has_option(help: &str, opt: &str) -> bool {
    help.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with(&format!("{opt} "))
            || l.starts_with(&format!("{opt},"))
            || l == opt
            || l.starts_with(&format!("{opt}="))
            // `-d, --detach`: the long name comes second.
            || l.split(", ").nth(1).is_some_and(|rest| {
                rest.starts_with(&format!("{opt} ")) || rest == opt
            })
    })
}

/// The option words of a piece of a command line: `--lease`, `-d`, `--ssh-option` (from
/// `--ssh-option=-p2222`). Stops at a lone `--` (what follows is the workload's).
pub fn option_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in text.split_whitespace() {
        let w = raw.trim_matches(|c: char| "[](){}<>,;`'\"".contains(c));
        if w == "--" {
            break;
        }
        let w = w.split('=').next().unwrap_or(w);
        let long = w.len() > 2
            && w.starts_with("--")
            && w[2..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        let short =
            w.len() == 2 && w.starts_with('-') && w[1..].chars().all(|c| c.is_ascii_alphabetic());
        if long || short {
            out.push(w.to_string());
        }
    }
    out
}

/// One command line a document shows: which program, which subcommand (None: the program
/// itself, or agent-run's implicit `start`), the option words it uses, and where it was seen.
#[derive(Debug, Clone)]
pub struct DocCommand {
    pub bin: String,
    pub sub: Option<String>,
    pub options: Vec<String>,
    pub source: String,
}

/// The command lines of the contract's "Command line" section: each line that starts with
/// `agent-run` opens a command; indented lines below it are its options.
pub fn contract_commands(contract: &str, subcommands: &[String]) -> Vec<DocCommand> {
    let section: String = contract
        .lines()
        .skip_while(|l| !l.starts_with("## Command line"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .map(|l| format!("{l}\n"))
        .collect();
    let block = section
        .split("```")
        .nth(1)
        .expect("the contract's command-line section has a code block");
    let mut out: Vec<DocCommand> = Vec::new();
    for line in block.lines() {
        if line.starts_with("agent-run") {
            if let Some(cmd) = parse_command(line, subcommands) {
                out.push(cmd);
            }
        } else if line.starts_with(' ') {
            if let Some(last) = out.last_mut() {
                last.options.extend(option_words(line));
            }
        }
    }
    out
}

/// Every agent-run command line of a Markdown document: the lines of code blocks (in a
/// `console` block, the `$ ` lines), and inline code spans, that run `agent-run` or
/// `agent-run-watchdog` (under any directory), cut at the shell's `|`, `;`, `&&` and `#`.
pub fn markdown_commands(doc: &str, subcommands: &[String]) -> Vec<DocCommand> {
    let mut pieces = Vec::new();
    // None: prose; Some(true): a ```console block (only `$ ` lines are commands, the rest is
    // output); Some(false): any other code block.
    let mut block: Option<bool> = None;
    for line in doc.lines() {
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            block = match block {
                Some(_) => None,
                None => Some(lang.trim() == "console"),
            };
            continue;
        }
        if let Some(console) = block {
            match line.strip_prefix("$ ") {
                Some(cmd) => pieces.push(cmd.to_string()),
                None if !console => pieces.push(line.to_string()),
                None => {}
            }
        } else {
            pieces.extend(
                line.split('`')
                    .enumerate()
                    .filter(|(i, _)| i % 2 == 1)
                    .map(|(_, s)| s.to_string()),
            );
        }
    }
    let mut out = Vec::new();
    for piece in pieces {
        for part in piece.split(['|', ';', '#']).flat_map(|p| p.split("&&")) {
            if let Some(cmd) = parse_command(part, subcommands) {
                out.push(cmd);
            }
        }
    }
    out
}

/// `... agent-run [--root DIR] SUB OPTIONS...` -> the command, if the text runs agent-run.
fn parse_command(text: &str, subcommands: &[String]) -> Option<DocCommand> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let at = words.iter().position(|w| {
        let name = w.rsplit('/').next().unwrap_or(w);
        name == "agent-run" || name == "agent-run-watchdog"
    })?;
    let bin = words[at]
        .rsplit('/')
        .next()
        .unwrap_or(words[at])
        .to_string();
    let rest = &words[at + 1..];
    // `cargo run -p agent-run -- ...`, `cargo install ... # agent-run`: not a command line.
    if at > 0 && matches!(words[at - 1], "-p" | "--package" | "uninstall") {
        return None;
    }
    let mut sub = None;
    if bin == "agent-run" {
        let mut i = 0;
        while i < rest.len() {
            let w = rest[i];
            if w == "--root" {
                i += 2;
                continue;
            }
            if subcommands.iter().any(|s| s == w) {
                sub = Some(w.to_string());
            }
            break;
        }
    }
    Some(DocCommand {
        bin,
        sub,
        options: option_words(&rest.join(" ")),
        source: text.trim().to_string(),
    })
}
