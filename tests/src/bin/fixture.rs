//! `fixture`: the workload of agent-run's black-box tests.
//!
//! It builds real process trees (children, grandchildren, setsid escapees, TERM/HUP ignorers and
//! loggers), prints one `ready ...` line once every process is in place, and parks; or it reports
//! the kernel facts a workload inherits (`env`), exits, dies by a signal, writes output or records
//! that it ran. It never sleeps to synchronise: descendants report their pids over a pipe, and the
//! leader prints the ready line only when it has all of them.
//!
//! The signal handlers installed by `log-exit` / `log-stay` call write(2) and _exit(2) only; the
//! line they write is formatted in advance, per process, while TERM and HUP are blocked.

use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use agent_run_tests::proc_stat;

const USAGE: &str = "usage: fixture tree [--children N] [--grandchildren] [--escapee] \
[--leader-term MODE] [--leader-hup MODE] [--member-term MODE] [--member-hup MODE] [--log FILE] \
[--leader-exit CODE]
       fixture env | exit CODE | signal SIGNUM | sleep-ms MS | count FILE
       fixture spew BYTES [--stderr-bytes N] [--chunk N]
       fixture zombie-leader | hopper | nondumpable-daemon | fork-loop
       fixture grab-parent-pipes (FORGE_BYTES | fill) (spew BYTES | hold | orphan-exit-127)
       fixture hold-dir-locks (directories on stdin, a blank line after each batch)
MODE is default, ignore, log-exit or log-stay";

/// Byte i of a `spew` stream is `PATTERN[i % PATTERN.len()]`.
const PATTERN: &[u8; 37] = b"0123456789abcdefghijklmnopqrstuvwxyz\n";

/// Why the fixture gave up: bad usage exits 2, anything else 1.
enum Failure {
    Usage(String),
    Runtime(String),
}

fn usage(msg: impl Into<String>) -> Failure {
    Failure::Usage(msg.into())
}

fn runtime(msg: impl Into<String>) -> Failure {
    Failure::Runtime(msg.into())
}

fn main() {
    restore_inherited_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match run(&args) {
        Ok(code) => code,
        Err(Failure::Usage(msg)) => {
            eprintln!("fixture: {msg}\n{USAGE}");
            2
        }
        Err(Failure::Runtime(msg)) => {
            eprintln!("fixture: {msg}");
            1
        }
    };
    std::process::exit(code)
}

fn run(args: &[String]) -> Result<i32, Failure> {
    let Some((mode, rest)) = args.split_first() else {
        return Err(usage("missing mode"));
    };
    match mode.as_str() {
        "tree" => tree(TreeOpts::parse(rest)?),
        "env" => {
            no_more(rest)?;
            env_report()
        }
        "exit" => {
            let [code] = rest else {
                return Err(usage("exit takes one CODE"));
            };
            number("exit code", code)
        }
        "signal" => {
            let [signum] = rest else {
                return Err(usage("signal takes one SIGNUM"));
            };
            die_by_signal(number("signal number", signum)?)
        }
        "spew" => spew(rest),
        "zombie-leader" => {
            no_more(rest)?;
            zombie_leader()
        }
        "hopper" => {
            no_more(rest)?;
            hopper()
        }
        "nondumpable-daemon" => {
            no_more(rest)?;
            nondumpable_daemon()
        }
        "fork-loop" => match rest {
            [] => fork_loop(false),
            [s] if s == "setsid" => fork_loop(true),
            _ => Err(usage("fork-loop takes nothing or `setsid`")),
        },
        "grab-parent-pipes" => grab_parent_pipes(rest),
        "hold-dir-locks" => {
            no_more(rest)?;
            hold_dir_locks()
        }
        "sleep-ms" => {
            let [ms] = rest else {
                return Err(usage("sleep-ms takes one MS"));
            };
            std::thread::sleep(Duration::from_millis(number("milliseconds", ms)?));
            Ok(0)
        }
        "count" => {
            let [file] = rest else {
                return Err(usage("count takes one FILE"));
            };
            let mut f = OpenOptions::new()
                .append(true)
                .create(true)
                .open(file)
                .map_err(|e| runtime(format!("cannot open {file}: {e}")))?;
            f.write_all(b"ran\n")
                .map_err(|e| runtime(format!("cannot write {file}: {e}")))?;
            Ok(0)
        }
        other => Err(usage(format!("unknown mode {other:?}"))),
    }
}

