//! The output keeper: the one writer of a run's stdout.log and stderr.log.
//!
//! The workload writes into pipes, never into the logs: reopening `/dev/stdout` or `/dev/stderr`
//! by path (`> /dev/stderr`, `tee /dev/stdout`) opens the same pipe, and `O_TRUNC` has nothing
//! to truncate. The keeper is a fork of the wrapper that does not exec (forked while the
//! wrapper is still single-threaded; /proc/PID/cmdline `agent-run __keep DIR`, comm
//! `agent-run-keep`). It runs in its own session and process group, stays in the wrapper's
//! cgroup (never the run's), carries no marker of its run (the wrapper's own environment has
//! none: the workload's `AGENT_RUN_ID`/`AGENT_RUN_DIR` are set only in the workload's), holds
//! no descriptor but its sources, logs, output.idx and journal (never the run's lock; stdio on
//! /dev/null), and ignores INT, HUP, TERM and PIPE (SIG_IGN): it outlives a SIGKILLed wrapper and keeps
//! draining. Nothing stops it; its one signal is a CONT from its wrapper if the run has
//! SIGSTOPped it (`Launch::continue_stopped_keeper`). It ends by EOF: when every writer of
//! every source is gone (the run's processes are dead) it writes its counts to
//! `output.json`, fsyncs the logs and exits 0.
//!
//! Interface (kept stable for the `--pty` work, which passes a pty master as a source):
//!
//! ```text
//! keeper::pipe() -> io::Result<(OwnedFd /*read*/, OwnedFd /*write*/)>  // O_CLOEXEC both
//! keeper::open_logs(dir: &RunDir, sources: Vec<(Stream, OwnedFd)>)
//!     -> anyhow::Result<Vec<(Stream, OwnedFd, File)>>   // each source with its log, opened now
//! keeper::spawn(dir: &RunDir, held: Vec<(Stream, OwnedFd, File)>, policy: &Policy,
//!               notify: Option<OwnedFd> /*write end of a non-blocking pipe*/,
//!               reset_signals: u64 /*sys::nondefault_signals(), after the last handler*/)
//!     -> anyhow::Result<Keeper>            // Keeper { identity: Identity }
//! Stream::{Stdout, Stderr}                 // which log a source feeds (its counts' key)
//! Policy { limit: Option<u64> /*per stream, None = unlimited*/, stop: bool /*--on-output-limit=stop*/ }
//! ```
//!
//! `spawn` opens each stream's log itself (hostile-safe, O_APPEND), forks the keeper with the
//! sources and logs as its only descriptors and returns at once; the caller drops its
//! copies of the sources (read ends) and, right after spawning the workload, of the write ends.
//! A source is drained with splice(2) into the log when it is a pipe, else read(2)/write(2)
//! (a pty master: EIO is its EOF). Every 8 MiB appended to a log it starts that log's
//! writeback (sync_file_range, asynchronous): the fsync at EOF, before output.json, then waits
//! for the last pages instead of a whole gigabyte the page cache was still holding.
//!
//! The order of the appends across the logs goes to `output.idx` ([`crate::output_order`]): one
//! write after each round that appended, before the streamer's wake-up.
//!
//! `notify`, when given, is how the wrapper's streaming thread learns of new bytes: after each
//! round of appends the keeper writes one byte into it (non-blocking: a full pipe already holds
//! a wake-up, so EAGAIN is ignored), and its exit closes it (the streamer reads EOF). Not
//! inotify: closing an inotify instance waits for an SRCU grace period in the kernel
//! (fsnotify_destroy_group), 2 to 20 ms here, and the wrapper would pay it at every exit.
//!
//! At the cap (`--max-output`, per stream) the keeper writes one marker line into that log,
//! keeps draining, counts what it drops and keeps the most recent `min(cap/8, 1 MiB)` bytes in
//! memory, appended after a second marker at EOF. Before the free space of the logs'
//! filesystem falls below a reserve (looked at after every quarter of it written, at most
//! 4 MiB, and no splice runs past a look) it stops writing the same way (`disk reserve`), so a
//! full disk never takes the records of other runs. With `stop`, the
//! first cap asks for the run's stop (reason `output_limit`) through `cancel`'s own code, on a
//! thread, while draining goes on.

