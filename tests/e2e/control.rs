//! Turn control: watching, stopping, disconnects, deadlines, heartbeats,
//! idempotency, admin calls.

use std::time::Duration;

use agentrt_client::{ChatEvent, Event, proto};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, text_chunk};
use futures::StreamExt as _;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session, read_until,
    small_window_watch, text_request, with_keys,
};

fn gated(session: &str, text: &str) -> proto::ChatRequest {
    let mut req = text_request(session, text);
    req.model = "gate/x".into();
    req
}

fn is_text(e: &Event) -> bool {
    matches!(e.kind, ChatEvent::Text(_))
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

fn finished(events: &[Event]) -> Option<(proto::TurnOutcome, proto::CancelReason)> {
    events.iter().find_map(|e| match e.kind {
        ChatEvent::TurnFinished {
            outcome,
            cancel_reason,
            ..
        } => Some((outcome, cancel_reason)),
        _ => None,
    })
}

#[tokio::test]
async fn a_late_watcher_gets_the_replay_then_the_live_rest() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut chat = client.chat_with(gated(&session, "hi")).await.unwrap();
    // The gate holds the turn after its first text delta (event 4).
    let head = read_until(&mut chat, is_text).await;
    assert!(head.len() >= 3);

    let mut from_start = client.subscribe(&session, 0, false).await.unwrap();
    let mut from_two = client.subscribe(&session, 2, false).await.unwrap();
    let replayed = read_until(&mut from_start, is_text).await;
    assert_eq!(seqs(&replayed), seqs(&head));
    let first_after_two = from_two.next().await.unwrap().unwrap();
    assert_eq!(first_after_two.seq, 3);
    assert_eq!(
        client.session_status(&session).await.unwrap().watcher_count,
        2
    );

    providers.gate.release(1);
    let rest_of_chat = chat.finish().await.unwrap();
    let rest_of_watch = from_start.finish().await.unwrap();
    let mut all = replayed.clone();
    all.extend(rest_of_watch.events);
    assert_eq!(seqs(&all), (1..=all.len() as u64).collect::<Vec<_>>());
    assert_eq!(all.len(), head.len() + rest_of_chat.events.len());
    assert_eq!(
        finished(&all),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        ))
    );
    assert!(rest_of_watch.status.is_none());
    let from_two = from_two.finish().await.unwrap();
    assert_eq!(
        from_two.events.last().map(|e| e.seq),
        all.last().map(|e| e.seq)
    );

    // Nothing live: Subscribe ends at once with OK.
    let idle = client
        .subscribe(&session, 0, false)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(idle.events.is_empty() && idle.status.is_none());
    server.stop().await;
}

#[tokio::test]
async fn wait_for_turn_attaches_to_the_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let watcher = client.subscribe(&session, 0, true).await.unwrap();
    let watching = tokio::spawn(watcher.finish());
    // The waiter is registered once Subscribe answered (headers received).
    let chat = client
        .chat(&session, "ping")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let watched = watching.await.unwrap().unwrap();
    assert_eq!(seqs(&watched.events), seqs(&chat.events));
    assert_eq!(watched.text, "You said: ping");
    server.stop().await;
}

#[tokio::test]
async fn a_watcher_asking_for_evicted_events_gets_a_replay_gap() {
    const EVENTS: u64 = 70_000;
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = text_request(&session, "go");
    req.model = format!("flood/{EVENTS}");
    let mut chat = client.chat_with(req).await.unwrap();
    // Attached from the start but not reading: it falls behind the replay.
    let mut slow = small_window_watch(&server.url, &session).await;
    let mut texts = 0;
    while texts < EVENTS {
        if matches!(chat.next().await.unwrap().unwrap().kind, ChatEvent::Text(_)) {
            texts += 1;
        }
    }
    let mut late = client.subscribe(&session, 0, false).await.unwrap();
    let first = late.next().await.unwrap().unwrap();
    let ChatEvent::ReplayGap {
        first_available_seq,
        lagged,
    } = first.kind
    else {
        panic!("expected replay_gap first, got {first:?}")
    };
    assert!(!lagged);
    assert!(first_available_seq > 1);
    let next = late.next().await.unwrap().unwrap();
    assert_eq!(next.seq, first_available_seq);
    providers.flood.release(1);
    let rest = late.finish().await.unwrap();
    assert!(finished(&rest.events).is_some());
    chat.finish().await.unwrap();

    let mut slow_events = Vec::new();
    while let Some(e) = slow.message().await.unwrap() {
        slow_events.push(Event::from(e));
    }
    let gaps: Vec<_> = slow_events
        .iter()
        .filter_map(|e| match e.kind {
            ChatEvent::ReplayGap {
                first_available_seq,
                lagged,
            } => Some((first_available_seq, lagged)),
            _ => None,
        })
        .collect();
    assert!(
        !gaps.is_empty() && gaps.iter().all(|(_, lagged)| *lagged),
        "{gaps:?}"
    );
    // Apart from the announced gaps, the seqs are contiguous.
    let mut expected = 1;
    for e in &slow_events {
        match e.kind {
            ChatEvent::ReplayGap {
                first_available_seq,
                ..
            } => expected = first_available_seq,
            _ => {
                assert_eq!(e.seq, expected);
                expected += 1;
            }
        }
    }
    assert!(finished(&slow_events).is_some());
    server.stop().await;
}

