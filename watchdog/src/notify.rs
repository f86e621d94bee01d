//! The systemd notification protocol (sd_notify(3)) without libsystemd: one datagram to
//! `$NOTIFY_SOCKET` per message (`READY=1`, `STATUS=...`, `WATCHDOG=1`, `STOPPING=1`).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager, if there is one.
pub struct Notifier {
    sock: Option<(UnixDatagram, SocketAddr)>,
    /// Half of `$WATCHDOG_USEC`: how often to send `WATCHDOG=1`.
    pub ping_every: Option<Duration>,
}

impl Notifier {
    /// From the environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`).
    pub fn from_env() -> Notifier {
        let sock = std::env::var("NOTIFY_SOCKET").ok().and_then(|path| {
            let addr = match path.strip_prefix('@') {
                Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes()).ok()?,
                None => SocketAddr::from_pathname(&path).ok()?,
            };
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let ping_every = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|_| ours)
            .map(|u| Duration::from_micros(u / 2));
        Notifier { sock, ping_every }
    }

    /// Send one message (ignored when not under systemd).
    pub fn send(&self, msg: &str) {
        if let Some((s, addr)) = &self.sock {
            let _ = s.send_to_addr(msg.as_bytes(), addr);
        }
    }
}
