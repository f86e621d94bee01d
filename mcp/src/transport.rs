//! The stdio transport: newline-delimited JSON-RPC on stdin and stdout.
//!
//! rmcp's own stdio transport drops a line that is not JSON without a word (rust-sdk#938): a
//! client that sent one waits for an answer that never comes. This one answers it as JSON-RPC 2.0
//! asks: error -32700 with `"id": null`. A line that is JSON but no JSON-RPC message gets -32600,
//! with its id when it has a usable one; a notification rmcp does not know is ignored (it asks no
//! answer). Everything else goes to rmcp as before.
//!
//! stdin and stdout are read and written without a blocking thread when they are pipes (rmcp's
//! `stdio_pipes`), so nothing here can hold the runtime's shutdown while a client keeps stdin open.
//! A line longer than [`MAX_LINE`] is dropped and answered -32700.

use rmcp::model::ErrorCode;
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::{StdioReader, StdioWriter, Transport};
use serde::Serialize;
use serde_json::Value;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// The longest line read (rmcp's own bound).
pub const MAX_LINE: usize = 16 << 20;

pub struct Stdio {
    read: BufReader<StdioReader>,
    /// A line read so far (kept across a cancelled `receive`).
    line: Vec<u8>,
    /// Dropping the rest of a line over [`MAX_LINE`].
    discarding: bool,
    write: Arc<Mutex<StdioWriter>>,
}

impl Stdio {
    pub fn new() -> Stdio {
        let (r, w) = rmcp::transport::stdio_pipes();
        Stdio {
            read: BufReader::new(r),
            line: Vec::new(),
            discarding: false,
            write: Arc::new(Mutex::new(w)),
        }
    }

    /// Write one line, in a task of its own: `receive` may be dropped at any await, and a line
    /// must never be cut in the middle of the stream.
    fn write_line(&self, bytes: Vec<u8>) {
        let w = self.write.clone();
        tokio::spawn(async move {
            let mut w = w.lock().await;
            let _ = w.write_all(&bytes).await;
            let _ = w.flush().await;
        });
    }

    /// An error answer for a message we could not take.
    fn answer_error(&self, id: Value, code: ErrorCode, message: String) {
        #[derive(Serialize)]
        struct Error {
            code: i32,
            message: String,
        }
        #[derive(Serialize)]
        struct Answer {
            jsonrpc: &'static str,
            id: Value,
            error: Error,
        }
        let a = Answer {
            jsonrpc: "2.0",
            id,
            error: Error {
                code: code.0,
                message,
            },
        };
        if let Ok(mut bytes) = serde_json::to_vec(&a) {
            bytes.push(b'\n');
            self.write_line(bytes);
        }
    }

    /// The next whole line into `self.line` (without its newline); None at EOF or a read error.
    async fn next_line(&mut self) -> Option<bool> {
        loop {
            let (take, done) = {
                let buf = match self.read.fill_buf().await {
                    Ok(b) => b,
                    Err(e) => {
                        crate::say(&format!("cannot read stdin: {e}"));
                        return None;
                    }
                };
                if buf.is_empty() {
                    return None;
                }
                let nl = buf.iter().position(|&b| b == b'\n');
                let take = nl.map_or(buf.len(), |i| i + 1);
                let body = &buf[..nl.unwrap_or(buf.len())];
                if !self.discarding {
                    if self.line.len() + body.len() > MAX_LINE {
                        self.line.clear();
                        self.discarding = true;
                    } else {
                        self.line.extend_from_slice(body);
                    }
                }
                (take, nl.is_some())
            };
            self.read.consume(take);
            if done {
                // Some(false): a line over the bound was dropped.
                return Some(!std::mem::replace(&mut self.discarding, false));
            }
        }
    }

    /// Take one line: Some(message) for rmcp, None when it was answered or ignored here.
    fn take(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let value: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                self.answer_error(
                    Value::Null,
                    ErrorCode::PARSE_ERROR,
                    format!("Parse error: the line is not JSON ({e})"),
                );
                return None;
            }
        };
        let id = value.get("id").cloned();
        let method = value
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
            Ok(m) => Some(m),
            // A notification asks no answer, and rmcp does not know every one a client sends.
            Err(_) if id.is_none() && method.is_some() => None,
            Err(e) => {
                let id = match id {
                    Some(v @ (Value::String(_) | Value::Number(_))) => v,
                    _ => Value::Null,
                };
                self.answer_error(
                    id,
                    ErrorCode::INVALID_REQUEST,
                    format!("Invalid Request: not a JSON-RPC 2.0 message this server takes ({e})"),
                );
                None
            }
        }
    }
}

impl Transport<RoleServer> for Stdio {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), io::Error>> + Send + 'static {
        let w = self.write.clone();
        let bytes = serde_json::to_vec(&item).map(|mut b| {
            b.push(b'\n');
            b
        });
        async move {
            let bytes = bytes.map_err(io::Error::other)?;
            let mut w = w.lock().await;
            w.write_all(&bytes).await?;
            w.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let whole = self.next_line().await?;
            let line = std::mem::take(&mut self.line);
            if !whole {
                self.answer_error(
                    Value::Null,
                    ErrorCode::PARSE_ERROR,
                    format!("Parse error: a line longer than {MAX_LINE} bytes was dropped"),
                );
                continue;
            }
            let taken = self.take(&line);
            // Keep the buffer's capacity for the next line.
            self.line = line;
            self.line.clear();
            if let Some(m) = taken {
                return Some(m);
            }
        }
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        let mut w = self.write.lock().await;
        w.flush().await
    }
}
