//! Turns through Chat: event order, persistence, busy admission, panics,
//! restarts.

use agentrt_client::{ChatEvent, proto};
use tonic::Code;
use tonic_types::StatusExt as _;

use super::harness::{Providers, TestServer, base_config, message_text, new_session, text_request};

#[tokio::test]
async fn echo_turn_streams_ordered_events_and_stores_both_messages() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let summary = client
        .chat(&session, "hello there")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(summary.status.is_none(), "{:?}", summary.status);
    assert_eq!(summary.text, "You said: hello there");
    let seqs: Vec<u64> = summary.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(matches!(summary.events[0].kind, ChatEvent::TurnStarted(_)));
    let finished = summary
        .events
        .iter()
        .filter(|e| matches!(e.kind, ChatEvent::TurnFinished { .. }))
        .count();
    assert_eq!(finished, 1);
    assert!(matches!(
        summary.events.last().unwrap().kind,
        ChatEvent::TurnFinished {
            outcome: proto::TurnOutcome::Success,
            ..
        }
    ));
    let text_deltas = summary
        .events
        .iter()
        .filter(|e| matches!(e.kind, ChatEvent::Text(_)))
        .count();
    assert!(
        text_deltas >= 3,
        "echo streams several deltas, got {text_deltas}"
    );
    let turn_id = &summary.events[0].turn_id;
    assert!(
        summary
            .events
            .iter()
            .all(|e| &e.turn_id == turn_id && e.session_id == session)
    );

    let stored: Vec<(u64, proto::Role)> = summary
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::MessageStored { seq, role, .. } => Some((*seq, *role)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stored,
        vec![(1, proto::Role::User), (2, proto::Role::Assistant)]
    );
    let history = client.history(&session).await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!((history[0].seq, history[0].role()), (1, proto::Role::User));
    assert_eq!(message_text(&history[0]), "hello there");
    assert_eq!(
        (history[1].seq, history[1].role()),
        (2, proto::Role::Assistant)
    );
    assert_eq!(message_text(&history[1]), "You said: hello there");
    assert_eq!(history[1].stop_reason, "stop");
    assert!(history.iter().all(|m| &m.turn_id == turn_id));

    let got = client.get_session(&session).await.unwrap();
    assert_eq!(got.message_count, 2);
    let last = got.last_turn.unwrap();
    assert_eq!(last.turn_id, *turn_id);
    assert_eq!(last.outcome(), proto::TurnOutcome::Success);
    server.stop().await;
}

