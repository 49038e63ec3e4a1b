//! Rebuilds the events of a finished turn from the store, for a retried
//! request (idempotency): its stored messages (text and reasoning again,
//! each followed by its `MessageStored`) and its `TurnFinished`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::TurnStream;
use crate::error::RuntimeError;
use crate::events::{ErrorCode, EventKind, TurnEvent, TurnOutcome};
use crate::store::Store;
use crate::types::{ContentBlock, Role, TurnRecord, TurnStatus};

/// Messages of one turn are contiguous in history; this bounds the read.
const MAX_TURN_MESSAGES: usize = 10_000;

pub(crate) async fn replay_turn(
    store: &dyn Store,
    record: TurnRecord,
) -> Result<TurnStream, RuntimeError> {
    let after = record.user_message_seq.saturating_sub(1);
    let messages = store
        .history(&record.session_id, after, MAX_TURN_MESSAGES, true)
        .await?;
    let at = record.finished_at.unwrap_or(record.started_at);
    let mut kinds = vec![EventKind::TurnStarted {
        model: record.model.clone(),
        thinking: record.thinking,
        user_message_seq: record.user_message_seq,
        system_overridden: record.system_overridden,
    }];
    for m in messages
        .iter()
        .take_while(|m| m.body.turn_id == record.turn_id)
    {
        if m.body.role == Role::Assistant {
            for block in &m.body.content {
                match block {
                    ContentBlock::Thinking { thinking, .. } => {
                        kinds.push(EventKind::Reasoning(thinking.clone()))
                    }
                    ContentBlock::Text { text } => kinds.push(EventKind::Text(text.clone())),
                    _ => {}
                }
            }
        }
        kinds.push(EventKind::MessageStored {
            seq: m.seq,
            id: m.body.id.clone(),
            role: m.body.role,
        });
    }
    let (outcome, error) = match record.status {
        TurnStatus::Success => (TurnOutcome::Success, None),
        TurnStatus::Canceled => (TurnOutcome::Canceled, None),
        TurnStatus::TimedOut => (TurnOutcome::TimedOut, None),
        TurnStatus::Error => (
            TurnOutcome::Error,
            Some((
                ErrorCode::Unavailable,
                record
                    .error
                    .clone()
                    .unwrap_or_else(|| "the turn failed".to_owned()),
            )),
        ),
        TurnStatus::Interrupted | TurnStatus::Running => (
            TurnOutcome::Error,
            Some((
                ErrorCode::Unavailable,
                "the turn was interrupted by a server restart; send a new request to try again"
                    .to_owned(),
            )),
        ),
    };
    if let Some((code, message)) = error {
        kinds.push(EventKind::Error { code, message });
    }
    let duration = record
        .finished_at
        .and_then(|f| f.duration_since(record.started_at).ok())
        .unwrap_or(Duration::ZERO);
    kinds.push(EventKind::TurnFinished {
        outcome,
        cancel_reason: record.cancel_reason,
        usage: record.usage,
        duration,
    });
    let events = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| {
            Arc::new(TurnEvent {
                seq: i as u64 + 1,
                at: if i == 0 {
                    record.started_at
                } else {
                    at.max(SystemTime::UNIX_EPOCH)
                },
                kind,
            })
        })
        .collect();
    Ok(TurnStream::replayed(
        record.session_id,
        record.turn_id,
        events,
    ))
}
