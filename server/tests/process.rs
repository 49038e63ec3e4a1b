//! The `agentrt-server` binary as a child process: SIGKILL mid-turn and
//! restart (crash recovery), SIGTERM with live turns (graceful drain).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk};
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

struct Server {
    child: Child,
    url: String,
}

fn write_config(dir: &Path, fake: &FakeOpenAi, grace: &str) -> std::path::PathBuf {
    let path = dir.join("agentrt.toml");
    let text = format!(
        "default_model = \"mock/m\"\nshutdown_grace = \"{grace}\"\n\n[[providers]]\nname = \"mock\"\nkind = \"openai\"\nbase_url = \"{}\"\n",
        fake.base_url()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn start(data_dir: &Path, config: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .arg("--config")
        .arg(config)
        .env("AGENTRT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the server announced its address")
        .unwrap()
        .expect("a line on stdout");
    let addr = line
        .strip_prefix("agentrt-server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

fn sigterm(child: &Child) {
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A deterministic pseudo-random sequence, so a failing kill point can be
/// reproduced.
fn points(n: usize, max: u64) -> Vec<u64> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (max + 1)
        })
        .collect()
}

#[tokio::test]
async fn sigkill_mid_turn_then_restart_interrupts_the_turn_and_frees_the_session() {
    const DELTAS: usize = 30;
    let mut chunks: Vec<Vec<u8>> = (0..DELTAS).map(|i| text_chunk(&format!("d{i} "))).collect();
    chunks.push(finish_chunk("stop"));
    let hang = FakeReply::Sse {
        chunks: chunks[..DELTAS / 2].to_vec(),
        done: false,
        then_hang: true,
    };
    // Alternate turns that complete with turns that stall mid-stream, so
    // kills land both inside and after turns.
    let script = (0..40)
        .map(|i| {
            if i % 2 == 0 {
                FakeReply::sse(chunks.clone())
            } else {
                hang.clone()
            }
        })
        .collect();
    let fake = FakeOpenAi::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, "1s");
    let data = dir.path().join("data");

    let mut server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    drop(client);

    let mut interrupted = 0;
    // A kill point is the number of events read before SIGKILL: 0 = right
    // after sending the request, DELTAS + 6 = after the whole turn.
    for (round, point) in points(20, DELTAS as u64 + 6).into_iter().enumerate() {
        let client = Client::connect(server.url.clone()).await.unwrap();
        let mut req = proto::ChatRequest {
            session_id: session.clone(),
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock {
                    text: format!("round {round}"),
                })),
            }],
            ..Default::default()
        };
        req.request_id = format!("round-{round}");
        match client.chat_with(req).await {
            Ok(mut events) => {
                for _ in 0..point {
                    // A stalled turn stops yielding: kill it there.
                    match tokio::time::timeout(Duration::from_millis(200), events.next()).await {
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            Err(e) => panic!("round {round}: admission failed: {e}"),
        }
        server.child.kill().await.unwrap();
        drop(client);

        server = start(&data, &config).await;
        let client = Client::connect(server.url.clone()).await.unwrap();
        let history = client.history(&session).await.unwrap();
        let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "round {round}"
        );
        let mut ids: Vec<&str> = history.iter().map(|m| m.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            history.len(),
            "round {round}: a message was stored twice"
        );
        let s = client.get_session(&session).await.unwrap();
        assert_eq!(s.message_count, history.len() as u64, "round {round}");
        if let Some(last) = s.last_turn {
            assert_ne!(last.outcome(), proto::TurnOutcome::Running, "round {round}");
            if last.outcome() == proto::TurnOutcome::Interrupted {
                interrupted += 1;
            }
            let users = history
                .iter()
                .filter(|m| m.turn_id == last.turn_id && m.role() == proto::Role::User)
                .count();
            assert_eq!(
                users, 1,
                "round {round}: the turn's user message is stored once"
            );
            let answers = history
                .iter()
                .filter(|m| m.turn_id == last.turn_id && m.role() == proto::Role::Assistant)
                .count();
            assert!(answers <= 1, "round {round}");
        }
        // A retry of the same request never runs twice.
        let retry = client
            .chat_with(proto::ChatRequest {
                session_id: session.clone(),
                content: vec![proto::ContentBlock {
                    block: Some(proto::content_block::Block::Text(proto::TextBlock {
                        text: format!("round {round}"),
                    })),
                }],
                request_id: format!("round-{round}"),
                ..Default::default()
            })
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
        assert!(
            retry.outcome.is_some(),
            "round {round}: the retry replays an outcome"
        );
        assert_eq!(
            client.history(&session).await.unwrap().len(),
            history.len(),
            "round {round}"
        );

        // The session is free at once.
        let mut fresh = proto::ChatRequest {
            session_id: session.clone(),
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock {
                    text: "after restart".into(),
                })),
            }],
            ..Default::default()
        };
        fresh.model = "builtin/echo".into();
        let after = client
            .chat_with(fresh)
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
        assert_eq!(
            after.outcome,
            Some(proto::TurnOutcome::Success),
            "round {round}"
        );
    }
    assert!(
        interrupted >= 5,
        "only {interrupted} of 20 kills landed inside a turn"
    );
    server.child.kill().await.unwrap();
}

