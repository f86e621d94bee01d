//! `agent-run list` and `agent-run gc`: every run under the root. A corrupt or unsafe run dir is
//! reported on its own line without stopping either.

use crate::cancel::parallel;
use crate::cli::{GcArgs, ListArgs};
use crate::human;
use crate::runs::{open_root, root_entries};
use agent_run_shared::exit;
use agent_run_shared::id::RunId;
use agent_run_shared::peek::Peek;
use agent_run_shared::pid::ClaimedPid;
use agent_run_shared::record::{ContainmentMode, State};
use agent_run_shared::removal;
use agent_run_shared::root::Root;
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::spec::matches_all;
use agent_run_shared::sweep::Sweep;
use agent_run_shared::time::{epoch_now, parse_rfc3339};
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// What `list` keeps of one run: the few fields it shows, not the whole record (100,000 runs
/// listed hold 100,000 of these, 184 bytes each and their strings, and no record).
struct Row {
    /// The sort key: `created_at` in epoch seconds (0 when unparsable).
    created: f64,
    run_id: Box<str>,
    state: State,
    reason: Option<Box<str>>,
    /// The record's leader pid, as written.
    pid: Option<ClaimedPid>,
    age_s: Option<f64>,
    /// What the kernel and the run's other files add, for a run that is not settled (none for
    /// most of 100,000 runs, which then keep 8 bytes for it).
    live: Option<Box<Live>>,
    exit_code: Option<i32>,
    launch_exit_code: Option<i32>,
    term_signal: Option<Box<str>>,
    outcome: Option<u8>,
    labels: BTreeMap<String, String>,
    created_at: Box<str>,
    started_at: Option<Box<str>>,
    ended_at: Option<Box<str>>,
    containment: Option<ContainmentMode>,
}

/// A row as `list --json` shows it: the keys in the order `serde_json` sorts them (the order
/// the output has always had), serialized straight to the output.
#[derive(Serialize)]
struct RowJson<'a> {
    age_s: Option<f64>,
    containment: Option<ContainmentMode>,
    created_at: &'a str,
    ended_at: Option<&'a str>,
    exit_code: Option<i32>,
    #[serde(rename = "final")]
    is_final: bool,
    labels: &'a BTreeMap<String, String>,
    launch_exit_code: Option<i32>,
    lease_remaining_s: Option<f64>,
    lease_unreadable: Option<&'a str>,
    note: Option<&'a str>,
    outcome_exit_code: Option<u8>,
    pid: Option<ClaimedPid>,
    reason: Option<&'a str>,
    run_id: &'a str,
    started_at: Option<&'a str>,
    state: &'a str,
    suspended: bool,
    term_signal: Option<&'a str>,
    timeout_remaining_s: Option<f64>,
}

/// One element of the `list --json` array: a run, or a run dir that could not be read.
#[derive(Serialize)]
#[serde(untagged)]
enum Item<'a> {
    #[serde(serialize_with = "row_json")]
    Row(&'a Row),
    Broken(Value),
}

/// A row as its `list --json` object ([`Row::json`]).
fn row_json<S: Serializer>(r: &&Row, s: S) -> Result<S::Ok, S::Error> {
    r.json().serialize(s)
}

/// What a settled run adds: nothing.
static SETTLED: Live = Live {
    lease_left: None,
    lease_unreadable: None,
    timeout_left: None,
    note: None,
    suspended: false,
};

impl Row {
    /// What the run adds beside its record.
    fn live(&self) -> &Live {
        self.live.as_deref().unwrap_or(&SETTLED)
    }

