//! One round trip that answers "how is this run, and what did it write": optionally wait a
//! moment for it to end (`agent-run wait --timeout`), then its record (`agent-run status --json`)
//! and a bounded byte range of each log, read on the host.
//!
//! The logs are read the way the house rules ask for run files: the file must be a regular file
//! (`stat`, which does not follow symlinks), and `dd` opens it with `O_NOFOLLOW|O_NONBLOCK` and
//! reads at most the bytes asked for, so a workload that planted a FIFO or a symlink, or wrote
//! gigabytes, costs one bounded read. The parts of the answer are framed by lines with a random
//! nonce the workload cannot know in advance.

use crate::host::{Host, Reply};
use serde_json::Value;
use std::time::Duration;

/// The most one read of one log returns.
pub const MAX_READ: u64 = 64 * 1024;

/// Which bytes of a log to read.
#[derive(Debug, Clone, Copy)]
pub enum Read {
    /// None, only the size.
    Size,
    /// Up to `max` bytes from `offset`.
    From { offset: u64, max: u64 },
    /// The last `bytes` bytes.
    Tail { bytes: u64 },
}

impl Read {
    /// (offset, max) for the script: a negative offset counts from the end.
    fn args(self) -> (i64, u64) {
        match self {
            Read::Size => (0, 0),
            Read::From { offset, max } => (offset.min(i64::MAX as u64) as i64, max.min(MAX_READ)),
            Read::Tail { bytes } => {
                let b = bytes.min(MAX_READ);
                (-(b as i64), b)
            }
        }
    }
}

/// What was read of one log.
#[derive(Debug, Clone, Default)]
pub struct Chunk {
    /// The log's size when it was read.
    pub size: u64,
    /// Where `data` starts in the log.
    pub offset: u64,
    pub data: Vec<u8>,
    /// `ok`, `missing`, or what the file is instead of a regular file (`fifo`, `symbolic_link`).
    pub kind: String,
}

impl Chunk {
    /// The offset just after the bytes read.
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// The record and both logs' chunks.
#[derive(Debug)]
pub struct Probe {
    /// `status --json` of the run, or agent-run's exit code and message when it has none.
    pub record: Result<Value, (Option<i32>, String)>,
    pub stdout: Chunk,
    pub stderr: Chunk,
}

impl Probe {
    pub fn is_final(&self) -> bool {
        self.record
            .as_ref()
            .is_ok_and(|r| r["final"].as_bool() == Some(true))
    }
}

/// A script in the making: the frame tag (a nonce the workload cannot know) and the text.
struct Script {
    tag: String,
    text: Vec<u8>,
}

impl Script {
    fn new() -> Result<Script, String> {
        let nonce = crate::random_hex(8).map_err(|e| format!("no random bytes: {e}"))?;
        Ok(Script {
            tag: format!("@@{nonce}"),
            text: Vec::new(),
        })
    }

    /// `agent-run wait --timeout=W [--any] IDS`, its output dropped: returns once the runs are
    /// final (one of them, with `any`) or the time is up.
    fn wait(&mut self, host: &Host, ids: &[String], w: Duration, any: bool) -> Result<(), String> {
        let ms = format!("--timeout={}ms", w.as_millis().max(1));
        let mut words = vec!["wait", &ms];
        if any {
            words.push("--any");
        }
        words.extend(ids.iter().map(String::as_str));
        self.text.extend(host.line(&words)?);
        self.text.extend_from_slice(b" >/dev/null 2>&1\n");
        Ok(())
    }

    /// `agent-run status --json IDS`, framed with its exit code, then the `part` function.
    fn status(&mut self, host: &Host, ids: &[String]) -> Result<(), String> {
        let tag = &self.tag;
        let mut words = vec!["status", "--json"];
        words.extend(ids.iter().map(String::as_str));
        self.text.extend_from_slice(b"st=$(");
        self.text.extend(host.line(&words)?);
        self.text.extend_from_slice(b" 2>&1); rc=$?\n");
        self.text.extend(
            format!(
                r#"printf '%s\n' "{tag} status $rc"; printf '%s\n' "$st"
part() {{
  f="$d/$1.log"; i=$(stat -c '%s %F' -- "$f" 2>/dev/null) || i='0 missing'
  z=${{i%% *}}; t=${{i#* }}
  case $t in
    "regular file"|"regular empty file") ;;
    *) printf '\n{tag} %s %s 0 0 %s\n' "$1" "$z" "$(printf %s "$t" | tr ' ' _)"; return 0;;
  esac
  o=$2; if [ "$o" -lt 0 ]; then o=$((z + o)); [ "$o" -lt 0 ] && o=0; fi
  n=$((z - o)); [ "$n" -lt 0 ] && n=0; [ "$n" -gt "$3" ] && n=$3
  printf '\n{tag} %s %s %s %s ok\n' "$1" "$z" "$o" "$n"
  [ "$n" -gt 0 ] && dd if="$f" iflag=nofollow,nonblock,skip_bytes,count_bytes,fullblock bs=65536 skip="$o" count="$n" 2>/dev/null
  return 0
}}
"#
            )
            .bytes(),
        );
        Ok(())
    }

