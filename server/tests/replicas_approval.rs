//! An approval across replicas on one PostgreSQL database: a turn on A
//! pauses on a server tool call that requires approval; A dies (its
//! database link cut, then it is gone); once A's lease lapses B reports the
//! turn paused — not interrupted — with its pending call, and
//! SubmitToolApproval on B resumes it there: the tool runs once, a watcher
//! on B sees the turn to one SUCCESS.

use std::sync::Arc;
use std::time::Duration;

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::proto;
use agentrt_client::proto::chat_event::Kind;
use agentrt_runtime::model::ModelProvider;
use agentrt_server::config::{ProviderConfig, ProviderKind};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::tools::Recorder;
use serde_json::json;
use support::*;

#[tokio::test]
async fn an_approval_pending_on_a_dead_replica_resumes_the_turn_on_another() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let call = json!({
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "local__act", "arguments": "{\"n\":1}"}
    });
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
            finish_chunk("tool_calls"),
        ]),
        FakeReply::sse(vec![text_chunk("done"), finish_chunk("stop")]),
    ])
    .await;
    let proxy = agentrt_testkit::tcp_proxy::TcpProxy::start(&db.addr).await;
    let via_proxy = db.url.replace(&db.addr, &proxy.addr().to_string());
    let tool = Arc::new(Recorder::default());
    let models: Vec<(&str, Arc<dyn ModelProvider>)> = Vec::new();
    let base_url = fake.base_url();
    let edit = |c: &mut agentrt_server::Config| {
        c.store.lease_ttl_ms = Some(1_000);
        c.default_model = "mock/m".into();
        c.providers.push(ProviderConfig {
            name: "mock".into(),
            kind: ProviderKind::Openai,
            base_url: base_url.clone(),
            api_key_env: None,
            models: None,
            idle_timeout: None,
            max_retries: None,
            max_tokens: None,
            model_max_tokens: None,
            max_tokens_limit: None,
            max_tokens_param: None,
            max_output_bytes: None,
            reads: None,
            model_reads: None,
        });
    };
    let with_tool = |b: agentrt_server::ServerBuilder| b.tool_source("local", tool.clone());
    let a = replica_built(&via_proxy, true, &models, edit, with_tool).await;
    let b = replica_built(&db.url, true, &models, edit, with_tool).await;
    let session = new_session(&a).await;
    let mut req = chat(&session, "", "");
    req.require_approval = vec!["*".into()];
    let mut turn = runtime(&a).await.chat(req).await.unwrap().into_inner();
    let seen = until(&mut turn, |k| matches!(k, Kind::ApprovalRequired(_))).await;
    let turn_id = seen[0].turn_id.clone();

    // A dies.
    proxy.cut();
    drop(a);
    drop(turn);

    // B sees the turn paused once A's lease lapsed (its sweep, every half
    // lease).
    let status = loop {
        let status = runtime(&b)
            .await
            .get_session_status(proto::GetSessionStatusRequest {
                session_id: session.clone(),
            })
            .await;
        if let Ok(status) = status
            && !status.get_ref().paused_turn_id.is_empty()
        {
            break status.into_inner();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.paused_turn_id, turn_id);
    assert_eq!(status.pending_calls.len(), 1);
    assert_eq!(status.pending_calls[0].call_id, "call_1");
    assert_eq!(
        status.pending_calls[0].wait(),
        proto::PendingCallWait::Approval
    );
    assert!(tool.calls().is_empty());

    let mut watch = runtime(&b)
        .await
        .subscribe(proto::SubscribeRequest {
            session_id: session.clone(),
            after_seq: 0,
            wait_for_turn: true,
        })
        .await
        .unwrap()
        .into_inner();
    runtime(&b)
        .await
        .submit_tool_approval(proto::SubmitToolApprovalRequest {
            session_id: session.clone(),
            call_id: "call_1".into(),
            approved: true,
            reason: String::new(),
        })
        .await
        .unwrap();
    let (events, trailer) = drain(&mut watch).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert!(events.iter().all(|e| e.turn_id == turn_id));
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    assert_eq!(tool.calls(), ["{\"n\":1}"]);
    assert_eq!(fake.requests().len(), 2);
    b.server.stop().await;
}
