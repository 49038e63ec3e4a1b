//! The shared-store paths of the core, on a memory store that plays a
//! shared one: it names a replica, and the test decides what its leases,
//! renewals, fences and pings say.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::StreamExt as _;

use crate::error::RuntimeError;
use crate::events::{ErrorCode, EventKind, TurnOutcome};
use crate::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, Models};
use crate::runtime::{ChatInput, Runtime, RuntimeConfig, StoreHealth, TurnStream};
use crate::store::{
    CreateOutcome, HistoryQuery, Lease, LeaseCursor, LeaseKey, Leases, ListQuery, ListedLease,
    MemoryStore, MessagePage, SessionPage, Store, StoreError,
};
use crate::types::{
    ContentBlock, Message, NewMessage, NewSession, Principal, Session, SessionUpdate, TurnRecord,
    TurnStatus,
};

const ME: &str = "replica-me";
const WAIT: Duration = Duration::from_secs(10);

/// A memory store that says it is shared; see the module docs.
#[derive(Debug, Default)]
struct Shared {
    inner: MemoryStore,
    leases: Mutex<HashMap<String, Lease>>,
    /// `begin_turn` refuses with `Busy(this)`.
    busy: Mutex<Option<Lease>>,
    /// Turn ids the next renewals report lost.
    lost: Mutex<Vec<String>>,
    renew_fails: AtomicBool,
    /// Turn writes are refused with `LeaseLost`.
    fenced: AtomicBool,
    down: AtomicBool,
    /// Renewals of at least one lease so far.
    renewals: tokio::sync::watch::Sender<usize>,
    /// `begin_turn` waits for `begin_release` first.
    hold_begin: AtomicBool,
    begin_release: tokio::sync::Notify,
    /// Renewals report every turn lost (as for turns without a lease).
    lose_all: AtomicBool,
    /// `find_turn_by_request` finds nothing once (another replica's
    /// admission of the same request id lands after this look-up), and
    /// `begin_turn` then refuses the duplicate request id as PostgreSQL does.
    hide_request_once: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap()
}

#[async_trait]
impl Store for Shared {
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError> {
        self.inner.create_session(new).await
    }
    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.inner.get_session(id).await
    }
    async fn list_sessions(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        self.inner.list_sessions(owner, query).await
    }
    async fn update_session(&self, id: &str, update: SessionUpdate) -> Result<Session, StoreError> {
        self.inner.update_session(id, update).await
    }
    async fn delete_session(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.inner.delete_session(id, incarnation).await
    }
    async fn begin_turn(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
    ) -> Result<Message, StoreError> {
        if let Some(lease) = lock(&self.busy).clone() {
            return Err(StoreError::Busy(lease));
        }
        if self.hold_begin.load(Ordering::SeqCst) {
            self.begin_release.notified().await;
        }
        if let Some(rid) = &turn.request_id
            && let Some(earlier) = self
                .inner
                .find_turn_by_request(&turn.session_id, rid)
                .await?
        {
            return Err(StoreError::Backend(format!(
                "request id already started turn {} of this session",
                earlier.turn_id
            )));
        }
        self.inner.begin_turn(turn, user_message).await
    }
    async fn append_message(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(StoreError::LeaseLost {
                turn_id: message.turn_id,
            });
        }
        self.inner
            .append_message(session_id, incarnation, message)
            .await
    }
    async fn finish_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(StoreError::LeaseLost {
                turn_id: turn.turn_id,
            });
        }
        self.inner.finish_turn(turn).await
    }
    async fn expired_pauses(
        &self,
        now: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.inner.expired_pauses(now, limit).await
    }
    async fn daily_spent(
        &self,
        owner: &str,
        day: u64,
    ) -> Result<crate::quota::DailySpent, StoreError> {
        self.inner.daily_spent(owner, day).await
    }
    async fn update_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        self.inner.update_turn(turn).await
    }
    async fn resume_turn(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError> {
        self.inner
            .resume_turn(session_id, incarnation, turn_id)
            .await
    }
    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.inner.get_turn(session_id, turn_id).await
    }
    fn inbox(&self) -> &dyn crate::store::Inbox {
        self.inner.inbox()
    }
    fn agents(&self) -> &dyn crate::store::AgentStore {
        self.inner.agents()
    }
    async fn list_turns(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.inner.list_turns(session_id, before, limit).await
    }
    async fn count_turns(&self, session_id: &str) -> Result<u64, StoreError> {
        self.inner.count_turns(session_id).await
    }
    async fn find_turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        if self.hide_request_once.swap(false, Ordering::SeqCst) {
            return Ok(None);
        }
        self.inner
            .find_turn_by_request(session_id, request_id)
            .await
    }
    async fn history_page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        self.inner.history_page(session_id, query).await
    }
    async fn store_compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        self.inner
            .store_compaction(session_id, incarnation, summary, through_seq)
            .await
    }
    async fn set_title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        self.inner
            .set_title_if_empty(session_id, incarnation, title)
            .await
    }
    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn count_sessions(&self) -> Result<u64, StoreError> {
        self.inner.count_sessions().await
    }
    async fn sessions_of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<crate::store::AgentSessions, StoreError> {
        self.inner.sessions_of_agent(agent_id, after, limit).await
    }
    async fn forget_owner(&self, owner: &str) -> Result<(), StoreError> {
        self.inner.forget_owner(owner).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn leases(&self) -> Option<&dyn Leases> {
        Some(self)
    }
    fn cluster(&self) -> Option<&dyn crate::store::Cluster> {
        None
    }
    async fn ping(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the test cut the database".into()));
        }
        Ok(())
    }
}