async fn fake_server(fake: &FakeOpenAi, dir: &std::path::Path) -> TestServer {
    let mut config = base_config(dir);
    config.default_model = "mock/model-a".into();
    config.providers.push(mock_provider(fake, None));
    TestServer::start_with(config, &Providers::default()).await
}

fn hanging() -> FakeReply {
    FakeReply::Sse {
        chunks: vec![text_chunk("partial")],
        done: false,
        then_hang: true,
    }
}

#[tokio::test]
async fn stop_cancels_the_model_request_and_stores_the_partial_text() {
    let fake = FakeOpenAi::start(vec![hanging()]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = fake_server(&fake, dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut chat = client.chat(&session, "hi").await.unwrap();
    read_until(&mut chat, is_text).await;

    assert!(client.stop_session(&session).await.unwrap());
    tokio::time::timeout(Duration::from_secs(1), fake.wait_clients_gone(1))
        .await
        .expect("the upstream request was closed within 1 s");
    let rest = chat.finish().await.unwrap();
    assert_eq!(
        finished(&rest.events),
        Some((proto::TurnOutcome::Canceled, proto::CancelReason::Stopped))
    );
    assert_eq!(rest.status.map(|s| s.code()), Some(Code::Cancelled));
    assert!(!client.stop_session(&session).await.unwrap());
    let history = client.history(&session).await.unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(message_text(&history[1]), "partial");
    assert_eq!(history[1].stop_reason, "cancelled");
    let status = client.session_status(&session).await.unwrap();
    assert!(!status.live);
    server.stop().await;
}

#[tokio::test]
async fn a_caller_that_goes_away_cancels_its_turn_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut chat = client.chat_with(gated(&session, "hi")).await.unwrap();
    read_until(&mut chat, is_text).await;
    let watcher = client.subscribe(&session, 0, false).await.unwrap();
    drop(chat);
    let watched = tokio::time::timeout(Duration::from_secs(1), watcher.finish())
        .await
        .expect("the turn ended within 1 s")
        .unwrap();
    assert_eq!(
        finished(&watched.events),
        Some((
            proto::TurnOutcome::Canceled,
            proto::CancelReason::ClientGone
        ))
    );
    assert!(!client.session_status(&session).await.unwrap().live);
    let history = client.history(&session).await.unwrap();
    assert_eq!(history[1].stop_reason, "client_gone");
    assert_eq!(message_text(&history[1]), "gated ");
    server.stop().await;
}

#[tokio::test]
async fn with_on_disconnect_continue_the_turn_runs_on_and_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = gated(&session, "hi");
    req.on_disconnect = proto::OnDisconnect::Continue.into();
    let mut chat = client.chat_with(req).await.unwrap();
    read_until(&mut chat, is_text).await;
    let watcher = client.subscribe(&session, 0, false).await.unwrap();
    drop(chat);
    providers.gate.release(1);
    let watched = watcher.finish().await.unwrap();
    assert_eq!(
        finished(&watched.events),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        ))
    );
    let history = client.history(&session).await.unwrap();
    assert_eq!(message_text(&history[1]), "gated answer");
    server.stop().await;
}

