//! Contract check for the session keys the runtime stores when client ids
//! are scoped to their owner (P12): the same client id from two owners is
//! stored under the id itself (a server-generated id, or one stored before
//! scoping) and under the id with a `~<owner tag>` suffix — two keys of
//! which one extends the other. Each must be a session of its own, with no
//! message, turn, request id, listing or delete reaching the other.

use agentrt_runtime::store::Store;
use agentrt_runtime::types::NewSession;

use super::{append, begin, create_new, get, history, turn};

/// A stored key as the runtime scopes client id `id` for an owner.
const SCOPED: &str = "support-42~0123456789abcdef0123456789abcdef";

/// Two sessions whose keys are a client id and that id scoped to another
/// owner stay apart in everything.
pub async fn a_key_extending_another_is_its_own_session(store: &dyn Store) {
    let named = |id: &str, owner: &str| NewSession {
        id: Some(id.to_owned()),
        owner: owner.to_owned(),
        ..NewSession::default()
    };
    let plain = create_new(store, named("support-42", "alice")).await;
    let scoped = create_new(store, named(SCOPED, "bob")).await;
    assert_eq!(
        (plain.id.as_str(), scoped.id.as_str()),
        ("support-42", SCOPED)
    );
    assert_eq!(get(store, SCOPED).await.owner, "bob");

    begin(store, "support-42", "t1").await;
    append(store, "support-42", "alice's answer").await;
    begin(store, SCOPED, "t2").await;
    let texts = async |id: &str| {
        history(store, id)
            .await
            .iter()
            .map(|m| agentrt_runtime::types::flatten_text(&m.body.content))
            .collect::<Vec<_>>()
    };
    assert_eq!(texts("support-42").await, ["question", "alice's answer"]);
    assert_eq!(texts(SCOPED).await, ["question"]);
    assert_eq!(get(store, SCOPED).await.message_count, 1);
    assert!(turn(store, SCOPED, "t1").await.is_none());
    assert!(turn(store, "support-42", "t2").await.is_none());
    let by_request = |id: &'static str, request: &'static str| async move {
        store
            .find_turn_by_request(id, request)
            .await
            .expect("find_turn_by_request")
    };
    assert!(by_request(SCOPED, "req-t1").await.is_none());
    assert!(by_request(SCOPED, "req-t2").await.is_some());

    assert!(
        store
            .delete_session("support-42", None)
            .await
            .expect("delete_session")
    );
    assert_eq!(texts(SCOPED).await, ["question"]);
    assert!(turn(store, SCOPED, "t2").await.is_some());
    assert!(
        store
            .get_session("support-42")
            .await
            .expect("get")
            .is_none()
    );
}
