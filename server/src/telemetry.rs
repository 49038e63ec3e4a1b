//! Telemetry set-up: logs (text or flat JSON on stderr), OpenTelemetry
//! traces and metrics over OTLP/gRPC, and the Prometheus text endpoint.
//!
//! Traces and OTLP metrics are off unless the standard environment asks
//! for them (`OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` = `otlp`, or
//! an `OTEL_EXPORTER_OTLP[_TRACES|_METRICS]_ENDPOINT`), read through an
//! injectable lookup ([`OtelEnv::from_lookup`]) so tests never touch the
//! process environment. Off means off: no exporter, no batch thread, no
//! OpenTelemetry layer in the subscriber.
//!
//! Modules:
//! - [`env`](mod@env): the `OTEL_*` variables → [`OtelEnv`].
//! - [`logs`]: the flat JSON log layer (plain values, `trace_id`/`span_id`).
//! - [`rpc`]: the tower layer that makes the RPC server span (continuing a
//!   caller's `traceparent`), records `rpc.server.call.duration` and logs
//!   refused calls.
//! - [`prometheus`]: a pull reader of the SDK rendered as Prometheus text,
//!   and its `/metrics` listener.
//! - [`process`]: the process series (CPU, memory, file descriptors, start
//!   time) and `agentrt_build_info`, registered with the meter provider.

pub mod env;
pub mod logs;
pub mod process;
pub mod prometheus;
pub mod rpc;

use std::io::IsTerminal as _;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::Filter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub use env::OtelEnv;

use crate::config::{BUILTIN_DEFAULT_MODEL, Config, LogFormat};

/// Registers the configured models as the only values the model metrics'
/// `gen_ai.request.model` label takes (with their providers, the only
/// `gen_ai.provider.name` values): the default and fast models, the
/// built-in and local models, each provider's `models` allow-list and
/// `model_max_tokens` names. Any other model a caller names is counted as
/// `other`, so callers cannot grow `/metrics` or push the configured
/// models into the SDK's overflow series. `extra_providers` are providers
/// registered in code (`ServerBuilder::model_provider`).
pub fn allow_configured_models(config: &Config, extra_providers: &[String]) {
    let mut models = vec![
        config.default_model.clone(),
        BUILTIN_DEFAULT_MODEL.to_owned(),
        agentrt_local_model::DEFAULT_MODEL_NAME.to_owned(),
    ];
    models.extend(config.fast_model.clone());
    for p in &config.providers {
        let listed = p.models.iter().flatten();
        let sized = p.model_max_tokens.iter().flat_map(|m| m.keys());
        models.extend(listed.chain(sized).map(|m| format!("{}/{m}", p.name)));
    }
    let providers = config
        .providers
        .iter()
        .map(|p| p.name.clone())
        .chain(extra_providers.iter().cloned());
    agentrt_runtime::telemetry::metrics::allow_model_labels(providers, models);
}

/// The installed telemetry; [`Telemetry::shutdown`] flushes what is queued.
#[derive(Debug)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
    prometheus: Option<prometheus::Registry>,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(pub String);

/// The log lines in `format`, on stderr.
fn log_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => logs::JsonLayer::stderr().boxed(),
    }
}

/// `AGENTRT_LOG`, parsed once: static directives (`info`,
/// `agentrt=debug,h2=warn`) as [`Targets`], which keeps no state per span;
/// directives on spans or fields as an [`EnvFilter`].
#[derive(Debug)]
enum LogFilter {
    Targets(Box<Targets>),
    Env(Box<EnvFilter>),
}

impl LogFilter {
    fn parse(spec: &str) -> Self {
        // `Targets` parses `agentrt[turn]=debug` as a target named
        // `agentrt[turn]` and ignores field names, so a spec with a span or
        // field part never goes to it.
        if !spec.contains(['[', '{'])
            && let Ok(targets) = spec.parse::<Targets>()
        {
            return Self::Targets(Box::new(targets));
        }
        Self::Env(Box::new(EnvFilter::new(spec)))
    }

    /// As the filter of the whole subscriber.
    fn global(self) -> Box<dyn Layer<Registry> + Send + Sync> {
        match self {
            Self::Targets(targets) => targets,
            Self::Env(env) => env,
        }
    }

    /// As a filter of one layer alone.
    fn per_layer<S>(self) -> Box<dyn Filter<S> + Send + Sync>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        match self {
            Self::Targets(targets) => targets,
            Self::Env(env) => env,
        }
    }
}

