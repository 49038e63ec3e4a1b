//! Approvals: a server tool call that requires approval (per call with
//! `require_approval`, or by the configuration) waits — listed in
//! GetSessionStatus — until its owner decides it: approved runs the tool,
//! denied tells the model so with the reason; another user's decision is
//! NOT_FOUND and a second decision FAILED_PRECONDITION.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, Error, proto};
use agentrt_server::ServerBuilder;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::server::InProcessServer;
use agentrt_testkit::tools::Recorder;
use serde_json::json;
use tonic::Code;

use super::harness::{base_config, mock_provider, read_until, text_request, with_keys};

const WAIT: Duration = Duration::from_secs(30);
const ALICE: &str = "alice-key-123";
const BOB: &str = "bob-key-456";

fn call_reply(id: &str, arguments: &str) -> FakeReply {
    let call = json!({
        "index": 0, "id": id, "type": "function",
        "function": {"name": "local__act", "arguments": arguments}
    });
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
    ])
}

fn text_reply(text: &str) -> FakeReply {
    FakeReply::sse(vec![text_chunk(text), finish_chunk("stop")])
}

/// The first tool result stored in `history`.
fn first_tool_result(history: &[proto::Message]) -> proto::ToolResultBlock {
    history
        .iter()
        .find_map(|m| match &m.content.first()?.block {
            Some(proto::content_block::Block::ToolResult(r)) => Some(r.clone()),
            _ => None,
        })
        .expect("a tool result in history")
}

fn code(err: Error) -> Code {
    err.code()
        .unwrap_or_else(|| panic!("expected a status, got {err}"))
}

struct Setup {
    _server: InProcessServer,
    _dir: tempfile::TempDir,
    fake: FakeOpenAi,
    tool: Arc<Recorder>,
    alice: Client,
    bob: Client,
}

async fn setup(replies: Vec<FakeReply>, configured: &[&str]) -> Setup {
    setup_with(replies, configured, Duration::from_secs(3600)).await
}

async fn setup_with(
    replies: Vec<FakeReply>,
    configured: &[&str],
    approval_timeout: Duration,
) -> Setup {
    let fake = FakeOpenAi::start(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_keys(base_config(dir.path()), &[(ALICE, "alice"), (BOB, "bob")]);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    config.tools.require_approval = configured.iter().map(|s| (*s).to_owned()).collect();
    config.tools.approval_timeout = approval_timeout;
    let tool = Arc::new(Recorder::default());
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("local", tool.clone())).await;
    let connect = |token: &'static str| {
        let url = server.url();
        async move { Client::builder(url).token(token).connect().await.unwrap() }
    };
    let (alice, bob) = (connect(ALICE).await, connect(BOB).await);
    Setup {
        _server: server,
        _dir: dir,
        fake,
        tool,
        alice,
        bob,
    }
}

async fn session(client: &Client) -> String {
    client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id
}

