//! The upstream fault matrix (RELIABILITY.md "Upstream fault matrix"):
//! every fault a model upstream can throw at a turn × both HTTP providers
//! (OpenAI-compatible, Anthropic) × with and without a tool call before
//! the fault. One server, one scripted loopback fake and one provider per
//! case; every turn must end with exactly one `turn_finished` (the last
//! event) of the expected outcome and error code, and leave a consistent
//! history: the user message, each tool call with exactly one result, and
//! at most one assistant message after them (the partial answer of a step
//! cut mid-way, which is stored as far as it came).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::ServerBuilder;
use agentrt_server::config::{ProviderConfig, ProviderKind};
use agentrt_testkit::fake_anthropic as anth;
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, slice_bytes, sse_data, text_chunk, usage_chunk,
};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use proto::content_block::Block;
use serde_json::json;

use super::harness::{base_config, message_text, new_session, text_request};

/// Bound on one turn of the matrix (the slowest waits about a second).
const TURN_WAIT: Duration = Duration::from_secs(30);
/// The providers' idle timeout: the stall case waits this long.
const IDLE: Duration = Duration::from_millis(500);
/// The endless case is cut here.
const OUTPUT_BOUND: usize = 64 * 1024;
const ANSWER: &str = "Hello, wörld — ✓";
const PARTIAL: &str = "partial ✓ ";

/// `fm__echo`: answers at once.
#[derive(Debug)]
struct Echo;

