//! The inbox: Chats that arrived while their session was busy
//! (`ON_BUSY_ENQUEUE`), kept durably per session until each runs as its own
//! turn, in arrival order.
//!
//! Exactly once: a queued message leaves the inbox only in the store write
//! that begins its turn (`begin_turn` of a [`TurnRecord`] whose
//! `from_inbox` names it — refused when it is gone, so two replicas or a
//! restarted process cannot both run it), or in the write that reports it
//! failed in history ([`Inbox::dequeue`] with a notice), or by
//! [`Inbox::clear`] (a stop that clears the inbox) and with its session.
//!
//! [`TurnRecord`]: crate::types::TurnRecord

use async_trait::async_trait;

use super::StoreError;
use crate::types::{NewMessage, Queued};

/// A session's inbox (see the module doc). Every engine has one.
#[async_trait]
pub trait Inbox: Send + Sync + std::fmt::Debug {
    /// Appends `message` to its session's inbox (the session must be
    /// `message.incarnation`), unless the inbox holds `max` already
    /// (`StoreError::QuotaExceeded` of the inbox quota). Its 1-based
    /// position.
    async fn enqueue(&self, message: Queued, max: u64) -> Result<u64, StoreError>;

    /// The session's queued messages, oldest first (empty for a session
    /// that does not exist).
    async fn queued(&self, session_id: &str) -> Result<Vec<Queued>, StoreError>;

    /// Removes queued message `id` of the session's incarnation, with
    /// `notice` appended to history in the same write (a message that
    /// cannot run is reported there); whether it was still queued.
    async fn dequeue(
        &self,
        session_id: &str,
        incarnation: &str,
        id: &str,
        notice: Option<NewMessage>,
    ) -> Result<bool, StoreError>;

    /// Removes every queued message of the session; how many.
    async fn clear(&self, session_id: &str) -> Result<u64, StoreError>;

    /// Sessions with queued messages (at most `limit`), for start-up and
    /// for taking over a dead replica's queue.
    async fn sessions_with_queued(&self, limit: usize) -> Result<Vec<String>, StoreError>;
}
