//! The `[[hooks]]` of the config as the runtime's [`Hooks`]: HTTP JSON
//! hooks use the core's transport, gRPC hooks the `agentrt.hooks.v1`
//! `HookService` client here (the core knows nothing of gRPC). The
//! conversions between the domain requests and decisions and the proto
//! messages live here too: they concern this transport only.

use std::sync::Arc;

use agentrt_proto::hooks::v1 as pb;
use agentrt_proto::hooks::v1::hook_service_client::HookServiceClient;
use agentrt_runtime::hooks::http::HttpHook;
use agentrt_runtime::hooks::{
    AfterStepRequest, AfterToolCallRequest, BeforeModelCallRequest, BeforeToolCallRequest,
    BeforeTurnRequest, Hook, HookClient, HookError, HookToolCall, Hooks, ModelCallDecision,
    ToolCallDecision, ToolResultDecision, TurnContext, TurnDecision,
};
use tonic::transport::{Channel, Endpoint};

use crate::config::{ConfigError, HookConfig, HookTransport};

/// Largest answer a gRPC hook may send.
const MAX_RESPONSE_BYTES: usize = 2 << 20;

/// The configured hooks, their bearer tokens read through `env`. Nothing
/// is connected yet: a hook that is down at start-up only fails its calls.
pub(crate) fn build(
    configs: &[HookConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Hooks, ConfigError> {
    let mut hooks = Vec::with_capacity(configs.len());
    for c in configs {
        let bearer = match &c.bearer_env {
            Some(var) => Some(env(var).ok_or_else(|| {
                ConfigError(format!(
                    "hook {:?}: environment variable {var} (bearer_env) is not set",
                    c.name
                ))
            })?),
            None => None,
        };
        let invalid = |why: String| ConfigError(format!("hook {:?}: {why}", c.name));
        let client: Arc<dyn HookClient> = match c.transport().map_err(invalid)? {
            HookTransport::Http(url) => {
                Arc::new(HttpHook::new(&url, bearer).map_err(|e| invalid(e.0))?)
            }
            HookTransport::Grpc(endpoint) => {
                Arc::new(GrpcHook::new(&endpoint, bearer).map_err(invalid)?)
            }
        };
        hooks.push(Hook {
            name: c.name.clone(),
            points: c.hook_points(),
            timeout: c.timeout,
            fail_open: c.fail_open,
            client,
        });
    }
    Ok(Hooks::new(hooks))
}

/// A hook reached as the gRPC `agentrt.hooks.v1.HookService`.
#[derive(Clone)]
pub(crate) struct GrpcHook {
    client: HookServiceClient<Channel>,
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl std::fmt::Debug for GrpcHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcHook")
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

impl GrpcHook {
    /// A client of the service at `endpoint` (`http://host:port`),
    /// connected on its first call (and again after a failure).
    fn new(endpoint: &str, bearer: Option<String>) -> Result<Self, String> {
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| format!("bad url: {e}"))?
            .connect_lazy();
        let authorization = bearer
            .map(|token| {
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| "the bearer token is not a valid header value".to_owned())
            })
            .transpose()?;
        Ok(Self {
            client: HookServiceClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES),
            authorization,
        })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }
}

/// A failed call, for the log (the status's code and message: the
/// operator's own service wrote them).
fn failed(status: tonic::Status) -> HookError {
    HookError(format!(
        "the hook answered {:?}: {}",
        status.code(),
        crate::clip::message(status.message().to_owned())
    ))
}

fn turn(t: &TurnContext) -> Option<pb::TurnContext> {
    Some(pb::TurnContext {
        session_id: t.session_id.clone(),
        user_id: t.user_id.clone(),
        agent_id: t.agent_id.clone(),
        turn_id: t.turn_id.clone(),
        model: t.model.clone(),
        hook_name: t.hook_name.clone(),
    })
}

fn tool_call(c: &HookToolCall) -> pb::ToolCall {
    pb::ToolCall {
        call_id: c.call_id.clone(),
        tool_name: c.tool_name.clone(),
        arguments_json: c.arguments_json.clone(),
    }
}

