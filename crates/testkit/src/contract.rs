//! The behaviour every [`Store`] must have, as reusable checks: the one
//! definition of what a store is, which the in-memory and the sled store
//! (and any later one) must both pass.
//!
//! Each check takes a fresh, empty store and panics on a violation.
//! [`store_contract_tests!`](crate::store_contract_tests) turns all of them
//! into `#[tokio::test]`s for one implementation, in an integration test of
//! the crate that owns the store (`crates/runtime/tests/store_contract.rs`):
//!
//! ```ignore
//! agentrt_testkit::store_contract_tests!(MemoryStore::new());
//! // When something must outlive the store (a temporary directory):
//! agentrt_testkit::store_contract_tests!(guarded: open_temp_store()); // -> (store, guard)
//! ```
//!
//! The helpers below ([`seed_history`], [`running_turn`], ...) build the
//! records the checks use, for tests of a store of their own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentrt_runtime::store::{CreateOutcome, ListCursor, ListQuery, Store, StoreError};
use agentrt_runtime::types::{
    ActorKind, Budget, CancelReason, ContentBlock, InputActor, LastTurn, MediaKind, MediaRef,
    Message, NewMessage, NewSession, Queued, QueuedInput, Role, Session, SessionUpdate, Speaker,
    Spent, StopReason, ThinkingLevel, TurnRecord, TurnStatus, Usage, flatten_text,
};

/// Expands to one `#[tokio::test]` per contract check, each on a fresh store
/// made by `$make` (or by `guarded: $make`, which yields `(store, guard)` and
/// keeps the guard alive for the test).
#[macro_export]
macro_rules! store_contract_tests {
    (guarded: $make:expr) => {
        $crate::__store_contract_test!($make;
            create_get_round_trip, create_is_idempotent, create_generates_ids,
            list_newest_first_with_pagination, list_cursor_orders_ties_by_id,
            list_filters_by_agent, list_excludes_archived_unless_asked,
            update_touches_activity, missing_session_errors, append_assigns_increasing_seqs,
            history_pagination, begin_turn_stores_message_and_turn,
            finish_turn_updates_turn_and_last_turn, finish_turn_with_stores_the_answer_too,
            find_turn_by_request_id, list_turns_newest_first_by_page,
            finish_turn_adds_what_it_spent_once, inbox_runs_each_queued_message_once,
            recover_marks_running_interrupted, delete_removes_everything,
            delete_then_recreate_starts_fresh, writes_to_an_old_incarnation_are_refused,
            content_round_trips,
            count_sessions_counts_all_owners, compaction_marks_covered_messages,
            compaction_rejects_bad_ranges, title_is_set_only_once,
            history_stops_at_the_byte_budget, list_stops_at_the_byte_budget,
            a_key_extending_another_is_its_own_session,
            a_paused_turn_keeps_its_session_until_resumed,
            daily_spent_sums_an_owners_ended_turns,
            agent_versions_are_immutable_and_listed_by_id,
            memory_is_per_owner_and_agent_and_swapped_by_version,
            sessions_of_agent_pages_every_owners_sessions,
            forget_owner_drops_only_that_owners_spending,
            listed_leases_page_by_replica_then_session,
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_appends_are_contiguous() {
            let (store, _guard) = $make;
            let store = ::std::sync::Arc::new(store);
            $crate::contract::concurrent_appends_are_contiguous(store).await;
        }
    };
    ($make:expr) => {
        $crate::store_contract_tests!(guarded: ($make, ()));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __store_contract_test {
    ($make:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let (store, _guard) = $make;
                $crate::contract::$name(&store).await;
            }
        )+
    };
}

mod agents;
mod budget;
mod compaction;
mod keys;
mod leases;
mod offboard;
mod pause;
pub use agents::{
    agent_versions_are_immutable_and_listed_by_id,
    memory_is_per_owner_and_agent_and_swapped_by_version,
};
pub use budget::{history_stops_at_the_byte_budget, list_stops_at_the_byte_budget};
pub use compaction::{
    compaction_marks_covered_messages, compaction_rejects_bad_ranges, title_is_set_only_once,
};
pub use keys::a_key_extending_another_is_its_own_session;
pub use leases::listed_leases_page_by_replica_then_session;
pub use offboard::{
    forget_owner_drops_only_that_owners_spending, sessions_of_agent_pages_every_owners_sessions,
};
pub use pause::{
    a_paused_turn_keeps_its_session_until_resumed, daily_spent_sums_an_owners_ended_turns,
};

/// A text message of `turn_id`.
pub fn text_message(turn_id: &str, role: Role, body: &str) -> NewMessage {
    NewMessage::new(turn_id, role, vec![ContentBlock::text(body)])
}

/// A running turn record with every field set (`user_message_seq` is junk
/// that `begin_turn` must overwrite).
pub fn running_turn(session_id: &str, incarnation: &str, turn_id: &str) -> TurnRecord {
    TurnRecord {
        incarnation: incarnation.to_owned(),
        steps: 0,
        cost_nano_usd: None,
        from_inbox: None,
        pause: None,
        delegated: Default::default(),
        turn_id: turn_id.to_owned(),
        session_id: session_id.to_owned(),
        status: TurnStatus::Running,
        started_at: SystemTime::now(),
        finished_at: None,
        model: "echo/echo".to_owned(),
        thinking: Some(ThinkingLevel::Low),
        system_overridden: true,
        usage: Usage::default(),
        user_message_seq: 999,
        error: None,
        cancel_reason: None,
        request_id: Some(format!("req-{turn_id}")),
    }
}

/// Creates a session of owner "seed" with `count` text messages; its id.
pub async fn seed_history(store: &dyn Store, count: usize) -> String {
    let id = create(store, "seed", "agent").await.id;
    for i in 0..count {
        append(store, &id, &format!("message {i}")).await;
    }
    id
}

fn new_session(owner: &str, agent: &str) -> NewSession {
    NewSession {
        owner: owner.to_owned(),
        agent_id: agent.to_owned(),
        ..NewSession::default()
    }
}

async fn create_new(store: &dyn Store, new: NewSession) -> Session {
    match store.create_session(new).await.expect("create_session") {
        CreateOutcome::Created(session) => session,
        CreateOutcome::Existing(session) => panic!("expected a new session, got {session:?}"),
    }
}

async fn create(store: &dyn Store, owner: &str, agent: &str) -> Session {
    create_new(store, new_session(owner, agent)).await
}

/// The incarnation of session `id` (empty when it does not exist).
pub async fn incarnation(store: &dyn Store, id: &str) -> String {
    store
        .get_session(id)
        .await
        .expect("get_session")
        .map(|s| s.incarnation)
        .unwrap_or_default()
}

async fn append(store: &dyn Store, id: &str, body: &str) -> Message {
    let message = text_message("t", Role::Assistant, body);
    store
        .append_message(id, &incarnation(store, id).await, message)
        .await
        .expect("append_message")
}

async fn begin(store: &dyn Store, id: &str, turn_id: &str) -> Message {
    let user = text_message(turn_id, Role::User, "question");
    store
        .begin_turn(
            running_turn(id, &incarnation(store, id).await, turn_id),
            user,
        )
        .await
        .expect("begin_turn")
}

async fn get(store: &dyn Store, id: &str) -> Session {
    store
        .get_session(id)
        .await
        .expect("get_session")
        .expect("session exists")
}

async fn turn(store: &dyn Store, id: &str, turn_id: &str) -> Option<TurnRecord> {
    store.get_turn(id, turn_id).await.expect("get_turn")
}

async fn history(store: &dyn Store, id: &str) -> Vec<Message> {
    store
        .history(id, 0, usize::MAX, true)
        .await
        .expect("history")
}

async fn count(store: &dyn Store) -> u64 {
    store.count_sessions().await.expect("count_sessions")
}

fn query(limit: usize) -> ListQuery {
    ListQuery {
        limit,
        ..ListQuery::default()
    }
}

/// Walks every page of `owner`'s listing and returns the ids.
async fn walk(store: &dyn Store, owner: &str, mut query: ListQuery) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..1000 {
        let page = store
            .list_sessions(owner, &query)
            .await
            .expect("list_sessions");
        assert!(
            page.sessions.len() <= query.limit,
            "page larger than its limit"
        );
        ids.extend(page.sessions.into_iter().map(|s| s.id));
        match page.next {
            Some(next) => query.after = Some(next),
            None => return ids,
        }
    }
    panic!("listing did not terminate");
}