use crate::cancel;
use crate::output_order::IndexWriter;
use crate::ring::Ring;
use agent_run_shared::id::RunId;
use agent_run_shared::journal::Journal;
use agent_run_shared::output::{Output, StreamCount, FILE as OUTPUT_FILE};
use agent_run_shared::pid::Identity;
use agent_run_shared::run_dir::{files, RunDir};
use agent_run_shared::signal::Sig;
use agent_run_shared::{procfs, sys};
use anyhow::Context;
use serde_json::json;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The word the keeper's /proc/PID/cmdline carries after `agent-run` (`agent-run __keep DIR`),
/// so `ps` and diagnostics tell it from its wrapper.
pub const MODE: &str = "__keep";

/// Which log a source feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// Its name in counts and markers.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// Its log in the run dir.
    pub fn log(self) -> &'static str {
        match self {
            Stream::Stdout => files::STDOUT,
            Stream::Stderr => files::STDERR,
        }
    }
}

/// What the keeper does at the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Bytes kept per stream; `None`: unlimited.
    pub limit: Option<u64>,
    /// `--on-output-limit=stop`: ask for the run's stop (reason `output_limit`).
    pub stop: bool,
}

/// A started keeper.
#[derive(Debug, Clone, Copy)]
pub struct Keeper {
    pub identity: Identity,
}

/// A pipe, both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from)
}

/// A pipe with both ends close-on-exec and non-blocking: `(read, write)`. The streamer's
/// wake-up pipe: the keeper writes into it after each round of appends (it must never block on
/// a streamer that stalls); the streamer drains it before each look at the logs.
pub fn wake_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pipe::PipeFlags;
    rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).map_err(io::Error::from)
}

/// Each source with its log, created (or opened) now: [`spawn`]'s `held`. The wrapper opens
/// them before the workload's spawn and forks the keeper after it: the logs are ours from
/// before the workload exists, never files it put in their place.
pub fn open_logs(
    dir: &RunDir,
    sources: Vec<(Stream, OwnedFd)>,
) -> anyhow::Result<Vec<(Stream, OwnedFd, File)>> {
    let mut held = Vec::new();
    for (stream, src) in sources {
        let log = dir.open_append(stream.log())?;
        held.push((stream, src, log));
    }
    Ok(held)
}

/// Start the keeper for the run in `dir`, draining each source of `held` into its log
/// ([`open_logs`]).
///
/// The keeper is a fork of the wrapper without an exec ([`sys::fork_helper`]): it runs
/// [`keep`] on the copy of our memory, so a launch pays no second program load. That is sound
/// only while the wrapper is single-threaded: call this before any thread is started (the
/// heartbeat and the streamer start after it, see `launch/spawn.rs`), as a debug assertion checks.
/// The wrapper forks it right after the workload's spawn, where the fork's copy of its page
/// tables runs beside the workload's exec instead of before it.
pub fn spawn(
    dir: &RunDir,
    held: Vec<(Stream, OwnedFd, File)>,
    policy: &Policy,
    notify: Option<OwnedFd>,
    reset_signals: u64,
) -> anyhow::Result<Keeper> {
    use std::os::unix::ffi::OsStrExt;
    let mut keep = Vec::new();
    for (_, src, log) in &held {
        keep.push(src.as_raw_fd());
        keep.push(log.as_raw_fd());
    }
    keep.extend(notify.as_ref().map(AsRawFd::as_raw_fd));
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .context("cannot open /dev/null for the output keeper")?;
    let path = dir.path().to_path_buf();
    let title = [
        b"agent-run".as_slice(),
        MODE.as_bytes(),
        path.as_os_str().as_bytes(),
    ];
    let policy = *policy;
    let body_path = path.clone();
    // INT, HUP and TERM are not our end (EOF is); PIPE: we write files only.
    let ignored = [Sig::Int, Sig::Hup, Sig::Term, Sig::Pipe];
    let pid = sys::fork_helper(
        &keep,
        std::os::fd::AsFd::as_fd(&null),
        &ignored,
        reset_signals,
        c"agent-run-keep",
        &title,
        move || keep_run(body_path, policy, held, notify),
    )
    .context("cannot start the output keeper")?;
    // Our unreaped child: the pid is its own until we wait for it.
    let start_ticks = procfs::stat(pid).map_or(0, |s| s.start_ticks);
    Ok(Keeper {
        identity: Identity { pid, start_ticks },
    })
}

