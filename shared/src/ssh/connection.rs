//! The synchronous driver: one link, its master, and the channels over it, for a program without
//! an async runtime (`agent-run remote`).
//!
//! Every child is registered ([`Children`]) until it is reaped, so [`Ssh::shutdown`] can stop
//! what is left without ever signalling a pid that was reused.

use super::children::{exited, wait_timeout, Children, Reply};
use super::{master_pid, Link, Login, Master, CHECK_TIMEOUT};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The connection to one host: a master and the channels over it.
pub struct Ssh {
    link: Link,
    master: Mutex<Option<Master>>,
    masters: AtomicU64,
    children: Children,
    /// Where a master that would not stop is reported.
    warn: fn(&str),
}

impl Ssh {
    /// Prepare (nothing is started). `warn` reports what cannot be returned (a master that
    /// would not stop at shutdown).
    pub fn new(link: Link, warn: fn(&str)) -> Ssh {
        Ssh {
            link,
            master: Mutex::new(None),
            masters: AtomicU64::new(0),
            children: Children::default(),
            warn,
        }
    }

    /// The destination.
    pub fn host(&self) -> &str {
        &self.link.host
    }

    /// The registry of our ssh processes.
    pub fn children(&self) -> &Children {
        &self.children
    }

    /// A channel running `script` (one string for the remote shell) over the master.
    pub fn channel(&self, script: &[u8]) -> Command {
        self.link.channel(script)
    }

    /// Start the master (replacing a dead one). `timeout` bounds the whole login (None: the
    /// user may be typing a passphrase). Ok(ssh's messages) or Err(why).
    pub fn connect(&self, timeout: Option<Duration>) -> Result<String, String> {
        self.drop_master();
        let (mut cmd, login): (Command, Login) = self.link.login()?;
        let mut child = self
            .children
            .spawn(&mut cmd)
            .map_err(|e| format!("cannot run ssh: {e}"))?;
        let status = wait_timeout(&mut child, timeout);
        if matches!(status, Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.reaped(&child);
        let said = login.outcome(status, timeout)?;
        let reply = self
            .children
            .capture(self.link.check(), None, Some(CHECK_TIMEOUT));
        let gen = self.masters.fetch_add(1, Ordering::SeqCst) + 1;
        let master = Master::pin(master_pid(reply.code, &reply.stderr), gen)?;
        *self.master.lock().unwrap() = Some(master);
        Ok(said)
    }

    /// Whether the master we started is still running.
    pub fn master_alive(&self) -> bool {
        self.master
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(Master::alive)
    }

    /// Whether the master is gone, or goes within `t`: a channel over a master that lost its
    /// link may end (255) a moment before the master itself exits.
    pub fn master_gone_within(&self, t: Duration) -> bool {
        let fd = match &*self.master.lock().unwrap() {
            Some(m) => m.pidfd(),
            None => return true,
        };
        fd.is_ok_and(|fd| exited(&fd, t))
    }

    /// Which master is current (0: none yet).
    pub fn generation(&self) -> u64 {
        self.master
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, Master::generation)
    }

    /// [`Ssh::drop_master`], if the current master is still generation `gen`.
    pub fn drop_master_if(&self, gen: u64) {
        if self.generation() == gen {
            self.drop_master();
        }
    }

    /// Stop the master ([`Master::stop`]) and remove its socket.
    pub fn drop_master(&self) {
        let master = self.master.lock().unwrap().take();
        if let Some(Err(why)) = master.map(Master::stop) {
            (self.warn)(&why);
        }
        self.link.remove_socket();
    }

    /// Run `script` over the master, capturing its output, for at most `timeout`.
    pub fn run(&self, script: &[u8], timeout: Option<Duration>) -> Reply {
        self.children.capture(self.channel(script), None, timeout)
    }

    /// [`Ssh::run`] with `input` on the channel's stdin (a lease token: never on a command
    /// line, which every user of either host can read in /proc).
    pub fn run_with_input(&self, script: &[u8], input: &[u8], timeout: Option<Duration>) -> Reply {
        self.children
            .capture(self.channel(script), Some(input.to_vec()), timeout)
    }

    /// Stop every child still running, then the master, and remove our directory (threads
    /// may still hold this value when the process exits, so this cannot wait for drop).
    pub fn shutdown(&self) {
        self.children.stop_all();
        self.drop_master();
        self.link.dir.remove();
    }
}

impl Drop for Ssh {
    fn drop(&mut self) {
        self.shutdown();
    }
}
