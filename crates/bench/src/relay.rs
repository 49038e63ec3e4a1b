//! Baseline (c), the relay floor: the least a gRPC server relaying a model
//! can do. A tonic `AgentRuntime/Chat` that, per Chat, sends one streaming
//! request to the upstream (the same timed fake agentrt uses) through one
//! shared reqwest client and its connection pool, reads the SSE stream and
//! forwards each token delta as an `agentrt.v1.ChatEvent` text delta, then
//! a terminal `turn_finished`. No storage, no session state, no history: the
//! upstream request carries only the Chat's text. It accepts the request
//! agentrt gets from the bench (a session id and one text block), so the
//! same driver ([`crate::driver::agentrt_turn`]) measures both. It runs as
//! a child process (`agentrt-bench relay-server`) so its CPU and memory are
//! measured apart from the bench's clients and the fake.
//!
//! Each Chat's stream is fed by a task through an `mpsc(64)`, the shape of
//! the echo baseline and of agentrt's turn task, and each upstream delta
//! becomes its own gRPC message (nothing is merged).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_runtime_server::{AgentRuntime, AgentRuntimeServer};
use pb::chat_event::Kind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::driver::delta_content;
use crate::fake::SseReader;

type Events = ReceiverStream<Result<pb::ChatEvent, Status>>;
type Tx = mpsc::Sender<Result<pb::ChatEvent, Status>>;

/// The relay service.
#[derive(Debug)]
pub(crate) struct Relay {
    http: reqwest::Client,
    /// `{upstream}/chat/completions`.
    url: String,
    turns: AtomicU64,
}

impl Relay {
    /// A relay to the OpenAI-compatible API at `upstream` (e.g.
    /// `http://127.0.0.1:PORT/v1`).
    pub(crate) fn new(upstream: &str) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("reqwest: {e}"))?;
        Ok(Self {
            http,
            url: format!("{}/chat/completions", upstream.trim_end_matches('/')),
            turns: AtomicU64::new(0),
        })
    }
}

