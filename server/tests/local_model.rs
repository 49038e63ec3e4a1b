//! The server with the built-in local model: real turns through gRPC
//! against the real model file (skipped loudly when it is absent, failing
//! under `CI=true` / `AGENTRT_REQUIRE_MODEL=1`), the tool refusal, and the
//! start-up without a model (echo, and one line saying how to get it).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

/// Serves `config` in this process; returns the URL and the server, which
/// stops when dropped.
async fn serve(config: Config) -> (String, InProcessServer) {
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    (server.url(), server)
}

async fn connect(url: &str) -> Client {
    for _ in 0..200 {
        if let Ok(client) = Client::connect(url.to_owned()).await {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server did not come up at {url}");
}

fn local_config(data_dir: &Path, model: &Path) -> Config {
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    };
    config.local_model.path = Some(model.to_path_buf());
    config.local_model.max_tokens = Some(24);
    config
}

#[tokio::test]
async fn with_the_model_present_chat_streams_real_text_from_local_smollm2() {
    let Some(model) = agentrt_testkit::local_model::model_path() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (url, _stop) = serve(local_config(dir.path(), &model)).await;
    let client = connect(&url).await;
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let events: Vec<ChatEvent> = client
        .chat(&session, "Write a haiku about the ocean.")
        .await
        .unwrap()
        .map(|e| e.unwrap().kind)
        .collect()
        .await;
    let ChatEvent::TurnStarted(started) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(started.model, "local/smollm2");
    let texts = events
        .iter()
        .filter(|e| matches!(e, ChatEvent::Text(t) if !t.is_empty()))
        .count();
    assert!(texts >= 3, "several text events: {events:?}");
    let Some(ChatEvent::TurnFinished { outcome, usage, .. }) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(*outcome, proto::TurnOutcome::Success);
    assert!(
        usage.input_tokens > 20 && usage.output_tokens >= 1,
        "{usage:?}"
    );
}

#[tokio::test]
async fn stop_session_ends_local_generation_within_a_second() {
    let Some(model) = agentrt_testkit::local_model::model_path() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(dir.path(), &model);
    config.local_model.max_tokens = Some(2000);
    let (url, _stop) = serve(config).await;
    let client = connect(&url).await;
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let mut events = client
        .chat(&session, "Write a very long story about a robot.")
        .await
        .unwrap();
    // Wait for generated text, so the stop hits a running generation.
    loop {
        match events.next().await.unwrap().unwrap().kind {
            ChatEvent::Text(_) => break,
            ChatEvent::TurnFinished { .. } => panic!("finished before any text"),
            _ => {}
        }
    }
    let asked = std::time::Instant::now();
    assert!(client.stop_session(&session).await.unwrap());
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "StopSession took {:?}",
        asked.elapsed()
    );
    let mut outcome = None;
    while let Some(e) = events.next().await {
        if let Ok(ChatEvent::TurnFinished { outcome: o, .. }) = e.map(|e| e.kind) {
            outcome = Some(o);
        }
    }
    assert_eq!(outcome, Some(proto::TurnOutcome::Canceled));
    // The inference thread is free again: the next turn streams text.
    let mut next = client.chat(&session, "hi").await.unwrap();
    let got_text = loop {
        match next.next().await {
            Some(Ok(e)) if matches!(e.kind, ChatEvent::Text(_)) => break true,
            Some(Ok(_)) => {}
            _ => break false,
        }
    };
    assert!(got_text);
}

#[tokio::test]
async fn a_turn_offering_tools_to_the_local_model_is_invalid_argument_naming_it() {
    let Some(model) = agentrt_testkit::local_model::model_path() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (url, _stop) = serve(local_config(dir.path(), &model)).await;
    let client = connect(&url).await;
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let request = proto::ChatRequest {
        session_id: session.clone(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: "what time is it?".into(),
            })),
        }],
        extra_tools: vec![proto::ToolDefinition {
            name: "clock".into(),
            description: "tells the time".into(),
            parameters_json_schema: r#"{"type":"object"}"#.into(),
        }],
        ..Default::default()
    };
    let Err(err) = client.chat_with(request).await else {
        panic!("a turn offering tools to local/smollm2 was admitted")
    };
    let Some(status) = err.status().cloned() else {
        panic!("{err:?}")
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("local/smollm2") && status.message().contains("tools"),
        "{}",
        status.message()
    );
    // Nothing was stored: the rejection had no side effect.
    let history = client.history(&session).await.unwrap();
    assert!(history.is_empty());
}

#[tokio::test]
async fn without_a_model_the_server_says_how_to_get_one_and_chats_with_echo() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("AGENTRT_MODEL_PATH")
        .env_remove("AGENTRT_DEFAULT_MODEL")
        .env_remove("AGENTRT_CONFIG")
        .env("AGENTRT_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("the server announced its address")
        .unwrap()
        .expect("a line on stdout");
    let addr = line
        .strip_prefix("agentrt-server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let hint = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("no local model") {
                return line;
            }
        }
        panic!("stderr ended without the hint")
    })
    .await
    .expect("a line saying how to get the model");
    assert!(hint.contains("fetch-model"), "{hint}");
    let client = connect(&format!("http://{addr}")).await;
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let text: String = client
        .chat(&session, "hi")
        .await
        .unwrap()
        .filter_map(|e| async move {
            match e.unwrap().kind {
                ChatEvent::Text(t) => Some(t),
                _ => None,
            }
        })
        .collect()
        .await;
    assert_eq!(text, "You said: hi");
    child.kill().await.unwrap();
}
