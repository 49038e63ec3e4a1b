//! Identity and isolation: credentials, and another user's session is
//! NOT_FOUND everywhere.

use agentrt_client::{Client, Error, proto};
use tonic::Code;

use super::harness::{Providers, TestServer, base_config, text_request, with_keys};

fn code(err: Error) -> Code {
    match err {
        e if e.status().is_some() => e.code().expect("a status"),
        other => panic!("not a status: {other}"),
    }
}

#[tokio::test]
async fn another_users_session_is_not_found_on_every_rpc() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_keys(
        base_config(dir.path()),
        &[("key-alice-1", "alice"), ("key-bob-12", "bob")],
    );
    let server = TestServer::start_with(config, &Providers::default()).await;
    let alice = server.client_with_token("key-alice-1").await;
    let bob = server.client_with_token("key-bob-12").await;
    let session = alice
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    alice
        .chat(&session, "mine")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();

    assert_eq!(
        code(bob.get_session(&session).await.unwrap_err()),
        Code::NotFound
    );
    assert_eq!(
        code(
            bob.chat_with(text_request(&session, "x"))
                .await
                .unwrap_err()
        ),
        Code::NotFound
    );
    assert_eq!(
        code(bob.history(&session).await.unwrap_err()),
        Code::NotFound
    );
    let update = proto::UpdateSessionRequest {
        session_id: session.clone(),
        title: Some("stolen".into()),
        ..Default::default()
    };
    assert_eq!(
        code(bob.update_session(update).await.unwrap_err()),
        Code::NotFound
    );
    assert_eq!(
        code(bob.delete_session(&session).await.unwrap_err()),
        Code::NotFound
    );
    assert_eq!(
        code(bob.compact_session(&session).await.unwrap_err()),
        Code::NotFound
    );
    assert!(
        bob.list_sessions(Default::default())
            .await
            .unwrap()
            .sessions
            .is_empty()
    );
    // Same client-chosen id from another owner: another session, his
    // (ids are unique per owner, so the id is no oracle).
    let same_id = proto::CreateSessionRequest {
        session_id: session.clone(),
        ..Default::default()
    };
    let his = bob.create_session(same_id).await.unwrap();
    assert_eq!(
        (
            his.session_id.as_str(),
            his.owner.as_str(),
            his.message_count
        ),
        (session.as_str(), "bob", 0)
    );
    assert!(bob.history(&session).await.unwrap().is_empty());

    // Alice still has it all.
    let s = alice.get_session(&session).await.unwrap();
    assert_ne!(s.title, "stolen");
    assert_eq!(s.owner, "alice");
    assert_eq!(alice.history(&session).await.unwrap().len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn missing_or_unknown_credentials_are_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_keys(base_config(dir.path()), &[("key-alice-1", "alice")]);
    let server = TestServer::start_with(config, &Providers::default()).await;
    let anonymous = server.client().await;
    let wrong = server.client_with_token("not-a-key").await;
    for client in [&anonymous, &wrong] {
        let err = client.create_session(Default::default()).await.unwrap_err();
        assert_eq!(code(err), Code::Unauthenticated);
        let err = client.chat("any", "hi").await.unwrap_err();
        assert_eq!(code(err), Code::Unauthenticated);
    }
    server.stop().await;
}

#[tokio::test]
async fn health_readiness_is_serving_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let config = with_keys(base_config(dir.path()), &[("key-alice-1", "alice")]);
    let server = TestServer::start_with(config, &Providers::default()).await;
    let channel = tonic::transport::Endpoint::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    // The first Check may arrive before the store is open; the watch stream
    // reports the transition without polling.
    let mut watch = health
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .unwrap()
        .into_inner();
    loop {
        let status = watch.message().await.unwrap().unwrap().status();
        if status == tonic_health::pb::health_check_response::ServingStatus::Serving {
            break;
        }
    }
    let _ = Client::connect(server.url.clone()).await.unwrap();
    server.stop().await;
}
