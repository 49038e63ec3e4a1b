//! Credential hygiene of the real `agentrt-server` binary: a config error
//! never shows a secret (TOML line, flag or variable value); API keys from
//! `[auth] api_keys_file` are reloaded on SIGHUP and when the file changes,
//! a bad version keeping the previous keys; `key_sha256` entries work; a
//! short cluster key is refused; caller-chosen model names never become
//! metric labels.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agentrt_client::{Client, proto};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk, usage_chunk};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(60);
const SECRET: &str = "sk-secret-do-not-print-4b1d";

/// Runs the binary to completion with `config` and extra env; returns
/// (exit code, stdout, stderr).
async fn run_to_exit(dir: &Path, config: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let path = dir.join("agentrt.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentrt-server"));
    command
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&path)
        .env("AGENTRT_LOG", "info")
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(WAIT, command.output())
        .await
        .expect("the binary exits in time")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_toml_error_on_a_line_with_an_inline_secret_names_the_position_only() {
    let dir = tempfile::tempdir().unwrap();
    for (config, line) in [
        // A syntax error on the secret's own line.
        (
            format!("[[auth.api_keys]]\nkey = \"{SECRET}\" user = \"alice\"\n"),
            "line 2",
        ),
        // An unterminated string holding the secret.
        (
            format!("[store]\nurl = \"postgres://u:{SECRET}@db/x\n"),
            "line 2",
        ),
        // A value of the wrong type, which serde would quote.
        (
            format!("default_model = \"x/y\"\nstore_cache_mb = \"{SECRET}\"\n"),
            "line 2",
        ),
    ] {
        let (code, stdout, stderr) = run_to_exit(dir.path(), &config, &[]).await;
        assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
        assert!(!stderr.contains("sk-secret"), "the secret leaked: {stderr}");
        assert!(!stdout.contains("sk-secret"), "the secret leaked: {stdout}");
        assert!(
            stderr.contains("agentrt.toml") && stderr.contains(line) && stderr.contains("column"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn a_bad_variable_or_flag_value_is_not_echoed() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value) in [
        ("AGENTRT_LISTEN", SECRET),
        ("AGENTRT_SHUTDOWN_GRACE", SECRET),
        ("AGENTRT_STORE_CACHE_MB", SECRET),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
            .args(["--data-dir"])
            .arg(dir.path().join("data"))
            .env(var, value)
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}: {stderr}");
        assert!(!stderr.contains("sk-secret"), "{var} leaked: {stderr}");
        assert!(stderr.contains("invalid value for --"), "{var}: {stderr}");
    }
}

#[tokio::test]
async fn a_short_cluster_key_is_refused_naming_the_field_and_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[store]\nkind = \"postgres\"\nurl_env = \"AGENTRT_TEST_DB\"\n\
                  [cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"AGENTRT_TEST_CLUSTER_KEY\"\n";
    let (code, stdout, stderr) = run_to_exit(
        dir.path(),
        config,
        &[
            ("AGENTRT_TEST_DB", "postgres://nobody@127.0.0.1:1/none"),
            ("AGENTRT_TEST_CLUSTER_KEY", "k"),
        ],
    )
    .await;
    assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
    assert!(
        stderr.contains("cluster.key_env")
            && stderr.contains("AGENTRT_TEST_CLUSTER_KEY")
            && stderr.contains("at least 32 bytes"),
        "{stderr}"
    );
}

/// A running binary whose stderr lines are collected as they come.
struct Server {
    child: Child,
    pid: u32,
    addr: String,
    metrics: Option<String>,
    stderr: watch::Receiver<Vec<String>>,
}

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
        .env_remove("OTEL_METRICS_EXPORTER")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env("AGENTRT_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let pid = child.id().unwrap();
    let (tx, stderr) = watch::channel(Vec::new());
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Drained as it comes, so the server never blocks on a full pipe.
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            tx.send_modify(|all| all.push(line));
        }
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(WAIT, stdout.next_line())
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
        line.strip_prefix("agentrt-server metrics on http://")
            .and_then(|l| l.strip_suffix("/metrics"))
            .map(str::to_owned)
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
    /// Waits until a stderr line has all of `parts`; returns it.
    async fn wait_log(&mut self, parts: &[&str]) -> String {
        let has = |l: &String| parts.iter().all(|p| l.contains(p));
        let found = tokio::time::timeout(WAIT, self.stderr.wait_for(|ls| ls.iter().any(has)))
            .await
            .map(|lines| lines.unwrap().iter().find(|l| has(l)).cloned());
        match found {
            Ok(line) => line.unwrap_or_default(),
            Err(_) => panic!("no log line with {parts:?}: {:?}", self.stderr.borrow()),
        }
    }

    fn signal(&self, name: &str) {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    async fn stop(mut self) -> Vec<String> {
        self.signal("TERM");
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the server exits after SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}");
        self.stderr.borrow().clone()
    }

    /// The owner of a session created with `key`, or the status code.
    async fn who(&self, key: &str) -> Result<String, tonic::Code> {
        let client = Client::builder(self.addr.clone())
            .token(key)
            .connect()
            .await
            .unwrap();
        match client.create_session(Default::default()).await {
            Ok(s) => Ok(s.owner),
            Err(e) => Err(e.code().unwrap_or_else(|| panic!("{e:?}"))),
        }
    }
}

