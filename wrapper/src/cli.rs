//! The command line, as the contract spells it. Parsing only: validation of run ids, roots and
//! durations happens where they are used, with the contract's exit codes.
//!
//! `agent-run [OPTIONS] <RUN_ID> -- CMD...` means `agent-run start ...`: [`parse`] inserts `start`
//! when the first word that is not an option is not a subcommand. clap's usage errors exit 64.

use agent_run_shared::exit;
use agent_run_shared::spec::{LabelMatch, OnDisconnect};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

// By path: packaging/gen includes this file by path too, and a plain `mod` would resolve
// differently there.
#[path = "cli/values.rs"]
mod values;
#[path = "cli/words.rs"]
mod words;
pub use values::MaxOutput;
use values::{
    dur, grace_dur, label_match, label_pair, lease_dur, policy, positive_dur, pty_size, size_arg,
    state_filter, EnvPair,
};
use words::*;

/// The output rule, said once for every subcommand (the short help's tail, and the long one's).
const OUTPUT_RULE: &str = "\
Output: every subcommand prints for people on stdout (a line or a summary a run), whether stdout
is a terminal or not; with --json, one JSON document on stdout instead. Errors and notes go to
stderr. Colour only on a terminal, never with NO_COLOR. Exit codes and files: agent-run --help";

/// The long help's tail: the output rule, the shared exit-code table, the files and the root.
fn exit_codes_help() -> String {
    format!(
        "{OUTPUT_RULE}\n\n{}\n\
Files: <root>/<run-id>/{{status.json,stdout.log,stderr.log,output.json,events.jsonl,lease.json,cancel.json,pid,pgid}}
Root: --root DIR, else $AGENT_RUN_ROOT, else $HOME/.agent-runs",
        exit::help_text()
    )
}

