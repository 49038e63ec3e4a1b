//! The in-memory [`Store`], for tests: the semantics of the sled store
//! without durability. What each write does to a session record is the
//! domain types' rules (`types/session.rs`), shared with the sled store.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;

use super::size::{Budget, message_wire_bytes, session_wire_bytes};
use super::{
    AgentStore, CreateOutcome, HistoryQuery, Inbox, Leases, ListCursor, ListQuery, MessagePage,
    SessionPage, Store, StoreError, seq_exhausted,
};
use crate::agents::{AgentVersion, Memory};
use crate::quota::{Quota, QuotaLimits, WriteQuota};
use crate::store::stored_bytes;
use crate::types::{
    Message, NewMessage, NewSession, Queued, Session, SessionUpdate, TurnRecord, TurnStatus, new_id,
};

/// A [`Store`] that keeps everything in memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    sessions: Mutex<BTreeMap<String, Entry>>,
    /// Agent versions by id, then version.
    agents: Mutex<BTreeMap<String, BTreeMap<u64, AgentVersion>>>,
    /// Memory blocks by (owner, agent).
    memory: Mutex<BTreeMap<(String, String), Memory>>,
    /// Tests: `begin_turn` fails while set.
    #[cfg(test)]
    pub(crate) fail_begin_turn: std::sync::atomic::AtomicBool,
}

/// A session with everything that belongs to it, so deletion is one removal.
#[derive(Debug)]
struct Entry {
    session: Session,
    messages: BTreeMap<u64, Message>,
    turns: BTreeMap<String, TurnRecord>,
    /// Bytes of the user messages stored (the `stored_bytes` quota's count).
    user_bytes: u64,
    /// Queued messages by id (arrival order).
    inbox: BTreeMap<String, Queued>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        // Every mutation below is applied to a fully built value at once, so
        // a panic elsewhere cannot leave an entry half-updated.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn mark_compacted(&self, session_id: &str, seq: u64) {
        let mut sessions = self.lock();
        let entry = sessions.get_mut(session_id).expect("session exists");
        entry
            .messages
            .get_mut(&seq)
            .expect("message exists")
            .compacted = true;
    }
}

impl Entry {
    fn append(&mut self, new: NewMessage, now: SystemTime) -> Result<Message, StoreError> {
        let message = self.session.append(new, now).ok_or_else(seq_exhausted)?;
        self.messages.insert(message.seq, message.clone());
        Ok(message)
    }
}

/// The entry of session `id` if it exists as `incarnation`.
fn entry_as<'a>(
    sessions: &'a mut BTreeMap<String, Entry>,
    id: &str,
    incarnation: &str,
) -> Result<&'a mut Entry, StoreError> {
    sessions
        .get_mut(id)
        .filter(|e| e.session.is_incarnation(incarnation))
        .ok_or(StoreError::SessionNotFound)
}

/// The listing order: newest activity first, ties by id descending.
fn order_key(session: &Session) -> (SystemTime, &str) {
    (session.last_active_at, &session.id)
}

#[async_trait]
impl Store for MemoryStore {
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError> {
        self.create_session_within(new, &WriteQuota::default())
            .await
    }

    async fn create_session_within(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        let id = new.id.clone().unwrap_or_else(new_id);
        let mut sessions = self.lock();
        if let Some(entry) = sessions.get(&id) {
            return Ok(CreateOutcome::Existing(entry.session.clone()));
        }
        if let Some(limit) = quota.limits.sessions {
            let held = sessions
                .values()
                .filter(|e| e.session.owner == new.owner)
                .count() as u64;
            QuotaLimits::check(Quota::Sessions, Some(limit), held, 1)
                .map_err(StoreError::QuotaExceeded)?;
        }
        let session = new.into_session(id.clone(), SystemTime::now());
        let entry = Entry {
            session: session.clone(),
            messages: BTreeMap::new(),
            turns: BTreeMap::new(),
            user_bytes: 0,
            inbox: BTreeMap::new(),
        };
        sessions.insert(id, entry);
        Ok(CreateOutcome::Created(session))
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        Ok(self.lock().get(id).map(|e| e.session.clone()))
    }

