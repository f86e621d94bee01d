//! What the watchdog says: its log lines (stderr, one per thing seen) and the events it adds
//! to a run's journal. Each damage is said once, not once per look.

use crate::assess::{Action, Subject};
use agent_run_shared::root::Root;
use std::time::Duration;

/// One log line on stderr. Under journald (stderr is the stream `$JOURNAL_STREAM` names) the
/// journal stamps it; anywhere else (a terminal, a file, cron's mail) it starts with the time.
pub fn log(msg: &str) {
    match stamped() {
        true => eprintln!(
            "{} agent-run-watchdog: {msg}",
            agent_run_shared::time::rfc3339(std::time::SystemTime::now())
        ),
        false => eprintln!("agent-run-watchdog: {msg}"),
    }
}

/// Whether log lines carry their own time: stderr is not the journal's stream.
fn stamped() -> bool {
    static STAMPED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STAMPED.get_or_init(|| {
        !is_stream(
            std::io::stderr(),
            std::env::var("JOURNAL_STREAM").ok().as_deref(),
        )
    })
}

/// Whether `fd` is the stream `journal_stream` ("DEVICE:INODE", as systemd sets it) names.
fn is_stream(fd: impl std::os::fd::AsFd, journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    // fstat of the descriptor itself: the journal's stream is a socket, which a path like
    // /proc/self/fd/2 cannot open.
    let Ok(st) = rustix::fs::fstat(fd) else {
        return false;
    };
    dev.parse() == Ok(st.st_dev) && ino.parse() == Ok(st.st_ino)
}

/// Say (log and journal) that a run's lease.json is damaged and what the watchdog goes by
/// instead, unless it said so already for the same damage (`said`). True when the damage
/// changed (said now, or repaired).
pub fn report_lease_damage(s: &Subject, said: Option<&str>) -> bool {
    let Some(why) = &s.lease_damaged else {
        return said.is_some();
    };
    if said == Some(why.as_str()) {
        return false;
    }
    let keep = s.seen.last_lease;
    let instead = match keep {
        Some(d) => format!(
            "the watchdog keeps the deadline it last saw while the wrapper lived ({})",
            agent_run_shared::time::rfc3339(
                std::time::UNIX_EPOCH + Duration::from_secs_f64(d.clamp(0.0, 1e11))
            )
        ),
        None => "no deadline was seen: if its wrapper is gone, the run gets the orphan grace"
            .to_string(),
    };
    log(&format!(
        "{}: lease.json is damaged ({why}); {instead}",
        s.id()
    ));
    let j = s.dir.journal("watchdog");
    let _ = j.event(
        "lease_unreadable",
        serde_json::json!({"error": why, "keeping_deadline": keep, "instead": instead}),
    );
    true
}

/// Say (log and journal) that a run's record cannot be read and that the watchdog goes by
/// the kernel's facts instead, unless it said so already for the same damage (`said`). True
/// when the damage changed.
pub fn report_record_damage(s: &Subject, said: Option<&str>) -> bool {
    let Some(why) = &s.record_damaged else {
        return said.is_some();
    };
    if said == Some(why.as_str()) {
        return false;
    }
    log(&format!(
        "{}: status.json cannot be read ({why}); the watchdog goes by the kernel's facts (the \
         run's lock, its cgroup, its marker)",
        s.id()
    ));
    let _ = s
        .dir
        .journal("watchdog")
        .event("record_damaged", serde_json::json!({"error": why}));
    true
}

pub fn describe(s: &Subject, action: Action, r: agent_run_shared::Result<String>) -> String {
    match r {
        Ok(what) => format!("run {}: {action}: {what}", s.id()),
        Err(e) => format!("run {}: {action}: failed: {e}", s.id()),
    }
}

/// Journal why a run dir is skipped, when it is a run dir we may write to (a skipped dir may be
/// unsafe or not ours: then only the log says it).
pub fn journal_once(root: &Root, name: &str, why: &str) {
    let Ok(id) = agent_run_shared::id::RunId::parse(name) else {
        return;
    };
    if let Ok(dir) = root.open_run_dir(&id) {
        let j = dir.journal("watchdog");
        let _ = j.event("skipped", serde_json::json!({"why": why}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_stream_journal_stream_names_is_the_journal_even_a_socket() {
        // The journal's stream is a socket.
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let st = rustix::fs::fstat(&a).expect("fstat");
        let named = format!("{}:{}", st.st_dev, st.st_ino);
        assert!(is_stream(&a, Some(&named)));
        assert!(!is_stream(&b, Some(&named)));
        assert!(!is_stream(
            &a,
            Some(&format!("{}:{}", st.st_dev, st.st_ino + 1))
        ));
        assert!(!is_stream(&a, Some("garbage")));
        assert!(!is_stream(&a, None));
    }
}
