//! Delegate sessions end to end against the fake OpenAI upstream: the
//! built-in `delegate` tool runs a linked child session of another agent,
//! its progress shows on the parent's stream, its answer is the tool
//! result, it can be continued by id; stopping the parent, or the parent's
//! deadline, ends the child.

use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_server::ServerBuilder;
use agentrt_server::config::{AgentConfig, Config, DelegationSettings};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, RecordedRequest, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use agentrt_testkit::server::InProcessServer;
use serde_json::json;

use super::agents::{call_reply, client, keys, system, text_reply, tool_names};
use super::harness::{base_config, message_text, mock_provider, read_until, text_request};

const WAIT: Duration = Duration::from_secs(30);

/// A server whose `boss` agent may delegate to `researcher`.
async fn server(fake: &FakeOpenAi, dir: &std::path::Path) -> InProcessServer {
    InProcessServer::start_prepared(ServerBuilder::new(config(fake, dir))).await
}

fn config(fake: &FakeOpenAi, dir: &std::path::Path) -> Config {
    let mut config = base_config(dir);
    config.auth = keys();
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(fake, None));
    config.agents.push(AgentConfig {
        id: "boss".into(),
        system_prompt: "You lead.".into(),
        tools: Some(Vec::new()),
        delegates: vec!["researcher".into()],
        ..AgentConfig::default()
    });
    config.agents.push(AgentConfig {
        id: "researcher".into(),
        description: "Finds facts".into(),
        system_prompt: "You research.".into(),
        tools: Some(Vec::new()),
        ..AgentConfig::default()
    });
    config
}

async fn boss_session(alice: &Client, budget: Option<proto::Budget>) -> String {
    alice
        .create_session(proto::CreateSessionRequest {
            agent_id: "boss".into(),
            budget,
            ..Default::default()
        })
        .await
        .unwrap()
        .session_id
}

async fn children(alice: &Client, parent: &str) -> Vec<proto::Session> {
    alice
        .list_sessions(proto::ListSessionsRequest {
            parent_session_id: parent.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .sessions
}

fn delegate_call(id: &str, arguments: serde_json::Value) -> FakeReply {
    call_reply(id, "delegate", &arguments.to_string())
}

/// A reply that writes a little, then hangs until the client goes away.
fn hanging() -> FakeReply {
    FakeReply::Sse {
        chunks: vec![text_chunk("digging")],
        done: false,
        then_hang: true,
    }
}

/// The events of `stream` up to its `TurnFinished`.
async fn until_finished(stream: &mut agentrt_client::EventStream) -> Vec<agentrt_client::Event> {
    tokio::time::timeout(
        WAIT,
        read_until(stream, |e| {
            matches!(&e.kind, ChatEvent::TurnFinished { .. })
        }),
    )
    .await
    .unwrap()
}

/// The last `tool_use` event of call `call_id` among `events`.
fn last_use(events: &[agentrt_client::Event], call_id: &str) -> proto::ToolUse {
    events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            ChatEvent::ToolUse(t) if t.call_id == call_id => Some(t.clone()),
            _ => None,
        })
        .unwrap()
}

