//! `builtin/echo`: a deterministic offline model for demos and tests.
//!
//! It answers `You said: <the user's last text>` in several deltas (one per
//! word), preceded, when a thinking level other than `none` is requested, by
//! a short reasoning delta. Usage counts are estimated as `(bytes + 3) / 4`.
//! It needs no network and no configuration, which makes it the default model
//! when nothing else is configured. It is **not** a language model.

use async_trait::async_trait;
use futures::stream;

use super::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use crate::types::{ContentBlock, Role, StopReason, ThinkingLevel, Usage, flatten_text};

/// The echo model provider (served under the provider name `builtin`).
#[derive(Debug, Default, Clone)]
pub struct EchoProvider;

/// Splits `text` into word-sized deltas that keep their trailing spaces, so
/// concatenating them gives back `text`.
fn deltas(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for ch in text.chars() {
        current.push(ch);
        if ch == ' ' {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `flatten_text(content).len()` without building the string.
fn text_len(content: &[ContentBlock]) -> usize {
    let texts = content.iter().filter_map(|block| match block {
        ContentBlock::Text { text } if !text.is_empty() => Some(text.len()),
        _ => None,
    });
    let (count, bytes) = texts.fold((0usize, 0usize), |(n, sum), len| (n + 1, sum + len));
    bytes + count.saturating_sub(1)
}

fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

#[async_trait]
impl ModelProvider for EchoProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let last_user = request
            .messages
            .iter()
            .rev()
            .find(|m| m.body.role == Role::User)
            .map(|m| flatten_text(&m.body.content))
            .unwrap_or_default();
        let prompt_len: usize = request
            .messages
            .iter()
            .map(|m| text_len(&m.body.content))
            .sum::<usize>()
            + request.system_prompt.as_deref().map_or(0, str::len);
        let reply = if last_user.trim().is_empty() {
            "You said nothing.".to_owned()
        } else {
            format!("You said: {last_user}")
        };
        let mut events = Vec::new();
        let reasoning = match request.thinking {
            Some(level) if level != ThinkingLevel::None => {
                let r = format!("The user wrote {} characters.", last_user.chars().count());
                events.push(Ok(ModelEvent::ReasoningDelta(r.clone())));
                r
            }
            _ => String::new(),
        };
        events.extend(
            deltas(&reply)
                .into_iter()
                .map(|d| Ok(ModelEvent::TextDelta(d))),
        );
        events.push(Ok(ModelEvent::Usage(Usage {
            input_tokens: (prompt_len as u64).div_ceil(4),
            output_tokens: estimate_tokens(&reply) + estimate_tokens(&reasoning),
            reasoning_tokens: estimate_tokens(&reasoning),
            cached_input_tokens: 0,
        })));
        events.push(Ok(ModelEvent::Finished(StopReason::Stop)));
        Ok(Box::pin(stream::iter(events)))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;
    use crate::types::{Message, NewMessage};

    #[test]
    fn text_len_is_the_flattened_length() {
        let image = ContentBlock::Image {
            mime_type: "image/png".into(),
            data: vec![1, 2, 3],
        };
        for content in [
            vec![],
            vec![ContentBlock::text("")],
            vec![ContentBlock::text("héllo")],
            vec![
                ContentBlock::text("a"),
                ContentBlock::text(""),
                ContentBlock::text("bc"),
            ],
            vec![
                ContentBlock::text(""),
                image,
                ContentBlock::text("x"),
                ContentBlock::text("yz"),
            ],
        ] {
            assert_eq!(
                text_len(&content),
                flatten_text(&content).len(),
                "{content:?}"
            );
        }
    }

    fn user(text: &str) -> Message {
        Message {
            seq: 1,
            body: NewMessage::new("t", Role::User, vec![ContentBlock::text(text)]),
            compacted: false,
        }
    }

    #[tokio::test]
    async fn echo_streams_the_reply_in_several_deltas_then_finishes() {
        let request = ModelRequest {
            model: "echo".into(),
            system_prompt: None,
            messages: vec![user("hello there world")].into(),
            thinking: None,
            tools: Vec::new(),
            ..Default::default()
        };
        let events: Vec<_> = EchoProvider
            .stream(request)
            .await
            .unwrap()
            .map(Result::unwrap)
            .collect()
            .await;
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                ModelEvent::TextDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "You said: hello there world");
        let deltas = events
            .iter()
            .filter(|e| matches!(e, ModelEvent::TextDelta(_)))
            .count();
        assert!(deltas >= 4, "expected several deltas, got {deltas}");
        assert_eq!(events.last(), Some(&ModelEvent::Finished(StopReason::Stop)));
    }

    #[tokio::test]
    async fn echo_reasons_only_when_thinking_is_requested() {
        let request = ModelRequest {
            model: "echo".into(),
            system_prompt: None,
            messages: vec![user("hi")].into(),
            thinking: Some(ThinkingLevel::Low),
            tools: Vec::new(),
            ..Default::default()
        };
        let first = EchoProvider
            .stream(request)
            .await
            .unwrap()
            .next()
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(first, ModelEvent::ReasoningDelta(_)));
    }
}
