//! A scripted stand-in for an OpenAI-compatible Chat Completions server on
//! a loopback port: it fakes the upstream of the HTTP providers, so their
//! real code (connection, SSE parsing, error mapping, retries) runs in
//! tests — the providers' own and the workspace's end-to-end tests.
//!
//! A test starts it with a script ([`FakeOpenAi::start`]), points a
//! provider's `base_url` at [`FakeOpenAi::base_url`], and afterwards reads
//! what was sent ([`FakeOpenAi::requests`]) or waits on what happened
//! ([`FakeOpenAi::wait_requests`], [`FakeOpenAi::wait_clients_gone`]). The
//! chunk builders below ([`text_chunk`], [`finish_chunk`], ...) write the
//! script's bodies.
//!
//! It speaks just enough HTTP/1.1: it reads one request per connection
//! (headers plus a `Content-Length` body), records it, answers with the next
//! scripted [`FakeReply`] and closes. Streaming bodies are close-delimited,
//! so closing early looks to the client like a cleanly ended body: exactly
//! the "stream cut before `[DONE]`" case providers must detect themselves.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// What the fake answers to one request.
#[derive(Debug, Clone)]
pub enum FakeReply {
    /// `200 OK` with `text/event-stream`, then `chunks` written one write
    /// each, then `data: [DONE]\n\n` when `done`. With `then_hang` the
    /// connection stays open (silent) until the client goes away, which is
    /// then counted by [`FakeOpenAi::clients_gone`]; otherwise it is closed.
    Sse {
        /// Raw body pieces, written in order.
        chunks: Vec<Vec<u8>>,
        /// Append the `[DONE]` sentinel event.
        done: bool,
        /// Keep the connection open after the last piece.
        then_hang: bool,
    },
    /// `200 OK` with `text/event-stream`, then `chunk` written again and
    /// again, never ending, until the client goes away (counted by
    /// [`FakeOpenAi::clients_gone`]): an upstream that never stops talking.
    /// [`FakeOpenAi::bytes_streamed`] says how much of it was written.
    Endless {
        /// The raw body piece repeated.
        chunk: Vec<u8>,
    },
    /// `200 OK` with `text/event-stream`, then `chunks`, then the
    /// connection reset (RST, not a clean close): a peer or a middlebox
    /// dropping the stream mid-way.
    Reset {
        /// Raw body pieces written before the reset.
        chunks: Vec<Vec<u8>>,
    },
    /// `200 OK` with `text/event-stream`, then `chunks` one at a time,
    /// `every` apart, then `[DONE]` when `done`, then close: a slow but
    /// live upstream.
    Drip {
        /// Raw body pieces, written in order.
        chunks: Vec<Vec<u8>>,
        /// The pause before each piece.
        every: std::time::Duration,
        /// Append the `[DONE]` sentinel event.
        done: bool,
    },
    /// This request's connection is reset unanswered and the fake stops
    /// listening: every later connection is refused. The replies before it
    /// are served as usual, so a turn can meet a refusal mid-way (e.g.
    /// after a tool call).
    Refuse,
    /// A non-streaming reply with this status and JSON body.
    Status {
        /// HTTP status code.
        code: u16,
        /// Response body.
        body: String,
    },
    /// Like [`FakeReply::Status`], with extra response headers (e.g.
    /// `Retry-After`).
    StatusWithHeaders {
        /// HTTP status code.
        code: u16,
        /// Extra headers, written as given.
        headers: Vec<(String, String)>,
        /// Response body.
        body: String,
    },
}

