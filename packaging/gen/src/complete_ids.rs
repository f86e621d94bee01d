//! Completion of run ids (`agent-run status <TAB>`), added to what clap writes for bash, zsh and
//! fish. The ids are the run root's listing ($AGENT_RUN_ROOT, else ~/.agent-runs): the names of
//! its directories, dot-names left out. No binary runs at a TAB, as systemctl lists units.
//!
//! A subcommand completes ids where it takes a positional `run_id` or `run_ids` (every one
//! but `start`, whose id is new), except after an option that takes a value.

use clap::Command;

/// The subcommands that take the ids of existing runs, with the options of each that take a
/// value (`--timeout`, `-n`, ...).
pub fn id_subcommands(cli: &Command) -> Vec<(String, Vec<String>)> {
    cli.get_subcommands()
        .filter(|s| s.get_name() != "start")
        .filter(|s| {
            s.get_positionals()
                .any(|a| matches!(a.get_id().as_str(), "run_id" | "run_ids"))
        })
        .map(|s| {
            let mut value_opts = Vec::new();
            for a in s.get_arguments().chain(cli.get_arguments()) {
                if a.is_positional() || !a.get_action().takes_values() {
                    continue;
                }
                value_opts.extend(a.get_long().map(|l| format!("--{l}")));
                value_opts.extend(a.get_short().map(|c| format!("-{c}")));
            }
            (s.get_name().to_string(), value_opts)
        })
        .collect()
}

