//! A tiny stdio MCP server for agentrt's tests, built with rmcp. `cargo
//! test` builds it as an example of agentrt-runtime; the end-to-end tests
//! find it in `target/<profile>/examples/`.
//!
//! Tools: `echo(text)` returns `text`; `slow(ms)` sleeps `ms` milliseconds
//! unless the call is cancelled first; `fail()` returns an error result.
//! For workspaces and sandboxes: `pwd()` returns its working directory;
//! `pid()` its process id; `write_file(name, text)` writes `text` to `name`
//! in its working directory and returns a `resource_link` to it (a
//! `file://` URI); `limits()` returns `/proc/self/limits`; `connect(addr)`
//! tries a TCP connection to `addr` and says `connected` or why not.
//!
//! With `MCP_TEST_LINGER` set it keeps running after its stdin closed (a
//! server that ignores EOF: only a signal stops it).
//!
//! Started with `__agentrt-tool-sandbox` as its first argument it is a
//! sandbox launcher (`agentrt_runtime::toolbox::sandbox`), as the server
//! binary is.
//!
//! With `MCP_TEST_RECORD` naming a file (or a FIFO), it appends one line per
//! event there: `ready <pid>` at start, `slow started <call id>` (the id in
//! `_meta` "io.agentrt/call_id", `-` without one), `slow cancelled`
//! when the sleeping call sees its cancellation, and `cancelled <reason>`
//! for each `notifications/cancelled` received.

use std::io::Write as _;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, ListToolsResult, PaginatedRequestParams, Resource, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};

fn record(line: &str) {
    let Ok(path) = std::env::var("MCP_TEST_RECORD") else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path);
    match file {
        Ok(mut f) => {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
        Err(e) => eprintln!("mcp_test_server: cannot record to {path}: {e}"),
    }
}

/// A 1×1 PNG, base64 (what the `picture` tool returns).
const PICTURE_PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn schema(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("schemas are objects"),
    }
}

#[derive(Debug, Clone, Copy)]
struct TestTools;

impl ServerHandler for TestTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "echo",
                "Returns its text",
                schema(json!({
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"]
                })),
            ),
            Tool::new(
                "slow",
                "Sleeps for ms milliseconds",
                schema(json!({
                    "type": "object",
                    "properties": {"ms": {"type": "integer"}},
                    "required": ["ms"]
                })),
            ),
            Tool::new(
                "fail",
                "Always fails",
                schema(json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "picture",
                "Returns a small PNG and a link to a report",
                schema(json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "pwd",
                "Returns the working directory",
                schema(json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "pid",
                "Returns the process id",
                schema(json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "write_file",
                "Writes text to a file in the working directory and links to it",
                schema(json!({
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["name", "text"]
                })),
            ),
            Tool::new(
                "limits",
                "Returns /proc/self/limits",
                schema(json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "connect",
                "Tries a TCP connection",
                schema(json!({
                    "type": "object",
                    "properties": {"addr": {"type": "string"}},
                    "required": ["addr"]
                })),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "echo" => {
                let text = args.get("text").and_then(Value::as_str).unwrap_or_default();
                CallToolResult::success(vec![ContentBlock::text(text)])
            }
            "slow" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                // The caller's id of the call, when it sends one in `_meta`.
                let call_id = context
                    .meta
                    .0
                    .0
                    .get("io.agentrt/call_id")
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned();
                record(&format!("slow started {call_id}"));
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {
                        CallToolResult::success(vec![ContentBlock::text(format!("slept {ms} ms"))])
                    }
                    () = context.ct.cancelled() => {
                        record("slow cancelled");
                        return Err(ErrorData::internal_error("cancelled", None));
                    }
                }
            }
            "fail" => CallToolResult::error(vec![ContentBlock::text("the fail tool failed")]),
            "picture" => {
                let mut link =
                    rmcp::model::Resource::new("https://example.invalid/report", "report");
                link.title = Some("The report".to_owned());
                link.description = Some("What the picture shows".to_owned());
                link.mime_type = Some("text/html".to_owned());
                CallToolResult::success(vec![
                    ContentBlock::text("here is the picture"),
                    ContentBlock::image(PICTURE_PNG_BASE64, "image/png"),
                    ContentBlock::resource_link(link),
                ])
            }
            "pwd" => match std::env::current_dir() {
                Ok(dir) => {
                    CallToolResult::success(vec![ContentBlock::text(dir.display().to_string())])
                }
                Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
            },
            "pid" => {
                CallToolResult::success(vec![ContentBlock::text(std::process::id().to_string())])
            }
            "write_file" => {
                let name = args
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("out.txt");
                let text = args.get("text").and_then(Value::as_str).unwrap_or_default();
                let written = std::env::current_dir()
                    .map(|dir| dir.join(name))
                    .and_then(|path| std::fs::write(&path, text).map(|()| path));
                match written {
                    Ok(path) => CallToolResult::success(vec![
                        ContentBlock::text(format!("wrote {} bytes", text.len())),
                        ContentBlock::resource_link(
                            Resource::new(format!("file://{}", path.display()), name)
                                .with_mime_type("text/plain"),
                        ),
                    ]),
                    Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
                }
            }
            "limits" => match std::fs::read_to_string("/proc/self/limits") {
                Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
                Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
            },
            "connect" => {
                let addr = args.get("addr").and_then(Value::as_str).unwrap_or_default();
                let dial = tokio::net::TcpStream::connect(addr);
                let text = match tokio::time::timeout(Duration::from_secs(5), dial).await {
                    Ok(Ok(_)) => "connected".to_owned(),
                    Ok(Err(e)) => format!("failed: {e}"),
                    Err(_) => "failed: timed out".to_owned(),
                };
                CallToolResult::success(vec![ContentBlock::text(text)])
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named {other}"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        record(&format!(
            "cancelled {}",
            notification.reason.unwrap_or_default()
        ));
    }
}

fn main() -> std::process::ExitCode {
    // First, before any thread exists: the sandbox launcher.
    if let Some(code) = agentrt_runtime::toolbox::sandbox::run_if_asked() {
        return code;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(serve()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp_test_server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    record(&format!("ready {}", std::process::id()));
    let running = TestTools.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    if std::env::var_os("MCP_TEST_LINGER").is_some() {
        std::future::pending::<()>().await;
    }
    Ok(())
}