/// Run a command in its own session so that cancelling it stops all of it, and keep an honest
/// record of how it ended.
///
/// `agent-run <RUN_ID> -- CMD [ARGS...]` is the same as `agent-run start <RUN_ID> -- CMD...`.
/// TERM, INT or HUP to agent-run, `agent-run cancel <RUN_ID>` from another connection, or an
/// expired lease stop the whole run: TERM, HUP after 500 ms, KILL at the grace, then a final
/// record in <root>/<RUN_ID>/status.json.
#[derive(Debug, Parser)]
#[command(name = "agent-run", version, after_long_help = exit_codes_help(), after_help = OUTPUT_RULE)]
pub struct Cli {
    /// The run root (default: $AGENT_RUN_ROOT, else $HOME/.agent-runs)
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// A subcommand's arguments, made only when clap enters that subcommand
/// ([`clap::Command::defer`]). A launch then builds the arguments of `start` alone, not those of
/// all twelve subcommands (that cost the wrapper a third of its own, anonymous memory: 84 of
/// 272 KiB, and 0.08 ms of a launch).
/// Help, man pages and completions build every subcommand first, so they show the same.
#[derive(Debug)]
pub struct Later<T>(pub T);

impl<T: Args> Args for Later<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.defer(T::augment_args)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd.defer(T::augment_args_for_update)
    }
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: clap::FromArgMatches> clap::FromArgMatches for Later<T> {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(m).map(Later)
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a run and supervise it to its final record (the default subcommand)
    Start(Later<StartArgs>),
    /// Stop runs from a second connection and say how each ended
    Cancel(Later<CancelArgs>),
    /// Push runs' lease deadlines to now + DUR and say when they end (needs the lease token start
    /// handed out)
    Renew(Later<RenewArgs>),
    /// Show runs' records (a human summary, or status.json plus derived fields with --json)
    Status(Later<StatusArgs>),
    /// Block until runs are final, then exit as they did
    Wait(Later<WaitArgs>),
    /// Stream a run's output from the start, in the order it was written, then exit as the run
    /// did; Ctrl-C detaches (exit 130, the run goes on)
    Attach(Later<AttachArgs>),
    /// Print (and with -f follow) a run's logs in the order they were written, or one log by
    /// byte offset
    Logs(Later<LogsArgs>),
    /// List the runs under the root, newest first
    List(Later<ListArgs>),
    /// Remove final run dirs older than DUR
    Gc(Later<GcArgs>),
    /// Remove runs by id: only runs that are over (cancel a running one first)
    Rm(Later<RmArgs>),
    /// Print agent-run's version, the record schema, its features and what this host offers
    Version(Later<VersionArgs>),
    /// Run a command on HOST through OpenSSH with a lease, renewals, a second-channel cancel and
    /// resumable output (the controller half)
    Remote(Later<RemoteArgs>),
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// Stop the run unless it is renewed within DUR (e.g. 90, 90s, 5m, 2h)
    #[arg(long, value_name = "DUR", value_parser = lease_dur)]
    pub lease: Option<Duration>,
    /// TERM -> KILL grace (at most 5m)
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = grace_dur)]
    pub grace: Duration,
    /// TERM -> HUP step (0 disables every HUP)
    #[arg(long, value_name = "DUR", default_value = "500ms", value_parser = dur("--hup-after"))]
    pub hup_after: Duration,
    /// Hold the run in a cgroup v2 made in DIR (default: $AGENT_RUN_CGROUP, else this
    /// process's own cgroup when this user may use it); `off` holds it by /proc scans only
    #[arg(long, value_name = "DIR|off")]
    pub cgroup: Option<String>,
    /// Return once the run is running (or failed to launch), printing `started ID (pid N)` (and
    /// the lease token it made, if any)
    #[arg(short, long)]
    pub detach: bool,
    /// With --detach: print one JSON line {"run_id","run_dir","pid","pgid","state","lease_token"}
    /// instead. A relaunch of a final run: its record on stdout (the line for people goes to
    /// stderr either way)
    #[arg(long)]
    pub json: bool,
    /// Do not copy the workload's output to this process's stdout/stderr
    #[arg(long)]
    pub quiet: bool,
    /// Stop the run DUR after it started, whatever its controller does: renewals do not
    /// extend it (reason timeout, exit 124)
    #[arg(long, value_name = "DUR", value_parser = positive_dur("--timeout"))]
    pub timeout: Option<Duration>,
    /// Run the command in DIR (default: the current directory)
    #[arg(short = 'C', long = "cwd", value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Set NAME=VALUE in the workload's environment (repeatable; the record keeps the names only)
    #[arg(short = 'e', long = "env", value_name = "NAME=VALUE", value_parser = EnvPair)]
    pub env: Vec<(OsString, OsString)>,
    /// Label the run KEY=VALUE (repeatable), e.g. an engine's own job id; `list --label` filters
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_pair)]
    pub labels: Vec<(String, String)>,
    /// When the caller goes away (its stdout and stderr hang up, as when an ssh client without
    /// a pty dies): keep, cancel, or DUR (stop unless someone attaches or renews within DUR).
    /// Default: keep with --lease (the lease decides), else cancel
    #[arg(long, value_name = "POLICY", value_parser = policy)]
    pub on_disconnect: Option<OnDisconnect>,
    /// Give the workload a pseudo-terminal as its stdin, stdout, stderr and controlling
    /// terminal, so it line-buffers, colours and interleaves as in a terminal; everything it
    /// writes goes to stdout.log (stderr.log stays empty). In the foreground the wrapper's stdin
    /// is copied to it (raw mode when stdin is a terminal); detached, nothing is written to it
    #[arg(long)]
    pub pty: bool,
    /// The pty's size, COLSxROWS (default: the caller's terminal, followed on SIGWINCH, else
    /// 80x24)
    #[arg(long, value_name = "COLSxROWS", value_parser = pty_size, requires = "pty")]
    pub pty_size: Option<agent_run_shared::pty::Size>,
    /// Cap each of stdout.log and stderr.log at SIZE bytes (K, M, G, T: powers of 1024; 0 or
    /// none: no cap). At the cap a marker line goes into the log, further bytes are dropped and
    /// counted (the record's `output`), and the last min(SIZE/8, 1M) bytes are kept at the end.
    /// Default: $AGENT_RUN_MAX_OUTPUT, else the size in <root>/max-output, else 1G
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub max_output: Option<MaxOutput>,
    /// At the --max-output cap (or the disk reserve): keep the run going (drop and count), or
    /// stop it (state cancelled, reason output_limit)
    #[arg(long, value_name = "POLICY", default_value = "keep", value_parser = ["keep", "stop"])]
    pub on_output_limit: String,
    /// Internal: this is the wrapper that --detach started (the workload reads /dev/null)
    #[arg(long, hide = true)]
    pub detached_child: bool,
    /// The run id: 1-128 characters of A-Z a-z 0-9 . _ -, not starting with . or -
    #[arg(value_name = "RUN_ID")]
    pub run_id: String,
    /// The command and its arguments (after --)
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The run id
    #[arg(value_name = "RUN_ID")]
    pub run_id: String,
    /// Start stdout at this byte offset (to resume after a broken stream)
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub stdout_from: u64,
    /// Start stderr at this byte offset
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub stderr_from: u64,
}