/// Bytes moved per splice or read.
const CHUNK: usize = 1 << 20;
/// The most a stream is drained in one turn before the other gets its turn.
const TURN: u64 = 8 << 20;
/// Bytes appended to a log between two starts of its writeback: the disk writes while the
/// workload runs, and the fsync at EOF waits for the last few MiB, not the whole log.
const WRITEBACK: u64 = 8 << 20;
/// The most the keeper writes into one log under a cap of `limit` bytes: the bytes up to the
/// cap, the kept tail (at most `limit / 8`, at most 1 MiB) and room for the markers. What a
/// follower of the log ([`crate::stream`]) copies at most.
pub fn most_logged(limit: u64) -> u64 {
    limit
        .saturating_add((limit / 8).min(1 << 20))
        .saturating_add(64 << 10)
}

/// The free space kept on the logs' filesystem: 1% of it, at least 1 MiB, at most 64 MiB.
fn reserve_of(total: u64) -> u64 {
    (total / 100).clamp(1 << 20, 64 << 20)
}

struct Source {
    stream: Stream,
    fd: OwnedFd,
    log: File,
    written: u64,
    dropped: u64,
    capped: Option<&'static str>,
    /// The most recent bytes past the cap (`max_output` only).
    ring: Ring,
    eof: bool,
    splice: bool,
    /// Bytes appended since the last start of the log's writeback.
    unflushed: u64,
    /// The log's end after our last append (its size, unless the run truncated it).
    end: u64,
}

/// The keeper's state across its sources.
struct Keep {
    /// The run dir, opened when a file of it is written: the keeper holds only its sources,
    /// its logs, output.idx and the journal.
    dir: PathBuf,
    limit: Option<u64>,
    stop: bool,
    journal: Option<Journal>,
    buf: Vec<u8>,
    /// Bytes written since the last look at the free space, and the next look's threshold.
    since_check: u64,
    check_every: u64,
    stopper: Option<std::thread::JoinHandle<()>>,
    /// The streamer's wake-up pipe (write end, non-blocking), and whether bytes were appended
    /// since the last byte written into it.
    notify: Option<OwnedFd>,
    appended: bool,
    /// output.idx: the order of the appends across the logs.
    index: IndexWriter,
}

/// The keeper's life, in the forked child: drain until every source is at EOF, then write
/// output.json; 0, or 70 (journalled as `keeper_failed`). Its exit is what the wrapper's final
/// record waits for (the pidfd).
fn keep_run(
    dir: PathBuf,
    policy: Policy,
    held: Vec<(Stream, OwnedFd, File)>,
    notify: Option<OwnedFd>,
) -> u8 {
    crate::phases::forked("keeper");
    crate::phases::mark("keeper_forked");
    let code = keep_run_inner(dir, policy, held, notify);
    crate::phases::flush();
    code
}