#[async_trait]
impl Leases for Shared {
    fn replica_id(&self) -> &str {
        ME
    }
    async fn lease(&self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        Ok(lock(&self.leases).get(session_id).cloned())
    }
    async fn leases_of(&self, session_ids: &[String]) -> Result<Vec<(String, Lease)>, StoreError> {
        let leases = lock(&self.leases);
        Ok(session_ids
            .iter()
            .filter_map(|id| leases.get(id).map(|l| (id.clone(), l.clone())))
            .collect())
    }
    async fn renew_leases(&self, turns: &[LeaseKey]) -> Result<Vec<String>, StoreError> {
        if !turns.is_empty() {
            self.renewals.send_modify(|n| *n += 1);
        }
        if self.renew_fails.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the test cut the database".into()));
        }
        if self.lose_all.load(Ordering::SeqCst) {
            return Ok(turns.iter().map(|k| k.turn_id.clone()).collect());
        }
        Ok(std::mem::take(&mut *lock(&self.lost)))
    }
    async fn sweep_expired_leases(&self) -> Result<Vec<TurnRecord>, StoreError> {
        Ok(Vec::new())
    }
    async fn list_leases(
        &self,
        after: Option<&LeaseCursor>,
        limit: usize,
    ) -> Result<Vec<ListedLease>, StoreError> {
        let mut held: Vec<(String, Lease)> = lock(&self.leases)
            .iter()
            .map(|(id, lease)| (id.clone(), lease.clone()))
            .collect();
        held.sort_by(|a, b| (&a.1.replica_id, &a.0).cmp(&(&b.1.replica_id, &b.0)));
        let mut listed = Vec::new();
        for (session_id, lease) in held {
            let past = after.is_none_or(|c| {
                (lease.replica_id.as_str(), session_id.as_str())
                    > (c.replica_id.as_str(), c.session_id.as_str())
            });
            if !past || listed.len() == limit {
                continue;
            }
            let owner = self.inner.get_session(&session_id).await?.map(|s| s.owner);
            listed.push(ListedLease {
                session_id,
                owner: owner.unwrap_or_default(),
                lease,
                turn_started_at: None,
            });
        }
        Ok(listed)
    }
}

/// Streams one delta, then never finishes (until its stream is dropped).
#[derive(Debug)]
struct Stall;

#[async_trait]
impl ModelProvider for Stall {
    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        let first = futures::stream::iter([Ok(ModelEvent::TextDelta("partial".into()))]);
        Ok(Box::pin(first.chain(futures::stream::pending())))
    }
}

async fn runtime(store: &Arc<Shared>, ttl: Duration) -> Runtime {
    let mut models = Models::with_builtin();
    models.insert("stall", Arc::new(Stall));
    let config = RuntimeConfig {
        lease_ttl: ttl,
        ..RuntimeConfig::default()
    };
    Runtime::open(config, Arc::clone(store) as Arc<dyn Store>, models)
        .await
        .unwrap()
}

async fn session(rt: &Runtime) -> String {
    rt.create_session(&Principal::local(), NewSession::default())
        .await
        .unwrap()
        .id
}

fn input(session_id: &str, model: &str) -> ChatInput {
    ChatInput {
        session_id: session_id.to_owned(),
        content: vec![ContentBlock::text("hi")],
        model: Some(model.to_owned()),
        ..ChatInput::default()
    }
}

