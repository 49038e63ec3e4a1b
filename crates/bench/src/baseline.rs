//! Baseline (a), the transport limit: a bare tonic `AgentRuntime/Chat`
//! that streams the same `agentrt.v1.ChatEvent` messages from a producer
//! task through an `mpsc(64)` (the shape of the real server's turn task),
//! paced by a tokio interval, with no upstream and no store. It runs as a
//! child process (`agentrt-bench echo-server`) so its CPU and memory are
//! measured apart from the bench's clients.
//!
//! Baseline (b), the upstream limit, is [`crate::driver::direct_stream`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_runtime_server::{AgentRuntime, AgentRuntimeServer};
use pb::chat_event::Kind;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::fake::{StreamParams, token_text};

type Events = ReceiverStream<Result<pb::ChatEvent, Status>>;

/// The inverse of [`crate::driver::echo_model`]: `echo/N/RATE/TTFT_US`.
pub(crate) fn parse_echo_model(model: &str) -> Option<StreamParams> {
    let mut parts = model.strip_prefix("echo/")?.split('/');
    let tokens = parts.next()?.parse().ok()?;
    let rate: f64 = parts.next()?.parse().ok()?;
    let ttft_us = parts.next()?.parse().ok()?;
    if parts.next().is_some() || !rate.is_finite() || rate < 0.0 {
        return None;
    }
    Some(StreamParams {
        ttft: Duration::from_micros(ttft_us),
        tokens,
        rate,
    })
}

/// The bare echo service.
#[derive(Debug, Default)]
pub(crate) struct Echo {
    turns: AtomicU64,
}

fn event(session_id: &str, turn_id: &str, seq: u64, kind: Kind) -> pb::ChatEvent {
    pb::ChatEvent {
        session_id: session_id.to_owned(),
        turn_id: turn_id.to_owned(),
        seq,
        at: Some(SystemTime::now().into()),
        kind: Some(kind),
    }
}

async fn produce(
    tx: mpsc::Sender<Result<pb::ChatEvent, Status>>,
    session_id: String,
    turn_id: String,
    p: StreamParams,
) {
    let mut seq = 0;
    let mut send = |kind: Kind| {
        seq += 1;
        let e = event(&session_id, &turn_id, seq, kind);
        let tx = tx.clone();
        async move { tx.send(Ok(e)).await.is_ok() }
    };
    let started = pb::TurnStarted {
        model: "echo".into(),
        ..Default::default()
    };
    if !send(Kind::TurnStarted(started)).await {
        return;
    }
    let first = tokio::time::Instant::now() + p.ttft;
    // Paced like the fake (see crate::fake): Delay, and no timer wait for
    // a zero TTFT.
    let now_first = p.ttft.is_zero();
    if p.rate > 0.0 {
        let period = Duration::from_secs_f64(1.0 / p.rate);
        let start = if now_first { first + period } else { first };
        let mut ticks = tokio::time::interval_at(start, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        for i in 0..p.tokens {
            if i > 0 || !now_first {
                ticks.tick().await;
            }
            let text = pb::TextDelta {
                text: token_text(i),
            };
            if !send(Kind::Text(text)).await {
                return;
            }
        }
    } else {
        if !now_first {
            tokio::time::sleep_until(first).await;
        }
        for i in 0..p.tokens {
            let text = pb::TextDelta {
                text: token_text(i),
            };
            if !send(Kind::Text(text)).await {
                return;
            }
        }
    }
    let finished = pb::TurnFinished {
        outcome: pb::TurnOutcome::Success as i32,
        ..Default::default()
    };
    send(Kind::TurnFinished(finished)).await;
}

#[tonic::async_trait]
impl AgentRuntime for Echo {
    type ChatStream = Events;
    type SubscribeStream = Events;

    async fn chat(&self, req: Request<pb::ChatRequest>) -> Result<Response<Events>, Status> {
        let r = req.into_inner();
        let p = parse_echo_model(&r.model)
            .ok_or_else(|| Status::invalid_argument("model must be echo/TOKENS/RATE/TTFT_US"))?;
        let n = self.turns.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(produce(tx, r.session_id, format!("echo-{n}"), p));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    // The baseline's turns are stateless echoes: nothing is registered, so
    // there is never a live turn to watch, inspect or stop, no runner to
    // close and no tool call waiting for a result.
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
            "the bench echo baseline's turns are not registered and cannot be stopped",
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
            "the bench echo baseline never calls tools",
        ))
    }

    async fn submit_tool_approval(
        &self,
        _req: Request<pb::SubmitToolApprovalRequest>,
    ) -> Result<Response<pb::SubmitToolApprovalResponse>, Status> {
        Err(Status::failed_precondition(
            "the bench echo baseline never calls tools",
        ))
    }

    async fn compact_session(
        &self,
        _req: Request<pb::CompactSessionRequest>,
    ) -> Result<Response<pb::CompactSessionResponse>, Status> {
        // Stateless: there is never any history to compact.
        Ok(Response::new(pb::CompactSessionResponse::default()))
    }
}

/// `agentrt-bench echo-server`: serves the echo until killed.
pub(crate) async fn run_echo_server(listen: SocketAddr) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("bind {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("agentrt-bench echo listening on {addr}");
    // TCP_NODELAY on accepted sockets, as tonic's own `serve` sets it:
    // without it Nagle holds small event writes until the peer's delayed
    // ACK (~40 ms on Linux).
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(AgentRuntimeServer::new(Echo::default()))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| format!("echo server: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{echo_call, echo_model};

    #[test]
    fn echo_model_round_trips() {
        let p = StreamParams {
            ttft: Duration::from_micros(1500),
            tokens: 40,
            rate: 50.0,
        };
        assert_eq!(parse_echo_model(&echo_model(p)), Some(p));
        assert_eq!(parse_echo_model("echo/1/x/0"), None);
        assert_eq!(parse_echo_model("fake/m"), None);
    }

    #[tokio::test]
    async fn the_echo_streams_every_token_then_finishes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentRuntimeServer::new(Echo::default()))
                .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
        );
        let client = agentrt_client::Client::connect(format!("http://{addr}"))
            .await
            .unwrap();
        for rate in [0.0, 2000.0] {
            let p = StreamParams {
                ttft: Duration::ZERO,
                tokens: 20,
                rate,
            };
            let obs = echo_call(&client, p, Duration::from_secs(5)).await;
            assert_eq!(obs.error, None);
            assert_eq!((obs.tokens, obs.events), (20, 22));
            assert_eq!(obs.lags.len(), 20);
        }
    }
}