/// Lets the clock move on, so activity times differ even on a coarse clock.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(2)).await;
}

/// A created session reads back identically.
pub async fn create_get_round_trip(store: &dyn Store) {
    let new = NewSession {
        id: Some("s-round-trip".to_owned()),
        project_id: "project".to_owned(),
        title: "Title ✓".to_owned(),
        model: "echo/echo".to_owned(),
        system_prompt: "be brief".to_owned(),
        metadata: BTreeMap::from([("k".to_owned(), "v".to_owned())]),
        ..new_session("alice", "agent-1")
    };
    let created = create_new(store, new.clone()).await;
    assert_eq!(
        (created.id.as_str(), created.owner.as_str()),
        ("s-round-trip", "alice")
    );
    assert_eq!(
        (&created.agent_id, &created.project_id),
        (&new.agent_id, &new.project_id)
    );
    assert_eq!((&created.title, &created.model), (&new.title, &new.model));
    assert_eq!(
        (&created.system_prompt, &created.metadata),
        (&new.system_prompt, &new.metadata)
    );
    assert_eq!(created.created_at, created.last_active_at);
    assert_eq!((created.next_seq, created.message_count), (1, 0));
    assert!(!created.archived && created.last_turn.is_none());
    assert_eq!(
        store.get_session("s-round-trip").await.expect("get"),
        Some(created)
    );
    assert_eq!(store.get_session("missing").await.expect("get"), None);
}

/// Creating an existing id returns it unchanged.
pub async fn create_is_idempotent(store: &dyn Store) {
    let first = NewSession {
        id: Some("s-same".to_owned()),
        ..new_session("alice", "agent")
    };
    let created = create_new(store, first).await;
    let second = NewSession {
        id: Some("s-same".to_owned()),
        title: "second".to_owned(),
        ..new_session("mallory", "other")
    };
    let outcome = store.create_session(second).await.expect("create");
    assert_eq!(outcome, CreateOutcome::Existing(created.clone()));
    assert_eq!(get(store, "s-same").await, created);
    assert_eq!(count(store).await, 1);
}

/// Without an id the store generates distinct ones.
pub async fn create_generates_ids(store: &dyn Store) {
    let a = create(store, "alice", "agent").await;
    let b = create(store, "alice", "agent").await;
    assert!(!a.id.is_empty() && a.id != b.id);
    assert_eq!((get(store, &a.id).await, get(store, &b.id).await), (a, b));
}

