//! Starts servers for tests and provides scripted model providers.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentrt_client::{Client, proto};
use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use agentrt_runtime::types::StopReason;
use agentrt_server::config::{ApiKeyConfig, AuthConfig, ProviderConfig, ProviderKind};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_openai::FakeOpenAi;
use agentrt_testkit::gate::GateProvider;
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use tokio::sync::Semaphore;

/// A server running in this process on an ephemeral loopback port, with
/// the test providers registered.
pub(crate) struct TestServer {
    pub(crate) url: String,
    server: InProcessServer,
}

/// Test-only providers registered with every test server: `gate/*` waits
/// for a permit per stream, `panic/*` panics mid-stream.
#[derive(Clone)]
pub(crate) struct Providers {
    pub(crate) gate: Arc<GateProvider>,
    pub(crate) flood: Arc<FloodProvider>,
}

impl Default for Providers {
    fn default() -> Self {
        Self {
            gate: Arc::new(GateProvider::default()),
            flood: Arc::new(FloodProvider::default()),
        }
    }
}

pub(crate) fn base_config(data_dir: &Path) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    }
}

/// An OpenAI-compatible provider named `mock` served by `fake`.
pub(crate) fn mock_provider(
    fake: &FakeOpenAi,
    idle_timeout: Option<std::time::Duration>,
) -> ProviderConfig {
    ProviderConfig {
        name: "mock".into(),
        kind: ProviderKind::Openai,
        base_url: fake.base_url(),
        api_key_env: None,
        models: None,
        idle_timeout,
        max_retries: None,
        max_tokens: None,
        model_max_tokens: None,
        max_tokens_limit: None,
        max_tokens_param: None,
        max_output_bytes: None,
        reads: None,
        model_reads: None,
    }
}

pub(crate) fn with_keys(mut config: Config, keys: &[(&str, &str)]) -> Config {
    config.auth = AuthConfig {
        api_keys: keys
            .iter()
            .map(|(key, user)| ApiKeyConfig::inline(*key, *user, false))
            .collect(),
        ..AuthConfig::default()
    };
    config
}

impl TestServer {
    /// Starts a server with `config` and the test providers.
    pub(crate) async fn start_with(config: Config, providers: &Providers) -> Self {
        let builder = ServerBuilder::new(config)
            .model_provider("gate", providers.gate.clone())
            .model_provider("panic", Arc::new(PanicProvider::default()))
            .model_provider("flood", providers.flood.clone());
        let server = InProcessServer::start(builder).await;
        Self {
            url: server.url(),
            server,
        }
    }

    /// Starts a server on its defaults in `data_dir`.
    pub(crate) async fn start(data_dir: &Path) -> Self {
        Self::start_with(base_config(data_dir), &Providers::default()).await
    }

    pub(crate) async fn client(&self) -> Client {
        Client::connect(self.url.clone()).await.unwrap()
    }

    pub(crate) async fn client_with_token(&self, token: &str) -> Client {
        Client::builder(self.url.clone())
            .token(token)
            .connect()
            .await
            .unwrap()
    }

    /// Drains and stops the server, waiting until the store is closed.
    pub(crate) async fn stop(self) {
        self.server.stop().await;
    }
}

pub(crate) fn text_request(session_id: &str, text: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session_id.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }],
        ..Default::default()
    }
}

pub(crate) fn message_text(m: &proto::Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match &b.block {
            Some(proto::content_block::Block::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

pub(crate) async fn new_session(client: &Client) -> String {
    client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id
}

/// Emits one delta, then panics.
#[derive(Debug, Default)]
pub(crate) struct PanicProvider {
    panicked: AtomicBool,
}

#[async_trait]
impl ModelProvider for PanicProvider {
    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        self.panicked.store(true, Ordering::SeqCst);
        let items =
            futures::stream::iter(vec![Ok(ModelEvent::TextDelta("before the panic".into()))]);
        let boom = futures::stream::once(async {
            panic!("test provider panics on purpose");
            #[allow(unreachable_code)]
            Ok(ModelEvent::Finished(StopReason::Stop))
        });
        Ok(Box::pin(futures::StreamExt::chain(items, boom)))
    }
}

/// `flood/N`: streams N one-word deltas as fast as it is read, then waits
/// for a permit, then finishes.
#[derive(Debug)]
pub(crate) struct FloodProvider {
    permits: Arc<Semaphore>,
}

impl Default for FloodProvider {
    fn default() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(0)),
        }
    }
}

impl FloodProvider {
    pub(crate) fn release(&self, n: usize) {
        self.permits.add_permits(n);
    }
}

#[async_trait]
impl ModelProvider for FloodProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let n: u64 = request
            .model
            .parse()
            .map_err(|_| ModelError::Rejected("flood/N needs a number".into()))?;
        let permits = Arc::clone(&self.permits);
        let stream = futures::stream::unfold(0u64, move |i| {
            let permits = Arc::clone(&permits);
            async move {
                let item = if i < n {
                    ModelEvent::TextDelta("w ".into())
                } else if i == n {
                    permits.acquire().await.ok()?.forget();
                    ModelEvent::Finished(StopReason::Stop)
                } else {
                    return None;
                };
                Some((Ok(item), i + 1))
            }
        });
        Ok(Box::pin(stream))
    }
}

/// Reads events until one matches, returning everything read.
pub(crate) async fn read_until(
    stream: &mut agentrt_client::EventStream,
    mut stop: impl FnMut(&agentrt_client::Event) -> bool,
) -> Vec<agentrt_client::Event> {
    use futures::StreamExt as _;
    let mut seen = Vec::new();
    while let Some(item) = stream.next().await {
        let event = item.expect("event");
        let done = stop(&event);
        seen.push(event);
        if done {
            break;
        }
    }
    seen
}

/// A connection of its own with the protocol's default 64 KiB flow-control
/// windows (hyper's client defaults are several MiB), so a stream that is
/// not read really stops the server from sending.
pub(crate) async fn small_window_channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap()
}

/// A Subscribe stream on a [`small_window_channel`]: a watcher that does not
/// read really stops the server from sending.
pub(crate) async fn small_window_watch(
    url: &str,
    session: &str,
) -> tonic::Streaming<proto::ChatEvent> {
    let channel = small_window_channel(url).await;
    proto::agent_runtime_client::AgentRuntimeClient::new(channel)
        .subscribe(proto::SubscribeRequest {
            session_id: session.to_owned(),
            after_seq: 0,
            wait_for_turn: false,
        })
        .await
        .unwrap()
        .into_inner()
}