fn keep_run_inner(
    dir: PathBuf,
    policy: Policy,
    held: Vec<(Stream, OwnedFd, File)>,
    notify: Option<OwnedFd>,
) -> u8 {
    match run(&dir, policy, held, notify) {
        Ok(()) => 0,
        Err(e) => {
            // Nobody reads our stderr (/dev/null); the journal says it.
            if let Ok(d) = open_dir(&dir) {
                let j = d.journal("keeper");
                let _ = j.event("keeper_failed", json!({"error": format!("{e:#}")}));
            }
            70
        }
    }
}

fn run(
    dir: &Path,
    policy: Policy,
    held: Vec<(Stream, OwnedFd, File)>,
    notify: Option<OwnedFd>,
) -> anyhow::Result<()> {
    let Policy { limit, stop } = policy;
    let mut sources = Vec::new();
    for (stream, fd, log) in held {
        prepare_source(&fd);
        // splice(2) refuses an O_APPEND target: the keeper is the logs' only writer, so it
        // appends by seeking to the end before each write instead (a log truncated by path is
        // then written at its new end, never past a hole).
        let splice = rustix::fs::fcntl_setfl(&log, rustix::fs::OFlags::empty()).is_ok();
        let ring = Ring::new(limit.map_or(0, |l| (l / 8).min(1 << 20) as usize));
        sources.push(Source {
            stream,
            fd,
            log,
            written: 0,
            dropped: 0,
            capped: None,
            ring,
            eof: false,
            splice,
            unflushed: 0,
            end: 0,
        });
    }
    // The run dir's own descriptor is dropped once its files are open.
    let run_dir = open_dir(dir).ok();
    let journal = run_dir.as_ref().map(|d| d.journal("keeper"));
    let index = IndexWriter::open(run_dir.as_ref());
    drop(run_dir);
    let mut k = Keep {
        journal,
        index,
        dir: dir.to_path_buf(),
        limit,
        stop,
        buf: Vec::new(),
        since_check: u64::MAX / 2,
        check_every: 4 << 20,
        stopper: None,
        notify,
        appended: false,
    };
    crate::phases::mark("keeper_ready");
    k.drain_all(&mut sources);
    crate::phases::mark("keeper_eof");
    k.finish(&mut sources)
}

/// Non-blocking reads (we poll), and a bigger pipe buffer (fewer wake-ups per MB).
fn prepare_source(fd: &OwnedFd) {
    if let Ok(fl) = rustix::fs::fcntl_getfl(fd) {
        let _ = rustix::fs::fcntl_setfl(fd, fl | rustix::fs::OFlags::NONBLOCK);
    }
    let _ = rustix::pipe::fcntl_setpipe_size(fd, 1 << 20);
}

impl Keep {
    fn drain_all(&mut self, sources: &mut [Source]) {
        use rustix::event::{poll, PollFd, PollFlags};
        loop {
            let live: Vec<usize> = (0..sources.len()).filter(|&i| !sources[i].eof).collect();
            if live.is_empty() {
                return;
            }
            let ready: Vec<bool> = {
                let mut fds: Vec<PollFd> = live
                    .iter()
                    .map(|&i| PollFd::new(&sources[i].fd, PollFlags::IN))
                    .collect();
                match poll(&mut fds, None) {
                    Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                    Err(rustix::io::Errno::INTR) => continue,
                    // Cannot wait (ENOMEM): read every source (one with nothing says EAGAIN).
                    Err(_) => vec![true; live.len()],
                }
            };
            for (j, &i) in live.iter().enumerate() {
                if ready[j] {
                    let s = &mut sources[i];
                    let end = s.end;
                    self.drain(s, TURN);
                    if s.end != end {
                        self.index.note(s.stream, s.end);
                    }
                }
            }
            if self.since_check >= self.check_every {
                self.check_disk(sources);
            }
            self.tell();
        }
    }

    /// Wake the streamer when this round appended: one byte into its pipe. A full pipe holds
    /// a wake-up already (EAGAIN), and a streamer gone (EPIPE: SIGPIPE is ignored here) wants
    /// none; either way nothing waits.
    fn tell(&mut self) {
        if !std::mem::take(&mut self.appended) {
            return;
        }
        // The order first: a streamer woken by the byte finds the records of what it reads.
        self.index.flush();
        if let Some(fd) = &self.notify {
            let _ = rustix::io::write(fd, b"+");
        }
    }