/// The texts of a request's messages.
fn texts(r: &RecordedRequest) -> Vec<String> {
    r.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_delegate_call_runs_a_linked_child_whose_answer_is_the_result_and_can_go_on() {
    let fake = FakeOpenAi::start(vec![
        delegate_call(
            "call_1",
            json!({"agent": "researcher", "task": "Find the capital of France"}),
        ),
        FakeReply::sse(vec![
            text_chunk("Paris is the capital of France."),
            finish_chunk("stop"),
            usage_chunk(100, 20),
        ]),
        text_reply("The answer is Paris."),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = client(&server, "key-alice").await;
    let bob = client(&server, "key-bob-1").await;
    let budget = proto::Budget {
        max_tokens: Some(5_000),
        max_cost: None,
    };
    let parent = boss_session(&alice, Some(budget)).await;

    let mut chat = alice
        .chat_with(text_request(&parent, "What is the capital of France?"))
        .await
        .unwrap();
    let seen = until_finished(&mut chat).await;
    let uses: Vec<_> = seen
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::ToolUse(t) if t.call_id == "call_1" => Some(t.clone()),
            _ => None,
        })
        .collect();
    let running = i32::from(proto::ToolStatus::Running);
    let details: Vec<_> = uses
        .iter()
        .filter(|t| t.status == running)
        .map(|t| t.detail.clone())
        .collect();
    // The child's progress, on the parent's stream.
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("researcher: started in session ")),
        "{details:?}"
    );
    assert!(
        details.iter().any(|d| d == "researcher: step 1"),
        "{details:?}"
    );
    let done = uses.last().unwrap();
    assert_eq!(done.status, i32::from(proto::ToolStatus::Done), "{done:?}");
    assert!(
        done.content.starts_with("Paris is the capital of France."),
        "{done:?}"
    );
    assert!(
        seen.iter().any(|e| matches!(
            &e.kind,
            ChatEvent::TurnFinished {
                outcome: proto::TurnOutcome::Success,
                ..
            }
        )),
        "{seen:?}"
    );

    // The child: linked to the parent, the same owner, the delegate
    // agent, titled after the task, with the parent's budget left.
    let kids = children(&alice, &parent).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let child = &kids[0];
    assert_eq!(child.parent_session_id, parent);
    assert_eq!(child.agent_id, "researcher");
    assert_eq!(child.title, "Find the capital of France");
    assert_eq!(
        child.budget.as_ref().and_then(|b| b.max_tokens),
        Some(5_000)
    );
    assert!(
        done.content
            .ends_with(&format!("(session_id: {})", child.session_id)),
        "{done:?}"
    );
    assert!(children(&bob, &parent).await.is_empty());
    // What the child used counts for the parent session too.
    let spent = |s: &proto::Session| {
        s.spent_usage
            .as_ref()
            .map(|u| (u.input_tokens, u.output_tokens))
    };
    assert_eq!(spent(child), Some((100, 20)));
    let parent_session = alice.get_session(&parent).await.unwrap();
    assert_eq!(spent(&parent_session), Some((100, 20)));
    // Its input came from the parent session, by the server's word.
    let history = alice.history(&child.session_id).await.unwrap();
    assert_eq!(message_text(&history[0]), "Find the capital of France");
    let actor = history[0].input_actor.clone().unwrap();
    assert_eq!(actor.kind, i32::from(proto::InputActorKind::Delegate));
    assert_eq!(actor.id, parent);
    assert_eq!(
        message_text(history.last().unwrap()),
        "Paris is the capital of France."
    );

    // What each model saw: the boss its profile and the delegate tool,
    // the researcher its own profile and no tools, the boss the answer.
    let requests = fake.requests();
    assert_eq!(system(&requests[0]), "You lead.");
    assert_eq!(tool_names(&requests[0]), ["delegate"]);
    let description = requests[0].body["tools"][0]["function"]["description"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(description.contains("researcher"), "{description}");
    assert_eq!(system(&requests[1]), "You research.");
    assert!(tool_names(&requests[1]).is_empty());
    assert_eq!(
        texts(&requests[1]).last().unwrap(),
        "Find the capital of France"
    );
    assert!(
        texts(&requests[2])
            .iter()
            .any(|t| t.starts_with("Paris is the capital of France.")),
        "{:?}",
        texts(&requests[2])
    );

    // The next turn continues the same child by its id; a session that is
    // not one of this conversation's children is refused.
    fake.extend([
        delegate_call(
            "call_2",
            json!({"session_id": child.session_id, "task": "And of Spain?"}),
        ),
        text_reply("Madrid."),
        delegate_call("call_3", json!({"session_id": parent, "task": "loop"})),
        text_reply("Madrid it is."),
    ]);
    let mut chat = alice
        .chat_with(text_request(&parent, "And Spain?"))
        .await
        .unwrap();
    let seen = until_finished(&mut chat).await;
    assert!(last_use(&seen, "call_2").content.starts_with("Madrid."));
    let refused = last_use(&seen, "call_3");
    assert_eq!(refused.status, i32::from(proto::ToolStatus::Error));
    assert!(
        refused
            .content
            .contains("is not a delegate session of this conversation"),
        "{refused:?}"
    );
    let requests = fake.requests();
    assert_eq!(
        texts(&requests[4])[1..],
        [
            "Find the capital of France",
            "Paris is the capital of France.",
            "And of Spain?"
        ],
        "the child went on with its own history"
    );
    // Continued, the child's budget is what it spent plus what the
    // parent has left.
    let kids = children(&alice, &parent).await;
    assert_eq!(kids.len(), 1);
    assert_eq!(
        kids[0].budget.as_ref().and_then(|b| b.max_tokens),
        Some(120 + 5_000 - 120)
    );
    server.stop().await;
}

