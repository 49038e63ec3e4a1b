//! Caller-executed tools: validation of per-call tool declarations and the
//! registry of calls waiting for `SubmitToolResult` (the tool phase of a
//! turn, for every tool, is `turn/tools.rs`).

use std::collections::{HashMap, HashSet};

use tokio::sync::oneshot;

use super::{Runtime, lock};
use crate::error::{FieldViolation, RuntimeError};
use crate::limits::{MAX_ID_BYTES, MAX_TOOLS, check_short};
use crate::model::ToolSpec;
use crate::toolbox::{ToolMedia, ToolOutcome, valid_tool_name};
use crate::types::{ContentBlock, PausedCall, Principal, Wait};

/// Longest tool description.
const MAX_DESCRIPTION: usize = 4 << 10;
/// Longest reason of an approval decision.
const MAX_REASON_BYTES: usize = 4 << 10;

/// Calls of one turn waiting for their result or approval, and those
/// already answered (so a second submit is told ALREADY_EXISTS, a second
/// decision FAILED_PRECONDITION, rather than "unknown").
#[derive(Debug, Default)]
pub(crate) struct Pending {
    waiting: HashMap<String, (PendingCall, oneshot::Sender<Answer>)>,
    answered: HashSet<String>,
}

/// What a waiting call is answered with.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A caller-executed tool's result.
    Result(ToolOutcome),
    /// A decision on a server tool call that required approval.
    Decision {
        /// Run it.
        approved: bool,
        /// Why (told to the model on a denial).
        reason: String,
    },
}

/// A tool call the turn waits for (`GetSessionStatus`): a caller-executed
/// tool's result or an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCall {
    /// Call id (what `SubmitToolResult` / `SubmitToolApproval` name).
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as the caller was sent them (a JSON document).
    pub arguments_json: String,
    /// What it waits for.
    pub wait: Wait,
}

impl From<&PausedCall> for PendingCall {
    fn from(c: &PausedCall) -> Self {
        Self {
            call_id: c.call_id.clone(),
            name: c.name.clone(),
            arguments_json: c.arguments_json.clone(),
            wait: c.wait,
        }
    }
}

impl Pending {
    /// Waits for the answer to `call` (announced to the caller).
    pub(crate) fn wait_for(&mut self, call: PendingCall) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        self.waiting.insert(call.call_id.clone(), (call, tx));
        rx
    }

    /// The calls waited for, in call id order.
    pub(crate) fn calls(&self) -> Vec<PendingCall> {
        let mut calls: Vec<_> = self.waiting.values().map(|(c, _)| c.clone()).collect();
        calls.sort_by(|a, b| a.call_id.cmp(&b.call_id));
        calls
    }

    /// Stops waiting for `call_id`, answered already (before a restart):
    /// a second answer is told so.
    pub(crate) fn answered_before(&mut self, call_id: &str) {
        self.waiting.remove(call_id);
        self.answered.insert(call_id.to_owned());
    }

    /// Stops waiting for everything (the turn moves on or ends).
    pub(crate) fn clear(&mut self) {
        self.waiting.clear();
    }

    /// Hands `answer` to the wait for `call_id`, which must wait for
    /// `wait`.
    pub(crate) fn answer(
        &mut self,
        call_id: &str,
        wait: Wait,
        answer: Answer,
    ) -> Result<(), RuntimeError> {
        if self.answered.contains(call_id) {
            return Err(match wait {
                Wait::Result => RuntimeError::AlreadyExists("this tool call already has a result"),
                Wait::Approval => {
                    RuntimeError::FailedPrecondition("this tool call was already decided")
                }
            });
        }
        match self.waiting.get(call_id) {
            None => {
                return Err(RuntimeError::FailedPrecondition(match wait {
                    Wait::Result => "the turn is not waiting for a result of that call",
                    Wait::Approval => "the turn is not waiting for an approval of that call",
                }));
            }
            Some((call, _)) if call.wait != wait => {
                return Err(RuntimeError::FailedPrecondition(match call.wait {
                    Wait::Result => {
                        "that call is a caller-executed tool's: answer it with SubmitToolResult"
                    }
                    Wait::Approval => {
                        "that call waits for an approval: decide it with SubmitToolApproval"
                    }
                }));
            }
            Some(_) => {}
        }
        let Some((_, tx)) = self.waiting.remove(call_id) else {
            return Err(RuntimeError::FailedPrecondition(
                "the turn stopped waiting for that call",
            ));
        };
        self.answered.insert(call_id.to_owned());
        tx.send(answer)
            .map_err(|_| RuntimeError::FailedPrecondition("the turn stopped waiting for that call"))
    }
}

