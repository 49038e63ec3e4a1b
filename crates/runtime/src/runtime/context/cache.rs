//! A long conversation's context kept on its runner between turns, so the
//! next turn does not re-read and re-decode the whole tail from the store.
//!
//! Only contexts of at least [`MIN_CACHED_MESSAGES`] messages are kept
//! (shorter ones are cheap to read, and idle sessions stay small), and all
//! cached contexts of a runtime together stay under their [`Budget`]
//! ([`CACHE_BUDGET_BYTES`]). A cached
//! context is used only when it provably equals what the store holds: same
//! session incarnation (and creation time), same compaction state, and the
//! turn's user message got exactly the seq after the cached messages — all
//! messages of a session are appended by its one live turn, so nothing can
//! have been written in between.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use crate::types::{ContentBlock, MediaRef, Message, Session};

/// Contexts shorter than this are read from the store each turn.
pub(crate) const MIN_CACHED_MESSAGES: usize = 64;
/// Upper bound of all cached contexts together (approximate bytes).
pub(crate) const CACHE_BUDGET_BYTES: usize = 64 << 20;

/// The approximate bytes all cached contexts of one runtime hold, and the
/// most they may.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit: CACHE_BUDGET_BYTES,
        }
    }
}

/// A context as it stood after a turn.
#[derive(Debug)]
pub(crate) struct CachedContext {
    created_at: SystemTime,
    incarnation: String,
    compacted_through: u64,
    summary_seq: u64,
    /// The seq the session's next message gets.
    next_seq: u64,
    messages: Vec<Message>,
    bytes: usize,
    /// The budget `bytes` count against, given back when dropped.
    budget: Arc<Budget>,
}

impl Drop for CachedContext {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

fn approx_bytes(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| {
            let content: usize = m
                .body
                .content
                .iter()
                .map(|b| match b {
                    ContentBlock::Text { text } => text.len(),
                    ContentBlock::Thinking {
                        thinking,
                        signature,
                    } => thinking.len() + signature.len(),
                    ContentBlock::Image { data, mime_type } => data.len() + mime_type.len(),
                    ContentBlock::File {
                        data,
                        mime_type,
                        name,
                    } => data.len() + mime_type.len() + name.len(),
                    ContentBlock::Media(media) => media.approx_bytes(),
                    ContentBlock::ToolCall {
                        id,
                        name,
                        arguments_json,
                    } => id.len() + name.len() + arguments_json.len(),
                    ContentBlock::ToolResult {
                        call_id,
                        name,
                        content,
                        media,
                        ..
                    } => {
                        call_id.len()
                            + name.len()
                            + content.len()
                            + media.iter().map(MediaRef::approx_bytes).sum::<usize>()
                    }
                })
                .sum();
            content + std::mem::size_of::<Message>() + m.body.id.len() + m.body.turn_id.len() + 64
        })
        .sum()
}

impl CachedContext {
    /// Keeps `messages` (the context after a turn whose last stored
    /// message has seq `next_seq - 1`) if it is long enough and fits the
    /// `budget`.
    pub(crate) fn keep(
        budget: &Arc<Budget>,
        session: &Session,
        next_seq: u64,
        messages: Vec<Message>,
    ) -> Option<Self> {
        if messages.len() < MIN_CACHED_MESSAGES {
            return None;
        }
        let bytes = approx_bytes(&messages);
        let before = budget.used.fetch_add(bytes, Ordering::Relaxed);
        let cached = Self {
            created_at: session.created_at,
            incarnation: session.incarnation.clone(),
            compacted_through: session.compacted_through,
            summary_seq: session.summary_seq,
            next_seq,
            messages,
            bytes,
            budget: Arc::clone(budget),
        };
        // Over the budget: dropping it gives the bytes back.
        (before + bytes <= budget.limit).then_some(cached)
    }

