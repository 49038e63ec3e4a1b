//! The RPC server span and metrics, as one tower layer in front of every
//! service: the caller's W3C `traceparent`/`tracestate` is extracted here,
//! once, and becomes the span's parent; the span is named and attributed
//! per the RPC conventions (`{rpc.method}`, `rpc.system.name`,
//! `rpc.method`, `rpc.response.status_code`, kind SERVER); its status comes from the
//! response headers (trailers-only answers) or the trailers of a stream.
//! `rpc.server.call.duration` is recorded when the call ends, and a call
//! refused before any message (a trailers-only error) gets one `info` line
//! and a count in `agentrt.admission.rejections` by reason.
//!
//! The method label is the fully qualified method for methods we serve and
//! `_OTHER` otherwise, so a scanner cannot grow the series without bound.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use agentrt_runtime::telemetry::metrics::{CALL_SECONDS, METER};
use agentrt_runtime::telemetry::semconv::{
    AGENTRT_REASON, RPC_METHOD, RPC_METHOD_OTHER, RPC_RESPONSE_STATUS_CODE, RPC_SYSTEM_NAME,
};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TraceContextExt as _;
use tonic::Status;
use tonic::body::Body;
use tonic_types::StatusExt as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// gRPC status code names, indexed by code number.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The name of gRPC status code `code` (`UNKNOWN` for numbers outside
/// the standard range).
pub fn code_name(code: i32) -> &'static str {
    usize::try_from(code)
        .ok()
        .and_then(|i| CODE_NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
}

/// The fully qualified names (`pkg.Service/Method`) of every method in
/// the encoded descriptor sets.
pub fn known_methods(sets: &[&[u8]]) -> HashSet<String> {
    use prost::Message as _;
    let mut methods = HashSet::new();
    for set in sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(*set) else {
            continue;
        };
        for file in set.file {
            let package = file.package.unwrap_or_default();
            for service in file.service {
                let service_name = service.name.unwrap_or_default();
                for method in service.method {
                    let prefix = if package.is_empty() {
                        service_name.clone()
                    } else {
                        format!("{package}.{service_name}")
                    };
                    methods.insert(format!("{prefix}/{}", method.name.unwrap_or_default()));
                }
            }
        }
    }
    methods
}

struct Instruments {
    duration: Histogram<f64>,
    rejections: Counter<u64>,
}

fn instruments() -> &'static Instruments {
    static I: OnceLock<Instruments> = OnceLock::new();
    I.get_or_init(|| {
        let meter = opentelemetry::global::meter(METER);
        Instruments {
            duration: meter
                .f64_histogram("rpc.server.call.duration")
                .with_unit("s")
                .with_description("Duration of gRPC calls, by method and status")
                .with_boundaries(CALL_SECONDS.to_vec())
                .build(),
            rejections: meter
                .u64_counter("agentrt.admission.rejections")
                .with_unit("{call}")
                .with_description("Calls refused before any message, by reason")
                .build(),
        }
    })
}

/// Makes the RPC span of every call; see the module doc.
#[derive(Debug, Clone)]
pub struct RpcLayer {
    methods: Arc<HashSet<String>>,
}

impl RpcLayer {
    /// A layer labelling `methods` by name and everything else `_OTHER`.
    pub fn new(methods: HashSet<String>) -> Self {
        Self {
            methods: Arc::new(methods),
        }
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = Rpc<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Rpc {
            inner,
            methods: Arc::clone(&self.methods),
        }
    }
}

/// The service of [`RpcLayer`].
#[derive(Debug, Clone)]
pub struct Rpc<S> {
    inner: S,
    methods: Arc<HashSet<String>>,
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// What is left to do when a call ends.
struct Ending {
    span: tracing::Span,
    /// The method, when it is one we serve.
    known: Option<String>,
    started: Instant,
}

impl Ending {
    fn method(&self) -> String {
        self.known
            .clone()
            .unwrap_or_else(|| RPC_METHOD_OTHER.to_owned())
    }