/// The text blocks of a Chat, joined.
fn user_text(content: &[pb::ContentBlock]) -> String {
    content
        .iter()
        .filter_map(|b| match &b.block {
            Some(pb::content_block::Block::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// One turn's events, numbered from 1.
struct Turn {
    tx: Tx,
    session_id: String,
    turn_id: String,
    seq: u64,
}

impl Turn {
    /// Queues one event; `false` when the caller went away.
    async fn send(&mut self, kind: Kind) -> bool {
        self.seq += 1;
        let e = pb::ChatEvent {
            session_id: self.session_id.clone(),
            turn_id: self.turn_id.clone(),
            seq: self.seq,
            at: Some(SystemTime::now().into()),
            kind: Some(kind),
        };
        self.tx.send(Ok(e)).await.is_ok()
    }

    async fn finish(&mut self, outcome: pb::TurnOutcome) {
        let finished = pb::TurnFinished {
            outcome: outcome as i32,
            ..Default::default()
        };
        self.send(Kind::TurnFinished(finished)).await;
    }

    /// An upstream failure: a `TurnError`, then `turn_finished` ERROR.
    async fn fail(&mut self, message: String) {
        let error = pb::TurnError {
            code: pb::ErrorCode::Unavailable as i32,
            message,
        };
        if self.send(Kind::Error(error)).await {
            self.finish(pb::TurnOutcome::Error).await;
        }
    }
}

/// Streams one upstream answer into `turn`.
async fn relay_turn(http: reqwest::Client, url: String, text: String, mut turn: Turn) {
    let started = pb::TurnStarted {
        model: "relay".into(),
        ..Default::default()
    };
    if !turn.send(Kind::TurnStarted(started)).await {
        return;
    }
    let body = serde_json::json!({
        "model": "m",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": text}],
    });
    let sent = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(serde_json::to_vec(&body).unwrap_or_default())
        .send()
        .await;
    let mut resp = match sent {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => return turn.fail(format!("upstream status {}", r.status())).await,
        Err(e) => return turn.fail(format!("upstream request: {e}")).await,
    };
    let mut reader = SseReader::default();
    let mut events = Vec::new();
    let mut done = false;
    // Read to the end of the body (past [DONE]) so the connection goes back
    // to the pool.
    loop {
        let bytes = match resp.chunk().await {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => return turn.fail(format!("upstream read: {e}")).await,
        };
        reader.push(&bytes, &mut events);
        for data in events.drain(..) {
            if data == "[DONE]" {
                done = true;
                continue;
            }
            match delta_content(&data) {
                Ok(Some(text)) if !text.is_empty() => {
                    if !turn.send(Kind::Text(pb::TextDelta { text })).await {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => return turn.fail(format!("upstream chunk: {e}")).await,
            }
        }
    }
    if done {
        turn.finish(pb::TurnOutcome::Success).await;
    } else {
        turn.fail("the upstream stream ended without [DONE]".into())
            .await;
    }
}

#[tonic::async_trait]
impl AgentRuntime for Relay {
    type ChatStream = Events;
    type SubscribeStream = Events;

    async fn chat(&self, req: Request<pb::ChatRequest>) -> Result<Response<Events>, Status> {
        let r = req.into_inner();
        let text = user_text(&r.content);
        if text.is_empty() {
            return Err(Status::invalid_argument("the Chat has no text"));
        }
        let n = self.turns.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(64);
        let turn = Turn {
            tx,
            session_id: r.session_id,
            turn_id: format!("relay-{n}"),
            seq: 0,
        };
        tokio::spawn(relay_turn(self.http.clone(), self.url.clone(), text, turn));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    // The relay keeps no state: nothing is registered, so there is never a
    // live turn to watch, inspect or stop, no runner to close, no history
    // to compact and no tool call waiting for a result.
    async fn subscribe(
        &self,
        _req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Events>, Status> {
        let (_tx, rx) = mpsc::channel(1);
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn stop_session(
        &self,
        _req: Request<pb::StopSessionRequest>,
    ) -> Result<Response<pb::StopSessionResponse>, Status> {
        Err(Status::failed_precondition(
            "the bench relay's turns are not registered and cannot be stopped",
        ))
    }

    async fn get_session_status(
        &self,
        _req: Request<pb::GetSessionStatusRequest>,
    ) -> Result<Response<pb::SessionStatus>, Status> {
        Ok(Response::new(pb::SessionStatus::default()))
    }

    async fn close_session(
        &self,
        _req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        Ok(Response::new(pb::CloseSessionResponse { closed: false }))
    }

    async fn submit_tool_result(
        &self,
        _req: Request<pb::SubmitToolResultRequest>,
    ) -> Result<Response<pb::SubmitToolResultResponse>, Status> {
        Err(Status::failed_precondition(
            "the bench relay never calls tools",
        ))
    }

    async fn submit_tool_approval(
        &self,
        _req: Request<pb::SubmitToolApprovalRequest>,
    ) -> Result<Response<pb::SubmitToolApprovalResponse>, Status> {
        Err(Status::failed_precondition(
            "the bench relay never calls tools",
        ))
    }

    async fn compact_session(
        &self,
        _req: Request<pb::CompactSessionRequest>,
    ) -> Result<Response<pb::CompactSessionResponse>, Status> {
        Ok(Response::new(pb::CompactSessionResponse::default()))
    }
}

/// `agentrt-bench relay-server`: relays to `upstream` until killed.
pub(crate) async fn run_relay_server(listen: SocketAddr, upstream: &str) -> Result<(), String> {
    let relay = Relay::new(upstream)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("bind {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("agentrt-bench relay listening on {addr}");
    // TCP_NODELAY on accepted sockets, as tonic's own `serve` sets it.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(AgentRuntimeServer::new(relay))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| format!("relay server: {e}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::driver::agentrt_turn;
    use crate::fake::{FakeServer, StreamParams};

    async fn serve(relay: Relay) -> agentrt_client::Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentRuntimeServer::new(relay))
                .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
        );
        agentrt_client::Client::connect(format!("http://{addr}"))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_relay_forwards_every_upstream_delta_then_finishes() {
        let fake = FakeServer::start().await.unwrap();
        let client = serve(Relay::new(&fake.base_url()).unwrap()).await;
        for rate in [0.0, 2000.0] {
            let p = StreamParams {
                ttft: Duration::from_millis(1),
                tokens: 20,
                rate,
            };
            let limit = Duration::from_secs(5);
            let obs = agentrt_turn(&client, "any", Some((&fake, p)), "", limit).await;
            assert_eq!(obs.error, None);
            // turn_started, one event per token, turn_finished.
            assert_eq!((obs.tokens, obs.events), (20, 22));
            assert_eq!(obs.lags.len(), 20);
            assert!(obs.admission.is_some() && obs.first_relay.is_some());
        }
        let c = fake.counters();
        assert_eq!(c.requests.load(Ordering::Relaxed), 2);
        assert_eq!(c.unknown_keys.load(Ordering::Relaxed), 0);
        assert_eq!(c.connections.load(Ordering::Relaxed), 1, "pooled");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_ends_the_turn_with_an_error() {
        // A port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = serve(Relay::new(&format!("http://127.0.0.1:{port}/v1")).unwrap()).await;
        let obs = agentrt_turn(&client, "s", None, "", Duration::from_secs(5)).await;
        let error = obs.error.unwrap();
        assert!(error.starts_with("turn error"), "{error}");
    }
}
