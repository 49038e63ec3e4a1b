//! The bench's client of LangGraph's Agent Server API, as a user's HTTP
//! client would drive it: `POST /threads`, then one
//! `POST /threads/{id}/runs/stream` per turn with `stream_mode:
//! ["messages-tuple"]` (one `messages` SSE event per token delta) and
//! `multitask_strategy: "reject"`, and `POST
//! /threads/{id}/runs/{run}/cancel`. The run stream has no terminal event:
//! a turn ends when the server closes the stream, and is complete when
//! every token of its ticket arrived and no `error` event came.

use std::time::Instant;

use crate::driver::{Received, TurnObs};
use crate::fake::Ticket;

/// An `text/event-stream` reader that keeps event names: `(event, data)` of
/// each completed event (`event` is `"message"` when the server named
/// none). Lines end in `\n` or `\r\n`.
#[derive(Debug, Default)]
pub(crate) struct EventReader {
    buf: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl EventReader {
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<(String, String)>) {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(n) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let raw = &self.buf[start..start + n];
            let line = String::from_utf8_lossy(raw.strip_suffix(b"\r").unwrap_or(raw));
            start += n + 1;
            if line.is_empty() {
                if !self.data.is_empty() {
                    let event = std::mem::take(&mut self.event);
                    let name = if event.is_empty() {
                        "message".to_owned()
                    } else {
                        event
                    };
                    out.push((name, self.data.join("\n")));
                    self.data.clear();
                }
                self.event.clear();
            } else if let Some(v) = line.strip_prefix("event:") {
                self.event = v.trim_start().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                self.data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
            }
        }
        self.buf.drain(..start);
    }
}

/// The text of a `messages` event (`[message chunk, metadata]`).
pub(crate) fn message_text(data: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    let content = v.get(0)?.get("content")?;
    match content {
        serde_json::Value::String(s) => Some(s.clone()),
        // Content blocks: the text of each `text` block.
        serde_json::Value::Array(blocks) => Some(
            blocks
                .iter()
                .filter_map(|b| b.get("text")?.as_str())
                .collect(),
        ),
        _ => None,
    }
}

/// The run id from a `Content-Location: /threads/{t}/runs/{run}` header.
pub(crate) fn run_id_from_location(location: &str) -> Option<String> {
    let (_, run) = location.rsplit_once("/runs/")?;
    let run = run.trim_end_matches("/stream");
    (!run.is_empty() && !run.contains('/')).then(|| run.to_owned())
}

/// How a turn ended.
#[derive(Debug)]
pub(crate) enum TurnEnd {
    /// The stream closed (the observation may still carry an error).
    Done(TurnObs),
    /// Still running at the deadline: not an answer, not counted as a turn.
    Unfinished,
}

/// A started run's open stream.
pub(crate) struct RunStream {
    resp: reqwest::Response,
    reader: EventReader,
    pending: Vec<(String, String)>,
    /// From the response's `Content-Location`.
    pub(crate) run_id: String,
}

/// One item of a run's stream.
#[derive(Debug, PartialEq)]
pub(crate) enum Item {
    /// A token delta's text.
    Text(String),
    /// An `error` event's data.
    Error(String),
    /// Any other event (`metadata`, empty chunks).
    Other,
}

impl RunStream {
    /// The next event, `None` when the server closed the stream.
    pub(crate) async fn next(&mut self) -> Result<Option<Item>, String> {
        loop {
            if !self.pending.is_empty() {
                let (event, data) = self.pending.remove(0);
                return Ok(Some(match event.as_str() {
                    "messages" => message_text(&data).map_or(Item::Other, Item::Text),
                    "error" => Item::Error(data),
                    _ => Item::Other,
                }));
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.reader.push(&bytes, &mut self.pending),
                Ok(None) => return Ok(None),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

/// A client of one server.
#[derive(Debug, Clone)]
pub(crate) struct LgClient {
    http: reqwest::Client,
    url: String,
}

impl LgClient {
    pub(crate) fn new(url: &str) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("reqwest: {e}"))?;
        Ok(Self {
            http,
            url: url.to_owned(),
        })
    }

    async fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap_or_default())
            .send()
            .await
    }