    async fn list_sessions(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        let sessions = self.lock();
        let mut matching: Vec<&Session> = sessions
            .values()
            .map(|e| &e.session)
            .filter(|s| s.owner == owner && query.admits(s))
            .filter(|s| {
                query
                    .after
                    .as_ref()
                    .is_none_or(|c| order_key(s) < (c.last_active_at, c.id.as_str()))
            })
            .collect();
        matching.sort_by(|a, b| order_key(b).cmp(&order_key(a)));
        let mut page = SessionPage::default();
        if query.limit == 0 {
            return Ok(page);
        }
        let mut budget = Budget::new(query.max_bytes);
        for session in matching {
            if page.sessions.len() == query.limit || !budget.admit(session_wire_bytes(session)) {
                // One more match exists, so the next page is not empty.
                page.next = page.sessions.last().map(|last| ListCursor {
                    last_active_at: last.last_active_at,
                    id: last.id.clone(),
                });
                break;
            }
            page.sessions.push(session.clone());
        }
        Ok(page)
    }

    async fn update_session(&self, id: &str, update: SessionUpdate) -> Result<Session, StoreError> {
        let mut sessions = self.lock();
        let entry = sessions.get_mut(id).ok_or(StoreError::SessionNotFound)?;
        let mut session = entry.session.clone();
        session.apply(update);
        session.touch(SystemTime::now());
        entry.session = session.clone();
        Ok(session)
    }

    async fn delete_session(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut sessions = self.lock();
        let matches = sessions
            .get(id)
            .is_some_and(|e| incarnation.is_none_or(|i| e.session.is_incarnation(i)));
        Ok(matches && sessions.remove(id).is_some())
    }

    async fn begin_turn(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.begin_turn_within(turn, user_message, &WriteQuota::default())
            .await
    }