#[async_trait]
impl ToolSource for Echo {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "echo".into(),
            description: "echoes".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, arguments_json: &str) -> ToolOutcome {
        ToolOutcome::ok(format!("echo {arguments_json}"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Refused,
    ResetMidStream,
    Stall,
    MalformedChunk,
    SplitUtf8,
    RateLimitedRetryAfter,
    ServerError,
    HugeChunk,
    EndlessStream,
    SlowDrip,
}

const FAULTS: [Fault; 10] = [
    Fault::Refused,
    Fault::ResetMidStream,
    Fault::Stall,
    Fault::MalformedChunk,
    Fault::SplitUtf8,
    Fault::RateLimitedRetryAfter,
    Fault::ServerError,
    Fault::HugeChunk,
    Fault::EndlessStream,
    Fault::SlowDrip,
];

/// What a turn meeting the fault must end with.
struct Expected {
    outcome: proto::TurnOutcome,
    /// The code of the turn's error event (`None`: no error event).
    code: Option<proto::ErrorCode>,
    /// The final assistant message's text: exactly, or (partial) a prefix
    /// of what the upstream sent, possibly nothing stored.
    answer: Answer,
}

enum Answer {
    Exactly(&'static str),
    /// A prefix of this (empty: no assistant message stored).
    PrefixOf(&'static str),
    /// Cut at the output bound: more than it, less than it plus a delta.
    Bounded,
}

fn expected(fault: Fault) -> Expected {
    use proto::{ErrorCode as C, TurnOutcome as O};
    let error = |code, answer| Expected {
        outcome: O::Error,
        code: Some(code),
        answer,
    };
    match fault {
        Fault::Refused | Fault::ServerError => error(C::Unavailable, Answer::PrefixOf("")),
        Fault::ResetMidStream | Fault::Stall | Fault::MalformedChunk | Fault::HugeChunk => {
            error(C::Unavailable, Answer::PrefixOf(PARTIAL))
        }
        Fault::RateLimitedRetryAfter => error(C::ResourceExhausted, Answer::PrefixOf("")),
        Fault::SplitUtf8 | Fault::SlowDrip => Expected {
            outcome: O::Success,
            code: None,
            answer: Answer::Exactly(ANSWER),
        },
        Fault::EndlessStream => Expected {
            outcome: O::Success,
            code: None,
            answer: Answer::Bounded,
        },
    }
}

/// A complete answer `ANSWER`, as body pieces.
fn answer(api: Api) -> Vec<Vec<u8>> {
    match api {
        Api::OpenAi => vec![
            text_chunk(&ANSWER[..6]),
            text_chunk(&ANSWER[6..]),
            finish_chunk("stop"),
            usage_chunk(3, 4),
            b"data: [DONE]\n\n".to_vec(),
        ],
        Api::Anthropic => vec![
            anth::message_start(3, 0),
            anth::text_start(0),
            anth::text_delta(0, &ANSWER[..6]),
            anth::text_delta(0, &ANSWER[6..]),
            anth::block_stop(0),
            anth::message_delta("end_turn", 4),
            anth::message_stop(),
        ],
    }
}

/// The start of an answer that never completes: `PARTIAL` relayed.
fn partial(api: Api) -> Vec<Vec<u8>> {
    match api {
        Api::OpenAi => vec![text_chunk(PARTIAL)],
        Api::Anthropic => vec![
            anth::message_start(3, 0),
            anth::text_start(0),
            anth::text_delta(0, PARTIAL),
        ],
    }
}

/// A step that calls `fm__echo`.
fn tool_call(api: Api) -> FakeReply {
    match api {
        Api::OpenAi => {
            let call = json!({
                "index": 0, "id": "call_1", "type": "function",
                "function": {"name": "fm__echo", "arguments": "{\"x\":1}"}
            });
            FakeReply::sse(vec![
                sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
                finish_chunk("tool_calls"),
            ])
        }
        Api::Anthropic => anth::stream(vec![
            anth::message_start(3, 0),
            anth::tool_use_start(0, "toolu_1", "fm__echo"),
            anth::input_json_delta(0, "{\"x\":1}"),
            anth::block_stop(0),
            anth::message_delta("tool_use", 5),
            anth::message_stop(),
        ]),
    }
}

fn sse(chunks: Vec<Vec<u8>>) -> FakeReply {
    FakeReply::Sse {
        chunks,
        done: false,
        then_hang: false,
    }
}

/// The upstream's replies from the faulted step on (the last repeats, so
/// a retry meets the fault again).
fn fault_replies(fault: Fault, api: Api) -> Vec<FakeReply> {
    match fault {
        Fault::Refused => vec![FakeReply::Refuse],
        Fault::ResetMidStream => vec![FakeReply::Reset {
            chunks: partial(api),
        }],
        Fault::Stall => vec![FakeReply::Sse {
            chunks: partial(api),
            done: false,
            then_hang: true,
        }],
        Fault::MalformedChunk => {
            let mut chunks = partial(api);
            chunks.push(b"data: {\"choices\": [{\"delta\": \n\n".to_vec());
            vec![sse(chunks)]
        }
        // Every multi-byte character is cut between two writes.
        Fault::SplitUtf8 => vec![sse(slice_bytes(&answer(api).concat(), 1))],
        Fault::RateLimitedRetryAfter => vec![FakeReply::StatusWithHeaders {
            code: 429,
            headers: vec![("retry-after".into(), "1".into())],
            body: r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#.into(),
        }],
        Fault::ServerError => vec![FakeReply::Status {
            code: 500,
            body: r#"{"error":{"message":"upstream-body-secret"}}"#.into(),
        }],
        // One event beyond the SSE parser's 8 MiB bound, in one write.
        Fault::HugeChunk => {
            let huge = "h".repeat(9 << 20);
            let mut chunks = partial(api);
            chunks.push(match api {
                Api::OpenAi => text_chunk(&huge),
                Api::Anthropic => anth::text_delta(0, &huge),
            });
            vec![sse(chunks)]
        }
        Fault::EndlessStream => {
            let delta = "x".repeat(1000);
            let chunk = match api {
                Api::OpenAi => text_chunk(&delta),
                // A text block (re)started with text, again and again.
                Api::Anthropic => anth::event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": delta}}),
                ),
            };
            vec![FakeReply::Endless { chunk }]
        }
        // Each piece well within the idle timeout, the whole beyond it.
        Fault::SlowDrip => vec![FakeReply::Drip {
            chunks: answer(api),
            every: IDLE / 4,
            done: false,
        }],
    }
}

struct Case {
    name: String,
    fault: Fault,
    api: Api,
    tools: bool,
    fake: FakeOpenAi,
    provider: String,
}

async fn case(n: usize, fault: Fault, api: Api, tools: bool) -> Case {
    let mut script = Vec::new();
    if tools {
        script.push(tool_call(api));
    }
    script.extend(fault_replies(fault, api));
    let fake = FakeOpenAi::start(script).await;
    Case {
        name: format!(
            "{fault:?} × {api:?} × {}",
            if tools { "tools" } else { "no tools" }
        ),
        fault,
        api,
        tools,
        fake,
        provider: format!("c{n}"),
    }
}

fn provider_config(case: &Case) -> ProviderConfig {
    ProviderConfig {
        name: case.provider.clone(),
        kind: match case.api {
            Api::OpenAi => ProviderKind::Openai,
            Api::Anthropic => ProviderKind::Anthropic,
        },
        base_url: case.fake.base_url(),
        api_key_env: None,
        models: None,
        idle_timeout: Some(IDLE),
        // One retry: the 429 case shows Retry-After is waited for.
        max_retries: Some(1),
        max_tokens: None,
        model_max_tokens: None,
        max_tokens_limit: None,
        max_tokens_param: None,
        max_output_bytes: Some(OUTPUT_BOUND),
        reads: None,
        model_reads: None,
    }
}

/// Runs one case's turn and checks it; returns its outcome and time.
async fn run(client: &Client, case: &Case) -> (proto::TurnOutcome, Duration) {
    let name = &case.name;
    let session = new_session(client).await;
    let mut request = text_request(&session, "go");
    request.model = format!("{}/m", case.provider);
    let started = Instant::now();
    let summary = tokio::time::timeout(TURN_WAIT, async {
        client.chat_with(request).await.unwrap().finish().await
    })
    .await
    .unwrap_or_else(|_| panic!("{name}: the turn did not end within {TURN_WAIT:?}"))
    .unwrap_or_else(|e| panic!("{name}: the stream failed: {e}"));
    let took = started.elapsed();
    let want = expected(case.fault);

    // Exactly one turn_finished, the last event, with the right outcome.
    let finished: Vec<_> = summary
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.kind, ChatEvent::TurnFinished { .. }))
        .collect();
    assert_eq!(
        finished.len(),
        1,
        "{name}: {} turn_finished",
        finished.len()
    );
    assert_eq!(
        finished[0].0 + 1,
        summary.events.len(),
        "{name}: events after turn_finished"
    );
    let ChatEvent::TurnFinished { outcome, .. } = finished[0].1.kind else {
        unreachable!("filtered above")
    };
    assert_eq!(outcome, want.outcome, "{name}: outcome");
    let codes: Vec<proto::ErrorCode> = summary
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Error { code, .. } => Some(*code),
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        want.code.into_iter().collect::<Vec<_>>(),
        "{name}: error events"
    );
    if case.fault == Fault::RateLimitedRetryAfter {
        assert!(
            took >= Duration::from_secs(1),
            "{name}: Retry-After not waited ({took:?})"
        );
    }

    check_history(case, &client.history(&session).await.unwrap(), &want);
    (outcome, took)
}

