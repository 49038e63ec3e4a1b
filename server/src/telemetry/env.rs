//! The standard OpenTelemetry environment variables we honour, read
//! through a lookup function (the process environment in the binary, a map
//! in tests), and checked before anything is bound: a value we cannot
//! honour is a start-up error, not a silently missing trace.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::Sampler;

/// Where the OTLP exporters send when no endpoint is set (the OTLP/gRPC
/// default).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4317";

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name`
/// resource attribute says otherwise.
pub const DEFAULT_SERVICE_NAME: &str = "agentrt-server";

/// What the `OTEL_*` environment asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelEnv {
    /// OTLP/gRPC endpoint for spans; `None`: traces off.
    pub traces: Option<String>,
    /// OTLP/gRPC endpoint for metrics; `None`: no OTLP metrics.
    pub metrics: Option<String>,
    /// `OTEL_METRIC_EXPORT_INTERVAL` (ms). Default 60 s.
    pub metric_interval: Duration,
    /// `service.name`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, without `service.name`.
    pub resource_attributes: Vec<(String, String)>,
    /// `OTEL_TRACES_SAMPLER[_ARG]`.
    pub sampler: SamplerChoice,
}

/// The samplers of `OTEL_TRACES_SAMPLER`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio` with the ratio.
    Ratio(f64),
    /// `parentbased_always_on` (the default).
    ParentAlwaysOn,
    /// `parentbased_always_off`.
    ParentAlwaysOff,
    /// `parentbased_traceidratio` with the ratio.
    ParentRatio(f64),
}

impl SamplerChoice {
    /// The SDK sampler.
    pub fn to_sdk(self) -> Sampler {
        match self {
            Self::AlwaysOn => Sampler::AlwaysOn,
            Self::AlwaysOff => Sampler::AlwaysOff,
            Self::Ratio(r) => Sampler::TraceIdRatioBased(r),
            Self::ParentAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            Self::ParentAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            Self::ParentRatio(r) => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r))),
        }
    }
}

/// A variable whose value we cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OtelEnvError(pub String);

fn nonempty(lookup: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The endpoint of one signal, or `None` when that signal is off.
fn signal(
    lookup: &dyn Fn(&str) -> Option<String>,
    exporter_var: &str,
    endpoint_var: &str,
) -> Result<Option<String>, OtelEnvError> {
    let endpoint =
        nonempty(lookup, endpoint_var).or_else(|| nonempty(lookup, "OTEL_EXPORTER_OTLP_ENDPOINT"));
    let exporter = nonempty(lookup, exporter_var).map(|v| v.to_ascii_lowercase());
    let on = match exporter.as_deref() {
        None => endpoint.is_some(),
        Some("otlp") => true,
        // Prometheus is served by --metrics-listen, not by an exporter.
        Some("none" | "prometheus") => false,
        Some(other) => {
            return Err(OtelEnvError(format!(
                "{exporter_var}={other} is not supported (use otlp or none)"
            )));
        }
    };
    Ok(on.then(|| endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())))
}

fn ratio(lookup: &dyn Fn(&str) -> Option<String>) -> Result<f64, OtelEnvError> {
    match nonempty(lookup, "OTEL_TRACES_SAMPLER_ARG") {
        None => Ok(1.0),
        Some(v) => match v.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(OtelEnvError(format!(
                "OTEL_TRACES_SAMPLER_ARG={v} is not a ratio between 0 and 1"
            ))),
        },
    }
}

impl OtelEnv {
    /// Everything off: what an empty environment means.
    pub fn off() -> Self {
        Self {
            traces: None,
            metrics: None,
            metric_interval: Duration::from_secs(60),
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            resource_attributes: Vec::new(),
            sampler: SamplerChoice::ParentAlwaysOn,
        }
    }