impl FakeReply {
    /// A complete stream: `chunks`, then `[DONE]`, then close.
    pub fn sse(chunks: Vec<Vec<u8>>) -> Self {
        Self::Sse {
            chunks,
            done: true,
            then_hang: false,
        }
    }
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// e.g. `POST`.
    pub method: String,
    /// e.g. `/v1/chat/completions`.
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Value::Null` when it was not JSON).
    pub body: Value,
}

impl RecordedRequest {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
struct Shared {
    script: Mutex<Vec<FakeReply>>,
    requests: Mutex<Vec<RecordedRequest>>,
    requests_seen: watch::Sender<usize>,
    clients_gone: watch::Sender<usize>,
    endless_bytes: std::sync::atomic::AtomicU64,
}

/// The running fake. Dropping it stops the server and its connections.
#[derive(Debug)]
pub struct FakeOpenAi {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeOpenAi {
    /// Listens on an ephemeral loopback port. Request `n` (from 0) gets
    /// `script[n]`; the last entry repeats; an empty script answers 500.
    pub async fn start(script: Vec<FakeReply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the fake server");
        let addr = listener.local_addr().expect("local address of the fake");
        let shared = Arc::new(Shared {
            script: Mutex::new(script),
            requests: Mutex::new(Vec::new()),
            requests_seen: watch::Sender::new(0),
            clients_gone: watch::Sender::new(0),
            endless_bytes: std::sync::atomic::AtomicU64::new(0),
        });
        let server = tokio::spawn(serve(listener, Arc::clone(&shared)));
        Self {
            addr,
            shared,
            server,
        }
    }

    /// `http://127.0.0.1:<port>/v1`, ready for a provider's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Adds `replies` to the end of the script: for a test whose later
    /// replies depend on what the server answered before (an id it made).
    pub fn extend(&self, replies: impl IntoIterator<Item = FakeReply>) {
        self.shared
            .script
            .lock()
            .expect("fake state")
            .extend(replies);
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().expect("fake state").clone()
    }

    /// Waits until at least `n` requests have been received.
    pub async fn wait_requests(&self, n: usize) {
        let mut rx = self.shared.requests_seen.subscribe();
        rx.wait_for(|seen| *seen >= n)
            .await
            .expect("the sender lives in self");
    }

