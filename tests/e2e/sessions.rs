//! SessionService through the client.

use std::collections::HashSet;

use agentrt_client::proto;
use tonic::Code;

use super::harness::{TestServer, new_session};

#[tokio::test]
async fn create_with_a_chosen_id_is_idempotent_and_round_trips_fields() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let req = proto::CreateSessionRequest {
        session_id: "support-42".into(),
        agent_id: "helpdesk".into(),
        title: "Printer".into(),
        model: "builtin/echo".into(),
        system_prompt: "Be kind.".into(),
        metadata: [("ticket".to_owned(), "42".to_owned())].into(),
        project_id: "p1".into(),
        budget: Some(proto::Budget {
            max_tokens: Some(10_000),
            max_cost: Some(0.25),
        }),
        ..Default::default()
    };
    let first = client.create_session(req.clone()).await.unwrap();
    let again = client.create_session(req).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(first.session_id, "support-42");
    assert_eq!(first.owner, "local");
    assert_eq!(first.agent_id, "helpdesk");
    assert_eq!(first.metadata["ticket"], "42");
    assert_eq!(first.budget, req_budget());
    assert_eq!(
        (
            first.spent_usage.unwrap_or_default().input_tokens,
            first.spent_cost
        ),
        (0, 0.0)
    );
    assert_eq!(client.get_session("support-42").await.unwrap(), first);

    let bad = proto::CreateSessionRequest {
        session_id: "has spaces/and slashes".into(),
        ..Default::default()
    };
    let err = client.create_session(bad).await.unwrap_err();
    assert!(err.code() == Some(Code::InvalidArgument));
    let bad_model = proto::CreateSessionRequest {
        model: "nowhere/x".into(),
        ..Default::default()
    };
    let err = client.create_session(bad_model).await.unwrap_err();
    assert!(err.code() == Some(Code::InvalidArgument));
    server.stop().await;
}

#[tokio::test]
async fn list_is_newest_activity_first_and_pages_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let mut created = Vec::new();
    for i in 0..7 {
        let s = client
            .create_session(proto::CreateSessionRequest {
                agent_id: if i % 2 == 0 {
                    "even".into()
                } else {
                    "odd".into()
                },
                ..Default::default()
            })
            .await
            .unwrap();
        created.push(s.session_id);
    }
    // Activity on the oldest moves it to the front.
    client
        .chat(&created[0], "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();

    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_sessions(proto::ListSessionsRequest {
                page_size: 3,
                page_token: std::mem::take(&mut token),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.sessions.len() <= 3);
        seen.extend(page.sessions.into_iter().map(|s| s.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen.len(), 7);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 7);
    assert_eq!(seen[0], created[0]);
    let rest: Vec<_> = created[1..].iter().rev().cloned().collect();
    assert_eq!(seen[1..], rest[..]);

    let even = client
        .list_sessions(proto::ListSessionsRequest {
            agent_id: "even".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(even.sessions.len(), 4);
    let err = client
        .list_sessions(proto::ListSessionsRequest {
            page_token: "garbage!".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.code() == Some(Code::InvalidArgument));
    server.stop().await;
}

#[tokio::test]
async fn update_sets_only_present_fields_and_archived_sessions_are_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let id = new_session(&client).await;
    let updated = client
        .update_session(proto::UpdateSessionRequest {
            session_id: id.clone(),
            title: Some("New title".into()),
            metadata: Some(proto::MetadataUpdate {
                entries: [("k".to_owned(), "v".to_owned())].into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(updated.title, "New title");
    assert_eq!(updated.metadata["k"], "v");
    assert_eq!(updated.system_prompt, "");
    let archived = client
        .update_session(proto::UpdateSessionRequest {
            session_id: id.clone(),
            archived: Some(true),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(archived.archived);
    assert_eq!(archived.title, "New title");
    let listed = client.list_sessions(Default::default()).await.unwrap();
    assert!(listed.sessions.is_empty());
    let all = client
        .list_sessions(proto::ListSessionsRequest {
            include_archived: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.sessions.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn delete_removes_the_session_and_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let id = new_session(&client).await;
    client
        .chat(&id, "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(client.delete_session(&id).await.unwrap());
    let err = client.get_session(&id).await.unwrap_err();
    assert!(err.code() == Some(Code::NotFound));
    let err = client.history(&id).await.unwrap_err();
    assert!(err.code() == Some(Code::NotFound));
    let err = client.delete_session(&id).await.unwrap_err();
    assert!(err.code() == Some(Code::NotFound));
    // The id can be used again, with a fresh history.
    let again = client
        .create_session(proto::CreateSessionRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(again.message_count, 0);
    server.stop().await;
}

#[tokio::test]
async fn history_pages_by_after_seq_and_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let id = new_session(&client).await;
    for i in 0..5 {
        client
            .chat(&id, &format!("m{i}"))
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
    }
    let page = client
        .history_page(proto::GetHistoryRequest {
            session_id: id.clone(),
            after_seq: 3,
            page_size: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    let seqs: Vec<u64> = page.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![4, 5, 6, 7]);
    assert_eq!(page.last_seq, 7);
    let next = client
        .history_page(proto::GetHistoryRequest {
            session_id: id.clone(),
            page_size: 4,
            page_token: page.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap();
    let seqs: Vec<u64> = next.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![8, 9, 10]);
    assert!(next.next_page_token.is_empty());
    server.stop().await;
}

fn req_budget() -> Option<proto::Budget> {
    Some(proto::Budget {
        max_tokens: Some(10_000),
        max_cost: Some(0.25),
    })
}
