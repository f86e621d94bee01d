//! The docs held against the binaries: the contract and the README name only what the binaries
//! have, the man pages show every option, the README's test command is the CI script, and the
//! repository cites only what it holds; `agent-run-gen` parses its arguments.
//!
//! Every test drives the real binaries and asserts on facts (the run root's contents, files a
//! command would have created, /proc, status.json), not on messages alone. Run ids start with `fc-`.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use agent_run_tests::cli::*;
use agent_run_tests::docs::{
    contract_commands, gen_bin, help, help_has_option, markdown_commands, subcommands_in_help,
    workspace_dir, workspace_file, DocCommand,
};
use agent_run_tests::{agent_run_bin, describe_output, exit_code, watchdog_bin};

// =============================================================================================
// agent-run-gen

/// `agent-run-gen --help`, `-h` and `--version` print and exit 0, writing nothing; a stray
/// second argument is refused (64); without an argument it writes into the workspace's
/// target/gen, not into the current directory. Before: `--help` wrote man pages under
/// `./--help/`, and no argument meant `./target/gen` of whatever directory.
#[test]
fn agent_run_gen_parses_its_arguments() {
    let cwd = tempfile::tempdir().unwrap();
    let gen = gen_bin();
    let run = |args: &[&str]| {
        let out = Command::new(&gen)
            .args(args)
            .current_dir(cwd.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (exit_code(&out.status), text(&out.stdout), text(&out.stderr))
    };
    for flag in ["--help", "-h"] {
        let (code, out, _) = run(&[flag]);
        assert_eq!(code, 0, "{flag}");
        assert!(
            out.contains("Usage: agent-run-gen [OUT_DIR]"),
            "{flag}: {out}"
        );
    }
    let (code, out, _) = run(&["--version"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("agent-run-gen {}", agent_run_shared::VERSION).as_str()
        ),
        "(code, out.trim())"
    );
    let (code, _, err) = run(&["a", "b"]);
    assert_eq!(code, 64, "{err}");
    assert_eq!(
        fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "flags wrote files"
    );

    let (code, _, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "no argument wrote into the cwd"
    );
    let page = workspace_dir().join("target/gen/man/man1/agent-run.1");
    let age = fs::metadata(&page)
        .and_then(|m| m.modified())
        .map(|m| SystemTime::now().duration_since(m).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    assert!(
        age < Duration::from_secs(60),
        "{} was not just written",
        page.display()
    );
}

/// The man pages: a page per subcommand `agent-run --help` lists (and no page, nor a reference,
/// for `help`); every synopsis shows each option with its value (`--lease DUR`, `--root DIR`),
/// including the global `--root`; `agent-run(1)` shows the default `RUN_ID -- COMMAND` form.
#[test]
fn the_man_pages_show_every_option_with_its_value() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(gen_bin())
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        describe_output("agent-run-gen", &out)
    );
    let man1 = out_dir.path().join("man/man1");
    let top = help(&agent_run_bin(), &[]);
    let subs = subcommands_in_help(&top);
    assert!(subs.len() >= 10, "{subs:?}");
    let mut pages: BTreeSet<String> = fs::read_dir(&man1)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(pages.remove("agent-run.1"), "pages.remove(\"agent-run.1\")");
    let want: BTreeSet<String> = subs
        .iter()
        .filter(|s| *s != "help")
        .map(|s| format!("agent-run-{s}.1"))
        .collect();
    assert_eq!(pages, want, "pages");
    let roff_of = |p: &Path| fs::read_to_string(p).unwrap().replace("\\-", "-");
    let synopsis_of = |roff: &str| -> String {
        roff.split(".SH SYNOPSIS")
            .nth(1)
            .and_then(|s| s.split(".SH").next())
            .unwrap_or_default()
            .replace("\\fB", "")
            .replace("\\fI", "")
            .replace("\\fR", "")
    };
    for page in fs::read_dir(&man1).unwrap().flatten() {
        let roff = roff_of(&page.path());
        assert!(
            !roff.contains("agent-run-help"),
            "{:?} refers to agent-run-help",
            page.path()
        );
    }
    let top_syn = synopsis_of(&roff_of(&man1.join("agent-run.1")));
    assert!(top_syn.contains("[--root DIR]"), "{top_syn}");
    assert!(top_syn.contains("RUN_ID -- COMMAND [ARGS...]"), "{top_syn}");
    for sub in subs.iter().filter(|s| *s != "help") {
        let syn = synopsis_of(&roff_of(&man1.join(format!("agent-run-{sub}.1"))));
        assert!(
            syn.contains("[--root DIR]"),
            "agent-run-{sub}(1) synopsis lacks --root: {syn}"
        );
        // Every option of `--help` with a value is shown with it.
        for line in help(&agent_run_bin(), &[sub]).lines() {
            let l = line.trim_start();
            let l = l.split_once(", ").map_or(l, |(_, long)| long);
            if let Some((opt, rest)) = l.strip_prefix("--").and_then(|o| o.split_once(' ')) {
                if let Some(value) = rest.strip_prefix('<').and_then(|v| v.split_once('>')) {
                    let shown = format!("--{opt} {}", value.0);
                    assert!(
                        syn.contains(&shown),
                        "agent-run-{sub}(1): no {shown:?} in {syn}"
                    );
                }
            }
        }
    }
    let wd = synopsis_of(&roff_of(
        &out_dir.path().join("man/man8/agent-run-watchdog.8"),
    ));
    for shown in [
        "[--root DIR]",
        "[--once]",
        "[--orphan-grace DUR]",
        "[--scan-interval DUR]",
    ] {
        assert!(
            wd.contains(shown),
            "agent-run-watchdog(8): no {shown} in {wd}"
        );
    }
}

