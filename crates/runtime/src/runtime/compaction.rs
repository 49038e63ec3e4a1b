//! Compaction inside the runtime: summarising the older part of a
//! session's context with a model and storing the summary — before a
//! turn's first model step when its context is over the budget (the hook
//! is the turn's, in `turn::compaction`), or now, for a `CompactSession` call.

use super::context::Context;
use super::models::Resolved;
use super::{Inner, Runtime};
use crate::compaction::{self, SummaryError};
use crate::error::RuntimeError;
use crate::store::StoreError;
use crate::types::{ContentBlock, Message, NewMessage, Principal, Role};

/// Largest summariser transcript, in characters per budget token.
const TRANSCRIPT_CHARS_PER_TOKEN: u64 = 4;

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

/// Why a compaction produced no summary.
#[derive(Debug, thiserror::Error)]
pub(super) enum CompactError {
    #[error(transparent)]
    Summary(#[from] SummaryError),
    #[error("the summary could not be stored")]
    Store(#[from] StoreError),
}

/// A stored compaction.
pub(super) struct Compacted {
    pub(super) summary: Message,
    /// Index in the tail of the first message kept.
    pub(super) cut: usize,
}

/// Summarises `context.tail[..cut]` (with the previous summary) and stores
/// the summary. `None` when nothing can be summarised.
pub(super) async fn compact(
    inner: &Inner,
    (session_id, incarnation): (&str, &str),
    context: &Context,
    summariser: &Resolved,
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

/// Messages a summary cutting the tail at `cut` newly covers (the previous
/// summary included).
pub(super) fn covered(context: &Context, cut: usize) -> u64 {
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
        let key = session.id.clone();
        let session_id = key.as_str();
        let slot = inner.slots.claim_compaction(&session)?;
        // A turn live on another replica (a shared store) holds the session
        // as a local one would.
        if let Some(lease) = self.lease_elsewhere(session_id).await? {
            return Err(RuntimeError::SessionBusy {
                turn_id: lease.turn_id,
            });
        }
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
        let summariser = inner.models.summariser(&session)?;
        let report = match compact(
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
        };
        // Messages queued while it ran may go now.
        drop(slot);
        inner.turn_ended(session_id);
        report
    }
}
