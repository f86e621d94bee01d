//! output.idx: the order in which the keeper appended to stdout.log and stderr.log, so that
//! `attach` and `logs` replay both logs in the order they were written.
//!
//! The file is a 16-byte header (`agent-run-idx v1`), then 16-byte records: the stream (`o` or
//! `e`), seven zero bytes, and that log's end offset after the keeper's append (u64, little
//! endian). The keeper notes one record per stream that moved, in the order they moved, and
//! writes a round's records with one write(2) after the round ([`IndexWriter`]). A reader copies
//! each log up to each record's offset in turn ([`Ordered`]). The order is the keeper's: bytes
//! both streams wrote within one round of its drain loop (microseconds apart) come stdout
//! first.
//!
//! The workload can write into the file (it is the same user's). A record that does not parse,
//! an offset that goes back, or one past its log's end makes the reader fall back to each log
//! in its own order (today's order before the index), with a note on stderr: never a hang.

use crate::keeper::Stream;
use crate::stream::{std_sink, Tail};
use agent_run_shared::run_dir::{files, RunDir};
use std::fs::File;
use std::io::Write;

/// The index, in the run dir.
pub const FILE: &str = "output.idx";
/// Its first 16 bytes.
const HEADER: &[u8; RECORD] = b"agent-run-idx v1";
/// One record's size.
const RECORD: usize = 16;
/// The most index bytes read per look.
const READ: usize = 64 << 10;

fn code(s: Stream) -> u8 {
    match s {
        Stream::Stdout => b'o',
        Stream::Stderr => b'e',
    }
}

/// The keeper's side: records noted during a round, written after it.
pub struct IndexWriter {
    file: Option<File>,
    pending: Vec<u8>,
}

impl IndexWriter {
    /// Create the index (0600, never through a symlink), with its header. Without it (it could
    /// not be made) nothing is written and readers fall back to each log's own order.
    pub fn open(dir: Option<&RunDir>) -> IndexWriter {
        let mut file = dir.and_then(|d| d.open_append(FILE).ok());
        if let Some(f) = &mut file {
            if f.write_all(HEADER).is_err() {
                file = None;
            }
        }
        IndexWriter {
            file,
            pending: Vec::new(),
        }
    }

    /// `stream`'s log now ends at `end`. A stream noted twice in a row keeps one record.
    pub fn note(&mut self, stream: Stream, end: u64) {
        if self.file.is_none() {
            return;
        }
        let n = self.pending.len();
        if n >= RECORD && self.pending[n - RECORD] == code(stream) {
            self.pending[n - 8..].copy_from_slice(&end.to_le_bytes());
            return;
        }
        self.pending.push(code(stream));
        self.pending.extend_from_slice(&[0; 7]);
        self.pending.extend_from_slice(&end.to_le_bytes());
    }

    /// Write the round's records: one write(2). A failed write (full disk) drops the index for
    /// good: readers then see its end early and fall back.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(f) = &mut self.file {
            if f.write_all(&self.pending).is_err() {
                self.file = None;
            }
        }
        self.pending.clear();
    }
}

/// What the index says next.
enum Next {
    /// Copy this stream up to this offset.
    Upto(Stream, u64),
    /// Nothing more yet.
    Wait,
    /// Not an index the keeper wrote: why.
    Damaged(String),
}

/// A reader of the index, from its start, in bounded reads.
struct IndexReader {
    file: File,
    /// Bytes of the file consumed (header included).
    at: u64,
    buf: Vec<u8>,
    pos: usize,
    /// The last offset seen per stream (stdout, stderr).
    last: [u64; 2],
    /// The header was read.
    header: bool,
}

impl IndexReader {
    fn next(&mut self) -> Next {
        if self.pos + RECORD > self.buf.len() {
            let rest = self.buf.split_off(self.pos);
            self.buf = rest;
            self.pos = 0;
            let have = self.buf.len();
            self.buf.resize(have + READ, 0);
            let n = loop {
                match rustix::io::pread(&self.file, &mut self.buf[have..], self.at) {
                    Ok(n) => break n,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        self.buf.truncate(have);
                        return Next::Damaged(format!("cannot be read ({e})"));
                    }
                }
            };
            self.buf.truncate(have + n);
            self.at += n as u64;
            if self.buf.len() < RECORD {
                return Next::Wait;
            }
        }
        let r = &self.buf[self.pos..self.pos + RECORD];
        self.pos += RECORD;
        if !self.header {
            if r != HEADER {
                return Next::Damaged("does not start with its header".into());
            }
            self.header = true;
            return self.next();
        }
        let end = u64::from_le_bytes(r[8..].try_into().expect("8 bytes"));
        let (stream, i) = match r[0] {
            b'o' => (Stream::Stdout, 0),
            b'e' => (Stream::Stderr, 1),
            _ => return Next::Damaged("holds a record that is not the keeper's".into()),
        };
        if r[1..8] != [0; 7] {
            return Next::Damaged("holds a record that is not the keeper's".into());
        }
        if end < self.last[i] {
            return Next::Damaged(format!("goes back in {}", stream.log()));
        }
        self.last[i] = end;
        Next::Upto(stream, end)
    }
}

