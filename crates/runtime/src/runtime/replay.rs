//! Rebuilds the events of a finished turn from the store, for a retried
//! request (idempotency): its stored messages (text and reasoning again,
//! each followed by its `MessageStored`) and its `TurnFinished`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::TurnStream;
use super::turn::TurnEnd;
use crate::error::RuntimeError;
use crate::events::{ErrorCode, EventKind, TurnEvent, TurnOutcome};
use crate::store::Store;
use crate::types::{ContentBlock, Message, Role, TurnRecord, TurnStatus};

/// Messages of one turn are contiguous in history; this bounds the read.
const MAX_TURN_MESSAGES: usize = 10_000;

pub(crate) async fn replay_turn(
    store: &dyn Store,
    record: TurnRecord,
) -> Result<TurnStream, RuntimeError> {
    let events = replay_events(store, &record).await?;
    Ok(TurnStream::replayed(
        record.session_id,
        record.turn_id,
        events,
    ))
}

/// The events of finished turn `record`, rebuilt from the store.
pub(crate) async fn replay_events(
    store: &dyn Store,
    record: &TurnRecord,
) -> Result<Vec<Arc<TurnEvent>>, RuntimeError> {
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
    kinds.extend(stored_events(record, &messages));
    let TurnEnd { outcome, error, .. } = ending(record);
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
    Ok(kinds
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
        .collect())
}

/// The events a finished turn's stored messages stand for: the text and
/// reasoning of its answers, and one `MessageStored` each.
fn stored_events(record: &TurnRecord, messages: &[Message]) -> Vec<EventKind> {
    let mut kinds = Vec::new();
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
    kinds
}

/// How a finished turn ended, from its record.
fn ending(record: &TurnRecord) -> TurnEnd {
    match record.status {
        TurnStatus::Success => TurnEnd::of(TurnOutcome::Success),
        TurnStatus::Canceled => TurnEnd::of(TurnOutcome::Canceled),
        TurnStatus::TimedOut => TurnEnd::of(TurnOutcome::TimedOut),
        TurnStatus::BudgetExceeded => TurnEnd::of(TurnOutcome::BudgetExceeded),
        TurnStatus::Error => TurnEnd::failed(
            ErrorCode::Unavailable,
            record.error.as_deref().unwrap_or("the turn failed"),
        ),
        TurnStatus::Paused => TurnEnd::failed(
            ErrorCode::Unavailable,
            "the turn is paused: it waits for the results or approvals of its pending calls \
             (GetSessionStatus lists them) and resumes once they are answered; Subscribe with \
             wait_for_turn follows it",
        ),
        TurnStatus::Interrupted | TurnStatus::Running => TurnEnd::failed(
            ErrorCode::Unavailable,
            "the turn was interrupted by a server restart; send a new request to try again",
        ),
    }
}
