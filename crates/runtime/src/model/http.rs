//! HTTP plumbing shared by the streaming providers: endpoint validation,
//! the client (no redirects, no proxy for loopback), sending a streaming
//! request with a bound on the wait for headers, and mapping refusals to
//! [`ModelError`]s without leaking upstream bodies.

use std::net::IpAddr;
use std::pin::Pin;
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;

use super::retry::retry_after_header;
use super::sse::{SseEvent, SseParser};
use super::{ModelError, ModelEvent, ModelStream};

/// Most of a refusal's body that is logged (at debug level, never returned).
pub(crate) const LOGGED_BODY_BYTES: usize = 512;

/// `{base_url}/{path}`, if it is an http(s) URL a path can be appended to.
pub(crate) fn endpoint(base_url: &str, path: &str) -> Result<reqwest::Url, String> {
    let root = base_url.trim_end_matches('/');
    let endpoint = reqwest::Url::parse(&format!("{root}/{path}")).map_err(|e| e.to_string())?;
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err("the scheme must be http or https".into());
    }
    if endpoint.query().is_some() || endpoint.fragment().is_some() {
        return Err("a query or fragment cannot be extended with a path".into());
    }
    Ok(endpoint)
}

/// The client for `endpoint`.
pub(crate) fn client(
    endpoint: &reqwest::Url,
    connect_timeout: Duration,
) -> Result<reqwest::Client, String> {
    // A redirect would re-send the prompt (and maybe the key) to a place
    // nobody configured.
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none());
    // Environment proxies have no loopback exemption by default, and a
    // local model server is never meant to be reached through one.
    if is_loopback(endpoint) {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|e| error_chain(&e))
}

/// Sends a streaming request: a refusal becomes an error (with the
/// upstream's retry hint when it gave one), and so does a 2xx that is not
/// `text/event-stream`.
pub(crate) async fn send_for_stream(
    request: reqwest::RequestBuilder,
    connect_timeout: Duration,
    idle_timeout: Duration,
) -> Result<reqwest::Response, ModelError> {
    // reqwest only bounds the connect phase; a server that accepts and then
    // stays silent must not hold the turn forever.
    let wait = connect_timeout.saturating_add(idle_timeout);
    let response = match tokio::time::timeout(wait, request.send()).await {
        Err(_) => {
            return Err(ModelError::Unavailable(format!(
                "no response headers within {wait:?}"
            )));
        }
        Ok(Err(e)) => return Err(ModelError::Unavailable(error_chain(&e.without_url()))),
        Ok(Ok(response)) => response,
    };
    if !response.status().is_success() {
        return Err(refusal(response, idle_timeout).await);
    }
    if let Some(content_type) = response.headers().get(CONTENT_TYPE) {
        let content_type = content_type.to_str().unwrap_or_default();
        if !content_type
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
        {
            tracing::debug!(content_type, "model upstream did not answer with a stream");
            return Err(ModelError::Malformed(
                "the response is not text/event-stream".into(),
            ));
        }
    }
    Ok(response)
}

/// Most of a refusal's body read to classify it (e.g. a 429 that is an
/// exhausted quota, not a rate limit).
const CLASSIFIED_BODY_BYTES: usize = 8 * 1024;

/// Maps a non-2xx answer to an error. The body stays out of the error (it
/// may echo the prompt) and is only logged, truncated, at debug level.
async fn refusal(mut response: reqwest::Response, idle_timeout: Duration) -> ModelError {
    let status = response.status();
    let retry_after = retry_after_header(response.headers());
    let mut body = Vec::new();
    let _ = tokio::time::timeout(idle_timeout, async {
        while body.len() < CLASSIFIED_BODY_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                _ => break,
            }
        }
    })
    .await;
    body.truncate(CLASSIFIED_BODY_BYTES);
    let logged = &body[..body.len().min(LOGGED_BODY_BYTES)];
    tracing::debug!(
        status = status.as_u16(),
        body = %String::from_utf8_lossy(logged),
        "model upstream refused the request"
    );
    if status.as_u16() == 429 && quota_exhausted(&body) {
        // Retrying cannot help, whatever Retry-After says.
        return ModelError::QuotaExhausted(format!("HTTP {}", status.as_u16()));
    }
    let error = status_error(status.as_u16());
    match retry_after {
        Some(wait) if error.is_retryable() => error.with_retry_after(wait),
        _ => error,
    }
}

/// Whether a 429's body says the account's quota is exhausted: OpenAI's
/// `{"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}`.
/// Read as JSON when it parses, else (a body cut at the read bound)
/// matched as text.
fn quota_exhausted(body: &[u8]) -> bool {
    const QUOTA: &str = "insufficient_quota";
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => ["/error/type", "/error/code", "/type", "/code"]
            .iter()
            .any(|p| value.pointer(p).and_then(serde_json::Value::as_str) == Some(QUOTA)),
        Err(_) => body.windows(QUOTA.len()).any(|w| w == QUOTA.as_bytes()),
    }
}

