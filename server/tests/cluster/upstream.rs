//! The model upstream of the cluster tests: an OpenAI-compatible Chat
//! Completions server on loopback whose reply is chosen by the request's
//! content, not by its arrival order, because requests come from three
//! replica processes at once. The test controls how long a turn stays live
//! ([`Upstream::release`]) and observes what each replica did
//! ([`Upstream::wait_requested`], [`Upstream::wait_gone`]).
//!
//! The last message of a request picks the reply:
//! - user text `hold KEY N`: N text deltas, then silence until the test
//!   releases KEY (then `end`, `finish_reason: stop`, `[DONE]`) or the
//!   replica closes the request (recorded as KEY gone);
//! - user text `tool KEY`: one call of the caller tool `lookup` with id
//!   `call-KEY`, `finish_reason: tool_calls`;
//! - a `tool` message (a tool result): the answer `after tool`, stop;
//! - anything else: the answer `ok`, stop.
//!
//! HTTP/1.1, one request per connection, close-delimited bodies.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The caller-executed tool the `tool KEY` replies call.
pub(crate) const TOOL: &str = "lookup";

#[derive(Debug, Default, Clone)]
struct State {
    /// Requests per key (the `tool` results under `KEY/result`).
    requested: HashMap<String, usize>,
    /// Keys whose held request the replica closed before release.
    gone: HashSet<String>,
    released: HashSet<String>,
    /// Bodies of the tool-result requests, by key.
    results: HashMap<String, Value>,
}

/// The running upstream; dropping it ends the server and its connections.
pub(crate) struct Upstream {
    addr: std::net::SocketAddr,
    state: Arc<watch::Sender<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(watch::Sender::new(State::default()));
        let task = tokio::spawn(serve(listener, Arc::clone(&state)));
        Self { addr, state, task }
    }

    /// `http://127.0.0.1:PORT/v1`, a provider's `base_url`.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Lets the held request(s) of `key` finish.
    pub(crate) fn release(&self, key: &str) {
        self.state.send_modify(|s| {
            s.released.insert(key.to_owned());
        });
    }

    /// How many requests `key` got.
    pub(crate) fn requests(&self, key: &str) -> usize {
        self.state.borrow().requested.get(key).copied().unwrap_or(0)
    }

    /// Whether a replica closed `key`'s held request before its release.
    pub(crate) fn gone(&self, key: &str) -> bool {
        self.state.borrow().gone.contains(key)
    }

    /// The body of the request that carried `key`'s tool result.
    pub(crate) fn tool_result_request(&self, key: &str) -> Option<Value> {
        self.state.borrow().results.get(key).cloned()
    }

    /// Waits (at most `within`) until `key` got a request.
    pub(crate) async fn wait_requested(&self, key: &str, within: Duration) {
        self.wait(within, |s| s.requested.contains_key(key))
            .await
            .unwrap_or_else(|()| panic!("no model request for {key} within {within:?}"));
    }

    /// Waits (at most `within`) until the held request of `key` is closed
    /// by its replica.
    pub(crate) async fn wait_gone(&self, key: &str, within: Duration) -> Result<(), ()> {
        self.wait(within, |s| s.gone.contains(key)).await
    }

    async fn wait(&self, within: Duration, cond: impl Fn(&State) -> bool) -> Result<(), ()> {
        let mut rx = self.state.subscribe();
        match tokio::time::timeout(within, rx.wait_for(|s| cond(s))).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(()),
        }
    }
}

async fn serve(listener: TcpListener, state: Arc<watch::Sender<State>>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((socket, _)) = accepted {
                    connections.spawn(handle(socket, Arc::clone(&state)));
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// What the request asks for.
enum Reply {
    Hold { key: String, deltas: usize },
    Tool { key: String },
    AfterTool { key: String },
    Quick,
}

fn reply_for(body: &Value) -> Reply {
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    if last["role"] == "tool" {
        let id = last["tool_call_id"].as_str().unwrap_or_default();
        return Reply::AfterTool {
            key: id.strip_prefix("call-").unwrap_or(id).to_owned(),
        };
    }
    let text = last["content"].as_str().unwrap_or_default();
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["hold", key, n, ..] => Reply::Hold {
            key: (*key).to_owned(),
            deltas: n.parse().unwrap_or(1),
        },
        ["tool", key, ..] => Reply::Tool {
            key: (*key).to_owned(),
        },
        _ => Reply::Quick,
    }
}

async fn handle(mut socket: TcpStream, state: Arc<watch::Sender<State>>) {
    let _ = socket.set_nodelay(true);
    let Some(body) = read_request(&mut socket).await else {
        return;
    };
    let reply = reply_for(&body);
    let key = match &reply {
        Reply::Hold { key, .. } | Reply::Tool { key } => Some(key.clone()),
        Reply::AfterTool { key } => Some(format!("{key}/result")),
        Reply::Quick => None,
    };
    state.send_modify(|s| {
        if let Some(key) = &key {
            *s.requested.entry(key.clone()).or_default() += 1;
        }
        if let Reply::AfterTool { key } = &reply {
            s.results.insert(key.clone(), body.clone());
        }
    });
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                cache-control: no-cache\r\nconnection: close\r\n\r\n";
    if socket.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let pieces = match reply {
        Reply::Quick => vec![text_chunk("ok"), finish_chunk("stop")],
        Reply::AfterTool { .. } => vec![text_chunk("after tool"), finish_chunk("stop")],
        Reply::Tool { key } => vec![tool_call_chunk(&key), finish_chunk("tool_calls")],
        Reply::Hold { key, deltas } => {
            for i in 0..deltas {
                if socket
                    .write_all(&text_chunk(&format!("d{i} ")))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if !held(&mut socket, &state, &key).await {
                state.send_modify(|s| {
                    s.gone.insert(key.clone());
                });
                return;
            }
            vec![text_chunk("end"), finish_chunk("stop")]
        }
    };
    for piece in pieces {
        if socket.write_all(&piece).await.is_err() {
            return;
        }
    }
    let _ = socket.write_all(b"data: [DONE]\n\n").await;
    let _ = socket.shutdown().await;
}

/// Waits for `key`'s release (true) or the client's going away (false).
async fn held(socket: &mut TcpStream, state: &watch::Sender<State>, key: &str) -> bool {
    let mut rx = state.subscribe();
    let mut buf = [0u8; 256];
    tokio::select! {
        _ = rx.wait_for(|s| s.released.contains(key)) => true,
        // The client sends nothing more: any return is EOF or a reset.
        _ = async {
            loop {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        } => false,
    }
}

async fn read_request(socket: &mut TcpStream) -> Option<Value> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim() == "content-length")
        .and_then(|(_, v)| v.trim().parse().ok())
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
    Some(serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn chunk(delta: Value, finish: Value) -> Vec<u8> {
    let event = json!({
        "id": "chatcmpl-cluster",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    });
    format!("data: {event}\n\n").into_bytes()
}

fn text_chunk(text: &str) -> Vec<u8> {
    chunk(json!({ "content": text }), Value::Null)
}

fn finish_chunk(reason: &str) -> Vec<u8> {
    chunk(json!({}), json!(reason))
}

fn tool_call_chunk(key: &str) -> Vec<u8> {
    chunk(
        json!({ "tool_calls": [{
            "index": 0,
            "id": format!("call-{key}"),
            "type": "function",
            "function": { "name": TOOL, "arguments": "{}" },
        }] }),
        Value::Null,
    )
}
