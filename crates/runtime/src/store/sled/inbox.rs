//! The `inbox` tree: session id `\0` queued id → [`Queued`] (see
//! `store/inbox.rs`). Queued ids are UUIDv7, so a session's prefix is in
//! arrival order. Enqueues are serialised in the process (sled is opened by
//! one) so the count checked against the bound is the count written to.

use std::time::SystemTime;

use async_trait::async_trait;
use sled::transaction::{ConflictableTransactionError as TxError, Transactional};

use super::keys::{child, inbox_key};
use super::tx::{append_tx, session_as_tx, write_session_tx};
use super::{INBOX, SledStore, backend, blocking, decode, keep_body};
use crate::quota::{Quota, QuotaLimits};
use crate::store::record::encode;
use crate::store::{Inbox, StoreError};
use crate::types::{NewMessage, Queued};

impl SledStore {
    /// How many messages the session has queued.
    async fn queued_count(&self, session_id: &str) -> Result<u64, StoreError> {
        let (inbox, prefix) = (self.inbox.clone(), child(session_id));
        blocking(move || {
            let mut count = 0u64;
            for key in inbox.scan_prefix(&prefix).keys() {
                key.map_err(|e| backend("scan", e))?;
                count = count.saturating_add(1);
            }
            Ok(count)
        })
        .await
    }
}

#[async_trait]
impl Inbox for SledStore {
    async fn enqueue(&self, message: Queued, max: u64) -> Result<u64, StoreError> {
        self.disk.admit()?;
        let started = std::time::Instant::now();
        let _serial = self.enqueues.lock().await;
        let held = self.queued_count(&message.session_id).await?;
        QuotaLimits::check(Quota::Inbox, Some(max), held, 1).map_err(StoreError::QuotaExceeded)?;
        let key = inbox_key(&message.session_id, &message.id);
        let value = encode(&message)?;
        (&self.sessions, &self.inbox)
            .transaction(|(s, i)| {
                session_as_tx(s, &message.session_id, &message.incarnation)?;
                i.insert(key.as_slice(), value.as_slice())?;
                Ok(())
            })
            .map_err(|e| self.tx_failed(e))?;
        self.durable_write(started).await?;
        Ok(held + 1)
    }

    async fn queued(&self, session_id: &str) -> Result<Vec<Queued>, StoreError> {
        if !self.session_exists(session_id)? {
            return Ok(Vec::new());
        }
        let (inbox, prefix) = (self.inbox.clone(), child(session_id));
        blocking(move || {
            let mut queued = Vec::new();
            for entry in inbox.scan_prefix(&prefix) {
                let (key, raw) = entry.map_err(|e| backend("scan", e))?;
                queued.push(decode(INBOX, &key, &raw)?);
            }
            Ok(queued)
        })
        .await
    }

    async fn dequeue(
        &self,
        session_id: &str,
        incarnation: &str,
        id: &str,
        notice: Option<NewMessage>,
    ) -> Result<bool, StoreError> {
        let started = std::time::Instant::now();
        let now = SystemTime::now();
        let notice = match &notice {
            Some(message) => Some(self.outgoing(session_id, message).await?),
            None => None,
        };
        let key = inbox_key(session_id, id);
        let trees = (&self.sessions, &self.activity, &self.messages, &self.inbox);
        let removed = trees
            .transaction(|(s, a, m, i)| {
                if i.get(key.as_slice())?.is_none() {
                    session_as_tx(s, session_id, incarnation)?;
                    return Ok(false);
                }
                match &notice {
                    Some(message) => {
                        let (session, _) =
                            append_tx(s, a, m, session_id, Some(incarnation), message, now)?;
                        write_session_tx(s, &session)?;
                    }
                    None => drop(session_as_tx(s, session_id, incarnation)?),
                }
                i.remove(key.as_slice())?;
                Ok::<_, TxError<StoreError>>(true)
            })
            .map_err(|e| self.tx_failed(e))?;
        notice.into_iter().for_each(keep_body);
        if removed {
            self.durable_write(started).await?;
        }
        Ok(removed)
    }

    async fn clear(&self, session_id: &str) -> Result<u64, StoreError> {
        let (inbox, prefix) = (self.inbox.clone(), child(session_id));
        let cleared = blocking(move || {
            let mut cleared = 0u64;
            for key in inbox.scan_prefix(&prefix).keys() {
                let key = key.map_err(|e| backend("scan", e))?;
                if inbox
                    .remove(&key)
                    .map_err(|e| backend("remove", e))?
                    .is_some()
                {
                    cleared = cleared.saturating_add(1);
                }
            }
            Ok(cleared)
        })
        .await?;
        if cleared > 0 {
            self.flush_db().await?;
        }
        Ok(cleared)
    }

    async fn sessions_with_queued(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let inbox = self.inbox.clone();
        blocking(move || {
            let mut sessions: Vec<String> = Vec::new();
            for key in inbox.iter().keys() {
                if sessions.len() >= limit {
                    break;
                }
                let key = key.map_err(|e| backend("scan", e))?;
                let Some(end) = key.iter().position(|b| *b == 0) else {
                    continue;
                };
                let id = String::from_utf8_lossy(&key[..end]).into_owned();
                if sessions.last() != Some(&id) {
                    sessions.push(id);
                }
            }
            Ok(sessions)
        })
        .await
    }
}
