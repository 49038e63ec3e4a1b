//! Conversions between the protobuf messages and the runtime's domain types.
//! Decoding checks what protobuf cannot express (a missing oneof, an unknown
//! enum value) and reports it as an invalid argument naming the field.
//!
//! Every enum is converted arm by arm, with no `_ =>` (the lint below): a
//! new variant on either side must be mapped, not silently folded into
//! another. A protobuf enum arrives as an `i32`; it is matched through its
//! `TryFrom`, the unknown value being its own arm.

#![deny(clippy::wildcard_enum_match_arm)]

mod provenance;

use std::time::{SystemTime, UNIX_EPOCH};

use agentrt_proto::v1 as pb;
use agentrt_runtime::ChatInput;
use agentrt_runtime::RuntimeError;
use agentrt_runtime::events::{
    CompactionStatus, ErrorCode, EventKind, Reference, StepKind, ToolStatus, TurnEvent, TurnOutcome,
};
use agentrt_runtime::runtime::{OnBusy, OnDisconnect};
use agentrt_runtime::types::{
    Budget, CancelReason, ContentBlock, Interrupted, LastTurn, MediaKind, MediaRef, Message,
    NewSession, Role, Session, SessionUpdate, ThinkingLevel, TurnRecord, TurnStatus, Usage, Wait,
};

mod admin;
mod agents;
pub use admin::replica_list;
pub use agents::{agent_spec, agent_to_pb, memory_edits, memory_to_pb};

/// A protobuf timestamp.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf duration.
pub fn duration(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn usage(u: &Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        reasoning_tokens: u.reasoning_tokens,
        cached_input_tokens: u.cached_input_tokens,
    }
}

fn role(r: Role) -> pb::Role {
    match r {
        Role::User => pb::Role::User,
        Role::Assistant => pb::Role::Assistant,
        Role::Tool => pb::Role::Tool,
        Role::Summary => pb::Role::Summary,
        Role::Notice => pb::Role::Notice,
    }
}

fn turn_outcome(s: TurnStatus) -> pb::TurnOutcome {
    match s {
        TurnStatus::Running => pb::TurnOutcome::Running,
        TurnStatus::Success => pb::TurnOutcome::Success,
        TurnStatus::Error => pb::TurnOutcome::Error,
        TurnStatus::Canceled => pb::TurnOutcome::Canceled,
        TurnStatus::TimedOut => pb::TurnOutcome::TimedOut,
        TurnStatus::Interrupted => pb::TurnOutcome::Interrupted,
        TurnStatus::BudgetExceeded => pb::TurnOutcome::BudgetExceeded,
        TurnStatus::Paused => pb::TurnOutcome::Paused,
    }
}

pub(crate) fn thinking(t: Option<ThinkingLevel>) -> pb::ThinkingLevel {
    match t {
        None => pb::ThinkingLevel::Unspecified,
        Some(ThinkingLevel::None) => pb::ThinkingLevel::None,
        Some(ThinkingLevel::Minimal) => pb::ThinkingLevel::Minimal,
        Some(ThinkingLevel::Low) => pb::ThinkingLevel::Low,
        Some(ThinkingLevel::Medium) => pb::ThinkingLevel::Medium,
        Some(ThinkingLevel::High) => pb::ThinkingLevel::High,
        Some(ThinkingLevel::XHigh) => pb::ThinkingLevel::Xhigh,
    }
}

/// Decodes a thinking level; `Unspecified` means "inherit".
pub fn thinking_from_pb(value: i32, field: &str) -> Result<Option<ThinkingLevel>, RuntimeError> {
    let level = pb::ThinkingLevel::try_from(value)
        .map_err(|_| RuntimeError::invalid(field, format!("unknown thinking level {value}")))?;
    Ok(match level {
        pb::ThinkingLevel::Unspecified => None,
        pb::ThinkingLevel::None => Some(ThinkingLevel::None),
        pb::ThinkingLevel::Minimal => Some(ThinkingLevel::Minimal),
        pb::ThinkingLevel::Low => Some(ThinkingLevel::Low),
        pb::ThinkingLevel::Medium => Some(ThinkingLevel::Medium),
        pb::ThinkingLevel::High => Some(ThinkingLevel::High),
        pb::ThinkingLevel::Xhigh => Some(ThinkingLevel::XHigh),
    })
}

