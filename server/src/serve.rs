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
use std::sync::Arc;
use std::time::Duration;

use agentrt_proto::a2a::v1::a2a_service_server::A2aServiceServer;
use agentrt_proto::v1::agent_runtime_server::AgentRuntimeServer;
use agentrt_proto::v1::agent_service_server::AgentServiceServer;
use agentrt_proto::v1::runtime_admin_server::RuntimeAdminServer;
use agentrt_proto::v1::session_service_server::SessionServiceServer;
use agentrt_runtime::Runtime;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tower::layer::util::{Identity, Stack};

use crate::a2a::A2aHandler;
use crate::builder::{ClusterParts, Prepared, ServerBuilder};
use crate::cluster::{Forwarder, WireKey, peer_check, refuse_peer_headers};
use crate::config::Config;
use crate::error::ServerError;
use crate::health::{Health, Phase};
use crate::services::{
    AgentRuntimeHandler, AgentServiceHandler, RuntimeAdminHandler, SessionServiceHandler,
};
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

/// The descriptor sets of the internal listener's services (the public
/// ones, without health and reflection).
const CLUSTER_SERVED: &[&[u8]] = &[agentrt_proto::FILE_DESCRIPTOR_SET];

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
            cluster,
            agents_reload: _agents_reload,
            health: probe,
        } = self;
        let (health, health_service) = Health::start(&probe).await;
        let forward = cluster.as_ref().map(|c| {
            Arc::new(Forwarder::new(
                c.key.clone(),
                c.tls.clone(),
                config.transport.max_request_bytes,
            ))
        });
        let addr = listener.local_addr().ok();
        let handlers = Handlers::new(&config, addr, &runtime, forward);
        let router = router(&config, &auth, health_service, &handlers)?;

        // Both listeners stop when this is cancelled: after the runtime's
        // shutdown, so forwarded calls for this replica's live turns are
        // served until those turns end.
        let stop = CancellationToken::new();
        // Our accept loop: connection caps, the handshake timeout, back-off
        // on accept errors, TCP_NODELAY and keepalive (transport.rs).
        let incoming = transport::incoming(listener, &config.transport, tls);
        let stopped = stop.clone();
        let mut server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async move {
            stopped.cancelled().await;
        }));
        let mut internal =
            cluster.map(|parts| serve_cluster(&config, &handlers, parts, stop.clone()));
        health.set(Phase::Serving).await;
        // An admin Drain flips readiness too, so the orchestrator stops
        // routing here before the process is told to stop; an Undrain
        // flips it back. The watchers are aborted when serving ends.
        let _drain_watch = health.drain_on(runtime.draining());
        let _store_watch = health.follow_store(runtime.store_health());
        tracing::info!(
            addr = %addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string()),
            default_model = %config.default_model,
            fast_model = config.fast_model.as_deref().unwrap_or(""),
            replica_id = runtime.replica_id().unwrap_or(""),
            "agentrt-server serving"
        );

        let internal_ended = async {
            match internal.as_mut() {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            finished = &mut server => {
                // The transport stopped on its own: report why.
                runtime.shutdown(Duration::ZERO, HARD_STOP).await;
                stop.cancel();
                return transport_ended(finished);
            }
            finished = internal_ended => {
                tracing::error!("the internal cluster listener stopped on its own; shutting down");
                runtime.begin_shutdown();
                health.set(Phase::Draining).await;
                runtime.shutdown(Duration::ZERO, HARD_STOP).await;
                stop.cancel();
                let _ = tokio::time::timeout(HARD_STOP, &mut server).await;
                return transport_ended(finished);
            }
            () = shutdown => {}
        }
        tracing::info!(
            grace_ms = config.shutdown_grace.as_millis() as u64,
            "draining"
        );
        // Refuse new turns first: a client that saw NOT_SERVING must not
        // still get a turn admitted.
        runtime.begin_shutdown();
        health.set(Phase::Draining).await;
        runtime.shutdown(config.shutdown_grace, HARD_STOP).await;
        stop.cancel();
        let public = tokio::time::timeout(HARD_STOP, &mut server).await;
        if let Some(task) = internal.as_mut() {
            match tokio::time::timeout(HARD_STOP, &mut *task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => tracing::error!(error = %err, "the internal listener failed"),
                Ok(Err(join)) => tracing::error!(error = %join, "internal listener task failed"),
                Err(_) => task.abort(),
            }
        }
        match public {
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

/// What a listener's task ended with.
fn transport_ended(
    finished: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), ServerError> {
    match finished {
        Ok(result) => result.map_err(ServerError::from),
        Err(join) => Err(ServerError::Runtime(
            agentrt_runtime::RuntimeError::Unavailable(if join.is_panic() {
                "the transport task panicked"
            } else {
                "the transport task was cancelled"
            }),
        )),
    }
}

type ServeTask = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

/// The public services' handlers, shared by both listeners.
struct Handlers {
    sessions: SessionServiceHandler,
    runtime: AgentRuntimeHandler,
    admin: RuntimeAdminHandler,
    agents: AgentServiceHandler,
    a2a: A2aHandler,
}

impl Handlers {
    fn new(
        config: &Config,
        addr: Option<std::net::SocketAddr>,
        runtime: &Runtime,
        forward: Option<Arc<Forwarder>>,
    ) -> Self {
        Self {
            sessions: SessionServiceHandler::new(runtime.clone()),
            runtime: AgentRuntimeHandler::with_forwarder(runtime.clone(), forward.clone()),
            admin: RuntimeAdminHandler::with_forwarder(runtime.clone(), forward.clone()),
            agents: AgentServiceHandler::new(runtime.clone()),
            a2a: A2aHandler::with_forwarder(
                runtime.clone(),
                crate::a2a::card::agent_card(config, addr, runtime),
                forward,
            ),
        }
    }
}

/// Serves the public services on the internal listener until `stop`, for
/// calls other replicas forward here: behind the cluster key (the caller's
/// principal is the forwarding replica's word) instead of the
/// authenticator — and with `[tls]` behind mTLS against the cluster's CA —
/// under the public port's connection, stream and message limits.
fn serve_cluster(
    config: &Config,
    handlers: &Handlers,
    parts: ClusterParts,
    stop: CancellationToken,
) -> ServeTask {
    let t = &config.transport;
    let max_request = t.max_request_bytes;
    let streaming = transport::streaming_request_paths(CLUSTER_SERVED);
    let peer = |key: &WireKey| peer_check(key.clone());
    let router = server_builder(t)
        .layer(telemetry::rpc::RpcLayer::new(
            telemetry::rpc::known_methods(CLUSTER_SERVED),
        ))
        .layer(transport::CatchPanicLayer)
        .layer(transport::RequestLimitsLayer::new(
            t,
            streaming,
            Default::default(),
        ))
        .add_service(InterceptedService::new(
            SessionServiceServer::new(handlers.sessions.clone())
                .max_decoding_message_size(max_request),
            peer(&parts.key),
        ))
        .add_service(InterceptedService::new(
            AgentRuntimeServer::new(handlers.runtime.clone())
                .max_decoding_message_size(max_request),
            peer(&parts.key),
        ))
        .add_service(InterceptedService::new(
            RuntimeAdminServer::new(handlers.admin.clone()).max_decoding_message_size(max_request),
            peer(&parts.key),
        ))
        .add_service(InterceptedService::new(
            A2aServiceServer::new(handlers.a2a.clone()).max_decoding_message_size(max_request),
            peer(&parts.key),
        ));
    // With `[tls]`, mTLS: a client certificate chained to the cluster's
    // CA is required before any call reaches the key check.
    let incoming = transport::incoming(parts.listener, t, parts.tls);
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await }),
    )
}