fn number<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, Failure> {
    text.parse()
        .map_err(|_| usage(format!("bad {what}: {text:?}")))
}

fn no_more(rest: &[String]) -> Result<(), Failure> {
    match rest.first() {
        Some(extra) => Err(usage(format!("unexpected argument {extra:?}"))),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// SIGPIPE: Rust's runtime sets it to SIG_IGN before main. A workload must see what it inherited
// (the `env` report is how tests check that agent-run leaks no ignored signal), so the
// disposition is captured by an .init_array constructor, which runs before Rust's runtime.

const SIGPIPE_UNKNOWN: u8 = 0;
const SIGPIPE_DEFAULT: u8 = 1;
const SIGPIPE_OTHER: u8 = 2;

static INHERITED_SIGPIPE: AtomicU8 = AtomicU8::new(SIGPIPE_UNKNOWN);

#[used]
#[link_section = ".init_array"]
static CAPTURE_SIGPIPE: extern "C" fn() = capture_sigpipe;

extern "C" fn capture_sigpipe() {
    // SAFETY: sigaction is plain data; all-zero is a valid value for the kernel to overwrite.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sigaction(2) with a null new action only reads the current disposition into `old`.
    if unsafe { libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) } == 0 {
        let state = if old.sa_sigaction == libc::SIG_DFL {
            SIGPIPE_DEFAULT
        } else {
            SIGPIPE_OTHER
        };
        INHERITED_SIGPIPE.store(state, Ordering::Relaxed);
    }
}

fn restore_inherited_sigpipe() {
    if INHERITED_SIGPIPE.load(Ordering::Relaxed) == SIGPIPE_DEFAULT {
        // Failure is impossible for a valid signal number and SIG_DFL.
        let _ = set_disposition(libc::SIGPIPE, Mode::Default);
    }
}

// ---------------------------------------------------------------------------------------------
// Signal dispositions and the logging handlers.

/// How a process handles SIGTERM or SIGHUP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Default,
    Ignore,
    LogExit,
    LogStay,
}

impl Mode {
    fn parse(text: &str) -> Result<Mode, Failure> {
        match text {
            "default" => Ok(Mode::Default),
            "ignore" => Ok(Mode::Ignore),
            "log-exit" => Ok(Mode::LogExit),
            "log-stay" => Ok(Mode::LogStay),
            _ => Err(usage(format!("bad signal mode {text:?}"))),
        }
    }

    fn logs(self) -> bool {
        matches!(self, Mode::LogExit | Mode::LogStay)
    }
}

const LINE_CAP: usize = 64;

/// One pre-formatted log line, readable from a signal handler (atomics are lock-free).
struct Line {
    len: AtomicUsize,
    bytes: [AtomicU8; LINE_CAP],
}

impl Line {
    const fn new() -> Line {
        Line {
            len: AtomicUsize::new(0),
            bytes: [const { AtomicU8::new(0) }; LINE_CAP],
        }
    }

    /// Only called while TERM and HUP are blocked, so no handler sees a half-written line.
    fn set(&self, text: &str) {
        let text = &text.as_bytes()[..text.len().min(LINE_CAP)];
        for (slot, byte) in self.bytes.iter().zip(text) {
            slot.store(*byte, Ordering::Relaxed);
        }
        self.len.store(text.len(), Ordering::Relaxed);
    }
}

static TERM_LINE: Line = Line::new();
static HUP_LINE: Line = Line::new();
static LOG_FD: AtomicI32 = AtomicI32::new(-1);