const REMOTE_HELP: &str = "\
The run is started on HOST with `agent-run start --detach --lease` and streamed with `attach`
over one private ssh master connection; the workload's stdin is /dev/null. Its id is printed
first on stderr: `agent-run: run id <ID> on <HOST>`. Before the launch, the host's agent-run is
asked `version --json`: if it is missing, cannot run, or lacks what --timeout, --label, -C or -e
need, remote says so, starts nothing and exits 72. --timeout holds on the host whatever happens
here (renewals do not extend it; exit 124).

INT, TERM or HUP: `cancel` on a fresh channel; the final record is printed on stderr and the
exit code is the record's (143 for a cancel, as `wait` and --status will say later; the
workload's own code if it finished first). A second signal stops waiting (75).

A broken stream is resumed from the bytes already received (no byte lost or repeated). If HOST
stays unreachable until the lease must have run out, the outcome is reported unknown (75): the
host stops the run by its lease; ask later with --status.

--status exits as the run did, or 75 while it is not final. --cancel exits 0 once the run is
final. --attach streams an earlier run from the start, renews its lease, cancels it on INT/TERM/
HUP and exits as it did. 75 also when HOST cannot be reached at all (nothing was started).
ssh options that must hold (ControlPath, ControlMaster) cannot be overridden; keepalive and
ConnectTimeout defaults can. The remote login shell must be POSIX (sh, bash, dash, ksh, zsh).

Exit codes: as the remote run did (agent-run --help), and
  75  the outcome cannot be known here (HOST unreachable, or the run not final yet for --status)
  72  agent-run could not be run on HOST: the remote shell found no --remote-bin program (127)
      or could not execute it (126), or it is too old for what the launch asks; nothing was
      started there";

#[derive(Debug, Args)]
#[command(after_long_help = REMOTE_HELP)]
pub struct RemoteArgs {
    /// An option for ssh (repeatable), e.g. --ssh-option=-p2222 --ssh-option=-oUser=ci
    #[arg(long = "ssh-option", value_name = "OPT", allow_hyphen_values = true)]
    pub ssh_options: Vec<String>,
    /// The remote agent-run program (a relative path starts at the remote home directory)
    #[arg(long, value_name = "PATH", default_value = "agent-run")]
    pub remote_bin: String,
    /// The run root on the host, passed as the remote agent-run's --root (default: the host's
    /// $AGENT_RUN_ROOT, else ~/.agent-runs)
    #[arg(long, value_name = "DIR")]
    pub remote_root: Option<PathBuf>,
    /// The run id (default: 128 random bits, printed to stderr first)
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// The lease; renewed every third of it while the run is active
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = lease_dur)]
    pub lease: Duration,
    /// TERM -> KILL grace on the host (at most 5m)
    #[arg(long, value_name = "DUR", value_parser = grace_dur)]
    pub grace: Option<Duration>,
    /// Stop the run DUR after it started on the host, whatever happens to this controller
    /// (renewals do not extend it; exit 124)
    #[arg(long, value_name = "DUR", value_parser = positive_dur("--timeout"))]
    pub timeout: Option<Duration>,
    /// Run the command in DIR on the host
    #[arg(short = 'C', long = "cwd", value_name = "DIR")]
    pub cwd: Option<OsString>,
    /// Set NAME=VALUE in the workload's environment on the host (repeatable)
    #[arg(short = 'e', long = "env", value_name = "NAME=VALUE", value_parser = EnvPair)]
    pub env: Vec<(OsString, OsString)>,
    /// Label the run KEY=VALUE on the host (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label_pair)]
    pub labels: Vec<(String, String)>,
    /// Run the command on a pseudo-terminal on the host (`start --pty`), sized from this
    /// terminal (or --pty-size); its output all comes as stdout
    #[arg(long)]
    pub pty: bool,
    /// The host pty's size, COLSxROWS (default: this process's terminal, else 80x24)
    #[arg(long, value_name = "COLSxROWS", value_parser = pty_size, requires = "pty")]
    pub pty_size: Option<agent_run_shared::pty::Size>,
    /// Cap each of the host's stdout.log and stderr.log at SIZE bytes (`start --max-output`;
    /// default: the host root's setting, else 1G)
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    pub max_output: Option<MaxOutput>,
    /// At the host's output cap: keep the run going (drop and count) or stop it (reason
    /// output_limit); `start --on-output-limit`
    #[arg(long, value_name = "POLICY", value_parser = ["keep", "stop"])]
    pub on_output_limit: Option<String>,
    /// Print the record of an earlier run and exit as it did (75 while it is not final)
    #[arg(long, value_name = "ID", conflicts_with_all = ["cancel", "attach"])]
    pub status: Option<String>,
    /// Cancel an earlier run over a fresh channel and print its final record
    #[arg(long, value_name = "ID", conflicts_with_all = ["status", "attach"])]
    pub cancel: Option<String>,
    /// Come back to an earlier run: stream it, renew its lease, exit as it did
    #[arg(long, value_name = "ID", conflicts_with_all = ["status", "cancel"])]
    pub attach: Option<String>,
    /// The host, as ssh understands it (user@host, an alias from ~/.ssh/config, ...)
    #[arg(value_name = "HOST")]
    pub host: String,
    /// The command and its arguments (after --), passed to the remote agent-run unchanged
    #[arg(value_name = "COMMAND", num_args = 0.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

