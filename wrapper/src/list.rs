//! `agent-run list` and `agent-run gc`: every run under the root. A corrupt or unsafe run dir is
//! reported on its own line without stopping either.

use crate::cli::{GcArgs, ListArgs};
use crate::human;
use crate::runs::{note, open_root, root_entries};
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::record::Status;
use agent_run_shared::root::Root;
use agent_run_shared::spec::matches_all;
use agent_run_shared::time::{epoch_now, parse_rfc3339};
use serde_json::{json, Value};
use std::path::Path;

/// What `list` knows of one run: its JSON entry, its record, and the sort key (created_at).
fn list_entry(root: &Root, name: &str) -> Result<(Value, Status), String> {
    let id = RunId::parse(name).map_err(|e| e.to_string())?;
    let dir = root.open_run_dir(&id).map_err(|e| e.to_string())?;
    let st = dir.read_status().map_err(|e| e.to_string())?;
    let now = epoch_now();
    let age = parse_rfc3339(&st.created_at).map(|c| now - c);
    let lease_left = if st.state.is_final() {
        None
    } else {
        dir.read_lease().ok().flatten().map(|l| l.remaining_s())
    };
    let timeout_left = st
        .timeout_deadline_epoch()
        .filter(|_| !st.state.is_final())
        .map(|d| d - now);
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let v = json!({
        "run_id": st.run_id, "state": st.state.as_str(), "reason": st.reason, "pid": st.pid,
        "age_s": age.map(|a| a.round()), "lease_remaining_s": lease_left.map(round),
        "timeout_remaining_s": timeout_left.map(round),
        "exit_code": st.exit_code, "launch_exit_code": st.launch_exit_code,
        "term_signal": st.term_signal, "note": note(&dir, &st),
        "final": st.state.is_final(), "outcome_exit_code": exit::for_record(&st),
        "labels": st.labels, "created_at": st.created_at, "started_at": st.started_at,
        "ended_at": st.ended_at,
        "containment": st.containment.as_ref().map(|c| c.mode),
    });
    Ok((v, st))
}

/// The width `list` keeps to: 80 columns for run ids of up to 37 characters (longer ids are
/// shown whole, and the row grows).
const LIST_WIDTH: usize = 80;

/// One human line of `list`. `id_w` and `state_w` are the column widths.
fn list_line(v: &Value, st: &Status, id_w: usize, state_w: usize, colour: bool) -> String {
    let state = st.state.as_str();
    let detail = match (v["note"].as_str(), st.reason.as_deref()) {
        (Some(n), _) => format!(" ({})", short_note(n)),
        (None, Some(r)) => format!(" ({})", human::printable(r)),
        (None, None) => String::new(),
    };
    let mut text = format!("{state}{detail}");
    if text.chars().count() > state_w {
        text = text
            .chars()
            .take(state_w.saturating_sub(1))
            .collect::<String>()
            + "\u{2026}";
    }
    let pad = state_w.saturating_sub(text.chars().count());
    // Colour the state word only, after the padding is computed on the plain text.
    let painted = format!(
        "{}{}{}",
        human::paint(st, state, colour),
        &text[state.len()..],
        " ".repeat(pad)
    );
    let left = [
        v["lease_remaining_s"].as_f64(),
        v["timeout_remaining_s"].as_f64(),
    ]
    .into_iter()
    .flatten()
    .min_by(f64::total_cmp);
    format!(
        "{:<id_w$} {painted} {:>7} {:>7} {:>7} {:>4}",
        human::printable(&st.run_id),
        st.pid.map_or("-".into(), |p| p.to_string()),
        v["age_s"]
            .as_f64()
            .map_or("-".into(), human::duration_coarse),
        left.map_or("-".into(), human::duration_coarse),
        v["outcome_exit_code"]
            .as_u64()
            .map_or("-".into(), |c| c.to_string()),
    )
}

/// The notes in their short form for the STATE column.
fn short_note(n: &str) -> &str {
    n.strip_suffix(", not reconciled").unwrap_or(n)
}

