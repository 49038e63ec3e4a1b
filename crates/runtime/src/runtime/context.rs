//! A turn's context: what the model is sent — the session's latest summary,
//! then its uncompacted tail (never the whole history) — loaded from the
//! store, or taken from the runner's cache ([`cache`]) when that provably
//! equals the store. Compaction and every turn read it through here.

use crate::compaction;
use crate::store::{Store, StoreError};
use crate::types::{Message, Role, Session};

pub(crate) mod cache;

/// Messages loaded per store call when assembling a context.
const CONTEXT_PAGE: usize = 1_000;
/// Contexts of at most this many messages are read on the calling thread
/// (a few tens of microseconds) instead of a blocking thread's hand-off.
const INLINE_CONTEXT: u64 = 64;

/// A conversation's context: the latest summary and the uncompacted tail
/// (summaries excluded), oldest first.
#[derive(Debug, Default)]
pub(crate) struct Context {
    pub(crate) summary: Option<Message>,
    pub(crate) tail: Vec<Message>,
}

impl Context {
    /// Reads `session`'s context as its record says: the messages after
    /// its `compacted_through` and before its `next_seq` (a turn's user
    /// message, stored meanwhile, is left out), and the summary
    /// `summary_seq`. A short context is read on the calling thread.
    pub(crate) async fn load(store: &dyn Store, session: &Session) -> Result<Self, StoreError> {
        let (id, floor, next) = (&session.id, session.compacted_through, session.next_seq);
        let inline = next.saturating_sub(floor) <= INLINE_CONTEXT;
        let mut context = Self::default();
        let mut after = floor;
        'pages: loop {
            let page = if inline {
                store.history_inline(id, after, CONTEXT_PAGE).await?
            } else {
                store.history(id, after, CONTEXT_PAGE, false).await?
            };
            let full = page.len() == CONTEXT_PAGE;
            if let Some(last) = page.last() {
                after = last.seq;
            }
            for message in page {
                if message.seq >= next {
                    break 'pages;
                }
                context.push(message);
            }
            if !full {
                break;
            }
        }
        let summary_seq = session.summary_seq;
        if context.summary.is_none() && summary_seq > 0 && summary_seq <= floor {
            let found = store.history_inline(id, summary_seq - 1, 1).await?;
            context.summary = found.into_iter().find(|m| m.seq == summary_seq);
        }
        Ok(context)
    }

    /// A context from messages as [`Context::into_messages`] gave them.
    pub(crate) fn from_messages(messages: Vec<Message>) -> Self {
        let mut context = Self::default();
        messages.into_iter().for_each(|m| context.push(m));
        context
    }

    /// Adds the next message (in seq order): a summary replaces the
    /// summary, anything else joins the tail.
    fn push(&mut self, message: Message) {
        if message.body.role == Role::Summary {
            self.summary = Some(message);
        } else {
            self.tail.push(message);
        }
    }

    /// The estimated size when the context must be compacted before the
    /// turn's first model request: over `max_tokens`, with something
    /// before the kept tail to summarise.
    pub(crate) fn over_budget(
        &self,
        system_prompt: Option<&str>,
        config: &compaction::CompactionConfig,
    ) -> Option<u64> {
        let tokens = self.estimate(system_prompt);
        (tokens > config.max_tokens
            && compaction::split_point(&self.tail, config.keep_tail).is_some())
        .then_some(tokens)
    }

    /// The messages sent to the model: the summary first, then the tail.
    pub(crate) fn into_messages(self) -> Vec<Message> {
        let mut out = Vec::with_capacity(self.tail.len() + 1);
        out.extend(self.summary);
        out.extend(self.tail);
        out
    }

    /// The context's estimated size in tokens, with `system_prompt`.
    pub(crate) fn estimate(&self, system_prompt: Option<&str>) -> u64 {
        compaction::estimate_context(system_prompt, self.summary.as_ref(), &self.tail)
    }
}

/// The messages a turn of `session` starts from: its latest summary, then
/// the uncompacted tail. Reads only from the session's `compacted_through`
/// on, so its cost follows the tail, not the whole history.
pub async fn load_context(
    store: &dyn Store,
    session: &Session,
) -> Result<Vec<Message>, StoreError> {
    let context = Context::load(store, session).await?;
    Ok(context.into_messages())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SledStore;
    use crate::types::{ContentBlock, NewMessage, NewSession};

    #[tokio::test]
    async fn a_compacted_long_session_loads_only_summary_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path().join("db")).unwrap();
        let created = store
            .create_session(NewSession {
                owner: "alice".into(),
                ..NewSession::default()
            })
            .await
            .unwrap();
        let crate::store::CreateOutcome::Created(session) = created else {
            panic!("not created")
        };
        let messages = (0..2_000)
            .map(|i| {
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                NewMessage::new("t", role, vec![ContentBlock::text(format!("m{i}"))])
            })
            .collect();
        assert_eq!(
            store.import_messages(&session.id, messages).await.unwrap(),
            2_000
        );
        let session = store.get_session(&session.id).await.unwrap().unwrap();
        assert_eq!(load_context(&store, &session).await.unwrap().len(), 2_000);

        let summary = NewMessage::new("c", Role::Summary, vec![ContentBlock::text("sum")]);
        let stored = store
            .store_compaction(&session.id, &session.incarnation, summary, 1_950)
            .await
            .unwrap();
        let session = store.get_session(&session.id).await.unwrap().unwrap();
        let context = load_context(&store, &session).await.unwrap();
        assert_eq!(context.len(), 51);
        assert_eq!(context[0].seq, stored.seq);
        assert_eq!(context[1].seq, 1_951);
        assert_eq!(context[50].seq, 2_000);
        assert!(context.iter().all(|m| !m.compacted));
    }
}