// =============================================================================================
// The docs say what the binaries do

/// The help text of the command a document line runs.
fn help_for(cmd: &DocCommand, subs: &[String]) -> String {
    match (cmd.bin.as_str(), &cmd.sub) {
        ("agent-run-watchdog", _) => help(&watchdog_bin(), &[]),
        (_, Some(sub)) => help(&agent_run_bin(), &[sub]),
        // The implicit start form: its options are start's, plus the global ones.
        (_, None) => {
            assert!(
                subs.iter().any(|s| s == "start"),
                "subs.iter().any(|s| s == \"start\")"
            );
            help(&agent_run_bin(), &["start"])
        }
    }
}

/// Every subcommand and option that docs/contract.md's command-line section and the command
/// lines of the README, docs/usage.md, agents.md, operations.md and development.md name exists
/// in the matching `--help`; every subcommand `--help` lists is in
/// the contract; every exit code of the contract's table is explained by `--help`.
#[test]
fn the_contract_and_the_readme_name_only_what_the_binaries_have() {
    let top = help(&agent_run_bin(), &[]);
    let subs = subcommands_in_help(&top);
    let contract = workspace_file("docs/contract.md");
    let readme = workspace_file("README.md");
    let from_contract = contract_commands(&contract, &subs);
    assert!(from_contract.len() >= 10, "{from_contract:?}");
    let from_readme = markdown_commands(&readme, &subs);
    let used = |cmds: &[DocCommand]| cmds.iter().map(|c| c.options.len()).sum::<usize>();
    // Not vacuous: the parsers find the commands and options the documents show.
    assert!(used(&from_contract) >= 20, "{from_contract:#?}");
    assert!(used(&from_readme) >= 20, "{from_readme:#?}");
    let mut missing = Vec::new();
    let mut docs = vec![
        ("docs/contract.md", from_contract.clone()),
        ("README.md", from_readme),
    ];
    // The reference the README links to: its command lines are held to the binaries too.
    for doc in [
        "docs/usage.md",
        "docs/agents.md",
        "docs/operations.md",
        "docs/development.md",
    ] {
        let cmds = markdown_commands(&workspace_file(doc), &subs);
        assert!(!cmds.is_empty(), "no command line found in {doc}");
        docs.push((doc, cmds));
    }
    for (doc, cmds) in docs {
        for cmd in cmds {
            let h = help_for(&cmd, &subs);
            for opt in &cmd.options {
                if !help_has_option(&h, opt) && !help_has_option(&top, opt) {
                    missing.push(format!("{doc}: {opt} in {:?}", cmd.source));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "options the binaries do not have:\n{}",
        missing.join("\n")
    );
    let in_contract: BTreeSet<String> =
        from_contract.iter().filter_map(|c| c.sub.clone()).collect();
    for sub in subs.iter().filter(|s| *s != "help") {
        assert!(
            in_contract.contains(sub),
            "the contract's command line lacks `agent-run {sub}`"
        );
    }
    // Exit codes: the contract's table rows, explained in `--help` (remote's own in its help).
    let codes_help = format!("{top}\n{}", help(&agent_run_bin(), &["remote"]));
    for row in contract.lines().filter(|l| l.starts_with("| ")) {
        let code = row.trim_start_matches("| ").split(' ').next().unwrap_or("");
        if code.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            assert!(
                codes_help.lines().any(|l| l.trim_start().starts_with(code)),
                "exit code {code} of the contract is not in --help"
            );
        }
    }
}

/// The README's test command is the one script that installs what the suite needs and runs
/// it, and `.ci/run` calls the same script.
#[test]
fn the_readme_test_command_is_the_ci_script() {
    let readme = workspace_file("README.md");
    assert!(
        readme.contains("\nbash .ci/test\n"),
        "README's test command is not `bash .ci/test`"
    );
    let ci = workspace_file(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "bash .ci/test"),
        ".ci/run does not call .ci/test"
    );
    let test = workspace_file(".ci/test");
    for pkg in [
        "openssh-server",
        "openssh-client",
        "iproute2",
        "tini",
        "hyperfine",
        "tmux",
    ] {
        assert!(test.contains(pkg), ".ci/test does not install {pkg}");
    }
    assert!(
        test.contains("cargo test --workspace"),
        "test.contains(\"cargo test --workspace\")"
    );
    let mode = fs::metadata(workspace_dir().join(".ci/test"))
        .unwrap()
        .permissions()
        .mode();
    assert!(mode & 0o111 != 0, ".ci/test is not executable");
}

/// Housekeeping: no compiled Python is tracked, and no file cites the seed documents by a path
/// outside the repository.
#[test]
fn the_repository_cites_only_what_it_holds() {
    let ws = workspace_dir();
    let gitignore = workspace_file(".gitignore");
    assert!(
        gitignore.lines().any(|l| l.trim() == "__pycache__/"),
        ".gitignore: {gitignore}"
    );
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&ws)
        .output()
        .expect("git is needed to list the repository's files");
    assert!(out.status.success(), "git ls-files: {}", text(&out.stderr));
    let files: Vec<String> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(text)
        .collect();
    assert!(files.len() > 20, "{files:?}");
    let pyc: Vec<&String> = files
        .iter()
        .filter(|f| f.ends_with(".pyc") || f.contains("__pycache__"))
        .collect();
    assert!(pyc.is_empty(), "tracked compiled Python: {pyc:?}");
    let outside = ["shared/", "seeds/"].concat();
    for f in &files {
        if let Ok(body) = fs::read_to_string(ws.join(f)) {
            assert!(
                !body.contains(&outside),
                "{f} cites {outside}, which is not in the repository"
            );
        }
    }
    assert!(
        files.iter().any(|f| f == "docs/references.md"),
        "files.iter().any(|f| f == \"docs/references.md\")"
    );
    assert!(
        files.iter().any(|f| f == "docs/contract.md"),
        "files.iter().any(|f| f == \"docs/contract.md\")"
    );
}