/// The listing is newest activity first, ties by id descending, and every
/// page size yields the same sequence: no duplicates, no misses.
pub async fn list_newest_first_with_pagination(store: &dyn Store) {
    for i in 0..23 {
        create(store, "alice", "agent").await;
        if i % 5 == 0 {
            create(store, "bob", "agent").await;
        }
    }
    let full = store
        .list_sessions("alice", &query(1000))
        .await
        .expect("list");
    assert_eq!((full.sessions.len(), full.next), (23, None));
    assert!(full.sessions.iter().all(|s| s.owner == "alice"));
    let key = |s: &Session| (s.last_active_at, s.id.clone());
    assert!(
        full.sessions.windows(2).all(|w| key(&w[0]) > key(&w[1])),
        "listing order"
    );
    let ids: Vec<String> = full.sessions.into_iter().map(|s| s.id).collect();
    for limit in [1, 2, 3, 7, 22, 23, 24] {
        assert_eq!(
            walk(store, "alice", query(limit)).await,
            ids,
            "page size {limit}"
        );
    }
    assert_eq!(walk(store, "bob", query(2)).await.len(), 5);
    assert!(walk(store, "nobody", query(2)).await.is_empty());
}

/// A cursor means "strictly after (time, id)" with ties broken by id
/// descending, whether or not a session sits exactly at the cursor.
pub async fn list_cursor_orders_ties_by_id(store: &dyn Store) {
    for _ in 0..6 {
        create(store, "alice", "agent").await;
    }
    let full = store
        .list_sessions("alice", &query(100))
        .await
        .expect("list")
        .sessions;
    let far = SystemTime::now() + Duration::from_secs(86_400);
    let mut cursors = vec![(UNIX_EPOCH, String::new()), (far, String::new())];
    let ns = Duration::from_nanos(1);
    for s in &full {
        for id in [String::new(), s.id.clone(), format!("{}\u{10FFFF}", s.id)] {
            let t = s.last_active_at;
            cursors.extend([(t - ns, id.clone()), (t, id.clone()), (t + ns, id)]);
        }
    }
    for (at, id) in cursors {
        let before = |s: &&Session| (s.last_active_at, s.id.as_str()) < (at, id.as_str());
        let expected: Vec<&String> = full.iter().filter(before).map(|s| &s.id).collect();
        let after = Some(ListCursor {
            last_active_at: at,
            id: id.clone(),
        });
        let page = store
            .list_sessions(
                "alice",
                &ListQuery {
                    after,
                    ..query(100)
                },
            )
            .await;
        let page = page.expect("list").sessions;
        let got: Vec<&String> = page.iter().map(|s| &s.id).collect();
        assert_eq!(got, expected, "cursor ({at:?}, {id:?})");
    }
}

/// `agent_id` restricts the listing, across pages.
pub async fn list_filters_by_agent(store: &dyn Store) {
    for agent in ["a", "b", "a", "b", "a", "a"] {
        create(store, "alice", agent).await;
    }
    let only_a = ListQuery {
        agent_id: Some("a".to_owned()),
        ..query(100)
    };
    let page = store
        .list_sessions("alice", &only_a)
        .await
        .expect("list")
        .sessions;
    assert_eq!(page.len(), 4);
    assert!(page.iter().all(|s| s.agent_id == "a"));
    let paged = walk(
        store,
        "alice",
        ListQuery {
            limit: 3,
            ..only_a.clone()
        },
    )
    .await;
    assert_eq!(paged, page.into_iter().map(|s| s.id).collect::<Vec<_>>());
    let only_c = ListQuery {
        agent_id: Some("c".to_owned()),
        ..only_a
    };
    assert!(walk(store, "alice", only_c).await.is_empty());
}

/// Archived sessions are listed only with `include_archived`.
pub async fn list_excludes_archived_unless_asked(store: &dyn Store) {
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(create(store, "alice", "agent").await.id);
    }
    let archive = SessionUpdate {
        archived: Some(true),
        ..SessionUpdate::default()
    };
    assert!(
        store
            .update_session(&ids[1], archive)
            .await
            .expect("update")
            .archived
    );
    let visible = walk(store, "alice", query(1)).await;
    assert_eq!(visible.len(), 3);
    assert!(!visible.contains(&ids[1]));
    let all = walk(
        store,
        "alice",
        ListQuery {
            include_archived: true,
            ..query(1)
        },
    )
    .await;
    assert_eq!(
        (all.len(), &all[0]),
        (4, &ids[1]),
        "archiving is activity too"
    );
}

/// An update applies its fields, touches `last_active_at` and moves the
/// session to the front of the listing; so does an appended message.
pub async fn update_touches_activity(store: &dyn Store) {
    let a = create(store, "alice", "agent").await;
    tick().await;
    let b = create(store, "alice", "agent").await;
    tick().await;
    create(store, "alice", "agent").await;
    tick().await;
    let metadata = BTreeMap::from([("x".to_owned(), "y".to_owned())]);
    let update = SessionUpdate {
        title: Some("renamed".to_owned()),
        metadata: Some(metadata.clone()),
        ..SessionUpdate::default()
    };
    let updated = store.update_session(&a.id, update).await.expect("update");
    assert_eq!(
        (updated.title.as_str(), &updated.metadata),
        ("renamed", &metadata)
    );
    assert_eq!(
        (&updated.model, &updated.system_prompt),
        (&a.model, &a.system_prompt)
    );
    assert_eq!(
        (updated.created_at, updated.archived),
        (a.created_at, false)
    );
    assert!(updated.last_active_at > a.last_active_at);
    assert_eq!(get(store, &a.id).await, updated);
    assert_eq!(walk(store, "alice", query(1)).await[0], a.id);
    tick().await;
    append(store, &b.id, "hi").await;
    let listed = walk(store, "alice", query(2)).await;
    assert_eq!((listed.len(), &listed[0], &listed[1]), (3, &b.id, &a.id));
}

