//! Two replicas in this process on one PostgreSQL database (a real one, from
//! `agentrt_testkit::pg`): one live turn per session across both, and every
//! call for it answered wherever it lands — forwarded over the internal
//! cluster service to the replica that owns the turn. Also: the internal
//! service refuses calls without the cluster key, and a replica whose
//! database goes away reports NOT_SERVING, refuses Chats, and comes back
//! with nothing lost.

use std::sync::Arc;
use std::time::Duration;

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::proto;
use agentrt_client::proto::chat_event::Kind;
use agentrt_client::proto::session_service_client::SessionServiceClient;
use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use agentrt_runtime::types::StopReason;
use agentrt_server::Config;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, text_chunk};
use agentrt_testkit::gate::GateProvider;
use agentrt_testkit::tcp_proxy::TcpProxy;
use async_trait::async_trait;
use support::*;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt as _;

#[tokio::test]
async fn one_turn_per_session_across_replicas_and_every_call_reaches_it() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = replica(&db.url, true, &gate_models(&gate)).await;
    let b = replica(&db.url, true, &gate_models(&gate)).await;
    assert_ne!(a.server.replica_id(), b.server.replica_id());
    let (mut on_a, mut on_b) = (runtime(&a).await, runtime(&b).await);
    let session = new_session(&a).await;

    let mut owner = on_a
        .chat(chat(&session, "gate/x", "req-1"))
        .await
        .unwrap()
        .into_inner();
    let started = until(&mut owner, is_text).await;
    let turn_id = started[0].turn_id.clone();

    // A second Chat on the other replica: busy, cluster-wide, naming the turn.
    let busy = on_b
        .chat(chat(&session, "gate/x", "req-2"))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    let info = busy.get_error_details().error_info().cloned().unwrap();
    assert_eq!(info.reason, "SESSION_BUSY");
    assert_eq!(info.metadata.get("turn_id"), Some(&turn_id));

    // Status and Close on B are answered by A.
    let status = on_b
        .get_session_status(proto::GetSessionStatusRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(status.live);
    assert_eq!(status.turn_id, turn_id);
    let closed = on_b
        .close_session(proto::CloseSessionRequest {
            session_id: session.clone(),
            force: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed, "the owner had the session's runner cached");

    // Subscribe on B replays A's turn from the start and follows it.
    let mut watcher = on_b
        .subscribe(proto::SubscribeRequest {
            session_id: session.clone(),
            after_seq: 0,
            wait_for_turn: false,
        })
        .await
        .unwrap()
        .into_inner();
    let replayed = until(&mut watcher, is_text).await;
    assert!(matches!(replayed[0].kind, Some(Kind::TurnStarted(_))));
    // A retry of the first Chat on B joins A's turn.
    let mut joined = on_b
        .chat(chat(&session, "gate/x", "req-1"))
        .await
        .unwrap()
        .into_inner();
    let rejoined = until(&mut joined, is_text).await;
    assert_eq!(rejoined[0].turn_id, turn_id);

    gate.release(1);
    let (rest, trailer) = drain(&mut watcher).await;
    assert!(trailer.is_none(), "{trailer:?}");
    let seqs: Vec<u64> = replayed.iter().chain(&rest).map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "contiguous"
    );
    assert!(rest.iter().all(|e| e.turn_id == turn_id));
    assert_eq!(outcome(&rest), Some(proto::TurnOutcome::Success));
    let (joined_rest, trailer) = drain(&mut joined).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(outcome(&joined_rest), Some(proto::TurnOutcome::Success));
    let (owner_rest, _) = drain(&mut owner).await;
    assert_eq!(outcome(&owner_rest), Some(proto::TurnOutcome::Success));

    // Nothing is live now: B answers by itself, and admits the next turn.
    let status = on_b
        .get_session_status(proto::GetSessionStatusRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!status.live);
    gate.release(1);
    let mut next_turn = on_b
        .chat(chat(&session, "gate/x", "req-3"))
        .await
        .unwrap()
        .into_inner();
    let (events, _) = drain(&mut next_turn).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    let history = SessionServiceClient::new(channel(a.server.url()).await)
        .get_history(proto::GetHistoryRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "two turns, no duplicate, no gap");
    a.server.stop().await;
    b.server.stop().await;
}