/// bash: a function around clap's that completes ids first. It also mends clap_complete
/// 4.6's script for a name with a dash: it sets `cmd="agent__run__subcmd__status"` but
/// matches `agent__subcmd__run__subcmd__status)`, so no subcommand's options completed.
pub fn bash(generated: &str, subs: &[(String, Vec<String>)]) -> String {
    let generated = generated.replace("agent__subcmd__run__subcmd__", "agent__run__subcmd__");
    let mut cases = String::new();
    for (name, opts) in subs {
        let opts = if opts.is_empty() {
            "--".to_string()
        } else {
            opts.join("|")
        };
        cases.push_str(&format!(
            "        {name})\n            case \"$prev\" in {opts}) ;; *) [[ \"$cur\" == -* ]] || {{ COMPREPLY=($(compgen -W \"$(_agent_run_ids)\" -- \"$cur\")); return 0; }} ;; esac ;;\n"
        ));
    }
    format!(
        "{generated}
# Run ids: the directories of the run root.
_agent_run_ids() {{
    local root=\"${{AGENT_RUN_ROOT:-$HOME/.agent-runs}}\" d
    for d in \"$root\"/*/; do
        [[ -d \"$d\" ]] || continue
        d=\"${{d%/}}\"
        printf '%s\\n' \"${{d##*/}}\"
    done
}}

_agent_run_with_ids() {{
    local cur=\"${{COMP_WORDS[COMP_CWORD]}}\" prev=\"${{COMP_WORDS[COMP_CWORD-1]}}\" sub=\"\" w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=\"${{COMP_WORDS[i]}}\"
        if [[ \"$w\" == --root ]]; then ((i++)); continue; fi
        [[ \"$w\" == -* ]] && continue
        sub=\"$w\"
        break
    done
    case \"$sub\" in
{cases}    esac
    _agent__run \"$@\"
}}
complete -F _agent_run_with_ids -o bashdefault -o default agent-run
"
    )
}

/// zsh: the `run_id`/`run_ids` arguments of the id subcommands complete with `_agent_run_ids`.
pub fn zsh(generated: &str, subs: &[(String, Vec<String>)]) -> String {
    let mut out = String::new();
    let mut current = String::new();
    for line in generated.lines() {
        if let Some(name) = line.strip_prefix('(').and_then(|l| l.strip_suffix(')')) {
            current = name.to_string();
        }
        let ids = subs.iter().any(|(s, _)| *s == current)
            && (line.contains(":run_id -- ") || line.contains(":run_ids -- "));
        match line.strip_suffix(":_default' \\").filter(|_| ids) {
            Some(head) => out.push_str(&format!("{head}:_agent_run_ids' \\\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
        if line == "autoload -U is-at-least" {
            out.push_str(
                "
# Run ids: the directories of the run root.
(( $+functions[_agent_run_ids] )) ||
_agent_run_ids() {
    local root=${AGENT_RUN_ROOT:-$HOME/.agent-runs}
    local -a ids
    ids=( $root/*(N/:t) )
    compadd -a ids
}
",
            );
        }
    }
    out
}

/// fish: one more completion per id subcommand.
pub fn fish(generated: &str, subs: &[(String, Vec<String>)]) -> String {
    let mut out = format!(
        "{generated}
# Run ids: the directories of the run root.
function __fish_agent_run_ids
    set -l root $HOME/.agent-runs
    set -q AGENT_RUN_ROOT; and set root $AGENT_RUN_ROOT
    for d in $root/*/
        basename $d
    end
end
"
    );
    for (name, _) in subs {
        out.push_str(&format!(
            "complete -c agent-run -n \"__fish_agent_run_using_subcommand {name}\" -f -a \"(__fish_agent_run_ids)\"\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    /// The completions, generated into a temp dir, and a run root with two runs and a dot-name.
    fn setup() -> (tempfile::TempDir, tempfile::TempDir) {
        let out = tempfile::tempdir().unwrap();
        crate::generate(out.path()).expect("generate");
        let root = tempfile::tempdir().unwrap();
        for d in ["build-7", "train-3", ".ansible-fence.x"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
        }
        (out, root)
    }

    fn run(shell: &str, script: &str, root: &Path) -> String {
        let o = Command::new(shell)
            .arg("-c")
            .arg(script)
            .env("AGENT_RUN_ROOT", root)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {shell} (bash .ci/test installs it): {e}"));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{shell}: {text}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        text
    }

    fn words(text: &str) -> Vec<&str> {
        let mut w: Vec<&str> = text.split_whitespace().collect();
        w.sort();
        w
    }

    #[test]
    fn bash_completes_the_ids_of_runs_and_still_the_options() {
        let (out, root) = setup();
        let file = out.path().join("completions/agent-run.bash");
        let complete = |line: &str| {
            let script = format!(
                "source '{}'; COMP_WORDS=({line}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 _agent_run_with_ids agent-run \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
                 printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                file.display()
            );
            run("bash", &script, root.path())
        };
        assert_eq!(
            words(&complete("agent-run status ''")),
            ["build-7", "train-3"]
        );
        assert_eq!(words(&complete("agent-run cancel --json b")), ["build-7"]);
        assert_eq!(words(&complete("agent-run --root x wait t")), ["train-3"]);
        // After an option that takes a value, and for options, clap's completion answers.
        assert!(!complete("agent-run wait --timeout ''").contains("build-7"));
        assert!(complete("agent-run status --js").contains("--json"));
        // `start` makes a new id: no ids there.
        assert!(!complete("agent-run start ''").contains("build-7"));
    }

    #[test]
    fn fish_completes_the_ids_of_runs() {
        let (out, root) = setup();
        let file = out.path().join("completions/agent-run.fish");
        let script = format!(
            "source '{}'; complete -C 'agent-run status '",
            file.display()
        );
        let got = run("fish", &script, root.path());
        let ids: Vec<&str> = words(&got)
            .into_iter()
            .filter(|w| !w.starts_with('-'))
            .collect();
        assert_eq!(ids, ["build-7", "train-3"], "{got}");
    }

    #[test]
    fn zsh_completes_the_ids_of_runs_where_the_subcommand_takes_them() {
        let (out, root) = setup();
        let file = out.path().join("completions/_agent-run");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(":run_ids -- ") && text.contains(":_agent_run_ids' \\"));
        // The function itself, with compadd standing in for the completion system's.
        let script = format!(
            "compdef() {{ :; }}; source '{}' >/dev/null 2>&1; \
             compadd() {{ [[ $1 == -a ]] && print -l ${{(P)2}}; }}; _agent_run_ids",
            file.display()
        );
        assert_eq!(
            words(&run("zsh", &script, root.path())),
            ["build-7", "train-3"]
        );
    }
}