/// The error for an HTTP status.
fn status_error(code: u16) -> ModelError {
    let message = format!("HTTP {code}");
    match code {
        429 => ModelError::RateLimited(message),
        401 | 403 => ModelError::Unauthorized(message),
        // 409: a conflicting concurrent request; 529: Anthropic's overloaded.
        408 | 409 | 500..=599 => ModelError::Unavailable(message),
        _ => ModelError::Rejected(message),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An error with its whole chain of causes, for logs.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// At most [`LOGGED_BODY_BYTES`] of `text`, cut at a character boundary.
pub(crate) fn truncated(text: &str) -> &str {
    let mut end = text.len().min(LOGGED_BODY_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A provider's decoding of its SSE events into model events.
pub(crate) trait SseDecoder: Send + 'static {
    /// What ends a complete stream, named in the error when it is missing.
    const END: &'static str;

    /// Handles one event; `Ok(true)` once the stream is complete. Decoded
    /// items are queued for [`SseDecoder::next_decoded`].
    fn decode(&mut self, event: SseEvent) -> Result<bool, ModelError>;

    /// The next queued item.
    fn next_decoded(&mut self) -> Option<ModelEvent>;
}

/// The stream of a step: reads the body with an idle timeout, feeds the SSE
/// parser and the decoder, and ends with the decoder's items then at most
/// one error. It owns the response, so dropping the stream drops the
/// connection; the response is also dropped as soon as the outcome is known.
pub(crate) fn sse_stream<D: SseDecoder>(
    response: reqwest::Response,
    idle_timeout: Duration,
    decoder: D,
) -> ModelStream {
    let now = tokio::time::Instant::now();
    let body = SseBody {
        response: Some(response),
        parser: SseParser::new(),
        decoder,
        error: None,
        idle_timeout,
        idle: Box::pin(tokio::time::sleep_until(now + idle_timeout)),
        last_data: now,
    };
    Box::pin(futures::stream::unfold(body, |mut body| async move {
        let item = body.next_item().await?;
        Some((item, body))
    }))
}

struct SseBody<D> {
    response: Option<reqwest::Response>,
    parser: SseParser,
    decoder: D,
    /// The final error, delivered after the items decoded before it.
    error: Option<ModelError>,
    idle_timeout: Duration,
    /// Fires `idle_timeout` after the data read when it was armed; re-armed
    /// when it finds newer data (so a chunk costs a clock read, not a
    /// timer registered and cancelled).
    idle: Pin<Box<tokio::time::Sleep>>,
    last_data: tokio::time::Instant,
}

impl<D: SseDecoder> SseBody<D> {
    async fn next_item(&mut self) -> Option<Result<ModelEvent, ModelError>> {
        loop {
            if let Some(event) = self.decoder.next_decoded() {
                return Some(Ok(event));
            }
            if let Some(error) = self.error.take() {
                return Some(Err(error));
            }
            let response = self.response.as_mut()?;
            let read = tokio::select! {
                biased;
                read = response.chunk() => Some(read),
                () = &mut self.idle => None,
            };
            match read {
                None => {
                    let due = self.last_data + self.idle_timeout;
                    if due > tokio::time::Instant::now() {
                        self.idle.as_mut().reset(due);
                        continue;
                    }
                    self.fail(ModelError::Unavailable(format!(
                        "no data for {:?}",
                        self.idle_timeout
                    )));
                }
                Some(Err(e)) => self.fail(ModelError::Truncated(format!(
                    "reading the stream failed: {}",
                    error_chain(&e.without_url())
                ))),
                Some(Ok(None)) => self.fail(ModelError::Truncated(format!(
                    "the stream ended without {}",
                    D::END
                ))),
                Some(Ok(Some(bytes))) => {
                    self.last_data = tokio::time::Instant::now();
                    self.on_bytes(&bytes);
                }
            }
        }
    }

    /// Ends the stream with `error` and closes the connection now.
    fn fail(&mut self, error: ModelError) {
        self.response = None;
        self.error = Some(error);
    }

    fn on_bytes(&mut self, bytes: &[u8]) {
        let events = match self.parser.push(bytes) {
            Ok(events) => events,
            Err(e) => return self.fail(ModelError::Malformed(e.to_string())),
        };
        for event in events {
            match self.decoder.decode(event) {
                Ok(false) => {}
                Ok(true) => {
                    self.response = None;
                    break;
                }
                Err(e) => {
                    self.fail(e);
                    break;
                }
            }
        }
    }
}
