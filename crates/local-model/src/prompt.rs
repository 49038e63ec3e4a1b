//! The ChatML prompt, as token ids.
//!
//! ```text
//! <|im_start|>system\n{system}<|im_end|>\n
//! <|im_start|>user\n{text}<|im_end|>\n
//! <|im_start|>assistant\n{text}<|im_end|>\n
//! …
//! <|im_start|>assistant\n
//! ```
//!
//! This is exactly what SmolLM2's template renders (its default system
//! prompt included), written by hand: no template engine. The control ids
//! are spliced in here; every piece of text — user text included — is
//! encoded with special-token matching off, so typing `<|im_end|>` gives the
//! ids of that text, never the control token. No BOS is prepended
//! (`add_bos_token` is false and id 1 is `<|im_start|>`).
//!
//! Text parts only: images become `[image]`, tool calls and results (from
//! turns run by another model) are rendered as short text, reasoning and
//! runtime notices are left out. When the prompt does not fit the context
//! with room for the answer, the oldest messages are dropped (the system
//! prompt and the last message are kept; the last is cut from its start if
//! it alone is too long).

use agentrt_runtime::model::ModelRequest;
use agentrt_runtime::types::{ContentBlock, Role};
use tokenizers::Tokenizer;

use crate::load::LoadedModel;

/// One rendered chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// The text.
    pub text: String,
}

/// The messages of a request in ChatML roles, oldest first (system prompt
/// not included).
pub fn chat_messages(request: &ModelRequest) -> Vec<ChatMessage> {
    let mut out = Vec::new();
    for message in request.messages.iter() {
        let role = match message.body.role {
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
            Role::Summary => "user",
            Role::Notice => continue,
        };
        let mut text = String::new();
        if message.body.role == Role::Summary {
            text.push_str("Summary of the earlier conversation:\n");
        }
        for block in &message.body.content {
            let piece = match block {
                ContentBlock::Text { text } => text.clone(),
                ContentBlock::Image { .. } => "[image]".to_owned(),
                ContentBlock::File { name, .. } => format!("[file {name}]"),
                ContentBlock::Media(media) => format!("[{}]", media.describe()),
                ContentBlock::ToolCall {
                    name,
                    arguments_json,
                    ..
                } => format!("[called tool {name} with {arguments_json}]"),
                ContentBlock::ToolResult { name, content, .. } => {
                    format!("[result of tool {name}]\n{content}")
                }
                ContentBlock::Thinking { .. } => continue,
            };
            if !text.is_empty() && !piece.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&piece);
        }
        if text.is_empty() {
            continue;
        }
        // ChatML has no author name: a group session's speaker is named in
        // the text.
        if message.body.role == Role::User
            && let Some(speaker) = &message.body.speaker
        {
            text.insert_str(0, &speaker.prefix());
        }
        // Consecutive messages of one role (e.g. a tool result after a user
        // message) are merged: ChatML alternates.
        match out.last_mut() {
            Some(ChatMessage { role: r, text: t }) if *r == role => {
                t.push_str("\n\n");
                t.push_str(&text);
            }
            _ => out.push(ChatMessage { role, text }),
        }
    }
    out
}

/// A prompt ready for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The token ids.
    pub ids: Vec<u32>,
    /// How many of the oldest messages were dropped to fit the context.
    pub dropped_messages: usize,
}

/// Why no prompt could be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot encode the prompt: {0}")]
pub struct PromptError(pub String);

fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, PromptError> {
    // The tokenizer was set to treat special-token text as plain text
    // (`set_encode_special_tokens(true)`) when it was loaded.
    debug_assert!(tokenizer.get_encode_special_tokens());
    tokenizer
        .encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| PromptError(e.to_string()))
}

/// `<|im_start|>{role}\n{text}<|im_end|>\n` as ids.
fn message_ids(model: &LoadedModel, role: &str, text: &str) -> Result<Vec<u32>, PromptError> {
    let mut ids = vec![model.im_start];
    ids.extend(encode(&model.tokenizer, &format!("{role}\n{text}"))?);
    ids.push(model.im_end);
    ids.extend(encode(&model.tokenizer, "\n")?);
    Ok(ids)
}

