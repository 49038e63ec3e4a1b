//! A timed fake of an OpenAI-compatible Chat Completions server.
//!
//! Raw tokio TCP speaking HTTP/1.1 with keep-alive: `POST
//! /v1/chat/completions` answers `text/event-stream` in chunked transfer
//! encoding, one HTTP chunk per SSE event. Each stream is configured by a
//! [`Ticket`]: the caller registers the stream's parameters (time to first
//! token, tokens/s, token count) under a key and puts the key in the user
//! message; the fake finds the key as the `content` of the request's last
//! message. Every token's text carries its index (`"t17 "`), and the fake
//! records the `Instant` just before each write, so a client in this process
//! maps a received delta to its emit time on one clock.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::MissedTickBehavior;

/// Unpaced streams are written in batches of about this many bytes.
const UNPACED_BATCH: usize = 16 * 1024;
/// Largest request accepted (head + body).
const MAX_REQUEST: usize = 8 << 20;

/// How one stream is shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StreamParams {
    /// From the request's arrival to the first token.
    pub(crate) ttft: Duration,
    /// Tokens in the answer.
    pub(crate) tokens: u32,
    /// Tokens per second; 0 writes them as fast as the socket takes them.
    pub(crate) rate: f64,
}

/// What the fake saw of one stream, set once before the final write.
#[derive(Debug, Clone)]
pub(crate) struct StreamTimes {
    /// The request was read completely.
    pub(crate) received: Instant,
    /// `emits[i]`: just before the write carrying token `i`.
    pub(crate) emits: Vec<Instant>,
}

/// Filled by the fake when the stream's tokens have been written.
#[derive(Debug, Default)]
pub(crate) struct StreamRecord {
    times: OnceLock<StreamTimes>,
}

impl StreamRecord {
    /// Waits (bounded) for the fake to finish the token phase of the stream.
    pub(crate) async fn wait(&self, limit: Duration) -> Option<&StreamTimes> {
        let until = Instant::now() + limit;
        loop {
            if let Some(t) = self.times.get() {
                return Some(t);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }
}

/// A registered stream: put `key` in the user message.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    pub(crate) key: String,
    pub(crate) record: Arc<StreamRecord>,
}

/// Counters of the fake.
#[derive(Debug, Default)]
pub(crate) struct FakeCounters {
    pub(crate) connections: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) unknown_keys: AtomicU64,
    /// Compaction summaries the server asked for (a long bench session
    /// passed the compaction budget); answered with a short default stream.
    pub(crate) summaries: AtomicU64,
    pub(crate) tokens: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    tickets: Mutex<HashMap<String, (StreamParams, Arc<StreamRecord>)>>,
    next_key: AtomicU64,
    counters: FakeCounters,
}

/// The running fake. Dropping it stops accepting (open streams finish).
#[derive(Debug)]
pub(crate) struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl FakeServer {
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            tickets: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            counters: FakeCounters::default(),
        });
        let accept = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    let _ = socket.set_nodelay(true);
                    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(serve_connection(socket, Arc::clone(&shared)));
                }
            }
        });
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    /// `http://127.0.0.1:PORT/v1`
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Registers a stream; its key must be the user message's text.
    pub(crate) fn ticket(&self, params: StreamParams) -> Ticket {
        let n = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        let key = format!("bench-{n}");
        let record = Arc::new(StreamRecord::default());
        lock(&self.shared.tickets).insert(key.clone(), (params, Arc::clone(&record)));
        Ticket { key, record }
    }

    pub(crate) fn counters(&self) -> &FakeCounters {
        &self.shared.counters
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The text of token `i`.
pub(crate) fn token_text(i: u32) -> String {
    format!("t{i} ")
}

/// The token indices in a text delta (`"t3 t4 "` → 3, 4).
pub(crate) fn token_indices(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix('t')?.parse().ok())
}

/// The SSE event of token `i`.
pub(crate) fn token_event(i: u32) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n")
}

/// The events after the last token: finish reason, usage, `[DONE]`.
pub(crate) fn trailer_events(prompt_tokens: u64, completion_tokens: u64) -> String {
    format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{completion_tokens}}}}}\n\n\
         data: [DONE]\n\n"
    )
}

