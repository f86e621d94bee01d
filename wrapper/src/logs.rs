//! `agent-run logs` and `agent-run attach`: a run's output, copied as it grows, until its record is
//! final (attach, `logs --follow`) or as far as it goes now (`logs`). Both logs are replayed in
//! the order the keeper wrote them ([`crate::output_order`]), stdout to our stdout and stderr to
//! our stderr. INT (Ctrl-C) on `attach` or `logs -f` detaches: the run goes on.

use crate::cli::{AttachArgs, LogsArgs};
use crate::output_order::Ordered;
use crate::runs::{open_run, read_record};
use crate::stream::{last_lines_at, std_sink, Tail};
use agent_run_shared::exit;
use agent_run_shared::record::Status;
use agent_run_shared::run_dir::{files, RunDir};
use agent_run_shared::signal::Sig;
use agent_run_shared::sys::Inotify;
use agent_run_shared::wrapper::live_wrapper;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `agent-run attach`.
pub fn attach(root: Option<&Path>, args: AttachArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    let int = catch_int()?;
    claim_lost_run(&dir);
    let mut both = Ordered::new(&dir, (args.stdout_from, args.stderr_from));
    let st = follow(&dir, &mut Copier::Both(&mut both), Some(&int))?;
    Ok(st.map_or_else(|| detached(&dir), |st| exit_of(&st)))
}

/// A foreground run whose caller is gone and whose `--on-disconnect DUR` is counting down is
/// kept alive by an attach (or a relaunch, which attaches): tell its wrapper (USR1,
/// journalled) that someone is here.
pub fn claim_lost_run(dir: &RunDir) {
    let Ok(st) = dir.read_status() else {
        return;
    };
    let counting = st.caller_lost_at.is_some()
        && st
            .on_disconnect
            .as_deref()
            .is_some_and(|p| !matches!(p, "keep" | "cancel"));
    if st.state.is_final() || !counting {
        return;
    }
    let journal = dir.journal("attach");
    let _ = journal.event("attach", json!({"claims": "the run whose caller was lost"}));
    // Only a wrapper the kernel confirms (the holder of the run's lock) is woken.
    if let Some(w) = live_wrapper(dir) {
        let _ = agent_run_shared::wrapper::signal_wrapper(
            &w,
            agent_run_shared::stop::Sig::Usr1,
            agent_run_shared::reason::Reason::Attach,
            Some("someone attached within the disconnect grace"),
            &journal,
        );
    }
}

/// Stream both logs from the given offsets until the run is final, then exit as the run did.
pub fn follow_to_end(dir: &RunDir, from: (u64, u64)) -> anyhow::Result<u8> {
    let mut both = Ordered::new(dir, from);
    let st = follow(dir, &mut Copier::Both(&mut both), None)?;
    Ok(st.map_or(exit::SOFTWARE, |st| exit_of(&st)))
}

fn exit_of(st: &Status) -> u8 {
    exit::for_record(st).unwrap_or(exit::SOFTWARE)
}

/// INT sets the returned flag (and interrupts our waits) instead of ending us.
fn catch_int() -> anyhow::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(Sig::Int.number(), Arc::clone(&flag))?;
    Ok(flag)
}

/// INT while following: say so and exit 130; the run goes on.
fn detached(dir: &RunDir) -> u8 {
    crate::human::say(&format!("detached from {} (still running)", dir.id()));
    exit::SIGNAL_BASE + Sig::Int.number() as u8
}

/// What a follower copies: one log to our stdout, or both in their order.
enum Copier<'a> {
    One(&'a mut Tail),
    Both(&'a mut Ordered),
}

impl Copier<'_> {
    /// One pass; `last`: the run is final. Whether any byte moved.
    fn pump(&mut self, last: bool) -> bool {
        match self {
            Copier::One(t) => t.pump(),
            Copier::Both(o) => o.pump(last),
        }
    }
}

/// Copy new bytes until the record is final (then the rest once more), or until `int` is set
/// (`None` returned).
fn follow(
    dir: &RunDir,
    c: &mut Copier,
    int: Option<&AtomicBool>,
) -> anyhow::Result<Option<Status>> {
    let ino = Inotify::new()?;
    ino.add_watch(dir.path(), Inotify::CHANGED | Inotify::MODIFIED)?;
    let stop = || int.is_some_and(|f| f.load(Ordering::SeqCst));
    loop {
        if stop() {
            return Ok(None);
        }
        // Read the record first: once it is final no process of the run writes, so the pump
        // after it reaches the true end of every log.
        let st = read_record(dir)?;
        let last = st.state.is_final();
        while c.pump(last) {
            if stop() {
                return Ok(None);
            }
        }
        if last {
            return Ok(Some(st));
        }
        // An INT interrupts this wait.
        ino.wait(Duration::from_millis(250));
    }
}