/// Both logs copied to our stdout and stderr in the order the keeper wrote them.
pub struct Ordered {
    dir: RunDir,
    out: Tail,
    err: Tail,
    /// None before the index is found, or after a fallback.
    index: Option<IndexReader>,
    /// Each log in its own order from now on (no index, or a damaged one).
    fallback: bool,
}

impl Ordered {
    /// Copy stdout.log from `from.0` and stderr.log from `from.1`; records below them are
    /// already copied (a resumed stream).
    pub fn new(dir: &RunDir, from: (u64, u64)) -> Ordered {
        Ordered {
            dir: dir.clone(),
            out: Tail::new(dir, files::STDOUT, std_sink(false)).starting_at(from.0),
            err: Tail::new(dir, files::STDERR, std_sink(true)).starting_at(from.1),
            index: None,
            fallback: false,
        }
    }

    /// Copy what the index says is there. `last`: the run is final (no writer is left), so what
    /// the index has not named (or all of it, without an index) is copied as it is.
    /// Returns whether any byte moved.
    pub fn pump(&mut self, last: bool) -> bool {
        let before = self.out.copied + self.err.copied;
        if !self.fallback && self.index.is_none() {
            self.open_index(last);
        }
        if let Some(ix) = &mut self.index {
            loop {
                match ix.next() {
                    Next::Upto(s, end) => {
                        let t = match s {
                            Stream::Stdout => &mut self.out,
                            Stream::Stderr => &mut self.err,
                        };
                        if !t.pump_to(end) {
                            let why = format!("names bytes past the end of {}", s.log());
                            self.fall_back(&why);
                            break;
                        }
                    }
                    Next::Wait => break,
                    Next::Damaged(why) => {
                        self.fall_back(&why);
                        break;
                    }
                }
            }
        }
        if self.fallback || last {
            self.out.pump();
            self.err.pump();
        }
        self.out.copied + self.err.copied != before
    }

    /// Open the index once it exists. The keeper makes it when it starts, before it appends a
    /// byte: missing while the logs are empty and the run is live means not yet (nothing waits
    /// to be copied). Missing otherwise: a keeper of an older agent-run, or one that could not
    /// make it.
    fn open_index(&mut self, last: bool) {
        let e = match self.dir.open_run_file(FILE) {
            Ok((file, _)) => {
                self.index = Some(IndexReader {
                    file,
                    at: 0,
                    buf: Vec::new(),
                    pos: 0,
                    last: [0, 0],
                    header: false,
                });
                return;
            }
            Err(e) => e,
        };
        let size = |n| self.dir.open_run_file(n).map_or(0, |(_, m)| m.len());
        let (out, err) = (size(files::STDOUT), size(files::STDERR));
        let missing = matches!(e, agent_run_shared::Error::Missing { .. });
        if missing && !last && out == 0 && err == 0 {
            return;
        }
        // Order matters only when both logs hold something.
        if missing && (out == 0 || err == 0) {
            self.fallback = true;
        } else {
            self.fall_back(&format!("cannot be used ({e})"));
        }
    }

    fn fall_back(&mut self, why: &str) {
        self.index = None;
        self.fallback = true;
        crate::human::say(&format!(
            "{FILE} {why}; stdout and stderr follow each in its own order from here"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_coalesce_per_stream_and_read_back_in_order() {
        let mut w = IndexWriter {
            file: None,
            pending: Vec::new(),
        };
        // Without a file nothing is kept.
        w.note(Stream::Stdout, 3);
        assert!(w.pending.is_empty());
        let path = std::env::temp_dir().join(format!("agent-run-idx-test.{}", std::process::id()));
        w.file = Some(File::create(&path).unwrap());
        w.file.as_mut().unwrap().write_all(HEADER).unwrap();
        w.note(Stream::Stdout, 3);
        w.note(Stream::Stdout, 5);
        w.note(Stream::Stderr, 2);
        w.flush();
        w.note(Stream::Stdout, 9);
        w.flush();
        let mut r = IndexReader {
            file: File::open(&path).unwrap(),
            at: 0,
            buf: Vec::new(),
            pos: 0,
            last: [0, 0],
            header: false,
        };
        let mut seen = Vec::new();
        while let Next::Upto(s, e) = r.next() {
            seen.push((s, e));
        }
        assert_eq!(
            seen,
            [
                (Stream::Stdout, 5),
                (Stream::Stderr, 2),
                (Stream::Stdout, 9)
            ]
        );
        // A record going back is damage, as is garbage.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&[b'o', 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
            .unwrap();
        assert!(matches!(r.next(), Next::Damaged(_)));
        let _ = std::fs::remove_file(&path);
    }
}