    /// Records the call's end with status `code`; `refused` holds the
    /// status of a call refused before any message.
    fn finish(self, code: i32, refused: Option<&Status>) {
        let name = code_name(code);
        let method = self.method();
        self.span.record(RPC_RESPONSE_STATUS_CODE, name);
        if code != 0 {
            self.span.record("otel.status_code", "error");
        }
        let i = instruments();
        i.duration.record(
            self.started.elapsed().as_secs_f64(),
            &[
                KeyValue::new(RPC_SYSTEM_NAME, "grpc"),
                KeyValue::new(RPC_METHOD, method.clone()),
                KeyValue::new(RPC_RESPONSE_STATUS_CODE, name),
            ],
        );
        if let Some(status) = refused {
            let reason = reason(status);
            i.rejections.add(
                1,
                &[
                    KeyValue::new(RPC_METHOD, method.clone()),
                    KeyValue::new(AGENTRT_REASON, reason.clone()),
                ],
            );
            let _in_span = self.span.enter();
            tracing::info!(method = %method, code = name, reason = %reason, "call rejected");
        }
    }
}

/// Why a call was refused, for the log line and the metric label: the
/// `ErrorInfo` reason when there is one, `QUOTA` for a quota failure,
/// `DRAINING` while the server drains, else the code's name. Never the
/// status message (it may quote input).
fn reason(status: &Status) -> String {
    let details = status.get_error_details();
    if let Some(info) = details.error_info() {
        return info.reason.clone();
    }
    if details.quota_failure().is_some() {
        return "QUOTA".to_owned();
    }
    if status.code() == tonic::Code::Unavailable && status.message().contains("draining") {
        return "DRAINING".to_owned();
    }
    code_name(i32::from(status.code())).to_owned()
}

impl<S> tower::Service<http::Request<Body>> for Rpc<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let path = req.uri().path().trim_start_matches('/');
        let known = self.methods.contains(path).then(|| path.to_owned());
        let label = known.as_deref().unwrap_or(RPC_METHOD_OTHER);
        let span = tracing::info_span!(
            "rpc",
            otel.name = %known.as_deref().unwrap_or("grpc"),
            otel.kind = "server",
            { RPC_SYSTEM_NAME } = "grpc",
            { RPC_METHOD } = %label,
            { RPC_RESPONSE_STATUS_CODE } = Empty,
            otel.status_code = Empty,
            method = %label,
            session_id = Empty,
        );
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&HeaderExtractor(req.headers()))
        });
        if parent.span().span_context().is_valid() {
            // Only fails without the OpenTelemetry layer (traces off).
            let _ = span.set_parent(parent);
        }
        let ending = Ending {
            span: span.clone(),
            known,
            started: Instant::now(),
        };
        let future = {
            let _in_span = span.enter();
            self.inner.call(req)
        };
        Box::pin(async move {
            let response = tracing::Instrument::instrument(future, span).await?;
            Ok(match Status::from_header_map(response.headers()) {
                // Trailers-only: the call ends here.
                Some(status) => {
                    let refused = (status.code() != tonic::Code::Ok).then_some(&status);
                    ending.finish(i32::from(status.code()), refused);
                    response
                }
                None => response.map(|body| {
                    Body::new(RpcBody {
                        inner: body,
                        ending: Some(ending),
                    })
                }),
            })
        })
    }
}

/// A response body that ends the call's span at its trailers, or as
/// `CANCELLED` when it is dropped first (the caller went away).
struct RpcBody {
    inner: Body,
    ending: Option<Ending>,
}

impl Drop for RpcBody {
    fn drop(&mut self) {
        if let Some(ending) = self.ending.take() {
            ending.finish(i32::from(tonic::Code::Cancelled), None);
        }
    }
}

impl HttpBody for RpcBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(ending) = self.ending.take()
                {
                    let code = Status::from_header_map(trailers)
                        .map_or(i32::from(tonic::Code::Unknown), |s| i32::from(s.code()));
                    ending.finish(code, None);
                }
            }
            Poll::Ready(Some(Err(status))) => {
                if let Some(ending) = self.ending.take() {
                    ending.finish(i32::from(status.code()), None);
                }
            }
            Poll::Ready(None) => {
                if let Some(ending) = self.ending.take() {
                    ending.finish(i32::from(tonic::Code::Unknown), None);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_follow_the_grpc_numbering() {
        assert_eq!(code_name(0), "OK");
        assert_eq!(code_name(10), "ABORTED");
        assert_eq!(code_name(16), "UNAUTHENTICATED");
        assert_eq!(code_name(17), "UNKNOWN");
        assert_eq!(code_name(-1), "UNKNOWN");
    }

    #[test]
    fn the_served_methods_are_known_by_their_full_names() {
        let methods = known_methods(&[agentrt_proto::FILE_DESCRIPTOR_SET]);
        assert!(
            methods.contains("agentrt.v1.AgentRuntime/Chat"),
            "{methods:?}"
        );
        assert!(!methods.contains("agentrt.v1.AgentRuntime/Nope"));
    }

    #[test]
    fn refusal_reasons_come_from_error_info_then_the_code() {
        let busy = crate::status::from_runtime(agentrt_runtime::RuntimeError::SessionBusy {
            turn_id: "t".into(),
        });
        assert_eq!(reason(&busy), "SESSION_BUSY");
        let draining = crate::status::from_runtime(agentrt_runtime::RuntimeError::Unavailable(
            "the server is draining or shutting down",
        ));
        assert_eq!(reason(&draining), "DRAINING");
        assert_eq!(
            reason(&Status::unauthenticated("no key")),
            "UNAUTHENTICATED"
        );
    }
}
