//! What the replica tests share: two (or more) in-process replicas on one
//! PostgreSQL database, their clients, and readers of event streams that
//! never wait unbounded.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::proto;
use agentrt_client::proto::agent_runtime_client::AgentRuntimeClient;
use agentrt_client::proto::chat_event::Kind;
use agentrt_client::proto::session_service_client::SessionServiceClient;
use agentrt_runtime::model::ModelProvider;
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::gate::GateProvider;
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

pub const KEY_VAR: &str = "AGENTRT_TEST_CLUSTER_KEY";
pub const KEY: &str = "replicas-test-cluster-key-0123456789abcdef";
/// Bounds every wait, so a broken build fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(20);

/// A replica's config on `url`, its internal listener on loopback.
pub fn config(url: &str, dir: &std::path::Path, cluster: bool) -> Config {
    let mut toml = format!(
        "listen = \"127.0.0.1:0\"\n[store]\nkind = \"postgres\"\nurl = \"{url}\"\nlease_ttl_ms = 3000\n"
    );
    if cluster {
        toml.push_str(&format!(
            "[cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"{KEY_VAR}\"\n"
        ));
    }
    let mut c = Config::parse_toml(&toml).expect("the test config parses");
    c.data_dir = dir.to_path_buf();
    c
}

pub struct Replica {
    pub server: InProcessServer,
    pub _dir: tempfile::TempDir,
}

pub async fn replica(
    url: &str,
    cluster: bool,
    models: &[(&str, Arc<dyn ModelProvider>)],
) -> Replica {
    replica_with(url, cluster, models, |_| {}).await
}

/// [`replica`] with the config edited first.
pub async fn replica_with(
    url: &str,
    cluster: bool,
    models: &[(&str, Arc<dyn ModelProvider>)],
    edit: impl FnOnce(&mut Config),
) -> Replica {
    replica_built(url, cluster, models, edit, |b| b).await
}

/// [`replica_with`], the builder changed by `build` last (tool sources).
pub async fn replica_built(
    url: &str,
    cluster: bool,
    models: &[(&str, Arc<dyn ModelProvider>)],
    edit: impl FnOnce(&mut Config),
    build: impl FnOnce(ServerBuilder) -> ServerBuilder,
) -> Replica {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(url, dir.path(), cluster);
    edit(&mut c);
    let mut builder =
        ServerBuilder::new(c).env_lookup(|name| (name == KEY_VAR).then(|| KEY.to_owned()));
    for (name, provider) in models {
        builder = builder.model_provider(*name, Arc::clone(provider));
    }
    builder = build(builder);
    Replica {
        server: InProcessServer::start_prepared(builder).await,
        _dir: dir,
    }
}

pub async fn channel(url: String) -> Channel {
    tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

pub async fn runtime(r: &Replica) -> AgentRuntimeClient<Channel> {
    AgentRuntimeClient::new(channel(r.server.url()).await)
}

pub async fn new_session(r: &Replica) -> String {
    SessionServiceClient::new(channel(r.server.url()).await)
        .create_session(proto::CreateSessionRequest {
            title: "replicas".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

pub fn chat(session_id: &str, model: &str, request_id: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session_id.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: "hello".to_owned(),
            })),
        }],
        model: model.to_owned(),
        request_id: request_id.to_owned(),
        ..Default::default()
    }
}

pub type Events = tonic::Streaming<proto::ChatEvent>;

/// The next event, bounded by [`WAIT`].
pub async fn next(events: &mut Events) -> Option<Result<proto::ChatEvent, tonic::Status>> {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("an event within the wait")
}

/// Events until (and with) the first whose kind matches.
pub async fn until(events: &mut Events, hit: impl Fn(&Kind) -> bool) -> Vec<proto::ChatEvent> {
    let mut seen = Vec::new();
    loop {
        let event = next(events).await.expect("the stream goes on").unwrap();
        let done = event.kind.as_ref().is_some_and(&hit);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// Every remaining event, and the trailing status (`None`: OK).
pub async fn drain(events: &mut Events) -> (Vec<proto::ChatEvent>, Option<tonic::Status>) {
    let mut seen = Vec::new();
    loop {
        match next(events).await {
            None => return (seen, None),
            Some(Ok(event)) => seen.push(event),
            Some(Err(status)) => return (seen, Some(status)),
        }
    }
}

pub fn is_text(kind: &Kind) -> bool {
    matches!(kind, Kind::Text(_))
}

pub fn outcome(events: &[proto::ChatEvent]) -> Option<proto::TurnOutcome> {
    events.iter().find_map(|e| match &e.kind {
        Some(Kind::TurnFinished(f)) => Some(f.outcome()),
        _ => None,
    })
}

/// A Chat on `r` with the gate model, read until its first text delta: a
/// turn that stays live (on `r`) until the test releases the gate.
pub async fn live_gate_turn(r: &Replica, session_id: &str) -> Events {
    let mut turn = runtime(r)
        .await
        .chat(chat(session_id, "gate/x", ""))
        .await
        .unwrap()
        .into_inner();
    until(&mut turn, is_text).await;
    turn
}

pub fn gate_models(gate: &Arc<GateProvider>) -> Vec<(&'static str, Arc<dyn ModelProvider>)> {
    vec![("gate", Arc::clone(gate) as Arc<dyn ModelProvider>)]
}

pub async fn readiness(r: &Replica) -> ServingStatus {
    HealthClient::new(channel(r.server.url()).await)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "readiness".to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

/// Polls readiness until it is `want` (the pinger runs every second).
pub async fn wait_readiness(r: &Replica, want: ServingStatus) {
    let mut health = HealthClient::new(channel(r.server.url()).await)
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "readiness".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(WAIT, async {
        while let Some(Ok(update)) = health.next().await {
            if update.status() == want {
                return;
            }
        }
        panic!("the health watch ended before readiness was {want:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("readiness did not become {want:?}"));
}