/// Builds the prompt for `system` + `messages`, leaving room for
/// `reserve` generated tokens within the model's context.
pub fn build(
    model: &LoadedModel,
    system: Option<&str>,
    messages: &[ChatMessage],
    reserve: usize,
) -> Result<Prompt, PromptError> {
    let budget = model.context_length.saturating_sub(reserve).max(16);
    let system = system
        .filter(|s| !s.trim().is_empty())
        .or(model.default_system_prompt.as_deref());
    let head = match system {
        Some(s) => message_ids(model, "system", s)?,
        None => Vec::new(),
    };
    let mut tail = vec![model.im_start];
    tail.extend(encode(&model.tokenizer, "assistant\n")?);

    // Newest first, until the budget is spent.
    let mut used = head.len() + tail.len();
    let mut kept: Vec<Vec<u32>> = Vec::new();
    for (i, m) in messages.iter().enumerate().rev() {
        let ids = message_ids(model, m.role, &m.text)?;
        if used + ids.len() <= budget {
            used += ids.len();
            kept.push(ids);
            continue;
        }
        if i + 1 == messages.len() {
            // The newest message alone is too long: keep the end of its text.
            let mut ids = vec![model.im_start];
            ids.extend(encode(&model.tokenizer, &format!("{}\n", m.role))?);
            let mut close = vec![model.im_end];
            close.extend(encode(&model.tokenizer, "\n")?);
            let text = encode(&model.tokenizer, &m.text)?;
            let room = budget.saturating_sub(used + ids.len() + close.len());
            ids.extend_from_slice(&text[text.len().saturating_sub(room)..]);
            ids.extend(close);
            kept.push(ids);
        }
        break;
    }
    let dropped_messages = messages.len() - kept.len();
    let mut ids = head;
    ids.extend(kept.into_iter().rev().flatten());
    ids.extend(tail);
    // A huge system prompt alone can still exceed the context: keep the end.
    if ids.len() > budget {
        ids.drain(..ids.len() - budget);
    }
    Ok(Prompt {
        ids,
        dropped_messages,
    })
}

#[cfg(test)]
mod tests {
    use agentrt_runtime::types::{Message, NewMessage};

    use super::*;

    fn msg(role: Role, content: Vec<ContentBlock>) -> Message {
        Message {
            seq: 1,
            body: NewMessage::new("t", role, content),
            compacted: false,
        }
    }

    #[test]
    fn roles_map_to_chatml_and_non_text_is_rendered_as_text() {
        let request = ModelRequest {
            model: "smollm2".into(),
            system_prompt: None,
            messages: std::sync::Arc::new(vec![
                msg(Role::User, vec![ContentBlock::text("hi")]),
                msg(
                    Role::Assistant,
                    vec![
                        ContentBlock::Thinking {
                            thinking: "hmm".into(),
                            signature: String::new(),
                        },
                        ContentBlock::text("hello"),
                        ContentBlock::ToolCall {
                            id: "c1".into(),
                            name: "clock".into(),
                            arguments_json: "{}".into(),
                        },
                    ],
                ),
                msg(
                    Role::Tool,
                    vec![ContentBlock::ToolResult {
                        call_id: "c1".into(),
                        name: "clock".into(),
                        content: "noon".into(),
                        is_error: false,
                        interrupted: None,
                        media: Vec::new(),
                    }],
                ),
                msg(Role::Notice, vec![ContentBlock::text("timed out")]),
                msg(
                    Role::User,
                    vec![
                        ContentBlock::text("look"),
                        ContentBlock::Image {
                            data: vec![1],
                            mime_type: "image/png".into(),
                        },
                    ],
                ),
            ]),
            thinking: None,
            tools: Vec::new(),
            ..Default::default()
        };
        let m = chat_messages(&request);
        let roles: Vec<_> = m.iter().map(|m| m.role).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(m[1].text, "hello\n[called tool clock with {}]");
        assert_eq!(m[2].text, "[result of tool clock]\nnoon\n\nlook\n[image]");
    }

    #[test]
    fn a_speaker_prefixes_its_user_message() {
        let mut alice = msg(Role::User, vec![ContentBlock::text("hi")]);
        alice.body.speaker = Some(agentrt_runtime::types::Speaker::new("u1", "Alice"));
        let request = ModelRequest {
            messages: std::sync::Arc::new(vec![
                alice,
                msg(Role::Assistant, vec![ContentBlock::text("hello")]),
                msg(Role::User, vec![ContentBlock::text("anonymous")]),
            ]),
            ..Default::default()
        };
        let texts: Vec<_> = chat_messages(&request)
            .into_iter()
            .map(|m| m.text)
            .collect();
        assert_eq!(texts, ["[Alice]: hi", "hello", "anonymous"]);
    }
}
