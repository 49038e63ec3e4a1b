//! [`RequestLimitsLayer`]: every request body must arrive within the
//! request timeout (for streaming requests: no silence longer than it), and
//! a request message longer than the limit is refused with INVALID_ARGUMENT
//! naming the limit before it is buffered. Calls to the services served
//! without credentials (health, reflection) whose request is still
//! arriving share a pool of their own that evicts its oldest member; every
//! call counts as open on its connection until its response ends (the
//! connection's idle timeout).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::transport::server::TcpConnectInfo;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use super::accept::ConnInfo;
use super::lifetime::OpenCall;
use super::peers::{PeerCounts, PeerSlot};
use super::pool::{EvictingPool, PoolSlot};
use crate::config::TransportSettings;

/// The gRPC paths whose requests are streams (client or bidi streaming),
/// from the descriptor sets of every service served here.
pub(crate) fn streaming_request_paths(descriptor_sets: &[&[u8]]) -> HashSet<String> {
    use prost::Message as _;
    let mut paths = HashSet::new();
    for bytes in descriptor_sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(*bytes) else {
            continue;
        };
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                for method in &service.method {
                    if method.client_streaming() {
                        let service_name = if package.is_empty() {
                            service.name().to_owned()
                        } else {
                            format!("{package}.{}", service.name())
                        };
                        paths.insert(format!("/{service_name}/{}", method.name()));
                    }
                }
            }
        }
    }
    paths
}

/// The services answered without credentials: health and reflection.
pub(crate) fn anonymous_services(descriptor_sets: &[&[u8]]) -> HashSet<String> {
    use prost::Message as _;
    let mut names = HashSet::new();
    for bytes in descriptor_sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(*bytes) else {
            continue;
        };
        for file in &set.file {
            let package = file.package();
            if package == "grpc.health.v1" || package.starts_with("grpc.reflection.") {
                for service in &file.service {
                    names.insert(format!("{package}.{}", service.name()));
                }
            }
        }
    }
    names
}

/// Bounds how long a request takes to arrive and how large its messages
/// may be (see [`TransportSettings::request_timeout`] and
/// [`TransportSettings::max_request_bytes`]).
#[derive(Debug, Clone)]
pub struct RequestLimitsLayer {
    timeout: Duration,
    max_message: usize,
    streaming: Arc<HashSet<String>>,
    /// Services answered without credentials.
    anonymous: Arc<HashSet<String>>,
    /// Calls per peer address whose request is still arriving.
    pending: PeerCounts,
    /// Calls to `anonymous` services whose request is still arriving.
    pending_anonymous: EvictingPool,
}

impl RequestLimitsLayer {
    /// From the settings; `streaming` are the paths whose requests are
    /// streams (they get an idle timeout instead of a total one),
    /// `anonymous` the services answered without credentials (their
    /// pending calls have a pool of their own).
    pub fn new(
        settings: &TransportSettings,
        streaming: HashSet<String>,
        anonymous: HashSet<String>,
    ) -> Self {
        Self {
            timeout: settings.request_timeout,
            max_message: settings.max_request_bytes,
            streaming: Arc::new(streaming),
            anonymous: Arc::new(anonymous),
            pending: PeerCounts::new(settings.max_pending_requests_per_ip),
            pending_anonymous: EvictingPool::new(
                "pending calls to health and reflection",
                settings.max_pending_anonymous_requests,
            ),
        }
    }

    fn is_anonymous(&self, path: &str) -> bool {
        path.strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .is_some_and(|(service, _)| self.anonymous.contains(service))
    }
}

impl<S> tower::Layer<S> for RequestLimitsLayer {
    type Service = RequestLimits<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestLimits {
            inner,
            limits: self.clone(),
        }
    }
}

/// The service of [`RequestLimitsLayer`].
#[derive(Debug, Clone)]
pub struct RequestLimits<S> {
    inner: S,
    limits: RequestLimitsLayer,
}

impl<S> tower::Service<http::Request<Body>> for RequestLimits<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures::future::Either<
        HeldResponse<S::Future, OpenCall>,
        futures::future::Ready<Result<http::Response<Body>, S::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let streaming = self.limits.streaming.contains(req.uri().path());
        let timeout = self.limits.timeout;
        let max_message = self.limits.max_message;
        let mut req = req;
        let mut open = None;
        if let Some(info) = req.extensions().get::<ConnInfo>().cloned() {
            req.extensions_mut().insert(info.tcp);
            if let Some(client) = info.client {
                req.extensions_mut().insert(client);
            }
            open = Some(info.state.open_call());
        }
        if req.body().is_end_stream() {
            return futures::future::Either::Left(HeldResponse::new(self.inner.call(req), open));
        }
        let peer = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .map(|a| a.ip());
        let slot = match peer {
            Some(ip) => match self.limits.pending.claim(ip) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(peer = %ip, "refusing a call over transport.max_pending_requests_per_ip");
                    return futures::future::Either::Right(futures::future::ready(Ok(
                        Status::resource_exhausted(format!(
                            "too many calls from this address are still sending their request \
                             (transport.max_pending_requests_per_ip = {}); finish sending requests \
                             before starting more",
                            self.limits.pending.max()
                        ))
                        .into_http(),
                    )));
                }
            },
            None => None,
        };
        let anonymous = self
            .limits
            .is_anonymous(req.uri().path())
            .then(|| self.limits.pending_anonymous.join());
        let evicted = anonymous.as_ref().map(|a| Box::pin(a.evicted()));
        let max_anonymous = self.limits.pending_anonymous.max();
        let req = req.map(|body| {
            Body::new(LimitedBody {
                inner: body,
                slot,
                anonymous,
                evicted,
                max_anonymous,
                deadline: Some(Box::pin(tokio::time::sleep(timeout))),
                idle: streaming.then_some(timeout),
                timeout,
                max_message,
                header: [0; 5],
                header_len: 0,
                remaining: 0,
            })
        });
        futures::future::Either::Left(HeldResponse::new(self.inner.call(req), open))
    }
}

