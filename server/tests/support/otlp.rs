//! A test OTLP/gRPC trace receiver: an in-process tonic server for
//! `opentelemetry.proto.collector.trace.v1.TraceService` on a loopback
//! port, handing every exported span to the test through a bounded
//! channel.

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
