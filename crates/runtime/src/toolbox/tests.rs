//! Toolbox namespacing and routing, and the hooks, with in-process fake
//! sources.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::mpsc;

use super::*;

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("{name} tool"),
        parameters: serde_json::json!({"type": "object"}),
    }
}

/// Lists `tools`; `echo` returns its arguments, `big` 100 000 bytes,
/// `secret` a password, `hang` never answers; anything else fails.
#[derive(Debug, Default)]
struct Fake {
    tools: Vec<&'static str>,
    down: AtomicBool,
    calls: Mutex<Vec<(String, String)>>,
}

impl Fake {
    fn new(tools: &[&'static str]) -> Arc<Self> {
        Arc::new(Self {
            tools: tools.to_vec(),
            ..Self::default()
        })
    }

    fn calls(&self) -> Vec<(String, String)> {
        lock(&self.calls).clone()
    }
}

#[async_trait]
impl ToolSource for Fake {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ToolError::Unavailable("down for the test".into()));
        }
        Ok(self.tools.iter().map(|t| spec(t)).collect())
    }

    async fn call(&self, name: &str, arguments_json: &str) -> ToolOutcome {
        lock(&self.calls).push((name.to_owned(), arguments_json.to_owned()));
        match name {
            "echo" => ToolOutcome::ok(arguments_json),
            "big" => ToolOutcome::ok("x".repeat(100_000)),
            "secret" => ToolOutcome::ok("the password is hunter2"),
            "hang" => std::future::pending().await,
            other => ToolOutcome::error(format!("{other} failed")),
        }
    }
}

fn server_call<'a>(name: &'a str, arguments_json: &'a str) -> ToolCallInfo<'a> {
    ToolCallInfo {
        call_id: "call_1",
        name,
        arguments_json,
        kind: ToolKind::Server,
    }
}