#[tokio::test]
async fn a_turn_past_its_deadline_times_out_with_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = gated(&session, "slow");
    req.timeout = Some(prost_types::Duration {
        seconds: 0,
        nanos: 200_000_000,
    });
    let summary = client.chat_with(req).await.unwrap().finish().await.unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::TimedOut));
    assert_eq!(
        summary.status.map(|s| s.code()),
        Some(Code::DeadlineExceeded)
    );
    let history = client.history(&session).await.unwrap();
    let roles: Vec<_> = history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        [
            proto::Role::User,
            proto::Role::Assistant,
            proto::Role::Notice
        ]
    );
    assert_eq!(history[1].stop_reason, "timeout");
    assert!(message_text(&history[2]).contains("time limit"));
    let last = client
        .get_session(&session)
        .await
        .unwrap()
        .last_turn
        .unwrap();
    assert_eq!(last.outcome(), proto::TurnOutcome::TimedOut);

    // The gRPC deadline bounds the turn too.
    let mut raw = client.runtime_raw();
    let mut request = tonic::Request::new(gated(&session, "slow again"));
    request.set_timeout(Duration::from_millis(300));
    let mut stream = raw.chat(request).await.unwrap().into_inner();
    let mut outcome = None;
    let end = loop {
        match stream.message().await {
            Ok(Some(e)) => {
                if let Some(proto::chat_event::Kind::TurnFinished(f)) = e.kind {
                    outcome = Some(f.outcome());
                }
            }
            Ok(None) => break None,
            Err(status) => break Some(status.code()),
        }
    };
    assert_eq!(end, Some(Code::DeadlineExceeded));
    assert_eq!(outcome, Some(proto::TurnOutcome::TimedOut));
    server.stop().await;
}

