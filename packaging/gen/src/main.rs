//! `agent-run-gen OUT_DIR`: man pages (`man1/agent-run.1`, one page per subcommand,
//! `man8/agent-run-watchdog.8`) and completions (bash, zsh, fish) from the same clap definitions
//! the binaries parse with, so the docs cannot drift from the command line. Not shipped: the
//! generator's crates stay out of the product binaries.
#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "../../../wrapper/src/cli.rs"]
mod cli;
#[allow(dead_code)]
#[path = "../../../watchdog/src/cli.rs"]
mod wd_cli;

use clap::CommandFactory;
use clap_complete::Shell;
use std::fs;
use std::path::{Path, PathBuf};

const RUN_DIR: &str = "\
Each run lives in <root>/<run-id>/ (root: --root, else $AGENT_RUN_ROOT, else $HOME/.agent-runs), \
mode 0700, files 0600: status.json (the record, replaced atomically; final records fsynced), \
stdout.log and stderr.log (written by the workload itself), events.jsonl (append-only journal: \
every launch, state change and signal sent), lease.json, cancel.json, pid and pgid.";

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args_os()
            .nth(1)
            .unwrap_or_else(|| "target/gen".into()),
    );
    let man1 = out.join("man/man1");
    let man8 = out.join("man/man8");
    fs::create_dir_all(&man1)?;
    fs::create_dir_all(&man8)?;
    let run = cli::Cli::command().after_long_help(format!("{RUN_DIR}\n\n{}", exit_codes()));
    write_man(&run, &man1, "1")?;
    for sub in run.get_subcommands() {
        // A one-shot program: leaking the few names is simpler than clap's `string` feature.
        let name: &'static str =
            Box::leak(format!("agent-run-{}", sub.get_name()).into_boxed_str());
        let bin: &'static str = Box::leak(format!("agent-run {}", sub.get_name()).into_boxed_str());
        let page = sub.clone().name(name).bin_name(bin);
        write_man(&page, &man1, "1")?;
    }
    let wd = wd_cli::Cli::command();
    write_man(&wd, &man8, "8")?;
    let comp = out.join("completions");
    fs::create_dir_all(&comp)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        for mut cmd in [cli::Cli::command(), wd_cli::Cli::command()] {
            let name = cmd.get_name().to_string();
            clap_complete::generate_to(shell, &mut cmd, &name, &comp)?;
        }
    }
    println!("wrote man pages and completions under {}", out.display());
    Ok(())
}

fn exit_codes() -> String {
    let long = cli::Cli::command().render_long_help().to_string();
    long.split_once("Exit codes")
        .map(|(_, rest)| format!("Exit codes{rest}"))
        .unwrap_or_default()
}

fn write_man(cmd: &clap::Command, dir: &Path, section: &str) -> anyhow::Result<()> {
    let name = cmd.get_name().to_string();
    let man = clap_mangen::Man::new(cmd.clone()).section(section);
    let mut buf = Vec::new();
    man.render(&mut buf)?;
    fs::write(dir.join(format!("{name}.{section}")), buf)?;
    Ok(())
}
