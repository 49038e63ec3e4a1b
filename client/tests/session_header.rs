//! Every session-scoped call of the client carries `x-agentrt-session`
//! (docs/contract.md §7), checked on the wire: a bare HTTP/2 server on loopback
//! records each request's path and header and answers UNIMPLEMENTED.

use std::time::Duration;

use agentrt_client::{Client, SESSION_HEADER, proto};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// (gRPC path, the header's value) of every request received. Recorded
/// before the answer is sent, so it is there when the call returns.
async fn recorder() -> (String, mpsc::Receiver<(String, Option<String>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let header = req
                        .headers()
                        .get(SESSION_HEADER)
                        .map(|v| v.to_str().unwrap().to_owned());
                    let _ = tx.send((req.uri().path().to_owned(), header)).await;
                    let response = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc")
                        .header("grpc-status", "12")
                        .body(())
                        .unwrap();
                    let _ = respond.send_response(response, true);
                }
            });
        }
    });
    (url, rx)
}

#[tokio::test]
async fn every_session_scoped_call_names_its_session_in_a_header() {
    let (url, mut seen) = recorder().await;
    let client = Client::builder(url)
        .request_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let sid = |name: &str| format!("s-{name}");
    let mut expect = |path: &str, header: Option<String>| {
        let got = seen
            .try_recv()
            .unwrap_or_else(|e| panic!("{path}: nothing recorded ({e})"));
        assert_eq!(got, (path.to_owned(), header), "{path}");
    };
    let _ = client
        .create_session(proto::CreateSessionRequest {
            session_id: sid("create"),
            ..Default::default()
        })
        .await;
    expect(
        "/agentrt.v1.SessionService/CreateSession",
        Some(sid("create")),
    );
    let _ = client.create_session(Default::default()).await;
    expect("/agentrt.v1.SessionService/CreateSession", None);
    let _ = client.list_sessions(Default::default()).await;
    expect("/agentrt.v1.SessionService/ListSessions", None);
    let _ = client.get_session(&sid("get")).await;
    expect("/agentrt.v1.SessionService/GetSession", Some(sid("get")));
    let _ = client
        .update_session(proto::UpdateSessionRequest {
            session_id: sid("update"),
            ..Default::default()
        })
        .await;
    expect(
        "/agentrt.v1.SessionService/UpdateSession",
        Some(sid("update")),
    );
    let _ = client.delete_session(&sid("delete")).await;
    expect(
        "/agentrt.v1.SessionService/DeleteSession",
        Some(sid("delete")),
    );
    let _ = client.history(&sid("history")).await;
    expect(
        "/agentrt.v1.SessionService/GetHistory",
        Some(sid("history")),
    );
    let _ = client.chat(&sid("chat"), "hi").await;
    expect("/agentrt.v1.AgentRuntime/Chat", Some(sid("chat")));
    let _ = client.subscribe(&sid("subscribe"), 0, false).await;
    expect("/agentrt.v1.AgentRuntime/Subscribe", Some(sid("subscribe")));
    let _ = client.stop_session(&sid("stop")).await;
    expect("/agentrt.v1.AgentRuntime/StopSession", Some(sid("stop")));
    let _ = client.session_status(&sid("status")).await;
    expect(
        "/agentrt.v1.AgentRuntime/GetSessionStatus",
        Some(sid("status")),
    );
    let _ = client.close_session(&sid("close"), false).await;
    expect("/agentrt.v1.AgentRuntime/CloseSession", Some(sid("close")));
    let _ = client.compact_session(&sid("compact")).await;
    expect(
        "/agentrt.v1.AgentRuntime/CompactSession",
        Some(sid("compact")),
    );
    let _ = client
        .submit_tool_result(&sid("tool"), "turn", "call", "{}", false)
        .await;
    expect(
        "/agentrt.v1.AgentRuntime/SubmitToolResult",
        Some(sid("tool")),
    );
    // A session id that cannot be a header value is left out, not fatal.
    let err = client.get_session("bad\nid").await.unwrap_err();
    assert!(err.code() == Some(tonic::Code::Unimplemented), "{err}");
    expect("/agentrt.v1.SessionService/GetSession", None);
}
