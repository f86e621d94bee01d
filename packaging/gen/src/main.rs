//! `agent-run-gen [OUT_DIR]`: man pages (`man/man1/agent-run.1`, one page per subcommand,
//! `man/man8/agent-run-watchdog.8`) and completions (bash, zsh, fish) from the same clap
//! definitions the binaries parse with, so the docs cannot drift from the command line. Not
//! shipped: the generator's crates stay out of the product binaries.
//!
//! OUT_DIR defaults to `target/gen` of this workspace (wherever it is run from). It also
//! rewrites the exit-code table of the workspace's docs/contract.md from shared/src/exit.rs
//! ([`exit_table`]) when that table is out of date.
#![forbid(unsafe_code)]

mod complete_ids;
mod examples;
mod exit_table;

#[allow(dead_code)]
#[path = "../../../wrapper/src/cli.rs"]
mod cli;
#[allow(dead_code)]
#[path = "../../../watchdog/src/cli.rs"]
mod wd_cli;

use clap::{Arg, ArgAction, CommandFactory, Parser};
use clap_complete::Shell;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const RUN_DIR: &str = "\
Each run lives in <root>/<run-id>/ (root: --root, else $AGENT_RUN_ROOT, else $HOME/.agent-runs), \
mode 0700, files 0600: status.json (the record, replaced atomically; final records fsynced), \
stdout.log and stderr.log (written by the output keeper from the workload's pipes; capped by \
--max-output, counted in the record's output key; output.json holds the keeper's counts), events.jsonl (append-only journal: \
every launch, state change and signal sent), lease.json (signed with the run's lease token: only \
its holder renews), cancel.json, pid, pgid and lock (held by the wrapper for its whole life, as \
is the run dir; its mtime is the wrapper's heartbeat). The workload can rewrite every one of \
them: they inform, and the kernel's facts (the lock's holder, the run's cgroup, the wrapper's \
pidfd) decide.";

/// The workspace's own `target/gen`, whatever the current directory.
const DEFAULT_OUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/gen");
/// The workspace's contract, whose exit-code table is generated.
const CONTRACT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/contract.md");

/// Generate agent-run's man pages and shell completions from its clap definitions.
///
/// Writes OUT_DIR/man/man1/agent-run.1, one page per subcommand (agent-run-start.1, ...),
/// OUT_DIR/man/man8/agent-run-watchdog.8 and OUT_DIR/completions/ (bash, zsh, fish).
/// packaging/build-deb.sh runs it with OUT_DIR = target/static. It also rewrites the exit-code
/// table of the workspace's docs/contract.md (between its exit-table markers) when it differs
/// from shared/src/exit.rs.
#[derive(Debug, Parser)]
#[command(name = "agent-run-gen", version)]
struct Args {
    /// Where to write man/ and completions/ (default: target/gen of the agent-run workspace,
    /// not of the current directory)
    #[arg(value_name = "OUT_DIR")]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 64 } else { 0 });
        }
    };
    let out = args.out.unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    match generate(&out).and_then(|()| contract()) {
        Ok(()) => {
            println!("wrote man pages and completions under {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agent-run-gen: {e:#}");
            ExitCode::from(70)
        }
    }
}

fn generate(out: &Path) -> anyhow::Result<()> {
    let man1 = out.join("man/man1");
    let man8 = out.join("man/man8");
    fs::create_dir_all(&man1)?;
    fs::create_dir_all(&man8)?;
    // `agent-run help` works, but it gets no page of its own, so no page refers to one. Built
    // first, so every subcommand's page carries the global options (--root).
    let mut run = cli::Cli::command()
        .disable_help_subcommand(true)
        .after_long_help(RUN_DIR);
    run.build();
    write_man(&run, &man1, "1", &top_synopsis(&run))?;
    for sub in run.get_subcommands() {
        // A one-shot program: leaking the few names is simpler than clap's `string` feature.
        let name: &'static str =
            Box::leak(format!("agent-run-{}", sub.get_name()).into_boxed_str());
        let bin: &'static str = Box::leak(format!("agent-run {}", sub.get_name()).into_boxed_str());
        let page = sub.clone().name(name).bin_name(bin);
        write_man(&page, &man1, "1", &[synopsis(&page, bin)])?;
    }
    let mut wd = wd_cli::Cli::command();
    wd.build();
    write_man(&wd, &man8, "8", &[synopsis(&wd, "agent-run-watchdog")])?;
    let comp = out.join("completions");
    fs::create_dir_all(&comp)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        for mut cmd in [cli::Cli::command(), wd_cli::Cli::command()] {
            let name = cmd.get_name().to_string();
            clap_complete::generate_to(shell, &mut cmd, &name, &comp)?;
        }
    }
    // The ids of runs, after clap's completion of options and subcommands.
    let subs = complete_ids::id_subcommands(&run);
    for (file, add) in [
        (
            "agent-run.bash",
            complete_ids::bash as fn(&str, &_) -> String,
        ),
        ("_agent-run", complete_ids::zsh),
        ("agent-run.fish", complete_ids::fish),
    ] {
        let path = comp.join(file);
        let text = fs::read_to_string(&path)?;
        fs::write(&path, add(&text, &subs))?;
    }
    Ok(())
}