/// `agent-run logs`.
pub fn logs(root: Option<&Path>, args: LogsArgs) -> anyhow::Result<u8> {
    let dir = open_run(root, &args.run_id)?;
    if let Some(offset) = args.offset {
        return by_offset(&dir, &args, offset);
    }
    if let (Some(n), false) = (args.tail, args.follow) {
        print_tails(&dir, &args, n);
        return Ok(exit::OK);
    }
    let int = if args.follow {
        Some(catch_int()?)
    } else {
        None
    };
    // With -n, each log from the start of its last N lines.
    let from = |name| args.tail.map_or(0, |n| last_lines_at(&dir, name, n).0);
    let one = match (args.stdout, args.stderr) {
        (_, true) => Some(files::STDERR),
        (true, _) => Some(files::STDOUT),
        _ => None,
    };
    let mut tail;
    let mut both;
    let mut c = match one {
        Some(name) => {
            tail = Tail::new(&dir, name, std_sink(false)).starting_at(from(name));
            Copier::One(&mut tail)
        }
        None => {
            both = Ordered::new(&dir, (from(files::STDOUT), from(files::STDERR)));
            Copier::Both(&mut both)
        }
    };
    if args.follow {
        if follow(&dir, &mut c, int.as_deref())?.is_none() {
            return Ok(detached(&dir));
        }
    } else {
        // As the logs are now: what the index has not named yet comes last.
        while c.pump(true) {}
    }
    Ok(exit::OK)
}

/// `logs -n N` without -f: the last N lines of both logs under a header each (as `tail` shows
/// several files), or of the one asked for.
fn print_tails(dir: &RunDir, args: &LogsArgs, n: usize) {
    use std::io::Write;
    let both = !args.stdout && !args.stderr;
    let mut out = std::io::stdout().lock();
    for (name, wanted) in [(files::STDOUT, !args.stderr), (files::STDERR, !args.stdout)] {
        if !wanted {
            continue;
        }
        let lines = last_lines_at(dir, name, n).1;
        if both {
            let _ = writeln!(out, "==> {} <==", dir.file(name).display());
        }
        let _ = out.write_all(&lines);
        if both && !lines.is_empty() && !lines.ends_with(b"\n") {
            let _ = writeln!(out);
        }
    }
}

/// With --json and no --max-bytes: the most bytes read (as the MCP logs tool's default).
pub const JSON_MAX_BYTES: u64 = 16384;
/// With --json: the largest --max-bytes (the answer is held in memory).
const JSON_MOST: u64 = 64 << 20;

/// `logs --offset N [--max-bytes M] [--json]`: one log from byte N, at most M bytes; raw, or
/// one JSON document with the names of the MCP logs tool's answer.
fn by_offset(dir: &RunDir, args: &LogsArgs, offset: u64) -> anyhow::Result<u8> {
    let (name, stream) = if args.stderr {
        (files::STDERR, "stderr")
    } else {
        (files::STDOUT, "stdout")
    };
    if !args.json {
        let mut t = Tail::new(dir, name, std_sink(false)).starting_at(offset);
        match args.max_bytes {
            Some(m) => {
                t.pump_to(offset.saturating_add(m));
            }
            None => while t.pump() {},
        }
        return Ok(exit::OK);
    }
    // The record first: once final, the size read after it is the log's last.
    let st = read_record(dir)?;
    let max = args.max_bytes.unwrap_or(JSON_MAX_BYTES).min(JSON_MOST);
    let (data, size) = read_at(dir, name, offset, max)?;
    let next = offset + data.len() as u64;
    let text = String::from_utf8_lossy(&data);
    let doc = json!({
        "run_id": dir.id().as_str(),
        "stream": stream,
        "offset": offset,
        "next_offset": next,
        "size": size,
        "more": next < size,
        "final": st.state.is_final(),
        "state": st.state.as_str(),
        "text": text,
        "lossy": matches!(text, std::borrow::Cow::Owned(_)),
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(exit::OK)
}

/// At most `max` bytes of `dir/name` from `offset`, and the log's size after the read (0 and
/// nothing for a missing log). A UTF-8 character cut at the end is left for the next read.
fn read_at(dir: &RunDir, name: &str, offset: u64, max: u64) -> anyhow::Result<(Vec<u8>, u64)> {
    let f = match dir.open_run_file(name) {
        Ok((f, _)) => f,
        Err(agent_run_shared::Error::Missing { .. }) => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e.into()),
    };
    let mut buf = vec![0u8; max as usize];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::pread(&f, &mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
    buf.truncate(got);
    let size = f.metadata()?.len();
    if offset + (got as u64) < size {
        buf.truncate(utf8_cut(&buf));
    }
    Ok((buf, size))
}

/// Where `b` ends without a UTF-8 character cut at its end: `b.len()`, or the start of the
/// cut character (never 0: a read of one broken byte still moves on).
fn utf8_cut(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let c = b[b.len() - back];
        if c & 0xC0 != 0x80 {
            // A lead byte: how long its character is.
            let want = match c {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            let at = b.len() - back;
            return if want > back && at > 0 { at } else { b.len() };
        }
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::utf8_cut;

    #[test]
    fn a_character_cut_at_the_end_is_left_for_the_next_read() {
        assert_eq!(utf8_cut(b"abc"), 3);
        let e = "a\u{e9}".as_bytes(); // a, then two bytes
        assert_eq!(utf8_cut(e), 3);
        assert_eq!(utf8_cut(&e[..2]), 1);
        let euro = "xx\u{20ac}".as_bytes(); // three bytes
        assert_eq!(utf8_cut(&euro[..4]), 2);
        assert_eq!(utf8_cut(&euro[..3]), 2);
        // A lone broken byte moves on.
        assert_eq!(utf8_cut(&euro[2..3]), 1);
    }
}