/// Writes to a missing session fail with `SessionNotFound`; reads are empty.
pub async fn missing_session_errors(store: &dyn Store) {
    let not_found = |r: Result<(), StoreError>| matches!(r, Err(StoreError::SessionNotFound));
    let update = store.update_session("nope", SessionUpdate::default()).await;
    assert!(not_found(update.map(drop)));
    let append = store
        .append_message("nope", "", text_message("t", Role::User, "x"))
        .await;
    assert!(not_found(append.map(drop)));
    let user = text_message("t", Role::User, "x");
    assert!(not_found(
        store
            .begin_turn(running_turn("nope", "", "t"), user)
            .await
            .map(drop)
    ));
    assert!(not_found(
        store.finish_turn(running_turn("nope", "", "t")).await
    ));
    assert_eq!(turn(store, "nope", "t").await, None);
    let by_request = store.find_turn_by_request("nope", "req-t").await;
    assert_eq!(by_request.expect("find_turn_by_request"), None);
    assert!(history(store, "nope").await.is_empty());
    assert!(!store.delete_session("nope", None).await.expect("delete"));
    assert_eq!(count(store).await, 0);
}

/// Seqs are 1, 2, 3… per session with the counters kept, and are not reused
/// when other sessions are deleted.
pub async fn append_assigns_increasing_seqs(store: &dyn Store) {
    let a = create(store, "alice", "agent").await;
    let b = create(store, "alice", "agent").await;
    let mut seqs = Vec::new();
    for i in 0..3 {
        let message = text_message("t1", Role::User, &format!("a{i}"));
        let stored = store
            .append_message(&a.id, &a.incarnation, message.clone())
            .await
            .expect("append");
        assert_eq!((&stored.body, stored.compacted), (&message, false));
        seqs.push(stored.seq);
    }
    append(store, &b.id, "b1").await;
    append(store, &b.id, "b2").await;
    assert!(store.delete_session(&b.id, None).await.expect("delete"));
    seqs.push(append(store, &a.id, "a3").await.seq);
    assert_eq!(seqs, [1, 2, 3, 4]);
    let session = get(store, &a.id).await;
    assert_eq!((session.next_seq, session.message_count), (5, 4));
    assert!(session.last_active_at >= a.last_active_at);
    assert!(history(store, &a.id).await.iter().map(|m| m.seq).eq(1..=4));
}

/// `history` pages by `after_seq` and `limit`.
pub async fn history_pagination(store: &dyn Store) {
    let id = seed_history(store, 10).await;
    let page = async |after: u64, limit: usize| {
        let page = store
            .history(&id, after, limit, false)
            .await
            .expect("history");
        page.iter().map(|m| m.seq).collect::<Vec<_>>()
    };
    assert_eq!(page(0, 100).await, (1..=10).collect::<Vec<_>>());
    assert_eq!(
        (page(0, 3).await, page(3, 3).await),
        (vec![1, 2, 3], vec![4, 5, 6])
    );
    assert_eq!(page(9, 5).await, [10]);
    for (after, limit) in [(10, 5), (u64::MAX, 5), (0, 0)] {
        assert!(
            page(after, limit).await.is_empty(),
            "after {after}, limit {limit}"
        );
    }
    let (mut after, mut walked) = (0, Vec::new());
    loop {
        let got = page(after, 4).await;
        let Some(&last) = got.last() else { break };
        (after, walked) = (last, [walked, got].concat());
    }
    assert_eq!(walked, (1..=10).collect::<Vec<_>>());
    // The inline read is the same page.
    for (after, limit) in [(0, 100), (3, 3), (9, 5), (10, 5), (u64::MAX, 5), (0, 0)] {
        let inline = store.history_inline(&id, after, limit).await;
        let seqs: Vec<u64> = inline
            .expect("history_inline")
            .iter()
            .map(|m| m.seq)
            .collect();
        assert_eq!(
            seqs,
            page(after, limit).await,
            "inline after {after}, limit {limit}"
        );
    }
    let last = history(store, &id).await.pop().expect("messages");
    assert_eq!(flatten_text(&last.body.content), "message 9");
}

/// `begin_turn` stores the user message, the turn (with its seq) and
/// `last_turn` together.
pub async fn begin_turn_stores_message_and_turn(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    append(store, &s.id, "earlier").await;
    let (record, user) = (
        running_turn(&s.id, &s.incarnation, "t1"),
        text_message("t1", Role::User, "q"),
    );
    let message = store
        .begin_turn(record.clone(), user.clone())
        .await
        .expect("begin_turn");
    assert_eq!((message.seq, &message.body), (2, &user));
    let stored = turn(store, &s.id, "t1").await.expect("turn stored");
    assert_eq!(
        stored,
        TurnRecord {
            user_message_seq: 2,
            ..record
        }
    );
    let session = get(store, &s.id).await;
    assert_eq!(session.last_turn, Some(LastTurn::from(&stored)));
    assert_eq!((session.next_seq, session.message_count), (3, 2));
    assert_eq!(history(store, &s.id).await.last(), Some(&message));
    assert_eq!(turn(store, &s.id, "t-other").await, None);
}

