//! The cost of telemetry: S2 at one concurrency, run twice in the same
//! bench run against fresh servers — first with telemetry off (the
//! `OTEL_*` exporters set to `none`), then with traces on at 100 %
//! sampling (`always_on`), exported over OTLP/gRPC to a trace receiver
//! this process serves (an OTLP `TraceService` that counts spans and
//! drops them). Reports TTFE p50/p99 and server CPU per event for both,
//! and the overhead.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use serde::Serialize;

use crate::driver::{Recorder, connections_for};
use crate::load::Load;
use crate::markdown::{ms, num, table};
use crate::scenarios::{Env, Measure, agentrt_loops, create_sessions, nominal};

/// S2 with telemetry off and on.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct OtelCompare {
    pub(crate) sessions: usize,
    pub(crate) off: Load,
    pub(crate) on: Load,
    /// Spans the receiver got from the "on" server (including its
    /// shutdown flush).
    pub(crate) spans: u64,
    /// on − off, TTFE p50 (µs).
    pub(crate) ttfe_p50_overhead_us: f64,
    /// on − off, TTFE p99 (µs).
    pub(crate) ttfe_p99_overhead_us: f64,
    /// on ÷ off, server CPU per relayed event.
    pub(crate) cpu_per_event_ratio: f64,
}

/// Counts exported spans.
#[derive(Debug, Default)]
struct Counter(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Counter {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Starts the receiver on a loopback port; returns its endpoint and count.
async fn receiver() -> Result<(String, Arc<AtomicU64>, tokio::task::JoinHandle<()>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind the OTLP receiver: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("OTLP receiver address: {e}"))?;
    let count = Arc::new(AtomicU64::new(0));
    let service = TraceServiceServer::new(Counter(Arc::clone(&count)));
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    Ok((format!("http://{addr}"), count, task))
}

/// One S2 agentrt load on a fresh server with `vars` in its environment.
async fn s2_with(
    env: &Env,
    name: &str,
    sessions: usize,
    vars: Vec<(String, String)>,
) -> Result<Load, String> {
    let p = env.plan.s2;
    let stagger = nominal(p);
    let grace = env.plan.turn_limit + Duration::from_secs(5);
    let mut spec = env.spec.clone();
    spec.env.extend(vars);
    let run = env
        .fresh_server_with(&spec, name, connections_for(sessions))
        .await?;
    let ids: Vec<String> = (0..sessions).map(|i| format!("{name}-{i}")).collect();
    create_sessions(&run.clients, &ids).await?;
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(run.server.pid());
    let elapsed = agentrt_loops(
        env,
        &run.clients,
        ids,
        &rec,
        p,
        (env.plan.s2_window, stagger, grace),
    )
    .await;
    let load = measure
        .end(
            &format!("S2 agentrt c={sessions} ({name})"),
            sessions,
            &rec.take(),
            elapsed,
            run.rss_startup_kb,
        )
        .await;
    run.server.terminate(Duration::from_secs(15)).await;
    Ok(load)
}

/// Telemetry off, then on, at `sessions` concurrent S2 sessions.
pub(crate) async fn compare(env: &Env, sessions: usize) -> Result<OtelCompare, String> {
    let kv = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let off = s2_with(
        env,
        "otel-off",
        sessions,
        vec![
            kv("OTEL_TRACES_EXPORTER", "none"),
            kv("OTEL_METRICS_EXPORTER", "none"),
        ],
    )
    .await?;
    let (endpoint, spans, task) = receiver().await?;
    let on = s2_with(
        env,
        "otel-on",
        sessions,
        vec![
            kv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &endpoint),
            kv("OTEL_TRACES_EXPORTER", "otlp"),
            kv("OTEL_TRACES_SAMPLER", "always_on"),
            kv("OTEL_METRICS_EXPORTER", "none"),
        ],
    )
    .await?;
    task.abort();
    let spans = spans.load(Ordering::Relaxed);
    let ratio = if off.cpu_us_per_event > 0.0 {
        on.cpu_us_per_event / off.cpu_us_per_event
    } else {
        0.0
    };
    Ok(OtelCompare {
        sessions,
        ttfe_p50_overhead_us: on.ttfe.p50_us - off.ttfe.p50_us,
        ttfe_p99_overhead_us: on.ttfe.p99_us - off.ttfe.p99_us,
        cpu_per_event_ratio: ratio,
        spans,
        off,
        on,
    })
}

/// The comparison as a markdown section.
pub(crate) fn markdown(o: &OtelCompare) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Telemetry off vs on (S2, {} sessions, traces 100 % to a local OTLP receiver)\n",
        o.sessions
    );
    let row = |name: &str, l: &Load| {
        vec![
            name.to_owned(),
            ms(l.ttfe.p50_us),
            ms(l.ttfe.p99_us),
            num(l.cpu_us_per_event),
            num(l.events_per_s),
            format!("{}/{}", l.failures, l.turns),
        ]
    };
    out.push_str(&table(
        &[
            "telemetry",
            "TTFE p50 ms",
            "TTFE p99 ms",
            "server CPU µs/event",
            "events/s",
            "failed/turns",
        ],
        &[row("off", &o.off), row("on", &o.on)],
    ));
    let _ = writeln!(
        out,
        "\nOverhead: TTFE p50 {} ms, p99 {} ms; CPU per event ×{:.2}; {} spans exported.",
        ms(o.ttfe_p50_overhead_us),
        ms(o.ttfe_p99_overhead_us),
        o.cpu_per_event_ratio,
        o.spans
    );
    out
}