/// The public port's check in front of the services: a call naming a
/// forwarded principal is refused, then the authenticator says who calls.
fn public_check(
    auth: &auth::Authenticator,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone + use<> {
    let mut authenticate = auth.interceptor();
    move |req: tonic::Request<()>| {
        refuse_peer_headers(req.metadata())?;
        authenticate(req)
    }
}

/// tonic's server with the HTTP/2 limits of `t`: streams per connection,
/// keepalive, and the GOAWAY at `max_connection_age` (the connection is
/// closed after the grace by our accept loop's connection type: tonic's own
/// grace option would replace the GOAWAY with a hard close).
fn server_builder(t: &crate::config::TransportSettings) -> tonic::transport::Server {
    let builder = tonic::transport::Server::builder()
        // tonic sets no stream limit of its own (it replaces hyper's
        // default); without one a single connection can hold any
        // number of half-open streams.
        .max_concurrent_streams(t.max_concurrent_streams)
        .concurrency_limit_per_connection(t.max_requests_per_connection)
        .http2_keepalive_interval(Some(t.keepalive_interval))
        .http2_keepalive_timeout(Some(t.keepalive_timeout));
    if t.max_connection_age.is_zero() {
        builder
    } else {
        builder.max_connection_age(t.max_connection_age)
    }
}

/// The gRPC router: the transport's layers around health, reflection, the
/// three `agentrt.v1` services and the A2A binding (each behind the
/// authenticator).
fn router(
    config: &Config,
    auth: &auth::Authenticator,
    health_service: HealthServer<impl HealthService>,
    handlers: &Handlers,
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
    let anonymous = transport::anonymous_services(SERVED);
    let per_principal = transport::PrincipalStreams::new(t);
    Ok(server_builder(t)
        // Outermost: the RPC span and metrics see every refusal below.
        .layer(telemetry::rpc::RpcLayer::new(rpc_methods))
        .layer(transport::CatchPanicLayer)
        .layer(transport::RequestLimitsLayer::new(t, streaming, anonymous))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        // Our layer refuses a larger message first, with
        // INVALID_ARGUMENT; tonic's own limit (OUT_OF_RANGE) is the same
        // number, so it never fires first.
        .add_service(InterceptedService::new(
            per_principal.wrap(
                SessionServiceServer::new(handlers.sessions.clone())
                    .max_decoding_message_size(max_request),
            ),
            public_check(auth),
        ))
        .add_service(InterceptedService::new(
            per_principal.wrap(
                AgentRuntimeServer::new(handlers.runtime.clone())
                    .max_decoding_message_size(max_request),
            ),
            public_check(auth),
        ))
        .add_service(InterceptedService::new(
            per_principal.wrap(
                RuntimeAdminServer::new(handlers.admin.clone())
                    .max_decoding_message_size(max_request),
            ),
            public_check(auth),
        ))
        .add_service(InterceptedService::new(
            per_principal.wrap(
                AgentServiceServer::new(handlers.agents.clone())
                    .max_decoding_message_size(max_request),
            ),
            public_check(auth),
        ))
        .add_service(InterceptedService::new(
            per_principal.wrap(
                A2aServiceServer::new(handlers.a2a.clone()).max_decoding_message_size(max_request),
            ),
            public_check(auth),
        )))
}
