//! The HTTP JSON transport of a hook: each call is a `POST <url>/<Rpc>`
//! (`BeforeTurn`, `BeforeModelCall`, ...) whose body is the request message
//! of `agentrt.hooks.v1` in the proto3 JSON mapping; the answer is a `200`
//! with the response message in the same mapping. A `decision` left unset
//! is the permissive answer. The request carries the hook's bearer token
//! when one is configured, and nothing else of the server's.

use futures::StreamExt as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{
    AfterStepRequest, AfterToolCallRequest, BeforeModelCallRequest, BeforeToolCallRequest,
    BeforeTurnRequest, HookClient, HookError, HookPoint, ModelCallDecision, ToolCallDecision,
    ToolResultDecision, TurnDecision,
};

/// Largest answer body read from a hook.
pub const MAX_RESPONSE_BYTES: usize = 2 << 20;

/// A hook reached over HTTP JSON.
#[derive(Clone)]
pub struct HttpHook {
    base: String,
    bearer: Option<String>,
    client: reqwest::Client,
}

impl std::fmt::Debug for HttpHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpHook")
            .field("url", &self.base)
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl HttpHook {
    /// A hook at `url` (`http://` or `https://`; the RPC's name is appended
    /// as a path segment), sending `bearer` as `Authorization: Bearer`.
    pub fn new(url: &str, bearer: Option<String>) -> Result<Self, HookError> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(HookError(
                "a hook's url must start with http:// or https://".to_owned(),
            ));
        }
        let client = reqwest::Client::builder()
            // Redirects could carry the bearer token elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| HookError(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            base: url.trim_end_matches('/').to_owned(),
            bearer,
            client,
        })
    }

    async fn post<Req: serde::Serialize + Sync, Resp: DeserializeOwned>(
        &self,
        point: HookPoint,
        request: &Req,
    ) -> Result<Resp, HookError> {
        let mut call = self
            .client
            .post(format!("{}/{}", self.base, point.rpc()))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(token) = &self.bearer {
            call = call.bearer_auth(token);
        }
        let body = serde_json::to_vec(request)
            .map_err(|e| HookError(format!("cannot encode the request: {e}")))?;
        let response = call
            .body(body)
            .send()
            .await
            .map_err(|e| HookError(format!("the hook could not be reached: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(HookError(format!("the hook answered HTTP {status}")));
        }
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| HookError(format!("reading the answer failed: {e}")))?;
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(HookError(format!(
                    "the answer is larger than {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            body = b"{}".to_vec();
        }
        serde_json::from_slice(&body)
            .map_err(|e| HookError(format!("the answer is not the expected JSON: {e}")))
    }
}

/// `{"reason": ...}` of a refusal or denial.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Reason {
    reason: String,
}

/// An empty message (`Allow`, `Keep`).
#[derive(Debug, Default, Deserialize)]
struct Empty {}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TurnAllow {
    #[serde(alias = "system_prompt", rename = "systemPrompt")]
    system_prompt: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BeforeTurnResponse {
    allow: Option<TurnAllow>,
    refuse: Option<Reason>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BeforeModelCallResponse {
    allow: Option<Empty>,
    refuse: Option<Reason>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Rewrite {
    #[serde(alias = "arguments_json", rename = "argumentsJson")]
    arguments_json: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BeforeToolCallResponse {
    allow: Option<Empty>,
    deny: Option<Reason>,
    rewrite: Option<Rewrite>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Redact {
    replacement: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AfterToolCallResponse {
    keep: Option<Empty>,
    redact: Option<Redact>,
}

/// A oneof holds at most one member.
fn one_of(set: usize) -> Result<(), HookError> {
    if set > 1 {
        Err(HookError(
            "the answer sets more than one member of `decision`".to_owned(),
        ))
    } else {
        Ok(())
    }
}

#[async_trait::async_trait]
impl HookClient for HttpHook {
    async fn before_turn(&self, request: &BeforeTurnRequest) -> Result<TurnDecision, HookError> {
        let r: BeforeTurnResponse = self.post(HookPoint::BeforeTurn, request).await?;
        one_of(usize::from(r.allow.is_some()) + usize::from(r.refuse.is_some()))?;
        Ok(match (r.allow, r.refuse) {
            (_, Some(refuse)) => TurnDecision::Refuse {
                reason: refuse.reason,
            },
            (allow, None) => TurnDecision::Allow {
                system_prompt: allow.and_then(|a| a.system_prompt),
            },
        })
    }

    async fn before_model_call(
        &self,
        request: &BeforeModelCallRequest,
    ) -> Result<ModelCallDecision, HookError> {
        let r: BeforeModelCallResponse = self.post(HookPoint::BeforeModelCall, request).await?;
        one_of(usize::from(r.allow.is_some()) + usize::from(r.refuse.is_some()))?;
        Ok(match r.refuse {
            Some(refuse) => ModelCallDecision::Refuse {
                reason: refuse.reason,
            },
            None => ModelCallDecision::Allow,
        })
    }

    async fn after_step(&self, request: &AfterStepRequest) -> Result<(), HookError> {
        let _: Empty = self.post(HookPoint::AfterStep, request).await?;
        Ok(())
    }

    async fn before_tool_call(
        &self,
        request: &BeforeToolCallRequest,
    ) -> Result<ToolCallDecision, HookError> {
        let r: BeforeToolCallResponse = self.post(HookPoint::BeforeToolCall, request).await?;
        one_of(
            usize::from(r.allow.is_some())
                + usize::from(r.deny.is_some())
                + usize::from(r.rewrite.is_some()),
        )?;
        Ok(match (r.deny, r.rewrite) {
            (Some(deny), _) => ToolCallDecision::Deny {
                reason: deny.reason,
            },
            (None, Some(rewrite)) => ToolCallDecision::Rewrite {
                arguments_json: rewrite.arguments_json,
            },
            (None, None) => ToolCallDecision::Allow,
        })
    }

    async fn after_tool_call(
        &self,
        request: &AfterToolCallRequest,
    ) -> Result<ToolResultDecision, HookError> {
        let r: AfterToolCallResponse = self.post(HookPoint::AfterToolCall, request).await?;
        one_of(usize::from(r.keep.is_some()) + usize::from(r.redact.is_some()))?;
        Ok(match r.redact {
            Some(redact) => ToolResultDecision::Redact {
                replacement: redact.replacement,
            },
            None => ToolResultDecision::Keep,
        })
    }
}
