//! `agent-run`: run a command so that cancelling it stops all of it, with an honest record.
//!
//! Thin by design: parse the command line, hand it to [`run`], turn the result into an exit code.
//! The logic lives in the `agent-run-shared` library and in one module per subcommand here.
#![forbid(unsafe_code)]

mod cancel;
mod cli;
mod error;
mod human;
mod keeper;
mod launch;
mod list;
mod logs;
mod output_order;
mod phases;
mod ptyio;
mod remote;
mod renew;
mod ring;
mod rm;
mod runs;
mod select;
mod signals;
mod status;
mod stream;
mod supervise;
mod version;
mod wait;

/// `process::exit` flushes Rust's stdout, as returning from `main` would.
/// Under musl, a heap that keeps its memory ([`agent_run_shared::sys::Heap`]).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: agent_run_shared::sys::Heap = agent_run_shared::sys::Heap;

fn main() {
    std::process::exit(agent_run().into())
}

/// What `main` runs: the exit code.
fn agent_run() -> u8 {
    phases::init();
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    phases::mark("parse");
    let code = match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // Never a panic on a closed stderr (the caller may be gone).
            human::say(&format!("{err:#}"));
            error::exit_code_of(&err)
        }
    };
    phases::flush();
    code
}

fn run(cli: cli::Cli) -> anyhow::Result<u8> {
    let root = cli.root.as_deref();
    // Anything but the wrapper itself says so in its signal mask: holding a run's lock for a
    // look or a takeover, it is never taken for that run's wrapper (sys::PARTY_MARK).
    if !matches!(cli.command, cli::Command::Start(_)) {
        agent_run_shared::sys::mark_party();
    }
    // Readers of our output may go away (`agent-run list | head`): the control subcommands end
    // quietly then. The supervising wrapper (`start`) and the streaming ones handle EPIPE
    // themselves and must outlive a dropped channel.
    if !matches!(
        cli.command,
        cli::Command::Start(_)
            | cli::Command::Attach(_)
            | cli::Command::Remote(_)
            | cli::Command::Logs(_)
    ) {
        agent_run_shared::sys::default_sigpipe();
    }
    match cli.command {
        cli::Command::Start(cli::Later(args)) => launch::start(root, args),
        cli::Command::Cancel(cli::Later(args)) => cancel::cancel(root, args),
        cli::Command::Renew(cli::Later(args)) => renew::renew(root, args),
        cli::Command::Status(cli::Later(args)) => status::status(root, args),
        cli::Command::Wait(cli::Later(args)) => wait::wait(root, args),
        cli::Command::Attach(cli::Later(args)) => logs::attach(root, args),
        cli::Command::Logs(cli::Later(args)) => logs::logs(root, args),
        cli::Command::List(cli::Later(args)) => list::list(root, args),
        cli::Command::Gc(cli::Later(args)) => list::gc(root, args),
        cli::Command::Rm(cli::Later(args)) => rm::rm(root, args),
        cli::Command::Remote(cli::Later(args)) => remote::remote(args),
        cli::Command::Version(cli::Later(args)) => version::version(args),
    }
}
