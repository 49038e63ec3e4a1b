//! [`CatchPanicLayer`]: a handler that panics answers INTERNAL instead of
//! resetting the stream.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt as _;
use tonic::Status;
use tonic::body::Body;

/// Turns a panic of the service future (a unary handler, an interceptor,
/// the start of a streaming one) into an INTERNAL status; the panic is
/// logged with the method, the client learns nothing internal.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchPanicLayer;

impl<S> tower::Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CatchPanic { inner }
    }
}

/// The service of [`CatchPanicLayer`].
#[derive(Debug, Clone)]
pub struct CatchPanic<S> {
    inner: S,
}

/// The text of a panic payload, when it has one.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl<S> tower::Service<http::Request<Body>> for CatchPanic<S>
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
        let method = req.uri().path().to_owned();
        let call = std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req)));
        Box::pin(async move {
            let outcome = match call {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
                Err(payload) => Err(payload),
            };
            outcome.unwrap_or_else(|payload| {
                tracing::error!(
                    method = %method,
                    panic = panic_text(payload.as_ref()),
                    "a handler panicked; the call ends INTERNAL"
                );
                Ok(Status::internal(
                    "internal error: the server failed while handling this call (it has been logged); \
                     retrying may work",
                )
                .into_http())
            })
        })
    }
}
