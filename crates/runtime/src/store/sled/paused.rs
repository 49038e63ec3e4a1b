//! The paused turns of the sled store and their bounds, in memory: sled
//! has no index by a turn's state, and the runtime looks for paused turns
//! past their bound every few seconds. Filled by start-up recovery (its
//! scan of every turn record finds those left paused, and pauses those a
//! crash left waiting) and kept up to date by every write that pauses,
//! resumes or ends a turn (sled is opened by one process, so nothing else
//! writes).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use crate::types::{TurnRecord, TurnStatus};

/// (session id, turn id) of every paused turn, with its pause's bound.
#[derive(Debug, Default)]
pub(super) struct Paused {
    turns: Mutex<BTreeMap<(String, String), SystemTime>>,
}

impl Paused {
    /// Notes `turn`'s state as just stored.
    pub(super) fn note(&self, turn: &TurnRecord) {
        let key = (turn.session_id.clone(), turn.turn_id.clone());
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        match turn.paused_until() {
            Some(until) if turn.status == TurnStatus::Paused => {
                turns.insert(key, until);
            }
            Some(_) | None => {
                turns.remove(&key);
            }
        }
    }

    /// Forgets a turn found gone (its session deleted).
    pub(super) fn forget(&self, session_id: &str, turn_id: &str) {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns.remove(&(session_id.to_owned(), turn_id.to_owned()));
    }

    /// At most `limit` of those whose bound is at or before `now`, the
    /// longest expired first.
    pub(super) fn expired(&self, now: SystemTime, limit: usize) -> Vec<(String, String)> {
        let turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        let mut expired: Vec<_> = turns.iter().filter(|(_, until)| **until <= now).collect();
        expired.sort_by_key(|(_, until)| **until);
        expired
            .into_iter()
            .take(limit)
            .map(|(key, _)| key.clone())
            .collect()
    }
}