#[tokio::test]
async fn stop_on_another_replica_closes_the_owners_model_request() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let upstream = FakeOpenAi::start(vec![FakeReply::Sse {
        chunks: vec![text_chunk("partial")],
        done: false,
        then_hang: true,
    }])
    .await;
    let provider = Config::parse_toml(&format!(
        "[[providers]]\nname = \"fake\"\nkind = \"openai\"\nbase_url = \"{}\"\nmax_retries = 0\n",
        upstream.base_url()
    ))
    .unwrap()
    .providers;
    let a = replica_with(&db.url, true, &[], |c| c.providers = provider).await;
    let b = replica(&db.url, true, &[]).await;
    let session = new_session(&a).await;
    let mut owner = runtime(&a)
        .await
        .chat(chat(&session, "fake/m", ""))
        .await
        .unwrap()
        .into_inner();
    until(&mut owner, is_text).await;

    let stopped = tokio::time::timeout(
        Duration::from_secs(1),
        runtime(&b).await.stop_session(proto::StopSessionRequest {
            session_id: session.clone(),
            clear_inbox: false,
        }),
    )
    .await
    .expect("stopped within a second")
    .unwrap()
    .into_inner();
    assert!(stopped.stopped);
    tokio::time::timeout(WAIT, upstream.wait_clients_gone(1))
        .await
        .expect("the upstream saw its request closed");
    let (events, trailer) = drain(&mut owner).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Canceled));
    assert_eq!(trailer.map(|s| s.code()), Some(Code::Cancelled));
    a.server.stop().await;
    b.server.stop().await;
}

/// Calls one caller-executed tool (`lookup`), then answers with its result.
#[derive(Debug)]
struct CallsLookup;

#[async_trait]
impl ModelProvider for CallsLookup {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let answered = request.messages.iter().any(|m| {
            m.body
                .content
                .iter()
                .any(|b| matches!(b, agentrt_runtime::types::ContentBlock::ToolResult { .. }))
        });
        let events = if answered {
            vec![
                ModelEvent::TextDelta("done".into()),
                ModelEvent::Finished(StopReason::Stop),
            ]
        } else {
            vec![
                ModelEvent::ToolCall {
                    id: "call-1".into(),
                    name: "lookup".into(),
                    arguments_json: "{}".into(),
                },
                ModelEvent::Finished(StopReason::ToolUse),
            ]
        };
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

#[tokio::test]
async fn a_tool_result_sent_to_another_replica_reaches_the_turn() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let tools: Vec<(&str, Arc<dyn ModelProvider>)> = vec![("tools", Arc::new(CallsLookup))];
    let a = replica(&db.url, true, &tools).await;
    let b = replica(&db.url, true, &tools).await;
    let session = new_session(&a).await;
    let mut request = chat(&session, "tools/x", "");
    request.extra_tools = vec![proto::ToolDefinition {
        name: "lookup".to_owned(),
        description: "looks it up".to_owned(),
        parameters_json_schema: "{\"type\":\"object\"}".to_owned(),
    }];
    let mut owner = runtime(&a).await.chat(request).await.unwrap().into_inner();
    let seen = until(&mut owner, |k| matches!(k, Kind::ToolCall(_))).await;
    let turn_id = seen[0].turn_id.clone();

