//! A real OpenSSH server started by the test itself (`/usr/sbin/sshd -D -e -f <generated config>`)
//! with a generated host key and a generated user key in a temporary authorized_keys, optionally
//! inside a network namespace joined to a client namespace by a veth pair whose link the test can
//! cut (`ip link set DEV down`: this kernel has no netem). Addresses are 192.0.2.0/24 (TEST-NET-1),
//! inside namespaces the test made: nothing leaves the machine. Everything a test starts is
//! stopped by pid and every namespace deleted on drop, whatever happened.

use super::{proc_stat, wait_until_dbg, Pinned};
use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// The server's address inside a [`Netns`] pair.
pub const SERVER_ADDR: &str = "192.0.2.1";
const CLIENT_ADDR: &str = "192.0.2.2";

/// Runs a command that must succeed; panics with its output otherwise.
fn must(cmd: &mut Command) {
    crate::must_succeed(cmd, "");
}

/// Two network namespaces joined by a veth pair: `server` holds 192.0.2.1, `client`
/// 192.0.2.2. Deleted on drop.
pub struct Netns {
    pub server: String,
    pub client: String,
    client_dev: String,
    server_dev: String,
}

impl Netns {
    /// Names are unique per process and call (`ar<pid>n<k>s` / `...c`).
    pub fn new() -> Netns {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "ar{}n{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let net = Netns {
            server: format!("{tag}s"),
            client: format!("{tag}c"),
            client_dev: format!("{tag}c"),
            server_dev: format!("{tag}s"),
        };
        let server_dev = &net.server_dev;
        let ip = |args: &[&str]| must(Command::new("ip").args(args));
        ip(&["netns", "add", &net.server]);
        ip(&["netns", "add", &net.client]);
        ip(&[
            "link",
            "add",
            &net.client_dev,
            "type",
            "veth",
            "peer",
            "name",
            server_dev,
        ]);
        ip(&["link", "set", server_dev, "netns", &net.server]);
        ip(&["link", "set", &net.client_dev, "netns", &net.client]);
        for (ns, dev, addr) in [
            (&net.server, server_dev, SERVER_ADDR),
            (&net.client, &net.client_dev, CLIENT_ADDR),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        net
    }

    /// Cut the link (the client's end goes down; its route to the server goes with it).
    pub fn cut(&self) {
        must(Command::new("ip").args([
            "-n",
            &self.client,
            "link",
            "set",
            &self.client_dev,
            "down",
        ]));
    }

    /// Restore the link cut by [`Netns::cut`].
    pub fn restore(&self) {
        must(Command::new("ip").args(["-n", &self.client, "link", "set", &self.client_dev, "up"]));
    }

    /// Cut the link at the server's end: the client keeps its route, so its packets vanish
    /// and new connections hang until their timeout (a black hole, not "unreachable").
    pub fn blackhole(&self) {
        must(Command::new("ip").args([
            "-n",
            &self.server,
            "link",
            "set",
            &self.server_dev,
            "down",
        ]));
    }

    /// Restore the link cut by [`Netns::blackhole`].
    pub fn restore_server(&self) {
        must(Command::new("ip").args(["-n", &self.server, "link", "set", &self.server_dev, "up"]));
    }

    /// `ip netns exec <ns> <program>`: ip execs the program, so the pid is the program's.
    pub fn exec(ns: &str, program: impl Into<OsString>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program.into());
        cmd
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [&self.server, &self.client] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// An sshd of our own, for root, with keys made for it. Stopped (with every process it
/// forked) on drop.
pub struct SshServer {
    pub dir: tempfile::TempDir,
    pub addr: String,
    pub port: u16,
    sshd: Child,
}

impl SshServer {
    /// A server on loopback, for a test that must run as root (it says so and fails
    /// otherwise): the remote tests' usual start.
    pub fn start_as_root() -> SshServer {
        crate::facts::require_root();
        SshServer::start(None)
    }

