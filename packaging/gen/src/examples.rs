//! The man pages' EXAMPLES, FILES and ENVIRONMENT sections. Every example is a command line of
//! README.md or docs/usage.md, word for word (a test holds them to that), so the pages teach
//! what the docs teach.

/// (page, [(command, what it does)]): the examples of each page.
pub const EXAMPLES: &[(&str, &[(&str, &str)])] = &[
    (
        "agent-run",
        &[
            ("agent-run build-1 -- make -j4", "Run a command as run build-1, in the foreground."),
            (
                "agent-run -d --lease 2m build-7 -- sh -c 'for i in 1 2 3; do echo step $i; sleep 1; done; exit 3'",
                "Start a run in the background, held by a two-minute lease.",
            ),
            ("agent-run status build-7", "Show the run's record."),
            ("agent-run cancel build-7", "Stop the whole tree, confirm it, then write the final record."),
        ],
    ),
    (
        "agent-run-start",
        &[
            ("agent-run build-1 -- make -j4", "Run a command in the foreground (start is the default subcommand)."),
            ("agent-run -C ~/src -e CI=1 --label job=42 test-7 -- make test", "Set the directory, a variable and a label."),
            ("agent-run --timeout 10s train-3 -- python train.py", "Stop the run after ten seconds."),
            (
                "agent-run -d --lease 2m build-7 -- sh -c 'for i in 1 2 3; do echo step $i; sleep 1; done; exit 3'",
                "Detach, with a lease that stops the run unless renewed.",
            ),
        ],
    ),
    (
        "agent-run-cancel",
        &[
            ("agent-run cancel build-7", "Stop one run, the whole tree."),
            ("agent-run cancel --label job=42", "Stop every active run labelled job=42."),
        ],
    ),
    (
        "agent-run-renew",
        &[
            ("agent-run renew build-7 --lease 10m", "Push the deadline to ten minutes from now (the token from $AGENT_RUN_LEASE_TOKEN)."),
            ("agent-run renew build-7", "Push it by the run's own lease length."),
        ],
    ),
    (
        "agent-run-status",
        &[
            ("agent-run status build-7", "The record, for people."),
            ("agent-run status build-7 --json", "The record, for programs."),
        ],
    ),
    (
        "agent-run-wait",
        &[
            ("agent-run wait build-7 --timeout 30s", "Exit as the run did; 75 if it is not final by then."),
            ("agent-run wait --any --json a b c", "Wait for the first of several to end."),
        ],
    ),
    (
        "agent-run-attach",
        &[("agent-run attach build-7", "Stream the output from the start, and exit as the run did.")],
    ),
    (
        "agent-run-logs",
        &[
            ("agent-run logs -f build-7", "Follow the output until the run is final."),
            ("agent-run logs --tail 20 build-7", "The last 20 lines of both logs."),
        ],
    ),
    (
        "agent-run-list",
        &[
            ("agent-run list", "Every run under the root."),
            ("agent-run list --state active --label job=42", "The active runs labelled job=42."),
        ],
    ),
    (
        "agent-run-gc",
        &[
            ("agent-run gc --older-than 7d --dry-run", "Say which final runs older than a week would go."),
            ("agent-run gc --older-than 7d", "Remove them."),
        ],
    ),
    (
        "agent-run-rm",
        &[("agent-run rm build-7 train-3", "Remove two runs that are over.")],
    ),
    (
        "agent-run-remote",
        &[(
            "agent-run remote build-host --lease 60s --timeout 30m --label job=42 -- make -j8 test",
            "Run a command on another host over OpenSSH, cancelled if this side goes away.",
        )],
    ),
    (
        "agent-run-version",
        &[("agent-run version --json", "What this binary can do and what this host offers it.")],
    ),
];

/// agent-run(1)'s ENVIRONMENT section: (variable, meaning).
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "AGENT_RUN_ROOT",
        "The run root when --root is not given (else $HOME/.agent-runs).",
    ),
    (
        "AGENT_RUN_LEASE_TOKEN",
        "The lease token start uses and renew presents (else --token). The workload never sees it.",
    ),
    (
        "AGENT_RUN_CGROUP",
        "Where start makes the run's cgroup when --cgroup is not given.",
    ),
    (
        "AGENT_RUN_MAX_OUTPUT",
        "The output cap when --max-output is not given.",
    ),
    (
        "AGENT_RUN_NO_SCOPE",
        "Set to 1: never ask the user's systemd manager for a delegated scope.",
    ),
    (
        "AGENT_RUN_ID, AGENT_RUN_DIR",
        "Set by agent-run in the workload's environment: its run id and run dir.",
    ),
];

/// agent-run(1)'s FILES section.
pub const FILES: &[(&str, &str)] = &[
    ("~/.agent-runs/ID/", "A run's dir (mode 0700): status.json, events.jsonl, stdout.log, stderr.log, lease.json, cancel.json, lock."),
    ("~/.agent-runs/ID/status.json", "The run's record, replaced atomically; a final record is fsynced."),
    ("~/.agent-runs/ID/events.jsonl", "The journal: every launch, state change and signal."),
];

/// The roff of a page's EXAMPLES (and, for agent-run(1), FILES and ENVIRONMENT).
pub fn roff(page: &str) -> String {
    let mut out = String::new();
    if let Some((_, examples)) = EXAMPLES.iter().find(|(p, _)| *p == page) {
        out.push_str(".SH EXAMPLES\n");
        for (cmd, what) in *examples {
            out.push_str(&format!(
                ".TP\n.B {}\n{}\n",
                crate::esc(cmd),
                crate::esc(what)
            ));
        }
    }
    if page == "agent-run" {
        for (title, rows) in [("FILES", FILES), ("ENVIRONMENT", ENVIRONMENT)] {
            out.push_str(&format!(".SH {title}\n"));
            for (k, v) in rows {
                out.push_str(&format!(".TP\n.B {}\n{}\n", crate::esc(k), crate::esc(v)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(rel: &str) -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        std::fs::read_to_string(format!("{path}{rel}")).unwrap_or_default()
    }

    #[test]
    fn every_example_is_a_command_line_of_the_readme_or_the_usage_doc() {
        let docs = [
            doc("README.md"),
            doc("docs/usage.md"),
            doc("docs/agents.md"),
        ]
        .join("\n");
        assert!(docs.len() > 10_000, "the docs were not found");
        for (page, examples) in EXAMPLES {
            for (cmd, _) in *examples {
                assert!(docs.contains(cmd), "{page}: `{cmd}` is in no doc");
            }
        }
    }

    #[test]
    fn every_subcommand_page_has_examples() {
        use clap::CommandFactory;
        for sub in crate::cli::Cli::command().get_subcommands() {
            let page = format!("agent-run-{}", sub.get_name());
            if sub.is_hide_set() || sub.get_name() == "help" {
                continue;
            }
            assert!(
                roff(&page).contains(".SH EXAMPLES"),
                "{page} has no examples"
            );
        }
    }
}