    /// The two reads of run `id`'s logs.
    fn logs(&mut self, host: &Host, id: &str, reads: (Read, Read)) {
        self.text.extend_from_slice(b"d=");
        self.text.extend(host.run_dir_word(id));
        self.text.push(b'\n');
        for (name, read) in [("stdout", reads.0), ("stderr", reads.1)] {
            let (o, m) = read.args();
            self.text.extend(format!("part {name} {o} {m}\n").bytes());
        }
    }

    /// Run it on `host` (its waits plus 30 s at most): the status frame and the chunks.
    async fn run(
        mut self,
        host: &Host,
        wait: Option<Duration>,
        what: &str,
    ) -> Result<Frames, String> {
        self.text
            .extend(format!("printf '\\n{} end\\n'\n", self.tag).bytes());
        let timeout = wait.unwrap_or_default() + Duration::from_secs(30);
        let reply = host.script(&self.text, timeout).await?;
        parse(&reply.stdout, &self.tag).ok_or_else(|| {
            format!(
                "cannot read {what} on {}: unexpected answer (exit {}): {}",
                host.name,
                reply.code.map_or("?".into(), |c| c.to_string()),
                reply.stderr_text()
            )
        })
    }
}

/// Ask `host` about run `id`: wait up to `wait` for it to be final (None: not at all), then the
/// record and the two reads.
pub async fn probe(
    host: &Host,
    id: &str,
    wait: Option<Duration>,
    reads: (Read, Read),
) -> Result<Probe, String> {
    let ids = [id.to_string()];
    let mut s = Script::new()?;
    if let Some(w) = wait {
        s.wait(host, &ids, w, false)?;
    }
    s.status(host, &ids)?;
    s.logs(host, id, reads);
    let mut f = s.run(host, wait, &format!("run {id}")).await?;
    let bad = || format!("cannot read run {id} on {}: unexpected answer", host.name);
    if f.chunks.len() != 2 {
        return Err(bad());
    }
    let stderr = f.chunks.pop().ok_or_else(bad)?;
    let stdout = f.chunks.pop().ok_or_else(bad)?;
    let mut record = f.record;
    // The shell could not run agent-run at all: say so as plainly as a launch would.
    if let Err((Some(code @ (126 | 127)), msg)) = &record {
        let said = Reply {
            code: Some(*code),
            stdout: Vec::new(),
            stderr: msg.clone().into_bytes(),
        };
        record = Err((Some(*code), host.missing_message(&said)));
    }
    Ok(Probe {
        record,
        stdout,
        stderr,
    })
}

/// Several runs at one look.
#[derive(Debug)]
pub struct Look {
    /// One entry per id, in order: the record, or `{"run_id", "state": null, "error"}`.
    pub records: Vec<Value>,
    /// The sizes of each run's stdout and stderr (0 for a log that is not a regular file).
    pub sizes: Vec<(u64, u64)>,
}

/// Ask `host` about `ids` in one round trip: wait up to `wait` for them (`any`: for one of them)
/// to be final, then their records and the sizes of their logs.
pub async fn look(
    host: &Host,
    ids: &[String],
    wait: Option<Duration>,
    any: bool,
) -> Result<Look, String> {
    let mut s = Script::new()?;
    if let Some(w) = wait {
        s.wait(host, ids, w, any)?;
    }
    s.status(host, ids)?;
    for id in ids {
        s.logs(host, id, (Read::Size, Read::Size));
    }
    let f = s
        .run(host, wait, &format!("run {}", ids.join(", ")))
        .await?;
    let records = match f.record {
        Ok(Value::Array(a)) if a.len() == ids.len() => a,
        Ok(v @ Value::Object(_)) if ids.len() == 1 => vec![v],
        Ok(_) => {
            return Err(format!(
                "run {} on {}: status --json gave no record per run",
                ids.join(", "),
                host.name
            ))
        }
        // One id: agent-run says why on stderr (no such run: 69).
        Err((Some(69), msg)) if ids.len() == 1 => {
            vec![serde_json::json!({"run_id": ids[0], "state": null, "error": msg})]
        }
        Err((code, msg)) => {
            let said = Reply {
                code,
                stdout: Vec::new(),
                stderr: msg.clone().into_bytes(),
            };
            if said.bin_missing() {
                return Err(host.missing_message(&said));
            }
            return Err(format!("run {} on {}: {msg}", ids.join(", "), host.name));
        }
    };
    if f.chunks.len() != 2 * ids.len() {
        return Err(format!(
            "cannot read the logs of {} on {}",
            ids.join(", "),
            host.name
        ));
    }
    let sizes = f.chunks.chunks(2).map(|c| (c[0].size, c[1].size)).collect();
    Ok(Look { records, sizes })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// A script's answer, split at its tagged lines.
struct Frames {
    record: Result<Value, (Option<i32>, String)>,
    chunks: Vec<Chunk>,
}

/// Split the script's answer at its tagged lines.
fn parse(out: &[u8], tag: &str) -> Option<Frames> {
    let head = format!("{tag} status ");
    if !out.starts_with(head.as_bytes()) {
        return None;
    }
    let nl = find(out, b"\n", 0)?;
    let rc: i32 = std::str::from_utf8(&out[head.len()..nl])
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let sep = format!("\n{tag} ");
    let mut cuts = Vec::new();
    let mut at = nl;
    while let Some(p) = find(out, sep.as_bytes(), at) {
        cuts.push(p);
        at = p + 1;
    }
    let body = &out[nl + 1..*cuts.first()?];
    let record = if rc == 0 {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => Ok(v),
            Err(e) => Err((Some(rc), format!("status --json printed no JSON: {e}"))),
        }
    } else {
        let text = String::from_utf8_lossy(body);
        Err((
            Some(rc),
            text.lines()
                .map(|l| l.trim().trim_start_matches("agent-run: "))
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        ))
    };
    let mut chunks = Vec::new();
    let mut ended = false;
    for (i, &c) in cuts.iter().enumerate() {
        let line_start = c + sep.len();
        let line_end = find(out, b"\n", line_start)?;
        let line = std::str::from_utf8(&out[line_start..line_end]).ok()?;
        if line == "end" {
            ended = true;
            break;
        }
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 5 {
            return None;
        }
        let n: u64 = f[3].parse().ok()?;
        let data_end = cuts.get(i + 1).copied().unwrap_or(out.len());
        let data = &out[(line_end + 1).min(data_end)..data_end];
        // Never more than announced: a log that grew while dd read cannot move the frame.
        let data = &data[..data.len().min(n as usize)];
        chunks.push(Chunk {
            size: f[1].parse().ok()?,
            offset: f[2].parse().ok()?,
            data: data.to_vec(),
            kind: f[4].to_string(),
        });
    }
    if !ended {
        return None;
    }
    Some(Frames { record, chunks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_split_and_capped() {
        let out = b"@@abc status 0\n{\"final\": true}\n\n@@abc stdout 5 0 5 ok\nhello\n@@abc stderr 0 0 0 missing\n\n@@abc end\n";
        let f = parse(out, "@@abc").unwrap();
        assert_eq!(f.record.unwrap()["final"], true);
        assert_eq!(f.chunks[0].data, b"hello");
        assert_eq!((f.chunks[0].size, f.chunks[0].end()), (5, 5));
        assert_eq!(f.chunks[1].kind, "missing");
        assert!(f.chunks[1].data.is_empty());
    }

    #[test]
    fn an_unknown_run_is_an_error_record() {
        let out = b"@@t status 69\nagent-run: no such run x\n\n@@t stdout 0 0 0 missing\n\n@@t stderr 0 0 0 missing\n\n@@t end\n";
        let f = parse(out, "@@t").unwrap();
        assert_eq!(
            f.record.unwrap_err(),
            (Some(69), "no such run x".to_string())
        );
    }

    #[test]
    fn a_truncated_answer_is_refused() {
        assert!(parse(b"@@t status 0\n{}\n\n@@t stdout 5 0 5 ok\nhel", "@@t").is_none());
        assert!(parse(b"garbage", "@@t").is_none());
    }
}
