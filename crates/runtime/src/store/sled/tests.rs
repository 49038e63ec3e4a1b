//! The sled engine on its own: reopening, corrupt records, orphans.

use sled::IVec;

use super::keys::{activity_key, message_key, turn_key};
use super::*;
use crate::store::record::{RECORD_VERSION, encode};
use crate::store::testing::{self, running_turn, text_message};
use crate::types::Role;

fn open_temp() -> (SledStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    (SledStore::open(dir.path().join("db")).expect("open"), dir)
}

fn user(turn_id: &str) -> NewMessage {
    text_message(turn_id, Role::User, "q")
}

fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>, reason: &str) {
    match result {
        Err(StoreError::Corrupt { reason: got, .. }) => assert!(got.contains(reason), "{got}"),
        other => panic!("expected Corrupt ({reason}), got {other:?}"),
    }
}

#[tokio::test]
async fn reopen_keeps_sessions_and_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path().join("db")).expect("open");
    let id = testing::seed_history(&store, 3).await;
    store
        .begin_turn(
            running_turn(&id, &testing::incarnation(&store, &id).await, "t1"),
            user("t1"),
        )
        .await
        .expect("begin");
    let before = store.get_session(&id).await.expect("get");
    drop(store);
    let store = SledStore::open(dir.path().join("db")).expect("reopen");
    assert_eq!(store.get_session(&id).await.expect("get"), before);
    let history = store.history(&id, 0, 100, true).await.expect("history");
    assert!(history.iter().map(|m| m.seq).eq(1..=4));
    let query = ListQuery {
        limit: 5,
        ..ListQuery::default()
    };
    assert_eq!(
        store
            .list_sessions("seed", &query)
            .await
            .expect("list")
            .sessions
            .len(),
        1
    );
    assert_eq!(store.recover_interrupted().await.expect("recover").len(), 1);
    assert_eq!(
        store
            .append_message(&id, &testing::incarnation(&store, &id).await, user("t2"))
            .await
            .expect("append")
            .seq,
        5
    );
}

/// The day's totals per owner are kept on disk per session and summed
/// again when the store opens: a restart forgets nothing spent today.
#[tokio::test]
async fn what_an_owner_spent_today_survives_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path().join("db")).expect("open");
    let id = testing::seed_history(&store, 1).await;
    let incarnation = testing::incarnation(&store, &id).await;
    let owner = store
        .get_session(&id)
        .await
        .expect("get")
        .expect("a session")
        .owner;
    store
        .begin_turn(running_turn(&id, &incarnation, "t1"), user("t1"))
        .await
        .expect("begin");
    let now = std::time::SystemTime::now();
    let ended = TurnRecord {
        status: crate::types::TurnStatus::Success,
        finished_at: Some(now),
        usage: crate::types::Usage {
            input_tokens: 30,
            output_tokens: 12,
            ..crate::types::Usage::default()
        },
        cost_nano_usd: Some(77),
        ..running_turn(&id, &incarnation, "t1")
    };
    store.finish_turn(ended).await.expect("finish");
    let today = crate::quota::day_window(now).0;
    let spent = DailySpent {
        tokens: 42,
        cost_nano_usd: 77,
    };
    assert_eq!(
        store.daily_spent(&owner, today).await.expect("daily"),
        spent
    );
    drop(store);
    let store = SledStore::open(dir.path().join("db")).expect("reopen");
    assert_eq!(
        store.daily_spent(&owner, today).await.expect("daily"),
        spent
    );
    assert_eq!(
        store.daily_spent("nobody", today).await.expect("daily"),
        DailySpent::default()
    );
}

#[tokio::test]
async fn garbage_values_are_corrupt() {
    let (store, _dir) = open_temp();
    let broken = testing::seed_history(&store, 3).await;
    let intact = testing::seed_history(&store, 3).await;
    store
        .begin_turn(
            running_turn(&intact, &testing::incarnation(&store, &intact).await, "t1"),
            user("t1"),
        )
        .await
        .expect("begin");
    store
        .sessions
        .insert(broken.as_bytes(), &b"\x01{not json"[..])
        .expect("raw write");
    assert_corrupt(store.get_session(&broken).await, "undecodable version 1");
    let query = ListQuery {
        limit: 10,
        ..ListQuery::default()
    };
    assert_corrupt(store.list_sessions("seed", &query).await, "undecodable");
    assert_corrupt(
        store.append_message(&broken, "", user("t")).await,
        "undecodable",
    );
    store
        .messages
        .insert(message_key(&intact, 2), &b"\xff\xfe"[..])
        .expect("raw write");
    assert_corrupt(
        store.history(&intact, 0, 10, true).await,
        "unknown record version 255",
    );
    assert_eq!(
        store
            .history(&intact, 2, 10, true)
            .await
            .expect("after it")
            .len(),
        2
    );
    store
        .turns
        .insert(turn_key(&intact, "t1"), IVec::default())
        .expect("raw write");
    assert_corrupt(store.get_turn(&intact, "t1").await, "empty record");
    assert_corrupt(store.recover_interrupted().await, "empty record");
    assert!(
        store
            .delete_session(&broken, None)
            .await
            .expect("a corrupt session is deletable")
    );
    assert_eq!(
        store
            .list_sessions("seed", &query)
            .await
            .expect("list")
            .sessions
            .len(),
        1
    );
}