#[tokio::test]
async fn sigterm_with_live_turns_drains_refuses_new_chats_and_exits_zero() {
    let hang = FakeReply::Sse {
        chunks: vec![text_chunk("partial")],
        done: false,
        then_hang: true,
    };
    let fake = FakeOpenAi::start(vec![hang]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, "1s");
    let data = dir.path().join("data");
    let mut server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();

    let mut live = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..8 {
        let s = client
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .session_id;
        let mut events = client.chat(&s, "go").await.unwrap();
        loop {
            let e = events.next().await.unwrap().unwrap();
            if matches!(e.kind, ChatEvent::Text(_)) {
                break;
            }
        }
        live.push(events);
        sessions.push(s);
    }
    let spare = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;

    let channel = tonic::transport::Endpoint::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut readiness = health
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving;
    assert_eq!(
        readiness.message().await.unwrap().unwrap().status(),
        serving
    );

    let signalled = Instant::now();
    sigterm(&server.child);
    let next = readiness.message().await.unwrap().unwrap().status();
    assert_eq!(
        next,
        tonic_health::pb::health_check_response::ServingStatus::NotServing
    );
    let refused = client.chat(&spare, "too late").await.unwrap_err();
    assert!(refused.code() == Some(tonic::Code::Unavailable));

    for events in live {
        let rest = events.finish().await.unwrap();
        let end = rest.events.iter().find_map(|e| match e.kind {
            ChatEvent::TurnFinished {
                outcome,
                cancel_reason,
                ..
            } => Some((outcome, cancel_reason)),
            _ => None,
        });
        assert_eq!(
            end,
            Some((proto::TurnOutcome::Canceled, proto::CancelReason::Shutdown))
        );
    }
    drop(readiness);
    drop(health);
    drop(client);
    let status = tokio::time::timeout(Duration::from_secs(10), server.child.wait())
        .await
        .expect("the server exited")
        .unwrap();
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < Duration::from_secs(3) + Duration::from_millis(500),
        "exit took {took:?}"
    );

    // Everything stayed: the partial answers are stored, marked shutdown.
    let server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    for s in &sessions {
        let history = client.history(s).await.unwrap();
        assert_eq!(history.len(), 2);
        assert_eq!(history[1].stop_reason, "shutdown");
    }
}

/// Start-up errors come before the "listening" line: a script waiting for
/// that line must never see it from a server that is about to exit.
#[tokio::test]
async fn a_bad_default_model_is_reported_before_the_listening_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agentrt.toml");
    std::fs::write(&config, "default_model = \"nowhere/model-x\"\n").unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .env("AGENTRT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the server exited on its own")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert!(
        !stdout.contains("listening on"),
        "announced an address it will never serve: {stdout:?}"
    );
    assert!(
        stderr.contains("nowhere"),
        "the error names the model: {stderr:?}"
    );
}