/// The stored history of the case's one turn.
fn check_history(case: &Case, history: &[proto::Message], want: &Expected) {
    let name = &case.name;
    let role = |m: &proto::Message| proto::Role::try_from(m.role).unwrap();
    assert!(!history.is_empty(), "{name}: nothing stored");
    assert_eq!(
        role(&history[0]),
        proto::Role::User,
        "{name}: first message"
    );
    let mut rest = &history[1..];
    if case.tools {
        // The call, then its one result.
        assert!(
            rest.len() >= 2,
            "{name}: the tool exchange is missing: {history:?}"
        );
        let calls: Vec<&str> = rest[0]
            .content
            .iter()
            .filter_map(|b| match &b.block {
                Some(Block::ToolCall(c)) => Some(c.id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(role(&rest[0]), proto::Role::Assistant, "{name}");
        assert_eq!(calls.len(), 1, "{name}: tool calls {calls:?}");
        let results: Vec<&str> = history
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match &b.block {
                Some(Block::ToolResult(r)) => Some(r.call_id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(results, calls, "{name}: every call has exactly one result");
        assert_ne!(role(&rest[1]), proto::Role::Assistant, "{name}");
        rest = &rest[2..];
    }
    // At most one assistant message after that, and nothing else.
    assert!(
        rest.len() <= 1,
        "{name}: {} messages after the last tool result",
        rest.len()
    );
    let stored = rest.first().map(|m| {
        assert_eq!(role(m), proto::Role::Assistant, "{name}");
        message_text(m)
    });
    match (&want.answer, stored) {
        (Answer::Exactly(text), Some(stored)) => assert_eq!(&stored, text, "{name}"),
        (Answer::Exactly(_), None) => panic!("{name}: the answer is not stored"),
        (Answer::PrefixOf(text), stored) => {
            let stored = stored.unwrap_or_default();
            assert!(text.starts_with(&stored), "{name}: stored {stored:?}");
        }
        (Answer::Bounded, Some(stored)) => assert!(
            stored.len() > OUTPUT_BOUND && stored.len() <= OUTPUT_BOUND + 1000,
            "{name}: stored {} bytes",
            stored.len()
        ),
        (Answer::Bounded, None) => panic!("{name}: the cut answer is not stored"),
    }
}

#[tokio::test]
async fn every_upstream_fault_ends_each_turn_once_with_a_consistent_history() {
    let mut cases = Vec::new();
    for fault in FAULTS {
        for api in [Api::OpenAi, Api::Anthropic] {
            for tools in [false, true] {
                cases.push(case(cases.len(), fault, api, tools).await);
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.providers = cases.iter().map(provider_config).collect();
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("fm", Arc::new(Echo))).await;
    let client = Client::connect(server.url()).await.unwrap();

    let started = Instant::now();
    // Concurrently: the slow cases (stall, 429, drip) overlap.
    let results = futures::future::join_all(cases.iter().map(|c| run(&client, c))).await;
    let total = started.elapsed();
    for (case, (outcome, took)) in cases.iter().zip(&results) {
        println!("fault-matrix: {:<44} {outcome:?} in {took:.2?}", case.name);
    }
    println!(
        "fault-matrix: {} cases, {} success, {} error, all in {total:.2?}",
        results.len(),
        results
            .iter()
            .filter(|(o, _)| *o == proto::TurnOutcome::Success)
            .count(),
        results
            .iter()
            .filter(|(o, _)| *o == proto::TurnOutcome::Error)
            .count(),
    );
    // The endless upstreams were hung up on, not left streaming.
    for case in cases.iter().filter(|c| c.fault == Fault::EndlessStream) {
        tokio::time::timeout(TURN_WAIT, case.fake.wait_clients_gone(1))
            .await
            .unwrap_or_else(|_| panic!("{}: the endless upstream is still read", case.name));
    }
    server.stop().await;
}
