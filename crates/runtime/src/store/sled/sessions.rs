//! Sessions: created within the owner's quota, listed newest activity
//! first, updated, and deleted with everything stored under them.

use std::ops::Bound;
use std::time::{SystemTime, UNIX_EPOCH};

use sled::transaction::Transactional;
use sled::{Batch, IVec, Tree};

use super::keys::{activity_key, child, index_key, index_nanos};
use super::tx::{load_session, not_found, reindex_tx, session_as_tx, session_tx, write_session_tx};
use super::{
    ACTIVITY, PURGE_BATCH, SESSIONS, SledStore, backend, blocking, decode, printable, usage,
};
use crate::quota::WriteQuota;
use crate::store::size::{Budget, session_wire_bytes};
use crate::store::{CreateOutcome, ListCursor, ListQuery, SessionPage, StoreError};
use crate::types::{NewSession, Session, SessionUpdate, new_id};

impl SledStore {
    pub(super) async fn create(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        let id = new.id.clone().unwrap_or_else(new_id);
        if let Some(existing) = self.load_session(&id)? {
            return Ok(CreateOutcome::Existing(existing));
        }
        if id.contains('\0') || new.owner.contains('\0') {
            let reason = "session id and owner must not contain NUL";
            return Err(StoreError::Backend(reason.to_owned()));
        }
        self.disk.admit()?;
        let guard = self.lifecycle.lock().await;
        // Again under the lock: a concurrent create may have won, and its
        // messages must not be purged as leftovers.
        if let Some(existing) = self.load_session(&id)? {
            return Ok(CreateOutcome::Existing(existing));
        }
        if self.has_children(&id)? {
            tracing::warn!(session_id = %id, "purging leftovers of an interrupted delete");
            self.purge_children(&id).await?;
        }
        let session = new.into_session(id, SystemTime::now());
        let outcome = (&self.sessions, &self.activity, &self.usage)
            .transaction(|(s, a, u)| {
                if let Some(existing) = session_tx(s, &session.id)? {
                    return Ok(CreateOutcome::Existing(existing));
                }
                usage::add_session_tx(u, &session.owner, &quota.limits)?;
                write_session_tx(s, &session)?;
                a.insert(activity_key(&session), IVec::default())?;
                Ok(CreateOutcome::Created(session.clone()))
            })
            .map_err(|e| self.tx_failed(e))?;
        drop(guard);
        if matches!(outcome, CreateOutcome::Created(_)) {
            self.flush_db().await?;
        }
        Ok(outcome)
    }

    pub(super) async fn list(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        let (sessions, activity) = (self.sessions.clone(), self.activity.clone());
        let (owner, query) = (owner.to_owned(), query.clone());
        blocking(move || list_blocking(&sessions, &activity, &owner, &query)).await
    }

    pub(super) async fn update(
        &self,
        id: &str,
        update: SessionUpdate,
    ) -> Result<Session, StoreError> {
        self.disk.admit()?;
        let now = SystemTime::now();
        let session = (&self.sessions, &self.activity)
            .transaction(|(s, a)| {
                let mut session = session_tx(s, id)?.ok_or_else(not_found)?;
                let old_index = activity_key(&session);
                session.apply(update.clone());
                session.touch(now);
                reindex_tx(a, &session, old_index)?;
                write_session_tx(s, &session)?;
                Ok(session)
            })
            .map_err(|e| self.tx_failed(e))?;
        self.flush_db().await?;
        Ok(session)
    }

    pub(super) async fn delete(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        let guard = self.lifecycle.lock().await;
        let removed = (&self.sessions, &self.activity, &self.usage)
            .transaction(|(s, a, u)| {
                let Some(raw) = s.get(id.as_bytes())? else {
                    return Ok(None);
                };
                // A corrupt record must stay deletable; its index entry then
                // dangles, and listing skips it.
                match decode::<Session>(SESSIONS, id.as_bytes(), &raw) {
                    Ok(session) if incarnation.is_some_and(|i| !session.is_incarnation(i)) => {
                        Ok(None)
                    }
                    Ok(session) => {
                        s.remove(id.as_bytes())?;
                        drop(a.remove(activity_key(&session))?);
                        let bytes = usage::remove_session_tx(u, &session.owner, id)?;
                        Ok(Some(Some((session.owner, bytes))))
                    }
                    Err(e) => {
                        tracing::warn!(session_id = %id, error = %e, "deleting a corrupt session record");
                        s.remove(id.as_bytes())?;
                        Ok(Some(None))
                    }
                }
            })
            .map_err(|e| self.tx_failed(e))?;
        if let Some(Some((owner, bytes))) = &removed {
            self.owners.forget(owner, *bytes);
        }
        let removed = removed.is_some();
        if removed {
            self.purge_children(id).await?;
            drop(guard);
            self.flush_db().await?;
        }
        Ok(removed)
    }