fn lease(turn_id: &str, replica_id: &str) -> Lease {
    Lease {
        replica_id: replica_id.to_owned(),
        address: "http://10.0.0.9:50052".to_owned(),
        turn_id: turn_id.to_owned(),
        expires_at: SystemTime::now() + Duration::from_secs(10),
    }
}

/// Reads until the first text delta; returns the turn id.
async fn streaming(stream: &mut TurnStream) -> String {
    loop {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("an event")
            .expect("the turn goes on");
        if matches!(event.kind, EventKind::Text(_)) {
            return stream.turn_id().to_owned();
        }
    }
}

/// The rest of the turn: the error event (if any) and the outcome.
async fn ending(stream: &mut TurnStream) -> (Option<(ErrorCode, String)>, TurnOutcome) {
    let mut error = None;
    loop {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("the turn ends in time")
            .expect("the turn ends with TurnFinished");
        match &event.kind {
            EventKind::Error { code, message } => error = Some((*code, message.clone())),
            EventKind::TurnFinished { outcome, .. } => return (error, *outcome),
            _ => {}
        }
    }
}

/// What the turn's callers must see after its replica lost the lease.
fn assert_lease_lost(ended: (Option<(ErrorCode, String)>, TurnOutcome)) {
    let (error, outcome) = ended;
    assert_eq!(outcome, TurnOutcome::Error);
    let (code, message) = error.expect("an error event");
    assert_eq!(code, ErrorCode::Unavailable);
    assert!(message.contains("lost the session's lease"), "{message}");
}

#[tokio::test]
async fn a_turn_reported_lost_by_renewal_stops_and_stores_nothing_more() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_millis(300)).await;
    let id = session(&rt).await;
    let mut turn = rt
        .chat(&Principal::local(), input(&id, "stall/x"))
        .await
        .unwrap();
    let turn_id = streaming(&mut turn).await;
    lock(&store.lost).push(turn_id.clone());
    assert_lease_lost(ending(&mut turn).await);
    // Neither the partial answer nor the record's end was written: the
    // turn is another replica's business now.
    let history = store.history(&id, 0, 100, true).await.unwrap();
    assert_eq!(history.len(), 1, "only the user message: {history:?}");
    let record = store.get_turn(&id, &turn_id).await.unwrap().unwrap();
    assert_eq!(record.status, TurnStatus::Running);
    assert_eq!(rt.live_turns(), 0, "the session is free here");
}

