//! A newer server may send event kinds this client was built without. A
//! test-only tonic server speaks a newer `ChatEvent` (the same message with
//! one more oneof case, tag 99) on the wire; the client yields the known
//! events, an `Unknown` for the new one, and reads on to `turn_finished`.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use agentrt_client::{ChatEvent, Client, proto};
use futures::{Stream, StreamExt as _};
use tonic::codegen::{BoxFuture, Service, http};
use tonic::{Request, Response, Status};

/// `agentrt.v1.ChatEvent` as a newer server has it: one more kind.
#[derive(Clone, PartialEq, prost::Message)]
struct NewerChatEvent {
    #[prost(string, tag = "1")]
    session_id: String,
    #[prost(string, tag = "2")]
    turn_id: String,
    #[prost(uint64, tag = "3")]
    seq: u64,
    #[prost(oneof = "NewerKind", tags = "10, 11, 17, 99")]
    kind: Option<NewerKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum NewerKind {
    #[prost(message, tag = "10")]
    TurnStarted(proto::TurnStarted),
    #[prost(message, tag = "11")]
    Text(proto::TextDelta),
    #[prost(message, tag = "17")]
    TurnFinished(proto::TurnFinished),
    /// The kind added after the client was built.
    #[prost(message, tag = "99")]
    Celebration(Celebration),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Celebration {
    #[prost(string, tag = "1")]
    note: String,
}

fn event(seq: u64, kind: NewerKind) -> NewerChatEvent {
    NewerChatEvent {
        session_id: "s-new".into(),
        turn_id: "t-new".into(),
        seq,
        kind: Some(kind),
    }
}

type Events = Pin<Box<dyn Stream<Item = Result<NewerChatEvent, Status>> + Send>>;

/// The Chat method: a fixed turn with the new kind in the middle.
struct ChatMethod;

impl tonic::server::ServerStreamingService<proto::ChatRequest> for ChatMethod {
    type Response = NewerChatEvent;
    type ResponseStream = Events;
    type Future = BoxFuture<Response<Events>, Status>;

    fn call(&mut self, _request: Request<proto::ChatRequest>) -> Self::Future {
        let events = vec![
            event(1, NewerKind::TurnStarted(proto::TurnStarted::default())),
            event(
                2,
                NewerKind::Text(proto::TextDelta {
                    text: "before ".into(),
                }),
            ),
            event(
                3,
                NewerKind::Celebration(Celebration {
                    note: "a kind from the future".into(),
                }),
            ),
            event(
                4,
                NewerKind::Text(proto::TextDelta {
                    text: "after".into(),
                }),
            ),
            event(
                5,
                NewerKind::TurnFinished(proto::TurnFinished {
                    outcome: proto::TurnOutcome::Success as i32,
                    ..Default::default()
                }),
            ),
        ];
        let stream: Events = Box::pin(futures::stream::iter(events.into_iter().map(Ok)));
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}

/// `agentrt.v1.AgentRuntime` with only Chat, encoding the newer message.
#[derive(Clone)]
struct NewerRuntime;

impl tonic::server::NamedService for NewerRuntime {
    const NAME: &'static str = "agentrt.v1.AgentRuntime";
}

impl<B> Service<http::Request<B>> for NewerRuntime
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != "/agentrt.v1.AgentRuntime/Chat" {
            return Box::pin(async { Ok(Status::unimplemented("only Chat here").into_http()) });
        }
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<NewerChatEvent, proto::ChatRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec);
            Ok(grpc.server_streaming(ChatMethod, req).await)
        })
    }
}

#[tokio::test]
async fn an_event_kind_added_later_is_passed_on_as_unknown_and_the_stream_continues() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NewerRuntime)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );

    let client = Client::connect(url).await.unwrap();
    let mut events = client.chat("s-new", "hi").await.unwrap();
    let mut kinds = Vec::new();
    while let Some(item) = events.next().await {
        let event = item.expect("no stream error for an unknown kind");
        kinds.push((event.seq, event.kind));
    }
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    assert!(
        matches!(kinds[0], (1, ChatEvent::TurnStarted(_))),
        "{kinds:?}"
    );
    assert_eq!(kinds[1], (2, ChatEvent::Text("before ".into())));
    assert_eq!(kinds[2], (3, ChatEvent::Unknown));
    assert_eq!(kinds[3], (4, ChatEvent::Text("after".into())));
    assert!(
        matches!(
            kinds[4],
            (
                5,
                ChatEvent::TurnFinished {
                    outcome: proto::TurnOutcome::Success,
                    ..
                }
            )
        ),
        "{kinds:?}"
    );

    // `finish` reads through it too.
    let summary = client
        .chat("s-new", "again")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(summary.text, "before after");
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    assert!(summary.status.is_none(), "{:?}", summary.status);

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