    async fn begin_turn_within(
        &self,
        mut turn: TurnRecord,
        user_message: NewMessage,
        quota: &WriteQuota,
    ) -> Result<Message, StoreError> {
        #[cfg(test)]
        if self
            .fail_begin_turn
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(StoreError::Backend("injected failure".to_owned()));
        }
        let mut sessions = self.lock();
        let owner = entry_as(&mut sessions, &turn.session_id, &turn.incarnation)?
            .session
            .owner
            .clone();
        if let Some(limit) = quota.limits.stored_bytes {
            let used: u64 = sessions
                .values()
                .filter(|e| e.session.owner == owner)
                .map(|e| e.user_bytes)
                .sum();
            let adding = stored_bytes(&user_message);
            QuotaLimits::check(Quota::StoredBytes, Some(limit), used, adding)
                .map_err(StoreError::QuotaExceeded)?;
        }
        let entry = entry_as(&mut sessions, &turn.session_id, &turn.incarnation)?;
        crate::store::not_paused(&entry.session)?;
        if let Some(id) = &turn.from_inbox
            && !entry.inbox.contains_key(id)
        {
            return Err(StoreError::NotQueued { id: id.clone() });
        }
        let message = entry.append(user_message, SystemTime::now())?;
        if let Some(id) = &turn.from_inbox {
            entry.inbox.remove(id);
        }
        entry.user_bytes += stored_bytes(&message.body);
        turn.user_message_seq = message.seq;
        entry.session.begin_turn(&turn);
        entry.turns.insert(turn.turn_id.clone(), turn);
        Ok(message)
    }

    async fn append_message(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, session_id, incarnation)?;
        entry.append(message, SystemTime::now())
    }

    async fn finish_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, &turn.session_id, &turn.incarnation)?;
        let before = entry.turns.get(&turn.turn_id);
        entry.session.spend(before, &turn);
        entry.session.finish_turn(&turn);
        entry.turns.insert(turn.turn_id.clone(), turn);
        Ok(())
    }

    async fn update_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, &turn.session_id, &turn.incarnation)?;
        entry.turns.insert(turn.turn_id.clone(), turn);
        Ok(())
    }

    async fn resume_turn(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, session_id, incarnation)?;
        let turn = entry
            .turns
            .get_mut(turn_id)
            .filter(|t| t.status == TurnStatus::Paused)
            .ok_or_else(|| StoreError::NotPaused {
                turn_id: turn_id.to_owned(),
            })?;
        turn.status = TurnStatus::Running;
        let turn = turn.clone();
        entry.session.begin_turn(&turn);
        Ok(turn)
    }

    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let sessions = self.lock();
        Ok(sessions
            .get(session_id)
            .and_then(|e| e.turns.get(turn_id))
            .cloned())
    }

    async fn list_turns(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let sessions = self.lock();
        let Some(entry) = sessions.get(session_id) else {
            return Ok(Vec::new());
        };
        let newer = |id: &&String| before.is_none_or(|b| id.as_str() < b);
        Ok(entry
            .turns
            .iter()
            .rev()
            .filter(|(id, _)| newer(id))
            .take(limit)
            .map(|(_, turn)| turn.clone())
            .collect())
    }

    async fn count_turns(&self, session_id: &str) -> Result<u64, StoreError> {
        let sessions = self.lock();
        Ok(sessions
            .get(session_id)
            .map_or(0, |e| u64::try_from(e.turns.len()).unwrap_or(u64::MAX)))
    }

    async fn find_turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let sessions = self.lock();
        Ok(sessions
            .get(session_id)
            .and_then(|e| e.turns.values().find(|t| t.started_by(request_id)).cloned()))
    }

    async fn history_page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        let sessions = self.lock();
        let mut page = MessagePage::default();
        let Some(entry) = sessions.get(session_id) else {
            return Ok(page);
        };
        let Some(first) = query.after_seq.checked_add(1) else {
            return Ok(page);
        };
        if query.limit == 0 {
            return Ok(page);
        }
        let session = &entry.session;
        let mut budget = Budget::new(query.max_bytes);
        let visible = entry
            .messages
            .range(first..)
            .map(|(_, m)| m)
            .filter(|m| query.include_compacted || !session.covers(m));
        for m in visible {
            if !budget.admit(message_wire_bytes(m)) {
                page.more = true;
                break;
            }
            page.messages.push(Message {
                compacted: session.covers(m),
                ..m.clone()
            });
            if page.messages.len() == query.limit {
                break;
            }
        }
        Ok(page)
    }

    async fn store_compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, session_id, incarnation)?;
        super::check_compaction(&entry.session, &summary, through_seq)?;
        let stored = entry.append(summary, SystemTime::now())?;
        entry.session.compacted(through_seq, stored.seq);
        Ok(stored)
    }

    async fn set_title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, session_id, incarnation)?;
        Ok(entry.session.set_title_if_empty(title))
    }

    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError> {
        let now = SystemTime::now();
        let mut sessions = self.lock();
        let mut changed = Vec::new();
        for entry in sessions.values_mut() {
            for turn in entry.turns.values_mut() {
                if turn.interrupt(now) {
                    entry.session.recover_turn(turn);
                    changed.push(turn.clone());
                }
            }
        }
        Ok(changed)
    }

    async fn expired_pauses(
        &self,
        now: SystemTime,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let sessions = self.lock();
        let mut expired: Vec<TurnRecord> = sessions
            .values()
            .flat_map(|e| e.turns.values())
            .filter(|t| {
                t.status == TurnStatus::Paused && t.paused_until().is_some_and(|u| u <= now)
            })
            .cloned()
            .collect();
        expired.sort_by_key(TurnRecord::paused_until);
        expired.truncate(limit);
        Ok(expired)
    }

    /// Summed from the owner's stored turn records (a test double's store:
    /// a deleted session's turns no longer count).
    async fn daily_spent(
        &self,
        owner: &str,
        day: u64,
    ) -> Result<crate::quota::DailySpent, StoreError> {
        let sessions = self.lock();
        let ended_on = |t: &&TurnRecord| {
            t.status.is_final()
                && t.finished_at
                    .is_some_and(|at| crate::quota::day_window(at).0 == day)
        };
        Ok(sessions
            .values()
            .filter(|e| e.session.owner == owner)
            .flat_map(|e| e.turns.values())
            .filter(ended_on)
            .fold(crate::quota::DailySpent::default(), |sum, t| {
                let turn = crate::quota::DailySpent::of(t);
                sum.plus(turn.tokens, turn.cost_nano_usd)
            }))
    }

    async fn count_sessions(&self) -> Result<u64, StoreError> {
        Ok(self.lock().len() as u64)
    }

    async fn sessions_of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<super::AgentSessions, StoreError> {
        use std::ops::Bound;
        let sessions = self.lock();
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut page = super::AgentSessions::default();
        let of_agent = sessions
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(_, e)| &e.session)
            .filter(|s| s.agent_id == agent_id);
        for session in of_agent {
            if page.sessions.len() == limit {
                page.next = page.sessions.last().map(|s| s.id.clone());
                break;
            }
            page.sessions.push(session.clone());
        }
        Ok(page)
    }

    /// Nothing beyond the sessions: a test double's quota counts and daily
    /// spending are summed from the sessions themselves.
    async fn forget_owner(&self, _owner: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn leases(&self) -> Option<&dyn Leases> {
        None
    }

    fn cluster(&self) -> Option<&dyn super::cluster::Cluster> {
        None
    }

    fn inbox(&self) -> &dyn Inbox {
        self
    }

    fn agents(&self) -> &dyn AgentStore {
        self
    }
}

