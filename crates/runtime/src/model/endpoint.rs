//! The settings every HTTP model provider shares, and what they become once
//! validated: one copy for the OpenAI-compatible and the Anthropic
//! provider, which differ only in their wire format and in how they send
//! the key.
//!
//! [`EndpointConfig`] is what a caller fills in (the server from a
//! `[[providers]]` entry): where the API is, the key, the timeouts, which
//! models it serves, how much a step may generate. A provider validates it
//! into an `Endpoint` (crate-internal) — the URL of its one operation, the
//! HTTP client, the key as a ready header — and sends every request
//! through that.

use std::fmt;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue};

use super::http::{self, SseDecoder};
use super::{ModelError, ModelStream, OutputLimits};
use crate::types::MediaSupport;

/// Settings of one HTTP model endpoint (OpenAI-compatible or Anthropic).
#[derive(Clone)]
pub struct EndpointConfig {
    /// The API root, e.g. `http://127.0.0.1:8080/v1` or
    /// `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// The API key, sent the way the provider's API wants it; empty counts
    /// as none.
    pub api_key: Option<String>,
    /// Model names served; `None` serves any name.
    pub models: Option<Vec<String>>,
    /// Bound on establishing the TCP/TLS connection. Default 10 s.
    pub connect_timeout: Duration,
    /// Longest silence allowed while waiting for headers or between
    /// chunks. Default 60 s.
    pub idle_timeout: Duration,
    /// How much a step may generate. Default [`OutputLimits::default`]
    /// (`max_tokens` 4096).
    pub limits: OutputLimits,
    /// What its models read besides text: `None` for the provider's
    /// default (images; PDFs too on Anthropic).
    pub reads: Option<MediaReads>,
}

/// What an endpoint's models read besides text: one setting for all, and
/// per-model exceptions (model names without the provider prefix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MediaReads {
    /// For models not listed.
    pub default: MediaSupport,
    /// Per model.
    pub models: std::collections::BTreeMap<String, MediaSupport>,
}

impl MediaReads {
    /// Every model reads what `support` says.
    pub fn all(support: MediaSupport) -> Self {
        Self {
            default: support,
            models: std::collections::BTreeMap::new(),
        }
    }

    /// What `model` reads.
    pub fn of(&self, model: &str) -> MediaSupport {
        self.models.get(model).copied().unwrap_or(self.default)
    }
}

impl EndpointConfig {
    /// `base_url` with no key, no allow-list, a 10 s connect timeout, a
    /// 60 s idle timeout and the default [`OutputLimits`] (`max_tokens`
    /// 4096).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            models: None,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            limits: OutputLimits::default(),
            reads: None,
        }
    }
}

impl fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("limits", &self.limits)
            .field("reads", &self.reads)
            .finish()
    }
}

/// Why an [`EndpointConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// `base_url` is not an http(s) URL without query or fragment.
    #[error("invalid model base_url {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The configured value.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key contains bytes that cannot appear in an HTTP header.
    #[error("the model api_key cannot be sent in an HTTP header")]
    InvalidApiKey,
    /// A zero timeout would fail every request.
    #[error("model timeouts must be greater than zero")]
    ZeroTimeout,
    /// The output limits are inconsistent (e.g. a `max_tokens` of zero).
    #[error("{0}")]
    Limits(String),
    /// The HTTP client could not be built (e.g. no TLS roots).
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

/// A validated endpoint: everything a provider needs per request.
pub(crate) struct Endpoint {
    client: reqwest::Client,
    url: reqwest::Url,
    key: Option<(HeaderName, HeaderValue)>,
    models: Option<Vec<String>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    limits: OutputLimits,
    reads: Option<MediaReads>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url.as_str())
            .field("api_key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("idle_timeout", &self.idle_timeout)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Validates `config` for the operation at `path` below its base URL.
    /// A key is sent as header `key_header` with the value `key_value`
    /// makes of it (marked sensitive, so it is never logged).
    pub(crate) fn new(
        config: EndpointConfig,
        path: &str,
        key_header: HeaderName,
        key_value: impl FnOnce(&str) -> String,
    ) -> Result<Self, EndpointError> {
        let url = http::endpoint(&config.base_url, path).map_err(|reason| {
            EndpointError::InvalidBaseUrl {
                url: config.base_url.clone(),
                reason,
            }
        })?;
        if config.connect_timeout.is_zero() || config.idle_timeout.is_zero() {
            return Err(EndpointError::ZeroTimeout);
        }
        config.limits.check().map_err(EndpointError::Limits)?;
        let key = match config.api_key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => {
                let mut value = HeaderValue::from_str(&key_value(key))
                    .map_err(|_| EndpointError::InvalidApiKey)?;
                value.set_sensitive(true);
                Some((key_header, value))
            }
            None => None,
        };
        let client = http::client(&url, config.connect_timeout).map_err(EndpointError::Client)?;
        Ok(Self {
            client,
            url,
            key,
            models: config.models,
            connect_timeout: config.connect_timeout,
            idle_timeout: config.idle_timeout,
            limits: config.limits,
            reads: config.reads,
        })
    }

    /// What `model` reads besides text; `default` when not configured.
    pub(crate) fn reads(&self, model: &str, default: MediaSupport) -> MediaSupport {
        self.reads.as_ref().map_or(default, |r| r.of(model))
    }

    /// The operation's URL.
    pub(crate) fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// How much a step may generate.
    pub(crate) fn limits(&self) -> &OutputLimits {
        &self.limits
    }

    /// Whether `model` is served (any name without an allow-list).
    pub(crate) fn serves(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model))
    }

    /// A streaming `POST` of the JSON `body`, with the key and the current
    /// span's trace context; the provider adds its own headers.
    pub(crate) fn post(&self, body: Vec<u8>) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body);
        if let Some((name, value)) = &self.key {
            request = request.header(name.clone(), value.clone());
        }
        // The `chat` span's W3C context, so the provider's side of the
        // call joins the trace (nothing is added without telemetry).
        let mut trace = reqwest::header::HeaderMap::new();
        crate::telemetry::inject_trace_context(&mut trace);
        if !trace.is_empty() {
            request = request.headers(trace);
        }
        request
    }

    /// Sends `request` and streams its answer through `decoder`, both
    /// bounded by the endpoint's timeouts.
    pub(crate) async fn stream<D: SseDecoder>(
        &self,
        request: reqwest::RequestBuilder,
        decoder: D,
    ) -> Result<ModelStream, ModelError> {
        let response =
            http::send_for_stream(request, self.connect_timeout, self.idle_timeout).await?;
        Ok(http::sse_stream(response, self.idle_timeout, decoder))
    }
}