/// A response future whose body holds `G` until the response ends: the
/// call stays counted (open on its connection, [`RequestLimits`]; a place
/// of its principal, [`super::PerPrincipal`]) for as long as it streams.
pub struct HeldResponse<F, G> {
    inner: Pin<Box<F>>,
    guard: Option<G>,
}

impl<F, G> std::fmt::Debug for HeldResponse<F, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldResponse")
            .field("held", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, G> HeldResponse<F, G> {
    pub(super) fn new(inner: F, guard: Option<G>) -> Self {
        Self {
            inner: Box::pin(inner),
            guard,
        }
    }
}

impl<F, G, E> Future for HeldResponse<F, G>
where
    F: Future<Output = Result<http::Response<Body>, E>>,
    G: Send + Unpin + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let response = std::task::ready!(this.inner.as_mut().poll(cx))?;
        Poll::Ready(Ok(match this.guard.take() {
            None => response,
            Some(guard) => response.map(|body| {
                Body::new(HeldBody {
                    inner: body,
                    _guard: guard,
                })
            }),
        }))
    }
}

/// A response body that holds its call's guard until dropped.
struct HeldBody<G> {
    inner: Body,
    _guard: G,
}

impl<G: Unpin> HttpBody for HeldBody<G> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body with a deadline and a message-size check.
struct LimitedBody {
    inner: Body,
    /// This call's place among its peer's pending requests, given back
    /// when the request has arrived (or failed, or was dropped).
    slot: Option<PeerSlot>,
    /// Calls to health and reflection: this call's place in their pool.
    anonymous: Option<PoolSlot>,
    /// Completes when that place was given to a newer call.
    evicted: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    max_anonymous: usize,
    /// None once the body has ended or failed.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Streaming requests: each frame renews the deadline by this much.
    idle: Option<Duration>,
    timeout: Duration,
    max_message: usize,
    /// The gRPC message prefix being read (flag + 4-byte length).
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message still to come.
    remaining: u64,
}

impl LimitedBody {
    /// The request has arrived, failed or timed out.
    fn finish(&mut self) {
        self.deadline = None;
        self.slot = None;
        self.anonymous = None;
        self.evicted = None;
    }

    fn evicted(&self) -> Status {
        Status::resource_exhausted(format!(
            "too many calls to health and reflection are still sending their request \
             (transport.max_pending_anonymous_requests = {}); this one, the oldest, was ended \
             to make room",
            self.max_anonymous
        ))
    }

    /// Follows the gRPC framing through `data`; the length of the first
    /// message over the limit.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), u64> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = data
                    .len()
                    .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (self.header.len() - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
            self.header_len += n;
            data = &data[n..];
            if self.header_len == self.header.len() {
                self.header_len = 0;
                let len = u64::from(u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]));
                if len > self.max_message as u64 {
                    return Err(len);
                }
                self.remaining = len;
            }
        }
        Ok(())
    }

    fn too_large(&self, len: u64) -> Status {
        let description = format!(
            "the request message is {len} bytes; the largest accepted is {} bytes (transport.max_request_bytes)",
            self.max_message
        );
        Status::with_error_details(
            Code::InvalidArgument,
            format!("request: {description}"),
            ErrorDetails::with_bad_request_violation("request", description),
        )
    }

    fn timed_out(&self) -> Status {
        let what = if self.idle.is_some() {
            "the request stream sent nothing for"
        } else {
            "the request did not arrive completely within"
        };
        Status::deadline_exceeded(format!(
            "{what} {:?} (transport.request_timeout); send the whole request at once",
            self.timeout
        ))
    }
}

impl HttpBody for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.deadline.is_none() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if this.idle.is_none() && this.deadline.as_ref().is_some_and(|d| d.is_elapsed()) {
                    this.finish();
                    return Poll::Ready(Some(Err(this.timed_out())));
                }
                if let Some(Err(len)) = frame.data_ref().map(|data| this.scan(data)) {
                    this.finish();
                    return Poll::Ready(Some(Err(this.too_large(len))));
                }
                if let (Some(idle), Some(deadline)) = (this.idle, this.deadline.as_mut()) {
                    deadline.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                this.finish();
                Poll::Ready(other)
            }
            Poll::Pending => {
                if this
                    .evicted
                    .as_mut()
                    .is_some_and(|evicted| evicted.as_mut().poll(cx).is_ready())
                {
                    this.finish();
                    return Poll::Ready(Some(Err(this.evicted())));
                }
                if this
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
                {
                    this.finish();
                    return Poll::Ready(Some(Err(this.timed_out())));
                }
                Poll::Pending
            }
        }
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
    fn upload_and_reflection_are_the_streaming_requests_served() {
        let paths = streaming_request_paths(&[
            agentrt_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ]);
        let mut paths: Vec<_> = paths.into_iter().collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                "/agentrt.v1.SessionService/UploadBlob",
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            ]
        );
    }
}
