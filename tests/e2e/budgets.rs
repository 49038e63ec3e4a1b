//! Session budgets: what a session spent is summed from its ended turns
//! (GetSession), a turn that reaches the budget ends after its step with
//! TURN_OUTCOME_BUDGET_EXCEEDED and a notice, and the next Chat is refused
//! with RESOURCE_EXHAUSTED and a QuotaFailure naming the budget.

use std::collections::BTreeMap;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::prices::{Price, Prices};
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::ServerBuilder;
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt as _;

use super::harness::{base_config, message_text, mock_provider, text_request};

/// `local__ping`: answers at once.
#[derive(Debug)]
struct Ping;

#[async_trait]
impl ToolSource for Ping {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "ping".into(),
            description: "answers pong".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        ToolOutcome::ok("pong")
    }
}

/// A step that calls `local__ping`, using 20 + 10 tokens.
fn calling() -> FakeReply {
    let call = json!({
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "local__ping", "arguments": "{}"}
    });
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
        usage_chunk(20, 10),
    ])
}

/// A final answer using 12 + 5 tokens.
fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![
        text_chunk(text),
        finish_chunk("stop"),
        usage_chunk(12, 5),
    ])
}

/// `mock/m` at $1 / $2 per million input / output tokens.
async fn server(fake: &FakeOpenAi, dir: &std::path::Path) -> InProcessServer {
    let mut config = base_config(dir);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(fake, None));
    let price = Price {
        input: 1.0,
        cached_input: None,
        output: 2.0,
    };
    config.prices = Prices::new(BTreeMap::from([("mock/m".to_owned(), price)])).unwrap();
    InProcessServer::start(
        ServerBuilder::new(config).tool_source("local", std::sync::Arc::new(Ping)),
    )
    .await
}

async fn session_with(client: &Client, budget: proto::Budget) -> String {
    let req = proto::CreateSessionRequest {
        budget: Some(budget),
        ..Default::default()
    };
    client.create_session(req).await.unwrap().session_id
}

async fn run(client: &Client, session: &str, text: &str) -> agentrt_client::TurnSummary {
    client
        .chat_with(text_request(session, text))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap()
}

fn budget_failure(status: &tonic::Status) -> (String, i64) {
    let failure = status.get_details_quota_failure().expect("a QuotaFailure");
    let v = &failure.violations[0];
    (v.quota_id.clone(), v.quota_value)
}

#[tokio::test]
async fn a_turn_reaching_the_token_budget_ends_after_its_step_and_the_next_chat_is_refused() {
    // One turn of two steps would use 30 + 17 tokens; the budget is 40.
    let fake = FakeOpenAi::start(vec![answer("first"), calling(), answer("never sent")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = Client::connect(server.url()).await.unwrap();
    let budget = proto::Budget {
        max_tokens: Some(40),
        max_cost: None,
    };
    let session = session_with(&client, budget).await;

    // 17 tokens: under the budget.
    let first = run(&client, &session, "hello").await;
    assert_eq!(first.outcome, Some(proto::TurnOutcome::Success));
    let spent = client.get_session(&session).await.unwrap();
    let usage = spent.spent_usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (12, 5));
    assert!(
        (spent.spent_cost - 22e-6).abs() < 1e-12,
        "{}",
        spent.spent_cost
    );

    // Its first step brings the session to 47 ≥ 40: the tool result is
    // stored, no second model request, outcome BUDGET_EXCEEDED.
    let second = run(&client, &session, "ping it").await;
    assert_eq!(second.outcome, Some(proto::TurnOutcome::BudgetExceeded));
    let status = second.status.expect("a trailing status");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("budget of 40 tokens"),
        "{status:?}"
    );
    let error = second
        .events
        .iter()
        .any(|e| matches!(&e.kind, ChatEvent::Error { .. }));
    assert!(error, "an error event precedes turn_finished");
    assert_eq!(
        fake.requests().len(),
        2,
        "the step after the budget is never requested"
    );
    let history = client.history(&session).await.unwrap();
    let roles: Vec<_> = history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles[2..],
        [
            proto::Role::User,
            proto::Role::Assistant,
            proto::Role::Tool,
            proto::Role::Notice
        ]
    );
    assert!(message_text(&history[5]).contains("budget of 40 tokens"));
    let turns = client
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let crossing = &turns.turns[0];
    assert_eq!(crossing.outcome(), proto::TurnOutcome::BudgetExceeded);
    assert_eq!(
        (crossing.steps, crossing.usage.unwrap().input_tokens),
        (1, 20)
    );

    // The next Chat is refused before anything is stored.
    let refused = client
        .chat_with(text_request(&session, "more"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(Code::ResourceExhausted));
    let status = refused.status().expect("a status");
    assert_eq!(
        budget_failure(status),
        ("session_budget_tokens".to_owned(), 40)
    );
    assert_eq!(client.history(&session).await.unwrap().len(), history.len());

    // Raising the budget lets the session go on.
    let raised = proto::UpdateSessionRequest {
        session_id: session.clone(),
        budget: Some(proto::Budget {
            max_tokens: Some(1_000),
            max_cost: None,
        }),
        ..Default::default()
    };
    let updated = client.update_session(raised).await.unwrap();
    assert_eq!(updated.budget.unwrap().max_tokens, Some(1_000));
    let usage = updated.spent_usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (32, 15));

    // The operator's view: every session of the user, summed.
    let other = session_with(&client, proto::Budget::default()).await;
    let usage = client.user_usage("local").await.unwrap();
    assert_eq!((usage.user_id.as_str(), usage.sessions), ("local", 2));
    let tokens = usage.usage.unwrap();
    assert_eq!((tokens.input_tokens, tokens.output_tokens), (32, 15));
    assert!((usage.cost - updated.spent_cost).abs() < 1e-12);
    assert!(client.delete_session(&other).await.unwrap());
    let nobody = client.user_usage("nobody").await.unwrap();
    assert_eq!((nobody.sessions, nobody.cost), (0, 0.0));
    let empty = client.user_usage("").await.unwrap_err();
    assert_eq!(empty.code(), Some(Code::InvalidArgument));
    server.stop().await;
}

