//! Test OTLP/gRPC receivers: in-process tonic servers for
//! `opentelemetry.proto.collector.trace.v1.TraceService` ([`Receiver`])
//! and `…metrics.v1.MetricsService` ([`MetricsReceiver`]) on loopback
//! ports, handing every exported span or metric to the test through a
//! bounded channel.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;

/// One exported span, with its attributes flattened to strings.
#[derive(Debug, Clone)]
pub struct Got {
    pub name: String,
    pub kind: i32,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    pub attrs: HashMap<String, String>,
    pub events: Vec<String>,
    pub service_name: Option<String>,
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| text(v.value.as_ref()))
            .collect::<Vec<_>>()
            .join(","),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

impl Got {
    fn new(span: Span, service_name: Option<String>) -> Self {
        Self {
            name: span.name,
            kind: span.kind,
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_span_id: span.parent_span_id,
            attrs: span
                .attributes
                .into_iter()
                .map(|kv| {
                    (
                        kv.key,
                        text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                    )
                })
                .collect(),
            events: span.events.into_iter().map(|e| e.name).collect(),
            service_name,
        }
    }

    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

#[derive(Debug)]
struct Sink(mpsc::Sender<Got>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in request.into_inner().resource_spans {
            let service = rs.resource.as_ref().and_then(|r| {
                r.attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            });
            for ss in rs.scope_spans {
                for span in ss.spans {
                    // A full channel fails the export, which the test sees
                    // as missing spans: it never blocks the exporter.
                    let _ = self.0.try_send(Got::new(span, service.clone()));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The running receiver.
pub struct Receiver {
    pub endpoint: String,
    pub spans: mpsc::Receiver<Got>,
    _server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (tx, spans) = mpsc::channel(4096);
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Sink(tx)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Self {
            endpoint,
            spans,
            _server: server,
        }
    }

    /// Every span that arrives within `wait` of the previous one.
    pub async fn drain(&mut self, wait: Duration) -> Vec<Got> {
        let mut got = Vec::new();
        while let Ok(Some(span)) = tokio::time::timeout(wait, self.spans.recv()).await {
            got.push(span);
        }
        got
    }
}

/// One exported metric: its name, and the attribute sets of its data
/// points (flattened to strings), each with the point's value when it is
/// a number (sums and gauges; histograms carry their count).
#[derive(Debug, Clone)]
pub struct GotMetric {
    pub name: String,
    pub points: Vec<(HashMap<String, String>, f64)>,
    pub service_name: Option<String>,
}

fn flatten(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> HashMap<String, String> {
    attrs
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
            )
        })
        .collect()
}

#[allow(clippy::cast_precision_loss)]
fn number(
    value: Option<&opentelemetry_proto::tonic::metrics::v1::number_data_point::Value>,
) -> f64 {
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as N;
    match value {
        Some(N::AsDouble(d)) => *d,
        Some(N::AsInt(i)) => *i as f64,
        None => f64::NAN,
    }
}

impl GotMetric {
    #[allow(clippy::cast_precision_loss)]
    fn new(
        metric: opentelemetry_proto::tonic::metrics::v1::Metric,
        service: Option<String>,
    ) -> Self {
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        let points = match metric.data {
            Some(Data::Sum(s)) => s
                .data_points
                .iter()
                .map(|p| (flatten(&p.attributes), number(p.value.as_ref())))
                .collect(),
            Some(Data::Gauge(g)) => g
                .data_points
                .iter()
                .map(|p| (flatten(&p.attributes), number(p.value.as_ref())))
                .collect(),
            Some(Data::Histogram(h)) => h
                .data_points
                .iter()
                .map(|p| (flatten(&p.attributes), p.count as f64))
                .collect(),
            _ => Vec::new(),
        };
        Self {
            name: metric.name,
            points,
            service_name: service,
        }
    }

    /// The value of the point whose attributes include `attrs`.
    pub fn value(&self, attrs: &[(&str, &str)]) -> Option<f64> {
        self.points
            .iter()
            .find(|(a, _)| {
                attrs
                    .iter()
                    .all(|(k, v)| a.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, v)| *v)
    }
}

#[derive(Debug)]
struct MetricSink(mpsc::Sender<GotMetric>);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsService
    for MetricSink
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse,
        >,
        tonic::Status,
    > {
        for rm in request.into_inner().resource_metrics {
            let service = rm.resource.as_ref().and_then(|r| {
                r.attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            });
            for sm in rm.scope_metrics {
                for metric in sm.metrics {
                    // A full channel drops the metric (the next export
                    // sends it again): it never blocks the exporter.
                    let _ = self.0.try_send(GotMetric::new(metric, service.clone()));
                }
            }
        }
        Ok(tonic::Response::new(
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse {
                partial_success: None,
            },
        ))
    }
}

/// A test OTLP/gRPC metrics receiver
/// (`opentelemetry.proto.collector.metrics.v1.MetricsService`).
pub struct MetricsReceiver {
    pub endpoint: String,
    pub metrics: mpsc::Receiver<GotMetric>,
    _server: tokio::task::JoinHandle<()>,
}

impl MetricsReceiver {
    pub async fn start() -> Self {
        use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::MetricsServiceServer;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (tx, metrics) = mpsc::channel(4096);
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(MetricsServiceServer::new(MetricSink(tx)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Self {
            endpoint,
            metrics,
            _server: server,
        }
    }
}
