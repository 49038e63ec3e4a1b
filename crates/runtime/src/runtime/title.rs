//! Session titles: after the first successful turn of an untitled session a
//! title is set in the background (the turn's stream is never delayed) — by
//! the fast model when one is configured, otherwise (or when it fails) a
//! deterministic extract of the session's first message. A title, once
//! set, is never overwritten (`Store::set_title_if_empty`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use super::Inner;
use super::compact::FastModel;
use crate::compaction::clip;
use crate::model::{ModelEvent, ModelRequest};
use crate::types::{Message, Role, flatten_text};

/// Longest title, in characters.
pub const TITLE_MAX_CHARS: usize = 60;
/// How long the fast model may take to name a session.
const TITLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Characters of the first message and answer shown to the fast model:
/// enough to name a conversation, and short, because a local fast model
/// shares one inference thread with the turns (a long title prompt delays
/// the user's next turn by its prefill).
const TITLE_INPUT_CHARS: usize = 400;
/// Output of the fast model read before a title is cut from it.
const TITLE_READ_BYTES: usize = 120;
/// Messages read to find the session's first user message.
const FIRST_PAGE: usize = 16;

const TITLE_PROMPT: &str = "Write a short title (at most six words) for the conversation \
that starts with the exchange below, in its language. Answer with the title only, without \
quotes.";

/// A title from free text: whitespace collapsed, at most
/// [`TITLE_MAX_CHARS`] characters (cut at a word boundary when one is near,
/// marked with `…`). `None` when there is no text.
pub fn extract_title(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.is_empty() {
        return None;
    }
    let line = words.join(" ");
    if line.chars().count() <= TITLE_MAX_CHARS {
        return Some(line);
    }
    // Room for the ellipsis.
    let end = line
        .char_indices()
        .nth(TITLE_MAX_CHARS - 1)
        .map_or(line.len(), |(i, _)| i);
    let head = &line[..end];
    let cut = match head.rfind(' ') {
        Some(space) if head[..space].chars().count() >= TITLE_MAX_CHARS / 2 => &head[..space],
        _ => head,
    };
    Some(format!("{}…", cut.trim_end()))
}

/// Sets the session's title in the background from its first user message
/// (and, with a fast model, the first answer).
pub(super) fn spawn(inner: Arc<Inner>, session_id: String, incarnation: String, answer: String) {
    // Its own span, a child of the turn's (which it may outlive).
    let span = tracing::info_span!(
        "title",
        otel.name = "agentrt.title",
        { crate::telemetry::semconv::GEN_AI_CONVERSATION_ID } = %session_id,
    );
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let first = match inner.store.history(&session_id, 0, FIRST_PAGE, true).await {
                Ok(page) => first_user_text(&page),
                Err(err) => {
                    tracing::warn!(error = %err, "reading the first message for a title failed");
                    return;
                }
            };
            let Some(first) = first else { return };
            let mut title = None;
            if let Some(fast) = &inner.fast {
                title = from_model(fast, &first, &answer).await;
            }
            let Some(title) = title.or_else(|| extract_title(&first)) else {
                return;
            };
            match inner
                .store
                .set_title_if_empty(&session_id, &incarnation, &title)
                .await
            {
                Ok(set) => tracing::debug!(set, "session title"),
                Err(err) => tracing::warn!(error = %err, "storing the session title failed"),
            }
        },
        span,
    ));
}

fn first_user_text(page: &[Message]) -> Option<String> {
    page.iter()
        .find(|m| m.body.role == Role::User)
        .map(|m| flatten_text(&m.body.content))
        .filter(|t| !t.trim().is_empty())
}

/// Asks the fast model for a title; `None` when it fails or says nothing.
async fn from_model(fast: &FastModel, first: &str, answer: &str) -> Option<String> {
    let prompt = format!(
        "User: {}\n\nAssistant: {}",
        clip(first, TITLE_INPUT_CHARS),
        clip(answer, TITLE_INPUT_CHARS)
    );
    let request = ModelRequest::prompt(&fast.provider_model, TITLE_PROMPT, prompt);
    let collect = async {
        let mut stream = fast.provider.stream(request).await.ok()?;
        let mut text = String::new();
        while let Some(item) = stream.next().await {
            match item.ok()? {
                ModelEvent::TextDelta(t) => {
                    text.push_str(&t);
                    // A title is one short line: stop a rambling model early
                    // (dropping the stream cancels the generation).
                    let line_done = text.trim_start().contains('\n');
                    if line_done || text.len() > TITLE_READ_BYTES {
                        return Some(text);
                    }
                }
                ModelEvent::Finished(_) => return Some(text),
                _ => {}
            }
        }
        None
    };
    let text = tokio::time::timeout(TITLE_TIMEOUT, collect).await.ok()??;
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line
        .trim_matches(|c: char| c == '"' || c == '\'' || c == '*' || c == '#')
        .trim()
        .trim_end_matches('.');
    extract_title(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_with_whitespace_collapsed() {
        assert_eq!(
            extract_title("  Hello \n  world\t"),
            Some("Hello world".into())
        );
        assert_eq!(extract_title(" \n "), None);
    }

    #[test]
    fn long_text_is_cut_at_a_word_boundary_within_sixty_chars() {
        let text = "Please help me plan a three week trip through Japan in the spring with kids";
        let title = extract_title(text).unwrap();
        assert!(title.chars().count() <= TITLE_MAX_CHARS, "{title}");
        assert!(title.ends_with('…'));
        assert_eq!(
            title,
            "Please help me plan a three week trip through Japan in the…"
        );
    }

    #[test]
    fn long_words_and_multibyte_text_stay_valid_utf8() {
        let text = "ü".repeat(200);
        let title = extract_title(&text).unwrap();
        assert_eq!(title.chars().count(), TITLE_MAX_CHARS);
        let cjk = "日本語のテキスト".repeat(20);
        assert!(extract_title(&cjk).unwrap().chars().count() <= TITLE_MAX_CHARS);
    }
}