    /// Body bytes written by [`FakeReply::Endless`] replies so far.
    pub fn bytes_streamed(&self) -> u64 {
        self.shared
            .endless_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many hanging streams have seen their client go away.
    pub fn clients_gone(&self) -> usize {
        *self.shared.clients_gone.borrow()
    }

    /// Waits until at least `n` hanging streams have seen their client go
    /// away (EOF or reset on the socket).
    pub async fn wait_clients_gone(&self, n: usize) {
        let mut rx = self.shared.clients_gone.subscribe();
        rx.wait_for(|gone| *gone >= n)
            .await
            .expect("the sender lives in self");
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    // Owning the connections here means aborting this task ends them too.
    let mut connections = JoinSet::new();
    let mut index = 0usize;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else { continue };
                if matches!(reply_for(&shared, index), FakeReply::Refuse) {
                    record_then_reset(socket, &shared).await;
                    break;
                }
                connections.spawn(handle(socket, Arc::clone(&shared), index));
                index += 1;
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Closed: new connections are refused; the open ones finish.
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// What request `index` gets: its entry, else the last one, else a 500.
fn reply_for(shared: &Shared, index: usize) -> FakeReply {
    let script = shared.script.lock().expect("fake state");
    script
        .get(index)
        .or(script.last())
        .cloned()
        .unwrap_or(FakeReply::Status {
            code: 500,
            body: r#"{"error":{"message":"no scripted reply"}}"#.into(),
        })
}

/// Records the request on `socket`, then resets the connection.
async fn record_then_reset(mut socket: TcpStream, shared: &Shared) {
    if let Some(request) = read_request(&mut socket).await {
        shared.requests.lock().expect("fake state").push(request);
        shared.requests_seen.send_modify(|n| *n += 1);
    }
    let _ = socket.set_zero_linger();
}

const STREAM_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                           cache-control: no-cache\r\nconnection: close\r\n\r\n";

async fn handle(mut socket: TcpStream, shared: Arc<Shared>, index: usize) {
    // Each scripted piece should leave as its own segment, so clients see
    // the splits the script asks for as often as TCP allows.
    let _ = socket.set_nodelay(true);
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    shared.requests.lock().expect("fake state").push(request);
    shared.requests_seen.send_modify(|n| *n += 1);

    match reply_for(&shared, index) {
        // Handled by the accept loop.
        FakeReply::Refuse => {}
        FakeReply::Reset { chunks } => {
            if socket.write_all(STREAM_HEAD.as_bytes()).await.is_err() {
                return;
            }
            for chunk in &chunks {
                if socket.write_all(chunk).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
            let _ = socket.flush().await;
            // SO_LINGER 0: dropping the socket sends RST.
            let _ = socket.set_zero_linger();
        }
        FakeReply::Drip {
            chunks,
            every,
            done,
        } => {
            if socket.write_all(STREAM_HEAD.as_bytes()).await.is_err() {
                return;
            }
            let done_chunk = done.then(|| b"data: [DONE]\n\n".to_vec());
            for chunk in chunks.iter().chain(done_chunk.iter()) {
                tokio::time::sleep(every).await;
                if socket.write_all(chunk).await.is_err() {
                    return;
                }
            }
            let _ = socket.shutdown().await;
        }
        FakeReply::Status { code, body } => write_status(&mut socket, code, &[], &body).await,
        FakeReply::StatusWithHeaders {
            code,
            headers,
            body,
        } => write_status(&mut socket, code, &headers, &body).await,
        FakeReply::Endless { chunk } => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                        cache-control: no-cache\r\nconnection: close\r\n\r\n";
            if socket.write_all(head.as_bytes()).await.is_ok() {
                while socket.write_all(&chunk).await.is_ok() {
                    shared
                        .endless_bytes
                        .fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
            shared.clients_gone.send_modify(|n| *n += 1);
        }
        FakeReply::Sse {
            chunks,
            done,
            then_hang,
        } => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                        cache-control: no-cache\r\nconnection: close\r\n\r\n";
            if socket.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let done_chunk = done.then(|| b"data: [DONE]\n\n".to_vec());
            for chunk in chunks.iter().chain(done_chunk.iter()) {
                if socket.write_all(chunk).await.is_err() {
                    return;
                }
                // Give the client a chance to read this piece on its own.
                tokio::task::yield_now().await;
            }
            if then_hang {
                let mut buf = [0u8; 1024];
                // The client sends nothing more, so any return from read
                // (EOF or an error such as a reset) means it went away.
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                shared.clients_gone.send_modify(|n| *n += 1);
            } else {
                let _ = socket.shutdown().await;
            }
        }
    }
}

async fn write_status(socket: &mut TcpStream, code: u16, headers: &[(String, String)], body: &str) {
    let reason = http::StatusCode::from_u16(code)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Status");
    let mut head = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = socket.write_all(head.as_bytes()).await;
    let _ = socket.write_all(body.as_bytes()).await;
    let _ = socket.shutdown().await;
}

async fn read_request(socket: &mut TcpStream) -> Option<RecordedRequest> {
    const MAX_HEAD: usize = 64 * 1024;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf.split_off(head_end + 4);
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(RecordedRequest {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// `data: <json>\n\n`.
pub fn sse_data(value: &Value) -> Vec<u8> {
    format!("data: {value}\n\n").into_bytes()
}

fn chunk_with(choices: Value) -> Vec<u8> {
    sse_data(&json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": choices,
    }))
}

/// A chunk whose delta carries assistant text.
pub fn text_chunk(text: &str) -> Vec<u8> {
    chunk_with(json!([{ "index": 0, "delta": { "content": text }, "finish_reason": null }]))
}

/// A chunk whose delta carries reasoning (`reasoning_content`).
pub fn reasoning_chunk(text: &str) -> Vec<u8> {
    chunk_with(json!([
        { "index": 0, "delta": { "reasoning_content": text }, "finish_reason": null }
    ]))
}

/// A chunk with an empty delta and this `finish_reason`.
pub fn finish_chunk(reason: &str) -> Vec<u8> {
    chunk_with(json!([{ "index": 0, "delta": {}, "finish_reason": reason }]))
}

/// The trailing usage chunk (`choices: []`), as sent with
/// `stream_options.include_usage`.
pub fn usage_chunk(prompt_tokens: u64, completion_tokens: u64) -> Vec<u8> {
    sse_data(&json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }))
}

/// Splits `bytes` into pieces of at most `n` bytes (`n` of 0 counts as 1).
pub fn slice_bytes(bytes: &[u8], n: usize) -> Vec<Vec<u8>> {
    bytes.chunks(n.max(1)).map(<[u8]>::to_vec).collect()
}