#[tokio::test]
async fn unknown_version_is_corrupt() {
    let (store, _dir) = open_temp();
    let id = testing::seed_history(&store, 1).await;
    let session = store.get_session(&id).await.expect("get").expect("exists");
    let mut value = encode(&session).expect("encode");
    value[0] = RECORD_VERSION + 1;
    store
        .sessions
        .insert(id.as_bytes(), value)
        .expect("raw write");
    assert_corrupt(store.get_session(&id).await, "unknown record version 2");
    let update = store.update_session(&id, SessionUpdate::default()).await;
    assert_corrupt(update, "unknown record version 2");
}

#[tokio::test]
async fn compacted_messages_hidden_unless_asked() {
    let (store, _dir) = open_temp();
    let id = testing::seed_history(&store, 5).await;
    for seq in [1, 3] {
        let mut message = store.history(&id, seq - 1, 1, true).await.expect("history");
        message[0].compacted = true;
        let value = encode(&message[0]).expect("encode");
        store
            .messages
            .insert(message_key(&id, seq), value)
            .expect("raw write");
    }
    testing::check_compacted_filter(&store, &id, &[1, 3]).await;
}

#[tokio::test]
async fn locked_or_unusable_path_is_an_error() {
    let (_store, dir) = open_temp();
    let second = SledStore::open(dir.path().join("db"));
    assert!(matches!(second, Err(StoreError::Backend(_))), "{second:?}");
    std::fs::write(dir.path().join("file"), b"not a directory").expect("write");
    let opened = SledStore::open(dir.path().join("file"));
    assert!(matches!(opened, Err(StoreError::Backend(_))), "{opened:?}");
}

/// A crash between the two steps of a delete leaves orphans behind.
#[tokio::test]
async fn orphans_of_an_interrupted_delete_stay_invisible() {
    let (store, _dir) = open_temp();
    let id = testing::seed_history(&store, 2).await;
    store
        .begin_turn(
            running_turn(&id, &testing::incarnation(&store, &id).await, "t1"),
            user("t1"),
        )
        .await
        .expect("begin");
    let session = store.get_session(&id).await.expect("get").expect("exists");
    store.sessions.remove(id.as_bytes()).expect("raw remove");
    store
        .activity
        .remove(activity_key(&session))
        .expect("raw remove");
    assert!(
        store
            .history(&id, 0, 10, true)
            .await
            .expect("history")
            .is_empty()
    );
    assert_eq!(store.get_turn(&id, "t1").await.expect("get_turn"), None);
    assert!(
        store
            .recover_interrupted()
            .await
            .expect("recover")
            .is_empty()
    );
    assert_eq!(store.turns.len(), 0, "recovery drops orphan turns");
    let new = NewSession {
        id: Some(id.clone()),
        ..NewSession::default()
    };
    assert!(matches!(
        store.create_session(new).await,
        Ok(CreateOutcome::Created(_))
    ));
    assert_eq!(
        store.messages.len(),
        0,
        "re-creating the id purges its leftovers"
    );
    assert_eq!(
        store
            .append_message(&id, &testing::incarnation(&store, &id).await, user("t2"))
            .await
            .expect("append")
            .seq,
        1
    );
}

#[tokio::test]
async fn activity_index_has_one_current_entry_per_session() {
    let (store, _dir) = open_temp();
    let a = testing::seed_history(&store, 3).await;
    let b = testing::seed_history(&store, 1).await;
    let update = SessionUpdate {
        title: Some("t".to_owned()),
        ..SessionUpdate::default()
    };
    store.update_session(&a, update).await.expect("update");
    store
        .begin_turn(
            running_turn(&b, &testing::incarnation(&store, &b).await, "t1"),
            user("t1"),
        )
        .await
        .expect("begin");
    let doomed = testing::seed_history(&store, 1).await;
    assert!(store.delete_session(&doomed, None).await.expect("delete"));
    let mut expected = Vec::new();
    for id in [&a, &b] {
        let session = store.get_session(id).await.expect("get").expect("exists");
        expected.push(activity_key(&session));
    }
    expected.sort();
    let keys = store
        .activity
        .iter()
        .keys()
        .map(|k| k.expect("key").to_vec());
    assert_eq!(keys.collect::<Vec<_>>(), expected);
}

#[tokio::test]
async fn nul_in_ids_is_refused() {
    let (store, _dir) = open_temp();
    let bad_id = NewSession {
        id: Some("a\0b".to_owned()),
        ..NewSession::default()
    };
    let bad_owner = NewSession {
        owner: "o\0".to_owned(),
        ..NewSession::default()
    };
    for new in [bad_id, bad_owner] {
        assert!(matches!(
            store.create_session(new).await,
            Err(StoreError::Backend(_))
        ));
    }
    assert_eq!(store.count_sessions().await.expect("count"), 0);
    assert_eq!(store.get_turn("a\0b", "t").await.expect("get_turn"), None);
}
