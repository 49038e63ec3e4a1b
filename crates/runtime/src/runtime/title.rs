//! Session titles: after the first successful turn of an untitled session a
//! title is set in the background (the turn's stream is never delayed) — by
//! the fast model when one is configured, otherwise (or when it fails) a
//! deterministic extract of the session's first message. A title, once
//! set, is never overwritten (`Store::set_title_if_empty`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use super::Inner;
use super::models::Resolved;
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
/// (and, with a fast model, the first answer). A job of the runtime's
/// lifecycle: shutdown waits for it, and cancels it at its hard limit.
pub(super) fn spawn(inner: Arc<Inner>, session_id: String, incarnation: String, answer: String) {
    // Its own span, a child of the turn's (which it may outlive).
    let span = tracing::info_span!(
        "title",
        otel.name = "agentrt.title",
        { crate::telemetry::semconv::GEN_AI_CONVERSATION_ID } = %session_id,
    );
    let runtime = Arc::clone(&inner);
    runtime.lifecycle.spawn_job(tracing::Instrument::instrument(
        async move { set_title(&inner, &session_id, &incarnation, &answer).await },
        span,
    ));
}

/// The title job's body.
async fn set_title(inner: &Inner, session_id: &str, incarnation: &str, answer: &str) {
    let first = match inner.store.history(session_id, 0, FIRST_PAGE, true).await {
        Ok(page) => first_user_text(&page),
        Err(err) => {
            tracing::warn!(error = %err, "reading the first message for a title failed");
            return;
        }
    };
    let Some(first) = first else { return };
    let mut title = None;
    if let Some(fast) = inner.models.fast() {
        title = from_model(fast, &first, answer).await;
    }
    let Some(title) = title.or_else(|| extract_title(&first)) else {
        return;
    };
    match inner
        .store
        .set_title_if_empty(session_id, incarnation, &title)
        .await
    {
        Ok(set) => tracing::debug!(set, "session title"),
        Err(err) => tracing::warn!(error = %err, "storing the session title failed"),
    }
}

fn first_user_text(page: &[Message]) -> Option<String> {
    page.iter()
        .find(|m| m.body.role == Role::User)
        .map(|m| flatten_text(&m.body.content))
        .filter(|t| !t.trim().is_empty())
}

/// Asks the fast model for a title; `None` when it fails or says nothing.
async fn from_model(fast: &Resolved, first: &str, answer: &str) -> Option<String> {
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
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;
    use futures::StreamExt as _;
    use tokio::sync::{Semaphore, mpsc};

    use super::*;
    use crate::model::{ModelError, ModelProvider, ModelStream, Models};
    use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
    use crate::store::{MemoryStore, Store};
    use crate::types::{ContentBlock, NewSession, Principal, StopReason};

    /// A fast model that says when it is asked for a title, answers only
    /// once released, and notes when its request is dropped unanswered.
    #[derive(Debug)]
    struct Gate {
        asked: mpsc::Sender<()>,
        release: Semaphore,
        dropped: AtomicBool,
    }

    /// Sets its flag when dropped before it is disarmed.
    struct Dropped<'a>(Option<&'a AtomicBool>);

    impl Drop for Dropped<'_> {
        fn drop(&mut self) {
            if let Some(flag) = self.0 {
                flag.store(true, Ordering::SeqCst);
            }
        }
    }

    #[async_trait]
    impl ModelProvider for Gate {
        async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
            let mut dropped = Dropped(Some(&self.dropped));
            let _ = self.asked.try_send(());
            let _permit = self.release.acquire().await;
            dropped.0 = None;
            Ok(Box::pin(futures::stream::iter([
                Ok(ModelEvent::TextDelta("Named by the model".into())),
                Ok(ModelEvent::Finished(StopReason::Stop)),
            ])))
        }
    }

    /// A runtime whose fast model is a [`Gate`], with one finished turn in
    /// an untitled session whose title job has asked the gate.
    async fn titling() -> (Runtime, Arc<MemoryStore>, Arc<Gate>, String) {
        let (asked, mut was_asked) = mpsc::channel(4);
        let gate = Arc::new(Gate {
            asked,
            release: Semaphore::new(0),
            dropped: AtomicBool::new(false),
        });
        let mut models = Models::with_builtin();
        models.insert("gate", Arc::clone(&gate) as Arc<dyn ModelProvider>);
        let store = Arc::new(MemoryStore::new());
        let config = RuntimeConfig {
            fast_model: Some("gate/titles".into()),
            ..RuntimeConfig::default()
        };
        let rt = Runtime::open(config, Arc::clone(&store) as Arc<dyn Store>, models)
            .await
            .unwrap();
        let who = Principal::local();
        let id = rt
            .create_session(&who, NewSession::default())
            .await
            .unwrap()
            .id;
        let input = ChatInput {
            session_id: id.clone(),
            content: vec![ContentBlock::text("plan a trip")],
            ..ChatInput::default()
        };
        let events: Vec<_> = rt.chat(&who, input).await.unwrap().collect().await;
        assert!(events.last().unwrap().is_final());
        was_asked
            .recv()
            .await
            .expect("the title job asks the fast model");
        (rt, store, gate, id)
    }

    #[tokio::test]
    async fn shutdown_waits_for_a_title_job_in_flight() {
        let (rt, store, gate, id) = titling().await;
        let shutdown = tokio::spawn({
            let rt = rt.clone();
            async move {
                rt.shutdown(Duration::from_secs(60), Duration::from_secs(60))
                    .await;
            }
        });
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(
            !shutdown.is_finished(),
            "shutdown returned while a title job was running"
        );
        gate.release.add_permits(1);
        shutdown.await.unwrap();
        let session = store.get_session(&id).await.unwrap().unwrap();
        assert_eq!(session.title, "Named by the model");
        assert!(!gate.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_title_job_still_running_at_the_hard_limit_is_cancelled() {
        let (rt, store, gate, id) = titling().await;
        rt.shutdown(Duration::from_secs(1), Duration::from_secs(2))
            .await;
        assert!(
            gate.dropped.load(Ordering::SeqCst),
            "the title job was not cancelled before shutdown returned"
        );
        let session = store.get_session(&id).await.unwrap().unwrap();
        assert_eq!(session.title, "");
    }

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
