//! Traces and metrics of the core, through the OpenTelemetry *API* only
//! (no SDK, no exporter, no tonic): the server installs the providers, and
//! until it does every instrument here is a no-op and every span context
//! is empty, so a core used without telemetry pays an atomic load per
//! measurement and nothing else.
//!
//! - [`semconv`]: the attribute and span names of the semantic
//!   conventions we emit, in one place (the constants crate lags the
//!   current RPC and GenAI names).
//! - [`metrics`]: the instruments, created once from the global meter.
//! - [`inject_trace_context`]: the W3C `traceparent` of the current span,
//!   for the provider's outgoing HTTP request.

pub mod metrics;

use opentelemetry::propagation::Injector;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Attribute, span and metric names, per the OpenTelemetry semantic
/// conventions (RPC 1.44 release candidate, GenAI development status).
pub mod semconv {
    /// `rpc.system.name`: always `grpc` here.
    pub const RPC_SYSTEM_NAME: &str = "rpc.system.name";
    /// `rpc.method`: fully qualified (`pkg.Service/Method`), or `_OTHER`.
    pub const RPC_METHOD: &str = "rpc.method";
    /// `rpc.response.status_code`: the gRPC status code's name (`OK`,
    /// `ABORTED`); Prometheus shows it as `rpc_response_status_code`.
    pub const RPC_RESPONSE_STATUS_CODE: &str = "rpc.response.status_code";
    /// The method value for methods we do not serve.
    pub const RPC_METHOD_OTHER: &str = "_OTHER";
    /// `error.type`.
    pub const ERROR_TYPE: &str = "error.type";

    /// `gen_ai.operation.name`.
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    /// `gen_ai.provider.name`.
    pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
    /// `gen_ai.request.model`.
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    /// `gen_ai.conversation.id`: the session id (spans only, never a label).
    pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
    /// `gen_ai.agent.id`.
    pub const GEN_AI_AGENT_ID: &str = "gen_ai.agent.id";
    /// `gen_ai.response.finish_reasons`.
    pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// `gen_ai.response.time_to_first_chunk` (seconds).
    pub const GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
    /// `gen_ai.usage.input_tokens`.
    pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// `gen_ai.usage.output_tokens`.
    pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// `gen_ai.token.type` (`input`, `output`): a metric label.
    pub const GEN_AI_TOKEN_TYPE: &str = "gen_ai.token.type";
    /// `gen_ai.tool.name`.
    pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
    /// `gen_ai.tool.call.id`.
    pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    /// `gen_ai.tool.type`.
    pub const GEN_AI_TOOL_TYPE: &str = "gen_ai.tool.type";
    /// `gen_ai.output.messages` (opt-in content capture only).
    pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    /// `gen_ai.tool.call.arguments` (opt-in content capture only).
    pub const GEN_AI_TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";

    /// Operation `invoke_agent`: one turn.
    pub const OP_INVOKE_AGENT: &str = "invoke_agent";
    /// Operation `chat`: one model step.
    pub const OP_CHAT: &str = "chat";
    /// Operation `execute_tool`: one tool call.
    pub const OP_EXECUTE_TOOL: &str = "execute_tool";

    /// Our own: a turn's outcome (`success`, `error`, `canceled`, `timed_out`).
    pub const AGENTRT_TURN_OUTCOME: &str = "agentrt.turn.outcome";
    /// Our own: why a call was refused (`SESSION_BUSY`, `QUOTA`, `DRAINING`…),
    /// or why a turn was interrupted (`restart`, `lease_expired`, `lease_lost`).
    pub const AGENTRT_REASON: &str = "agentrt.reason";

    /// `db.client.connection.state` (`idle`, `used`).
    pub const DB_CLIENT_CONNECTION_STATE: &str = "db.client.connection.state";
    /// `db.client.connection.pool.name`.
    pub const DB_CLIENT_CONNECTION_POOL_NAME: &str = "db.client.connection.pool.name";
}

/// Writes the current span's W3C trace context (`traceparent`,
/// `tracestate`) into `headers`, through the globally installed
/// propagator. Without telemetry the propagator is a no-op and the span
/// context is invalid: nothing is written.
pub fn inject_trace_context(headers: &mut reqwest::header::HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers));
    });
}

struct HeaderInjector<'a>(&'a mut reqwest::header::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(key.as_bytes()),
            reqwest::header::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