    /// The row's `list --json` object.
    fn json(&self) -> RowJson<'_> {
        let round = |x: f64| (x * 10.0).round() / 10.0;
        let live = self.live();
        RowJson {
            run_id: &self.run_id,
            state: self.state.as_str(),
            reason: self.reason.as_deref(),
            pid: self.pid,
            age_s: self.age_s.map(|a| a.round()),
            lease_remaining_s: live.lease_left.map(round),
            lease_unreadable: live.lease_unreadable.as_deref(),
            timeout_remaining_s: live.timeout_left.map(round),
            exit_code: self.exit_code,
            launch_exit_code: self.launch_exit_code,
            term_signal: self.term_signal.as_deref(),
            note: live.note.as_deref(),
            suspended: live.suspended,
            is_final: self.state.is_final(),
            outcome_exit_code: self.outcome,
            labels: &self.labels,
            created_at: &self.created_at,
            started_at: self.started_at.as_deref(),
            ended_at: self.ended_at.as_deref(),
            containment: self.containment,
        }
    }

    /// The row of a record, with what the kernel adds to it.
    fn new(st: Peek, now: f64, live: Option<Box<Live>>) -> Row {
        let created = parse_rfc3339(st.created_at);
        let outcome = st.outcome();
        let own = |s: Option<&str>| s.map(Box::from);
        Row {
            created: created.unwrap_or(0.0),
            age_s: created.map(|c| now - c),
            live,
            outcome,
            state: st.state,
            pid: st.pid,
            exit_code: st.exit_code,
            launch_exit_code: st.launch_exit_code,
            containment: st.containment.as_ref().map(|c| c.mode),
            run_id: st.run_id.into(),
            reason: own(st.reason),
            term_signal: own(st.term_signal),
            labels: st
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_at: st.created_at.into(),
            started_at: own(st.started_at),
            ended_at: own(st.ended_at),
        }
    }
}

/// What a run that goes on (or whose end the kernel doubts) shows beside its record. A final
/// run nobody holds has none of it.
struct Live {
    lease_left: Option<f64>,
    lease_unreadable: Option<String>,
    timeout_left: Option<f64>,
    note: Option<String>,
    suspended: bool,
}

/// What `list` knows of one run, or why its dir is skipped. A final run the kernel agrees
/// with is read by the sweep's few syscalls ([`Sweep::settled`]); any other by the careful
/// path, which looks at what holds it.
fn list_entry(root: &Root, sweep: &mut Sweep, name: &str) -> Result<Row, String> {
    let now = epoch_now();
    if let Some(settled) = sweep.settled(name) {
        return Ok(Row::new(settled.record, now, None));
    }
    let id = RunId::parse(name).map_err(|e| e.to_string())?;
    let dir = root.open_run_dir(&id).map_err(|e| e.to_string())?;
    let st = dir.read_status().map_err(|e| e.to_string())?;
    let (lease_left, lease_unreadable) = match st.state.is_final() {
        true => (None, None),
        false => match dir.read_lease() {
            Ok(l) => (l.map(|l| l.remaining_s()), None),
            Err(e) => (None, Some(e.to_string())),
        },
    };
    let timeout_left = st
        .timeout_deadline_epoch()
        .filter(|_| !st.state.is_final())
        .map(|d| d - now);
    let look = crate::runs::look_with(&dir, &st, sweep.cgroups());
    let note = crate::runs::note_of(&look);
    let suspended = !st.state.is_final()
        && agent_run_shared::suspend::is_suspended(&dir, &st, look.cgroup.as_ref());
    let live = Live {
        lease_left,
        lease_unreadable,
        timeout_left,
        note,
        suspended,
    };
    Ok(Row::new(Peek::of_status(&st), now, Some(Box::new(live))))
}

/// How many threads read or serialize: one a CPU, up to 4.
fn fan_width() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// How many items of `list --json` are serialized at a time (a share of them per thread).
const BATCH: usize = 8192;

/// `items` as `serde_json::to_writer_pretty` writes an array of them, serialized by a thread a
/// CPU (up to 4), a batch at a time: after reading, serializing is most of the work of
/// `list --json`. A pretty array is `[`, each item after "\n  " with "," between items, then
/// "\n]"; so the parts of one array serialized apart join into the same bytes. On 2 CPUs,
/// `list --json` over 100,000 runs takes 1.2-1.5 s with it and 1.4-1.8 s without (musl build).
fn write_pretty_array<T: Serialize + Sync>(
    out: &mut impl Write,
    items: &[T],
) -> anyhow::Result<()> {
    let cpus = fan_width();
    let share = BATCH.div_ceil(cpus);
    if cpus < 2 || items.len() <= share {
        serde_json::to_writer_pretty(out, items)?;
        return Ok(());
    }
    let pretty = |part: &[T]| -> anyhow::Result<Vec<u8>> {
        let mut w = std::io::BufWriter::with_capacity(64 << 10, Vec::new());
        serde_json::to_writer_pretty(&mut w, part)?;
        Ok(w.into_inner()?)
    };
    out.write_all(b"[")?;
    for (i, batch) in items.chunks(BATCH).enumerate() {
        let shares: Vec<&[T]> = batch.chunks(share).collect();
        let parts = parallel(&shares, cpus, |c| pretty(c));
        let parts = parts.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        for (j, part) in parts.iter().enumerate() {
            if i + j > 0 {
                out.write_all(b",")?;
            }
            // A part is "[" + "\n  item,\n  item" + "\n]": its middle goes out.
            out.write_all(&part[1..part.len() - 2])?;
        }
    }
    out.write_all(b"\n]")?;
    Ok(())
}