    /// Start sshd on 127.0.0.1 (a free port), or on 192.0.2.1:2222 inside namespace `ns`.
    pub fn start(ns: Option<&str>) -> SshServer {
        let dir = tempfile::Builder::new()
            .prefix("agent-run-sshd.")
            .tempdir()
            .expect("cannot create a temporary directory");
        let d = dir.path();
        for key in ["host_key", "user_key"] {
            must(
                Command::new("ssh-keygen")
                    .args([
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        "agent-run-test",
                        "-f",
                    ])
                    .arg(d.join(key)),
            );
        }
        fs::copy(d.join("user_key.pub"), d.join("authorized_keys")).unwrap();
        let (addr, port) = match ns {
            Some(_) => (SERVER_ADDR.to_string(), 2222),
            None => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                ("127.0.0.1".to_string(), l.local_addr().unwrap().port())
            }
        };
        let config = format!(
            "ListenAddress {addr}:{port}\nHostKey {d}/host_key\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             PermitRootLogin prohibit-password\nPidFile none\nMaxSessions 50\n\
             MaxStartups 50\nClientAliveInterval 2\nClientAliveCountMax 3\nSetEnv SHLVL=1\n",
            d = d.display()
        );
        // `SetEnv SHLVL=1`: the sessions' shells are not the first level, so bash does not
        // source this machine's ~/.bashrc (and /etc/bash.bashrc) for every ssh command, as
        // Debian's bash does for a command run by sshd (SSH_CLIENT set, SHLVL below 2). The
        // hosts are all this machine: a developer's rc (root's runs `pyenv init`, 0.2 s of
        // CPU) cost every command that much, ten hosts at once on shared cores, and made
        // Ansible's Ctrl-C reach the hosts 1-4 s late. Nothing here needs the rc: commands
        // are run by absolute path.
        fs::write(d.join("sshd_config"), config).unwrap();
        // sshd refuses to start without its privilege separation directory.
        if !Path::new("/run/sshd").is_dir() {
            fs::create_dir_all("/run/sshd").unwrap();
            fs::set_permissions("/run/sshd", fs::Permissions::from_mode(0o755)).unwrap();
        }
        let sshd = sshd_path();
        let mut cmd = match ns {
            Some(ns) => Netns::exec(ns, sshd),
            None => Command::new(sshd),
        };
        cmd.args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = crate::spawn_or_panic(&mut cmd);
        // sshd -e logs to stderr; "Server listening" means it accepts connections.
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains("Server listening") => break,
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("sshd did not start: {seen:?}");
                }
            }
        }
        SshServer {
            dir,
            addr,
            port,
            sshd: child,
        }
    }

    /// `root@ADDR`.
    /// The listening sshd's pid: every session forks from it.
    pub fn pid(&self) -> u32 {
        self.sshd.id()
    }

    pub fn host(&self) -> String {
        format!("root@{}", self.addr)
    }

    /// The client's ssh options: no user config, our key, a private known_hosts.
    pub fn ssh_options(&self) -> Vec<String> {
        let d = self.dir.path().display();
        vec![
            "-F".into(),
            "/dev/null".into(),
            "-o".into(),
            format!("UserKnownHostsFile={d}/known_hosts"),
            "-o".into(),
            "StrictHostKeyChecking=accept-new".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            "LogLevel=ERROR".into(),
            "-i".into(),
            format!("{d}/user_key"),
            "-p".into(),
            self.port.to_string(),
        ]
    }

    /// [`SshServer::ssh_options`] as `--ssh-option=...` arguments of `agent-run remote`.
    pub fn remote_args(&self) -> Vec<String> {
        self.ssh_options()
            .into_iter()
            .map(|o| format!("--ssh-option={o}"))
            .collect()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        // Every process sshd forked (sessions and what they ran), then sshd itself.
        // Pinned with pidfds first; dropping the pins SIGKILLs whatever is still alive.
        drop(Pinned::new(&descendants(self.sshd.id() as i32)));
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

fn sshd_path() -> PathBuf {
    ["/usr/sbin/sshd", "/usr/bin/sshd", "/sbin/sshd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("sshd is not installed (Debian: apt-get install openssh-server)")
}

pub use super::descendants;

/// Every live process whose command line contains `needle` (e.g. a control socket path).
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
                && proc_stat(*pid).is_some_and(|s| !matches!(s.0, 'Z' | 'X'))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Remove every `agent-run: ...\n` message of ours from a captured stderr, leaving the
/// workload's bytes (each message is written with one write, so it is contiguous).
pub fn strip_messages(stderr: &[u8]) -> Vec<u8> {
    let tag = b"agent-run: ";
    let mut out = Vec::with_capacity(stderr.len());
    let mut i = 0;
    while i < stderr.len() {
        if stderr[i..].starts_with(tag) {
            match stderr[i..].iter().position(|&b| b == b'\n') {
                Some(n) => i += n + 1,
                None => i = stderr.len(),
            }
        } else {
            out.push(stderr[i]);
            i += 1;
        }
    }
    out
}

/// Wait until `probe` sees `what` in a growing buffer.
pub fn wait_for_text(what: &str, timeout: Duration, mut buf: impl FnMut() -> Vec<u8>) {
    wait_until_dbg(&format!("{what:?} in the output"), timeout, || {
        let b = buf();
        let text = String::from_utf8_lossy(&b);
        if text.contains(what) {
            Ok(())
        } else {
            Err(text
                .chars()
                .rev()
                .take(400)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>())
        }
    })
}
