//! History: pages of a session's messages within a byte budget, and
//! compaction (a summary and the session's new compacted range).

use std::time::SystemTime;

use sled::Tree;
use sled::transaction::{ConflictableTransactionError as TxError, Transactional};

use super::bodies::Bodies;
use super::keys::{body_key_prefix, message_key};
use super::tx::{append_tx, session_as_tx, write_session_tx};
use super::{SledStore, backend, blocking, keep_body};
use crate::store::size::{Budget, message_wire_bytes};
use crate::store::{HistoryQuery, MessagePage, StoreError, check_compaction};
use crate::types::{Message, NewMessage, Session};

impl SledStore {
    pub(super) async fn page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        let Some(scan) = self.history_scan(session_id, query)? else {
            return Ok(MessagePage::default());
        };
        blocking(move || scan.run()).await
    }

    pub(super) fn inline(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Message>, StoreError> {
        let query = HistoryQuery::unbounded(after_seq, limit, false);
        match self.history_scan(session_id, &query)? {
            Some(scan) => Ok(scan.run()?.messages),
            None => Ok(Vec::new()),
        }
    }

    pub(super) async fn compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        let now = SystemTime::now();
        let summary = self.outgoing(session_id, &summary).await?;
        let written = (&self.sessions, &self.activity, &self.messages)
            .transaction(|(s, a, m)| {
                let session = session_as_tx(s, session_id, incarnation)?;
                check_compaction(&session, summary.0, through_seq).map_err(TxError::Abort)?;
                let (mut session, stored) =
                    append_tx(s, a, m, session_id, Some(incarnation), &summary, now)?;
                session.compacted(through_seq, stored.seq);
                write_session_tx(s, &session)?;
                Ok(stored)
            })
            .map_err(|e| self.tx_failed(e))?;
        keep_body(summary);
        self.flush_db().await?;
        Ok(written)
    }

    /// The scan behind [`Store::history`], or `None` when it finds nothing.
    fn history_scan(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<Option<HistoryScan>, StoreError> {
        let Some(first) = query.after_seq.checked_add(1) else {
            return Ok(None);
        };
        if query.limit == 0 || session_id.contains('\0') {
            return Ok(None);
        }
        let Some(session) = self.load_session(session_id)? else {
            return Ok(None);
        };
        Ok(Some(HistoryScan {
            messages: self.messages.clone(),
            bodies: self.bodies.clone(),
            body_keys: body_key_prefix(session_id),
            range: message_key(session_id, first)..=message_key(session_id, u64::MAX),
            session,
            query: *query,
        }))
    }
}

/// One page of a session's messages, read by [`HistoryScan::run`].
struct HistoryScan {
    messages: Tree,
    bodies: Bodies,
    /// Where the reference keys of the session's body files begin.
    body_keys: Vec<u8>,
    range: std::ops::RangeInclusive<Vec<u8>>,
    session: Session,
    query: HistoryQuery,
}

impl HistoryScan {
    /// Reads up to the page's bounds and no further.
    fn run(self) -> Result<MessagePage, StoreError> {
        let mut page = MessagePage::default();
        let mut budget = Budget::new(self.query.max_bytes);
        for entry in self.messages.range(self.range) {
            let (key, raw) = entry.map_err(|e| backend("scan", e))?;
            let mut message = self.bodies.load(&key, &raw, |name| {
                [self.body_keys.as_slice(), name.as_bytes()].concat()
            })?;
            message.compacted = self.session.covers(&message);
            if !self.query.include_compacted && message.compacted {
                continue;
            }
            if !budget.admit(message_wire_bytes(&message)) {
                page.more = true;
                break;
            }
            page.messages.push(message);
            if page.messages.len() == self.query.limit {
                break;
            }
        }
        Ok(page)
    }
}
