//! Compaction of long conversations (docs/contract.md §3.6), the parts that need no
//! runtime state: token estimates, where to cut, the summariser request and
//! the truncation fallback. The runtime's side (events, the store write,
//! the `CompactSession` call) is in `runtime/compaction.rs`.
//!
//! A conversation's context is its latest summary (if any) followed by the
//! uncompacted *tail*: every message after the session's
//! `compacted_through`, summaries excluded. Compaction cuts the tail at a
//! user message — so a tool call and its result (which always sit between
//! two user messages) are never separated — summarises everything before
//! the cut together with the previous summary, and stores the new summary
//! with `compacted_through` = the seq before the cut.

use std::time::Duration;

use futures::StreamExt as _;

use crate::model::{ModelError, ModelEvent, ModelProvider, ModelRequest};
use crate::types::{ContentBlock, MediaKind, MediaRef, Message, Role, Usage, flatten_text};

/// Compaction settings. Every field has a documented default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionConfig {
    /// Compact before a turn whose context is estimated above this many
    /// tokens. Default 80,000.
    pub max_tokens: u64,
    /// User turns kept verbatim after the summary. Default 6. When the
    /// context holds no more user turns than this, fewer are kept (at least
    /// the newest), so a context of a few huge turns can still be
    /// compacted.
    pub keep_tail: usize,
    /// How long the summariser may take before compaction gives up and the
    /// turn runs on a truncated context. Default 2 min.
    pub timeout: Duration,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            max_tokens: 80_000,
            keep_tail: 6,
            timeout: Duration::from_secs(120),
        }
    }
}

/// Instructions for the summarising model.
pub const SUMMARY_SYSTEM_PROMPT: &str = "You compress conversations. Summarise the \
conversation transcript you are given so that an assistant can continue it without the \
original messages: keep the user's goals, decisions, facts, names, numbers, code \
identifiers, tool results that matter and open questions. Write plain prose or short \
lists, in the conversation's language. Answer with the summary only.";

/// Characters of one tool result kept in a summariser transcript.
const TRANSCRIPT_TOOL_CHARS: usize = 2_000;
/// Estimated tokens of an image block.
const IMAGE_TOKENS: u64 = 1_000;
/// Estimated per-message overhead (role markers and separators).
const MESSAGE_OVERHEAD: u64 = 4;

fn text_tokens(bytes: usize) -> u64 {
    // About four bytes per token for English text and code; rounded up.
    u64::try_from(bytes.div_ceil(4)).unwrap_or(u64::MAX)
}

/// A rough token count of one message.
pub fn estimate_message(message: &Message) -> u64 {
    message
        .body
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text { text } => text_tokens(text.len()),
            ContentBlock::Thinking { thinking, .. } => text_tokens(thinking.len()),
            ContentBlock::Image { .. } => IMAGE_TOKENS,
            ContentBlock::File { data, .. } => text_tokens(data.len()),
            ContentBlock::Media(media) => media_tokens(media),
            ContentBlock::ToolCall {
                name,
                arguments_json,
                ..
            } => text_tokens(name.len() + arguments_json.len()),
            ContentBlock::ToolResult {
                name,
                content,
                media,
                ..
            } => media
                .iter()
                .map(media_tokens)
                .fold(text_tokens(name.len() + content.len()), u64::saturating_add),
        })
        .fold(MESSAGE_OVERHEAD, u64::saturating_add)
}

/// Estimated tokens of a stored image or file: an image's fixed estimate;
/// a file as if it were text (a PDF's pages cost about that much).
fn media_tokens(media: &MediaRef) -> u64 {
    match media.kind {
        MediaKind::Image => IMAGE_TOKENS,
        MediaKind::File => text_tokens(usize::try_from(media.size).unwrap_or(usize::MAX)),
    }
}

/// The estimated size of a context: the larger of a character-based
/// estimate and the provider-reported usage of the newest assistant
/// message produced on the current summary (its prompt plus output tokens)
/// plus estimates for what came after it.
pub fn estimate_context(
    system_prompt: Option<&str>,
    summary: Option<&Message>,
    tail: &[Message],
) -> u64 {
    let fixed =
        system_prompt.map_or(0, |s| text_tokens(s.len())) + summary.map_or(0, estimate_message);
    let heuristic = tail
        .iter()
        .map(estimate_message)
        .fold(fixed, u64::saturating_add);
    let summary_seq = summary.map_or(0, |s| s.seq);
    let reported = tail.iter().enumerate().rev().find_map(|(i, m)| {
        let usage = m.body.usage.filter(|_| m.body.role == Role::Assistant)?;
        // Usage from before the latest summary measured a longer context.
        (m.seq > summary_seq).then(|| {
            tail[i + 1..].iter().map(estimate_message).fold(
                usage.input_tokens + usage.output_tokens,
                u64::saturating_add,
            )
        })
    });
    heuristic.max(reported.unwrap_or(0))
}

/// Where to cut `tail` for a summary: the index of the first kept message
/// (a user message), keeping the last `keep_tail` user turns — fewer when
/// that would leave nothing to summarise, but always the newest. `None`
/// when everything belongs to the newest user turn.
pub fn split_point(tail: &[Message], keep_tail: usize) -> Option<usize> {
    let users: Vec<usize> = tail
        .iter()
        .enumerate()
        .filter(|(_, m)| m.body.role == Role::User)
        .map(|(i, _)| i)
        .collect();
    // Candidate cuts, from the longest kept tail to the shortest; the first
    // that leaves something before it wins.
    let keep = keep_tail.clamp(1, users.len().max(1));
    (1..=keep)
        .rev()
        .filter_map(|k| users.len().checked_sub(k).map(|i| users[i]))
        .find(|&cut| cut > 0)
}