/// `finish_turn` stores the final record and `last_turn`.
pub async fn finish_turn_updates_turn_and_last_turn(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let seq = begin(store, &s.id, "t1").await.seq;
    let finished = TurnRecord {
        status: TurnStatus::Canceled,
        finished_at: Some(SystemTime::now()),
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        },
        user_message_seq: seq,
        cancel_reason: Some(CancelReason::Stopped),
        ..running_turn(&s.id, &s.incarnation, "t1")
    };
    store
        .finish_turn(finished.clone())
        .await
        .expect("finish_turn");
    assert_eq!(turn(store, &s.id, "t1").await.as_ref(), Some(&finished));
    let last = get(store, &s.id).await.last_turn.expect("last_turn");
    assert_eq!(last, LastTurn::from(&finished));
    assert_eq!(
        (last.status, last.finished_at),
        (TurnStatus::Canceled, finished.finished_at)
    );
}

/// The last message and the final turn record are stored together; the
/// message gets the next seq.
pub async fn finish_turn_with_stores_the_answer_too(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let seq = begin(store, &s.id, "t1").await.seq;
    let finished = TurnRecord {
        status: TurnStatus::Success,
        finished_at: Some(SystemTime::now()),
        user_message_seq: seq,
        ..running_turn(&s.id, &s.incarnation, "t1")
    };
    let stored = store
        .finish_turn_with(
            finished.clone(),
            Some(text_message("t1", Role::Assistant, "answer")),
        )
        .await
        .expect("finish_turn_with")
        .expect("the answer is stored");
    assert_eq!(stored.seq, seq + 1);
    assert_eq!(turn(store, &s.id, "t1").await.as_ref(), Some(&finished));
    let session = get(store, &s.id).await;
    assert_eq!(session.last_turn, Some(LastTurn::from(&finished)));
    assert_eq!(session.message_count, 2);
    let history = store.history(&s.id, 0, 10, true).await.expect("history");
    assert_eq!(history.last().map(|m| m.seq), Some(seq + 1));
    // Without a message it is a plain finish.
    let none = store
        .finish_turn_with(finished, None)
        .await
        .expect("finish_turn_with");
    assert!(none.is_none());
    assert_eq!(get(store, &s.id).await.message_count, 2);
}

/// A turn is found by its Chat idempotency key, within its session only.
pub async fn find_turn_by_request_id(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let other = create(store, "alice", "agent").await;
    begin(store, &s.id, "t1").await;
    begin(store, &s.id, "t2").await;
    begin(store, &other.id, "t3").await;
    let find = async |id: &str, request: &str| {
        store
            .find_turn_by_request(id, request)
            .await
            .expect("find_turn_by_request")
    };
    assert_eq!(find(&s.id, "req-t2").await, turn(store, &s.id, "t2").await);
    assert!(find(&s.id, "req-t2").await.is_some());
    assert_eq!(
        (find(&s.id, "req-t3").await, find(&s.id, "nope").await),
        (None, None)
    );
}