    runtime(&b)
        .await
        .submit_tool_result(proto::SubmitToolResultRequest {
            session_id: session.clone(),
            turn_id: turn_id.clone(),
            call_id: "call-1".to_owned(),
            content: "42".to_owned(),
            is_error: false,
            media: Vec::new(),
        })
        .await
        .unwrap();
    let (events, trailer) = drain(&mut owner).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    // A second submit, again through B: the owner's ALREADY_EXISTS is
    // passed through — or, the turn having ended, nothing is live anywhere.
    let again = runtime(&b)
        .await
        .submit_tool_result(proto::SubmitToolResultRequest {
            session_id: session.clone(),
            turn_id,
            call_id: "call-1".to_owned(),
            content: "42".to_owned(),
            is_error: false,
            media: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    a.server.stop().await;
    b.server.stop().await;
}

/// The binary metadata key a forwarded call names its principal in (one
/// byte, 1 for an admin, then the user id).
const PRINCIPAL_HEADER: &str = "x-agentrt-forwarded-principal-bin";

/// A GetSessionStatus call as another replica would forward it: with `key`
/// (if any) and the principal `local`.
fn forwarded(session: &str, key: Option<&str>) -> tonic::Request<proto::GetSessionStatusRequest> {
    let mut req = tonic::Request::new(proto::GetSessionStatusRequest {
        session_id: session.to_owned(),
    });
    let mut principal = vec![0u8];
    principal.extend_from_slice(b"local");
    req.metadata_mut().insert_bin(
        PRINCIPAL_HEADER,
        tonic::metadata::MetadataValue::from_bytes(&principal),
    );
    if let Some(key) = key {
        req.metadata_mut()
            .insert("x-agentrt-cluster-key", key.parse().unwrap());
    }
    req
}

#[tokio::test]
async fn the_internal_listener_refuses_calls_without_the_cluster_key() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let a = replica(&db.url, true, &[]).await;
    let session = new_session(&a).await;
    let addr = a.server.cluster_addr().expect("a cluster listener");
    let mut internal = proto::agent_runtime_client::AgentRuntimeClient::new(
        channel(format!("http://{addr}")).await,
    );
    let missing = internal
        .get_session_status(forwarded(&session, None))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);
    for key in ["wrong-key", &KEY[..KEY.len() - 1]] {
        let wrong = internal
            .get_session_status(forwarded(&session, Some(key)))
            .await
            .unwrap_err();
        assert_eq!(wrong.code(), Code::Unauthenticated);
        assert!(!wrong.message().contains(KEY), "{}", wrong.message());
    }
    // The key without a principal: a replica always names the caller.
    let mut anonymous = forwarded(&session, Some(KEY));
    anonymous.metadata_mut().remove_bin(PRINCIPAL_HEADER);
    let err = internal.get_session_status(anonymous).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let status = internal
        .get_session_status(forwarded(&session, Some(KEY)))
        .await
        .unwrap()
        .into_inner();
    assert!(!status.live);
    // Another principal's session is not found there either.
    let mut other = forwarded(&session, Some(KEY));
    other.metadata_mut().insert_bin(
        PRINCIPAL_HEADER,
        tonic::metadata::MetadataValue::from_bytes(b"\x00someone-else"),
    );
    let err = internal.get_session_status(other).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // The public port refuses a call naming a forwarded principal, key or
    // not: only a replica may say who the caller is.
    let mut public =
        proto::agent_runtime_client::AgentRuntimeClient::new(channel(a.server.url()).await);
    for key in [None, Some(KEY)] {
        let err = public
            .get_session_status(forwarded(&session, key))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        assert!(
            err.message().contains(PRINCIPAL_HEADER),
            "{}",
            err.message()
        );
    }
    a.server.stop().await;
}

#[tokio::test]
async fn a_replica_without_its_database_is_not_ready_and_recovers_with_nothing_lost() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let proxy = TcpProxy::start(&db.addr).await;
    let via_proxy = db.url.replace(&db.addr, &proxy.addr().to_string());
    assert_ne!(via_proxy, db.url, "the URL names the server's address");
    let a = replica(&via_proxy, false, &[]).await;
    assert_eq!(readiness(&a).await, ServingStatus::Serving);
    let session = new_session(&a).await;
    let mut client = runtime(&a).await;
    let (first, _) = drain(
        &mut client
            .chat(chat(&session, "builtin/echo", ""))
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert_eq!(outcome(&first), Some(proto::TurnOutcome::Success));

    proxy.cut();
    wait_readiness(&a, ServingStatus::NotServing).await;
    let refused = client
        .chat(chat(&session, "builtin/echo", ""))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("database"),
        "{}",
        refused.message()
    );

    proxy.restore();
    wait_readiness(&a, ServingStatus::Serving).await;
    let (second, trailer) = drain(
        &mut client
            .chat(chat(&session, "builtin/echo", ""))
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(outcome(&second), Some(proto::TurnOutcome::Success));
    let history = SessionServiceClient::new(channel(a.server.url()).await)
        .get_history(proto::GetHistoryRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "both turns, nothing lost");
    a.server.stop().await;
}

