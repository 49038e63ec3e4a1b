//! Serving a [`Prepared`] server, in the order the shutdown contract needs
//! (docs/contract.md §7): mount the services behind the transport's layers, accept
//! on the caller's listener, report ready; when the caller's shutdown
//! future completes, refuse new turns, report not ready, give live turns
//! the grace period, cancel the rest, stop the transport — with a hard
//! deadline, so an open stream can never hang the process.
//!
//! [`run`] is the one entry point for a [`Config`]; the binary uses
//! [`ServerBuilder::prepare`] then [`Prepared::serve`] to bind between the
//! two.

use std::future::Future;
use std::time::Duration;

use agentrt_proto::v1::agent_runtime_server::AgentRuntimeServer;
use agentrt_proto::v1::runtime_admin_server::RuntimeAdminServer;
use agentrt_proto::v1::session_service_server::SessionServiceServer;
use agentrt_runtime::Runtime;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tower::layer::util::{Identity, Stack};

use crate::builder::{Prepared, ServerBuilder};
use crate::config::Config;
use crate::error::ServerError;
use crate::health::{Health, Phase};
use crate::services::{AgentRuntimeHandler, RuntimeAdminHandler, SessionServiceHandler};
use crate::{auth, telemetry, transport};

/// After the grace period, how long cancelled turns and open streams get
/// before the server stops regardless.
const HARD_STOP: Duration = Duration::from_secs(2);

/// The descriptor sets of every service mounted here: the RPC layer's
/// method names and the request limits' streaming paths come from them.
const SERVED: &[&[u8]] = &[
    agentrt_proto::FILE_DESCRIPTOR_SET,
    tonic_health::pb::FILE_DESCRIPTOR_SET,
    tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
];

/// The layers around every service, outermost last (as `Server::layer`
/// stacks them).
type Layers = Stack<
    transport::RequestLimitsLayer,
    Stack<transport::CatchPanicLayer, Stack<telemetry::rpc::RpcLayer, Identity>>,
>;

/// Serves `config` on `listener` until `shutdown` completes, then drains.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    ServerBuilder::new(config).serve(listener, shutdown).await
}

impl Prepared {
    /// Serves on `listener` until `shutdown` completes, then drains; see
    /// [`ServerBuilder::serve`].
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServerError> {
        let Self {
            config,
            runtime,
            auth,
            tls,
        } = self;
        let (health, health_service) = Health::start().await;
        let router = router(&config, &runtime, &auth, health_service)?;

        let addr = listener.local_addr().ok();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // Our accept loop: connection caps, the handshake timeout, back-off
        // on accept errors, TCP_NODELAY and keepalive (transport.rs).
        let incoming = transport::incoming(listener, &config.transport, tls);
        let mut server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        }));
        health.set(Phase::Serving).await;
        // An admin Drain flips readiness too, so the orchestrator stops
        // routing here before the process is told to stop. The watcher is
        // aborted when serving ends.
        let _drain_watch = health.drain_on(runtime.draining());
        tracing::info!(
            addr = %addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string()),
            default_model = %config.default_model,
            fast_model = config.fast_model.as_deref().unwrap_or(""),
            "agentrt-server serving"
        );

        tokio::select! {
            finished = &mut server => {
                // The transport stopped on its own: report why.
                runtime.shutdown(Duration::ZERO, HARD_STOP).await;
                return match finished {
                    Ok(result) => result.map_err(ServerError::from),
                    Err(join) => Err(ServerError::Runtime(agentrt_runtime::RuntimeError::Unavailable(
                        if join.is_panic() { "the transport task panicked" } else { "the transport task was cancelled" },
                    ))),
                };
            }
            () = shutdown => {}
        }
        tracing::info!(
            grace_ms = config.shutdown_grace.as_millis() as u64,
            "draining"
        );
        // Refuse new turns first: a client that saw NOT_SERVING must not
        // still get a turn admitted.
        runtime.stop_admitting();
        health.set(Phase::Draining).await;
        runtime.shutdown(config.shutdown_grace, HARD_STOP).await;
        let _ = stop_tx.send(());
        match tokio::time::timeout(HARD_STOP, &mut server).await {
            Ok(Ok(result)) => result?,
            Ok(Err(join)) => tracing::error!(error = %join, "transport task failed"),
            Err(_) => {
                tracing::warn!("open connections did not close in time; stopping anyway");
                server.abort();
            }
        }
        tracing::info!("agentrt-server stopped");
        Ok(())
    }
}

/// The gRPC router: the transport's layers around health, reflection and
/// the three `agentrt.v1` services (each behind the authenticator).
fn router(
    config: &Config,
    runtime: &Runtime,
    auth: &auth::Authenticator,
    health_service: HealthServer<impl HealthService>,
) -> Result<Router<Layers>, ServerError> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(agentrt_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(agentrt_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let t = &config.transport;
    transport::check_fd_limit(t);
    let streaming = transport::streaming_request_paths(SERVED);
    let max_request = t.max_request_bytes;
    let rpc_methods = telemetry::rpc::known_methods(SERVED);
    Ok(tonic::transport::Server::builder()
        // tonic sets no stream limit of its own (it replaces hyper's
        // default); without one a single connection can hold any
        // number of half-open streams.
        .max_concurrent_streams(t.max_concurrent_streams)
        .concurrency_limit_per_connection(t.max_requests_per_connection)
        .http2_keepalive_interval(Some(t.keepalive_interval))
        .http2_keepalive_timeout(Some(t.keepalive_timeout))
        // Outermost: the RPC span and metrics see every refusal below.
        .layer(telemetry::rpc::RpcLayer::new(rpc_methods))
        .layer(transport::CatchPanicLayer)
        .layer(transport::RequestLimitsLayer::new(t, streaming))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        // Our layer refuses a larger message first, with
        // INVALID_ARGUMENT; tonic's own limit (OUT_OF_RANGE) is the same
        // number, so it never fires first.
        .add_service(InterceptedService::new(
            SessionServiceServer::new(SessionServiceHandler::new(runtime.clone()))
                .max_decoding_message_size(max_request),
            auth.interceptor(),
        ))
        .add_service(InterceptedService::new(
            AgentRuntimeServer::new(AgentRuntimeHandler::new(runtime.clone()))
                .max_decoding_message_size(max_request),
            auth.interceptor(),
        ))
        .add_service(InterceptedService::new(
            RuntimeAdminServer::new(RuntimeAdminHandler::new(runtime.clone()))
                .max_decoding_message_size(max_request),
            auth.interceptor(),
        )))
}