fn block_to_pb(b: ContentBlock) -> pb::ContentBlock {
    use pb::content_block::Block;
    let block = match b {
        ContentBlock::Text { text } => Block::Text(pb::TextBlock { text }),
        ContentBlock::Thinking {
            thinking,
            signature,
        } => Block::Thinking(pb::ThinkingBlock {
            thinking,
            signature,
        }),
        ContentBlock::Image { data, mime_type } => Block::Image(pb::ImageBlock {
            size: data.len() as u64,
            data,
            mime_type,
            ..pb::ImageBlock::default()
        }),
        ContentBlock::File {
            data,
            mime_type,
            name,
        } => Block::File(pb::FileBlock {
            size: data.len() as u64,
            data,
            mime_type,
            name,
            ..pb::FileBlock::default()
        }),
        ContentBlock::Media(m) => match m.kind {
            MediaKind::Image => Block::Image(pb::ImageBlock {
                data: Vec::new(),
                mime_type: m.mime_type,
                blob_id: m.blob_id,
                size: m.size,
                name: m.name,
            }),
            MediaKind::File => Block::File(pb::FileBlock {
                data: Vec::new(),
                mime_type: m.mime_type,
                name: m.name,
                blob_id: m.blob_id,
                size: m.size,
            }),
        },
        ContentBlock::ToolCall {
            id,
            name,
            arguments_json,
        } => Block::ToolCall(pb::ToolCallBlock {
            id,
            name,
            arguments_json,
        }),
        ContentBlock::ToolResult {
            call_id,
            name,
            content,
            is_error,
            interrupted,
            media,
        } => Block::ToolResult(pb::ToolResultBlock {
            call_id,
            name,
            content,
            is_error,
            media: media.into_iter().map(blob_ref).collect(),
            interrupted: match interrupted {
                None => pb::ToolCallInterrupted::Unspecified,
                Some(Interrupted::Cancelled) => pb::ToolCallInterrupted::Cancelled,
                Some(Interrupted::OutcomeUnknown) => pb::ToolCallInterrupted::OutcomeUnknown,
            }
            .into(),
        }),
    };
    pb::ContentBlock { block: Some(block) }
}

/// A blob reference.
pub fn blob_ref(m: MediaRef) -> pb::BlobRef {
    pb::BlobRef {
        blob_id: m.blob_id,
        kind: match m.kind {
            MediaKind::Image => pb::MediaKind::Image,
            MediaKind::File => pb::MediaKind::File,
        }
        .into(),
        mime_type: m.mime_type,
        size: m.size,
        name: m.name,
    }
}

/// A request's image or file: its bytes inline, or a reference to a blob
/// uploaded to the session (`blob_id`; the server fills in the rest).
fn media_from_pb(
    kind: MediaKind,
    (data, mime_type, name, blob_id): (Vec<u8>, String, String, String),
) -> ContentBlock {
    if !blob_id.is_empty() {
        return ContentBlock::Media(MediaRef {
            kind,
            blob_id,
            mime_type,
            size: 0,
            name,
        });
    }
    match kind {
        // An inline image has no name in history (it is a blob's).
        MediaKind::Image => ContentBlock::Image { data, mime_type },
        MediaKind::File => ContentBlock::File {
            data,
            mime_type,
            name,
        },
    }
}