#[tokio::test]
async fn approve_runs_the_call_deny_tells_the_model_why_and_only_the_owner_decides_once() {
    let s = setup(
        vec![
            call_reply("call_1", r#"{"n":1}"#),
            text_reply("done"),
            call_reply("call_2", r#"{"n":2}"#),
            text_reply("understood"),
        ],
        &[],
    )
    .await;
    let id = session(&s.alice).await;

    // Approved: the tool runs once, after the decision.
    let mut req = text_request(&id, "act once");
    req.require_approval = vec!["local__act".into()];
    let mut chat = s.alice.chat_with(req).await.unwrap();
    let seen = read_until(&mut chat, |e| {
        matches!(e.kind, ChatEvent::ApprovalRequired { .. })
    })
    .await;
    let ChatEvent::ApprovalRequired {
        call_id,
        name,
        arguments_json,
    } = &seen.last().unwrap().kind
    else {
        unreachable!()
    };
    assert_eq!(
        (call_id.as_str(), name.as_str(), arguments_json.as_str()),
        ("call_1", "local__act", r#"{"n":1}"#)
    );
    assert!(s.tool.calls().is_empty(), "ran before approval");
    let status = s.alice.session_status(&id).await.unwrap();
    assert_eq!(status.pending_calls.len(), 1);
    assert_eq!(status.pending_calls[0].call_id, "call_1");
    assert_eq!(
        status.pending_calls[0].wait(),
        proto::PendingCallWait::Approval
    );
    // Another user: the session does not exist for them.
    let err = s
        .bob
        .submit_tool_approval(&id, "call_1", true, "")
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::NotFound);
    // A caller result for an approval is refused, naming the right call.
    let err = s
        .alice
        .submit_tool_result(&id, &seen[0].turn_id, "call_1", "x", false)
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::FailedPrecondition);
    s.alice
        .submit_tool_approval(&id, "call_1", true, "fine")
        .await
        .unwrap();
    let err = s
        .alice
        .submit_tool_approval(&id, "call_1", false, "changed my mind")
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::FailedPrecondition);
    let end = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(s.tool.calls(), [r#"{"n":1}"#]);

    // Denied: never run; the model is told so with the reason.
    let mut req = text_request(&id, "act again");
    req.require_approval = vec!["*".into()];
    let mut chat = s.alice.chat_with(req).await.unwrap();
    read_until(&mut chat, |e| {
        matches!(e.kind, ChatEvent::ApprovalRequired { .. })
    })
    .await;
    s.alice
        .submit_tool_approval(&id, "call_2", false, "not on a Friday")
        .await
        .unwrap();
    let end = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(s.tool.calls().len(), 1, "a denied call ran");
    let requests = s.fake.requests();
    let last = requests.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "call_2");
    let told = last["content"].to_string();
    assert!(
        told.contains("denied") && told.contains("not on a Friday"),
        "{told}"
    );
}

#[tokio::test]
async fn the_configuration_requires_approval_and_a_stop_cancels_the_waiting_call() {
    let s = setup(vec![call_reply("call_9", "{}")], &["local__act"]).await;
    let id = session(&s.alice).await;
    let mut chat = s.alice.chat_with(text_request(&id, "act")).await.unwrap();
    let seen = read_until(&mut chat, |e| {
        matches!(e.kind, ChatEvent::ApprovalRequired { .. })
    })
    .await;
    assert!(s.alice.stop_session(&id).await.unwrap());
    let end = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.outcome, Some(proto::TurnOutcome::Canceled));
    assert!(s.tool.calls().is_empty());
    // The call's record says it never ran; a late decision finds nothing.
    let history = s.alice.history(&id).await.unwrap();
    let result = first_tool_result(&history);
    assert_eq!(result.call_id, "call_9");
    assert_eq!(result.interrupted(), proto::ToolCallInterrupted::Cancelled);
    let err = s
        .alice
        .submit_tool_approval(&id, "call_9", true, "")
        .await
        .unwrap_err();
    assert_eq!(code(err), Code::FailedPrecondition);
    // The turn record is a normal ended one.
    let turn = s.alice.get_turn(&id, &seen[0].turn_id).await.unwrap();
    assert_eq!(turn.outcome(), proto::TurnOutcome::Canceled);
}

#[tokio::test]
async fn an_approval_never_given_times_the_turn_out_at_approval_timeout() {
    let s = setup_with(
        vec![call_reply("call_5", "{}")],
        &["local__act"],
        Duration::from_millis(300),
    )
    .await;
    let id = session(&s.alice).await;
    let chat = s.alice.chat_with(text_request(&id, "act")).await.unwrap();
    let end = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.outcome, Some(proto::TurnOutcome::TimedOut));
    assert!(s.tool.calls().is_empty());
    let history = s.alice.history(&id).await.unwrap();
    let result = first_tool_result(&history);
    assert_eq!(result.interrupted(), proto::ToolCallInterrupted::Cancelled);
    assert_eq!(history.last().unwrap().role(), proto::Role::Notice);
}
