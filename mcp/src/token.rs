//! The lease token: the secret a host asks of whoever renews a run's lease. The server gives it to
//! every `agent-run start` and `agent-run renew` it runs, in their environment
//! (`AGENT_RUN_LEASE_TOKEN`), never on a command line (argv is readable by every user in /proc):
//! locally in the child's environment; over ssh on the channel's stdin, which the remote shell
//! reads into the environment of the agent-run it then execs.
//!
//! One token per server process, random. With `--owner NAME` the token is the owner's, kept in
//! `$XDG_STATE_HOME/agent-run-mcp/NAME.token` (default `~/.local/state/agent-run-mcp/`): a 0700
//! directory and a 0600 file of this user, made once (written whole, then linked into place, so
//! two servers starting together agree on one), so a restarted server renews the runs of its
//! predecessor. A token file that is not a regular file of ours, readable by others, or not a
//! token is refused, never repaired.

use agent_run_shared::sys;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The variable agent-run reads the token from.
pub const ENV: &str = "AGENT_RUN_LEASE_TOKEN";
/// Random bytes in a token (hex-encoded: twice as many characters).
const BYTES: usize = 16;

#[derive(Clone)]
pub struct LeaseToken(String);

impl std::fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseToken(..)")
    }
}

impl LeaseToken {
    /// A new token for this process alone.
    pub fn random() -> io::Result<LeaseToken> {
        crate::random_hex(BYTES).map(LeaseToken)
    }

    /// The owner's token, from its file, made the first time.
    pub fn of_owner(owner: &str) -> Result<LeaseToken, String> {
        let dir = state_dir().ok_or("no $XDG_STATE_HOME and no $HOME to keep it in")?;
        private_dir(&dir).map_err(|e| format!("cannot use {}: {e}", dir.display()))?;
        let path = dir.join(format!("{owner}.token"));
        match read(&path) {
            Ok(t) => return Ok(t),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot use {}: {e}", path.display())),
        }
        create(&dir, &path).map_err(|e| format!("cannot make {}: {e}", path.display()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `$XDG_STATE_HOME/agent-run-mcp` (an absolute one), else `$HOME/.local/state/agent-run-mcp`.
fn state_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            let home = PathBuf::from(std::env::var_os("HOME")?);
            home.is_absolute().then(|| home.join(".local/state"))
        })?;
    Some(base.join("agent-run-mcp"))
}

/// Make `dir` (0700, parents too when missing) and check it is a directory of ours that only
/// we can enter; one of ours that others could enter is closed to them.
fn private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != sys::geteuid() {
        return Err(io::Error::other("not a directory of this user"));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The token in `path`: a regular file of ours, 0600 or closer, holding one token.
fn read(path: &Path) -> io::Result<LeaseToken> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.uid() != sys::geteuid() {
        return Err(io::Error::other("not a regular file of this user"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "others may read it (mode {:o}): remove it, and a new token is made",
            meta.mode() & 0o777
        )));
    }
    let mut text = String::new();
    (&mut f).take(256).read_to_string(&mut text)?;
    let t = text.trim_end_matches('\n');
    if t.len() != 2 * BYTES || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(io::Error::other("it holds no token"));
    }
    Ok(LeaseToken(t.to_string()))
}

/// Write a new token to a temporary file, fsync it, and link it into place; a server that won
/// the race made it first, and its token is the one.
fn create(dir: &Path, path: &Path) -> io::Result<LeaseToken> {
    let token = LeaseToken::random()?;
    let tmp = dir.join(format!(".token.{}", crate::random_hex(6)?));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let linked = f
        .write_all(format!("{}\n", token.0).as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| fs::hard_link(&tmp, path));
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            fs::File::open(dir)?.sync_all()?;
            Ok(token)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(path),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_keeps_one_token_in_a_private_file() {
        let base =
            std::env::temp_dir().join(format!("mcp-token-{}", crate::random_hex(6).unwrap()));
        let dir = base.join("agent-run-mcp");
        private_dir(&dir).unwrap();
        let path = dir.join("me.token");
        let a = create(&dir, &path).unwrap();
        let b = read(&path).unwrap();
        assert_eq!(a.as_str(), b.as_str());
        assert_eq!(a.as_str().len(), 32);
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        // A second maker loses the race and takes the first one's token.
        assert_eq!(create(&dir, &path).unwrap().as_str(), a.as_str());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read(&path).is_err(), "a token others may read is refused");
        fs::write(&path, "short\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read(&path).is_err(), "a file with no token is refused");
        fs::remove_dir_all(&base).unwrap();
    }
}