#[tokio::test]
async fn live_turns_stop_when_no_renewal_succeeds_for_a_lease_time() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_millis(300)).await;
    let id = session(&rt).await;
    let mut turn = rt
        .chat(&Principal::local(), input(&id, "stall/x"))
        .await
        .unwrap();
    streaming(&mut turn).await;
    store.renew_fails.store(true, Ordering::SeqCst);
    assert_lease_lost(ending(&mut turn).await);
    assert_eq!(store.history(&id, 0, 100, true).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_write_refused_for_a_lost_lease_ends_the_turn_the_same_way() {
    let store = Arc::new(Shared::default());
    // Long enough that the renewer does not get there first.
    let rt = runtime(&store, Duration::from_secs(60)).await;
    let id = session(&rt).await;
    let mut turn = rt
        .chat(&Principal::local(), input(&id, "stall/x"))
        .await
        .unwrap();
    streaming(&mut turn).await;
    store.fenced.store(true, Ordering::SeqCst);
    // The stop's partial answer is the write the store refuses.
    assert!(rt.stop_session(&Principal::local(), &id).await.unwrap());
    assert_lease_lost(ending(&mut turn).await);
    assert_eq!(store.history(&id, 0, 100, true).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_session_busy_on_another_replica_is_busy_here_and_its_retry_is_forwarded() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_secs(60)).await;
    let who = Principal::local();
    let id = session(&rt).await;
    *lock(&store.busy) = Some(lease("t-there", "replica-them"));
    match rt.chat(&who, input(&id, "builtin/echo")).await {
        Err(RuntimeError::SessionBusy { turn_id }) => assert_eq!(turn_id, "t-there"),
        other => panic!("expected SESSION_BUSY, got {:?}", other.map(|_| ())),
    }
    assert_eq!(store.history(&id, 0, 100, true).await.unwrap().len(), 0);

    // The other replica's turn was started with request id r-1: a retry of
    // it joins that turn there.
    *lock(&store.busy) = None;
    let session = store.get_session(&id).await.unwrap().unwrap();
    let mut record = crate::store::testing::running_turn(&id, &session.incarnation, "t-there");
    record.request_id = Some("r-1".to_owned());
    store
        .inner
        .begin_turn(
            record,
            NewMessage::new(
                "t-there",
                crate::types::Role::User,
                vec![ContentBlock::text("hi")],
            ),
        )
        .await
        .unwrap();
    lock(&store.leases).insert(id.clone(), lease("t-there", "replica-them"));
    let mut retry = input(&id, "builtin/echo");
    retry.request_id = Some("r-1".to_owned());
    match rt.chat(&who, retry).await {
        Err(RuntimeError::Elsewhere(l)) => assert_eq!(l.turn_id, "t-there"),
        other => panic!("expected Elsewhere, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn calls_for_a_turn_on_another_replica_are_sent_there_and_a_leftover_lease_is_nothing() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_secs(60)).await;
    let who = Principal::local();
    let id = session(&rt).await;
    lock(&store.leases).insert(id.clone(), lease("t-there", "replica-them"));
    let elsewhere = |r: Result<(), RuntimeError>| matches!(r, Err(RuntimeError::Elsewhere(l)) if l.turn_id == "t-there");
    assert!(elsewhere(
        rt.subscribe(&who, &id, 0, false).await.map(|_| ())
    ));
    assert!(elsewhere(
        rt.subscribe(&who, &id, 0, true).await.map(|_| ())
    ));
    assert!(elsewhere(rt.stop_session(&who, &id).await.map(|_| ())));
    assert!(elsewhere(rt.session_status(&who, &id).await.map(|_| ())));
    assert!(elsewhere(
        rt.close_session(&who, &id, true).await.map(|_| ())
    ));
    assert!(elsewhere(
        rt.submit_tool_result(&who, &id, "t-there", "c-1", "42".into(), false, Vec::new())
            .await
    ));
    match rt.compact_session(&who, &id).await {
        Err(RuntimeError::SessionBusy { turn_id }) => assert_eq!(turn_id, "t-there"),
        other => panic!("expected SESSION_BUSY, got {other:?}"),
    }

    // This replica's own lease with no turn live here: nothing is live.
    lock(&store.leases).insert(id.clone(), lease("t-old", ME));
    assert!(!rt.stop_session(&who, &id).await.unwrap());
    assert_eq!(rt.session_status(&who, &id).await.unwrap().live, None);
    assert!(rt.subscribe(&who, &id, 0, false).await.unwrap().is_none());
}

#[tokio::test]
async fn an_unreachable_store_refuses_chats_until_it_answers_again() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_secs(60)).await;
    let who = Principal::local();
    let id = session(&rt).await;
    let mut reachable = rt.store_health();
    assert_eq!(*reachable.borrow(), StoreHealth::Writable);
    store.down.store(true, Ordering::SeqCst);
    tokio::time::timeout(WAIT, reachable.wait_for(|h| *h == StoreHealth::Unreachable))
        .await
        .unwrap()
        .unwrap();
    match rt.chat(&who, input(&id, "builtin/echo")).await {
        Err(RuntimeError::Unavailable(why)) => assert!(why.contains("database"), "{why}"),
        other => panic!("expected UNAVAILABLE, got {:?}", other.map(|_| ())),
    }
    store.down.store(false, Ordering::SeqCst);
    tokio::time::timeout(WAIT, reachable.wait_for(|h| *h == StoreHealth::Writable))
        .await
        .unwrap()
        .unwrap();
    let (error, outcome) =
        ending(&mut rt.chat(&who, input(&id, "builtin/echo")).await.unwrap()).await;
    assert_eq!((error, outcome), (None, TurnOutcome::Success));
}

#[tokio::test]
async fn a_single_node_store_has_no_replica_and_no_jobs() {
    let rt = Runtime::open(
        RuntimeConfig::default(),
        Arc::new(MemoryStore::new()),
        Models::with_builtin(),
    )
    .await
    .unwrap();
    assert_eq!(rt.replica_id(), None);
    assert!(!rt.inner.shared);
    assert_eq!(*rt.store_health().borrow(), StoreHealth::Writable);
}

#[tokio::test]
async fn a_draining_replica_keeps_renewing_its_turns_leases_until_they_end() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_millis(300)).await;
    let who = Principal::local();
    let id = session(&rt).await;
    let mut turn = rt.chat(&who, input(&id, "stall/x")).await.unwrap();
    streaming(&mut turn).await;
    let shutting_down = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.shutdown(Duration::from_secs(30), Duration::from_secs(1))
                .await
        })
    };
    // Several lease times into the grace period, the turn's lease is still
    // renewed (else another replica would take the session over under it).
    let mut renewals = store.renewals.subscribe();
    let before = *renewals.borrow_and_update();
    tokio::time::timeout(WAIT, renewals.wait_for(|n| *n >= before + 6))
        .await
        .expect("renewals go on while the turn drains")
        .unwrap();
    assert!(rt.stop_session(&who, &id).await.unwrap());
    let (error, outcome) = ending(&mut turn).await;
    assert_eq!((error, outcome), (None, TurnOutcome::Canceled));
    tokio::time::timeout(WAIT, shutting_down)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_turn_being_admitted_is_not_renewed_before_its_lease_is_committed() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_millis(300)).await;
    let who = Principal::local();
    let id = session(&rt).await;
    // The turn claims its slot, then waits in begin_turn for several lease
    // renewal periods; a renewal of it now would be refused.
    store.hold_begin.store(true, Ordering::SeqCst);
    store.lose_all.store(true, Ordering::SeqCst);
    let admitting = {
        let rt = rt.clone();
        let who = who.clone();
        let id = id.clone();
        tokio::spawn(async move { rt.chat(&who, input(&id, "builtin/echo")).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rt.live_turns(), 1, "the turn holds its slot");
    assert_eq!(
        *store.renewals.borrow(),
        0,
        "no renewal of an uncommitted lease"
    );
    store.lose_all.store(false, Ordering::SeqCst);
    store.begin_release.notify_one();
    let mut turn = admitting.await.unwrap().unwrap();
    assert_eq!(ending(&mut turn).await, (None, TurnOutcome::Success));
}

#[tokio::test]
async fn a_request_another_replica_admitted_and_finished_meanwhile_is_replayed_not_an_error() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_secs(60)).await;
    let who = Principal::local();
    let id = session(&rt).await;
    // "Another replica" admitted and finished request r-1 ...
    let mut first = input(&id, "builtin/echo");
    first.request_id = Some("r-1".to_owned());
    let mut done = rt.chat(&who, first).await.unwrap();
    let first_turn = done.turn_id().to_owned();
    assert_eq!(ending(&mut done).await.1, TurnOutcome::Success);
    drop(done);
    let stored = store.history(&id, 0, 100, true).await.unwrap().len();
    // ... after this admission's look-up found nothing: the store refuses
    // the duplicate, and the caller gets the earlier turn as a retry would.
    store.hide_request_once.store(true, Ordering::SeqCst);
    let mut retry = input(&id, "builtin/echo");
    retry.request_id = Some("r-1".to_owned());
    let mut replayed = rt
        .chat(&who, retry)
        .await
        .expect("the earlier turn, not a store error");
    assert_eq!(replayed.turn_id(), first_turn);
    assert_eq!(ending(&mut replayed).await.1, TurnOutcome::Success);
    assert_eq!(
        store.history(&id, 0, 100, true).await.unwrap().len(),
        stored,
        "nothing stored twice"
    );
}

