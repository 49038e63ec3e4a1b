//! Compaction inside the runtime: loading a turn's context (the latest
//! summary and the uncompacted tail, never the whole history), compacting
//! it before the first model step when it is over the budget (with
//! `compaction` events and the truncation fallback), and the
//! `CompactSession` call.

use std::sync::Arc;

use super::turn::{Emitter, Turn};
use super::{Inner, Runtime, lock};
use crate::compaction::{self, SummaryError};
use crate::error::RuntimeError;
use crate::events::{Compaction, CompactionStatus, EventKind};
use crate::model::ModelProvider;
use crate::store::{Store, StoreError};
use crate::types::{ContentBlock, Message, NewMessage, Principal, Role, Session};

/// Messages loaded per store call when assembling a context.
const CONTEXT_PAGE: usize = 1_000;
/// Contexts of at most this many messages are read on the calling thread
/// (a few tens of microseconds) instead of a blocking thread's hand-off.
const INLINE_CONTEXT: u64 = 64;
/// Largest summariser transcript, in characters per budget token.
const TRANSCRIPT_CHARS_PER_TOKEN: u64 = 4;

/// A model resolved for summaries (the configured fast model).
#[derive(Debug, Clone)]
pub(crate) struct FastModel {
    pub(crate) provider: Arc<dyn ModelProvider>,
    pub(crate) provider_model: String,
    pub(crate) name: String,
}

/// What [`Runtime::compact_session`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// False when there was nothing to summarise (a single user turn).
    pub compacted: bool,
    /// Estimated context tokens before.
    pub tokens_before: u64,
    /// Estimated context tokens after (equal to before when nothing was
    /// compacted).
    pub tokens_after: u64,
    /// The new summary's seq (0 when nothing was compacted).
    pub summary_seq: u64,
    /// Messages the new summary covers that no summary covered before.
    pub messages_compacted: u64,
}

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

    fn estimate(&self, system_prompt: Option<&str>) -> u64 {
        compaction::estimate_context(system_prompt, self.summary.as_ref(), &self.tail)
    }
}

/// The messages a turn of `session` starts from: its latest summary, then
/// the uncompacted tail. Reads only from the session's `compacted_through`
/// on, so its cost follows the tail, not the whole history.
pub async fn load_context(
    store: &dyn Store,
    session: &crate::types::Session,
) -> Result<Vec<Message>, StoreError> {
    let context = Context::load(store, session).await?;
    Ok(context.into_messages())
}

/// Why a compaction produced no summary.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CompactError {
    #[error(transparent)]
    Summary(#[from] SummaryError),
    #[error("the summary could not be stored")]
    Store(#[from] StoreError),
}

/// A stored compaction.
struct Compacted {
    summary: Message,
    /// Index in the tail of the first message kept.
    cut: usize,
}

/// Summarises `context.tail[..cut]` (with the previous summary) and stores
/// the summary. `None` when nothing can be summarised.
async fn compact(
    inner: &Inner,
    (session_id, incarnation): (&str, &str),
    context: &Context,
    summariser: &FastModel,
) -> Result<Option<Compacted>, CompactError> {
    let config = &inner.config.compaction;
    let Some(cut) = compaction::split_point(&context.tail, config.keep_tail) else {
        return Ok(None);
    };
    let max_chars = config
        .max_tokens
        .saturating_mul(TRANSCRIPT_CHARS_PER_TOKEN)
        .try_into()
        .unwrap_or(usize::MAX);
    let transcript =
        compaction::transcript(context.summary.as_ref(), &context.tail[..cut], max_chars);
    let (text, usage) = compaction::summarise(
        summariser.provider.as_ref(),
        &summariser.provider_model,
        transcript,
        config.timeout,
    )
    .await?;
    let mut message = NewMessage::new("compaction", Role::Summary, vec![ContentBlock::text(text)]);
    message.model = Some(summariser.name.clone());
    message.usage = usage;
    let through = context.tail[cut].seq - 1;
    let summary = inner
        .store
        .store_compaction(session_id, incarnation, message, through)
        .await?;
    Ok(Some(Compacted { summary, cut }))
}

impl Turn {
    /// Compacts the turn's loaded `context`, found
    /// [over the budget](Context::over_budget) at `tokens_before` (events:
    /// `compaction` STARTED, the summary's `message_stored`, COMPLETED — or
    /// FAILED and a truncated context), and returns what the model is sent.
    pub(super) async fn compact_context(
        &mut self,
        mut context: Context,
        tokens_before: u64,
        emitter: &mut Emitter,
    ) -> Vec<Message> {
        let (session_id, incarnation) = (
            self.record.session_id.clone(),
            self.record.incarnation.clone(),
        );
        let system = self.system_prompt.as_deref();
        let max_tokens = self.inner.config.compaction.max_tokens;
        emitter
            .emit(compaction_event(CompactionStatus::Started, tokens_before))
            .await;
        let summariser = self.inner.fast.clone().unwrap_or_else(|| FastModel {
            provider: Arc::clone(&self.runner.provider),
            provider_model: self.runner.provider_model.clone(),
            name: self.runner.key.model.clone(),
        });
        let cancel = self.live.cancel.clone();
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => Err("the turn was cancelled".to_owned()),
            () = super::turn::until(self.deadline) => Err("the turn reached its time limit".to_owned()),
            r = compact(&self.inner, (&session_id, &incarnation), &context, &summariser) => r.map_err(|e| e.to_string()),
        };
        match outcome {
            Ok(Some(done)) => {
                let newly = covered(&context, done.cut);
                context.tail.drain(..done.cut);
                context.summary = Some(done.summary.clone());
                let tokens_after = context.estimate(system);
                emitter
                    .emit(EventKind::MessageStored {
                        seq: done.summary.seq,
                        id: done.summary.body.id.clone(),
                        role: Role::Summary,
                    })
                    .await;
                emitter
                    .emit(EventKind::Compaction(Box::new(Compaction {
                        status: CompactionStatus::Completed,
                        tokens_before,
                        tokens_after,
                        summary_seq: done.summary.seq,
                        messages_compacted: newly,
                        message: String::new(),
                    })))
                    .await;
            }
            Ok(None) => {}
            Err(why) => {
                tracing::warn!(reason = %why, "compaction failed; truncating the context");
                let fixed = compaction::estimate_context(system, context.summary.as_ref(), &[]);
                let cut = compaction::truncation_point(&context.tail, fixed, max_tokens);
                context.tail.drain(..cut);
                let tokens_after = context.estimate(system);
                emitter
                    .emit(EventKind::Compaction(Box::new(Compaction {
                        status: CompactionStatus::Failed,
                        tokens_before,
                        tokens_after,
                        summary_seq: 0,
                        messages_compacted: 0,
                        message: format!("{why}; this turn runs on a truncated context"),
                    })))
                    .await;
            }
        }
        context.into_messages()
    }
}

