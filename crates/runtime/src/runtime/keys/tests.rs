//! Scoped keys, and the runtime's calls over them: the same client id from
//! two owners is two sessions; a session stored under a client id before
//! ids were scoped keeps working for its owner.

use std::sync::Arc;

use futures::StreamExt as _;

use super::{client_id, fnv1a_128, scoped_key};
use crate::error::RuntimeError;
use crate::model::Models;
use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
use crate::store::{MemoryStore, Store};
use crate::types::{ContentBlock, NewSession, Principal};

fn user(name: &str) -> Principal {
    Principal::new(name, false, crate::types::ActorKind::ApiKey)
}

async fn runtime() -> (Runtime, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let rt = Runtime::open(
        RuntimeConfig::default(),
        Arc::clone(&store) as Arc<dyn Store>,
        Models::with_builtin(),
    )
    .await
    .unwrap();
    (rt, store)
}

fn named(id: &str) -> NewSession {
    NewSession {
        id: Some(id.to_owned()),
        ..NewSession::default()
    }
}

/// A finished echo turn of `who` in `id`: the id its stream names, and
/// the turn id.
async fn say(rt: &Runtime, who: &Principal, id: &str, text: &str) -> (String, String) {
    let input = ChatInput {
        session_id: id.to_owned(),
        content: vec![ContentBlock::text(text)],
        model: Some("builtin/echo".to_owned()),
        ..ChatInput::default()
    };
    let mut turn = rt.chat(who, input).await.unwrap();
    while turn.next().await.is_some() {}
    (turn.session_id().to_owned(), turn.turn_id().to_owned())
}

async fn texts(rt: &Runtime, who: &Principal, id: &str) -> Vec<String> {
    let page = rt.history(who, id, 0, 100, "", true).await.unwrap();
    page.messages
        .iter()
        .map(|m| crate::types::flatten_text(&m.body.content))
        .collect()
}

#[test]
fn a_scoped_key_is_per_owner_and_maps_back_to_the_client_id() {
    let alice = scoped_key("alice", "my-session");
    let bob = scoped_key("bob", "my-session");
    assert_ne!(alice, bob);
    assert_eq!(alice, scoped_key("alice", "my-session"), "stable");
    assert_eq!(client_id(&alice), "my-session");
    assert_eq!(client_id(&bob), "my-session");
    // Server-generated and pre-scoping ids are their own client ids.
    let uuid = "0198f5d2-6a4e-7c0e-9d4b-3f2a1b0c9d8e";
    assert_eq!(client_id(uuid), uuid);
    // Pinned: stored keys must not change between releases.
    assert_eq!(
        scoped_key("alice", "s"),
        format!("s~{:032x}", fnv1a_128(b"alice"))
    );
    assert_eq!(fnv1a_128(b""), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
    assert_eq!(fnv1a_128(b"a"), 0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964);
}

#[tokio::test]
async fn the_same_client_id_from_two_owners_is_two_sessions() {
    let (rt, store) = runtime().await;
    let (alice, bob) = (user("alice"), user("bob"));
    let a = rt
        .create_session(&alice, named("support-42"))
        .await
        .unwrap();
    let b = rt.create_session(&bob, named("support-42")).await.unwrap();
    assert_eq!((a.id.as_str(), a.owner.as_str()), ("support-42", "alice"));
    assert_eq!((b.id.as_str(), b.owner.as_str()), ("support-42", "bob"));
    assert_ne!(a.incarnation, b.incarnation);
    // Idempotent per owner.
    let again = rt
        .create_session(&alice, named("support-42"))
        .await
        .unwrap();
    assert_eq!(again.incarnation, a.incarnation);
    assert_eq!(store.count_sessions().await.unwrap(), 2);

    let (named_a, turn_a) = say(&rt, &alice, "support-42", "from a").await;
    let (named_b, _) = say(&rt, &bob, "support-42", "from b").await;
    assert_eq!(
        (named_a.as_str(), named_b.as_str()),
        ("support-42", "support-42")
    );
    assert!(
        texts(&rt, &alice, "support-42")
            .await
            .contains(&"from a".to_owned())
    );
    assert!(
        !texts(&rt, &alice, "support-42")
            .await
            .iter()
            .any(|t| t.contains("from b"))
    );
    assert!(
        !texts(&rt, &bob, "support-42")
            .await
            .iter()
            .any(|t| t.contains("from a"))
    );
    // Every answer names the session by its client id.
    let listed = rt
        .list_sessions(&bob, 10, "", None, None, true)
        .await
        .unwrap();
    let ids: Vec<_> = listed.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["support-42"]);
    let detail = rt
        .turn(&alice, "support-42", &turn_a)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.record.session_id, "support-42");
    assert!(
        rt.turn(&bob, "support-42", &turn_a)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        rt.get_session(&bob, "support-42").await.unwrap().owner,
        "bob"
    );
    // A third user has none.
    let carol = user("carol");
    assert!(matches!(
        rt.get_session(&carol, "support-42").await,
        Err(RuntimeError::SessionNotFound)
    ));
    // Deleting bob's leaves alice's.
    assert!(rt.delete_session(&bob, "support-42").await.unwrap());
    assert_eq!(
        rt.get_session(&alice, "support-42")
            .await
            .unwrap()
            .message_count,
        2
    );
}

#[tokio::test]
async fn a_session_stored_under_its_client_id_before_scoping_keeps_working() {
    let (rt, store) = runtime().await;
    let (alice, bob) = (user("alice"), user("bob"));
    // What an existing data dir holds: the client id as the stored key.
    let legacy = NewSession {
        id: Some("legacy-7".to_owned()),
        owner: "alice".to_owned(),
        ..NewSession::default()
    };
    store.create_session(legacy).await.unwrap();
    let old = rt.get_session(&alice, "legacy-7").await.unwrap();
    let (seen_as, _) = say(&rt, &alice, "legacy-7", "still here").await;
    assert_eq!(seen_as, "legacy-7");
    assert_eq!(
        store
            .get_session("legacy-7")
            .await
            .unwrap()
            .unwrap()
            .message_count,
        2
    );
    // Creating it again is idempotent for alice...
    let again = rt.create_session(&alice, named("legacy-7")).await.unwrap();
    assert_eq!(again.incarnation, old.incarnation);
    // ...and another session for bob, which alice's calls never reach.
    let b = rt.create_session(&bob, named("legacy-7")).await.unwrap();
    assert_eq!((b.owner.as_str(), b.message_count), ("bob", 0));
    assert!(
        !texts(&rt, &bob, "legacy-7")
            .await
            .iter()
            .any(|t| t.contains("still here"))
    );
    assert!(
        texts(&rt, &alice, "legacy-7")
            .await
            .contains(&"still here".to_owned())
    );
}