/// The inbox: queued messages in arrival order with their positions,
/// bounded; each taken once, by the write that begins its turn (a second
/// turn from it is refused and stores nothing) or by a dequeue that reports
/// it in history; cleared; gone with their session.
pub async fn inbox_runs_each_queued_message_once(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let inbox = store.inbox();
    let queued = |id: &str| Queued {
        id: id.to_owned(),
        session_id: s.id.clone(),
        incarnation: s.incarnation.clone(),
        enqueued_at: SystemTime::now(),
        admin: false,
        actor: Some(InputActor::new(ActorKind::ApiKey, "alice")),
        input: QueuedInput {
            content: vec![ContentBlock::text(format!("message {id}"))],
            request_id: Some(format!("r-{id}")),
            speaker: Some(Speaker::new(format!("p-{id}"), "Participant")),
            ..QueuedInput::default()
        },
    };
    for (id, position) in [("q1", 1), ("q2", 2), ("q3", 3)] {
        let at = inbox.enqueue(queued(id), 3).await.expect("enqueue");
        assert_eq!(at, position);
    }
    match inbox.enqueue(queued("q4"), 3).await {
        Err(StoreError::QuotaExceeded(refused)) => assert_eq!(refused.limit, 3),
        other => panic!("expected the inbox bound, got {other:?}"),
    }
    let ids = async || {
        let listed = inbox.queued(&s.id).await.expect("queued");
        listed.into_iter().map(|q| q.id).collect::<Vec<_>>()
    };
    assert_eq!(ids().await, ["q1", "q2", "q3"]);
    let first = inbox.queued(&s.id).await.expect("queued").remove(0);
    assert_eq!(
        (first.input, first.admin, first.actor),
        (queued("q1").input, false, queued("q1").actor)
    );

    // The turn that runs q1 takes it; a second turn from q1 is refused.
    let from = |turn_id: &str, id: &str| TurnRecord {
        from_inbox: Some(id.to_owned()),
        ..running_turn(&s.id, &s.incarnation, turn_id)
    };
    // The user message keeps its provenance in the store.
    let user = |turn_id: &str| {
        NewMessage::from_user(
            turn_id,
            vec![ContentBlock::text("message q1")],
            queued("q1").input.speaker,
            InputActor::new(ActorKind::Mtls, "spiffe://example.org/alice"),
        )
    };
    store
        .begin_turn(from("t1", "q1"), user("t1"))
        .await
        .expect("begin_turn from q1");
    let stored = history(store, &s.id).await;
    let said = stored.last().expect("the user message");
    assert_eq!(
        (&said.body.speaker, &said.body.input_actor),
        (&user("t1").speaker, &user("t1").input_actor)
    );
    let stored = stored.len();
    match store.begin_turn(from("t2", "q1"), user("t2")).await {
        Err(StoreError::NotQueued { id }) => assert_eq!(id, "q1"),
        other => panic!("expected NotQueued, got {other:?}"),
    }
    assert_eq!(history(store, &s.id).await.len(), stored, "nothing stored");
    assert!(turn(store, &s.id, "t2").await.is_none());
    assert_eq!(ids().await, ["q2", "q3"]);

    // q2 cannot run: reported in history, once.
    let notice = text_message("q2", Role::Notice, "message q2 was not run");
    let dequeued = inbox.dequeue(&s.id, &s.incarnation, "q2", Some(notice));
    assert!(dequeued.await.expect("dequeue"));
    assert!(
        !inbox
            .dequeue(&s.id, &s.incarnation, "q2", None)
            .await
            .expect("dequeue")
    );
    let last = history(store, &s.id).await.pop().expect("a message");
    assert_eq!(last.body.role, Role::Notice);
    assert_eq!(ids().await, ["q3"]);
    let waiting = inbox.sessions_with_queued(10).await.expect("sessions");
    assert_eq!(waiting, std::slice::from_ref(&s.id));

    // Another incarnation's message is refused; clear empties the inbox.
    let stale = Queued {
        incarnation: "another".to_owned(),
        ..queued("q5")
    };
    assert!(matches!(
        inbox.enqueue(stale, 3).await,
        Err(StoreError::SessionNotFound)
    ));
    assert_eq!(inbox.clear(&s.id).await.expect("clear"), 1);
    assert!(
        inbox
            .sessions_with_queued(10)
            .await
            .expect("sessions")
            .is_empty()
    );

    // Queued messages go with their session.
    inbox.enqueue(queued("q6"), 3).await.expect("enqueue");
    assert!(store.delete_session(&s.id, None).await.expect("delete"));
    assert!(inbox.queued(&s.id).await.expect("queued").is_empty());
    assert!(
        inbox
            .sessions_with_queued(10)
            .await
            .expect("sessions")
            .is_empty()
    );
}

/// A turn's end adds its usage and cost (and its delegates') to what the
/// session spent — once, however often the same end is stored; the budget
/// round-trips through create and update.
pub async fn finish_turn_adds_what_it_spent_once(store: &dyn Store) {
    let budget = Budget {
        max_tokens: Some(100),
        max_cost_nano_usd: None,
    };
    let new = NewSession {
        budget,
        ..new_session("alice", "agent")
    };
    let s = create_new(store, new).await;
    assert_eq!((s.budget, s.spent), (budget, Spent::default()));
    let seq = begin(store, &s.id, "t1").await.seq;
    let finished = TurnRecord {
        status: TurnStatus::Success,
        finished_at: Some(SystemTime::now()),
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        },
        cost_nano_usd: Some(1_000),
        user_message_seq: seq,
        ..running_turn(&s.id, &s.incarnation, "t1")
    };
    for _ in 0..2 {
        store
            .finish_turn(finished.clone())
            .await
            .expect("finish_turn");
    }
    let spent = get(store, &s.id).await.spent;
    assert_eq!(
        (
            spent.usage.input_tokens,
            spent.usage.output_tokens,
            spent.cost_nano_usd
        ),
        (10, 5, 1_000)
    );
    let seq = begin(store, &s.id, "t2").await.seq;
    let second = TurnRecord {
        status: TurnStatus::BudgetExceeded,
        finished_at: Some(SystemTime::now()),
        usage: Usage {
            input_tokens: 1,
            output_tokens: 2,
            ..Usage::default()
        },
        cost_nano_usd: None,
        user_message_seq: seq,
        // What its delegate sessions used counts for this session too.
        delegated: Spent {
            usage: Usage {
                input_tokens: 30,
                output_tokens: 4,
                ..Usage::default()
            },
            cost_nano_usd: 70,
        },
        ..running_turn(&s.id, &s.incarnation, "t2")
    };
    let answer = text_message("t2", Role::Notice, "budget");
    store
        .finish_turn_with(second.clone(), Some(answer))
        .await
        .expect("finish_turn_with");
    let session = get(store, &s.id).await;
    assert_eq!(session.spent.tokens(), 18 + 34);
    assert_eq!(session.spent.cost_nano_usd, 1_070);
    assert_eq!(turn(store, &s.id, "t2").await, Some(second));
    let raised = SessionUpdate {
        budget: Some(Budget::NONE),
        ..SessionUpdate::default()
    };
    let updated = store.update_session(&s.id, raised).await.expect("update");
    assert_eq!(
        (updated.budget, updated.spent),
        (Budget::NONE, session.spent)
    );
}