#[tokio::test]
async fn quiet_turns_send_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.heartbeat_interval = Duration::from_millis(50);
    let providers = Providers::default();
    let server = TestServer::start_with(config, &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut chat = client.chat_with(gated(&session, "hi")).await.unwrap();
    let seen = read_until(&mut chat, |e| matches!(e.kind, ChatEvent::Heartbeat { .. })).await;
    let ChatEvent::Heartbeat { phase, .. } = &seen.last().unwrap().kind else {
        panic!()
    };
    assert_eq!(phase, "model");
    assert_eq!(seqs(&seen), (1..=seen.len() as u64).collect::<Vec<_>>());
    providers.gate.release(1);
    chat.finish().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn the_same_request_id_runs_once_sequentially_and_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let mut req = text_request(&session, "once");
    req.request_id = "req-1".into();
    let first = client
        .chat_with(req.clone())
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let second = client.chat_with(req).await.unwrap().finish().await.unwrap();
    assert_eq!(first.text, second.text);
    assert_eq!(first.outcome, second.outcome);
    assert_eq!(first.events[0].turn_id, second.events[0].turn_id);
    assert_eq!(client.history(&session).await.unwrap().len(), 2);

    let mut req = gated(&session, "twice at once");
    req.request_id = "req-2".into();
    let (a, b) = tokio::join!(client.chat_with(req.clone()), client.chat_with(req));
    let (a, b) = (a.unwrap(), b.unwrap());
    providers.gate.release(1);
    let (a, b) = (a.finish().await.unwrap(), b.finish().await.unwrap());
    assert_eq!(a.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(b.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(a.events[0].turn_id, b.events[0].turn_id);
    assert_eq!(a.text, b.text);
    let history = client.history(&session).await.unwrap();
    assert_eq!(
        history.len(),
        4,
        "one user message and one answer per request id"
    );
    server.stop().await;
}

#[tokio::test]
async fn admin_calls_need_an_admin_and_default_model_changes_apply_to_the_next_turn() {
    let fake = FakeOpenAi::start(vec![
        hanging(),
        FakeReply::sse(vec![
            text_chunk("b"),
            agentrt_testkit::fake_openai::finish_chunk("stop"),
        ]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_keys(base_config(dir.path()), &[("key-user-1", "user")]);
    config
        .auth
        .api_keys
        .push(agentrt_server::config::ApiKeyConfig::inline(
            "key-admin-1",
            "ops",
            true,
        ));
    config.default_model = "mock/model-a".into();
    config.providers.push(mock_provider(&fake, None));
    let server = TestServer::start_with(config, &Providers::default()).await;
    let user = server.client_with_token("key-user-1").await;
    let ops = server.client_with_token("key-admin-1").await;

    let denied = user
        .admin()
        .get_runtime_stats(proto::GetRuntimeStatsRequest {})
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    let session = new_session(&user).await;
    let mut chat = user.chat(&session, "first").await.unwrap();
    let head = read_until(&mut chat, is_text).await;
    let previous = ops
        .admin()
        .set_default_model(proto::SetDefaultModelRequest {
            model: "mock/model-b".into(),
            thinking: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .previous_model;
    assert_eq!(previous, "mock/model-a");
    let reset = ops
        .admin()
        .reset_runners(proto::ResetRunnersRequest::default())
        .await
        .unwrap();
    assert_eq!(reset.into_inner().count, 1);
    let stats = ops
        .admin()
        .get_runtime_stats(proto::GetRuntimeStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.live_turns, 1);
    assert_eq!(stats.default_model, "mock/model-b");
    assert!(user.stop_session(&session).await.unwrap());
    chat.finish().await.unwrap();
    let ChatEvent::TurnStarted(started) = &head[0].kind else {
        panic!()
    };
    assert_eq!(
        started.model, "mock/model-a",
        "the live turn kept its model"
    );

    let second = user
        .chat(&session, "second")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let ChatEvent::TurnStarted(started) = &second.events[0].kind else {
        panic!()
    };
    assert_eq!(started.model, "mock/model-b");
    let requests = fake.requests();
    assert_eq!(requests[0].body["model"], "model-a");
    assert_eq!(requests[1].body["model"], "model-b");

    let bad = ops
        .admin()
        .set_default_model(proto::SetDefaultModelRequest {
            model: "nowhere/x".into(),
            thinking: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    server.stop().await;
}

/// Watches a health service until it reports `want`; each status change
/// arrives on the stream, so no polling is needed.
async fn wait_health(
    health: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
    service: &str,
    want: tonic_health::pb::health_check_response::ServingStatus,
) {
    let mut watch = health
        .watch(tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner();
    loop {
        let status = watch.message().await.unwrap().unwrap().status();
        if status == want {
            return;
        }
    }
}

#[tokio::test]
async fn an_admin_drain_turns_readiness_not_serving_while_liveness_stays_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let channel = tonic::transport::Endpoint::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    wait_health(&mut health, "readiness", ServingStatus::Serving).await;
    let check = |service: &str| tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    let live = health.check(check("liveness")).await.unwrap().into_inner();
    assert_eq!(live.status(), ServingStatus::Serving);

    let session = new_session(&client).await;
    let mut chat = client.chat_with(gated(&session, "hi")).await.unwrap();
    read_until(&mut chat, is_text).await;
    let drained = client
        .admin()
        .drain(proto::DrainRequest {
            timeout: Some(prost_types::Duration {
                seconds: 0,
                nanos: 50_000_000,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(drained.remaining, 1, "the gated turn is still live");
    wait_health(&mut health, "readiness", ServingStatus::NotServing).await;
    let overall = health.check(check("")).await.unwrap().into_inner();
    assert_eq!(overall.status(), ServingStatus::NotServing);
    // Mid-drain, with a turn still live: a liveness probe must not see a
    // dead process.
    let live = health.check(check("liveness")).await.unwrap().into_inner();
    assert_eq!(live.status(), ServingStatus::Serving);

    providers.gate.release(1);
    assert_eq!(
        chat.finish().await.unwrap().outcome,
        Some(proto::TurnOutcome::Success)
    );
    let live = health.check(check("liveness")).await.unwrap().into_inner();
    assert_eq!(live.status(), ServingStatus::Serving);
    server.stop().await;
}

#[tokio::test]
async fn drain_refuses_new_turns_and_waits_for_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let other = new_session(&client).await;
    let mut chat = client.chat_with(gated(&session, "hi")).await.unwrap();
    read_until(&mut chat, is_text).await;
    let drained = client
        .admin()
        .drain(proto::DrainRequest {
            timeout: Some(prost_types::Duration {
                seconds: 0,
                nanos: 100_000_000,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(drained.remaining, 1);
    let refused = client.chat(&other, "late").await.unwrap_err();
    assert!(refused.code() == Some(Code::Unavailable));
    providers.gate.release(1);
    assert_eq!(
        chat.finish().await.unwrap().outcome,
        Some(proto::TurnOutcome::Success)
    );
    let drained = client
        .admin()
        .drain(proto::DrainRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(drained.remaining, 0);
    server.stop().await;
}
