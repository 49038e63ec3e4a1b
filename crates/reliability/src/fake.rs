//! The fake OpenAI-compatible upstream of the battery: raw tokio HTTP/1.1
//! with keep-alive on loopback, answering `POST /v1/chat/completions` with
//! a chunked `text/event-stream`. What it streams is chosen by a directive
//! in the user message, `rel MODE TOKENS KEY` ([`directive`]):
//!
//! - `text`: `TOKENS` text tokens (`"t0 "`, `"t1 "`, ...), one per
//!   period given to [`Fake::start`], then `stop`;
//! - `stool`: a call of the server tool `test__slow` (the MCP test server)
//!   sleeping `TOKENS` ms, then, when the tool result comes back, a short
//!   text answer;
//! - `ctool`: a call of the caller-executed tool `lookup`, likewise;
//! - `lag`: like `text`, recording the instant just before each token's
//!   write under `KEY` ([`Fake::take_emits`]) so a client in this process
//!   measures relay lag on one clock;
//! - `long`: `TOKENS` fat tokens as fast as the socket takes them (abusive
//!   callers' turns);
//! - `gate`: one token, then nothing until the gate opens
//!   ([`Fake::set_gate`]), then `TOKENS` fat tokens at once: answers that
//!   are still streaming when the battery changes the world under them
//!   (the disk fills).
//!
//! A request whose last message is a tool result gets a short text answer;
//! anything else (a compaction summary, a title) a three-token answer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Largest request accepted (head + body).
const MAX_REQUEST: usize = 16 << 20;
/// Most emit records kept (a client that never collects them cannot grow
/// the map without bound).
const MAX_RECORDS: usize = 100_000;
/// Longest a `gate` answer waits for its gate: a battery that failed
/// before opening it must not leave the server's turns hanging for ever.
const GATE_LIMIT: Duration = Duration::from_secs(120);

/// What one turn's first model request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Text,
    ServerTool,
    CallerTool,
    Lag,
    Long,
    Gated,
}

impl Mode {
    fn word(self) -> &'static str {
        match self {
            Mode::Text => "text",
            Mode::ServerTool => "stool",
            Mode::CallerTool => "ctool",
            Mode::Lag => "lag",
            Mode::Long => "long",
            Mode::Gated => "gate",
        }
    }
}

/// The user message text that asks the fake for `mode`.
pub(crate) fn directive(mode: Mode, tokens: u32, key: &str) -> String {
    format!("rel {} {tokens} {key}", mode.word())
}

fn parse_directive(text: &str) -> Option<(Mode, u32, String)> {
    let mut words = text.split_whitespace();
    if words.next()? != "rel" {
        return None;
    }
    let mode = match words.next()? {
        "text" => Mode::Text,
        "stool" => Mode::ServerTool,
        "ctool" => Mode::CallerTool,
        "lag" => Mode::Lag,
        "long" => Mode::Long,
        "gate" => Mode::Gated,
        _ => return None,
    };
    let tokens = words.next()?.parse().ok()?;
    Some((mode, tokens, words.next()?.to_owned()))
}

/// The token indices in a text delta (`"t3 t4 "` → 3, 4).
pub(crate) fn token_indices(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix('t')?.parse().ok())
}

#[derive(Debug)]
struct Shared {
    period: Duration,
    emits: Mutex<HashMap<String, Vec<Instant>>>,
    /// Open (`true`) lets `gate` answers go on; closed at start.
    gate: tokio::sync::watch::Sender<bool>,
}

/// The running fake; dropping it closes the listener and every connection.
#[derive(Debug)]
pub(crate) struct Fake {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// Listens on `127.0.0.1:0`; paced tokens go one per `period`.
    pub(crate) async fn start(period: Duration) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("fake upstream bind: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("fake upstream address: {e}"))?;
        let shared = Arc::new(Shared {
            period,
            emits: Mutex::new(HashMap::new()),
            gate: tokio::sync::watch::Sender::new(false),
        });
        let task = tokio::spawn(accept(listener, Arc::clone(&shared)));
        Ok(Self { addr, shared, task })
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Opens (or closes) the gate that `gate` answers wait for.
    pub(crate) fn set_gate(&self, open: bool) {
        self.shared.gate.send_replace(open);
    }

    /// The emit instants of the `lag` stream `key` (removed).
    pub(crate) fn take_emits(&self, key: &str) -> Option<Vec<Instant>> {
        lock(&self.shared.emits).remove(key)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    // Owned here: aborting this task ends every connection too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let _ = socket.set_nodelay(true);
                connections.spawn(serve(socket, Arc::clone(&shared)));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

struct Request {
    path: String,
    close: bool,
    body: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn read_request(socket: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_REQUEST {
            return None;
        }
        let mut tmp = [0u8; 8192];
        let n = socket.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).ok()?.to_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let (mut length, mut close) = (0usize, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "connection" => close = value.trim().eq_ignore_ascii_case("close"),
            "transfer-encoding" => return None,
            _ => {}
        }
    }
    if length > MAX_REQUEST {
        return None;
    }
    while buf.len() < head_end + length {
        let mut tmp = vec![0u8; (head_end + length - buf.len()).min(1 << 16)];
        let n = socket.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf[head_end..head_end + length].to_vec();
    buf.drain(..head_end + length);
    Some(Request { path, close, body })
}

/// The role and text of the request's last message.
fn last_message(body: &[u8]) -> Option<(String, String)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let last = v.get("messages")?.as_array()?.last()?;
    let role = last.get("role")?.as_str()?.to_owned();
    let text = match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    Some((role, text))
}

async fn serve(mut socket: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut socket, &mut buf).await {
        if req.path != "/v1/chat/completions" {
            let r = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
            if socket.write_all(r).await.is_err() {
                return;
            }
            continue;
        }
        let (role, text) = last_message(&req.body).unwrap_or_default();
        let plan = match (role.as_str(), parse_directive(&text)) {
            ("user", Some(d)) => d,
            _ => (Mode::Text, 3, String::new()),
        };
        let ok = stream(&mut socket, &shared, plan).await;
        if !ok || req.close {
            return;
        }
    }
}

fn push_chunk(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

fn event(value: &Value) -> Vec<u8> {
    format!("data: {value}\n\n").into_bytes()
}

fn text_event(text: &str) -> Vec<u8> {
    event(&json!({"choices": [{"index": 0, "delta": {"content": text}}]}))
}

fn tool_call_event(id: &str, name: &str, arguments: &Value) -> Vec<u8> {
    event(
        &json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": id, "type": "function",
             "function": {"name": name, "arguments": arguments.to_string()}}
        ]}}]}),
    )
}