/// Every run of `names`, in their order: one part per reader, each in the order of its share of
/// the names. A large root is read by a thread a CPU (up to 4), each over its share with a
/// sweep of its own: reading 100,000 records is syscalls and parsing, and both go as fast as
/// there are CPUs. The rows stay in the parts they were read into (100,000 rows are 35 MB).
fn read_all(root: &Root, names: &[String]) -> Vec<Vec<Result<Row, String>>> {
    let cpus = fan_width();
    let read = |names: &[String]| {
        let mut sweep = Sweep::new(root);
        names
            .iter()
            .map(|n| list_entry(root, &mut sweep, n))
            .collect::<Vec<_>>()
    };
    if cpus < 2 || names.len() < 2_000 {
        return vec![read(names)];
    }
    let shares: Vec<&[String]> = names.chunks(names.len().div_ceil(cpus)).collect();
    parallel(&shares, cpus, |c| read(c))
}

/// The width `list` keeps to: 80 columns for run ids of up to 37 characters (longer ids are
/// shown whole, and the row grows).
const LIST_WIDTH: usize = 80;

/// One human line of `list`. `id_w` and `state_w` are the column widths.
fn list_line(r: &Row, id_w: usize, state_w: usize, colour: bool) -> String {
    let live = r.live();
    let state = match live.suspended {
        true => "suspended",
        false => r.state.as_str(),
    };
    let detail = match (live.note.as_deref(), r.reason.as_deref()) {
        (Some(n), _) => format!(" ({})", short_note(n)),
        (None, Some(reason)) => format!(" ({})", human::printable(reason)),
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
        human::paint_code(human::colour_of(r.state, r.outcome), state, colour),
        &text[state.len()..],
        " ".repeat(pad)
    );
    // The figures the JSON shows, rounded as it rounds them.
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let left = [live.lease_left.map(round), live.timeout_left.map(round)]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp);
    format!(
        "{:<id_w$} {painted} {:>7} {:>7} {:>7} {:>4}",
        human::printable(&r.run_id),
        r.pid.map_or("-".into(), |p| p.to_string()),
        r.age_s
            .map(|a| a.round())
            .map_or("-".into(), human::duration_coarse),
        match (&live.lease_unreadable, left) {
            // A damaged lease.json: said where the time left would be (status says why).
            (Some(_), _) => "damaged".into(),
            (None, left) => left.map_or("-".into(), human::duration_coarse),
        },
        r.outcome.map_or("-".into(), |c| c.to_string()),
    )
}