fn compaction_event(status: CompactionStatus, tokens_before: u64) -> EventKind {
    EventKind::Compaction(Box::new(Compaction {
        status,
        tokens_before,
        tokens_after: 0,
        summary_seq: 0,
        messages_compacted: 0,
        message: String::new(),
    }))
}

/// Messages a summary cutting the tail at `cut` newly covers (the previous
/// summary included).
fn covered(context: &Context, cut: usize) -> u64 {
    u64::try_from(cut).unwrap_or(u64::MAX) + u64::from(context.summary.is_some())
}

impl Runtime {
    /// Compacts the session now, whatever its size, keeping the last
    /// `keep_tail` user turns (fewer when that leaves nothing to
    /// summarise). While it runs the session is busy: `Chat` is rejected.
    /// `SessionBusy` when a turn is live.
    #[tracing::instrument(name = "compaction", skip_all, fields(otel.name = "agentrt.compaction"))]
    pub async fn compact_session(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<CompactionReport, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let inner = &self.inner;
        inner.lifecycle.admitting()?;
        let session = self.owned_session(who, session_id).await?;
        let _slot = inner.slots.claim_compaction(&session)?;
        // Re-read under the slot: a turn may have ended (and compacted)
        // between the first read and taking the slot.
        let session = inner
            .store
            .get_session(session_id)
            .await?
            .filter(|s| s.owner == session.owner && s.incarnation == session.incarnation)
            .ok_or(RuntimeError::SessionNotFound)?;
        let system = (!session.system_prompt.is_empty()).then_some(session.system_prompt.as_str());
        let mut context = Context::load(inner.store.as_ref(), &session).await?;
        let tokens_before = context.estimate(system);
        let summariser = match inner.fast.clone() {
            Some(fast) => fast,
            None => {
                let model = if session.model.is_empty() {
                    lock(&inner.defaults).model.clone()
                } else {
                    session.model.clone()
                };
                let (provider, provider_model) = inner
                    .models
                    .resolve(&model)
                    .map_err(|e| RuntimeError::unknown_model("session.model", &e))?;
                FastModel {
                    provider,
                    provider_model,
                    name: model,
                }
            }
        };
        match compact(
            inner,
            (session_id, &session.incarnation),
            &context,
            &summariser,
        )
        .await
        {
            Ok(Some(done)) => {
                let messages_compacted = covered(&context, done.cut);
                context.tail.drain(..done.cut);
                let summary_seq = done.summary.seq;
                context.summary = Some(done.summary);
                Ok(CompactionReport {
                    compacted: true,
                    tokens_before,
                    tokens_after: context.estimate(system),
                    summary_seq,
                    messages_compacted,
                })
            }
            Ok(None) => Ok(CompactionReport {
                compacted: false,
                tokens_before,
                tokens_after: tokens_before,
                ..CompactionReport::default()
            }),
            Err(CompactError::Store(e)) => Err(e.into()),
            Err(CompactError::Summary(e)) => Err(RuntimeError::CompactionFailed(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SledStore;
    use crate::types::NewSession;

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
