//! Telemetry of the real `agentrt-server` binary as a child process:
//! telemetry off exports nothing and starts no exporter thread (on does,
//! and its JSON log lines carry the trace id); `--metrics-listen` serves
//! the turn, token, RPC and refusal series, the process and build series,
//! and a turn a crash left counted as interrupted at the next start, and
//! the A2A public card at its well-known path with the public URL;
//! `--log-format json` writes
//! flat, plain lines with one summary per turn, one line per refused call
//! and no configured secret; text logs have no colour codes off a TTY.

#[path = "support/otlp.rs"]
mod otlp;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk, usage_chunk};
use futures::StreamExt as _;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, Command};

const WAIT: Duration = Duration::from_secs(60);
const AUTH_KEY: &str = "auth-key-do-not-log-7f3a";
const PROVIDER_KEY: &str = "sk-provider-do-not-log-91c2";

struct Server {
    child: Child,
    pid: u32,
    addr: String,
    metrics: Option<String>,
    stderr: tokio::task::JoinHandle<String>,
}

/// Starts the binary with `config` (TOML), extra `args` and `env`, and
/// reads its address line(s) from stdout.
async fn start(dir: &Path, config: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
    let path = dir.join("agentrt.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentrt-server"));
    command
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&path)
        .args(args)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OTEL_METRICS_EXPORTER")
        .env("AGENTRT_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let pid = child.id().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Drained as it comes, so the server never blocks on a full pipe.
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("a line on stdout in time")
            .unwrap()
            .expect("a line on stdout")
    };
    let line = next().await;
    let addr = line
        .strip_prefix("agentrt-server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let metrics = if args.contains(&"--metrics-listen") {
        let line = next().await;
        Some(
            line.strip_prefix("agentrt-server metrics on http://")
                .and_then(|l| l.strip_suffix("/metrics"))
                .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
                .to_owned(),
        )
    } else {
        None
    };
    Server {
        child,
        pid,
        addr: format!("http://{addr}"),
        metrics,
        stderr,
    }
}

impl Server {
    /// The names of the process's threads.
    fn threads(&self) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{}/task", self.pid))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_owned())
            .collect()
    }

    /// SIGTERM, then waits for a clean exit; returns stderr.
    async fn stop(mut self) -> String {
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the server exits after SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}");
        self.stderr.await.unwrap()
    }
}

async fn scrape(addr: &str) -> String {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_owned()
}

/// The value of the series `name{labels}` (labels as rendered, sorted).
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

