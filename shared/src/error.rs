//! The library's typed errors. Callers branch on the kind (gone, unsafe, invalid, corrupt);
//! the binaries wrap them in `anyhow` and print them with their chain.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result with the library's error.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, with the object it went wrong on.
#[derive(Debug)]
pub enum Error {
    /// An I/O call failed on a path: "cannot <what> <path>: <cause>".
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A run id that the contract refuses.
    InvalidRunId { id: String, why: &'static str },
    /// A path that fails the safety rules (symlink, owner, mode); `why` names the path and says
    /// what to do.
    Unsafe { path: PathBuf, why: String },
    /// A file that exists but does not hold a valid document.
    Corrupt { path: PathBuf, why: String },
    /// A file or run that does not exist.
    Missing { path: PathBuf },
    /// A record whose processes are not (or no longer) the run's.
    Identity { why: String },
    /// A bad value on the command line or in a file (durations and the like).
    Invalid {
        what: &'static str,
        value: String,
        why: String,
    },
}

impl Error {
    /// Attach a path and an action to an I/O error.
    pub fn io(what: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            what,
            path: path.into(),
            source,
        }
    }

    /// The underlying errno, when this is an I/O error.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { what, path, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
            Error::InvalidRunId { id, why } => write!(f, "invalid run id {id:?}: {why}"),
            // The reason names the path and the remedy ("run root /x is writable by others
            // (mode 0777): chmod 700 /x").
            Error::Unsafe { why, .. } => f.write_str(why),
            Error::Corrupt { path, why } => write!(f, "invalid file {}: {why}", path.display()),
            Error::Missing { path } => write!(f, "{} does not exist", path.display()),
            Error::Identity { why } => write!(f, "record failed validation: {why}"),
            Error::Invalid { what, value, why } => write!(f, "invalid {what} {value:?}: {why}"),
        }
    }
}

/// The I/O cause is part of the message (`cannot write X: No space left on device`), so it is
/// not also reported as a `source()`: chained printing (`{:#}`) would say it twice.
impl std::error::Error for Error {}