/// Decodes content blocks; an empty oneof is an invalid argument.
pub fn content_from_pb(
    blocks: Vec<pb::ContentBlock>,
    field: &str,
) -> Result<Vec<ContentBlock>, RuntimeError> {
    use pb::content_block::Block;
    // Before converting anything: a small request of many empty blocks
    // must not cost a large vector.
    agentrt_runtime::limits::check_block_count(field, blocks.len())?;
    blocks
        .into_iter()
        .enumerate()
        .map(|(i, b)| match b.block {
            Some(Block::Text(t)) => Ok(ContentBlock::Text { text: t.text }),
            Some(Block::Image(img)) => Ok(media_from_pb(
                MediaKind::Image,
                (img.data, img.mime_type, img.name, img.blob_id),
            )),
            Some(Block::File(f)) => Ok(media_from_pb(
                MediaKind::File,
                (f.data, f.mime_type, f.name, f.blob_id),
            )),
            Some(Block::Thinking(t)) => Ok(ContentBlock::Thinking {
                thinking: t.thinking,
                signature: t.signature,
            }),
            Some(Block::ToolCall(c)) => Ok(ContentBlock::ToolCall {
                id: c.id,
                name: c.name,
                arguments_json: c.arguments_json,
            }),
            // Only the server records an interruption.
            Some(Block::ToolResult(r)) => Ok(ContentBlock::ToolResult {
                call_id: r.call_id,
                name: r.name,
                content: r.content,
                is_error: r.is_error,
                interrupted: None,
                media: Vec::new(),
            }),
            None => Err(RuntimeError::invalid(
                format!("{field}[{i}]"),
                "content block has no kind set (text, image, ...)",
            )),
        })
        .collect()
}

fn reference(r: &Reference) -> pb::Reference {
    match r {
        Reference::Blob { blob, intent } => pb::Reference {
            kind: "blob".to_owned(),
            id: blob.blob_id.clone(),
            title: blob.name.clone(),
            mime_type: blob.mime_type.clone(),
            intent: (*intent).to_owned(),
            ..pb::Reference::default()
        },
        Reference::Uri {
            uri,
            title,
            preview,
            mime_type,
        } => pb::Reference {
            kind: "uri".to_owned(),
            uri: uri.clone(),
            title: title.clone(),
            preview: preview.clone(),
            mime_type: mime_type.clone(),
            intent: "result".to_owned(),
            ..pb::Reference::default()
        },
    }
}

/// A stored message.
pub fn message_to_pb(m: Message) -> pb::Message {
    let body = m.body;
    pb::Message {
        seq: m.seq,
        id: body.id,
        turn_id: body.turn_id,
        role: role(body.role).into(),
        content: body.content.into_iter().map(block_to_pb).collect(),
        model: body.model.unwrap_or_default(),
        usage: body.usage.as_ref().map(usage),
        stop_reason: body
            .stop_reason
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        created_at: Some(timestamp(body.created_at)),
        compacted: m.compacted,
        speaker: body.speaker.map(provenance::speaker_to_pb),
        input_actor: body.input_actor.map(provenance::actor_to_pb),
    }
}

fn last_turn(t: LastTurn) -> pb::LastTurn {
    pb::LastTurn {
        turn_id: t.turn_id,
        outcome: turn_outcome(t.status).into(),
        started_at: Some(timestamp(t.started_at)),
        finished_at: t.finished_at.map(timestamp),
    }
}

/// What one user's sessions spent.
pub fn user_usage(user_id: String, u: agentrt_runtime::runtime::UserUsage) -> pb::UserUsage {
    pb::UserUsage {
        user_id,
        sessions: u.sessions,
        usage: Some(usage(&u.spent.usage)),
        cost: agentrt_runtime::prices::usd(u.spent.cost_nano_usd),
    }
}

/// A turn record.
pub fn turn_to_pb(t: TurnRecord) -> pb::Turn {
    pb::Turn {
        turn_id: t.turn_id,
        request_id: t.request_id.unwrap_or_default(),
        outcome: turn_outcome(t.status).into(),
        cancel_reason: t
            .cancel_reason
            .map(cancel_reason_name)
            .unwrap_or_default()
            .to_owned(),
        user_message_seq: t.user_message_seq,
        started_at: Some(timestamp(t.started_at)),
        finished_at: t.finished_at.map(timestamp),
        model: t.model,
        thinking: thinking(t.thinking).into(),
        steps: t.steps,
        usage: Some(usage(&t.usage)),
        cost: t.cost_nano_usd.map(agentrt_runtime::prices::usd),
        error: t.error.unwrap_or_default(),
    }
}

