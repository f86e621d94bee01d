//! How an error reaching `main` becomes an exit code: errors that carry their own ([`Exit`],
//! made by [`fail`]) and the library's error kinds, mapped to the contract's table.

use agent_run_shared::{exit, Error};

/// The exit code for an error that reached `main`: the library's error kinds map to the
/// contract's table; anything else is an internal failure (70).
pub fn exit_code_of(err: &anyhow::Error) -> u8 {
    if let Some(code) = err.downcast_ref::<Exit>() {
        return code.0;
    }
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Error>() {
            return match e {
                Error::InvalidRunId { .. } | Error::Invalid { .. } => exit::USAGE,
                Error::Unsafe { .. } => exit::CONFIG,
                Error::Missing { .. } => exit::NO_SUCH_RUN,
                Error::Identity { .. } => exit::NOPERM,
                Error::Corrupt { .. } | Error::Io { .. } => exit::SOFTWARE,
            };
        }
    }
    exit::SOFTWARE
}

/// An error that carries its own exit code.
#[derive(Debug)]
pub struct Exit(pub u8, pub String);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Exit {}

/// Fail with a given exit code and message.
pub fn fail<T>(code: u8, msg: impl Into<String>) -> anyhow::Result<T> {
    Err(Exit(code, msg.into()).into())
}