// Which runs a control subcommand acts on: run ids, or `--all`, or a label selector. (Not a
// doc comment: clap would make it the `about` of every subcommand that flattens it.)
#[derive(Debug, Args, Clone)]
pub struct Selection {
    /// The run ids (several: a line or summary each; --json: one array, in the order given)
    #[arg(value_name = "RUN_ID", conflicts_with_all = ["all", "select_labels"])]
    pub run_ids: Vec<String>,
    /// Every run under the root (for cancel, renew and wait: every run that is not final)
    #[arg(long)]
    pub all: bool,
    /// The runs labelled KEY=VALUE (or carrying KEY at all); repeatable: every one must match
    #[arg(long = "label", id = "select_labels", value_name = "KEY[=VALUE]", value_parser = label_match)]
    pub labels: Vec<LabelMatch>,
}

const CANCEL_HELP: &str = "\
Output: one line a run (`run train-3: cancelled (cancel_request) after 1.2s, 3 processes stopped
in 4ms, exit 143`); with --json, the final record as `status --json` prints it (several runs: one
JSON array, in the order given, newest first for --all and --label). Several runs are cancelled concurrently. Exit 0 once every run is
final, whether this call stopped it or it already was; else the first failure's code (69 no
such run, 75 not final in time, 77 refused, 78 unsafe), the others still cancelled.";

#[derive(Debug, Args)]
#[command(after_long_help = CANCEL_HELP)]
pub struct CancelArgs {
    #[command(flatten)]
    pub select: Selection,
    /// How long to wait for the final record (default: the run's grace + 10s)
    #[arg(long, value_name = "DUR", value_parser = dur("--wait"))]
    pub wait: Option<Duration>,
    /// Print the final record (several runs: one JSON array) instead of a line a run
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    #[command(flatten)]
    pub select: Selection,
    /// New lease length (default: the run's lease length)
    #[arg(long, value_name = "DUR", value_parser = lease_dur)]
    pub lease: Option<Duration>,
    /// The run's lease token, as `start` handed it out (default: $AGENT_RUN_LEASE_TOKEN, which
    /// unlike this option is not shown in the process list)
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Print {"deadline_epoch","lease_s"} (several: an array with "run_id") instead of a line
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub select: Selection,
    /// Print status.json plus derived fields (several runs: one JSON array), not a summary
    #[arg(long)]
    pub json: bool,
}

const WAIT_HELP: &str = "\
With several runs, wait blocks until every one is final (or with --any until one is) and exits
0 when every run it waited for ended with 0; otherwise with the code of the first run, in the
order given, whose code is not 0 (with --any: the code of the first run to end). --timeout ends
the wait with 75, naming the runs that are not final.";

#[derive(Debug, Args)]
#[command(after_long_help = WAIT_HELP)]
pub struct WaitArgs {
    #[command(flatten)]
    pub select: Selection,
    /// Give up after DUR (exit 75)
    #[arg(long, value_name = "DUR", value_parser = dur("--timeout"))]
    pub timeout: Option<Duration>,
    /// Return as soon as one of the runs is final (default: when all of them are)
    #[arg(long)]
    pub any: bool,
    /// Return (exit 75) once the run has written nothing for DUR, stdout and stderr alike; the
    /// run goes on. One run only
    #[arg(long, value_name = "DUR", value_parser = dur("--idle"))]
    pub idle: Option<Duration>,
    /// Print the record of the run waited for (several runs: one JSON array)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The run id
    #[arg(value_name = "RUN_ID")]
    pub run_id: String,
    /// stderr.log only (to stdout); with --offset, the offset is in stderr.log
    #[arg(long)]
    pub stderr: bool,
    /// stdout.log only
    #[arg(long, conflicts_with = "stderr")]
    pub stdout: bool,
    /// Follow until the run is final (Ctrl-C detaches: exit 130, the run goes on)
    #[arg(short, long)]
    pub follow: bool,
    /// Only the last N lines (of both logs, each under a header, unless --stdout or --stderr);
    /// with -f, follow from there
    #[arg(short = 'n', long, value_name = "N")]
    pub tail: Option<usize>,
    /// Read one log (stdout.log, or stderr.log with --stderr) from this byte offset
    #[arg(long, value_name = "BYTES", conflicts_with_all = ["follow", "tail", "stdout"])]
    pub offset: Option<u64>,
    /// With --offset: at most this many bytes (default: to the log's end; 16384 with --json)
    #[arg(long, value_name = "BYTES", requires = "offset", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_bytes: Option<u64>,
    /// With --offset: one JSON document (text, next_offset, size, more, final, state, lossy)
    #[arg(long, requires = "offset")]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// One JSON document (an array of runs)
    #[arg(long)]
    pub json: bool,
    /// Only runs in STATE (a state name, or active, or final); repeatable
    #[arg(long = "state", value_name = "STATE", value_parser = state_filter)]
    pub states: Vec<String>,
    /// Only runs labelled KEY=VALUE (or carrying KEY at all); repeatable: every one must match
    #[arg(long = "label", value_name = "KEY[=VALUE]", value_parser = label_match)]
    pub labels: Vec<LabelMatch>,
    /// Only the N newest runs (after the filters)
    #[arg(short = 'n', long = "limit", value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// One JSON document: version, schema, features, cgroup
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The runs to remove. A run that is not over, or whose record says it is over while a
    /// process of it lives (a record the workload rewrote), is refused with 75: cancel it first.
    /// The others are removed all the same
    #[arg(value_name = "RUN_ID", required = true)]
    pub run_ids: Vec<String>,
    /// Only say what would be removed
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Remove final runs that ended more than DUR ago. A run whose record says it is over
    /// while its cgroup still holds processes (a record the workload rewrote) is skipped, with
    /// a line on stderr: cancel it first
    #[arg(long, value_name = "DUR", value_parser = dur("--older-than"))]
    pub older_than: Duration,
    /// Only say what would be removed
    #[arg(long)]
    pub dry_run: bool,
}

/// Parse the process's arguments. `Err(code)` after clap printed help (0) or an error (64).
pub fn parse() -> Result<Cli, u8> {
    let args = with_default_subcommand(std::env::args_os().collect()).map_err(|msg| {
        eprintln!("agent-run: {msg}");
        exit::USAGE
    })?;
    Cli::try_parse_from(args).map_err(|e| {
        let code = match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                return if e.kind()
                    == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                {
                    exit::USAGE
                } else {
                    0
                };
            }
            _ => exit::USAGE,
        };
        let msg = e.render().to_string();
        let msg = msg
            .trim_end()
            .strip_prefix("error: ")
            .unwrap_or(msg.trim_end());
        eprintln!("agent-run: {msg}");
        code
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_form_of_a_start_line_parses_as_start() {
        let lines: &[&[&str]] = &[
            &["a", "r1", "--", "true"],
            &[
                "a",
                "-d",
                "--detached-child",
                "--quiet",
                "r1",
                "--",
                "x",
                "--",
                "-y",
            ],
            &[
                "a",
                "--on-disconnect",
                "keep",
                "--cgroup",
                "/sys/x",
                "r1",
                "--",
                "x",
            ],
            &["a", "start", "r1", "--", "--"],
            &["a", "--root", "/x", "r1", "--", "sh", "-c", "exit 3"],
            &["a", "start", "--root", "/x", "r1", "--", "true"],
            &[
                "a", "--quiet", "--lease", "90s", "--grace", "2s", "r1", "--", "x", "--lease",
            ],
            &[
                "a", "-C", "/tmp", "-e", "A=1", "-e", "B=2", "--label", "k=v", "r1", "--", "x",
            ],
            &[
                "a",
                "--detach",
                "--on-disconnect",
                "30s",
                "--hup-after",
                "0",
                "r1",
                "--",
                "x",
            ],
            &[
                "a",
                "--cgroup",
                "off",
                "--max-output",
                "1M",
                "--on-output-limit",
                "stop",
                "r",
                "--",
                "x",
            ],
            &[
                "a",
                "--pty",
                "--pty-size",
                "100x30",
                "--timeout",
                "1h",
                "r1",
                "--",
                "x",
            ],
        ];
        for line in lines {
            let w = words(line);
            let cli = Cli::try_parse_from(&w).unwrap_or_else(|e| panic!("{w:?}: {e}"));
            assert!(matches!(cli.command, Command::Start(_)), "{w:?}");
        }
        // A line with -e's value not UTF-8 is taken (clap reads OsStrings).
        {
            use std::os::unix::ffi::OsStringExt;
            let mut os: Vec<OsString> = ["a", "start", "-e"].iter().map(OsString::from).collect();
            os.push(OsString::from_vec(b"A=\xff".to_vec()));
            os.extend(["r1", "--", "x"].iter().map(OsString::from));
            assert!(Cli::try_parse_from(&os).is_ok());
        }
        // Help and errors are clap's answers.
        for line in [
            &["a", "start", "--help"][..],
            &["a", "start", "-h"],
            &["a", "start", "--grace", "soon", "r1", "--", "x"],
            &["a", "start", "--bogus", "r1", "--", "x"],
            &["a", "start"],
        ] {
            let w: Vec<OsString> = line.iter().map(OsString::from).collect();
            assert!(Cli::try_parse_from(&w).is_err(), "{line:?}");
        }
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn words(v: &[&str]) -> Vec<String> {
        with_default_subcommand(v.iter().map(OsString::from).collect())
            .unwrap()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    }

    fn refused(v: &[&str]) -> String {
        with_default_subcommand(v.iter().map(OsString::from).collect()).unwrap_err()
    }

    #[test]
    fn pty_size_takes_a_value_in_the_implicit_start_form_and_needs_pty() {
        let w = words(&["a", "--pty", "--pty-size", "100x30", "r1", "--", "true"]);
        assert_eq!(w[1], "start");
        let cli = Cli::try_parse_from(&w).unwrap();
        let Command::Start(Later(s)) = cli.command else {
            panic!("not start")
        };
        assert!(s.pty);
        assert_eq!(
            s.pty_size,
            Some(agent_run_shared::pty::Size {
                cols: 100,
                rows: 30
            })
        );
        assert!(
            Cli::try_parse_from(["a", "start", "--pty-size", "80x24", "r", "--", "x"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["a", "start", "--pty", "--pty-size", "80", "r", "--", "x"])
                .is_err()
        );
    }

    #[test]
    fn the_implicit_start_form_requires_a_double_dash() {
        assert_eq!(words(&["a", "r1", "--quiet", "--", "true"])[1], "start");
        assert_eq!(
            words(&["a", "r1", "--lease", "5m", "--", "true"])[1],
            "start"
        );
        for typo in [
            &["a", "stop", "train-3"][..],
            &["a", "kill", "train-3"],
            &["a", "ls"],
            &["a", "frobnicate", "x"],
            &["a", "cancle", "r1"],
            &["a", "r1", "true"],
            &["a", "stop", "train-3", "--", "true"],
        ] {
            assert!(
                refused(typo).starts_with("unrecognized subcommand"),
                "{typo:?}"
            );
        }
    }

    #[test]
    fn near_subcommands_are_suggested() {
        for (typo, want) in [
            ("stop", Some("cancel")),
            ("kill", Some("cancel")),
            ("ls", Some("list")),
            ("cancle", Some("cancel")),
            ("staus", Some("status")),
            ("stat", Some("status")),
            ("lsit", Some("list")),
            ("frobnicate", None),
            ("x", None),
        ] {
            assert_eq!(suggestion(typo), want, "{typo}");
        }
    }

    #[test]
    fn a_bare_run_id_means_start() {
        assert_eq!(words(&["a", "r1", "--", "true"])[1], "start");
        assert_eq!(words(&["a", "--root", "x", "r1", "--", "true"])[1], "start");
        assert_eq!(
            words(&["a", "--grace", "1s", "r1", "--", "true"])[1],
            "start"
        );
        assert_eq!(words(&["a", "cancel", "r1"])[1], "cancel");
        assert_eq!(words(&["a", "--root", "x", "list"])[3], "list");
        assert_eq!(words(&["a", "--help"]), ["a", "--help"]);
        assert_eq!(words(&["a"]), ["a"]);
    }
}
