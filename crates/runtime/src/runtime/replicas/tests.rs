//! `ListReplicas` on a store one process owns: the process itself and its
//! live turns, page by page; admins only; page tokens checked.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt as _;

use super::*;
use crate::events::EventKind;
use crate::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, Models};
use crate::runtime::{ChatInput, RuntimeConfig, TurnStream};
use crate::store::MemoryStore;
use crate::types::{ActorKind, ContentBlock, NewSession};

/// Streams one delta, then never finishes.
#[derive(Debug)]
struct Stall;

#[async_trait]
impl ModelProvider for Stall {
    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        let first = futures::stream::iter([Ok(ModelEvent::TextDelta("x".into()))]);
        Ok(Box::pin(first.chain(futures::stream::pending())))
    }
}

async fn runtime() -> Runtime {
    let mut models = Models::with_builtin();
    models.insert("stall", Arc::new(Stall));
    Runtime::open(
        RuntimeConfig::default(),
        Arc::new(MemoryStore::new()),
        models,
    )
    .await
    .unwrap()
}

/// A live turn of a new session `id` of `who`, streaming.
async fn live_turn(rt: &Runtime, who: &Principal, id: &str) -> TurnStream {
    let new = NewSession {
        id: Some(id.to_owned()),
        ..NewSession::default()
    };
    let session = rt.create_session(who, new).await.unwrap();
    let input = ChatInput {
        session_id: session.id,
        content: vec![ContentBlock::text("hi")],
        model: Some("stall/x".to_owned()),
        ..ChatInput::default()
    };
    let mut turn = rt.chat(who, input).await.unwrap();
    while !matches!(turn.next().await.unwrap().kind, EventKind::Text(_)) {}
    turn
}

#[tokio::test]
async fn a_single_node_lists_itself_and_its_live_turns_page_by_page() {
    let rt = runtime().await;
    let admin = Principal::local();
    let alice = Principal::new("alice", false, ActorKind::ApiKey);
    let bob = Principal::new("bob", false, ActorKind::ApiKey);
    let _b = live_turn(&rt, &bob, "s-b").await;
    let _a = live_turn(&rt, &alice, "s-a").await;

    let first = rt.list_replicas(&admin, 1, "").await.unwrap();
    assert_eq!(first.replicas.len(), 1, "{first:?}");
    let me = &first.replicas[0];
    assert!(me.this_replica && me.live && me.id.is_empty(), "{me:?}");
    assert!(me.started_at <= me.heartbeat_at);
    assert_eq!(first.leases.len(), 1);
    assert!(!first.next_page_token.is_empty());
    let second = rt
        .list_replicas(&admin, 1, &first.next_page_token)
        .await
        .unwrap();
    assert_eq!(second.replicas.len(), 1);
    assert!(second.replicas[0].this_replica);
    assert_eq!(second.leases.len(), 1);
    assert!(second.next_page_token.is_empty(), "the last page");

    let mut seen: Vec<(String, String)> = first
        .leases
        .iter()
        .chain(&second.leases)
        .map(|l| {
            assert!(l.replica_id.is_empty() && l.expires_at.is_none(), "{l:?}");
            assert!(l.started_at.is_some() && !l.turn_id.is_empty(), "{l:?}");
            (l.owner.clone(), l.session_id.clone())
        })
        .collect();
    seen.sort();
    let want = [("alice", "s-a"), ("bob", "s-b")].map(|(o, s)| (o.to_owned(), s.to_owned()));
    assert_eq!(seen, want, "each live turn once, by the id its owner knows");

    let all = rt.list_replicas(&admin, 0, "").await.unwrap();
    assert_eq!(all.leases.len(), 2);
    assert!(all.next_page_token.is_empty());
}

#[tokio::test]
async fn only_admins_list_replicas_and_foreign_tokens_are_refused() {
    let rt = runtime().await;
    let alice = Principal::new("alice", false, ActorKind::ApiKey);
    assert!(matches!(
        rt.list_replicas(&alice, 0, "").await,
        Err(RuntimeError::PermissionDenied(_))
    ));
    let admin = Principal::local();
    let long = "x".repeat(MAX_ID_BYTES + 1);
    for token in [
        "***".to_owned(),
        URL_SAFE_NO_PAD.encode("not json"),
        URL_SAFE_NO_PAD.encode(r#"["r", ""]"#),
        URL_SAFE_NO_PAD.encode(format!(r#"["r", "{long}"]"#)),
        "A".repeat(20_000),
    ] {
        assert!(
            matches!(
                rt.list_replicas(&admin, 0, &token).await,
                Err(RuntimeError::InvalidArgument(_))
            ),
            "{token}"
        );
    }
    let token = encode_token("replica-1", "session-1");
    assert_eq!(
        decode_token(&token).unwrap(),
        Some(LeaseCursor {
            replica_id: "replica-1".into(),
            session_id: "session-1".into()
        })
    );
}
