//! Looking one turn up: its record and the messages it stored, for callers
//! that name a turn after it was admitted (the A2A binding's tasks).

use super::Runtime;
use super::TurnStream;
use crate::error::RuntimeError;
use crate::limits::{MAX_ID_BYTES, check_short, validate_session_id};
use crate::types::{Message, Principal, TurnRecord, TurnStatus};

/// Most messages read for one turn (a turn's messages are contiguous in
/// history, from its user message on).
const MAX_TURN_MESSAGES: usize = 1_000;

/// One turn of a session: its record and its stored messages.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnDetail {
    /// The turn's record (status, times, usage, error).
    pub record: TurnRecord,
    /// The messages the turn stored so far, its user message first
    /// (at most 1,000).
    pub messages: Vec<Message>,
}

impl Runtime {
    /// The turn `turn_id` of one of `who`'s sessions; `None` when the
    /// session has no such turn (another user's session is not found).
    pub async fn turn(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnDetail>, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        check_short("turn_id", turn_id, MAX_ID_BYTES)?;
        let key = self.owned_session(who, session_id).await?.id;
        let session_id = key.as_str();
        let store = &self.inner.store;
        let Some(mut record) = store.get_turn(session_id, turn_id).await? else {
            return Ok(None);
        };
        let after = record.user_message_seq.saturating_sub(1);
        let messages = store
            .history(session_id, after, MAX_TURN_MESSAGES, true)
            .await?
            .into_iter()
            .take_while(|m| m.body.turn_id == record.turn_id)
            .collect();
        record.session_id = super::keys::client_id(&record.session_id).to_owned();
        Ok(Some(TurnDetail { record, messages }))
    }

    /// The events of finished turn `turn_id` of one of `who`'s sessions,
    /// rebuilt from the store (as a retried request's are); `None` while
    /// it still runs, or when there is no such turn. For a watcher that
    /// followed a turn to another replica and arrived after its end.
    pub async fn replay_finished(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnStream>, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        check_short("turn_id", turn_id, MAX_ID_BYTES)?;
        let key = self.owned_session(who, session_id).await?.id;
        let store = self.inner.store.as_ref();
        match store.get_turn(&key, turn_id).await? {
            Some(record) if record.status != TurnStatus::Running => {
                Ok(Some(super::replay::replay_turn(store, record).await?))
            }
            Some(_) | None => Ok(None),
        }
    }
}
