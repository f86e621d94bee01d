//! The output channel: one ssh channel whose stdout and stderr are the run's logs, copied to
//! ours by one thread per pipe, counting bytes.
//!
//! The counts are the resume offsets. The remote side (`attach`) writes stdout.log and
//! stderr.log from the given offsets, in order, and nothing else; every byte we read from a pipe
//! is written to our stream and then counted. So after a break, `attach --stdout-from N
//! --stderr-from M` with the counts continues exactly where we stopped: no byte lost, none
//! repeated. Our own stdout going away (EPIPE) does not stop the copy: bytes are still counted,
//! so the run and its accounting go on.
//!
//! A waiter thread joins both readers (EOF: the channel is closed at the master too), reaps the
//! ssh process and reports its exit code.

use super::ssh::Ssh;
use crate::stream::std_sink;
use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

/// Bytes received so far on each stream: the offsets to resume from.
#[derive(Debug, Default)]
pub struct Counts {
    out: AtomicU64,
    err: AtomicU64,
}

impl Counts {
    /// (stdout bytes, stderr bytes).
    pub fn get(&self) -> (u64, u64) {
        (
            self.out.load(Ordering::SeqCst),
            self.err.load(Ordering::SeqCst),
        )
    }
}

/// Start a channel running `script`; `done` gets ssh's exit code (None if it was killed) once
/// both pipes are closed.
pub fn spawn(
    ssh: &Arc<Ssh>,
    script: &[u8],
    input: Option<Vec<u8>>,
    counts: &Arc<Counts>,
    done: impl FnOnce(Option<i32>) + Send + 'static,
) -> io::Result<()> {
    let mut cmd = ssh.channel(script);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if input.is_some() {
        cmd.stdin(std::process::Stdio::piped());
    }
    let mut child = ssh.children().spawn(&mut cmd)?;
    agent_run_shared::ssh::feed(child.stdin.take(), input);
    let out = child.stdout.take().expect("stdout is piped");
    let err = child.stderr.take().expect("stderr is piped");
    let readers = [
        copy_thread(out, std_sink(false), Arc::clone(counts), false),
        copy_thread(err, std_sink(true), Arc::clone(counts), true),
    ];
    let ssh = Arc::clone(ssh);
    thread::spawn(move || {
        for r in readers {
            let _ = r.join();
        }
        let code = child.wait().ok().and_then(|st| st.code());
        ssh.children().reaped(&child);
        done(code);
    });
    Ok(())
}

fn copy_thread(
    mut pipe: impl Read + Send + 'static,
    mut sink: Option<File>,
    counts: Arc<Counts>,
    stderr: bool,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let counter = if stderr { &counts.err } else { &counts.out };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if let Some(s) = &mut sink {
                if s.write_all(&buf[..n]).is_err() {
                    // Our reader is gone: keep the accounting, drop the bytes.
                    sink = None;
                }
            }
            counter.fetch_add(n as u64, Ordering::SeqCst);
        }
    })
}