/// The notes in their short form for the STATE column.
fn short_note(n: &str) -> &str {
    if n.ends_with(": the record was rewritten") && n.starts_with("but its cgroup") {
        return "cgroup not empty";
    }
    if n.starts_with("but its wrapper (pid") {
        return "wrapper running";
    }
    if n.starts_with("but pid") {
        return "lock squatted";
    }
    if n == crate::runs::NOT_STOPPING {
        return "not stopping";
    }
    if n == crate::runs::STOPPING {
        return "stopping";
    }
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
    let filtered = !args.states.is_empty() || !args.labels.is_empty();
    let wanted = |r: &Row| {
        let state_ok = args.states.is_empty()
            || args.states.iter().any(|want| match want.as_str() {
                "active" => !r.state.is_final(),
                "final" => r.state.is_final(),
                w => r.state.as_str() == w,
            });
        state_ok && matches_all(&args.labels, &r.labels)
    };
    let names = root_entries(&root)?;
    let parts = read_all(&root, &names);
    // The rows stay where they were read; what is sorted is references to them.
    let mut runs: Vec<&Row> = Vec::new();
    let mut broken = Vec::new();
    for (name, entry) in names.iter().zip(parts.iter().flatten()) {
        match entry {
            Ok(row) if wanted(row) => runs.push(row),
            Ok(_) => {}
            Err(why) => {
                eprintln!("agent-run: {name}: skipped: {why}");
                broken.push(json!({"run_id": name, "state": null, "error": why}));
            }
        }
    }
    // Newest first (by created_at; the id breaks ties).
    runs.sort_by(|a, b| {
        b.created
            .total_cmp(&a.created)
            .then_with(|| a.run_id.cmp(&b.run_id))
    });
    if let Some(n) = args.limit {
        runs.truncate(n);
    }
    // Rows go out as they are rendered, through one buffer (not one write per line).
    let mut out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
    if args.json {
        // Unreadable run dirs match no filter; unfiltered, they are listed (last) as errors.
        if filtered || args.limit.is_some() {
            broken.clear();
        }
        // The bytes of `serde_json::to_string_pretty` of the whole array.
        let rows = runs.iter().map(|r| Item::Row(r));
        let items: Vec<Item> = rows.chain(broken.into_iter().map(Item::Broken)).collect();
        write_pretty_array(&mut out, &items)?;
        out.write_all(b"\n")?;
        out.flush()?;
        return Ok(exit::OK);
    }
    let colour = human::colour_for(human::stdout_is_terminal());
    // Run ids are shown whole (they are what you type next); the STATE column gives way to a
    // long one, down to the width of the longest state word.
    let id_w = runs
        .iter()
        .map(|r| r.run_id.len())
        .max()
        .unwrap_or(0)
        .max(6);
    // The fixed columns: PID, AGE, LEFT (7 each), EXIT (4), and the five gaps.
    let fixed = 7 * 3 + 4 + 5;
    let state_w = LIST_WIDTH.saturating_sub(fixed + id_w).clamp(13, 26);
    writeln!(
        out,
        "{:<id_w$} {:<state_w$} {:>7} {:>7} {:>7} {:>4}",
        "RUN_ID", "STATE", "PID", "AGE", "LEFT", "EXIT"
    )?;
    for r in &runs {
        writeln!(out, "{}", list_line(r, id_w, state_w, colour))?;
    }
    out.flush()?;
    Ok(exit::OK)
}

/// `agent-run gc`: the root in inode order, each final run old enough removed when
/// [`removal::may_remove`] agrees. The decisions are taken one run after another; the removals
/// run on [`REMOVERS`] threads, since on a file system that discards each freed block at once
/// an unlink waits for the device, and several waits overlap.
pub fn gc(root: Option<&Path>, args: GcArgs) -> anyhow::Result<u8> {
    let Some(root) = open_root(root)? else {
        return Ok(exit::OK);
    };
    let names = removal::by_inode(&root)?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<RunDir>(256);
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|s| {
        for _ in 0..REMOVERS {
            s.spawn(|| loop {
                let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(dir) = next else {
                    return;
                };
                match removal::remove(&root, &dir) {
                    Ok(()) => println!("removed {}", dir.path().display()),
                    Err(e) => eprintln!("agent-run: cannot remove {}: {e}", dir.path().display()),
                }
            });
        }
        let mut evidence = removal::Evidence::default();
        let now = epoch_now();
        for name in names {
            let Some(dir) = gc_one(&root, &name, &args, now, &mut evidence) else {
                continue;
            };
            if args.dry_run {
                println!("would remove {}", dir.path().display());
            } else if tx.send(dir).is_err() {
                break;
            }
        }
        drop(tx);
    });
    Ok(exit::OK)
}

/// How many threads of `gc` remove run dirs at once.
const REMOVERS: usize = 4;

/// The run dir `name` when it is final, old enough and [`removal::may_remove`] agrees; why not
/// on stderr when it cannot be read or may not go.
fn gc_one(
    root: &Root,
    name: &str,
    args: &GcArgs,
    now: f64,
    ev: &mut removal::Evidence,
) -> Option<RunDir> {
    match removal::removable(root, name, now, args.older_than, ev) {
        Ok(found) => found.map(|(dir, _)| dir),
        Err(removal::Kept::Unreadable(why) | removal::Kept::Held { why, .. }) => {
            eprintln!("agent-run: {name}: skipped: {why}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_written_in_parts_is_the_bytes_of_one_pretty_array() {
        let item = |i: usize| json!({"run_id": format!("r{i}"), "labels": {"k": i}, "n": [i]});
        for n in [0, 1, 2, 4095, 4096, 4097, BATCH, BATCH + 1, 2 * BATCH + 3] {
            let items: Vec<Value> = (0..n).map(item).collect();
            let mut out = Vec::new();
            write_pretty_array(&mut out, &items).unwrap();
            let want = serde_json::to_string_pretty(&items).unwrap();
            assert!(String::from_utf8(out).unwrap() == want, "{n} items");
        }
    }
}
