//! Upstream resilience: [`RetryingProvider`] sends a model step again when
//! the upstream failed in a way a retry may fix (unreachable, 408, 409, 429,
//! 5xx, 529), with exponential backoff and full jitter, honouring the
//! upstream's `Retry-After` / `retry-after-ms`.
//!
//! A step is only retried before anything of it was forwarded: a failure of
//! `stream()` itself, or a stream whose *first* item is an error (e.g. the
//! connection reset before any byte). Once the stream has yielded an event,
//! a later error is final, since a retry would duplicate output.
//!
//! Waiting is a plain `tokio::time::sleep` inside the `stream()` future, so
//! dropping that future (cancellation, turn deadline) stops the retries.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::StreamExt as _;

use super::{ModelError, ModelProvider, ModelRequest, ModelStream, NoCapacity, Reservation};

/// When and how often a failed model step is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (0 counts as 1). Default 3.
    pub max_attempts: u32,
    /// Backoff before the first retry, doubled per retry. Default 250 ms.
    pub base_delay: Duration,
    /// Upper bound of the exponential backoff. Default 8 s.
    pub max_delay: Duration,
    /// Longest upstream-requested wait that is honoured; a longer
    /// `Retry-After` gives up at once. Default 30 s.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The default policy with `retries` retries (`retries + 1` attempts).
    pub fn with_max_retries(retries: u32) -> Self {
        Self {
            max_attempts: retries.saturating_add(1),
            ..Self::default()
        }
    }

    /// The backoff ceiling before retry number `retry` (from 1):
    /// `base_delay * 2^(retry-1)`, capped at `max_delay`.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_delay)
    }

    /// "Full jitter": a wait drawn uniformly from `[0, ceiling]`, with
    /// `fraction` in `[0, 1)`.
    fn jittered(&self, retry: u32, fraction: f64) -> Duration {
        self.backoff_ceiling(retry)
            .mul_f64(fraction.clamp(0.0, 1.0))
    }
}

/// A provider that retries `inner` under a [`RetryPolicy`].
pub struct RetryingProvider {
    inner: Arc<dyn ModelProvider>,
    policy: RetryPolicy,
}

impl fmt::Debug for RetryingProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryingProvider")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish()
    }
}

impl RetryingProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ModelProvider>, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }

    /// The policy in force.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// One attempt: the inner stream with its first item already read, or
    /// the error that ended the attempt before anything was forwarded.
    async fn attempt(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let mut stream = self.inner.stream(request).await?;
        match stream.next().await {
            // Nothing was forwarded yet, so the error may be retried. An
            // empty body (e.g. reset before any byte) counts as well.
            Some(Err(e)) if retry_first_item(&e) => Err(e),
            Some(first) => Ok(Box::pin(
                futures::stream::once(async move { first }).chain(stream),
            )),
            None => Ok(stream),
        }
    }
}

/// Whether an error that is a stream's first item may be retried.
fn retry_first_item(error: &ModelError) -> bool {
    error.is_retryable() || matches!(error.kind(), ModelError::Truncated(_))
}

#[async_trait]
impl ModelProvider for RetryingProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let max_attempts = self.policy.max_attempts.max(1);
        let mut attempt = 1u32;
        loop {
            let error = match self.attempt(request.clone()).await {
                Ok(stream) => return Ok(stream),
                Err(error) => error,
            };
            if attempt >= max_attempts || !retry_first_item(&error) {
                return Err(error.without_retry_after());
            }
            let wait = match error.retry_after() {
                Some(asked) if asked > self.policy.max_retry_after => {
                    tracing::warn!(
                        error = %error,
                        max_retry_after_ms = u64::try_from(self.policy.max_retry_after.as_millis()).unwrap_or(u64::MAX),
                        "model upstream asked to wait longer than allowed; giving up"
                    );
                    return Err(error.without_retry_after());
                }
                Some(asked) => asked,
                None => self.policy.jittered(attempt, random_fraction()),
            };
            tracing::warn!(
                error = %error,
                attempt,
                max_attempts,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "model step failed before any output; retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    fn serves(&self, model: &str) -> bool {
        self.inner.serves(model)
    }

    fn supports_tools(&self, model: &str) -> bool {
        self.inner.supports_tools(model)
    }

    fn media_support(&self, model: &str) -> crate::types::MediaSupport {
        self.inner.media_support(model)
    }

    fn has_capacity(&self, model: &str) -> bool {
        self.inner.has_capacity(model)
    }

    fn reserve(&self, model: &str) -> Result<Option<Reservation>, NoCapacity> {
        self.inner.reserve(model)
    }

    fn max_output_tokens_limit(&self, model: &str) -> Option<u32> {
        self.inner.max_output_tokens_limit(model)
    }

    fn max_step_output_bytes(&self, model: &str) -> usize {
        self.inner.max_step_output_bytes(model)
    }
}