fn trailer(reason: &str, completion_tokens: u32) -> Vec<u8> {
    let mut out = event(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}));
    out.extend(event(&json!({"choices": [], "usage": {
        "prompt_tokens": 10, "completion_tokens": completion_tokens,
        "total_tokens": 10 + completion_tokens}})));
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

async fn write(socket: &mut TcpStream, payload: &[u8]) -> bool {
    let mut out = Vec::with_capacity(payload.len() + 16);
    push_chunk(&mut out, payload);
    socket.write_all(&out).await.is_ok()
}

/// Writes `tokens` fat (251-byte) text tokens as fast as the socket takes
/// them; `false` when the client went away.
async fn fat_tokens(socket: &mut TcpStream, tokens: u32) -> bool {
    let fat = format!("{} ", "x".repeat(250));
    let piece = text_event(&fat);
    let mut batch = Vec::new();
    for _ in 0..tokens {
        push_chunk(&mut batch, &piece);
        if batch.len() >= 16 * 1024 {
            if socket.write_all(&batch).await.is_err() {
                return false;
            }
            batch.clear();
        }
    }
    socket.write_all(&batch).await.is_ok()
}

/// Writes one streamed answer; `false` when the client went away.
async fn stream(socket: &mut TcpStream, shared: &Shared, plan: (Mode, u32, String)) -> bool {
    let (mode, tokens, key) = plan;
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\n\r\n";
    if socket.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let reason = match mode {
        Mode::ServerTool | Mode::CallerTool => {
            let (name, args) = if mode == Mode::ServerTool {
                ("test__slow", json!({"ms": tokens}))
            } else {
                ("lookup", json!({"key": key}))
            };
            if !write(
                socket,
                &tool_call_event(&format!("call-{key}"), name, &args),
            )
            .await
            {
                return false;
            }
            "tool_calls"
        }
        Mode::Long => {
            if !fat_tokens(socket, tokens).await {
                return false;
            }
            "stop"
        }
        Mode::Gated => {
            if !write(socket, &text_event("g ")).await {
                return false;
            }
            let mut gate = shared.gate.subscribe();
            // A timeout or a dropped fake opens it: the answer goes on.
            let _ = tokio::time::timeout(GATE_LIMIT, gate.wait_for(|open| *open)).await;
            if !fat_tokens(socket, tokens).await {
                return false;
            }
            "stop"
        }
        Mode::Text | Mode::Lag => {
            let mut emits = Vec::with_capacity(tokens as usize);
            for i in 0..tokens {
                if i > 0 && !shared.period.is_zero() {
                    tokio::time::sleep(shared.period).await;
                }
                let piece = text_event(&format!("t{i} "));
                emits.push(Instant::now());
                if !write(socket, &piece).await {
                    return false;
                }
            }
            if mode == Mode::Lag {
                let mut map = lock(&shared.emits);
                if map.len() < MAX_RECORDS {
                    map.insert(key, emits);
                }
            }
            "stop"
        }
    };
    let mut out = Vec::new();
    push_chunk(&mut out, &trailer(reason, tokens));
    out.extend_from_slice(b"0\r\n\r\n");
    socket.write_all(&out).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_round_trip() {
        for mode in [
            Mode::Text,
            Mode::ServerTool,
            Mode::CallerTool,
            Mode::Lag,
            Mode::Long,
            Mode::Gated,
        ] {
            let d = directive(mode, 7, "k-1");
            assert_eq!(parse_directive(&d), Some((mode, 7, "k-1".to_owned())));
        }
        assert_eq!(parse_directive("hello"), None);
        assert_eq!(parse_directive("rel nope 1 k"), None);
        assert_eq!(token_indices("t3 t4 x t5").collect::<Vec<_>>(), [3, 4, 5]);
    }

    #[test]
    fn the_last_message_is_read_from_either_content_shape() {
        let a = br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"rel text 1 k"}]}"#;
        assert_eq!(
            last_message(a),
            Some(("user".into(), "rel text 1 k".into()))
        );
        let b = br#"{"messages":[{"role":"tool","content":[{"type":"text","text":"r"}]}]}"#;
        assert_eq!(last_message(b), Some(("tool".into(), "r".into())));
    }
}
