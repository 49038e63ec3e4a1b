//! The pre-turn compaction hook: a turn whose loaded context is over the
//! budget compacts it before its first model step, telling the caller with
//! `compaction` events, and runs on a truncated context when compaction
//! fails.

use super::emitter::Emitter;
use super::{Turn, until};
use crate::compaction;
use crate::events::{Compaction, CompactionStatus, EventKind};
use crate::runtime::compaction::{compact, covered};
use crate::runtime::context::Context;
use crate::types::{Message, Role};

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
        let summariser = self
            .inner
            .models
            .fast()
            .cloned()
            .unwrap_or_else(|| self.runner.model.clone());
        let cancel = self.live.cancel.clone();
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => Err("the turn was cancelled".to_owned()),
            () = until(self.deadline) => Err("the turn reached its time limit".to_owned()),
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