    /// `POST /threads`: a new thread's id.
    pub(crate) async fn create_thread(&self) -> Result<String, String> {
        let resp = self
            .post("/threads", &serde_json::json!({}))
            .await
            .map_err(|e| format!("create thread: {e}"))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("create thread: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "create thread: {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("create thread: {e}"))?;
        v["thread_id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| "create thread: no thread_id".to_owned())
    }

    /// `POST /threads/{thread}/runs/stream` with the user message `text`:
    /// the open stream, or the HTTP status and body of a refusal.
    pub(crate) async fn start_run(
        &self,
        thread: &str,
        text: &str,
    ) -> Result<Result<RunStream, (u16, String)>, String> {
        let body = serde_json::json!({
            "assistant_id": super::peer::GRAPH_ID,
            "input": {"messages": [{"role": "user", "content": text}]},
            "stream_mode": ["messages-tuple"],
            "multitask_strategy": "reject",
        });
        let resp = self
            .post(&format!("/threads/{thread}/runs/stream"), &body)
            .await
            .map_err(|e| format!("run: {e}"))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Ok(Err((status.as_u16(), body)));
        }
        let run_id = resp
            .headers()
            .get("content-location")
            .and_then(|v| v.to_str().ok())
            .and_then(run_id_from_location)
            .unwrap_or_default();
        Ok(Ok(RunStream {
            resp,
            reader: EventReader::default(),
            pending: Vec::new(),
            run_id,
        }))
    }

    /// `POST /threads/{thread}/runs/{run}/cancel` (not waiting for the run).
    pub(crate) async fn cancel(&self, thread: &str, run: &str) -> Result<(), String> {
        let resp = self
            .post(
                &format!("/threads/{thread}/runs/{run}/cancel?wait=false&action=interrupt"),
                &serde_json::json!({}),
            )
            .await
            .map_err(|e| format!("cancel: {e}"))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("cancel: {status}: {body}"))
        }
    }

    /// `GET /threads/{thread}/runs/{run}`: the run's status.
    pub(crate) async fn run_status(&self, thread: &str, run: &str) -> Result<String, String> {
        let resp = self
            .http
            .get(format!("{}/threads/{thread}/runs/{run}", self.url))
            .send()
            .await
            .map_err(|e| format!("get run: {e}"))?;
        let body = resp.bytes().await.map_err(|e| format!("get run: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("get run: {e}"))?;
        Ok(v["status"].as_str().unwrap_or("unknown").to_owned())
    }

    /// One turn: the ticket's key as the user message, read to the
    /// stream's end, which must have brought the ticket's `expected` tokens.
    /// Unfinished when `deadline` passes first.
    pub(crate) async fn turn(
        &self,
        thread: &str,
        ticket: Ticket,
        expected: u32,
        deadline: Instant,
    ) -> TurnEnd {
        let mut obs = TurnObs::default();
        let mut got = Received::default();
        let sent = Instant::now();
        let run = async {
            let mut stream = match self.start_run(thread, &ticket.key).await? {
                Ok(s) => s,
                Err((status, body)) => return Err(format!("run refused: {status}: {body}")),
            };
            while let Some(item) = stream.next().await? {
                let now = Instant::now();
                obs.events += 1;
                match item {
                    Item::Text(t) => got.text(&t, now),
                    Item::Error(e) => return Err(format!("error event: {e}")),
                    Item::Other => {}
                }
            }
            Ok(())
        };
        match tokio::time::timeout_at(deadline.into(), run).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => obs.error = Some(e),
            Err(_) => return TurnEnd::Unfinished,
        }
        obs.total = sent.elapsed();
        got.finish(sent, Some(&ticket), &mut obs).await;
        if obs.error.is_none() && obs.tokens != u64::from(expected) {
            obs.error = Some(format!(
                "the stream closed after {} of {expected} tokens",
                obs.tokens
            ));
        }
        TurnEnd::Done(obs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_keep_their_names_across_reads_and_crlf() {
        let mut r = EventReader::default();
        let mut out = Vec::new();
        r.push(
            b"event: metadata\r\ndata: {\"run_id\":\"r\"}\r\n\r\nevent: mess",
            &mut out,
        );
        assert_eq!(
            out,
            [("metadata".to_owned(), "{\"run_id\":\"r\"}".to_owned())]
        );
        out.clear();
        r.push(
            b"ages\r\ndata: [1,\r\ndata: 2]\r\n\r\n: comment\n\ndata: x\n\n",
            &mut out,
        );
        assert_eq!(
            out,
            [
                ("messages".to_owned(), "[1,\n2]".to_owned()),
                ("message".to_owned(), "x".to_owned())
            ]
        );
    }

    #[test]
    fn token_text_comes_from_the_message_chunk() {
        let data = r#"[{"content":"t3 ","type":"AIMessageChunk"},{"run_id":"r"}]"#;
        assert_eq!(message_text(data).as_deref(), Some("t3 "));
        let blocks = r#"[{"content":[{"type":"text","text":"t4 "}]},{}]"#;
        assert_eq!(message_text(blocks).as_deref(), Some("t4 "));
        assert_eq!(message_text("{}"), None);
    }

    #[test]
    fn the_run_id_comes_from_the_location() {
        assert_eq!(
            run_id_from_location("/threads/t-1/runs/r-2").as_deref(),
            Some("r-2")
        );
        assert_eq!(
            run_id_from_location("/threads/t-1/runs/r-2/stream").as_deref(),
            Some("r-2")
        );
        assert_eq!(run_id_from_location("/threads/t-1"), None);
    }
}
