//! A session's history on PostgreSQL: appends, pages, compactions.
//!
//! Pages read the `messages` primary key (session_id, seq) from the first
//! wanted seq on, in batches of at most 256 rows — under a byte budget,
//! batches that start at 16 rows and double — and stop at the first message
//! past the page's count or byte budget: a page of a long history never
//! loads the rest of it.

use std::time::SystemTime;

use super::PostgresStore;
use super::codec;
use super::sessions;
use super::write::{self, LeaseWrite};
use crate::store::size::{Budget, message_wire_bytes};
use crate::store::{HistoryQuery, MessagePage, StoreError};
use crate::types::{Message, NewMessage};

/// The first and the largest batch of a history read.
const FIRST_BATCH: usize = 16;
const MAX_BATCH: usize = 256;

impl PostgresStore {
    pub(super) async fn append(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut locked = write::lock_as(&tx, session_id, incarnation).await?;
        self.check_message_lease(&tx, &locked, &message).await?;
        let stored = write::append(&tx, &mut locked.session, message, SystemTime::now()).await?;
        self.write_session(&tx, &locked.session, LeaseWrite::Keep)
            .await?;
        write::commit(tx).await?;
        Ok(stored)
    }

    pub(super) async fn page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        let mut page = MessagePage::default();
        if query.limit == 0 || query.after_seq == u64::MAX {
            return Ok(page);
        }
        let client = self.client().await?;
        let Some(session) = sessions::get(&client, session_id).await? else {
            return Ok(page);
        };
        // Nothing at or below `compacted_through` is visible without
        // compacted messages: every summary there is an older one.
        let start = if query.include_compacted {
            query.after_seq
        } else {
            query.after_seq.max(session.compacted_through)
        };
        let Ok(mut after) = i64::try_from(start) else {
            return Ok(page);
        };
        let mut budget = Budget::new(query.max_bytes);
        // Without a byte budget the page's size is known: read it at once.
        let mut batch = if query.max_bytes == usize::MAX {
            MAX_BATCH
        } else {
            FIRST_BATCH
        };
        loop {
            let want = (query.limit - page.messages.len()).min(batch);
            let limit = codec::big(want as u64)?;
            let sql = "SELECT seq, record FROM messages WHERE session_id = $1 AND seq > $2 \
                       ORDER BY seq LIMIT $3";
            let rows = codec::rows(&client, sql, &[&session_id, &after, &limit]).await?;
            let fetched = rows.len();
            for row in rows {
                let mut message = codec::message(session_id, &row)?;
                after = codec::big(message.seq)?;
                message.compacted = session.covers(&message);
                if !query.include_compacted && message.compacted {
                    continue;
                }
                if !budget.admit(message_wire_bytes(&message)) {
                    page.more = true;
                    return Ok(page);
                }
                page.messages.push(message);
                if page.messages.len() == query.limit {
                    return Ok(page);
                }
            }
            if fetched < want {
                return Ok(page);
            }
            batch = (batch * 2).min(MAX_BATCH);
        }
    }

    pub(super) async fn compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut locked = write::lock_as(&tx, session_id, incarnation).await?;
        crate::store::check_compaction(&locked.session, &summary, through_seq)?;
        self.check_message_lease(&tx, &locked, &summary).await?;
        let stored = write::append(&tx, &mut locked.session, summary, SystemTime::now()).await?;
        locked.session.compacted(through_seq, stored.seq);
        self.write_session(&tx, &locked.session, LeaseWrite::Keep)
            .await?;
        write::commit(tx).await?;
        Ok(stored)
    }
}