/// A session's turns come newest first (by turn id), a page at a time
/// from before a turn id; another session's turns never; a missing
/// session has none.
pub async fn list_turns_newest_first_by_page(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let other = create(store, "alice", "agent").await;
    for t in ["t1", "t2", "t3", "t4", "t5"] {
        begin(store, &s.id, t).await;
    }
    begin(store, &other.id, "t6").await;
    let page = async |id: &str, before: Option<&str>, limit: usize| {
        let turns = store
            .list_turns(id, before, limit)
            .await
            .expect("list_turns");
        turns.into_iter().map(|t| t.turn_id).collect::<Vec<_>>()
    };
    assert_eq!(page(&s.id, None, 2).await, ["t5", "t4"]);
    assert_eq!(page(&s.id, Some("t4"), 2).await, ["t3", "t2"]);
    assert_eq!(page(&s.id, Some("t2"), 2).await, ["t1"]);
    assert!(page(&s.id, Some("t1"), 2).await.is_empty());
    assert!(page(&s.id, None, 0).await.is_empty());
    assert_eq!(page(&other.id, None, 10).await, ["t6"]);
    assert!(page("no-such-session", None, 10).await.is_empty());
    let listed = store.list_turns(&s.id, None, 1).await.expect("list_turns");
    assert_eq!(listed.first(), turn(store, &s.id, "t5").await.as_ref());
    let count = async |id: &str| store.count_turns(id).await.expect("count_turns");
    assert_eq!(
        (
            count(&s.id).await,
            count(&other.id).await,
            count("nope").await
        ),
        (5, 1, 0)
    );
}

/// Recovery marks running turns interrupted, leaves ended ones, and updates
/// `last_turn`; a second pass finds nothing.
pub async fn recover_marks_running_interrupted(store: &dyn Store) {
    let x = create(store, "alice", "agent").await;
    let y = create(store, "bob", "agent").await;
    let seq = begin(store, &x.id, "t1").await.seq;
    let done = TurnRecord {
        status: TurnStatus::Success,
        finished_at: Some(SystemTime::now()),
        user_message_seq: seq,
        ..running_turn(&x.id, &x.incarnation, "t1")
    };
    store.finish_turn(done.clone()).await.expect("finish");
    begin(store, &x.id, "t2").await;
    begin(store, &y.id, "t3").await;
    let mut changed = store.recover_interrupted().await.expect("recover");
    changed.sort_by(|a, b| a.turn_id.cmp(&b.turn_id));
    assert_eq!(
        changed
            .iter()
            .map(|t| t.turn_id.as_str())
            .collect::<Vec<_>>(),
        ["t2", "t3"]
    );
    for record in &changed {
        assert_eq!(record.status, TurnStatus::Interrupted);
        assert!(record.finished_at.is_some());
        assert_eq!(
            turn(store, &record.session_id, &record.turn_id)
                .await
                .as_ref(),
            Some(record)
        );
        let last = get(store, &record.session_id).await.last_turn;
        assert_eq!(last, Some(LastTurn::from(record)));
    }
    assert_eq!(turn(store, &x.id, "t1").await, Some(done));
    assert!(
        store
            .recover_interrupted()
            .await
            .expect("recover")
            .is_empty()
    );
}

/// Deletion removes the session, its history and turns, and nothing else.
pub async fn delete_removes_everything(store: &dyn Store) {
    let doomed = create(store, "alice", "agent").await;
    let kept = create(store, "alice", "agent").await;
    for s in [&doomed, &kept] {
        begin(store, &s.id, "t1").await;
        append(store, &s.id, "answer").await;
    }
    assert!(
        store
            .delete_session(&doomed.id, None)
            .await
            .expect("delete")
    );
    assert_eq!(store.get_session(&doomed.id).await.expect("get"), None);
    assert!(history(store, &doomed.id).await.is_empty());
    assert_eq!(turn(store, &doomed.id, "t1").await, None);
    let everything = ListQuery {
        include_archived: true,
        ..query(10)
    };
    assert_eq!(walk(store, "alice", everything).await, [kept.id.as_str()]);
    assert_eq!(count(store).await, 1);
    assert!(
        !store
            .delete_session(&doomed.id, None)
            .await
            .expect("delete")
    );
    assert_eq!(history(store, &kept.id).await.len(), 2);
    assert!(turn(store, &kept.id, "t1").await.is_some());
}

