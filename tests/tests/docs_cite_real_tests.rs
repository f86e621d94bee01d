//! Every test docs/safety.md cites exists, in full: a hazard whose test was renamed or removed
//! would otherwise look covered.
//!
//! A citation is a backquoted path: `file::name` for a test in tests/tests/file.rs (a name a
//! `cases!` or `mode_tests!` call makes counts when the file spells it), `unit:module::name` for
//! a unit test, `fuzz::name` for shared/tests/fuzz.rs. Any other backquoted `a::b` must name a
//! function that exists somewhere in the workspace's sources.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use agent_run_tests::docs::{workspace_dir, workspace_file};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.ends_with("target") {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The identifiers a source spells (words of letters, digits and `_`).
fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// The backquoted `a::b...` spans of a markdown text, `unit:` prefix kept.
fn citations(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.contains("::"))
        .filter(|s| {
            s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_:".contains(c))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_test_safety_md_cites_exists() {
    let root = workspace_dir();
    let tests_dir = root.join("tests/tests");
    let mut files = Vec::new();
    sources(&tests_dir, &mut files);
    let test_words: Vec<(String, HashSet<String>)> = files
        .iter()
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, words(&fs::read_to_string(p).unwrap_or_default()))
        })
        .collect();
    let mut all = Vec::new();
    for crate_dir in ["shared", "wrapper", "watchdog", "mcp", "tests", "packaging"] {
        sources(&root.join(crate_dir), &mut all);
    }
    let every_word: HashSet<String> = all
        .iter()
        .flat_map(|p| words(&fs::read_to_string(p).unwrap_or_default()))
        .collect();
    let safety = workspace_file("docs/safety.md");
    let cited = citations(&safety);
    assert!(cited.len() > 100, "only {} citations found", cited.len());
    let mut missing = Vec::new();
    for c in &cited {
        let path = c.trim_start_matches("unit:");
        let mut parts = path.split("::");
        let first = parts.next().unwrap_or_default();
        let name = path.rsplit("::").next().unwrap_or_default();
        // `file::` names a file, and `file::f` is the header's example of the notation.
        if name.len() < 2 {
            continue;
        }
        let found = match test_words.iter().find(|(stem, _)| stem == first) {
            Some((_, w)) => w.contains(name),
            None => every_word.contains(name),
        };
        if !found {
            missing.push(c.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/safety.md cites tests or functions that do not exist:\n{}",
        missing.join("\n")
    );
}