fn write_keys(path: &Path, text: &str) {
    // Replaced whole, as a mounted Secret is.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn sha256_hex(key: &str) -> String {
    agentrt_server::config::key_digest(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn the_key_file_is_reloaded_on_sighup_and_on_change_and_a_bad_version_keeps_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    write_keys(
        &keys,
        &format!(
            "[[api_keys]]\nkey_sha256 = \"{}\"\nuser = \"alice\"\n",
            sha256_hex("alice-key-0001")
        ),
    );
    let config = format!(
        "[auth]\napi_keys_file = {keys:?}\n\
         [[auth.api_keys]]\nkey_sha256 = \"{}\"\nuser = \"ops\"\nadmin = true\n",
        sha256_hex("ops-key-00001")
    );
    let mut server = start(dir.path(), &config, &[], &[]).await;
    assert_eq!(server.who("alice-key-0001").await.unwrap(), "alice");
    assert_eq!(server.who("ops-key-00001").await.unwrap(), "ops");
    assert_eq!(
        server.who("bob-key-00001").await,
        Err(tonic::Code::Unauthenticated)
    );

    // SIGHUP: Bob added, Alice removed.
    write_keys(
        &keys,
        "[[api_keys]]\nkey = \"bob-key-00001\"\nuser = \"bob\"\n",
    );
    server.signal("HUP");
    server.wait_log(&["API key file reloaded", "SIGHUP"]).await;
    assert_eq!(server.who("bob-key-00001").await.unwrap(), "bob");
    assert_eq!(
        server.who("alice-key-0001").await,
        Err(tonic::Code::Unauthenticated)
    );
    assert_eq!(server.who("ops-key-00001").await.unwrap(), "ops");

    // A broken version holding a key: the keys stay, the log names the
    // file and the position, never the key.
    write_keys(
        &keys,
        &format!("[[api_keys]]\nkey = \"{SECRET}\" user = \"eve\"\n"),
    );
    server.signal("HUP");
    let warning = server
        .wait_log(&["API key file reload failed", "SIGHUP"])
        .await;
    assert!(
        warning.contains("keys.toml") && warning.contains("line 2"),
        "{warning}"
    );
    assert_eq!(server.who("bob-key-00001").await.unwrap(), "bob");

    // A change alone, without a signal, is seen by the next call.
    write_keys(
        &keys,
        "[[api_keys]]\nkey = \"carol-key-0001\"\nuser = \"carol\"\n",
    );
    assert_eq!(server.who("carol-key-0001").await.unwrap(), "carol");
    assert_eq!(
        server.who("bob-key-00001").await,
        Err(tonic::Code::Unauthenticated)
    );

    let logs = server.stop().await.join("\n");
    for secret in [SECRET, "carol-key-0001", "bob-key-00001", "alice-key-0001"] {
        assert!(!logs.contains(secret), "{secret} in the logs: {logs}");
    }
}

async fn scrape(addr: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// The value of the series `name{labels}` (labels as rendered, sorted).
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_chosen_model_names_are_counted_as_other() {
    const CHOSEN: usize = 60;
    let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![
        text_chunk("ok"),
        finish_chunk("stop"),
        usage_chunk(3, 1),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "default_model = \"mock/m\"\n\
         [[providers]]\nname = \"mock\"\nkind = \"openai\"\nbase_url = \"{}\"\nmax_retries = 0\n",
        fake.base_url()
    );
    let server = start(
        dir.path(),
        &config,
        &["--metrics-listen", "127.0.0.1:0"],
        &[],
    )
    .await;
    let client = Client::connect(server.addr.clone()).await.unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let chat = async |model: String| {
        let req = proto::ChatRequest {
            session_id: session.clone(),
            model,
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock {
                    text: "hi".to_owned(),
                })),
            }],
            ..Default::default()
        };
        let turn = client.chat_with(req).await.unwrap().finish().await.unwrap();
        assert!(turn.status.is_none(), "{:?}", turn.status);
    };
    chat(String::new()).await;
    chat("mock/m".to_owned()).await;
    for i in 0..CHOSEN {
        chat(format!("mock/caller-chosen-{i}")).await;
    }
    let text = scrape(server.metrics.as_deref().unwrap()).await;
    assert!(!text.contains("caller-chosen"), "{text}");
    let ops = |model: &str| {
        series(
            &text,
            &format!(
                "gen_ai_client_operation_duration_seconds_count{{gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"mock\",gen_ai_request_model=\"{model}\"}}"
            ),
        )
    };
    assert_eq!(ops("m"), Some(2.0), "{text}");
    assert_eq!(ops("other"), Some(CHOSEN as f64), "{text}");
    let models: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.split("gen_ai_request_model=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert_eq!(models, ["m", "other"].into(), "{text}");
    server.stop().await;
}