/// Appends `payload` as one HTTP/1.1 chunk.
fn push_chunk(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// A parsed request.
struct Request {
    path: String,
    close: bool,
    body: Vec<u8>,
}

/// Reads one request (head + `Content-Length` body); `None` at a clean EOF
/// or on anything this fake does not speak.
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
    let mut first = lines.next()?.split(' ');
    let (_method, path) = (first.next()?, first.next()?.to_owned());
    let mut length = 0usize;
    let mut close = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().ok()?,
            "connection" => close = value.eq_ignore_ascii_case("close"),
            // Chunked request bodies are not needed by any client here.
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

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The text of the request's last message (where the bench puts the key).
fn last_message_text(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let last = v.get("messages")?.as_array()?.last()?;
    Some(last.get("content")?.as_str()?.to_owned())
}

/// Whether the request is the runtime's compaction summariser (its system
/// message is the summariser's prompt).
fn is_summary_request(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let first = v["messages"].get(0);
    first.is_some_and(|m| {
        m["role"] == "system"
            && m["content"].as_str() == Some(agentrt_runtime::compaction::SUMMARY_SYSTEM_PROMPT)
    })
}

async fn serve_connection(mut socket: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut socket, &mut buf).await {
        let received = Instant::now();
        shared.counters.requests.fetch_add(1, Ordering::Relaxed);
        if req.path != "/v1/chat/completions" {
            let r = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
            if socket.write_all(r).await.is_err() {
                return;
            }
            continue;
        }
        let key = last_message_text(&req.body).unwrap_or_default();
        let found = lock(&shared.tickets).remove(key.trim());
        let (params, record) = found.unwrap_or_else(|| {
            if is_summary_request(&req.body) {
                shared.counters.summaries.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.counters.unknown_keys.fetch_add(1, Ordering::Relaxed);
            }
            let default = StreamParams {
                ttft: Duration::ZERO,
                tokens: 3,
                rate: 0.0,
            };
            (default, Arc::new(StreamRecord::default()))
        });
        let prompt_tokens = (req.body.len() / 4) as u64;
        let ok = write_stream(&mut socket, params, received, &record, prompt_tokens).await;
        shared
            .counters
            .tokens
            .fetch_add(u64::from(params.tokens), Ordering::Relaxed);
        if !ok || req.close {
            return;
        }
    }
}