/// A session created again under a deleted id is a new incarnation: every
/// write meant for the old one — a turn's messages, its record, a
/// compaction, a title, a delete — is refused as not found and changes
/// nothing of the new one.
pub async fn writes_to_an_old_incarnation_are_refused(store: &dyn Store) {
    let new = NewSession {
        id: Some("s-again".to_owned()),
        ..new_session("alice", "agent")
    };
    let old = create_new(store, new.clone()).await;
    begin(store, &old.id, "t-old").await;
    assert!(store.delete_session(&old.id, None).await.expect("delete"));
    let fresh = create_new(
        store,
        NewSession {
            owner: "bob".to_owned(),
            ..new
        },
    )
    .await;
    assert_ne!(fresh.incarnation, old.incarnation);
    assert!(!fresh.incarnation.is_empty());
    let not_found = |r: Result<(), StoreError>| matches!(r, Err(StoreError::SessionNotFound));
    let stale = text_message("t-old", Role::Assistant, "alice's partial answer");
    assert!(not_found(
        store
            .append_message(&old.id, &old.incarnation, stale.clone())
            .await
            .map(drop)
    ));
    let old_turn = running_turn(&old.id, &old.incarnation, "t-old");
    assert!(not_found(store.finish_turn(old_turn.clone()).await));
    assert!(not_found(
        store
            .finish_turn_with(old_turn.clone(), Some(stale))
            .await
            .map(drop)
    ));
    let user = text_message("t-late", Role::User, "late admission");
    assert!(not_found(
        store
            .begin_turn(running_turn(&old.id, &old.incarnation, "t-late"), user)
            .await
            .map(drop)
    ));
    let summary = NewMessage::new("c", Role::Summary, vec![ContentBlock::text("sum")]);
    assert!(not_found(
        store
            .store_compaction(&old.id, &old.incarnation, summary, 0)
            .await
            .map(drop)
    ));
    assert!(not_found(
        store
            .set_title_if_empty(&old.id, &old.incarnation, "alice's title")
            .await
            .map(drop)
    ));
    assert!(
        !store
            .delete_session(&old.id, Some(&old.incarnation))
            .await
            .expect("delete")
    );
    assert_eq!(get(store, &fresh.id).await, fresh);
    assert!(history(store, &fresh.id).await.is_empty());
    assert_eq!(turn(store, &fresh.id, "t-old").await, None);
    // The new incarnation's own writes go through.
    begin(store, &fresh.id, "t-new").await;
    assert!(
        store
            .delete_session(&fresh.id, Some(&fresh.incarnation))
            .await
            .expect("delete")
    );
}

/// A deleted id can be created again, without any of the old state.
pub async fn delete_then_recreate_starts_fresh(store: &dyn Store) {
    let new = NewSession {
        id: Some("s-reused".to_owned()),
        ..new_session("alice", "agent")
    };
    create_new(store, new.clone()).await;
    begin(store, "s-reused", "t1").await;
    append(store, "s-reused", "answer").await;
    assert!(
        store
            .delete_session("s-reused", None)
            .await
            .expect("delete")
    );
    let again = create_new(store, new).await;
    assert_eq!(
        (again.next_seq, again.message_count, again.last_turn),
        (1, 0, None)
    );
    assert!(history(store, "s-reused").await.is_empty());
    assert_eq!(turn(store, "s-reused", "t1").await, None);
    assert_eq!(append(store, "s-reused", "new").await.seq, 1);
    assert!(
        store
            .recover_interrupted()
            .await
            .expect("recover")
            .is_empty()
    );
}

/// 8 tasks × 50 appends to one session get 400 distinct, contiguous seqs.
pub async fn concurrent_appends_are_contiguous(store: Arc<dyn Store>) {
    let id = create(&*store, "alice", "agent").await.id;
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (store, id) = (Arc::clone(&store), id.clone());
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..50 {
                    seqs.push(append(&*store, &id, &format!("{task}/{i}")).await.seq);
                }
                seqs
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for task in tasks {
        let mine = task.await.expect("task");
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "one task's seqs increase"
        );
        seqs.extend(mine);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    assert!(
        history(&*store, &id)
            .await
            .iter()
            .map(|m| m.seq)
            .eq(1..=400)
    );
    let session = get(&*store, &id).await;
    assert_eq!((session.next_seq, session.message_count), (401, 400));
}

/// Every kind of content block, including image bytes, reads back equal.
pub async fn content_round_trips(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let owned = String::from;
    let media = |kind, mime_type: &str, name: &str| MediaRef {
        kind,
        blob_id: "ab".repeat(32),
        mime_type: mime_type.to_owned(),
        size: 12_345,
        name: name.to_owned(),
    };
    let content = vec![
        ContentBlock::text("héllo\n\u{0}wörld 🦀"),
        ContentBlock::Thinking {
            thinking: owned("hmm"),
            signature: owned("sig"),
        },
        ContentBlock::Image {
            data: (0..=255).chain([0, 0]).collect(),
            mime_type: owned("a/b"),
        },
        ContentBlock::Image {
            data: Vec::new(),
            mime_type: owned("image/jpeg"),
        },
        ContentBlock::ToolCall {
            id: owned("c1"),
            name: owned("search"),
            arguments_json: owned(r#"{"q":"x"}"#),
        },
        ContentBlock::ToolResult {
            call_id: owned("c1"),
            name: owned("search"),
            content: owned("found"),
            is_error: true,
            interrupted: Some(agentrt_runtime::types::Interrupted::OutcomeUnknown),
            media: vec![media(MediaKind::Image, "image/png", "")],
        },
        ContentBlock::Media(media(MediaKind::File, "application/pdf", "report.pdf")),
    ];
    let mut message = NewMessage::new("t1", Role::Assistant, content);
    message.model = Some(owned("echo/echo"));
    message.usage = Some(Usage {
        input_tokens: 1,
        output_tokens: 2,
        ..Usage::default()
    });
    message.stop_reason = Some(StopReason::ToolUse);
    let stored = store
        .append_message(&s.id, &s.incarnation, message.clone())
        .await
        .expect("append");
    assert_eq!(stored.body, message);
    assert_eq!(history(store, &s.id).await, [stored]);
}

/// `count_sessions` counts every owner's sessions.
pub async fn count_sessions_counts_all_owners(store: &dyn Store) {
    assert_eq!(count(store).await, 0);
    let a = create(store, "alice", "agent").await;
    create(store, "alice", "agent").await;
    create(store, "bob", "agent").await;
    assert_eq!(count(store).await, 3);
    assert!(store.delete_session(&a.id, None).await.expect("delete"));
    assert_eq!(count(store).await, 2);
}