/// ON_BUSY_ENQUEUE across SIGKILL: the live turn is interrupted by the
/// crash, and each queued message runs exactly once after the restart —
/// found by the start-up sweep, its Chat retried with its request id
/// (queued, live or finished, the retry follows that message's turn).
#[tokio::test]
async fn sigkill_with_two_queued_messages_runs_each_once_after_restart() {
    let hang = FakeReply::Sse {
        chunks: vec![text_chunk("partial ")],
        done: false,
        then_hang: true,
    };
    let answer = |t: &str| FakeReply::sse(vec![text_chunk(t), finish_chunk("stop")]);
    let fake = FakeOpenAi::start(vec![hang, answer("one"), answer("two")]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, "1s");
    let data = dir.path().join("data");

    let mut server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let text = |t: &str| {
        vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: t.to_owned(),
            })),
        }]
    };
    let mut first = client
        .chat_with(proto::ChatRequest {
            session_id: session.clone(),
            content: text("first"),
            ..Default::default()
        })
        .await
        .unwrap();
    loop {
        let event = first.next().await.unwrap().unwrap();
        if matches!(event.kind, ChatEvent::Text(_)) {
            break;
        }
    }
    let queued = |t: &str, rid: &str| proto::ChatRequest {
        session_id: session.clone(),
        content: text(t),
        request_id: rid.to_owned(),
        on_busy: proto::OnBusy::Enqueue as i32,
        ..Default::default()
    };
    let mut ids = Vec::new();
    for (t, rid) in [("q1", "r1"), ("q2", "r2")] {
        let mut chat = client.chat_with(queued(t, rid)).await.unwrap();
        let event = chat.next().await.unwrap().unwrap();
        assert!(matches!(event.kind, ChatEvent::Queued { .. }), "{event:?}");
        ids.push(event.turn_id);
    }
    server.child.kill().await.unwrap();
    drop((first, client));

    let server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    for ((t, rid), id) in [("q1", "r1"), ("q2", "r2")].into_iter().zip(&ids) {
        let mut chat = client.chat_with(queued(t, rid)).await.unwrap();
        let mut outcome = None;
        while let Some(event) = chat.next().await {
            let event = event.unwrap();
            assert_eq!(&event.turn_id, id);
            if let ChatEvent::TurnFinished { outcome: o, .. } = event.kind {
                outcome = Some(o);
            }
        }
        assert_eq!(outcome, Some(proto::TurnOutcome::Success), "{t}");
    }
    // Each ran once: three model requests in all, history in order.
    assert_eq!(fake.requests().len(), 3);
    let history = client.history(&session).await.unwrap();
    let texts: Vec<String> = history
        .iter()
        .filter(|m| m.role() != proto::Role::Notice)
        .map(|m| {
            m.content
                .iter()
                .filter_map(|b| match &b.block {
                    Some(proto::content_block::Block::Text(t)) => Some(t.text.clone()),
                    _ => None,
                })
                .collect::<String>()
        })
        .collect();
    assert_eq!(texts, ["first", "q1", "one", "q2", "two"]);
    let turns = client
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .turns;
    let outcomes: Vec<_> = turns.iter().rev().map(|t| t.outcome()).collect();
    assert_eq!(
        outcomes,
        [
            proto::TurnOutcome::Interrupted,
            proto::TurnOutcome::Success,
            proto::TurnOutcome::Success
        ]
    );
    assert!(
        client
            .session_status(&session)
            .await
            .unwrap()
            .queued
            .is_empty()
    );
    drop(server);
}

/// A Chat offering the caller tool `get_time`.
fn get_time_request(session_id: &str, text: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session_id.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }],
        extra_tools: vec![proto::ToolDefinition {
            name: "get_time".into(),
            description: "the caller's clock".into(),
            parameters_json_schema: r#"{"type":"object"}"#.into(),
        }],
        ..Default::default()
    }
}

/// A server (config with `extra` appended) whose turn waits for the
/// caller's `get_time` call `call_1`; the model answers `answer` after it.
struct PausedOnGetTime {
    fake: FakeOpenAi,
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    config: std::path::PathBuf,
    server: Server,
    client: Client,
    session: String,
    turn_id: String,
    chat: agentrt_client::EventStream,
}

async fn paused_on_get_time(answer: &str, extra: &str) -> PausedOnGetTime {
    let call = serde_json::json!({
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "get_time", "arguments": "{\"tz\":\"CET\"}"}
    });
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            agentrt_testkit::fake_openai::sse_data(
                &serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
            ),
            finish_chunk("tool_calls"),
        ]),
        FakeReply::sse(vec![text_chunk(answer), finish_chunk("stop")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, "30s");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(extra);
    std::fs::write(&config, text).unwrap();
    let data = dir.path().join("data");
    let server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let mut chat = client
        .chat_with(get_time_request(&session, "what time is it?"))
        .await
        .unwrap();
    let turn_id = loop {
        let event = chat.next().await.unwrap().unwrap();
        if matches!(event.kind, ChatEvent::ToolCall { .. }) {
            break event.turn_id;
        }
    };
    PausedOnGetTime {
        fake,
        _dir: dir,
        data,
        config,
        server,
        client,
        session,
        turn_id,
        chat,
    }
}