/// The truncation fallback: the index of the first message to keep so the
/// context fits `max_tokens`, cutting only at user messages and always
/// keeping the newest user turn. `fixed` is the size of what is sent
/// anyway (system prompt, summary).
pub fn truncation_point(tail: &[Message], fixed: u64, max_tokens: u64) -> usize {
    let mut total = fixed;
    let mut cut = tail.len();
    for (i, message) in tail.iter().enumerate().rev() {
        total = total.saturating_add(estimate_message(message));
        if message.body.role != Role::User {
            continue;
        }
        // The newest user turn is always kept; older ones while they fit.
        if total > max_tokens && cut < tail.len() {
            break;
        }
        cut = i;
    }
    if cut == tail.len() { 0 } else { cut }
}

/// The text handed to the summariser: the previous summary, then each
/// message with its role. Longer than `max_chars`, the oldest messages are
/// left out (and the transcript says so).
pub fn transcript(previous: Option<&Message>, messages: &[Message], max_chars: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut used = 0usize;
    let mut omitted = false;
    for message in messages.iter().rev() {
        let line = render(message);
        if used + line.len() > max_chars && !parts.is_empty() {
            omitted = true;
            break;
        }
        used += line.len();
        parts.push(line);
    }
    parts.reverse();
    let mut out = String::new();
    if let Some(summary) = previous {
        out.push_str("Summary of the conversation before this transcript:\n");
        out.push_str(&flatten_text(&summary.body.content));
        out.push_str("\n\n");
    }
    if omitted {
        out.push_str("[older messages left out]\n\n");
    }
    out.push_str("Transcript:\n");
    out.push_str(&parts.join("\n"));
    out
}

fn render(message: &Message) -> String {
    let role = match message.body.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::Summary => "summary",
        Role::Notice => "notice",
    };
    // A group session's speakers stay told apart in the summary.
    let speaker;
    let role = match &message.body.speaker {
        Some(s) if message.body.role == Role::User => {
            speaker = format!("{role} {}", s.shown());
            speaker.as_str()
        }
        Some(_) | None => role,
    };
    let mut out = String::new();
    for block in &message.body.content {
        let piece = match block {
            ContentBlock::Text { text } => format!("[{role}] {text}"),
            ContentBlock::Thinking { .. } => continue,
            ContentBlock::Image { mime_type, .. } => format!("[{role}] (an image, {mime_type})"),
            ContentBlock::File {
                mime_type, name, ..
            } => format!("[{role}] (a file {name:?}, {mime_type})"),
            ContentBlock::Media(media) => format!("[{role}] {}", media.describe()),
            ContentBlock::ToolCall {
                name,
                arguments_json,
                ..
            } => format!("[{role}] called tool {name} with {arguments_json}"),
            ContentBlock::ToolResult {
                name,
                content,
                is_error,
                ..
            } => {
                let status = if *is_error { "error" } else { "result" };
                format!(
                    "[tool {name} {status}] {}",
                    clip(content, TRANSCRIPT_TOOL_CHARS)
                )
            }
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&piece);
    }
    out
}

/// At most `max` characters of `text`, marked when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Why the summariser produced no summary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    /// The summariser did not finish in time.
    #[error("the summariser did not finish within {0:?}")]
    Timeout(Duration),
    /// The summarising model failed.
    #[error("the summariser failed: {0}")]
    Model(&'static str),
    /// It finished without any text.
    #[error("the summariser returned an empty summary")]
    Empty,
}

/// Asks `provider` for a summary of `transcript`, bounded by `timeout` and
/// by the provider's per-step output bound
/// ([`ModelProvider::max_step_output_bytes`]): past it the summary is cut at
/// a character boundary and the stream dropped (which cancels the
/// generation), so a summariser that never stops cannot grow memory or the
/// stored summary without limit. Returns the summary text and the step's
/// usage.
pub async fn summarise(
    provider: &dyn ModelProvider,
    model: &str,
    transcript: String,
    timeout: Duration,
) -> Result<(String, Option<Usage>), SummaryError> {
    let request = ModelRequest::prompt(model, SUMMARY_SYSTEM_PROMPT, transcript);
    let max_bytes = provider.max_step_output_bytes(model);
    let collect = async {
        let mut stream = provider.stream(request).await?;
        let mut text = String::new();
        let mut usage = None;
        while let Some(item) = stream.next().await {
            match item? {
                ModelEvent::TextDelta(t) => {
                    if text.len() + t.len() > max_bytes {
                        let mut end = max_bytes - text.len();
                        while !t.is_char_boundary(end) {
                            end -= 1;
                        }
                        text.push_str(&t[..end]);
                        tracing::warn!(
                            max_bytes,
                            "the summary reached the per-step output bound; it is cut there"
                        );
                        return Ok((text, usage));
                    }
                    text.push_str(&t);
                }
                ModelEvent::Usage(u) => usage = Some(u),
                ModelEvent::Finished(_) => return Ok((text, usage)),
                ModelEvent::ReasoningDelta(_)
                | ModelEvent::ThinkingSignature(_)
                | ModelEvent::ToolCall { .. } => {}
            }
        }
        Err(ModelError::Truncated(
            "the summariser's stream ended without finishing".to_owned(),
        ))
    };
    let (text, usage) = tokio::time::timeout(timeout, collect)
        .await
        .map_err(|_| SummaryError::Timeout(timeout))?
        .map_err(|e: ModelError| {
            tracing::warn!(error = %e, "summariser failed");
            SummaryError::Model(e.public_message())
        })?;
    let text = text.trim();
    if text.is_empty() {
        return Err(SummaryError::Empty);
    }
    Ok((text.to_owned(), usage))
}

#[cfg(test)]
mod tests;