impl Telemetry {
    /// Installs the global subscriber (logs in `format`, filtered by
    /// `AGENTRT_LOG` from `log_filter`), and, as `otel` asks, the trace and
    /// meter providers; with `prometheus` a pull reader for `/metrics`.
    /// Must run inside a tokio runtime when OTLP is on (the gRPC exporter's
    /// channel lives on it).
    pub fn init(
        format: LogFormat,
        log_filter: Option<&str>,
        otel: &OtelEnv,
        prometheus: bool,
    ) -> Result<Self, TelemetryError> {
        let resource = otel.resource();
        let tracer = match &otel.traces {
            Some(endpoint) => {
                opentelemetry::global::set_text_map_propagator(
                    opentelemetry_sdk::propagation::TraceContextPropagator::new(),
                );
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .with_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| TelemetryError(format!("the OTLP span exporter: {e}")))?;
                Some(
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_sampler(otel.sampler.to_sdk())
                        .with_resource(resource.clone())
                        .build(),
                )
            }
            None => None,
        };
        let registry = prometheus.then(prometheus::Registry::new);
        let meter = if registry.is_some() || otel.metrics.is_some() {
            let mut builder = SdkMeterProvider::builder().with_resource(resource);
            if let Some(registry) = &registry {
                builder = builder.with_reader(registry.reader());
            }
            if let Some(endpoint) = &otel.metrics {
                let exporter = opentelemetry_otlp::MetricExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .with_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| TelemetryError(format!("the OTLP metric exporter: {e}")))?;
                builder = builder.with_reader(
                    opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
                        .with_interval(otel.metric_interval)
                        .build(),
                );
            }
            let provider = builder.build();
            opentelemetry::global::set_meter_provider(provider.clone());
            process::register(&provider.meter(agentrt_runtime::telemetry::metrics::METER));
            Some(provider)
        } else {
            None
        };

        let filter = LogFilter::parse(log_filter.unwrap_or("info"));
        let installed = match &tracer {
            // The log filter is then the only filter: it applies to the
            // whole subscriber, so the spans it disables are never created,
            // and entering a span (every poll of an instrumented future)
            // does no per-layer bookkeeping.
            None => tracing_subscriber::registry()
                .with(filter.global())
                .with(log_layer(format))
                .try_init(),
            Some(provider) => tracing_subscriber::registry()
                .with(log_layer(format).with_filter(filter.per_layer()))
                .with(
                    tracing_opentelemetry::layer()
                        .with_tracer(provider.tracer("agentrt"))
                        .with_location(false)
                        .with_threads(false)
                        .with_filter(LevelFilter::INFO),
                )
                .try_init(),
        };
        installed.map_err(|e| TelemetryError(format!("a subscriber is already installed: {e}")))?;
        Ok(Self {
            tracer,
            meter,
            prometheus: registry,
        })
    }

    /// The Prometheus registry, when `/metrics` was asked for.
    pub fn prometheus(&self) -> Option<prometheus::Registry> {
        self.prometheus.clone()
    }

    /// Whether traces are exported.
    pub fn traces_on(&self) -> bool {
        self.tracer.is_some()
    }

    /// Exports what is queued now (blocking: call it off the async
    /// workers).
    pub fn flush(&self) {
        if let Some(t) = &self.tracer
            && let Err(err) = t.force_flush()
        {
            tracing::warn!(error = %err, "flushing traces failed");
        }
        if let Some(m) = &self.meter
            && let Err(err) = m.force_flush()
        {
            tracing::warn!(error = %err, "flushing metrics failed");
        }
    }

    /// Flushes and stops the exporters (blocking: call it off the async
    /// workers, with the runtime still running).
    pub fn shutdown(self) {
        if let Some(t) = self.tracer
            && let Err(err) = t.shutdown()
        {
            eprintln!("agentrt-server: stopping the trace exporter: {err}");
        }
        if let Some(m) = self.meter
            && let Err(err) = m.shutdown()
        {
            eprintln!("agentrt-server: stopping the metric exporter: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LogFilter;

    #[test]
    fn static_directives_are_targets_and_span_or_field_directives_an_env_filter() {
        for spec in [
            "info",
            "agentrt=debug,h2=warn",
            "warn,agentrt_runtime=trace",
            "agentrt",
        ] {
            assert!(
                matches!(LogFilter::parse(spec), LogFilter::Targets(_)),
                "{spec}"
            );
        }
        for spec in [
            "agentrt[turn]=debug",
            "[turn{session_id=abc}]=debug",
            "info,[{session_id}]=trace",
            "agentrt[{session_id}]=debug",
            "agentrt[turn{x}]=debug",
        ] {
            assert!(
                matches!(LogFilter::parse(spec), LogFilter::Env(_)),
                "{spec}"
            );
        }
    }
}