/// A turn paused on a caller-executed tool survives the end of its
/// process — SIGKILL (`kill`) or a drain (SIGTERM) — and SubmitToolResult
/// after the restart resumes it: a watcher sees it run on from its tool
/// phase to one SUCCESS, with the result in history.
async fn paused_turn_resumes_after(kill: bool) {
    let PausedOnGetTime {
        fake,
        _dir,
        data,
        config,
        mut server,
        client,
        session,
        turn_id,
        mut chat,
    } = paused_on_get_time("it is noon", "").await;
    if kill {
        server.child.kill().await.unwrap();
    } else {
        // The drain does not wait for the caller: the turn is suspended,
        // its Chat told UNAVAILABLE, and the process exits at once.
        sigterm(&server.child);
        let mut last = None;
        while let Some(item) = chat.next().await {
            last = Some(item);
        }
        let err = last.expect("an end").expect_err("a status");
        assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
        assert!(err.to_string().contains("paused"), "{err}");
        let exited = tokio::time::timeout(Duration::from_secs(10), server.child.wait()).await;
        assert!(exited.is_ok(), "the drain waited for the caller");
    }
    drop((chat, client));

    let server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    let status = client.session_status(&session).await.unwrap();
    assert!(!status.live);
    assert_eq!(status.paused_turn_id, turn_id);
    assert_eq!(status.pending_calls.len(), 1);
    assert_eq!(status.pending_calls[0].call_id, "call_1");
    // The session is busy while paused.
    let busy = client
        .chat_with(proto::ChatRequest {
            session_id: session.clone(),
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock {
                    text: "hello?".into(),
                })),
            }],
            ..Default::default()
        })
        .await;
    let Err(err) = busy else {
        panic!("the session is busy")
    };
    assert_eq!(err.code(), Some(tonic::Code::Aborted), "{err}");

    let mut watch = client.subscribe(&session, 0, true).await.unwrap();
    client
        .submit_tool_result(&session, &turn_id, "call_1", "12:00 CET", false)
        .await
        .unwrap();
    let mut outcome = None;
    while let Some(event) = watch.next().await {
        let event = event.unwrap();
        assert_eq!(event.turn_id, turn_id);
        if let ChatEvent::TurnFinished { outcome: o, .. } = event.kind {
            outcome = Some(o);
        }
    }
    assert_eq!(outcome, Some(proto::TurnOutcome::Success));
    // The model got the result after its call, once.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["content"], "12:00 CET");
    let history = client.history(&session).await.unwrap();
    let roles: Vec<_> = history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        [
            proto::Role::User,
            proto::Role::Assistant,
            proto::Role::Tool,
            proto::Role::Assistant
        ]
    );
    let turn = client.get_turn(&session, &turn_id).await.unwrap();
    assert_eq!(turn.outcome(), proto::TurnOutcome::Success);
    assert!(!client.session_status(&session).await.unwrap().live);
}

#[tokio::test]
async fn a_turn_paused_on_a_caller_tool_survives_sigkill_and_resumes_on_submit() {
    paused_turn_resumes_after(true).await;
}

#[tokio::test]
async fn a_drain_suspends_a_turn_paused_on_a_caller_tool_and_a_submit_resumes_it() {
    paused_turn_resumes_after(false).await;
}

/// A paused turn nobody answers ends at its bound even with no process
/// running it: after the restart the inbox sweep finds it past
/// `approval_timeout` and it times out (its open call answered as cut
/// short), freeing the session.
#[tokio::test]
async fn a_paused_turn_past_its_bound_times_out_after_a_restart() {
    let PausedOnGetTime {
        fake,
        _dir,
        data,
        config,
        mut server,
        client,
        session,
        turn_id,
        chat,
    } = paused_on_get_time("later", "\n[tools]\napproval_timeout = \"1s\"\n").await;
    server.child.kill().await.unwrap();
    drop((chat, client));

    let server = start(&data, &config).await;
    let client = Client::connect(server.url.clone()).await.unwrap();
    let mut watch = client.subscribe(&session, 0, true).await.unwrap();
    let mut outcome = None;
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = watch.next().await {
            // TIMED_OUT ends the stream with DEADLINE_EXCEEDED after it.
            let Ok(event) = event else { break };
            assert_eq!(event.turn_id, turn_id);
            if let ChatEvent::TurnFinished { outcome: o, .. } = event.kind {
                outcome = Some(o);
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the paused turn did not end at its bound");
    assert_eq!(outcome, Some(proto::TurnOutcome::TimedOut));
    let status = client.session_status(&session).await.unwrap();
    assert!(status.paused_turn_id.is_empty() && !status.live);
    // The session is free again.
    let next = client
        .chat_with(get_time_request(&session, "again"))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(next.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(fake.requests().len(), 2);
}
