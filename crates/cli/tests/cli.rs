//! The real `agentrt` binary against the in-process server (on
//! `127.0.0.1:0`) with a scripted OpenAI-compatible upstream and the gate
//! provider: every subcommand at least once, `--output json` parsed, the
//! busy message verbatim, stdin input, a refused chat that leaves no
//! session, and the connection errors.

use std::process::Stdio;
use std::sync::Arc;

use agentrt_client::{ChatEvent, ChatOptions, Client, EventStream, OnDisconnect};
use agentrt_server::config::{ProviderConfig, ProviderKind};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, reasoning_chunk, sse_data, text_chunk, usage_chunk,
};
use agentrt_testkit::gate::{BEFORE, GateProvider};
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

struct Harness {
    server: InProcessServer,
    fake: FakeOpenAi,
    gate: Arc<GateProvider>,
    url: String,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A server whose default model `fake/m` is answered by `script`, and
    /// with `gate/*` for turns that stay live.
    async fn start(script: Vec<FakeReply>) -> Self {
        let fake = FakeOpenAi::start(script).await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        config.default_model = "fake/m".into();
        config.providers.push(ProviderConfig {
            name: "fake".into(),
            kind: ProviderKind::Openai,
            base_url: fake.base_url(),
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
        let gate = Arc::new(GateProvider::default());
        let server = InProcessServer::start(
            ServerBuilder::new(config)
                .model_provider("gate", gate.clone())
                .tool_source("local", Arc::new(Note)),
        )
        .await;
        let url = server.url();
        Self {
            server,
            fake,
            gate,
            url,
            _dir: dir,
        }
    }

    async fn client(&self) -> Client {
        Client::connect(self.url.clone()).await.unwrap()
    }

    /// Runs `agentrt --url URL ARGS...` with `stdin` (or none) to its end.
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let mut full = vec!["--url", self.url.as_str()];
        full.extend_from_slice(args);
        agentrt(&full, stdin).await
    }

    /// Runs it with `--output json` and parses stdout as one document.
    async fn json(&self, args: &[&str]) -> Value {
        let mut full = vec!["--output", "json"];
        full.extend_from_slice(args);
        let run = self.run(&full, None).await;
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
        serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON document ({e}): {run:?}"))
    }
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentrt"));
    cmd.args(args)
        .env_remove("AGENTRT_URL")
        .env_remove("AGENTRT_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn agentrt(args: &[&str], stdin: Option<&str>) -> Run {
    let mut cmd = command(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().expect("the agentrt binary starts");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).await.unwrap();
        drop(pipe);
    }
    let out = child.wait_with_output().await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Every stdout line as a JSON object (a streamed command).
fn json_lines(run: &Run) -> Vec<Value> {
    run.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?} is not JSON ({e})")))
        .collect()
}

fn answer(text: &[&str]) -> FakeReply {
    let mut chunks: Vec<Vec<u8>> = text.iter().map(|t| text_chunk(t)).collect();
    chunks.push(finish_chunk("stop"));
    chunks.push(usage_chunk(10, 3));
    FakeReply::sse(chunks)
}

/// A gated turn, live until the gate is released: the stream after its
/// first text, and the turn id.
async fn live_turn(client: &Client, session: &str) -> (EventStream, String) {
    let options = ChatOptions::new("wait for it")
        .model("gate/m")
        .on_disconnect(OnDisconnect::Continue);
    let mut events = client.chat(session, options).await.unwrap();
    loop {
        let event = events.next().await.unwrap().unwrap();
        if event.kind == ChatEvent::Text(BEFORE.into()) {
            return (events, event.turn_id);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_created_listed_read_updated_and_deleted() {
    let h = Harness::start(vec![answer(&["ok"])]).await;

    let created = h
        .json(&[
            "sessions", "create", "--title", "first", "--system", "be kind",
        ])
        .await;
    let id = created["session_id"].as_str().unwrap().to_owned();
    assert_eq!(created["title"], "first");
    assert_eq!(created["system_prompt"], "be kind");
    // Text output is the bare id; the old top-level spelling still works.
    let mine = h.run(&["create", "--id", "mine"], None).await;
    assert_eq!((mine.code, mine.stdout.as_str()), (0, "mine\n"), "{mine:?}");

    let listed = h.json(&["sessions", "list"]).await;
    let ids: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&id.as_str()) && ids.contains(&"mine"),
        "{listed}"
    );
    let text_list = h.run(&["list"], None).await;
    assert!(
        text_list.stdout.contains("mine\t0 messages"),
        "{text_list:?}"
    );

    let got = h.json(&["sessions", "get", &id]).await;
    assert_eq!(got["session_id"], id.as_str());
    let updated = h
        .json(&[
            "sessions",
            "update",
            &id,
            "--title",
            "renamed",
            "--archived",
            "true",
        ])
        .await;
    assert_eq!(
        (updated["title"].clone(), updated["archived"].clone()),
        (json!("renamed"), json!(true))
    );
    let listed = h.json(&["sessions", "list"]).await;
    assert_eq!(
        listed["sessions"].as_array().unwrap().len(),
        1,
        "archived left out: {listed}"
    );
    let all = h.json(&["sessions", "list", "--all"]).await;
    assert_eq!(all["sessions"].as_array().unwrap().len(), 2, "{all}");

    let shown = h.json(&["show", "mine"]).await;
    assert_eq!(shown["session"]["session_id"], "mine");
    assert_eq!(shown["messages"], json!([]));

    let deleted = h.json(&["sessions", "delete", &id]).await;
    assert_eq!(deleted["deleted"], true);
    let gone = h.run(&["sessions", "get", &id], None).await;
    assert_eq!(gone.code, 4, "{gone:?}");
    assert!(gone.stderr.contains("not found"), "{gone:?}");
    assert!(
        gone.stderr.contains("agentrt sessions list"),
        "says what to do: {gone:?}"
    );
    let again = h.run(&["sessions", "delete", &id], None).await;
    assert_eq!(again.code, 4, "{again:?}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_reads_stdin_creates_a_session_and_prints_reasoning_and_text() {
    let mut chunks = vec![
        reasoning_chunk("pondering "),
        text_chunk("hello "),
        text_chunk("world"),
    ];
    chunks.push(finish_chunk("stop"));
    chunks.push(usage_chunk(10, 3));
    let h = Harness::start(vec![FakeReply::sse(chunks)]).await;

    let run = h.run(&["chat"], Some("what is up?\n")).await;
    assert_eq!(run.code, 0, "{run:?}");
    // stdout is a pipe: it carries the answer alone; the reasoning went
    // to stderr, undimmed, on a line of its own.
    assert_eq!(run.stdout, "hello world\n", "{run:?}");
    assert!(run.stderr.contains("pondering \n"), "{run:?}");
    assert!(!run.stderr.contains('\x1b'), "{run:?}");
    assert!(run.stderr.contains("[SUCCESS"), "{run:?}");
    let session = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .expect("the new session is named on stderr")
        .to_owned();
    let history = h.json(&["history", &session]).await;
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "ROLE_USER");
    assert_eq!(
        messages[0]["content"][0]["text"]["text"], "what is up?",
        "{history}"
    );

    // `-` reads stdin too; --no-reasoning hides the reasoning.
    let run = h
        .run(
            &["chat", "--session", &session, "--no-reasoning", "-"],
            Some("again"),
        )
        .await;
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "hello world\n"),
        "{run:?}"
    );
    // No text and nothing on stdin: told what to do.
    let run = h.run(&["chat", "--session", &session], Some("")).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("stdin is empty"), "{run:?}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_json_is_one_object_per_event_and_the_options_reach_the_request() {
    let h = Harness::start(vec![answer(&["a", "b"])]).await;
    let session = h.json(&["sessions", "create"]).await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let run = h
        .run(
            &[
                "--output",
                "json",
                "chat",
                "--session",
                &session,
                "--model",
                "fake/other",
                "--system",
                "answer tersely",
                "--thinking",
                "low",
                "--timeout",
                "30s",
                "--on-disconnect",
                "continue",
                "hi",
                "there",
            ],
            None,
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines = json_lines(&run);
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"turn_started"), "{types:?}");
    assert_eq!(types.last(), Some(&"turn_finished"), "{types:?}");
    assert_eq!(
        lines.last().unwrap()["turn_finished"]["outcome"],
        "TURN_OUTCOME_SUCCESS"
    );
    let text: String = lines
        .iter()
        .filter(|l| l["type"] == "text")
        .map(|l| l["text"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ab");
    assert_eq!(lines[0]["turn_started"]["model"], "fake/other");
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=lines.len() as u64).collect::<Vec<_>>());

    let sent = h.fake.requests();
    let body = &sent.last().unwrap().body;
    assert_eq!(body["model"], "other", "{body}");
    let system = body["messages"][0].to_string();
    assert!(system.contains("answer tersely"), "{body}");
    let user = body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    assert!(user.contains("hi there"), "{body}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_chat_leaves_no_new_session_behind() {
    let h = Harness::start(vec![answer(&["never"])]).await;
    let run = h
        .run(&["chat", "--model", "nosuch/model", "hello"], None)
        .await;
    assert_eq!(run.code, 6, "{run:?}");
    assert!(run.stderr.contains("invalid argument"), "{run:?}");
    let listed = h.json(&["sessions", "list", "--all"]).await;
    assert_eq!(
        listed["sessions"],
        json!([]),
        "the new session was deleted again"
    );
    assert!(h.fake.requests().is_empty());
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_status_watch_and_stop() {
    let h = Harness::start(vec![answer(&["ok"])]).await;
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let (live, turn) = live_turn(&client, &session).await;

    let busy = h.run(&["chat", "--session", &session, "again"], None).await;
    assert_eq!(busy.code, 5, "{busy:?}");
    let expected = format!(
        "session {session} is running turn {turn}; watch it with `agentrt watch {session}` or \
         stop it with `agentrt stop {session}`"
    );
    assert_eq!(
        busy.stderr.trim_end(),
        format!("agentrt: {expected}"),
        "{busy:?}"
    );

    let status = h.json(&["status", &session]).await;
    assert_eq!(status["live"], true);
    assert_eq!(status["turn_id"], turn.as_str());

    // A watcher replays the turn so far, then follows it live.
    let mut watch = command(&["--url", &h.url, "--output", "json", "watch", &session])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut watched = Vec::new();
    loop {
        let line = lines.next_line().await.unwrap().expect("a watched event");
        let event: Value = serde_json::from_str(&line).unwrap();
        let gated = event["type"] == "text" && event["text"]["text"] == BEFORE;
        watched.push(event);
        if gated {
            break;
        }
    }
    h.gate.release(1);
    while let Some(line) = lines.next_line().await.unwrap() {
        watched.push(serde_json::from_str(&line).unwrap());
    }
    assert!(watch.wait().await.unwrap().success());
    assert_eq!(watched[0]["type"], "turn_started");
    let last = watched.last().unwrap();
    assert_eq!(
        (
            last["type"].clone(),
            last["turn_finished"]["outcome"].clone()
        ),
        (json!("turn_finished"), json!("TURN_OUTCOME_SUCCESS"))
    );
    assert!(live.finish().await.unwrap().status.is_none());

    let idle = h.run(&["status", &session], None).await;
    assert_eq!(idle.stdout.trim(), format!("{session}: idle"), "{idle:?}");

    // Stop a live turn; then nothing is running.
    let (live, _) = live_turn(&client, &session).await;
    let stop = h.run(&["stop", &session], None).await;
    assert_eq!(stop.code, 0, "{stop:?}");
    assert!(stop.stdout.contains("stopped the live turn"), "{stop:?}");
    let rest = live.finish().await.unwrap();
    assert_eq!(
        rest.outcome,
        Some(agentrt_client::proto::TurnOutcome::Canceled)
    );
    let again = h.json(&["stop", &session]).await;
    assert_eq!(again["stopped"], false);
    h.server.stop().await;
}

/// The next JSON line of a running command's stdout.
async fn next_json(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
    let line = lines.next_line().await.unwrap().expect("a line");
    serde_json::from_str(&line).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_busy_enqueue_and_steer_wait_for_their_turns() {
    let h = Harness::start(vec![answer(&["later ok"])]).await;
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let (live, _) = live_turn(&client, &session).await;
    let chat = |on_busy: &'static str, text: &'static str| {
        let mut c = command(&[
            "--url",
            &h.url,
            "--output",
            "json",
            "chat",
            "--session",
            &session,
            "--on-busy",
            on_busy,
            text,
        ]);
        c.stdin(Stdio::null());
        c.spawn().unwrap()
    };
    let mut queued = chat("enqueue", "later");
    let mut queued_lines = BufReader::new(queued.stdout.take().unwrap()).lines();
    let first = next_json(&mut queued_lines).await;
    assert_eq!(first["type"], "queued", "{first}");
    assert_eq!(first["queued"]["position"], 1);
    let status = h.json(&["status", &session]).await;
    assert_eq!(status["queued"].as_array().unwrap().len(), 1, "{status}");
    assert_eq!(status["queued"][0]["id"], first["turn_id"]);

    // A gated turn has no step boundary left: the steering message is
    // queued when it ends, behind the first.
    let mut steer = chat("steer", "also");
    let mut steer_lines = BufReader::new(steer.stdout.take().unwrap()).lines();
    // Released once the live turn holds the steering message (the status
    // re-read until it does, bounded).
    tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while client.session_status(&session).await.unwrap().steering == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the steering message reached the live turn");
    h.gate.release(1);
    assert!(live.finish().await.unwrap().status.is_none());

    let mut seen = Vec::new();
    while let Some(line) = queued_lines.next_line().await.unwrap() {
        seen.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert!(queued.wait().await.unwrap().success());
    assert_eq!(seen[0]["type"], "turn_started");
    assert!(seen.iter().all(|e| e["turn_id"] == first["turn_id"]));
    let last = seen.last().unwrap();
    assert_eq!(
        last["turn_finished"]["outcome"], "TURN_OUTCOME_SUCCESS",
        "{last}"
    );

    let steered = next_json(&mut steer_lines).await;
    assert_eq!(steered["type"], "steered", "{steered}");
    assert_eq!(steered["steered"]["message_seq"], 0);
    let requeued = next_json(&mut steer_lines).await;
    assert_eq!(requeued["type"], "queued", "{requeued}");
    assert_eq!(requeued["queued"]["position"], 2);
    let mut rest = Vec::new();
    while let Some(line) = steer_lines.next_line().await.unwrap() {
        rest.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert!(steer.wait().await.unwrap().success());
    assert_eq!(
        rest.last().unwrap()["turn_finished"]["outcome"],
        "TURN_OUTCOME_SUCCESS"
    );
    let stop = h.json(&["stop", "--clear-inbox", &session]).await;
    assert_eq!(
        (stop["stopped"].clone(), stop["cleared"].clone()),
        (json!(false), json!(0))
    );
    h.server.stop().await;
}

/// One tool call `lookup` (id `call_1`).
fn tool_call_reply() -> FakeReply {
    let call = json!({"index": 0, "id": "call_1", "type": "function",
                      "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}});
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
        usage_chunk(10, 3),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_result_history_pages_compact_and_admin() {
    let h = Harness::start(vec![tool_call_reply(), answer(&["done"])]).await;
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let options = ChatOptions::new("look it up").extra_tool(
        "lookup",
        "looks things up",
        r#"{"type":"object","properties":{"q":{"type":"string"}}}"#,
    );
    let mut events = client.chat(&session, options).await.unwrap();
    let (turn, call) = loop {
        let event = events.next().await.unwrap().unwrap();
        if let ChatEvent::ToolCall { call_id, .. } = &event.kind {
            break (event.turn_id.clone(), call_id.clone());
        }
    };
    let submitted = h
        .run(
            &["tool-result", &session, "--turn", &turn, "--call", &call],
            Some("the answer is 42"),
        )
        .await;
    assert_eq!(submitted.code, 0, "{submitted:?}");
    let summary = events.finish().await.unwrap();
    assert_eq!(summary.text, "done");
    let unknown_call = h
        .run(
            &[
                "tool-result",
                &session,
                "--turn",
                &turn,
                "--call",
                "nope",
                "x",
            ],
            None,
        )
        .await;
    assert_ne!(unknown_call.code, 0, "{unknown_call:?}");

    let all = h.json(&["history", &session]).await;
    let messages = all["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "user, call, result, answer: {all}");
    assert_eq!(all["next_page_token"], "");
    let result = &messages[2]["content"][0]["tool_result"];
    assert_eq!(result["content"], json!("the answer is 42"), "{all}");
    let page = h.json(&["history", &session, "--limit", "1"]).await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 1);
    assert_ne!(page["next_page_token"], "", "{page}");
    let after = h
        .json(&["history", &session, "--after-seq", "2", "--limit", "1"])
        .await;
    assert_eq!(after["messages"][0]["seq"], 3, "{after}");
    let text = h.run(&["history", &session], None).await;
    assert!(text.stdout.contains("user: look it up"), "{text:?}");

    // The turn's record: one turn, two model steps (the call, the answer).
    let turns = h.json(&["turns", &session]).await;
    let listed = turns["turns"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{turns}");
    assert_eq!(listed[0]["turn_id"], json!(turn), "{turns}");
    assert_eq!(
        (listed[0]["outcome"].clone(), listed[0]["steps"].clone()),
        (json!("TURN_OUTCOME_SUCCESS"), json!(2)),
        "{turns}"
    );
    let text = h.run(&["turns", &session], None).await;
    assert!(text.stdout.contains(&format!("{turn} success")), "{text:?}");

    let compacted = h.json(&["compact", &session]).await;
    assert!(compacted["compacted"].is_boolean(), "{compacted}");

    let stats = h.json(&["admin", "stats"]).await;
    assert_eq!(stats["live_turns"], 0, "{stats}");
    assert!(stats["sessions_stored"].as_u64().unwrap() >= 1, "{stats}");
    let usage = h.json(&["admin", "usage", "local"]).await;
    assert_eq!(usage["user_id"], "local", "{usage}");
    assert!(usage["sessions"].as_u64().unwrap() >= 1, "{usage}");
    let reset = h.json(&["admin", "reset"]).await;
    assert!(reset["reset"].is_u64(), "{reset}");
    let drained = h.json(&["admin", "drain", "--timeout", "5s"]).await;
    assert_eq!(drained["drained"], true, "{drained}");
    let refused = h.run(&["chat", "--session", &session, "more"], None).await;
    assert_eq!(refused.code, 8, "draining: {refused:?}");
    assert!(refused.stderr.contains("retry later"), "{refused:?}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_and_a_refused_connection_are_explained() {
    let no_scheme = agentrt(&["--url", "127.0.0.1:50051", "sessions", "list"], None).await;
    assert_eq!(no_scheme.code, 3, "{no_scheme:?}");
    assert!(
        no_scheme.stderr.contains("no scheme")
            && no_scheme.stderr.contains("http://127.0.0.1:50051"),
        "{no_scheme:?}"
    );
    let port = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let refused = agentrt(&["--url", &url, "status", "s"], None).await;
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(
        refused.stderr.contains(&url) && refused.stderr.contains("refused"),
        "{refused:?}"
    );
    let plaintext = agentrt(
        &[
            "--url",
            "http://10.255.255.1:1",
            "--token",
            "k",
            "sessions",
            "list",
        ],
        None,
    )
    .await;
    assert_eq!(plaintext.code, 3, "{plaintext:?}");
    assert!(plaintext.stderr.contains("--insecure"), "{plaintext:?}");
    let usage = agentrt(&["chat", "--thinking", "enormous", "x"], None).await;
    assert_eq!(usage.code, 2, "{usage:?}");
}

/// A timestamp as the protobuf JSON mapping writes it (RFC 3339, UTC):
/// `2026-12-03T18:40:24Z`, with optional fractional seconds.
fn is_rfc3339(v: &Value) -> bool {
    let Some(t) = v.as_str() else { return false };
    let b = t.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && t.ends_with('Z')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_a_streaming_chat_quietly_with_zero() {
    let h = Harness::start(vec![]).await;
    let session = h
        .client()
        .await
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let mut chat = command(&[
        "--url",
        &h.url,
        "chat",
        "--session",
        &session,
        "--model",
        "gate/m",
        "hi",
    ]);
    chat.stdin(Stdio::null());
    let mut chat = chat.spawn().unwrap();
    let mut stdout = chat.stdout.take().unwrap();
    // The gated text is out: the reader goes away (as `head -c 10` does),
    // then the turn goes on and the command has more to write.
    let mut first = vec![0u8; BEFORE.len()];
    tokio::io::AsyncReadExt::read_exact(&mut stdout, &mut first)
        .await
        .unwrap();
    assert_eq!(first, BEFORE.as_bytes());
    drop(stdout);
    h.gate.release(1);
    let out = chat.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_json_is_the_protobuf_mapping_with_usage_and_rfc3339_times() {
    let h = Harness::start(vec![answer(&["fine"])]).await;
    let run = h.run(&["chat", "how are you?"], None).await;
    assert_eq!(run.code, 0, "{run:?}");
    let session = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .unwrap()
        .to_owned();
    let history = h.json(&["history", &session]).await;
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{history}");
    let reply = &messages[1];
    assert_eq!(reply["role"], "ROLE_ASSISTANT", "{reply}");
    assert_eq!(reply["model"], "fake/m", "{reply}");
    assert_eq!(reply["usage"]["input_tokens"], 10, "{reply}");
    assert_eq!(reply["usage"]["output_tokens"], 3, "{reply}");
    assert!(reply["stop_reason"].is_string(), "every field: {reply}");
    for m in messages {
        assert!(is_rfc3339(&m["created_at"]), "{m}");
    }
    let turns = h.json(&["turns", &session]).await;
    let turn = &turns["turns"][0];
    assert!(is_rfc3339(&turn["started_at"]), "{turn}");
    assert!(is_rfc3339(&turn["finished_at"]), "{turn}");
    let session_json = h.json(&["sessions", "get", &session]).await;
    assert!(is_rfc3339(&session_json["created_at"]), "{session_json}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_version_and_undrain_after_a_drain() {
    let h = Harness::start(vec![answer(&["back"])]).await;
    let client = h.client().await;
    let health = h.json(&["health"]).await;
    assert_eq!(
        health,
        json!({"readiness": "SERVING", "liveness": "SERVING", "": "SERVING"})
    );
    let version = h.json(&["version"]).await;
    assert_eq!(version["client"], env!("CARGO_PKG_VERSION"), "{version}");
    assert_eq!(version["server"], env!("CARGO_PKG_VERSION"), "{version}");
    let text = h.run(&["version"], None).await;
    assert!(text.stdout.contains("server  "), "{text:?}");

    let mut readiness = client.watch_health("readiness").await.unwrap();
    let drained = h.json(&["admin", "drain", "--timeout", "5s"]).await;
    assert_eq!(drained["drained"], true, "{drained}");
    wait_for_health(&mut readiness, agentrt_client::Health::NotServing).await;
    let not_ready = h.run(&["health", "--service", "readiness"], None).await;
    assert_eq!(not_ready.code, 10, "{not_ready:?}");
    assert!(not_ready.stdout.contains("NOT_SERVING"), "{not_ready:?}");
    let live = h.run(&["health", "--service", "liveness"], None).await;
    assert_eq!(live.code, 0, "liveness stays SERVING: {live:?}");
    let refused = h.run(&["chat", "refused"], None).await;
    assert_eq!(refused.code, 8, "{refused:?}");

    let undrained = h.run(&["admin", "undrain"], None).await;
    assert_eq!(undrained.code, 0, "{undrained:?}");
    assert!(undrained.stdout.contains("admitted again"), "{undrained:?}");
    wait_for_health(&mut readiness, agentrt_client::Health::Serving).await;
    let ready = h
        .run(&["health", "--service", "readiness", "--wait", "10s"], None)
        .await;
    assert_eq!(ready.code, 0, "{ready:?}");
    let chat = h.run(&["chat", "are you back?"], None).await;
    assert_eq!((chat.code, chat.stdout.as_str()), (0, "back\n"), "{chat:?}");
    let again = h.json(&["admin", "undrain"]).await;
    assert_eq!(again["was_draining"], false, "{again}");

    let set = h.json(&["admin", "set-default-model", "fake/n"]).await;
    assert_eq!(
        (set["model"].clone(), set["previous_model"].clone()),
        (json!("fake/n"), json!("fake/m"))
    );
    let stats = h.json(&["admin", "stats"]).await;
    assert_eq!(stats["default_model"], "fake/n", "{stats}");
    let invalidated = h.json(&["admin", "invalidate"]).await;
    assert!(invalidated["invalidated"].is_u64(), "{invalidated}");
    h.server.stop().await;
}

/// Follows a health watch until it reports `want` (bounded).
async fn wait_for_health(
    updates: &mut futures::stream::BoxStream<
        'static,
        Result<agentrt_client::Health, agentrt_client::Error>,
    >,
    want: agentrt_client::Health,
) {
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(update) = updates.next().await {
            if update.unwrap() == want {
                return;
            }
        }
        panic!("the health watch ended before {want:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {want:?} within 10 s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_request_id_replays_and_max_steps_and_tools_reach_the_request() {
    let h = Harness::start(vec![answer(&["once"]), tool_call_reply()]).await;
    let session = h
        .client()
        .await
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let args = [
        "chat",
        "--session",
        &session,
        "--request-id",
        "req-1",
        "--max-steps",
        "3",
        "hello",
    ];
    let first = h.run(&args, None).await;
    assert_eq!(
        (first.code, first.stdout.as_str()),
        (0, "once\n"),
        "{first:?}"
    );
    let replay = h.run(&args, None).await;
    assert_eq!(
        (replay.code, replay.stdout.as_str()),
        (0, "once\n"),
        "{replay:?}"
    );
    assert_eq!(h.fake.requests().len(), 1, "the replay ran no model step");

    // A caller tool: offered to the model; its call, with no terminal to
    // answer it, ends the command with 9 and the way to answer it.
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("lookup.json");
    std::fs::write(
        &schema,
        r#"{"description": "looks a word up", "type": "object",
            "properties": {"q": {"type": "string"}}}"#,
    )
    .unwrap();
    let tool = format!("lookup={}", schema.display());
    let called = h
        .run(
            &[
                "chat",
                "--session",
                &session,
                "--on-disconnect",
                "continue",
                "--tool",
                &tool,
                "look",
            ],
            None,
        )
        .await;
    assert_eq!(called.code, 9, "{called:?}");
    assert!(
        called.stderr.contains("lookup({\"q\":\"x\"})"),
        "{called:?}"
    );
    assert!(called.stderr.contains("agentrt tool-result"), "{called:?}");
    let sent = h.fake.requests();
    let tools = sent.last().unwrap().body["tools"].to_string();
    assert!(
        tools.contains("lookup") && tools.contains("looks a word up"),
        "{tools}"
    );
    let bad = h
        .run(&["chat", "--tool", "x=/no/such/schema.json", "hi"], None)
        .await;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("/no/such/schema.json"), "{bad:?}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_when_busy_queues_the_message_and_runs_it_after_the_live_turn() {
    let h = Harness::start(vec![answer(&["my turn"])]).await;
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let (live, _) = live_turn(&client, &session).await;
    let mut chat = command(&[
        "--url",
        &h.url,
        "--output",
        "json",
        "chat",
        "--session",
        &session,
        "--wait-when-busy",
        "next",
    ]);
    chat.stdin(Stdio::null());
    let mut chat = chat.spawn().unwrap();
    let mut lines = BufReader::new(chat.stdout.take().unwrap()).lines();
    let first = next_json(&mut lines).await;
    assert_eq!(first["type"], "queued", "{first}");
    h.gate.release(1);
    let mut last = Value::Null;
    while let Ok(Some(line)) = lines.next_line().await {
        last = serde_json::from_str(&line).unwrap();
    }
    assert!(chat.wait().await.unwrap().success());
    assert_eq!(
        last["turn_finished"]["outcome"], "TURN_OUTCOME_SUCCESS",
        "{last}"
    );
    assert!(live.finish().await.unwrap().status.is_none());
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_to_a_port_that_hangs_up_suggests_https_and_completions_print() {
    // A TLS server reads the HTTP/2 preface as a broken hello: it answers
    // with a TLS alert and hangs up.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await;
            let _ = conn
                .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46])
                .await;
        }
    });
    let url = format!("http://127.0.0.1:{port}");
    let run = agentrt(&["--url", &url, "sessions", "list"], None).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(
        run.stderr.contains(&format!("https://127.0.0.1:{port}")),
        "{run:?}"
    );
    assert!(!run.stderr.contains("ClientBuilder"), "{run:?}");

    let script = agentrt(&["completions", "bash"], None).await;
    assert_eq!(script.code, 0, "{script:?}");
    assert!(
        script.stdout.contains("agentrt") && script.stdout.contains("undrain"),
        "{script:?}"
    );
}

/// Server tool `local__note`: answers "noted" (with a small PNG when asked
/// for `{"picture": true}`).
#[derive(Debug)]
struct Note;

#[async_trait::async_trait]
impl agentrt_runtime::toolbox::ToolSource for Note {
    async fn list(
        &self,
    ) -> Result<Vec<agentrt_runtime::model::ToolSpec>, agentrt_runtime::toolbox::ToolError> {
        Ok(vec![agentrt_runtime::model::ToolSpec {
            name: "note".into(),
            description: "notes something".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(
        &self,
        _name: &str,
        arguments_json: &str,
    ) -> agentrt_runtime::toolbox::ToolOutcome {
        let mut outcome = agentrt_runtime::toolbox::ToolOutcome::ok("noted");
        if arguments_json.contains("picture") {
            outcome
                .media
                .push(agentrt_runtime::toolbox::ToolMedia::Bytes {
                    kind: agentrt_runtime::types::MediaKind::Image,
                    data: bytes_of_png().into(),
                    mime_type: "image/png".into(),
                    name: "dot.png".into(),
                    uri: String::new(),
                });
        }
        outcome
    }
}

fn bytes_of_png() -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend((0..5_000u32).map(|i| (i % 241) as u8));
    png
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_attaches_files_saves_what_tools_return_and_blob_gets_and_puts() {
    let call = json!({"index": 0, "id": "call_1", "type": "function",
                      "function": {"name": "local__note", "arguments": "{\"picture\":true}"}});
    let h = Harness::start(vec![
        answer(&["a dot"]),
        FakeReply::sse(vec![
            sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
            finish_chunk("tool_calls"),
        ]),
        answer(&["drew it"]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("photo.png");
    std::fs::write(&image, bytes_of_png()).unwrap();
    let doc = dir.path().join("notes.txt");
    std::fs::write(&doc, "line one\nline two\n").unwrap();
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;

    // --attach: uploaded, then sent; the model gets the image and the text.
    let run = h
        .run(
            &[
                "chat",
                "--session",
                &session,
                "--attach",
                image.to_str().unwrap(),
                "--attach",
                doc.to_str().unwrap(),
                "what is this?",
            ],
            None,
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), "a dot");
    let body = &h.fake.requests()[0].body;
    let parts = body["messages"][0]["content"].as_array().unwrap();
    assert!(
        parts[1]["image_url"]["url"]
            .as_str()
            .unwrap()
            .starts_with("data:image/png;base64,"),
        "{body}"
    );
    assert!(
        parts[2]["text"].as_str().unwrap().contains("line two"),
        "{body}"
    );
    let history = h.json(&["history", &session]).await;
    let blocks = history["messages"][0]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(blocks[2]["file"]["name"], "notes.txt", "{history}");
    let blob_id = blocks[1]["image"]["blob_id"].as_str().unwrap().to_owned();

    // blob list: the image and the text file.
    let listed = h.json(&["blob", "list", &session]).await;
    let names: std::collections::BTreeSet<&str> = listed["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["notes.txt", "photo.png"].into(), "{listed}");
    // blob get: the same bytes.
    let out = dir.path().join("again.png");
    let got = h
        .run(
            &[
                "blob",
                "get",
                &session,
                &blob_id,
                "--out",
                out.to_str().unwrap(),
            ],
            None,
        )
        .await;
    assert_eq!(got.code, 0, "{got:?}");
    assert_eq!(std::fs::read(&out).unwrap(), bytes_of_png());
    // blob put: prints the id.
    let put = h
        .run(&["blob", "put", &session, doc.to_str().unwrap()], None)
        .await;
    assert_eq!(put.code, 0, "{put:?}");
    assert_eq!(
        put.stdout.trim(),
        agentrt_client::sha256_hex(b"line one\nline two\n")
    );

    // --save-dir: what a tool returns is saved and named.
    let saved = dir.path().join("saved");
    let run = h
        .run(
            &[
                "chat",
                "--session",
                &session,
                "--save-dir",
                saved.to_str().unwrap(),
                "draw",
            ],
            None,
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("[image dot.png (image/png, 5 KB)"),
        "{run:?}"
    );
    let files: Vec<_> = std::fs::read_dir(&saved)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].to_str().unwrap().ends_with("-dot.png"));
    assert_eq!(std::fs::read(&files[0]).unwrap(), bytes_of_png());

    // Another user's session or a bad id: a clear failure, nothing written.
    let bad = h.run(&["blob", "get", &session, "nope"], None).await;
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("blob_id"), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_requires_approval_is_listed_and_approved() {
    let call = json!({"index": 0, "id": "call_1", "type": "function",
                      "function": {"name": "local__note", "arguments": "{}"}});
    let h = Harness::start(vec![
        FakeReply::sse(vec![
            sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
            finish_chunk("tool_calls"),
        ]),
        answer(&["noted it"]),
    ])
    .await;
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let mut chat = command(&[
        "--url",
        &h.url,
        "--output",
        "json",
        "chat",
        "--session",
        &session,
        "--require-approval",
        "local__note",
        "note it",
    ]);
    chat.stdin(Stdio::null());
    let mut chat = chat.spawn().unwrap();
    let mut lines = BufReader::new(chat.stdout.take().unwrap()).lines();
    loop {
        let event = next_json(&mut lines).await;
        if event["type"] == "approval_required" {
            assert_eq!(event["approval_required"]["call_id"], "call_1", "{event}");
            assert_eq!(event["approval_required"]["name"], "local__note", "{event}");
            break;
        }
    }
    let status = h.json(&["status", &session]).await;
    assert_eq!(status["pending_calls"][0]["call_id"], "call_1", "{status}");
    assert_eq!(
        status["pending_calls"][0]["wait"], "PENDING_CALL_WAIT_APPROVAL",
        "{status}"
    );
    let approved = h.json(&["approve", &session, "call_1"]).await;
    assert_eq!(approved["approved"], true, "{approved}");
    let mut last = Value::Null;
    while let Ok(Some(line)) = lines.next_line().await {
        last = serde_json::from_str(&line).unwrap();
    }
    assert!(chat.wait().await.unwrap().success());
    assert_eq!(last["type"], "turn_finished", "{last}");
    let again = h
        .run(&["approve", &session, "call_1", "--deny"], None)
        .await;
    assert_ne!(again.code, 0, "{again:?}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_created_updated_and_read_memory_is_set_and_chat_runs_with_an_agent() {
    let h = Harness::start(vec![answer(&["ok"])]).await;
    let prompt = h._dir.path().join("prompt.txt");
    std::fs::write(&prompt, "Notes for {{ user }}: {{ memory.notes }}").unwrap();
    let at_prompt = format!("@{}", prompt.display());
    let created = h
        .json(&[
            "agents",
            "create",
            "helper",
            "--description",
            "helps",
            "--system",
            &at_prompt,
            "--tools",
            "memory_read",
        ])
        .await;
    assert_eq!(created["version"], 1, "{created}");
    assert_eq!(
        created["spec"]["tools"]["names"],
        serde_json::json!(["memory_read"]),
        "{created}"
    );
    // An update keeps what its flags leave out.
    let updated = h
        .json(&["agents", "update", "helper", "--description", "helps more"])
        .await;
    assert_eq!(
        (
            &updated["version"],
            &updated["spec"]["description"],
            &updated["spec"]["system_prompt"]
        ),
        (
            &serde_json::json!(2),
            &serde_json::json!("helps more"),
            &serde_json::json!("Notes for {{ user }}: {{ memory.notes }}")
        ),
        "{updated}"
    );
    let listed = h.json(&["agents", "list"]).await;
    assert_eq!(listed[0]["agent_id"], "helper", "{listed}");
    let v1 = h.json(&["agents", "get", "helper", "--version", "1"]).await;
    assert_eq!(v1["spec"]["description"], "helps", "{v1}");
    // An unknown agent: a clear message and a non-zero exit.
    let run = h.run(&["agents", "get", "nobody"], None).await;
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("agent not found"), "{run:?}");

    let memory = h
        .json(&["memory", "set", "helper", "notes", "likes tea"])
        .await;
    assert_eq!(memory["blocks"]["notes"], "likes tea", "{memory}");
    let run = h.run(&["memory", "get", "helper"], None).await;
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "[notes]\nlikes tea\n"),
        "{run:?}"
    );

    // chat --agent: a new session of the agent, its prompt rendered.
    let run = h.run(&["chat", "--agent", "helper", "hi"], None).await;
    assert_eq!(run.code, 0, "{run:?}");
    let sent = &h.fake.requests()[0].body;
    assert_eq!(sent["messages"][0]["role"], "system", "{sent}");
    assert_eq!(
        sent["messages"][0]["content"], "Notes for local: likes tea",
        "{sent}"
    );
    // The session it made is listed by agent, with its version.
    let listed = h.json(&["sessions", "list", "--agent", "helper"]).await;
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{listed}");
    assert_eq!(sessions[0]["agent_version"], 2, "{listed}");
    assert_eq!(sessions[0]["parent_session_id"], "", "{listed}");
    let none = h.json(&["sessions", "list", "--agent", "other"]).await;
    assert_eq!(none["sessions"], serde_json::json!([]), "{none}");
    h.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_replicas_lists_this_process_and_its_live_turn() {
    let h = Harness::start(vec![answer(&["ok"])]).await;
    let client = h.client().await;
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let (live, turn_id) = live_turn(&client, &session).await;

    let listed = h.json(&["admin", "replicas"]).await;
    let replicas = listed["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 1, "{listed}");
    assert_eq!(replicas[0]["this_replica"], true, "{listed}");
    assert_eq!(replicas[0]["live"], true, "{listed}");
    assert!(is_rfc3339(&replicas[0]["heartbeat_at"]), "{listed}");
    let leases = listed["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{listed}");
    assert_eq!(
        (
            &leases[0]["session_id"],
            &leases[0]["owner"],
            &leases[0]["turn_id"]
        ),
        (&json!(session), &json!("local"), &json!(turn_id)),
        "{listed}"
    );
    assert!(is_rfc3339(&leases[0]["started_at"]), "{listed}");
    assert_eq!(listed["next_page_token"], "", "{listed}");

    let text = h.run(&["admin", "replicas"], None).await;
    assert_eq!(text.code, 0, "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert!(
        lines[0].starts_with("REPLICA") && lines[0].ends_with("LEASES"),
        "{text:?}"
    );
    let me: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        (&me[..3], &me[me.len() - 2..]),
        (&["(single", "process)", "*"][..], &["yes", "1"][..]),
        "{text:?}"
    );
    let lease = lines
        .iter()
        .find(|l| l.starts_with(&session))
        .expect("the lease's row");
    assert!(
        lease.contains(" local ") && lease.contains(&turn_id),
        "{text:?}"
    );

    h.gate.release(1);
    drop(live);
    h.server.stop().await;
}