#[tokio::test]
async fn stopping_the_parent_or_its_deadline_ends_the_child() {
    let fake = FakeOpenAi::start(vec![
        delegate_call("call_1", json!({"agent": "researcher", "task": "dig"})),
        hanging(),
        delegate_call(
            "call_2",
            json!({"agent": "researcher", "task": "dig deeper"}),
        ),
        hanging(),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = client(&server, "key-alice").await;
    let parent = boss_session(&alice, None).await;

    // StopSession on the parent ends the child, with the same reason.
    let chat = alice.chat_with(text_request(&parent, "dig")).await.unwrap();
    tokio::time::timeout(WAIT, fake.wait_requests(2))
        .await
        .unwrap();
    let child = children(&alice, &parent).await.remove(0);
    let mut watch = alice.subscribe(&child.session_id, 0, true).await.unwrap();
    let stopped_at = Instant::now();
    assert!(alice.stop_session(&parent).await.unwrap());
    let seen = until_finished(&mut watch).await;
    let ended_in = stopped_at.elapsed();
    match &seen.last().unwrap().kind {
        ChatEvent::TurnFinished {
            outcome,
            cancel_reason,
            ..
        } => {
            assert_eq!(*outcome, proto::TurnOutcome::Canceled);
            assert_eq!(*cancel_reason, proto::CancelReason::Stopped);
        }
        other => panic!("{other:?}"),
    }
    assert!(ended_in < Duration::from_secs(1), "{ended_in:?}");
    let parent_end = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent_end.outcome, Some(proto::TurnOutcome::Canceled));

    // A parent's deadline reaches the child: it times out first.
    let mut request = text_request(&parent, "dig deeper");
    request.timeout = Some(prost_types::Duration {
        seconds: 2,
        nanos: 0,
    });
    let chat = alice.chat_with(request).await.unwrap();
    tokio::time::timeout(WAIT, fake.wait_requests(4))
        .await
        .unwrap();
    let deeper = children(&alice, &parent)
        .await
        .into_iter()
        .find(|s| s.title == "dig deeper")
        .unwrap();
    let mut watch = alice.subscribe(&deeper.session_id, 0, true).await.unwrap();
    let parent_end = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent_end.outcome, Some(proto::TurnOutcome::TimedOut));
    let timed_out = last_use(&parent_end.events, "call_2");
    assert!(
        timed_out.content.contains("time limit"),
        "the child's end is the result: {timed_out:?}"
    );
    let seen = until_finished(&mut watch).await;
    assert!(
        matches!(
            &seen.last().unwrap().kind,
            ChatEvent::TurnFinished {
                outcome: proto::TurnOutcome::TimedOut,
                ..
            }
        ),
        "{seen:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn delegation_is_bounded_in_depth_and_in_calls_at_once() {
    let calls = json!([
        {"index": 0, "id": "call_a", "type": "function", "function": {
            "name": "delegate",
            "arguments": json!({"agent": "researcher", "task": "one"}).to_string()}},
        {"index": 1, "id": "call_b", "type": "function", "function": {
            "name": "delegate",
            "arguments": json!({"agent": "researcher", "task": "two"}).to_string()}}
    ]);
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})),
            finish_chunk("tool_calls"),
        ]),
        text_reply("one done"),
        text_reply("ok"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&fake, dir.path());
    config.delegation = DelegationSettings {
        max_depth: 1,
        max_parallel: 1,
    };
    // The researcher may delegate back, but its sessions are as deep as
    // delegation goes here.
    config.agents[1].delegates = vec!["boss".into()];
    let server = InProcessServer::start_prepared(ServerBuilder::new(config)).await;
    let alice = client(&server, "key-alice").await;
    let parent = boss_session(&alice, None).await;
    let end = tokio::time::timeout(
        WAIT,
        alice
            .chat_with(text_request(&parent, "two things"))
            .await
            .unwrap()
            .finish(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(end.outcome, Some(proto::TurnOutcome::Success));
    assert!(
        last_use(&end.events, "call_a")
            .content
            .starts_with("one done")
    );
    let refused = last_use(&end.events, "call_b");
    assert_eq!(refused.status, i32::from(proto::ToolStatus::Error));
    assert!(
        refused
            .content
            .contains("at most 1 delegate calls run at once"),
        "{refused:?}"
    );
    assert_eq!(children(&alice, &parent).await.len(), 1);
    let requests = fake.requests();
    assert_eq!(system(&requests[1]), "You research.");
    assert!(
        tool_names(&requests[1]).is_empty(),
        "a session at the deepest level is not offered delegate"
    );
    server.stop().await;
}