    /// The context of a turn whose user message is `user` in `session` (as
    /// read at admission), or `None` when the cache may be stale.
    pub(crate) fn take_for(mut self, session: &Session, user: &Message) -> Option<Vec<Message>> {
        let fresh = self.created_at == session.created_at
            && self.incarnation == session.incarnation
            && self.compacted_through == session.compacted_through
            && self.summary_seq == session.summary_seq
            && self.next_seq == user.seq;
        if !fresh {
            return None;
        }
        let mut messages = std::mem::take(&mut self.messages);
        messages.push(user.clone());
        Some(messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{NewMessage, Role};

    fn session() -> Session {
        Session {
            id: "s".into(),
            owner: "o".into(),
            agent_id: String::new(),
            project_id: String::new(),
            title: String::new(),
            model: String::new(),
            system_prompt: String::new(),
            metadata: Default::default(),
            created_at: SystemTime::UNIX_EPOCH,
            last_active_at: SystemTime::UNIX_EPOCH,
            archived: false,
            last_turn: None,
            message_count: 100,
            next_seq: 101,
            compacted_through: 0,
            summary_seq: 0,
            incarnation: "i1".into(),
            budget: Default::default(),
            spent: Default::default(),
            agent: Default::default(),
        }
    }

    fn messages(n: u64) -> Vec<Message> {
        (1..=n)
            .map(|seq| Message {
                seq,
                body: NewMessage::new("t", Role::User, vec![ContentBlock::text("hi")]),
                compacted: false,
            })
            .collect()
    }

    #[test]
    fn short_contexts_are_not_kept() {
        assert!(CachedContext::keep(&Arc::default(), &session(), 11, messages(10)).is_none());
    }

    #[test]
    fn a_kept_context_is_used_only_for_the_next_seq_of_the_same_session() {
        let s = session();
        let budget = Arc::default();
        let user = Message {
            seq: 101,
            body: NewMessage::new("t2", Role::User, vec![ContentBlock::text("next")]),
            compacted: false,
        };
        let kept = CachedContext::keep(&budget, &s, 101, messages(100)).unwrap();
        let context = kept.take_for(&s, &user).unwrap();
        assert_eq!(context.len(), 101);
        assert_eq!(context.last().unwrap().seq, 101);

        let kept = CachedContext::keep(&budget, &s, 101, messages(100)).unwrap();
        let later = Message {
            seq: 102,
            ..user.clone()
        };
        assert!(
            kept.take_for(&s, &later).is_none(),
            "a message was written in between"
        );

        let kept = CachedContext::keep(&budget, &s, 101, messages(100)).unwrap();
        let mut compacted = s.clone();
        compacted.compacted_through = 50;
        assert!(kept.take_for(&compacted, &user).is_none());

        let kept = CachedContext::keep(&budget, &s, 101, messages(100)).unwrap();
        let mut recreated = s;
        recreated.created_at += std::time::Duration::from_secs(1);
        assert!(kept.take_for(&recreated, &user).is_none());
    }

    /// Records the seqs of every request's messages.
    #[derive(Debug, Default)]
    struct Recorder {
        requests: std::sync::Mutex<Vec<Vec<(u64, Role)>>>,
    }

    #[async_trait::async_trait]
    impl crate::model::ModelProvider for Recorder {
        async fn stream(
            &self,
            request: crate::model::ModelRequest,
        ) -> Result<crate::model::ModelStream, crate::model::ModelError> {
            let seen = request
                .messages
                .iter()
                .map(|m| (m.seq, m.body.role))
                .collect();
            self.requests.lock().unwrap().push(seen);
            let events = [
                Ok(crate::model::ModelEvent::TextDelta("ok".into())),
                Ok(crate::model::ModelEvent::Finished(
                    crate::types::StopReason::Stop,
                )),
            ];
            Ok(Box::pin(futures::stream::iter(events)))
        }
    }

    /// Every request of a long session — cached or read from the store —
    /// holds exactly what the store holds, also across a compaction.
    #[tokio::test]
    async fn cached_contexts_equal_the_store() {
        use futures::StreamExt as _;
        use std::sync::Arc;

        use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
        use crate::store::{MemoryStore, Store};
        use crate::types::{NewSession, Principal};

        let recorder = Arc::new(Recorder::default());
        let mut models = crate::model::Models::with_builtin();
        models.insert(
            "rec",
            Arc::clone(&recorder) as Arc<dyn crate::model::ModelProvider>,
        );
        let store = Arc::new(MemoryStore::new());
        let config = RuntimeConfig {
            default_model: "rec/x".into(),
            ..RuntimeConfig::default()
        };
        let rt = Runtime::open(config, Arc::clone(&store) as Arc<dyn Store>, models)
            .await
            .unwrap();
        let who = Principal::local();
        let session = rt
            .create_session(
                &who,
                NewSession {
                    title: "t".into(),
                    ..NewSession::default()
                },
            )
            .await
            .unwrap()
            .id;
        for turn in 0..45 {
            if turn == 40 {
                let report = rt.compact_session(&who, &session).await.unwrap();
                assert!(report.compacted);
            }
            let input = ChatInput {
                session_id: session.clone(),
                content: vec![ContentBlock::text(format!("turn {turn}"))],
                ..ChatInput::default()
            };
            let mut stream = rt.chat(&who, input).await.unwrap();
            while stream.next().await.is_some() {}
            let s = store.get_session(&session).await.unwrap().unwrap();
            let expected: Vec<(u64, Role)> = {
                let page = store
                    .history(&session, s.compacted_through, 10_000, false)
                    .await
                    .unwrap();
                let summary = page.iter().filter(|m| m.body.role == Role::Summary);
                let tail = page.iter().filter(|m| m.body.role != Role::Summary);
                summary
                    .chain(tail)
                    .map(|m| (m.seq, m.body.role))
                    .filter(|(seq, _)| *seq < s.next_seq - 1) // without the answer
                    .collect()
            };
            let requests = recorder.requests.lock().unwrap();
            assert_eq!(requests.last().unwrap(), &expected, "turn {turn}");
        }
        // The summarizer's request is among them; the last turns ran on
        // summary + tail.
        let requests = recorder.requests.lock().unwrap();
        assert_eq!(requests.last().unwrap()[0].1, Role::Summary);
    }
}