/// Checks `extra_tools` and `excluded_tools` of a Chat.
pub(crate) fn validate_tools(extra: &[ToolSpec], excluded: &[String]) -> Result<(), RuntimeError> {
    let mut violations = Vec::new();
    if extra.len() > MAX_TOOLS {
        violations.push(FieldViolation::new(
            "extra_tools",
            format!("at most {MAX_TOOLS} tools"),
        ));
    }
    if excluded.len() > MAX_TOOLS {
        violations.push(FieldViolation::new(
            "excluded_tools",
            format!("at most {MAX_TOOLS} names"),
        ));
    }
    for (i, name) in excluded.iter().enumerate().take(MAX_TOOLS) {
        if name.len() > MAX_ID_BYTES {
            violations.push(FieldViolation::new(
                format!("excluded_tools[{i}]"),
                format!("is {} bytes; the limit is {MAX_ID_BYTES}", name.len()),
            ));
        }
    }
    let mut names = HashSet::new();
    for (i, tool) in extra.iter().enumerate() {
        if !valid_tool_name(&tool.name) {
            violations.push(FieldViolation::new(
                format!("extra_tools[{i}].name"),
                "must be 1-64 characters of A-Z a-z 0-9 _ -",
            ));
        } else if !names.insert(tool.name.as_str()) {
            violations.push(FieldViolation::new(
                format!("extra_tools[{i}].name"),
                format!("{:?} is declared twice", tool.name),
            ));
        }
        if tool.description.len() > MAX_DESCRIPTION {
            violations.push(FieldViolation::new(
                format!("extra_tools[{i}].description"),
                format!("is longer than {MAX_DESCRIPTION} bytes"),
            ));
        }
        if !tool.parameters.is_object() {
            violations.push(FieldViolation::new(
                format!("extra_tools[{i}].parameters_json_schema"),
                "must be a JSON object (a JSON Schema)",
            ));
        }
    }
    RuntimeError::check(violations)
}

/// Checks `require_approval` of a Chat: tool names, or `*`.
pub(crate) fn validate_approvals(names: &[String]) -> Result<(), RuntimeError> {
    let mut violations = Vec::new();
    if names.len() > MAX_TOOLS {
        violations.push(FieldViolation::new(
            "require_approval",
            format!("at most {MAX_TOOLS} names"),
        ));
    }
    for (i, name) in names.iter().enumerate().take(MAX_TOOLS) {
        if name != "*" && !valid_tool_name(name) {
            violations.push(FieldViolation::new(
                format!("require_approval[{i}]"),
                "must be a tool name (1-64 characters of A-Z a-z 0-9 _ -) or \"*\"",
            ));
        }
    }
    RuntimeError::check(violations)
}

/// The tools offered to the model for one call: the caller's, minus the
/// excluded names.
pub(crate) fn offered(extra: Vec<ToolSpec>, excluded: &[String]) -> Vec<ToolSpec> {
    extra
        .into_iter()
        .filter(|t| !excluded.iter().any(|e| e == &t.name))
        .collect()
}

/// Checks the media of a caller's tool result (as a user message's media
/// are checked, fields named `media[i]...`) and turns them into the
/// tool's media.
fn caller_media(
    media: Vec<ContentBlock>,
    limits: &crate::media::MediaLimits,
) -> Result<Vec<ToolMedia>, RuntimeError> {
    use crate::media::{block_name, check_blob_id, check_inline, check_name};
    use crate::types::{MediaKind, MediaRef};
    crate::limits::check_block_count("media", media.len())?;
    let mut violations = Vec::new();
    let mut out = Vec::with_capacity(media.len());
    let mut total = 0u64;
    for (i, block) in media.into_iter().enumerate() {
        let (kind, data, mime_type, name) = match block {
            ContentBlock::Image { data, mime_type } => {
                (MediaKind::Image, data, mime_type, String::new())
            }
            ContentBlock::File {
                data,
                mime_type,
                name,
            } => (MediaKind::File, data, mime_type, name),
            ContentBlock::Media(m) => {
                let field = format!("media[{i}].{}", block_name(m.kind));
                check_blob_id(&field, &m.blob_id, &mut violations);
                check_name(&field, &m.name, &mut violations);
                out.push(ToolMedia::Blob(MediaRef { size: 0, ..m }));
                continue;
            }
            ContentBlock::Text { .. }
            | ContentBlock::Thinking { .. }
            | ContentBlock::ToolCall { .. }
            | ContentBlock::ToolResult { .. } => {
                violations.push(FieldViolation::new(
                    format!("media[{i}]"),
                    "must be an image or file block",
                ));
                continue;
            }
        };
        let field = format!("media[{i}].{}", block_name(kind));
        check_inline(&field, kind, &data, &mime_type, limits, &mut violations);
        check_name(&field, &name, &mut violations);
        total += data.len() as u64;
        out.push(ToolMedia::Bytes {
            kind,
            data: data.into(),
            mime_type,
            name,
            uri: String::new(),
        });
    }
    if total > limits.max_message_bytes {
        violations.push(FieldViolation::new(
            "media",
            format!(
                "holds {total} bytes; the limit is {} per result",
                limits.max_message_bytes
            ),
        ));
    }
    RuntimeError::check(violations)?;
    Ok(out)
}