    /// Move what `src` has (up to one turn) into its log. Marks EOF.
    fn drain(&mut self, src: &mut Source, turn: u64) {
        let mut moved = 0u64;
        while moved < turn {
            if src.capped.is_none() {
                let room = self
                    .limit
                    .map_or(u64::MAX, |l| l.saturating_sub(src.written));
                if room > 0 {
                    // Never past the next look at the disk: one splice can move a whole pipe
                    // (1 MiB), the reserve on a small filesystem, and the look that would have
                    // stopped it came after (a 40 MiB tmpfs filled to the last block). The
                    // first chunk goes before the first look, as it always did.
                    let to_check = match self.check_every.checked_sub(self.since_check) {
                        Some(n) if n > 0 => n,
                        _ => CHUNK as u64,
                    };
                    let want = room.min(CHUNK as u64).min(to_check) as usize;
                    match self.write_some(src, want) {
                        Step::Moved(n) => {
                            self.appended |= n > 0;
                            src.written += n as u64;
                            self.since_check += n as u64;
                            moved += n as u64;
                            src.unflushed += n as u64;
                            if src.unflushed >= WRITEBACK {
                                src.unflushed = 0;
                                // Best effort: without it the final fsync does all the work.
                                let _ = sys::start_writeback(std::os::fd::AsFd::as_fd(&src.log));
                            }
                            if self.since_check >= self.check_every {
                                return;
                            }
                        }
                        Step::Again => return,
                        Step::Eof => {
                            src.eof = true;
                            return;
                        }
                        Step::Full(done, lost) => {
                            self.appended |= done > 0;
                            src.written += done as u64;
                            src.dropped += lost as u64;
                            self.cap(src, "disk_full");
                        }
                    }
                    continue;
                }
            }
            // Past the cap (or exactly at it): read, count, keep the most recent bytes.
            self.ensure_buf();
            let n = match read_some(&src.fd, &mut self.buf) {
                Step::Moved(n) => n,
                Step::Again | Step::Full(..) => return,
                Step::Eof => {
                    src.eof = true;
                    return;
                }
            };
            if src.capped.is_none() {
                self.cap(src, "max_output");
            }
            src.dropped += n as u64;
            moved += n as u64;
            if src.capped == Some("max_output") {
                src.ring.push(&self.buf[..n]);
            }
        }
    }

    /// The copy buffer, allocated at its first use: a keeper that only splices (pipes into a
    /// log, every run without --pty under its cap) never maps it.
    fn ensure_buf(&mut self) {
        if self.buf.is_empty() {
            self.buf = vec![0u8; CHUNK];
        }
    }