#[tokio::test]
async fn per_call_model_thinking_and_system_override_are_applied() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = text_request(&session, "think");
    req.model = "builtin/echo".into();
    req.thinking = proto::ThinkingLevel::High.into();
    req.system_override = Some("be brief".into());
    let summary = client.chat_with(req).await.unwrap().finish().await.unwrap();
    let ChatEvent::TurnStarted(started) = &summary.events[0].kind else {
        panic!("first event is not turn_started");
    };
    assert_eq!(started.model, "builtin/echo");
    assert_eq!(started.thinking(), proto::ThinkingLevel::High);
    assert!(started.system_overridden);
    assert!(
        !summary.reasoning.is_empty(),
        "thinking HIGH makes echo reason"
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_chat_requests_are_rejected_without_side_effects() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let empty = proto::ChatRequest {
        session_id: session.clone(),
        ..Default::default()
    };
    let mut unknown_model = text_request(&session, "hi");
    unknown_model.model = "nowhere/model".into();
    let mut no_block_kind = text_request(&session, "hi");
    no_block_kind
        .content
        .push(proto::ContentBlock { block: None });
    let huge = text_request(&session, &"x".repeat(2 << 20));
    let mut bad_thinking = text_request(&session, "hi");
    bad_thinking.thinking = 99;

    for (name, req) in [
        ("empty", empty),
        ("unknown model", unknown_model),
        ("empty oneof", no_block_kind),
        ("oversized", huge),
        ("bad thinking", bad_thinking),
    ] {
        let err = client.chat_with(req).await.unwrap_err();
        let Some(status) = err.status().cloned() else {
            panic!("{name}: {err}")
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        let bad = status.get_error_details().bad_request().cloned();
        assert!(
            bad.is_some_and(|b| !b.field_violations.is_empty()),
            "{name}: no field violations"
        );
    }
    let missing = client.chat("no-such-session", "hi").await.unwrap_err();
    assert!(missing.code() == Some(Code::NotFound));

    assert!(client.history(&session).await.unwrap().is_empty());
    assert!(
        client
            .get_session(&session)
            .await
            .unwrap()
            .last_turn
            .is_none()
    );
    server.stop().await;
}

#[tokio::test]
async fn archived_sessions_reject_turns_until_unarchived() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    client
        .update_session(proto::UpdateSessionRequest {
            session_id: session.clone(),
            archived: Some(true),
            ..Default::default()
        })
        .await
        .unwrap();
    let err = client.chat(&session, "hi").await.unwrap_err();
    assert!(err.code() == Some(Code::FailedPrecondition));
    assert!(client.history(&session).await.unwrap().is_empty());
    client
        .update_session(proto::UpdateSessionRequest {
            session_id: session.clone(),
            archived: Some(false),
            ..Default::default()
        })
        .await
        .unwrap();
    let summary = client
        .chat(&session, "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    server.stop().await;
}

#[tokio::test]
async fn two_concurrent_chats_admit_exactly_one_200_times() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    for round in 0..200u64 {
        let mut a = text_request(&session, "a");
        a.model = "gate/x".into();
        let mut b = text_request(&session, "b");
        b.model = "gate/x".into();
        let (ra, rb) = tokio::join!(client.chat_with(a), client.chat_with(b));
        let (admitted, rejected) = match (ra, rb) {
            (Ok(s), Err(e)) | (Err(e), Ok(s)) => (s, e),
            (Ok(_), Ok(_)) => panic!("round {round}: both admitted"),
            (Err(a), Err(b)) => panic!("round {round}: both rejected: {a} / {b}"),
        };
        let Some(status) = rejected.status().cloned() else {
            panic!("round {round}: {rejected}")
        };
        assert_eq!(status.code(), Code::Aborted, "round {round}");
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, "SESSION_BUSY");
        assert_eq!(info.domain, "agentrt");
        assert!(info.metadata.contains_key("turn_id"));
        providers.gate.release(1);
        let summary = admitted.finish().await.unwrap();
        assert_eq!(
            summary.outcome,
            Some(proto::TurnOutcome::Success),
            "round {round}"
        );
        let ChatEvent::TurnStarted(_) = &summary.events[0].kind else {
            panic!()
        };
        assert_eq!(info.metadata["turn_id"], summary.events[0].turn_id);
    }
    let history = client.history(&session).await.unwrap();
    assert_eq!(
        history.len(),
        400,
        "one user and one assistant message per round"
    );
    let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_provider_ends_the_turn_internal_and_frees_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = text_request(&session, "boom");
    req.model = "panic/x".into();
    let summary = client.chat_with(req).await.unwrap().finish().await.unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    let status = summary.status.expect("trailing status");
    assert_eq!(status.code(), Code::Internal);
    let error_event = summary.events.iter().find_map(|e| match &e.kind {
        ChatEvent::Error { code, message } => Some((*code, message.clone())),
        _ => None,
    });
    let (code, message) = error_event.expect("an error event");
    assert_eq!(code, proto::ErrorCode::Internal);
    assert_eq!(message, status.message());
    assert!(
        !message.contains("on purpose"),
        "panic text must not leak: {message}"
    );

    let history = client.history(&session).await.unwrap();
    assert_eq!(history.len(), 2, "user message and the partial answer");
    assert_eq!(message_text(&history[1]), "before the panic");
    assert_eq!(history[1].stop_reason, "error");

    let next = client
        .chat(&session, "again")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(next.outcome, Some(proto::TurnOutcome::Success));
    server.stop().await;
}

#[tokio::test]
async fn restarting_on_the_same_data_dir_keeps_sessions_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let mut sessions = Vec::new();
    for i in 0..3 {
        let s = new_session(&client).await;
        for j in 0..2 {
            client
                .chat(&s, &format!("message {i}.{j}"))
                .await
                .unwrap()
                .finish()
                .await
                .unwrap();
        }
        sessions.push(s);
    }
    let before: Vec<_> = {
        let mut v = Vec::new();
        for s in &sessions {
            v.push(client.history(s).await.unwrap());
        }
        v
    };
    drop(client);
    server.stop().await;

    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    for (s, old) in sessions.iter().zip(&before) {
        let now = client.history(s).await.unwrap();
        assert_eq!(&now, old);
        assert_eq!(now.len(), 4);
    }
    let listed = client.list_sessions(Default::default()).await.unwrap();
    assert_eq!(listed.sessions.len(), 3);
    // Seqs continue after a restart, never reused.
    let s = &sessions[0];
    let summary = client
        .chat(s, "after restart")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let seqs: Vec<u64> = summary
        .events
        .iter()
        .filter_map(|e| match e.kind {
            ChatEvent::MessageStored { seq, .. } => Some(seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, vec![5, 6]);
    server.stop().await;
}