#[tokio::test]
async fn a_cost_budget_refuses_the_next_chat_and_a_bad_budget_is_invalid() {
    let fake = FakeOpenAi::start(vec![answer("costly")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = Client::connect(server.url()).await.unwrap();
    // 12 × $1/M + 5 × $2/M = $0.000022 ≥ $0.00002.
    let budget = proto::Budget {
        max_tokens: None,
        max_cost: Some(0.000_02),
    };
    let session = session_with(&client, budget).await;
    let first = run(&client, &session, "hello").await;
    assert_eq!(
        first.outcome,
        Some(proto::TurnOutcome::Success),
        "a final answer ends normally"
    );
    let refused = client
        .chat_with(text_request(&session, "more"))
        .await
        .unwrap_err();
    let status = refused.status().expect("a status");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        budget_failure(status),
        ("session_budget_cost".to_owned(), 20)
    );
    assert!(status.message().contains("$0.000020"), "{status:?}");

    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let req = proto::CreateSessionRequest {
            budget: Some(proto::Budget {
                max_tokens: None,
                max_cost: Some(bad),
            }),
            ..Default::default()
        };
        let err = client.create_session(req).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::InvalidArgument), "{bad}");
        assert!(err.to_string().contains("budget.max_cost"), "{err}");
    }
    server.stop().await;
}

/// A user's budget for the day (`[quotas] daily_tokens`): the tokens of
/// every session of the user's ended turns add up; a turn that crosses it
/// ends after its step (BUDGET_EXCEEDED), the user's next Chat — in any
/// session — is refused until midnight UTC (RetryInfo), another user is
/// untouched.
#[tokio::test]
async fn a_users_daily_token_budget_spans_sessions_and_refuses_until_midnight() {
    const ALICE: &str = "alice-key-123";
    const BOB: &str = "bob-key-456";
    // alice: 17 tokens, then 30 (crossing 40 after the first step); bob: 17.
    let fake = FakeOpenAi::start(vec![answer("first"), calling(), answer("bob's")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        super::harness::with_keys(base_config(dir.path()), &[(ALICE, "alice"), (BOB, "bob")]);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    config.quotas.daily_tokens = Some(40);
    let server = InProcessServer::start(
        ServerBuilder::new(config).tool_source("local", std::sync::Arc::new(Ping)),
    )
    .await;
    let connect = |key: &'static str| {
        let url = server.url();
        async move { Client::builder(url).token(key).connect().await.unwrap() }
    };
    let (alice, bob) = (connect(ALICE).await, connect(BOB).await);
    let new = |c: &Client| {
        let c = c.clone();
        async move {
            c.create_session(Default::default())
                .await
                .unwrap()
                .session_id
        }
    };

    let first = run(&alice, &new(&alice).await, "hello").await;
    assert_eq!(first.outcome, Some(proto::TurnOutcome::Success));
    // Another session of hers: 17 + 30 crosses 40 after the step.
    let crossing = run(&alice, &new(&alice).await, "ping").await;
    assert_eq!(crossing.outcome, Some(proto::TurnOutcome::BudgetExceeded));
    let said = crossing.events.iter().find_map(|e| match &e.kind {
        ChatEvent::Error { message, .. } => Some(message.clone()),
        _ => None,
    });
    assert!(
        said.as_deref().is_some_and(|m| m.contains("for today")),
        "{said:?}"
    );
    // Any session of hers is refused now, until midnight UTC.
    let third = new(&alice).await;
    let Err(err) = alice.chat_with(text_request(&third, "more")).await else {
        panic!("the day's budget is spent: refused")
    };
    assert_eq!(err.code(), Some(Code::ResourceExhausted), "{err}");
    let status = err.status().expect("a status");
    assert_eq!(budget_failure(status), ("daily_tokens".to_owned(), 40));
    let retry = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a RetryInfo");
    assert!(retry <= std::time::Duration::from_secs(86_400), "{retry:?}");
    // Nothing of the refused Chat was stored.
    assert!(alice.history(&third).await.unwrap().is_empty());
    // Bob has his own budget.
    let his = run(&bob, &new(&bob).await, "hi").await;
    assert_eq!(his.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(fake.requests().len(), 3);
}