/// A session.
pub fn session_to_pb(s: Session) -> pb::Session {
    pb::Session {
        session_id: s.id,
        owner: s.owner,
        agent_id: s.agent_id,
        project_id: s.project_id,
        title: s.title,
        model: s.model,
        system_prompt: s.system_prompt,
        metadata: s.metadata.into_iter().collect(),
        created_at: Some(timestamp(s.created_at)),
        last_active_at: Some(timestamp(s.last_active_at)),
        archived: s.archived,
        last_turn: s.last_turn.map(last_turn),
        message_count: s.message_count,
        budget: Some(budget_to_pb(s.budget)),
        spent_usage: Some(usage(&s.spent.usage)),
        spent_cost: agentrt_runtime::prices::usd(s.spent.cost_nano_usd),
        agent_version: s.agent.version,
        parent_session_id: s.agent.parent_session_id,
        refresh_memory: s.agent.refresh_memory,
    }
}

/// CreateSession fields (the owner is set by the runtime).
pub fn new_session(r: pb::CreateSessionRequest) -> Result<NewSession, RuntimeError> {
    Ok(NewSession {
        id: (!r.session_id.is_empty()).then_some(r.session_id),
        owner: String::new(),
        agent_id: r.agent_id,
        project_id: r.project_id,
        title: r.title,
        model: r.model,
        system_prompt: r.system_prompt,
        metadata: r.metadata.into_iter().collect(),
        budget: r
            .budget
            .map(budget_from_pb)
            .transpose()?
            .unwrap_or_default(),
        agent: agentrt_runtime::agents::AgentBinding {
            version: r.agent_version,
            follow_latest: r.follow_latest_agent,
            refresh_memory: r.refresh_memory,
            ..Default::default()
        },
    })
}

/// UpdateSession fields.
pub fn session_update(r: pb::UpdateSessionRequest) -> Result<SessionUpdate, RuntimeError> {
    Ok(SessionUpdate {
        title: r.title,
        model: r.model,
        system_prompt: r.system_prompt,
        metadata: r.metadata.map(|m| m.entries.into_iter().collect()),
        archived: r.archived,
        budget: r.budget.map(budget_from_pb).transpose()?,
        agent_version: r.agent_version,
        refresh_memory: r.refresh_memory,
        memory_snapshot: None,
    })
}

/// A budget; a cost that is not a number of dollars ≥ 0 is refused.
pub(crate) fn budget_from_pb(b: pb::Budget) -> Result<Budget, RuntimeError> {
    let max_cost_nano_usd = b
        .max_cost
        .map(|usd| {
            agentrt_runtime::prices::nano_usd(usd).ok_or_else(|| {
                RuntimeError::invalid(
                    "budget.max_cost",
                    format!("{usd} is not a cost (US dollars, 0 or more, below 10^10)"),
                )
            })
        })
        .transpose()?;
    Ok(Budget {
        max_tokens: b.max_tokens,
        max_cost_nano_usd,
    })
}

pub(crate) fn budget_to_pb(b: Budget) -> pb::Budget {
    pb::Budget {
        max_tokens: b.max_tokens,
        max_cost: b.max_cost_nano_usd.map(agentrt_runtime::prices::usd),
    }
}

/// A positive protobuf duration; `None` when absent.
pub fn duration_from_pb(
    d: Option<prost_types::Duration>,
    field: &str,
) -> Result<Option<std::time::Duration>, RuntimeError> {
    d.map(|d| {
        std::time::Duration::try_from(d)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| RuntimeError::invalid(field, "must be a positive duration"))
    })
    .transpose()
}