impl Runtime {
    /// Delivers the result of a caller-executed tool call to the live turn
    /// waiting for it.
    ///
    /// `media` (image and file blocks: bytes inline, or a blob of the
    /// session by reference) are what the tool returned besides `content`.
    #[allow(clippy::too_many_arguments)]
    pub async fn submit_tool_result(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
        call_id: &str,
        content: String,
        is_error: bool,
        media: Vec<ContentBlock>,
    ) -> Result<(), RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        if call_id.is_empty() {
            return Err(RuntimeError::invalid("call_id", "is required"));
        }
        check_short("call_id", call_id, MAX_ID_BYTES)?;
        check_short("turn_id", turn_id, MAX_ID_BYTES)?;
        if content.len() > self.inner.config.max_input_bytes {
            return Err(RuntimeError::invalid(
                "content",
                format!("is longer than {} bytes", self.inner.config.max_input_bytes),
            ));
        }
        let media = caller_media(media, &self.inner.config.media)?;
        let session = self.owned_session(who, session_id).await?;
        let key = session.id.clone();
        let session_id = key.as_str();
        let live = match self.live_of(&session).filter(|t| t.turn_id == turn_id) {
            Some(live) => live,
            None => match self.resume_paused(&session, Some(turn_id), call_id).await? {
                Some(live) => live,
                None => {
                    self.not_elsewhere(session_id).await?;
                    return Err(RuntimeError::FailedPrecondition(
                        "no live or paused turn with that id in this session",
                    ));
                }
            },
        };
        lock(&live.pending_tools).answer(
            call_id,
            Wait::Result,
            Answer::Result(ToolOutcome {
                content,
                is_error,
                media,
            }),
        )
    }

    /// Decides a server tool call that waits for an approval in the
    /// session's live or paused turn: approved runs it, denied answers it
    /// with a result saying so (with `reason`). The session's owner or an
    /// admin only (another user: NOT_FOUND); a second decision is
    /// FAILED_PRECONDITION.
    pub async fn submit_tool_approval(
        &self,
        who: &Principal,
        session_id: &str,
        call_id: &str,
        approved: bool,
        reason: String,
    ) -> Result<(), RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        if call_id.is_empty() {
            return Err(RuntimeError::invalid("call_id", "is required"));
        }
        check_short("call_id", call_id, MAX_ID_BYTES)?;
        check_short("reason", &reason, MAX_REASON_BYTES)?;
        super::restricted::check_approval(who)?;
        let session = self.owned_session(who, session_id).await?;
        let live = match self.live_of(&session) {
            Some(live) => live,
            None => match self.resume_paused(&session, None, call_id).await? {
                Some(live) => live,
                None => {
                    self.not_elsewhere(&session.id).await?;
                    return Err(RuntimeError::FailedPrecondition(
                        "the session has no turn waiting for an approval of that call",
                    ));
                }
            },
        };
        lock(&live.pending_tools).answer(
            call_id,
            Wait::Approval,
            Answer::Decision { approved, reason },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    #[test]
    fn tool_declarations_are_validated() {
        assert!(validate_tools(&[tool("get_weather"), tool("b-2")], &[]).is_ok());
        for bad in [
            vec![tool("")],
            vec![tool("has space")],
            vec![tool("a"), tool("a")],
        ] {
            assert!(validate_tools(&bad, &[]).is_err());
        }
        let mut no_schema = tool("x");
        no_schema.parameters = serde_json::json!("string");
        assert!(validate_tools(&[no_schema], &[]).is_err());
    }

    #[test]
    fn excluded_tools_are_not_offered() {
        let offered = offered(vec![tool("a"), tool("b")], &["a".to_owned()]);
        assert_eq!(
            offered.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
    }
}