fn echo_config() -> String {
    "default_model = \"builtin/echo\"\n".to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_off_exports_nothing_and_runs_no_exporter_thread_while_on_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut off_receiver = otlp::Receiver::start().await;
    let off = start(
        dir.path(),
        &echo_config(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &off_receiver.endpoint),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    )
    .await;
    let client = Client::connect(off.addr.clone()).await.unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let turn = client
        .chat(&session, "hello")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(turn.status.is_none(), "{:?}", turn.status);
    let threads = off.threads();
    assert!(
        !threads.iter().any(|t| t.starts_with("OpenTelemetry")),
        "{threads:?}"
    );
    off.stop().await;
    // The process has exited: anything it exported has been received.
    assert!(
        off_receiver.spans.try_recv().is_err(),
        "telemetry off exported a span"
    );

    // The control: the same turn with traces on starts the batch thread,
    // exports the turn, and puts its trace id on the JSON log lines.
    let dir = tempfile::tempdir().unwrap();
    let mut on_receiver = otlp::Receiver::start().await;
    let on = start(
        dir.path(),
        &echo_config(),
        &["--log-format", "json"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &on_receiver.endpoint),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    )
    .await;
    let client = Client::connect(on.addr.clone()).await.unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let turn = client
        .chat(&session, "hello")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(turn.status.is_none(), "{:?}", turn.status);
    let threads = on.threads();
    assert!(
        threads.iter().any(|t| t.starts_with("OpenTelemetry")),
        "{threads:?}"
    );
    let stderr = on.stop().await;
    let mut spans = Vec::new();
    while let Ok(span) = on_receiver.spans.try_recv() {
        spans.push(span);
    }
    let agent = spans
        .iter()
        .find(|s| s.name == "invoke_agent")
        .unwrap_or_else(|| panic!("no invoke_agent span in {spans:#?}"));
    let summary: Value = stderr
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["message"] == "turn finished")
        .expect("a turn summary line");
    let hex: String = agent.trace_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        summary["trace_id"].as_str(),
        Some(hex.as_str()),
        "{summary}"
    );
    assert!(summary["span_id"].is_string(), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_process_build_and_store_series_and_a_turn_a_crash_interrupted() {
    let fake = FakeOpenAi::start(vec![FakeReply::Sse {
        chunks: vec![text_chunk("partial")],
        done: false,
        then_hang: true,
    }])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "default_model = \"mock/m\"\n\
         [[providers]]\nname = \"mock\"\nkind = \"openai\"\nbase_url = \"{}\"\nmax_retries = 0\n",
        fake.base_url()
    );
    let args = ["--metrics-listen", "127.0.0.1:0"];
    let mut server = start(dir.path(), &config, &args, &[]).await;
    let client = Client::connect(server.addr.clone()).await.unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let mut hanging = client.chat(&session, "hang").await.unwrap();
    hanging.next().await.unwrap().unwrap();
    fake.wait_requests(1).await;
    // The process dies with the turn running: the next start finds it.
    server.child.kill().await.unwrap();
    drop(hanging);

    let server = start(dir.path(), &config, &args, &[]).await;
    let text = scrape(server.metrics.as_deref().unwrap()).await;
    assert_eq!(
        series(
            &text,
            "agentrt_turns_interrupted_total{agentrt_reason=\"restart\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "agentrt_turns_total{agentrt_turn_outcome=\"interrupted\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        !text.contains("agentrt_reason=\"lease_"),
        "no lease series on sled: {text}"
    );
    assert_eq!(
        series(&text, "agentrt_store_reachable"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(series(&text, "agentrt_store_writable"), Some(1.0), "{text}");

    let version = env!("CARGO_PKG_VERSION");
    let build = text
        .lines()
        .find(|l| l.starts_with("agentrt_build_info{"))
        .unwrap_or_else(|| panic!("no build info in {text}"));
    assert!(build.ends_with("} 1"), "{build}");
    assert!(build.contains(&format!("version=\"{version}\"")), "{build}");
    assert!(build.contains("rustc=\""), "{build}");

    let positive = |name: &str| {
        let v = series(&text, name).unwrap_or_else(|| panic!("no {name} in {text}"));
        assert!(v > 0.0, "{name} = {v}");
        v
    };
    positive("process_cpu_seconds_total");
    let rss = positive("process_resident_memory_bytes");
    let vsize = positive("process_virtual_memory_bytes");
    assert!(vsize >= rss, "{vsize} < {rss}");
    let fds = positive("process_open_fds");
    assert!(fds <= positive("process_max_fds"), "{text}");
    let started = positive("process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started <= now + 1.0 && started > now - WAIT.as_secs_f64() - 60.0,
        "started {started}, now {now}"
    );
    for family in [
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_start_time_seconds gauge",
        "# TYPE agentrt_build_info gauge",
    ] {
        assert!(text.contains(family), "{family} in {text}");
    }
    server.stop().await;
}

/// `GET path` on `addr`: the response head and body.
async fn get(addr: &str, path: &str) -> (String, String) {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_well_known_agent_card_names_the_public_url_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[[auth.api_keys]]\nkey = \"{AUTH_KEY}\"\nuser = \"alice\"\n",
        echo_config()
    );
    let server = start(
        dir.path(),
        &config,
        &["--metrics-listen", "127.0.0.1:0"],
        &[("AGENTRT_A2A_PUBLIC_URL", "agent.example.com:443")],
    )
    .await;
    let (head, body) = get(
        server.metrics.as_deref().unwrap(),
        "/.well-known/agent-card.json",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: application/json"), "{head}");
    let card: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        card["supportedInterfaces"],
        serde_json::json!([{
            "url": "agent.example.com:443",
            "protocolBinding": "GRPC",
            "protocolVersion": "1.0",
        }]),
        "{card}"
    );
    assert_eq!(card["name"], "agentrt");
    assert_eq!(card["capabilities"]["extendedAgentCard"], true, "{card}");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer",
        "{card}"
    );
    assert_eq!(
        card["securityRequirements"],
        serde_json::json!([{"schemes": {"bearer": {"list": []}}}]),
        "{card}"
    );
    assert!(!body.contains(AUTH_KEY), "{body}");
    let (head, _) = get(server.metrics.as_deref().unwrap(), "/.well-known/other").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_and_metrics_show_turns_tokens_and_refusals_without_secrets() {
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            text_chunk("one"),
            finish_chunk("stop"),
            usage_chunk(12, 5),
        ]),
        FakeReply::sse(vec![
            text_chunk("two"),
            finish_chunk("stop"),
            usage_chunk(12, 5),
        ]),
        FakeReply::Sse {
            chunks: vec![text_chunk("partial")],
            done: false,
            then_hang: true,
        },
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "default_model = \"mock/m\"\n\
         [[providers]]\nname = \"mock\"\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"MOCK_API_KEY\"\nmax_retries = 0\n\
         [[auth.api_keys]]\nkey = \"{AUTH_KEY}\"\nuser = \"alice\"\n\
         [prices.\"mock/m\"]\ninput = 1.0\noutput = 2.0\n",
        fake.base_url()
    );
    let server = start(
        dir.path(),
        &config,
        &["--log-format", "json", "--metrics-listen", "127.0.0.1:0"],
        &[("MOCK_API_KEY", PROVIDER_KEY)],
    )
    .await;
    let client = Client::builder(server.addr.clone())
        .token(AUTH_KEY)
        .connect()
        .await
        .unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let mut turn_ids = Vec::new();
    for _ in 0..2 {
        let turn = client
            .chat(&session, "hi")
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
        assert!(turn.status.is_none(), "{:?}", turn.status);
        turn_ids.push(turn.events[0].turn_id.clone());
    }
    // The third turn hangs upstream; a second Chat meanwhile is busy.
    let mut hanging = client.chat(&session, "hang").await.unwrap();
    let first = hanging.next().await.unwrap().unwrap();
    turn_ids.push(first.turn_id.clone());
    fake.wait_requests(3).await;
    let busy = client.chat(&session, "again").await.expect_err("busy");
    assert!(format!("{busy:?}").contains("Aborted"), "{busy:?}");
    assert!(client.stop_session(&session).await.unwrap());
    let mut outcome = None;
    while let Some(event) = hanging.next().await {
        if let Ok(e) = event
            && let ChatEvent::TurnFinished { outcome: o, .. } = e.kind
        {
            outcome = Some(o);
        }
    }
    assert_eq!(outcome, Some(agentrt_client::proto::TurnOutcome::Canceled));

    let text = scrape(server.metrics.as_deref().unwrap()).await;
    assert_eq!(
        series(
            &text,
            "agentrt_turns_total{agentrt_turn_outcome=\"success\"}"
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "agentrt_turns_total{agentrt_turn_outcome=\"canceled\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(series(&text, "agentrt_turns_live"), Some(0.0), "{text}");
    let tokens = |kind: &str| {
        series(
            &text,
            &format!(
                "gen_ai_client_token_usage_sum{{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"mock\",gen_ai_request_model=\"m\",gen_ai_token_type=\"{kind}\"}}"
            ),
        )
    };
    assert_eq!(tokens("input"), Some(24.0), "{text}");
    assert_eq!(tokens("output"), Some(10.0), "{text}");
    // The cost of every turn, as their records say: two of 12 + 5 tokens at
    // $1 / $2 per million, and the cancelled one's partial output.
    let cost = series(
        &text,
        "agentrt_cost_usd_total{gen_ai_provider_name=\"mock\",gen_ai_request_model=\"m\"}",
    )
    .unwrap_or_else(|| panic!("no cost series in {text}"));
    let turns = client
        .list_turns(agentrt_client::proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .turns;
    let recorded: f64 = turns.iter().filter_map(|t| t.cost).sum();
    assert_eq!(turns.len(), 3);
    assert!(
        recorded >= 44e-6 && (cost - recorded).abs() < 1e-12,
        "{cost} vs {recorded}"
    );
    assert_eq!(
        series(
            &text,
            "agentrt_admission_rejections_total{agentrt_reason=\"SESSION_BUSY\",rpc_method=\"agentrt.v1.AgentRuntime/Chat\"}"
        ),
        Some(1.0),
        "{text}"
    );
    for name in [
        "rpc_server_call_duration_seconds_count{rpc_method=\"agentrt.v1.AgentRuntime/Chat\",rpc_response_status_code=\"OK\",rpc_system_name=\"grpc\"}",
        "rpc_server_call_duration_seconds_count{rpc_method=\"agentrt.v1.AgentRuntime/Chat\",rpc_response_status_code=\"ABORTED\",rpc_system_name=\"grpc\"}",
    ] {
        assert!(
            series(&text, name).is_some_and(|v| v >= 1.0),
            "{name} in {text}"
        );
    }
    for family in [
        "# TYPE gen_ai_client_operation_duration_seconds histogram",
        "# TYPE agentrt_turn_time_to_first_event_seconds histogram",
        "# TYPE agentrt_relay_events_total counter",
        "# TYPE agentrt_runners_cached gauge",
        "# TYPE agentrt_watchers gauge",
        "# TYPE agentrt_store_write_duration_seconds histogram",
        "# TYPE agentrt_store_flush_duration_seconds histogram",
    ] {
        assert!(text.contains(family), "{family} in {text}");
    }
    assert!(
        series(&text, "agentrt_relay_events_total").is_some_and(|v| v >= 10.0),
        "{text}"
    );
    assert!(!text.contains(&session), "a session id in a label: {text}");

    let stderr = server.stop().await;
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!lines.is_empty());
    for (line, raw) in lines.iter().zip(stderr.lines()) {
        let object = line
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {raw}"));
        assert!(!object.contains_key("fields"), "{raw}");
        for (k, v) in object {
            assert!(!v.is_object() && !v.is_array(), "{k} nested in {raw}");
            if let Some(s) = v.as_str() {
                assert!(!s.starts_with("Some("), "{k} in {raw}");
                assert!(!s.starts_with('"'), "{k} Debug-quoted in {raw}");
            }
        }
        for secret in [AUTH_KEY, PROVIDER_KEY] {
            assert!(!raw.contains(secret), "a secret in {raw}");
        }
    }
    for turn_id in &turn_ids {
        let summaries: Vec<&Value> = lines
            .iter()
            .filter(|l| l["message"] == "turn finished" && l["turn_id"] == turn_id.as_str())
            .collect();
        assert_eq!(summaries.len(), 1, "{turn_id}: {summaries:?}");
        let s = summaries[0];
        assert_eq!(s["session_id"], session.as_str());
        assert_eq!(s["model"], "mock/m");
        for field in ["outcome", "duration_ms", "input_tokens", "output_tokens"] {
            assert!(!s[field].is_null(), "{field} in {s}");
        }
    }
    let first = lines
        .iter()
        .find(|l| l["message"] == "turn finished" && l["turn_id"] == turn_ids[0].as_str())
        .unwrap();
    assert_eq!(
        (
            first["outcome"].as_str(),
            first["input_tokens"].as_u64(),
            first["output_tokens"].as_u64()
        ),
        (Some("success"), Some(12), Some(5))
    );
    let rejected: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "call rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0]["code"], "ABORTED");
    assert_eq!(rejected[0]["reason"], "SESSION_BUSY");
    assert_eq!(rejected[0]["method"], "agentrt.v1.AgentRuntime/Chat");
    // Plain values: numbers stay numbers, addresses are not Debug output.
    let serving = lines
        .iter()
        .find(|l| l["message"] == "agentrt-server serving")
        .expect("the serving line");
    assert!(
        serving["addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{serving}"
    );
}

#[tokio::test]
async fn text_logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &echo_config(), &[], &[]).await;
    let client = Client::connect(server.addr.clone()).await.unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    client
        .chat(&session, "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let stderr = server.stop().await;
    assert!(stderr.contains("turn finished"), "{stderr}");
    assert!(!stderr.contains("\x1b["), "{stderr:?}");
}