    /// One splice (or read + write) of up to `want` bytes into the log.
    fn write_some(&mut self, src: &mut Source, want: usize) -> Step {
        if src.splice {
            let at = src.log.seek(SeekFrom::End(0)).unwrap_or(src.end);
            match rustix::pipe::splice(
                &src.fd,
                None,
                &src.log,
                None,
                want,
                rustix::pipe::SpliceFlags::NONBLOCK | rustix::pipe::SpliceFlags::MOVE,
            ) {
                Ok(0) => return Step::Eof,
                Ok(n) => {
                    src.end = at + n as u64;
                    return Step::Moved(n);
                }
                Err(rustix::io::Errno::AGAIN) => return Step::Again,
                Err(rustix::io::Errno::INTR) => return Step::Moved(0),
                Err(rustix::io::Errno::NOSPC | rustix::io::Errno::DQUOT) => {
                    // Nothing moved; the next read counts what the pipe holds as dropped.
                    return Step::Full(0, 0);
                }
                // Not a pipe (a pty master), or a filesystem without splice: plain copies.
                Err(_) => src.splice = false,
            }
        }
        self.ensure_buf();
        let want = want.min(self.buf.len());
        let n = match read_some(&src.fd, &mut self.buf[..want]) {
            Step::Moved(n) => n,
            other => return other,
        };
        let at = src.log.seek(SeekFrom::End(0)).unwrap_or(src.end);
        let mut done = 0;
        while done < n {
            match src.log.write(&self.buf[done..n]) {
                Ok(0) => return Step::Full(done, n - done),
                Ok(k) => {
                    done += k;
                    src.end = at + done as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ENOSPC, EDQUOT, EIO: these bytes are lost to the log; counted.
                Err(_) => return Step::Full(done, n - done),
            }
        }
        Step::Moved(n)
    }

    /// Stop writing `src`: one marker line, once; then ask for the stop if the policy says so.
    fn cap(&mut self, src: &mut Source, why: &'static str) {
        if src.capped.is_some() {
            return;
        }
        src.capped = Some(why);
        let name = src.stream.name();
        let line = match why {
            "max_output" => format!(
                "\n[agent-run: {name} reached --max-output {} bytes; further bytes are dropped and counted]\n",
                self.limit.unwrap_or_default()
            ),
            "disk_reserve" => format!(
                "\n[agent-run: {name} stopped at {} bytes: the disk reserve was reached (little free space); further bytes are dropped and counted]\n",
                src.written
            ),
            _ => format!(
                "\n[agent-run: {name} stopped at {} bytes: the disk is full; further bytes are dropped and counted]\n",
                src.written
            ),
        };
        let at = src.log.seek(SeekFrom::End(0)).unwrap_or(src.end);
        if src.log.write_all(line.as_bytes()).is_ok() {
            src.end = at + line.len() as u64;
            self.index.note(src.stream, src.end);
        }
        self.appended = true;
        if let Some(j) = &self.journal {
            let _ = j.event(
                "output_capped",
                json!({"stream": name, "why": why, "written": src.written, "limit": self.limit}),
            );
        }
        if self.stop && self.stopper.is_none() {
            self.stopper = Some(request_stop(&self.dir));
        }
    }

    /// Look at the logs' filesystem: below the reserve, every stream stops writing.
    fn check_disk(&mut self, sources: &mut [Source]) {
        self.since_check = 0;
        let Some(first) = sources.first() else { return };
        let Ok(vfs) = rustix::fs::fstatvfs(&first.log) else {
            return;
        };
        let unit = vfs.f_frsize.max(1);
        let total = vfs.f_blocks.saturating_mul(unit);
        let free = vfs.f_bavail.saturating_mul(unit);
        let reserve = reserve_of(total);
        // Look again before a quarter of the margin can be used up (every 4 MiB at most).
        self.check_every = (reserve / 4).clamp(64 << 10, 4 << 20);
        if free < reserve {
            for s in sources.iter_mut() {
                if s.capped.is_none() {
                    self.cap(s, "disk_reserve");
                }
            }
        }
    }

    /// Every source is at EOF: the ring tails, fsync, output.json, and the stop thread.
    fn finish(&mut self, sources: &mut [Source]) -> anyhow::Result<()> {
        for s in sources.iter_mut() {
            if !s.ring.is_empty() && s.capped == Some("max_output") {
                let kept = s.ring.len() as u64;
                let line = format!(
                    "\n[agent-run: {}: {} bytes dropped above; the last {kept} bytes follow]\n",
                    s.stream.name(),
                    s.dropped - kept
                );
                let (a, b) = s.ring.halves();
                let at = s.log.seek(SeekFrom::End(0)).unwrap_or(s.end);
                let ok = s.log.write_all(line.as_bytes()).is_ok()
                    && s.log.write_all(a).is_ok()
                    && s.log.write_all(b).is_ok();
                if ok {
                    s.dropped -= kept;
                    s.written += kept;
                    s.end = at + line.len() as u64 + kept;
                    self.index.note(s.stream, s.end);
                }
            }
            // Durable before the counts appear. A log we never wrote costs no fsync (a new empty
            // file's would be a journal commit for nothing: most of a short run's end).
            if s.written > 0 || s.capped.is_some() {
                if agent_run_shared::fault::armed(agent_run_shared::fault::SLOW_LOG_FSYNC) {
                    std::thread::sleep(std::time::Duration::from_secs(5));
                }
                let _ = s.log.sync_data();
            }
        }
        self.index.flush();
        let count = |st: Stream| {
            sources.iter().find(|s| s.stream == st).map_or_else(
                || StreamCount {
                    written: Some(0),
                    dropped: Some(0),
                    capped: None,
                },
                |s| StreamCount {
                    written: Some(s.written),
                    dropped: Some(s.dropped),
                    capped: s.capped.map(str::to_string),
                },
            )
        };
        let out = Output {
            stdout: count(Stream::Stdout),
            stderr: count(Stream::Stderr),
            limit: self.limit,
            on_limit: Some(if self.stop { "stop" } else { "keep" }.into()),
            complete: true,
            settled: false,
        };
        let bytes = serde_json::to_vec(&out).expect("counts serialize");
        // Not fsynced itself: the final record that copies these counts is.
        let written =
            open_dir(&self.dir).and_then(|d| Ok(d.write_atomic(OUTPUT_FILE, &bytes, false)?));
        if let Some(j) = &self.journal {
            let _ = j.event(
                "keeper_done",
                json!({"stdout": out.stdout, "stderr": out.stderr, "error": written.as_ref().err().map(|e| e.to_string())}),
            );
        }
        // A stop we asked for is asked before our done: the thread returns once the wrapper
        // is signalled (`Until::Asked`, milliseconds), never waiting for the final record,
        // which waits for our done. Waiting for it held every such stop up by the wrapper's
        // whole keeper wait (2 s). A takeover (the wrapper gone) runs to its end: nobody
        // waits for our done then.
        if let Some(t) = self.stopper.take() {
            let _ = t.join();
        }
        written
    }
}

enum Step {
    Moved(usize),
    Again,
    Eof,
    /// The log's filesystem refused bytes: (written, lost) of those read from the source.
    Full(usize, usize),
}

/// One read from a source. A pty master says EIO once its last slave is closed: EOF.
fn read_some(fd: &OwnedFd, buf: &mut [u8]) -> Step {
    match rustix::io::read(fd, buf) {
        Ok(0) => Step::Eof,
        Ok(n) => Step::Moved(n),
        Err(rustix::io::Errno::AGAIN) => Step::Again,
        Err(rustix::io::Errno::INTR) => Step::Moved(0),
        Err(_) => Step::Eof,
    }
}

/// The run dir the wrapper named on our command line, held and checked as the wrapper holds it.
fn open_dir(path: &Path) -> anyhow::Result<RunDir> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    Ok(RunDir::open(path, RunId::parse(name)?)?)
}

/// Ask for the run's stop with reason `output_limit`, as `agent-run cancel` does (cancel.json
/// and a TERM to a live wrapper; the takeover when it is gone), on a thread that returns once
/// the stop is asked for ([`cancel::Until::Asked`]), not with the final record.
fn request_stop(dir: &Path) -> std::thread::JoinHandle<()> {
    let Ok(dir) = open_dir(dir) else {
        return std::thread::spawn(|| {});
    };
    std::thread::spawn(move || {
        let Some(root) = dir.path().parent() else {
            return;
        };
        let id = dir.id().as_str();
        let until = cancel::Until::Asked;
        let reason = agent_run_shared::reason::Reason::OutputLimit;
        let r = cancel::cancel_one_for(Some(root), id, None, "keeper", reason, until);
        if let Err(e) = r {
            let j = dir.journal("keeper");
            let _ = j.event("stop_request_failed", json!({"error": format!("{e:#}")}));
        }
    })
}