/// `agent-run list`: newest first; `--state`, `--label`, `-n`.
pub fn list(root: Option<&Path>, args: ListArgs) -> anyhow::Result<u8> {
    let Some(root) = open_root(root)? else {
        if args.json {
            println!("[]");
        } else {
            eprintln!("agent-run: no runs (no run root yet)");
        }
        return Ok(exit::OK);
    };
    let mut runs = Vec::new();
    let mut broken = Vec::new();
    for name in root_entries(&root)? {
        match list_entry(&root, &name) {
            Ok(entry) => runs.push(entry),
            Err(why) => {
                eprintln!("agent-run: {name}: skipped: {why}");
                broken.push(json!({"run_id": name, "state": null, "error": why}));
            }
        }
    }
    let filtered = !args.states.is_empty() || !args.labels.is_empty();
    runs.retain(|(_, st)| {
        let state_ok = args.states.is_empty()
            || args.states.iter().any(|want| match want.as_str() {
                "active" => !st.state.is_final(),
                "final" => st.state.is_final(),
                w => st.state.as_str() == w,
            });
        state_ok && matches_all(&args.labels, &st.labels)
    });
    // Newest first (by created_at; the id breaks ties).
    let created = |st: &Status| parse_rfc3339(&st.created_at).unwrap_or(0.0);
    runs.sort_by(|a, b| {
        created(&b.1)
            .total_cmp(&created(&a.1))
            .then_with(|| a.1.run_id.cmp(&b.1.run_id))
    });
    if let Some(n) = args.limit {
        runs.truncate(n);
    }
    if args.json {
        let mut rows: Vec<Value> = runs.into_iter().map(|(v, _)| v).collect();
        // Unreadable run dirs match no filter; unfiltered, they are listed (last) as errors.
        if !filtered && args.limit.is_none() {
            rows.extend(broken);
        }
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(exit::OK);
    }
    let colour = human::colour_for(human::stdout_is_terminal());
    // Run ids are shown whole (they are what you type next); the STATE column gives way to a
    // long one, down to the width of the longest state word.
    let id_w = runs
        .iter()
        .map(|(_, st)| st.run_id.len())
        .max()
        .unwrap_or(0)
        .max(6);
    // The fixed columns: PID, AGE, LEFT (7 each), EXIT (4), and the five gaps.
    let fixed = 7 * 3 + 4 + 5;
    let state_w = LIST_WIDTH.saturating_sub(fixed + id_w).clamp(13, 26);
    println!(
        "{:<id_w$} {:<state_w$} {:>7} {:>7} {:>7} {:>4}",
        "RUN_ID", "STATE", "PID", "AGE", "LEFT", "EXIT"
    );
    for (v, st) in &runs {
        println!("{}", list_line(v, st, id_w, state_w, colour));
    }
    Ok(exit::OK)
}

/// `agent-run gc`.
pub fn gc(root: Option<&Path>, args: GcArgs) -> anyhow::Result<u8> {
    let Some(root) = open_root(root)? else {
        return Ok(exit::OK);
    };
    let now = epoch_now();
    for name in root_entries(&root)? {
        let checked = RunId::parse(&name)
            .map_err(|e| e.to_string())
            .and_then(|id| root.open_run_dir(&id).map_err(|e| e.to_string()))
            .and_then(|dir| {
                dir.read_status()
                    .map(|st| (dir, st))
                    .map_err(|e| e.to_string())
            });
        let (dir, st) = match checked {
            Ok(x) => x,
            Err(why) => {
                eprintln!("agent-run: {name}: skipped: {why}");
                continue;
            }
        };
        if !st.state.is_final() {
            continue;
        }
        let ended = st.ended_at.as_deref().and_then(parse_rfc3339);
        if ended.is_none_or(|e| now - e < args.older_than.as_secs_f64()) {
            continue;
        }
        if args.dry_run {
            println!("would remove {}", dir.path().display());
            continue;
        }
        // remove_dir_all never follows symlinks inside the tree (std, since CVE-2022-21658).
        match std::fs::remove_dir_all(dir.path()) {
            Ok(()) => println!("removed {}", dir.path().display()),
            Err(e) => eprintln!("agent-run: cannot remove {}: {e}", dir.path().display()),
        }
    }
    Ok(exit::OK)
}