#[tokio::test]
async fn concurrent_chats_on_two_replicas_admit_exactly_one_each_round() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = replica(&db.url, true, &gate_models(&gate)).await;
    let b = replica(&db.url, true, &gate_models(&gate)).await;
    let session = new_session(&a).await;
    let (mut on_a, mut on_b) = (runtime(&a).await, runtime(&b).await);
    for round in 0..20 {
        let (first, second) = tokio::join!(
            on_a.chat(chat(&session, "gate/x", "")),
            on_b.chat(chat(&session, "gate/x", "")),
        );
        let (mut admitted, refused) = match (first, second) {
            (Ok(ok), Err(busy)) | (Err(busy), Ok(ok)) => (ok.into_inner(), busy),
            (first, second) => panic!(
                "round {round}: expected one admitted and one busy, got {:?} and {:?}",
                first.map(|_| ()),
                second.map(|_| ())
            ),
        };
        assert_eq!(refused.code(), Code::Aborted, "round {round}: {refused:?}");
        let started = until(&mut admitted, is_text).await;
        let info = refused.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.metadata.get("turn_id"), Some(&started[0].turn_id));
        gate.release(1);
        let (events, _) = drain(&mut admitted).await;
        assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    }
    let history = SessionServiceClient::new(channel(b.server.url()).await)
        .get_history(proto::GetHistoryRequest {
            session_id: session.clone(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
    assert_eq!(
        seqs,
        (1..=40).collect::<Vec<_>>(),
        "20 turns, no duplicate, no gap"
    );
    a.server.stop().await;
    b.server.stop().await;
}

#[tokio::test]
async fn a_budget_and_the_turn_records_hold_across_replicas() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let priced = |c: &mut Config| {
        let price = agentrt_runtime::prices::Price {
            input: 1.0,
            cached_input: None,
            output: 1.0,
        };
        c.prices = agentrt_runtime::prices::Prices::new(
            [("builtin/echo".to_owned(), price)].into_iter().collect(),
        )
        .unwrap();
    };
    let a = replica_with(&db.url, true, &[], priced).await;
    let b = replica_with(&db.url, true, &[], priced).await;
    let mut sessions_a = SessionServiceClient::new(channel(a.server.url()).await);
    let mut sessions_b = SessionServiceClient::new(channel(b.server.url()).await);
    let session = sessions_a
        .create_session(proto::CreateSessionRequest {
            budget: Some(proto::Budget {
                max_tokens: Some(1),
                max_cost: None,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let mut turn = runtime(&a)
        .await
        .chat(chat(&session, "builtin/echo", "r1"))
        .await
        .unwrap()
        .into_inner();
    let (events, status) = drain(&mut turn).await;
    assert_eq!(
        outcome(&events),
        Some(proto::TurnOutcome::Success),
        "{status:?}"
    );

    // B reads what A's turn spent, and its record with its cost.
    let seen = sessions_b
        .get_session(proto::GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let spent = seen.spent_usage.unwrap();
    assert!(spent.input_tokens + spent.output_tokens >= 1, "{spent:?}");
    assert!(seen.spent_cost > 0.0, "{seen:?}");
    let turns = sessions_b
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .turns;
    assert_eq!(turns.len(), 1);
    assert_eq!(
        (turns[0].request_id.as_str(), turns[0].cost),
        ("r1", Some(seen.spent_cost))
    );

    // The budget is spent: B refuses the next Chat before storing anything.
    let refused = runtime(&b)
        .await
        .chat(chat(&session, "builtin/echo", "r2"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let failure = refused.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(failure.violations[0].quota_id, "session_budget_tokens");
    let after = sessions_a
        .get_session(proto::GetSessionRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.message_count, seen.message_count);
}