/// A Chat request; `transport_deadline` is the time left of the gRPC
/// deadline, which also bounds the turn.
pub fn chat_input(
    r: pb::ChatRequest,
    transport_deadline: Option<std::time::Duration>,
) -> Result<ChatInput, RuntimeError> {
    let timeout = duration_from_pb(r.timeout, "timeout")?;
    let on_disconnect = match pb::OnDisconnect::try_from(r.on_disconnect) {
        Ok(pb::OnDisconnect::Unspecified | pb::OnDisconnect::Cancel) => OnDisconnect::Cancel,
        Ok(pb::OnDisconnect::Continue) => OnDisconnect::Continue,
        Err(_) => {
            return Err(RuntimeError::invalid(
                "on_disconnect",
                format!("unknown value {}", r.on_disconnect),
            ));
        }
    };
    let on_busy = match pb::OnBusy::try_from(r.on_busy) {
        Ok(pb::OnBusy::Unspecified | pb::OnBusy::Reject) => OnBusy::Reject,
        Ok(pb::OnBusy::Enqueue) => OnBusy::Enqueue,
        Ok(pb::OnBusy::Interrupt) => OnBusy::Interrupt,
        Ok(pb::OnBusy::Steer) => OnBusy::Steer,
        Err(_) => {
            return Err(RuntimeError::invalid(
                "on_busy",
                format!(
                    "unknown value {}; use ON_BUSY_REJECT, ON_BUSY_ENQUEUE, ON_BUSY_INTERRUPT or ON_BUSY_STEER",
                    r.on_busy
                ),
            ));
        }
    };
    // Sizes first: a request may make us parse only a bounded amount of JSON.
    let schemas: Vec<&str> = r
        .extra_tools
        .iter()
        .map(|t| t.parameters_json_schema.as_str())
        .collect();
    agentrt_runtime::limits::check_tool_schemas(&schemas)?;
    let extra_tools = r
        .extra_tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let parameters = if t.parameters_json_schema.trim().is_empty() {
                serde_json::json!({"type": "object", "properties": {}})
            } else {
                serde_json::from_str(&t.parameters_json_schema).map_err(|e| {
                    RuntimeError::invalid(
                        format!("extra_tools[{i}].parameters_json_schema"),
                        format!("is not valid JSON: {e}"),
                    )
                })?
            };
            Ok(agentrt_runtime::model::ToolSpec {
                name: t.name,
                description: t.description,
                parameters,
            })
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    Ok(ChatInput {
        extra_tools,
        excluded_tools: r.excluded_tools,
        max_steps: r.max_steps,
        max_output_tokens: r.max_output_tokens,
        thinking: thinking_from_pb(r.thinking, "thinking")?,
        content: content_from_pb(r.content, "content")?,
        session_id: r.session_id,
        model: (!r.model.is_empty()).then_some(r.model),
        system_override: r.system_override,
        timeout,
        transport_deadline,
        on_disconnect,
        request_id: (!r.request_id.is_empty()).then_some(r.request_id),
        on_busy,
        require_approval: r.require_approval,
        speaker: provenance::speaker_from_pb(r.speaker),
    })
}

/// The time left of a request's gRPC deadline (`grpc-timeout` header).
pub fn grpc_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    })
}

fn error_code(c: ErrorCode) -> pb::ErrorCode {
    match c {
        ErrorCode::Cancelled => pb::ErrorCode::Cancelled,
        ErrorCode::InvalidArgument => pb::ErrorCode::InvalidArgument,
        ErrorCode::DeadlineExceeded => pb::ErrorCode::DeadlineExceeded,
        ErrorCode::ResourceExhausted => pb::ErrorCode::ResourceExhausted,
        ErrorCode::FailedPrecondition => pb::ErrorCode::FailedPrecondition,
        ErrorCode::Internal => pb::ErrorCode::Internal,
        ErrorCode::Unavailable => pb::ErrorCode::Unavailable,
        ErrorCode::PermissionDenied => pb::ErrorCode::PermissionDenied,
    }
}

fn outcome(o: TurnOutcome) -> pb::TurnOutcome {
    match o {
        TurnOutcome::Success => pb::TurnOutcome::Success,
        TurnOutcome::Error => pb::TurnOutcome::Error,
        TurnOutcome::Canceled => pb::TurnOutcome::Canceled,
        TurnOutcome::TimedOut => pb::TurnOutcome::TimedOut,
        TurnOutcome::BudgetExceeded => pb::TurnOutcome::BudgetExceeded,
    }
}

/// The name of a cancel reason in a `Turn` record (the enum's value
/// names, lower case, as `Message.stop_reason` spells its values).
fn cancel_reason_name(r: CancelReason) -> &'static str {
    match r {
        CancelReason::Stopped => "stopped",
        CancelReason::ClientGone => "client_gone",
        CancelReason::Shutdown => "shutdown",
        CancelReason::SessionDeleted => "session_deleted",
        CancelReason::Interrupted => "interrupted",
    }
}