#[async_trait]
impl AgentStore for MemoryStore {
    async fn put_agent(&self, agent: &AgentVersion) -> Result<bool, StoreError> {
        let mut agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        let versions = agents.entry(agent.id.clone()).or_default();
        let latest = versions.keys().next_back().copied().unwrap_or(0);
        if agent.version != latest + 1 {
            return Ok(false);
        }
        versions.insert(agent.version, agent.clone());
        Ok(true)
    }

    async fn get_agent(
        &self,
        id: &str,
        version: Option<u64>,
    ) -> Result<Option<AgentVersion>, StoreError> {
        let agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        let Some(versions) = agents.get(id) else {
            return Ok(None);
        };
        Ok(match version {
            Some(v) => versions.get(&v).cloned(),
            None => versions.values().next_back().cloned(),
        })
    }

    async fn list_agents(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AgentVersion>, StoreError> {
        let agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        Ok(agents
            .iter()
            .filter(|(id, _)| after.is_none_or(|a| id.as_str() > a))
            .filter_map(|(_, versions)| versions.values().next_back().cloned())
            .take(limit)
            .collect())
    }

    async fn get_memory(&self, owner: &str, agent: &str) -> Result<Memory, StoreError> {
        let memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        Ok(memory
            .get(&(owner.to_owned(), agent.to_owned()))
            .cloned()
            .unwrap_or_default())
    }

    async fn put_memory(
        &self,
        owner: &str,
        agent: &str,
        new: &Memory,
        expected: u64,
    ) -> Result<bool, StoreError> {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let key = (owner.to_owned(), agent.to_owned());
        if memory.get(&key).map_or(0, |m| m.version) != expected {
            return Ok(false);
        }
        memory.insert(key, new.clone());
        Ok(true)
    }

    async fn delete_memory(&self, owner: &str, agent: Option<&str>) -> Result<u64, StoreError> {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let before = memory.len();
        memory.retain(|(o, a), _| o != owner || agent.is_some_and(|agent| agent != a));
        Ok(u64::try_from(before - memory.len()).unwrap_or(u64::MAX))
    }

    async fn delete_agent_memory(&self, agent: &str) -> Result<u64, StoreError> {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let before = memory.len();
        memory.retain(|(_, a), _| a != agent);
        Ok(u64::try_from(before - memory.len()).unwrap_or(u64::MAX))
    }
}

#[async_trait]
impl Inbox for MemoryStore {
    async fn enqueue(&self, message: Queued, max: u64) -> Result<u64, StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, &message.session_id, &message.incarnation)?;
        let held = u64::try_from(entry.inbox.len()).unwrap_or(u64::MAX);
        QuotaLimits::check(Quota::Inbox, Some(max), held, 1).map_err(StoreError::QuotaExceeded)?;
        entry.inbox.insert(message.id.clone(), message);
        Ok(held + 1)
    }

    async fn queued(&self, session_id: &str) -> Result<Vec<Queued>, StoreError> {
        let sessions = self.lock();
        Ok(sessions
            .get(session_id)
            .map(|e| e.inbox.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn dequeue(
        &self,
        session_id: &str,
        incarnation: &str,
        id: &str,
        notice: Option<NewMessage>,
    ) -> Result<bool, StoreError> {
        let mut sessions = self.lock();
        let entry = entry_as(&mut sessions, session_id, incarnation)?;
        if !entry.inbox.contains_key(id) {
            return Ok(false);
        }
        if let Some(notice) = notice {
            entry.append(notice, SystemTime::now())?;
        }
        entry.inbox.remove(id);
        Ok(true)
    }

    async fn clear(&self, session_id: &str) -> Result<u64, StoreError> {
        let mut sessions = self.lock();
        let Some(entry) = sessions.get_mut(session_id) else {
            return Ok(0);
        };
        let cleared = u64::try_from(entry.inbox.len()).unwrap_or(u64::MAX);
        entry.inbox.clear();
        Ok(cleared)
    }

    async fn sessions_with_queued(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let sessions = self.lock();
        Ok(sessions
            .iter()
            .filter(|(_, e)| !e.inbox.is_empty())
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::MemoryStore;
    use crate::store::Store;
    use crate::store::testing;

    #[tokio::test]
    async fn compacted_messages_hidden_unless_asked() {
        let store = MemoryStore::new();
        let session = testing::seed_history(&store, 4).await;
        store.mark_compacted(&session, 2);
        testing::check_compacted_filter(&store, &session, &[2]).await;
        assert_eq!(store.count_sessions().await.expect("count"), 1);
    }
}