/// Appends this process's line for `signo` to the log with one write(2). Async-signal-safe.
fn append_log_line(signo: c_int) {
    let line = if signo == libc::SIGTERM {
        &TERM_LINE
    } else {
        &HUP_LINE
    };
    let mut buf = [0u8; LINE_CAP];
    let len = line.len.load(Ordering::Relaxed);
    for (byte, slot) in buf.iter_mut().zip(&line.bytes).take(len) {
        *byte = slot.load(Ordering::Relaxed);
    }
    let fd = LOG_FD.load(Ordering::Relaxed);
    if fd >= 0 && len > 0 {
        // SAFETY: write(2) is async-signal-safe; `buf` is a live stack buffer of `len` bytes.
        unsafe { libc::write(fd, buf.as_ptr().cast(), len) };
    }
}

extern "C" fn log_then_exit(signo: c_int) {
    append_log_line(signo);
    // SAFETY: _exit(2) is async-signal-safe and does not return.
    unsafe { libc::_exit(128 + signo) }
}

extern "C" fn log_then_stay(signo: c_int) {
    // SAFETY: __errno_location() returns this thread's errno slot, valid for the thread's life;
    // restoring it keeps the interrupted code's errno intact.
    let saved = unsafe { *libc::__errno_location() };
    append_log_line(signo);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

fn set_disposition(signo: c_int, mode: Mode) -> Result<(), Failure> {
    let handler = match mode {
        Mode::Default => libc::SIG_DFL,
        Mode::Ignore => libc::SIG_IGN,
        Mode::LogExit => log_then_exit as extern "C" fn(c_int) as libc::sighandler_t,
        Mode::LogStay => log_then_stay as extern "C" fn(c_int) as libc::sighandler_t,
    };
    // SAFETY: sigaction is plain data; all-zero means an empty sa_mask and no flags.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    // Restart the leader's pipe reads when a log-stay handler runs.
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: sigaction(2) with a valid action; the handlers are async-signal-safe (see above).
    if unsafe { libc::sigaction(signo, &action, std::ptr::null_mut()) } != 0 {
        return Err(runtime(format!(
            "sigaction({signo}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Blocks (`SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) the given signals in this process.
fn mask_signals(how: c_int, signals: &[c_int]) {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset(3) before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; sigprocmask(2) only reads it. Errors are impossible for
    // valid `how` and signal numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        for &signo in signals {
            libc::sigaddset(&mut set, signo);
        }
        libc::sigprocmask(how, &set, std::ptr::null_mut());
    }
}

const STOP_SIGNALS: [c_int; 2] = [libc::SIGTERM, libc::SIGHUP];

/// Gives this process its role: the line its handlers log, and its TERM/HUP dispositions.
/// Called with TERM and HUP blocked, right after fork (or at the start, for the leader).
fn take_role(role: &str, term: Mode, hup: Mode) -> Result<(), Failure> {
    let pid = std::process::id();
    TERM_LINE.set(&format!("{role} {pid} TERM\n"));
    HUP_LINE.set(&format!("{role} {pid} HUP\n"));
    set_disposition(libc::SIGTERM, term)?;
    set_disposition(libc::SIGHUP, hup)
}

// ---------------------------------------------------------------------------------------------
// tree

struct TreeOpts {
    children: u32,
    grandchildren: bool,
    escapee: bool,
    leader_term: Mode,
    leader_hup: Mode,
    member_term: Mode,
    member_hup: Mode,
    log: Option<PathBuf>,
    leader_exit: Option<i32>,
}

impl TreeOpts {
    fn parse(args: &[String]) -> Result<TreeOpts, Failure> {
        let mut opts = TreeOpts {
            children: 1,
            grandchildren: false,
            escapee: false,
            leader_term: Mode::Default,
            leader_hup: Mode::Default,
            member_term: Mode::Default,
            member_hup: Mode::Default,
            log: None,
            leader_exit: None,
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .map(String::as_str)
                    .ok_or_else(|| usage(format!("{flag} needs a value")))
            };
            match flag.as_str() {
                "--children" => opts.children = number("child count", value()?)?,
                "--grandchildren" => opts.grandchildren = true,
                "--escapee" => opts.escapee = true,
                "--leader-term" => opts.leader_term = Mode::parse(value()?)?,
                "--leader-hup" => opts.leader_hup = Mode::parse(value()?)?,
                "--member-term" => opts.member_term = Mode::parse(value()?)?,
                "--member-hup" => opts.member_hup = Mode::parse(value()?)?,
                "--log" => opts.log = Some(PathBuf::from(value()?)),
                "--leader-exit" => opts.leader_exit = Some(number("exit code", value()?)?),
                other => return Err(usage(format!("unknown tree option {other:?}"))),
            }
        }
        let modes = [
            opts.leader_term,
            opts.leader_hup,
            opts.member_term,
            opts.member_hup,
        ];
        if opts.log.is_none() && modes.iter().any(|m| m.logs()) {
            return Err(usage("log-exit and log-stay need --log FILE"));
        }
        Ok(opts)
    }

    fn expected_members(&self) -> usize {
        let grandchildren = if self.grandchildren { self.children } else { 0 };
        (self.children + grandchildren) as usize + usize::from(self.escapee)
    }
}

enum Forked {
    Child,
    Parent(libc::pid_t),
}

fn fork() -> Result<Forked, Failure> {
    // SAFETY: the fixture never starts a thread, so the child is a complete copy of a
    // single-threaded process and may go on running ordinary Rust code.
    match unsafe { libc::fork() } {
        -1 => Err(runtime(format!(
            "fork: {}",
            std::io::Error::last_os_error()
        ))),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

fn park() -> ! {
    loop {
        // SAFETY: pause(2) has no preconditions; it returns after each handled signal.
        unsafe { libc::pause() };
    }
}

/// Writes `pid\n` (or `error ...\n`) to the leader's pipe in one write(2): atomic, being
/// shorter than PIPE_BUF.
fn report(mut pipe: &File, message: &str) {
    let _ = pipe.write_all(message.as_bytes());
}

/// The life of a descendant once it has its role: unblock, report, park. On failure it reports
/// an error line, so the leader fails instead of waiting forever.
fn settle(role: &str, opts: &TreeOpts, pipe: &File) -> ! {
    if let Err(Failure::Usage(msg) | Failure::Runtime(msg)) =
        take_role(role, opts.member_term, opts.member_hup)
    {
        report(pipe, &format!("error {role}: {msg}\n"));
        std::process::exit(1);
    }
    mask_signals(libc::SIG_UNBLOCK, &STOP_SIGNALS);
    report(pipe, &format!("{}\n", std::process::id()));
    park()
}

/// Forks one child (and its grandchild). Returns in the leader only.
fn fork_child(opts: &TreeOpts, pipe: &File) -> Result<(), Failure> {
    if let Forked::Parent(_) = fork()? {
        return Ok(());
    }
    if opts.grandchildren {
        match fork() {
            Ok(Forked::Child) => settle("grandchild", opts, pipe),
            Ok(Forked::Parent(_)) => {}
            Err(Failure::Usage(msg) | Failure::Runtime(msg)) => {
                report(pipe, &format!("error child: {msg}\n"));
            }
        }
    }
    settle("child", opts, pipe)
}

/// Forks an intermediate that calls setsid(2), forks the escapee and exits at once, so the
/// escapee lives in a new session and is reparented to the nearest subreaper. The leader reaps
/// the intermediate.
fn fork_escapee(opts: &TreeOpts, pipe: &File) -> Result<(), Failure> {
    let intermediate = match fork()? {
        Forked::Parent(pid) => pid,
        Forked::Child => {
            // SAFETY: setsid(2) has no preconditions; it fails only for a group leader, which a
            // fresh child is not.
            if unsafe { libc::setsid() } == -1 {
                let err = std::io::Error::last_os_error();
                report(pipe, &format!("error intermediate: setsid: {err}\n"));
            } else {
                match fork() {
                    Ok(Forked::Child) => settle("escapee", opts, pipe),
                    Ok(Forked::Parent(_)) => {}
                    Err(Failure::Usage(msg) | Failure::Runtime(msg)) => {
                        report(pipe, &format!("error intermediate: {msg}\n"));
                    }
                }
            }
            // SAFETY: _exit(2) ends the intermediate without running the leader's exit path.
            unsafe { libc::_exit(0) }
        }
    };
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child with a valid status pointer.
    if unsafe { libc::waitpid(intermediate, &mut status, 0) } == -1 {
        let err = std::io::Error::last_os_error();
        return Err(runtime(format!("waitpid({intermediate}): {err}")));
    }
    Ok(())
}

fn pid_pipe() -> Result<(File, File), Failure> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2(2) writes two fds into a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        let err = std::io::Error::last_os_error();
        return Err(runtime(format!("pipe2: {err}")));
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((File::from(read), File::from(write)))
}

/// Reads `count` pid lines from the pipe.
fn collect_members(mut pipe: File, count: usize) -> Result<Vec<i32>, Failure> {
    let mut text = String::new();
    let mut buf = [0u8; 512];
    while text.matches('\n').count() < count {
        let n = pipe
            .read(&mut buf)
            .map_err(|e| runtime(format!("reading member pids: {e}")))?;
        if n == 0 {
            return Err(runtime("member pid pipe closed early"));
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let mut members = Vec::with_capacity(count);
    for line in text.lines() {
        let pid = line
            .parse()
            .map_err(|_| runtime(format!("a descendant failed: {line}")))?;
        members.push(pid);
    }
    members.sort_unstable();
    Ok(members)
}

fn tree(opts: TreeOpts) -> Result<i32, Failure> {
    if let Some(path) = &opts.log {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| runtime(format!("cannot open log {}: {e}", path.display())))?;
        // Deliberately leaked: every process of the tree logs to it until it dies.
        LOG_FD.store(file.into_raw_fd(), Ordering::Relaxed);
    }
    let (read_end, write_end) = pid_pipe()?;
    // Blocked from here until each process has its role, so no signal meets a half-set process.
    mask_signals(libc::SIG_BLOCK, &STOP_SIGNALS);
    take_role("leader", opts.leader_term, opts.leader_hup)?;
    for _ in 0..opts.children {
        fork_child(&opts, &write_end)?;
    }
    if opts.escapee {
        fork_escapee(&opts, &write_end)?;
    }
    drop(write_end);
    mask_signals(libc::SIG_UNBLOCK, &STOP_SIGNALS);
    let members = collect_members(read_end, opts.expected_members())?;

    let me = std::process::id() as i32;
    let (_, _, pgid, sid, _) =
        proc_stat(me).ok_or_else(|| runtime("cannot read /proc/self/stat"))?;
    let members: Vec<String> = members.iter().map(i32::to_string).collect();
    let line = format!(
        "ready pid={me} pgid={pgid} sid={sid} members={}\n",
        members.join(",")
    );
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(line.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| runtime(format!("cannot write the ready line: {e}")))?;
    drop(stdout);
    match opts.leader_exit {
        Some(code) => Ok(code),
        None => park(),
    }
}

// ---------------------------------------------------------------------------------------------
// env, signal, spew

fn env_report() -> Result<i32, Failure> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| runtime(format!("cannot read /proc/self/status: {e}")))?;
    let mut out = String::new();
    for line in status.lines() {
        if line.starts_with("SigBlk:") || line.starts_with("SigIgn:") {
            out.push_str(line);
            out.push('\n');
        }
    }
    let fds: Vec<String> = open_fds()?.iter().map(i32::to_string).collect();
    out.push_str(&format!("fds: {}\n", fds.join(",")));
    for name in ["AGENT_RUN_ID", "AGENT_RUN_DIR"] {
        let value = std::env::var_os(name).unwrap_or_default();
        out.push_str(&format!("{name}={}\n", value.to_string_lossy()));
    }
    let me = std::process::id() as i32;
    let (_, _, pgid, sid, _) =
        proc_stat(me).ok_or_else(|| runtime("cannot read /proc/self/stat"))?;
    out.push_str(&format!("pid={me} pgid={pgid} sid={sid}\n"));
    std::io::stdout()
        .write_all(out.as_bytes())
        .map_err(|e| runtime(format!("cannot write stdout: {e}")))?;
    Ok(0)
}

/// The fds open in this process, without the one used to list them.
fn open_fds() -> Result<Vec<i32>, Failure> {
    let names: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| runtime(format!("cannot list /proc/self/fd: {e}")))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    // The listing's own fd is closed now, so its link no longer resolves; should a number be
    // reused meanwhile, a link to the fd dir itself is dropped too.
    let fd_dir = PathBuf::from(format!("/proc/{}/fd", std::process::id()));
    let mut fds: Vec<i32> = names
        .iter()
        .filter_map(|name| {
            let fd = name.parse().ok()?;
            let target = std::fs::read_link(format!("/proc/self/fd/{name}")).ok()?;
            (target != fd_dir).then_some(fd)
        })
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

fn die_by_signal(signo: c_int) -> Result<i32, Failure> {
    // SAFETY: signal(2) with SIG_DFL installs no handler; an invalid number only returns SIG_ERR.
    unsafe { libc::signal(signo, libc::SIG_DFL) };
    mask_signals(libc::SIG_UNBLOCK, &[signo]);
    // SAFETY: raise(3) has no preconditions.
    unsafe { libc::raise(signo) };
    Err(runtime(format!("signal {signo} did not end the process")))
}

/// Writes `buf` to `fd` with as few write(2) calls as the kernel allows (std's stdout would
/// re-chunk at newlines).
fn write_fd(fd: c_int, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: write(2) from a live slice of buf.len() bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

fn spew(args: &[String]) -> Result<i32, Failure> {
    let (bytes, rest) = args
        .split_first()
        .ok_or_else(|| usage("spew takes BYTES"))?;
    let mut remaining: [(c_int, u64); 2] = [(1, number("byte count", bytes)?), (2, 0)];
    let mut chunk: usize = 4096;
    let mut rest = rest.iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| usage(format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--stderr-bytes" => remaining[1].1 = number("byte count", value)?,
            "--chunk" => chunk = number("chunk size", value)?,
            other => return Err(usage(format!("unknown spew option {other:?}"))),
        }
    }
    if chunk == 0 {
        return Err(usage("chunk size must be positive"));
    }
    let mut written = [0u64; 2];
    let mut buf = Vec::with_capacity(chunk);
    // Alternate between the streams, one chunk each, until both are done.
    while remaining.iter().any(|&(_, left)| left > 0) {
        for (i, (fd, left)) in remaining.iter_mut().enumerate() {
            let n = (*left).min(chunk as u64);
            if n == 0 {
                continue;
            }
            buf.clear();
            buf.extend((written[i]..written[i] + n).map(|k| PATTERN[(k % 37) as usize]));
            write_fd(*fd, &buf).map_err(|e| runtime(format!("cannot write fd {fd}: {e}")))?;
            written[i] += n;
            *left -= n;
        }
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// Workloads that hide from scans

/// A leader whose main thread exits (`SYS_exit`) while another thread runs on, printing
/// `tick` every 100 ms: /proc shows the leader `Z` with 2 threads, and it is alive.
fn zombie_leader() -> Result<i32, Failure> {
    let me = std::process::id();
    println!("ready pid={me} pgid={me} sid={me} members=");
    std::thread::spawn(|| loop {
        let _ = write_fd(1, b"tick\n");
        std::thread::sleep(Duration::from_millis(100));
    });
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: SYS_exit ends only the calling thread; the other thread keeps the process alive.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("SYS_exit returned")
}

/// TERM and HUP ignored; then forever: fork, the parent exits at once, the child starts a new
/// session. The run's processes are one pid after another, never the same for long.
fn hopper() -> Result<i32, Failure> {
    set_disposition(libc::SIGTERM, Mode::Ignore)?;
    set_disposition(libc::SIGHUP, Mode::Ignore)?;
    let _ = write_fd(
        1,
        format!("hopping from {}\n", std::process::id()).as_bytes(),
    );
    loop {
        // SAFETY: single-threaded; the child only calls setsid and loops, the parent _exits.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: setsid has no preconditions.
                unsafe { libc::setsid() };
            }
            -1 => std::thread::sleep(Duration::from_millis(1)),
            // SAFETY: _exit ends the process without running anything else.
            _ => unsafe { libc::_exit(0) },
        }
    }
}

/// Double-forks a daemon in a session of its own that makes itself non-dumpable (as ssh-agent
/// does: its environment is then unreadable to its own user), prints
/// `ready pid=<daemon> ...` and exits; the daemon parks.
fn nondumpable_daemon() -> Result<i32, Failure> {
    let (read, write) = pid_pipe()?;
    match fork()? {
        Forked::Parent(_) => {
            drop(write);
            let pids = collect_members(read, 1)?;
            let d = pids[0];
            println!("ready pid={d} pgid={d} sid={d} members=");
            Ok(0)
        }
        Forked::Child => {
            drop(read);
            // SAFETY: setsid has no preconditions.
            unsafe { libc::setsid() };
            match fork() {
                Ok(Forked::Parent(_)) => std::process::exit(0),
                Ok(Forked::Child) => {
                    // SAFETY: prctl with integer arguments only.
                    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
                    report(&write, &format!("{}\n", std::process::id()));
                    drop(write);
                    park()
                }
                Err(_) => std::process::exit(1),
            }
        }
    }
}

/// TERM and HUP ignored; forks a child every 2 ms (children ignore them too and sleep), up to
/// 2000 children: a stop meets new members all the time until KILL. With `setsid`, each child
/// starts a session of its own: no signal to the loop's group reaches it, only one to itself.
fn fork_loop(setsid: bool) -> Result<i32, Failure> {
    set_disposition(libc::SIGTERM, Mode::Ignore)?;
    set_disposition(libc::SIGHUP, Mode::Ignore)?;
    let me = std::process::id();
    println!("ready pid={me} pgid={me} sid={me} members=");
    for _ in 0..2000 {
        if let Forked::Child = fork()? {
            if setsid {
                // SAFETY: setsid(2) has no preconditions.
                unsafe { libc::setsid() };
            }
            park();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    park()
}

/// The hostile workload of a same-user attack on its wrapper: open a write end of every pipe
/// the parent holds (through /proc/PPID/fd, as anyone of the same user may while the parent is
/// dumpable), except the pipes of our own stdout and stderr, and write FORGE_BYTES bytes into
/// each, once per pipe (8: a whole spawn report, step 8 (the exec) errno ENOENT; 4: half of one;
/// `fill`: whole reports until the pipe is full, holding a read end of each too, never read). Those ends stay open
/// while the fixture goes on: `spew BYTES` writes BYTES pattern bytes to stdout (as `spew`) and
/// exits 0; `hold` sleeps 300 s (prints `holding` on stderr first); `orphan-exit-127` forks a child that sleeps 300 s, prints `orphan pid=PID` and
/// exits 127, as a child whose exec failed does. Prints `grabbed N pipes` on stderr.
fn grab_parent_pipes(args: &[String]) -> Result<i32, Failure> {
    // `fill`: as many report copies as each pipe takes, until it is full.
    let (forge, fill, then) = match args {
        [forge, then @ ..] if forge == "fill" => (8, true, then),
        [forge, then @ ..] => (number::<usize>("forge bytes", forge)?, false, then),
        _ => return Err(usage("grab-parent-pipes takes FORGE_BYTES and what then")),
    };
    if forge > 8 {
        return Err(usage("FORGE_BYTES is at most 8 (or `fill`)"));
    }
    let link = |p: &str| {
        std::fs::read_link(p)
            .ok()
            .map(|l| l.to_string_lossy().into_owned())
    };
    let own: Vec<String> = ["/proc/self/fd/1", "/proc/self/fd/2"]
        .iter()
        .filter_map(|p| link(p))
        .collect();
    let ppid = std::os::unix::process::parent_id();
    let dir = format!("/proc/{ppid}/fd");
    let entries =
        std::fs::read_dir(&dir).map_err(|e| runtime(format!("cannot list {dir}: {e}")))?;
    // The parent may hold pipes it inherited whose readers are gone (a CI runner's): a write
    // there is EPIPE, not our death.
    set_disposition(libc::SIGPIPE, Mode::Ignore)?;
    let report: [u8; 8] = [8, 0, 0, 0, libc::ENOENT as u8, 0, 0, 0];
    let mut held = Vec::new();
    let mut seen = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(target) = link(&path.to_string_lossy()) else {
            continue;
        };
        // Each pipe once (the parent may hold both its ends).
        if !target.starts_with("pipe:") || own.contains(&target) || seen.contains(&target) {
            continue;
        }
        seen.push(target);
        let Ok(mut f) = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let _ = f.write(&report[..forge]);
        // Non-blocking: full at EAGAIN (a pipe without readers says EPIPE at once). A read end
        // of ours, never read, keeps it full after its own reader has gone.
        if fill {
            if let Ok(r) = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
            {
                held.push(r);
            }
            // At most 1 MiB (the largest pipe here): a pipe someone drains never fills.
            for _ in 0..(1 << 17) {
                if f.write(&report).is_err() {
                    break;
                }
            }
        }
        held.push(f);
    }
    eprintln!("grabbed {} pipes", held.len());
    let code = match then {
        [mode, bytes] if mode == "spew" => {
            spew(std::slice::from_ref(bytes))?;
            0
        }
        [mode] if mode == "hold" => {
            // Holds every end it opened until it is stopped.
            eprintln!("holding");
            std::thread::sleep(Duration::from_secs(300));
            0
        }
        [mode] if mode == "orphan-exit-127" => {
            // SAFETY (fixture): fork from a single-threaded process; the child only sleeps.
            match unsafe { libc::fork() } {
                0 => {
                    std::thread::sleep(Duration::from_secs(300));
                    unsafe { libc::_exit(0) }
                }
                -1 => return Err(runtime("cannot fork")),
                pid => {
                    println!("orphan pid={pid}");
                    let _ = std::io::stdout().flush();
                    127
                }
            }
        }
        _ => {
            return Err(usage(
                "grab-parent-pipes then: spew BYTES | orphan-exit-127",
            ))
        }
    };
    drop(held);
    Ok(code)
}

/// Take an exclusive flock on each directory named on stdin, and keep them all: a stand-in
/// for many live wrappers (run as a copy of this binary named `agent-run`). After each blank
/// line, `locked N` on stdout; at the end of stdin, sleep until killed.
fn hold_dir_locks() -> Result<i32, Failure> {
    use std::io::BufRead;
    let _ = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .map(|max| {
            rustix::process::setrlimit(
                rustix::process::Resource::Nofile,
                rustix::process::Rlimit {
                    current: Some(max),
                    maximum: Some(max),
                },
            )
        });
    let mut held: Vec<File> = Vec::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| runtime(format!("stdin: {e}")))?;
        if line.is_empty() {
            println!("locked {}", held.len());
            let _ = std::io::stdout().flush();
            continue;
        }
        let dir = File::open(&line).map_err(|e| runtime(format!("open {line}: {e}")))?;
        rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| runtime(format!("flock {line}: {e}")))?;
        held.push(dir);
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