fn cancel_reason(r: Option<CancelReason>) -> pb::CancelReason {
    match r {
        None => pb::CancelReason::Unspecified,
        Some(CancelReason::Stopped) => pb::CancelReason::Stopped,
        Some(CancelReason::ClientGone) => pb::CancelReason::ClientGone,
        Some(CancelReason::Shutdown) => pb::CancelReason::Shutdown,
        Some(CancelReason::SessionDeleted) => pb::CancelReason::SessionDeleted,
        Some(CancelReason::Interrupted) => pb::CancelReason::Interrupted,
    }
}

/// One turn event.
pub fn event_to_pb(session_id: &str, turn_id: &str, e: &TurnEvent) -> pb::ChatEvent {
    use pb::chat_event::Kind;
    let kind = match &e.kind {
        EventKind::TurnStarted {
            model,
            thinking: t,
            user_message_seq,
            system_overridden,
        } => Kind::TurnStarted(pb::TurnStarted {
            model: model.clone(),
            thinking: thinking(*t).into(),
            user_message_seq: *user_message_seq,
            system_overridden: *system_overridden,
        }),
        EventKind::Text(t) => Kind::Text(pb::TextDelta { text: t.clone() }),
        EventKind::Reasoning(t) => Kind::Reasoning(pb::ReasoningDelta { text: t.clone() }),
        EventKind::Step { kind, index } => Kind::Step(pb::Step {
            kind: match kind {
                StepKind::Start => pb::StepKind::Start,
                StepKind::Finish => pb::StepKind::Finish,
            }
            .into(),
            index: *index,
        }),
        EventKind::MessageStored { seq, id, role: r } => Kind::MessageStored(pb::MessageStored {
            message_seq: *seq,
            message_id: id.clone(),
            role: role(*r).into(),
        }),
        EventKind::Usage { usage: u, model } => Kind::Usage(pb::UsageEvent {
            usage: Some(usage(u)),
            model: model.clone(),
        }),
        EventKind::Error { code, message } => Kind::Error(pb::TurnError {
            code: error_code(*code).into(),
            message: message.clone(),
        }),
        EventKind::Heartbeat { phase, tool } => Kind::Heartbeat(pb::Heartbeat {
            phase: phase.as_str().to_owned(),
            tool_name: tool.clone().unwrap_or_default(),
        }),
        EventKind::ToolUse(t) => Kind::ToolUse(pb::ToolUse {
            call_id: t.call_id.clone(),
            tool_name: t.tool_name.clone(),
            status: match t.status {
                ToolStatus::Running => pb::ToolStatus::Running,
                ToolStatus::Done => pb::ToolStatus::Done,
                ToolStatus::Error => pb::ToolStatus::Error,
                ToolStatus::Cancelled => pb::ToolStatus::Cancelled,
                ToolStatus::OutcomeUnknown => pb::ToolStatus::OutcomeUnknown,
            }
            .into(),
            input_summary: t.input_summary.clone(),
            arguments_json: t.arguments_json.clone(),
            detail: t.detail.clone(),
            content: t.content.clone(),
            references: t.references.iter().map(reference).collect(),
        }),
        EventKind::Image(m) => Kind::Image(pb::ImageEvent {
            blob: Some(blob_ref(m.blob.clone())),
            data: m.data.as_ref().map(|d| d.to_vec()).unwrap_or_default(),
            call_id: m.call_id.clone(),
        }),
        EventKind::File(m) => Kind::File(pb::FileEvent {
            blob: Some(blob_ref(m.blob.clone())),
            data: m.data.as_ref().map(|d| d.to_vec()).unwrap_or_default(),
            call_id: m.call_id.clone(),
            uri: m.uri.clone(),
        }),
        EventKind::References {
            call_id,
            references,
        } => Kind::References(pb::ReferencesEvent {
            references: references.iter().map(reference).collect(),
            call_id: call_id.clone(),
        }),
        EventKind::Notice { code, message } => Kind::Notice(pb::Notice {
            code: (*code).to_owned(),
            message: message.clone(),
        }),
        EventKind::ToolCall {
            call_id,
            name,
            arguments_json,
        } => Kind::ToolCall(pb::ToolCall {
            call_id: call_id.clone(),
            name: name.clone(),
            arguments_json: arguments_json.clone(),
        }),
        EventKind::ApprovalRequired {
            call_id,
            name,
            arguments_json,
        } => Kind::ApprovalRequired(pb::ApprovalRequired {
            call_id: call_id.clone(),
            name: name.clone(),
            arguments_json: arguments_json.clone(),
        }),
        EventKind::Compaction(c) => Kind::Compaction(pb::Compaction {
            status: match c.status {
                CompactionStatus::Started => pb::CompactionStatus::Started,
                CompactionStatus::Completed => pb::CompactionStatus::Completed,
                CompactionStatus::Failed => pb::CompactionStatus::Failed,
            }
            .into(),
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
            summary_seq: c.summary_seq,
            messages_compacted: c.messages_compacted,
            message: c.message.clone(),
        }),
        EventKind::Queued { position } => Kind::Queued(pb::Queued {
            position: *position,
        }),
        EventKind::Steered { message_seq } => Kind::Steered(pb::Steered {
            message_seq: message_seq.unwrap_or(0),
        }),
        EventKind::ReplayGap {
            first_available_seq,
            lagged,
        } => Kind::ReplayGap(pb::ReplayGap {
            first_available_seq: *first_available_seq,
            lagged: *lagged,
        }),
        EventKind::TurnFinished {
            outcome: o,
            cancel_reason: r,
            usage: u,
            duration: d,
        } => Kind::TurnFinished(pb::TurnFinished {
            outcome: outcome(*o).into(),
            cancel_reason: cancel_reason(*r).into(),
            usage: Some(usage(u)),
            duration: Some(duration(*d)),
        }),
    };
    pb::ChatEvent {
        session_id: session_id.to_owned(),
        turn_id: turn_id.to_owned(),
        seq: e.seq,
        at: Some(timestamp(e.at)),
        kind: Some(kind),
    }
}