    pub(super) async fn title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let set = self
            .sessions
            .transaction(|s| {
                let mut session = session_as_tx(s, session_id, incarnation)?;
                if !session.set_title_if_empty(title) {
                    return Ok(false);
                }
                write_session_tx(s, &session)?;
                Ok(true)
            })
            .map_err(|e| self.tx_failed(e))?;
        if set {
            self.flush_db().await?;
        }
        Ok(set)
    }

    pub(super) async fn count(&self) -> Result<u64, StoreError> {
        let sessions = self.sessions.clone();
        let len = blocking(move || Ok(sessions.len())).await?;
        Ok(u64::try_from(len).unwrap_or(u64::MAX))
    }

    /// Removes messages and turns stored under `id` (see the module doc).
    async fn purge_children(&self, id: &str) -> Result<(), StoreError> {
        let (messages, turns, prefix) = (self.messages.clone(), self.turns.clone(), child(id));
        let inbox = self.inbox.clone();
        let files = self.bodies.clone();
        blocking(move || {
            purge_prefix(&messages, &prefix, |keys| files.forget(&prefix, keys))?;
            purge_prefix(&turns, &prefix, |_| {})?;
            purge_prefix(&inbox, &prefix, |_| {})
        })
        .await
    }

    fn has_children(&self, id: &str) -> Result<bool, StoreError> {
        for tree in [&self.messages, &self.turns, &self.inbox] {
            let first = tree.scan_prefix(child(id)).next().transpose();
            if first.map_err(|e| backend("scan", e))?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn list_blocking(
    sessions: &Tree,
    activity: &Tree,
    owner: &str,
    query: &ListQuery,
) -> Result<SessionPage, StoreError> {
    let mut page = SessionPage::default();
    let mut budget = Budget::new(query.max_bytes);
    if query.limit == 0 || owner.contains('\0') {
        return Ok(page);
    }
    let prefix = child(owner);
    let mut owner_end = owner.as_bytes().to_vec();
    owner_end.push(1);
    let upper = match &query.after {
        None => owner_end,
        Some(cursor) => match cursor.last_active_at.duration_since(UNIX_EPOCH) {
            // Nothing stored is older than the epoch.
            Err(_) => return Ok(page),
            Ok(since) => match u64::try_from(since.as_nanos()) {
                Ok(nanos) => index_key(owner, nanos, &cursor.id),
                Err(_) => owner_end,
            },
        },
    };
    for entry in activity
        .range((Bound::Included(prefix.clone()), Bound::Excluded(upper)))
        .rev()
    {
        let (key, _) = entry.map_err(|e| backend("scan", e))?;
        let corrupt = |reason: &str| StoreError::Corrupt {
            key: printable(ACTIVITY, &key),
            reason: reason.to_owned(),
        };
        let rest = key
            .get(prefix.len()..)
            .ok_or_else(|| corrupt("key outside its prefix"))?;
        let (stamp, id) = rest
            .split_at_checked(8)
            .ok_or_else(|| corrupt("key too short"))?;
        let id = std::str::from_utf8(id).map_err(|_| corrupt("session id is not UTF-8"))?;
        let Some(session) = load_session(sessions, id)? else {
            continue;
        };
        if session.owner != owner || index_nanos(session.last_active_at).to_be_bytes() != stamp {
            tracing::debug!(session_id = %id, "skipping a stale activity index entry");
            continue;
        }
        if !query.admits(&session) {
            continue;
        }
        if page.sessions.len() == query.limit || !budget.admit(session_wire_bytes(&session)) {
            // One more match exists, so the next page is not empty.
            page.next = page.sessions.last().map(|last| ListCursor {
                last_active_at: last.last_active_at,
                id: last.id.clone(),
            });
            break;
        }
        page.sessions.push(session);
    }
    Ok(page)
}

/// Removes every key under `prefix`, in batches; `removed` sees each
/// batch once it is gone.
fn purge_prefix(tree: &Tree, prefix: &[u8], removed: impl Fn(&[IVec])) -> Result<(), StoreError> {
    loop {
        let keys = tree.scan_prefix(prefix).keys().take(PURGE_BATCH);
        let keys = keys
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| backend("scan", e))?;
        if keys.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::default();
        keys.iter().for_each(|key| batch.remove(key));
        tree.apply_batch(batch).map_err(|e| backend("delete", e))?;
        removed(&keys);
    }
}