#[tokio::test]
async fn list_replicas_pages_the_stores_leases_by_replica_then_session() {
    let store = Arc::new(Shared::default());
    let rt = runtime(&store, Duration::from_secs(30)).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(session(&rt).await);
    }
    {
        let mut leases = lock(&store.leases);
        leases.insert(ids[0].clone(), lease("t-0", "replica-z"));
        leases.insert(ids[1].clone(), lease("t-1", ME));
        leases.insert(ids[2].clone(), lease("t-2", ME));
    }
    // This replica's two first ("replica-me" < "replica-z"), by session.
    let mut mine = [ids[1].clone(), ids[2].clone()];
    mine.sort();
    let who = Principal::local();
    let first = rt.list_replicas(&who, 2, "").await.unwrap();
    let listed: Vec<(&str, &str)> = first
        .leases
        .iter()
        .map(|l| (l.replica_id.as_str(), l.session_id.as_str()))
        .collect();
    assert_eq!(listed, [(ME, mine[0].as_str()), (ME, mine[1].as_str())]);
    assert!(
        first
            .leases
            .iter()
            .all(|l| l.owner == "local" && l.expires_at.is_some())
    );
    assert!(
        first.replicas.is_empty(),
        "this store has no heartbeat rows"
    );
    let second = rt
        .list_replicas(&who, 2, &first.next_page_token)
        .await
        .unwrap();
    assert_eq!(second.leases.len(), 1);
    assert_eq!(
        (
            second.leases[0].replica_id.as_str(),
            second.leases[0].turn_id.as_str()
        ),
        ("replica-z", "t-0")
    );
    assert!(second.next_page_token.is_empty());
}