/// A session's live-turn status.
pub fn session_status(s: agentrt_runtime::runtime::SessionStatus) -> pb::SessionStatus {
    let watcher_count = u32::try_from(s.watchers).unwrap_or(u32::MAX);
    let queued = s.queued.into_iter().map(queued_message).collect();
    let steering = u32::try_from(s.steering).unwrap_or(u32::MAX);
    let pending_calls = s
        .pending_calls
        .into_iter()
        .map(|c| pb::PendingCall {
            call_id: c.call_id,
            tool_name: c.name,
            arguments_json: c.arguments_json,
            wait: match c.wait {
                Wait::Result => pb::PendingCallWait::Result,
                Wait::Approval => pb::PendingCallWait::Approval,
            }
            .into(),
        })
        .collect();
    match s.live {
        Some((turn_id, phase, started_at)) => pb::SessionStatus {
            live: true,
            turn_id,
            phase: phase.as_str().to_owned(),
            started_at: Some(timestamp(started_at)),
            watcher_count,
            queued,
            steering,
            pending_calls,
            paused_turn_id: String::new(),
        },
        None => pb::SessionStatus {
            watcher_count,
            queued,
            pending_calls,
            paused_turn_id: s.paused.unwrap_or_default(),
            ..Default::default()
        },
    }
}

/// A message in a session's inbox.
fn queued_message(q: agentrt_runtime::types::Queued) -> pb::QueuedMessage {
    pb::QueuedMessage {
        id: q.id,
        enqueued_at: Some(timestamp(q.enqueued_at)),
        request_id: q.input.request_id.unwrap_or_default(),
        content: q.input.content.into_iter().map(block_to_pb).collect(),
        model: q.input.model.unwrap_or_default(),
        speaker: q.input.speaker.map(provenance::speaker_to_pb),
        input_actor: q.actor.map(provenance::actor_to_pb),
    }
}

/// Runtime-wide numbers.
pub fn runtime_stats(s: agentrt_runtime::runtime::RuntimeStats) -> pb::RuntimeStats {
    let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    pb::RuntimeStats {
        live_turns: small(s.live_turns),
        cached_runners: small(s.cached_runners),
        watchers: small(s.watchers),
        sessions_stored: s.sessions_stored,
        uptime: Some(duration(s.uptime)),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        draining: s.draining,
        default_model: s.default_model,
    }
}