#[async_trait::async_trait]
impl HookClient for GrpcHook {
    async fn before_turn(&self, r: &BeforeTurnRequest) -> Result<TurnDecision, HookError> {
        use pb::before_turn_response::Decision;
        let answer = self
            .client
            .clone()
            .before_turn(self.request(pb::BeforeTurnRequest {
                turn: turn(&r.turn),
                user_text: r.user_text.clone(),
                system_prompt: r.system_prompt.clone(),
            }))
            .await
            .map_err(failed)?
            .into_inner();
        Ok(match answer.decision {
            Some(Decision::Refuse(refuse)) => TurnDecision::Refuse {
                reason: refuse.reason,
            },
            Some(Decision::Allow(allow)) => TurnDecision::Allow {
                system_prompt: allow.system_prompt,
            },
            None => TurnDecision::Allow {
                system_prompt: None,
            },
        })
    }

    async fn before_model_call(
        &self,
        r: &BeforeModelCallRequest,
    ) -> Result<ModelCallDecision, HookError> {
        use pb::before_model_call_response::Decision;
        let answer = self
            .client
            .clone()
            .before_model_call(self.request(pb::BeforeModelCallRequest {
                turn: turn(&r.turn),
                step: r.step,
                message_count: r.message_count,
                tool_names: r.tool_names.clone(),
            }))
            .await
            .map_err(failed)?
            .into_inner();
        Ok(match answer.decision {
            Some(Decision::Refuse(refuse)) => ModelCallDecision::Refuse {
                reason: refuse.reason,
            },
            Some(Decision::Allow(_)) | None => ModelCallDecision::Allow,
        })
    }

    async fn after_step(&self, r: &AfterStepRequest) -> Result<(), HookError> {
        self.client
            .clone()
            .after_step(self.request(pb::AfterStepRequest {
                turn: turn(&r.turn),
                step: r.step,
                stop_reason: r.stop_reason.clone(),
                text: r.text.clone(),
                tool_calls: r.tool_calls.iter().map(tool_call).collect(),
                usage: Some(pb::Usage {
                    input_tokens: r.usage.input_tokens,
                    cached_input_tokens: r.usage.cached_input_tokens,
                    output_tokens: r.usage.output_tokens,
                    reasoning_tokens: r.usage.reasoning_tokens,
                }),
            }))
            .await
            .map_err(failed)?;
        Ok(())
    }

    async fn before_tool_call(
        &self,
        r: &BeforeToolCallRequest,
    ) -> Result<ToolCallDecision, HookError> {
        use pb::before_tool_call_response::Decision;
        let answer = self
            .client
            .clone()
            .before_tool_call(self.request(pb::BeforeToolCallRequest {
                turn: turn(&r.turn),
                step: r.step,
                call: Some(tool_call(&r.call)),
            }))
            .await
            .map_err(failed)?
            .into_inner();
        Ok(match answer.decision {
            Some(Decision::Deny(deny)) => ToolCallDecision::Deny {
                reason: deny.reason,
            },
            Some(Decision::Rewrite(rewrite)) => ToolCallDecision::Rewrite {
                arguments_json: rewrite.arguments_json,
            },
            Some(Decision::Allow(_)) | None => ToolCallDecision::Allow,
        })
    }

    async fn after_tool_call(
        &self,
        r: &AfterToolCallRequest,
    ) -> Result<ToolResultDecision, HookError> {
        use pb::after_tool_call_response::Decision;
        let answer = self
            .client
            .clone()
            .after_tool_call(self.request(pb::AfterToolCallRequest {
                turn: turn(&r.turn),
                step: r.step,
                call: Some(tool_call(&r.call)),
                result: r.result.clone(),
                is_error: r.is_error,
            }))
            .await
            .map_err(failed)?
            .into_inner();
        Ok(match answer.decision {
            Some(Decision::Redact(redact)) => ToolResultDecision::Redact {
                replacement: redact.replacement,
            },
            Some(Decision::Keep(_)) | None => ToolResultDecision::Keep,
        })
    }
}