    /// Reads the `OTEL_*` variables through `lookup`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, OtelEnvError> {
        let mut env = Self::off();
        if nonempty(lookup, "OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(env);
        }
        for var in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ] {
            if let Some(p) = nonempty(lookup, var)
                && p != "grpc"
            {
                return Err(OtelEnvError(format!(
                    "{var}={p} is not supported: agentrt exports OTLP over gRPC only"
                )));
            }
        }
        env.traces = signal(
            lookup,
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )?;
        env.metrics = signal(
            lookup,
            "OTEL_METRICS_EXPORTER",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )?;
        if let Some(ms) = nonempty(lookup, "OTEL_METRIC_EXPORT_INTERVAL") {
            let ms = ms.parse::<u64>().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                OtelEnvError(format!(
                    "OTEL_METRIC_EXPORT_INTERVAL={ms} is not a number of milliseconds"
                ))
            })?;
            env.metric_interval = Duration::from_millis(ms);
        }
        if let Some(attrs) = nonempty(lookup, "OTEL_RESOURCE_ATTRIBUTES") {
            for pair in attrs.split(',').filter(|p| !p.trim().is_empty()) {
                let (k, v) = pair.split_once('=').ok_or_else(|| {
                    OtelEnvError(format!(
                        "OTEL_RESOURCE_ATTRIBUTES: {pair:?} is not key=value"
                    ))
                })?;
                let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
                if k == "service.name" {
                    env.service_name = v;
                } else {
                    env.resource_attributes.push((k, v));
                }
            }
        }
        if let Some(name) = nonempty(lookup, "OTEL_SERVICE_NAME") {
            env.service_name = name;
        }
        env.sampler = match nonempty(lookup, "OTEL_TRACES_SAMPLER").as_deref() {
            None | Some("parentbased_always_on") => SamplerChoice::ParentAlwaysOn,
            Some("always_on") => SamplerChoice::AlwaysOn,
            Some("always_off") => SamplerChoice::AlwaysOff,
            Some("traceidratio") => SamplerChoice::Ratio(ratio(lookup)?),
            Some("parentbased_always_off") => SamplerChoice::ParentAlwaysOff,
            Some("parentbased_traceidratio") => SamplerChoice::ParentRatio(ratio(lookup)?),
            Some(other) => {
                return Err(OtelEnvError(format!(
                    "OTEL_TRACES_SAMPLER={other} is not supported"
                )));
            }
        };
        Ok(env)
    }

    /// The resource every span and metric is reported under.
    pub fn resource(&self) -> Resource {
        Resource::builder_empty()
            .with_service_name(self.service_name.clone())
            .with_attributes(
                self.resource_attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<OtelEnv, OtelEnvError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OtelEnv::from_lookup(&move |k| map.get(k).cloned())
    }

    #[test]
    fn an_empty_environment_turns_everything_off() {
        assert_eq!(env(&[]).unwrap(), OtelEnv::off());
    }

    #[test]
    fn an_endpoint_turns_traces_and_metrics_on_unless_an_exporter_is_none() {
        let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")]).unwrap();
        assert_eq!(e.traces.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!(e.metrics.as_deref(), Some("http://127.0.0.1:4317"));
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:9999",
            ),
            ("OTEL_METRICS_EXPORTER", "none"),
        ])
        .unwrap();
        assert_eq!(e.traces.as_deref(), Some("http://127.0.0.1:9999"));
        assert_eq!(e.metrics, None);
        let e = env(&[("OTEL_TRACES_EXPORTER", "otlp")]).unwrap();
        assert_eq!(e.traces.as_deref(), Some(DEFAULT_ENDPOINT));
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ])
        .unwrap();
        assert_eq!(e, OtelEnv::off());
    }

    #[test]
    fn names_samplers_and_resource_attributes_are_read() {
        let e = env(&[
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=a, deployment.environment=prod",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ])
        .unwrap();
        assert_eq!(e.service_name, "a");
        assert_eq!(
            e.resource_attributes,
            vec![("deployment.environment".to_owned(), "prod".to_owned())]
        );
        assert_eq!(e.sampler, SamplerChoice::ParentRatio(0.25));
        let e = env(&[
            ("OTEL_SERVICE_NAME", "b"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=a"),
        ])
        .unwrap();
        assert_eq!(e.service_name, "b");
    }

    #[test]
    fn values_we_cannot_honour_are_errors_naming_the_variable() {
        for (k, v) in [
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "soon"),
            ("OTEL_RESOURCE_ATTRIBUTES", "novalue"),
        ] {
            let err = env(&[(k, v)]).unwrap_err();
            assert!(err.0.contains(k), "{err}");
        }
        let err = env(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ])
        .unwrap_err();
        assert!(err.0.contains("OTEL_TRACES_SAMPLER_ARG"), "{err}");
    }
}
