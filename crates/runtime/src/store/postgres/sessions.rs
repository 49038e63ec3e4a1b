//! The session registry on PostgreSQL: create, read, list, update,
//! delete, count, title.
//!
//! Listing walks the `sessions_by_activity` index (owner, last_active_ns
//! DESC, id DESC) from the cursor in bounded batches and stops at the first
//! session past the page's count or byte budget.

use std::time::{SystemTime, UNIX_EPOCH};

use super::codec::{self, SessionParams, session_cols};
use super::write::{self, LeaseWrite};
use super::{PostgresStore, quota};
use crate::quota::WriteQuota;
use crate::store::size::{Budget, session_wire_bytes};
use crate::store::{CreateOutcome, ListCursor, ListQuery, SessionPage, StoreError};
use crate::types::{NewSession, Session, SessionUpdate, new_id};

/// Most sessions one listing statement reads.
const LIST_BATCH: usize = 128;

/// How often `create` retries when the id it met is deleted before it
/// could read it.
const CREATE_ATTEMPTS: usize = 3;

impl PostgresStore {
    pub(super) async fn create(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        let id = new.id.clone().unwrap_or_else(new_id);
        let session = new.into_session(id, SystemTime::now());
        if let Some(limit) = quota.limits.sessions {
            return self.create_limited(session, limit).await;
        }
        let params = SessionParams::new(&session)?;
        let client = self.client().await?;
        let sql = concat!(
            "INSERT INTO sessions (",
            session_cols!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20) \
             ON CONFLICT (id) DO NOTHING"
        );
        for _ in 0..CREATE_ATTEMPTS {
            if codec::execute(&client, sql, &params.all()).await? == 1 {
                return Ok(CreateOutcome::Created(session));
            }
            if let Some(existing) = get(&client, &session.id).await? {
                return Ok(CreateOutcome::Existing(existing));
            }
        }
        Err(StoreError::Backend(format!(
            "session {} was created and deleted concurrently {CREATE_ATTEMPTS} times",
            session.id
        )))
    }

    /// [`PostgresStore::create`] under `owner`'s limit of `limit` sessions:
    /// counted and inserted in one transaction under the owner's lock.
    async fn create_limited(
        &self,
        session: Session,
        limit: u64,
    ) -> Result<CreateOutcome, StoreError> {
        let params = SessionParams::new(&session)?;
        let mut client = self.client().await?;
        for _ in 0..CREATE_ATTEMPTS {
            if let Some(existing) = get(&client, &session.id).await? {
                return Ok(CreateOutcome::Existing(existing));
            }
            let tx = write::begin(&mut client).await?;
            quota::lock_owner(&tx, &session.owner).await?;
            quota::check_sessions(&tx, &session.owner, limit).await?;
            let sql = concat!(
                "INSERT INTO sessions (",
                session_cols!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 $17, $18, $19, $20) ON CONFLICT (id) DO NOTHING"
            );
            if codec::execute(&tx, sql, &params.all()).await? == 1 {
                write::commit(tx).await?;
                return Ok(CreateOutcome::Created(session));
            }
            // Created meanwhile: read it after this transaction.
            drop(tx);
        }
        Err(StoreError::Backend(format!(
            "session {} was created and deleted concurrently {CREATE_ATTEMPTS} times",
            session.id
        )))
    }

    pub(super) async fn get(&self, id: &str) -> Result<Option<Session>, StoreError> {
        get(&self.client().await?, id).await
    }

    pub(super) async fn list(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        let mut page = SessionPage::default();
        if query.limit == 0 {
            return Ok(page);
        }
        let mut cursor = match &query.after {
            None => None,
            Some(c) => match codec::nanos(c.last_active_at) {
                Ok(nanos) => Some((nanos, c.id.clone())),
                // Past bigint's range: later than anything stored.
                Err(_) if c.last_active_at > UNIX_EPOCH => None,
                Err(_) => return Ok(page),
            },
        };
        let client = self.client().await?;
        let mut budget = Budget::new(query.max_bytes);
        let agent = query.agent_id.as_deref();
        loop {
            // One more than the page holds, to learn whether another follows.
            let want = (query.limit - page.sessions.len())
                .saturating_add(1)
                .min(LIST_BATCH);
            let limit = codec::big(want as u64)?;
            let rows = match &cursor {
                None => {
                    let sql = concat!(
                        "SELECT ",
                        session_cols!(),
                        " FROM sessions WHERE owner = $1 AND ($2::text IS NULL OR agent_id = $2) \
                         AND ($3::boolean OR NOT archived) \
                         ORDER BY last_active_ns DESC, id DESC LIMIT $4"
                    );
                    codec::rows(
                        &client,
                        sql,
                        &[&owner, &agent, &query.include_archived, &limit],
                    )
                    .await?
                }
                Some((nanos, id)) => {
                    let sql = concat!(
                        "SELECT ",
                        session_cols!(),
                        " FROM sessions WHERE owner = $1 AND ($2::text IS NULL OR agent_id = $2) \
                         AND ($3::boolean OR NOT archived) AND (last_active_ns, id) < ($5, $6) \
                         ORDER BY last_active_ns DESC, id DESC LIMIT $4"
                    );
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                        [&owner, &agent, &query.include_archived, &limit, nanos, id];
                    codec::rows(&client, sql, &params).await?
                }
            };
            let fetched = rows.len();
            for row in rows {
                let session = codec::session(&row)?;
                cursor = Some((codec::nanos(session.last_active_at)?, session.id.clone()));
                if !query.admits(&session) {
                    continue;
                }
                if page.sessions.len() == query.limit || !budget.admit(session_wire_bytes(&session))
                {
                    // One more match exists, so the next page is not empty.
                    page.next = page.sessions.last().map(|last| ListCursor {
                        last_active_at: last.last_active_at,
                        id: last.id.clone(),
                    });
                    return Ok(page);
                }
                page.sessions.push(session);
            }
            if fetched < want {
                return Ok(page);
            }
        }
    }

    pub(super) async fn update(
        &self,
        id: &str,
        update: SessionUpdate,
    ) -> Result<Session, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut session = write::lock(&tx, id)
            .await?
            .ok_or(StoreError::SessionNotFound)?
            .session;
        session.apply(update);
        session.touch(SystemTime::now());
        self.write_session(&tx, &session, LeaseWrite::Keep).await?;
        write::commit(tx).await?;
        Ok(session)
    }

    /// One statement: the session row goes, and its messages and turns
    /// with it (`ON DELETE CASCADE`), the lease too.
    pub(super) async fn delete(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let sql = "DELETE FROM sessions WHERE id = $1 AND ($2::text IS NULL OR incarnation = $2)";
        Ok(codec::execute(&client, sql, &[&id, &incarnation]).await? > 0)
    }

    pub(super) async fn count(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = codec::row(&client, "SELECT count(*) FROM sessions", &[]).await?;
        let count: i64 = row
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| StoreError::Backend(format!("counting sessions: {e}")))?
            .unwrap_or(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    pub(super) async fn title_if_empty(
        &self,
        id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut session = write::lock_as(&tx, id, incarnation).await?.session;
        if !session.set_title_if_empty(title) {
            return Ok(false);
        }
        self.write_session(&tx, &session, LeaseWrite::Keep).await?;
        write::commit(tx).await?;
        Ok(true)
    }
}

/// Session `id`, read without a lock.
pub(super) async fn get<C: deadpool_postgres::GenericClient>(
    client: &C,
    id: &str,
) -> Result<Option<Session>, StoreError> {
    let sql = concat!("SELECT ", session_cols!(), " FROM sessions WHERE id = $1");
    codec::row(client, sql, &[&id])
        .await?
        .map(|row| codec::session(&row))
        .transpose()
}