fn names(tools: &[ToolSpec]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

#[tokio::test]
async fn tools_are_namespaced_and_calls_routed_back_by_prefix() {
    let a = Fake::new(&["echo", "other"]);
    let b = Fake::new(&["echo"]);
    let mut toolbox = Toolbox::new();
    toolbox.add_source("a", a.clone()).unwrap();
    toolbox.add_source("b-2", b.clone()).unwrap();
    let listing = toolbox.list().await;
    assert_eq!(names(&listing.tools), ["a__echo", "a__other", "b-2__echo"]);
    assert_eq!(listing.tools[0].description, "echo tool");
    assert_eq!(names(&toolbox.cached()), names(&listing.tools));

    assert_eq!(toolbox.call("b-2__echo", "{}").await, ToolOutcome::ok("{}"));
    assert_eq!(b.calls(), [("echo".to_owned(), "{}".to_owned())]);
    assert!(a.calls().is_empty());
    for unknown in ["c__echo", "a__", "echo", "a_echo"] {
        let outcome = toolbox.call(unknown, "{}").await;
        assert!(
            outcome.is_error && outcome.content.contains("unknown tool"),
            "{unknown}"
        );
    }
    assert_eq!(a.calls().len(), 0);
}

#[test]
fn source_names_are_checked() {
    let mut toolbox = Toolbox::new();
    for bad in ["", "Caps", "a__b", "ends_", "sp ace", &"x".repeat(33)] {
        assert!(toolbox.add_source(bad, Fake::new(&[])).is_err(), "{bad:?}");
    }
    toolbox.add_source("ok_name-1", Fake::new(&[])).unwrap();
    assert!(toolbox.add_source("ok_name-1", Fake::new(&[])).is_err());
    assert_eq!(toolbox.source_names(), ["ok_name-1"]);
}

#[tokio::test]
async fn a_failing_source_is_absent_and_its_change_makes_listings_stale() {
    let a = Fake::new(&["echo"]);
    let b = Fake::new(&["has space", "fine", "fine"]);
    let mut toolbox = Toolbox::new();
    toolbox.add_source("a", a.clone()).unwrap();
    toolbox.add_source("b", b).unwrap();
    let first = toolbox.list().await;
    assert_eq!(
        names(&first.tools),
        ["a__echo", "b__fine"],
        "unusable and repeated names are skipped"
    );
    assert!(!toolbox.is_stale(first.generation));
    assert_eq!(toolbox.list().await.generation, first.generation);

    a.down.store(true, Ordering::SeqCst);
    let second = toolbox.list().await;
    assert_eq!(names(&second.tools), ["b__fine"]);
    assert!(toolbox.is_stale(first.generation));
    assert!(!toolbox.is_stale(second.generation));

    a.down.store(false, Ordering::SeqCst);
    assert_eq!(names(&toolbox.list().await.tools), ["a__echo", "b__fine"]);
}

#[tokio::test]
async fn denied_tools_are_never_called_and_the_reason_is_the_result() {
    let a = Fake::new(&["echo"]);
    let mut toolbox = Toolbox::new();
    toolbox.add_source("a", a.clone()).unwrap();
    toolbox.set_policy(ToolPolicy {
        deny: ["a__echo".to_owned()].into(),
        ..ToolPolicy::default()
    });
    let permits = toolbox.permits();
    let outcome = toolbox
        .run(server_call("a__echo", "{}"), &permits, &Default::default())
        .await;
    assert!(outcome.is_error);
    assert!(outcome.content.contains("denied"), "{}", outcome.content);
    assert!(a.calls().is_empty());
}

/// Rewrites every call's arguments and redacts passwords from results.
#[derive(Debug, Default)]
struct Rewriter {
    seen: Mutex<Vec<(ToolKind, String)>>,
}

#[async_trait]
impl ToolHook for Rewriter {
    async fn before_call(&self, call: &ToolCallInfo<'_>) -> HookDecision {
        lock(&self.seen).push((call.kind, call.arguments_json.to_owned()));
        HookDecision::Rewrite(r#"{"rewritten":true}"#.to_owned())
    }

    async fn after_call(&self, _call: &ToolCallInfo<'_>, outcome: &mut ToolOutcome) {
        outcome.content = outcome.content.replace("hunter2", "[redacted]");
    }
}

#[tokio::test]
async fn hooks_rewrite_arguments_and_redact_results() {
    let a = Fake::new(&["echo", "secret"]);
    let hook = Arc::new(Rewriter::default());
    let mut toolbox = Toolbox::new();
    toolbox.add_source("a", a.clone()).unwrap();
    toolbox.add_hook(hook.clone());
    let permits = toolbox.permits();
    let echoed = toolbox
        .run(
            server_call("a__echo", r#"{"x":1}"#),
            &permits,
            &Default::default(),
        )
        .await;
    assert_eq!(echoed, ToolOutcome::ok(r#"{"rewritten":true}"#));
    assert_eq!(a.calls()[0].1, r#"{"rewritten":true}"#);
    assert_eq!(
        lock(&hook.seen)[0],
        (ToolKind::Server, r#"{"x":1}"#.to_owned())
    );
    let secret = toolbox
        .run(
            server_call("a__secret", "{}"),
            &permits,
            &Default::default(),
        )
        .await;
    assert_eq!(secret.content, "the password is [redacted]");

    // Caller tools go through the same hooks (the runtime calls these).
    let caller = ToolCallInfo {
        kind: ToolKind::Caller,
        ..server_call("get_time", "{}")
    };
    assert_eq!(
        toolbox.before(caller).await,
        Ok(r#"{"rewritten":true}"#.to_owned())
    );
    let redacted = toolbox
        .after(caller, ToolOutcome::ok("hunter2 at noon"))
        .await;
    assert_eq!(redacted.content, "[redacted] at noon");
}

#[tokio::test]
async fn long_results_are_cut_and_marked() {
    let a = Fake::new(&["big"]);
    let mut toolbox = Toolbox::new();
    toolbox.add_source("a", a).unwrap();
    toolbox.set_policy(ToolPolicy {
        max_result_bytes: 1000,
        ..ToolPolicy::default()
    });
    let permits = toolbox.permits();
    let outcome = toolbox
        .run(server_call("a__big", "{}"), &permits, &Default::default())
        .await;
    assert!(!outcome.is_error);
    assert!(outcome.content.starts_with(&"x".repeat(1000)));
    assert!(
        outcome
            .content
            .ends_with("[result truncated: 1000 of 100000 bytes shown]"),
        "{}",
        &outcome.content[990..]
    );

    let mut text = "ééé".to_owned();
    hooks::cut(&mut text, 3);
    assert!(
        text.starts_with("é\n[result truncated: 2 of 6 bytes"),
        "{text}"
    );
    let mut short = "fits".to_owned();
    hooks::cut(&mut short, 4);
    assert_eq!(short, "fits");
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_timeout_is_an_error_result() {
    let a = Fake::new(&["hang", "echo"]);
    let mut toolbox = Toolbox::new();
    toolbox.add_source("a", a).unwrap();
    toolbox.set_policy(ToolPolicy {
        timeouts: [("a__hang".to_owned(), Duration::from_millis(1500))].into(),
        ..ToolPolicy::default()
    });
    assert_eq!(
        toolbox.policy().timeout_for("a__echo"),
        Duration::from_secs(60)
    );
    let permits = toolbox.permits();
    let started = tokio::time::Instant::now();
    let outcome = toolbox
        .run(server_call("a__hang", "{}"), &permits, &Default::default())
        .await;
    assert_eq!(
        outcome,
        ToolOutcome::error("the tool call timed out after 1.5s")
    );
    assert_eq!(started.elapsed(), Duration::from_millis(1500));
}

/// Reports each call's start, then waits for a permit from the test.
#[derive(Debug)]
struct Gate {
    started: mpsc::UnboundedSender<()>,
    release: Semaphore,
    running: AtomicUsize,
    most: AtomicUsize,
}

#[async_trait]
impl ToolSource for Gate {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![spec("wait")])
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let _ = self.started.send(());
        self.release.acquire().await.unwrap().forget();
        self.running.fetch_sub(1, Ordering::SeqCst);
        ToolOutcome::ok("released")
    }
}

#[tokio::test]
async fn parallel_calls_are_bounded_by_max_parallel() {
    let (started, mut starts) = mpsc::unbounded_channel();
    let gate = Arc::new(Gate {
        started,
        release: Semaphore::new(0),
        running: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let mut toolbox = Toolbox::new();
    toolbox.add_source("g", gate.clone()).unwrap();
    toolbox.set_policy(ToolPolicy {
        max_parallel: 2,
        ..ToolPolicy::default()
    });
    let toolbox = Arc::new(toolbox);
    let runner = Arc::clone(&toolbox);
    let all = tokio::spawn(async move {
        let permits = runner.permits();
        let started = std::sync::atomic::AtomicBool::default();
        futures::stream::iter(0..6)
            .map(|_| runner.run(server_call("g__wait", "{}"), &permits, &started))
            .buffer_unordered(6)
            .collect::<Vec<_>>()
            .await
    });
    // Each start lets one call finish, which lets the next one start.
    for _ in 0..6 {
        starts.recv().await.unwrap();
        gate.release.add_permits(1);
    }
    let outcomes = all.await.unwrap();
    assert_eq!(outcomes, vec![ToolOutcome::ok("released"); 6]);
    assert_eq!(gate.most.load(Ordering::SeqCst), 2);
}

#[test]
fn mcp_results_join_text_and_carry_media_and_links() {
    use rmcp::model::{CallToolResult, ContentBlock, Resource};
    let mut link = Resource::new("file:///work/report.csv", "report.csv");
    link.mime_type = Some("text/csv".to_owned());
    link.description = Some("the report".to_owned());
    let ok = mcp::render(CallToolResult::success(vec![
        ContentBlock::text("first"),
        ContentBlock::image("aGk=", "image/png"),
        ContentBlock::embedded_text("file:///a.txt", "embedded"),
        ContentBlock::image("not base64!", "image/png"),
        ContentBlock::resource_link(link),
        ContentBlock::text("last"),
    ]));
    assert_eq!(
        ok.content,
        "first\nembedded\n[image/png content: not valid base64]\nlast"
    );
    assert!(!ok.is_error);
    assert_eq!(
        ok.media,
        vec![
            ToolMedia::Bytes {
                kind: crate::types::MediaKind::Image,
                data: bytes::Bytes::from_static(b"hi"),
                mime_type: "image/png".to_owned(),
                name: String::new(),
                uri: String::new(),
            },
            ToolMedia::Link {
                uri: "file:///work/report.csv".to_owned(),
                name: "report.csv".to_owned(),
                description: "the report".to_owned(),
                mime_type: "text/csv".to_owned(),
            },
        ]
    );
    let failed = mcp::render(CallToolResult::error(vec![ContentBlock::text("boom")]));
    assert_eq!(failed, ToolOutcome::error("boom"));
}

#[tokio::test]
async fn unreachable_mcp_servers_fail_to_list_and_their_calls_are_errors() {
    use mcp::{McpSource, McpTarget};
    let missing = McpSource::new(
        "missing",
        McpTarget::Stdio {
            command: "/nonexistent/mcp-server".into(),
            args: vec![],
            env: Default::default(),
        },
    );
    let err = missing.list().await.unwrap_err();
    assert!(err.to_string().contains("cannot start"), "{err}");
    assert!(missing.needs_refresh());
    // Within the retry delay the failure is reported without a new try.
    assert_eq!(missing.list().await.unwrap_err(), err);
    let outcome = missing.call("echo", "{}").await;
    assert!(outcome.is_error && outcome.content.contains("not connected"));

    // A closed loopback port: the HTTP handshake fails, bounded in time.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = McpSource::new(
        "http",
        McpTarget::Http {
            url: format!("http://127.0.0.1:{port}/mcp"),
            bearer: Some("token".into()),
        },
    )
    .with_list_timeout(Duration::from_secs(20));
    assert!(http.list().await.is_err());
    assert!(http.needs_refresh());
    assert!(!format!("{http:?}").contains("token"));
}