/// Writes one streamed answer; `false` when the client went away.
async fn write_stream(
    socket: &mut TcpStream,
    params: StreamParams,
    received: Instant,
    record: &StreamRecord,
    prompt_tokens: u64,
) -> bool {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                transfer-encoding: chunked\r\n\r\n";
    let mut emits = Vec::with_capacity(params.tokens as usize);
    let mut ok = socket.write_all(head.as_bytes()).await.is_ok();
    let first = tokio::time::Instant::from_std(received + params.ttft);
    let mut out = Vec::with_capacity(UNPACED_BATCH + 256);
    if ok && params.rate > 0.0 {
        // Delay, not Burst: after a stall (the fake shares its cores with
        // the server and the clients) Burst would fire every missed tick at
        // once, sending a clump of tokens back to back that the relay then
        // sees as one read. Delay keeps tokens at least a period apart, as a
        // real model server does; the achieved rate is reported instead.
        let period = Duration::from_secs_f64(1.0 / params.rate);
        // With no TTFT the first token goes at once: even an elapsed tokio
        // deadline waits for the timer's next 1 ms tick.
        let now_first = params.ttft.is_zero();
        let start = if now_first { first + period } else { first };
        let mut ticks = tokio::time::interval_at(start, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        for i in 0..params.tokens {
            if i > 0 || !now_first {
                ticks.tick().await;
            }
            out.clear();
            push_chunk(&mut out, token_event(i).as_bytes());
            emits.push(Instant::now());
            if socket.write_all(&out).await.is_err() {
                ok = false;
                break;
            }
        }
    } else if ok {
        if !params.ttft.is_zero() {
            tokio::time::sleep_until(first).await;
        }
        let mut i = 0;
        while i < params.tokens {
            out.clear();
            let start = i;
            while i < params.tokens && out.len() < UNPACED_BATCH {
                push_chunk(&mut out, token_event(i).as_bytes());
                i += 1;
            }
            let now = Instant::now();
            emits.extend((start..i).map(|_| now));
            if socket.write_all(&out).await.is_err() {
                ok = false;
                break;
            }
        }
    }
    // Recorded before the trailer, so the relay cannot finish the turn
    // before the times are readable.
    let _ = record.times.set(StreamTimes { received, emits });
    if !ok {
        return false;
    }
    out.clear();
    push_chunk(
        &mut out,
        trailer_events(prompt_tokens, u64::from(params.tokens)).as_bytes(),
    );
    // The terminating chunk goes in the same write as [DONE], so a client
    // that stops reading at [DONE] still finds the body complete and can
    // reuse the connection.
    out.extend_from_slice(b"0\r\n\r\n");
    socket.write_all(&out).await.is_ok()
}

/// An incremental `text/event-stream` reader: the `data` of each event.
#[derive(Debug, Default)]
pub(crate) struct SseReader {
    buf: Vec<u8>,
}

impl SseReader {
    /// Feeds bytes; appends the data of every completed event to `out`.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<String>) {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = find(&self.buf[start..], b"\n\n") {
            let block = String::from_utf8_lossy(&self.buf[start..start + end]);
            let data: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
            start += end + 2;
        }
        self.buf.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_chunks_have_the_openai_shape() {
        let e = token_event(17);
        assert_eq!(
            e,
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t17 \"}}]}\n\n"
        );
        let json: serde_json::Value = serde_json::from_str(&e[6..]).unwrap();
        assert_eq!(json["choices"][0]["delta"]["content"], token_text(17));
        let mut events = Vec::new();
        SseReader::default().push(trailer_events(5, 2).as_bytes(), &mut events);
        assert_eq!(events.len(), 3);
        let finish: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        let usage: serde_json::Value = serde_json::from_str(&events[1]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 2);
        assert_eq!(events[2], "[DONE]");
    }

    #[test]
    fn the_reader_reassembles_events_split_anywhere() {
        let mut wire = String::new();
        for i in 0..5 {
            wire.push_str(&token_event(i));
        }
        for split in 1..wire.len() {
            let mut reader = SseReader::default();
            let mut out = Vec::new();
            reader.push(&wire.as_bytes()[..split], &mut out);
            reader.push(&wire.as_bytes()[split..], &mut out);
            assert_eq!(out.len(), 5, "split at {split}");
        }
        assert_eq!(token_indices("t3 t4 x t5").collect::<Vec<_>>(), [3, 4, 5]);
    }

    #[test]
    fn chunks_are_framed_for_chunked_transfer_encoding() {
        let mut out = Vec::new();
        push_chunk(&mut out, &[b'a'; 26]);
        assert_eq!(out, b"1a\r\naaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }

    /// The fake read back over HTTP by reqwest and [`SseReader`]: paced
    /// tokens in order with increasing emit times, keep-alive reuse.
    #[tokio::test]
    async fn streams_read_back_over_http_with_emit_times() {
        let fake = FakeServer::start().await.unwrap();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for paced in [true, false] {
            let ticket = fake.ticket(StreamParams {
                ttft: Duration::from_millis(2),
                tokens: 5,
                rate: if paced { 1000.0 } else { 0.0 },
            });
            let body = serde_json::json!({
                "model": "m", "stream": true,
                "messages": [{"role": "user", "content": ticket.key}],
            });
            let mut resp = client
                .post(format!("{}/chat/completions", fake.base_url()))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(
                resp.headers()["content-type"].to_str().unwrap(),
                "text/event-stream"
            );
            let mut reader = SseReader::default();
            let mut events = Vec::new();
            while let Some(bytes) = resp.chunk().await.unwrap() {
                reader.push(&bytes, &mut events);
            }
            assert_eq!(events.len(), 5 + 3);
            let text: String = events[..5]
                .iter()
                .map(|e| {
                    let v: serde_json::Value = serde_json::from_str(e).unwrap();
                    v["choices"][0]["delta"]["content"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            assert_eq!(token_indices(&text).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
            assert_eq!(events[7], "[DONE]");
            let times = ticket.record.wait(Duration::from_secs(1)).await.unwrap();
            assert_eq!(times.emits.len(), 5);
            assert!(times.emits[0] >= times.received + Duration::from_millis(2));
            assert!(times.emits.windows(2).all(|w| w[0] <= w[1]));
            if paced {
                // The pacing never runs ahead of its schedule (it only falls
                // behind under load), so this lower bound cannot flake:
                // token 4 goes no earlier than TTFT + 4 periods.
                assert!(times.emits[4] >= times.received + Duration::from_millis(2 + 4));
            }
        }
        let c = fake.counters();
        assert_eq!(c.requests.load(Ordering::Relaxed), 2);
        assert_eq!(c.connections.load(Ordering::Relaxed), 1, "keep-alive");
        assert_eq!(c.unknown_keys.load(Ordering::Relaxed), 0);
    }
}