/// For HTTP providers: the wait an error answer asks for, from
/// `retry-after-ms` (milliseconds, fractional allowed) or else `Retry-After`
/// (whole seconds, or an HTTP-date: the time until then, zero when past).
/// Attach it with [`ModelError::with_retry_after`].
pub fn retry_after_header(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

fn retry_after_at(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let ms = header("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok());
    ms.or_else(|| {
        let value = header("retry-after")?;
        match value.parse::<u64>() {
            Ok(secs) => Some(Duration::from_secs(secs)),
            Err(_) => httpdate::parse_http_date(value)
                .ok()
                .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO)),
        }
    })
}

/// A cheap uniform draw from `[0, 1)`: splitmix64 over the clock and a
/// counter. Only spreads retries out; nothing depends on its quality.
fn random_fraction() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_refusals_carry_the_retry_hint() {
        let error =
            ModelError::RateLimited("HTTP 429".into()).with_retry_after(Duration::from_secs(2));
        assert_eq!(error.retry_after(), Some(Duration::from_secs(2)));
        assert!(error.is_retryable());
        assert_eq!(
            error.public_message(),
            ModelError::RateLimited(String::new()).public_message()
        );
        let again = error.with_retry_after(Duration::from_secs(1));
        assert!(
            matches!(&again, ModelError::RetryAfter { error, .. } if matches!(**error, ModelError::RateLimited(_)))
        );
        assert!(matches!(
            again.without_retry_after(),
            ModelError::RateLimited(_)
        ));
        assert!(!ModelError::Rejected("x".into()).is_retryable());
        assert!(!ModelError::Truncated("x".into()).is_retryable());
        assert!(ModelError::Unavailable("x".into()).is_retryable());
    }

    #[test]
    fn retry_after_headers_are_parsed() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            // 07:27:30 GMT on the day of the HTTP-date below.
            retry_after_at(&map, UNIX_EPOCH + Duration::from_secs(1_445_412_450))
        };
        assert_eq!(headers(&[]), None);
        assert_eq!(
            headers(&[("retry-after", "3")]),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            headers(&[("retry-after-ms", "1500.5"), ("retry-after", "3")]),
            Some(Duration::from_micros(1_500_500))
        );
        assert_eq!(
            headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            headers(&[("retry-after", "Wed, 21 Oct 2015 07:00:00 GMT")]),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(headers(&[("retry-after", "soon")]), None);
        assert_eq!(headers(&[("retry-after-ms", "-1")]), None);
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff_ceiling(1), Duration::from_millis(250));
        assert_eq!(policy.backoff_ceiling(2), Duration::from_millis(500));
        assert_eq!(policy.backoff_ceiling(6), Duration::from_secs(8));
        assert_eq!(policy.backoff_ceiling(100), Duration::from_secs(8));
        assert_eq!(policy.jittered(2, 0.0), Duration::ZERO);
        assert_eq!(policy.jittered(2, 0.5), Duration::from_millis(250));
        for _ in 0..1000 {
            let f = random_fraction();
            assert!((0.0..1.0).contains(&f), "{f}");
        }
        assert_eq!(RetryPolicy::with_max_retries(2), RetryPolicy::default());
    }
}