/// The contract's exit table, rewritten when it is out of date. A workspace without the
/// contract (the generator built elsewhere) has nothing to rewrite.
fn contract() -> anyhow::Result<()> {
    let path = Path::new(CONTRACT);
    if path.exists() && exit_table::update_contract(path)? {
        println!("rewrote the exit-code table of {}", path.display());
    }
    Ok(())
}

/// The pages that get the EXIT STATUS section: the commands the table is for.
fn has_exit_table(name: &str) -> bool {
    matches!(
        name,
        "agent-run" | "agent-run-start" | "agent-run-wait" | "agent-run-attach"
    )
}

/// One page: clap_mangen's sections, with our synopsis (clap_mangen's omits option values).
fn write_man(
    cmd: &clap::Command,
    dir: &Path,
    section: &str,
    synopsis: &[String],
) -> anyhow::Result<()> {
    let name = cmd.get_name().to_string();
    let man = clap_mangen::Man::new(cmd.clone()).section(section);
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    // No hyphenation, no justification: an option name must not break at its dash.
    writeln!(buf, ".SH SYNOPSIS\n.nh\n.ad l")?;
    for (i, line) in synopsis.iter().enumerate() {
        if i > 0 {
            writeln!(buf, ".br")?;
        }
        writeln!(buf, "{line}")?;
    }
    writeln!(buf, ".ad b\n.hy")?;
    man.render_description_section(&mut buf)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut buf)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(&mut buf)?;
    }
    if has_exit_table(&name) {
        buf.extend_from_slice(exit_table::roff().as_bytes());
    }
    buf.extend_from_slice(examples::roff(&name).as_bytes());
    if cmd.get_version().is_some() {
        man.render_version_section(&mut buf)?;
    }
    fs::write(dir.join(format!("{name}.{section}")), buf)?;
    Ok(())
}

/// roff text: `-` as `\-` (a real hyphen-minus when copied), backslashes escaped.
fn esc(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

fn bold(s: &str) -> String {
    format!("\\fB{}\\fR", esc(s))
}

fn italic(s: &str) -> String {
    format!("\\fI{}\\fR", esc(s))
}

/// `[--lease DUR]`, `[-d|--detach]`, `--older-than DUR` (required), in roff.
fn option(a: &Arg) -> Option<String> {
    let mut names = Vec::new();
    if let Some(s) = a.get_short() {
        names.push(bold(&format!("-{s}")));
    }
    if let Some(l) = a.get_long() {
        names.push(bold(&format!("--{l}")));
    }
    if names.is_empty() {
        return None;
    }
    let mut text = names.join("|");
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values())
        && !matches!(
            a.get_action(),
            ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Help | ArgAction::Version
        );
    if takes_value {
        let value = a
            .get_value_names()
            .map(|v| v.join(" "))
            .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
        text += &format!(" {}", italic(&value));
    }
    if matches!(a.get_action(), ArgAction::Append) {
        text += "...";
    }
    Some(if a.is_required_set() {
        text
    } else {
        format!("[{text}]")
    })
}

/// `RUN_ID`, and for the command of `start`/`remote`: `-- COMMAND [ARGS...]`.
fn positional(a: &Arg) -> String {
    let value = a
        .get_value_names()
        .map(|v| v.join(" "))
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    if a.is_trailing_var_arg_set() {
        let text = format!("{} {} [{}...]", bold("--"), italic(&value), italic("ARGS"));
        return if a.is_required_set() {
            text
        } else {
            format!("[{text}]")
        };
    }
    if a.is_required_set() {
        italic(&value)
    } else {
        format!("[{}]", italic(&value))
    }
}

/// The synopsis line of one command: its name, every visible option with its value, then its
/// positionals.
fn synopsis(cmd: &clap::Command, bin: &str) -> String {
    let mut words = vec![bold(bin)];
    words.extend(
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set() && !a.is_positional())
            .filter_map(option),
    );
    words.extend(
        cmd.get_positionals()
            .filter(|a| !a.is_hide_set())
            .map(positional),
    );
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        words.push(italic("SUBCOMMAND"));
        words.push("[...]".into());
    }
    words.join(" ")
}

/// agent-run(1): the subcommand form, and the default `start` form.
fn top_synopsis(run: &clap::Command) -> Vec<String> {
    let start = run
        .find_subcommand("start")
        .expect("agent-run has a start subcommand");
    let start_form = synopsis(start, "agent-run");
    vec![synopsis(run, "agent-run"), start_form]
}
