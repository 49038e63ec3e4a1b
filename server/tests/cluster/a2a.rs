//! The A2A binding on several replicas: a task live on one replica can be
//! watched and cancelled through any other (the call is forwarded to the
//! owner, as agentrt.v1's are).

use std::time::Duration;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_proto::a2a::v1::stream_response::Payload;
use futures::StreamExt as _;
use tonic::transport::Channel;
use tonic::{Request, Streaming};

use super::harness::{Cluster, serial};

const A: usize = 0;
const B: usize = 1;

async fn a2a_client(cluster: &Cluster, i: usize) -> A2aServiceClient<Channel> {
    A2aServiceClient::connect(cluster.replica(i).url.clone())
        .await
        .unwrap()
}

fn v1<T>(message: T) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut()
        .insert("a2a-version", "1.0".parse().unwrap());
    req
}

/// A message starting a task in a new context.
fn message(text: &str) -> a2a::SendMessageRequest {
    a2a::SendMessageRequest {
        message: Some(a2a::Message {
            message_id: format!("m-{}", text.replace(' ', "-")),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Text(text.to_owned())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The next stream response's payload, within 10 s.
async fn next(stream: &mut Streaming<a2a::StreamResponse>) -> Option<Payload> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a stream response within 10 s")
        .map(|item| item.unwrap().payload.expect("a payload"))
}

/// Reads `stream` until a text artifact chunk arrives.
async fn until_text(stream: &mut Streaming<a2a::StreamResponse>) {
    loop {
        match next(stream).await {
            Some(Payload::ArtifactUpdate(_)) => return,
            Some(_) => {}
            None => panic!("the stream ended before any text"),
        }
    }
}

/// The state of the terminal status a stream ends with.
async fn last_state(stream: &mut Streaming<a2a::StreamResponse>) -> a2a::TaskState {
    let mut last = None;
    while let Some(payload) = next(stream).await {
        if let Payload::StatusUpdate(update) = payload {
            last = update.status.map(|s| s.state);
        }
    }
    a2a::TaskState::try_from(last.expect("a status update")).unwrap()
}

#[tokio::test]
async fn a_task_live_on_one_replica_is_watched_and_cancelled_through_another() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(2).await else {
        return;
    };
    let mut on_a = a2a_client(&cluster, A).await;
    let mut sent = on_a
        .send_streaming_message(v1(message("hold a2a 2")))
        .await
        .unwrap()
        .into_inner();
    let Some(Payload::Task(task)) = next(&mut sent).await else {
        panic!("the Task first")
    };
    until_text(&mut sent).await;

    // B does not own the turn: SubscribeToTask there is A's stream.
    let mut on_b = a2a_client(&cluster, B).await;
    let mut watched = on_b
        .subscribe_to_task(v1(a2a::SubscribeToTaskRequest {
            id: task.id.clone(),
            ..Default::default()
        }))
        .await
        .expect("B forwards SubscribeToTask to A")
        .into_inner();
    let Some(Payload::Task(snapshot)) = next(&mut watched).await else {
        panic!("the task's snapshot first")
    };
    assert_eq!(snapshot.id, task.id);
    assert_eq!(
        snapshot.status.as_ref().map(|s| s.state),
        Some(a2a::TaskState::Working as i32)
    );

    // And CancelTask there stops it on A.
    let cancelled = on_b
        .cancel_task(v1(a2a::CancelTaskRequest {
            id: task.id.clone(),
            ..Default::default()
        }))
        .await
        .expect("B forwards CancelTask to A")
        .into_inner();
    assert_eq!(cancelled.id, task.id);
    assert_eq!(
        cancelled.status.as_ref().map(|s| s.state),
        Some(a2a::TaskState::Canceled as i32)
    );
    cluster
        .upstream
        .wait_gone("a2a", Duration::from_secs(5))
        .await
        .expect("A's model request closed by the cancel");
    assert_eq!(last_state(&mut sent).await, a2a::TaskState::Canceled);
    assert_eq!(last_state(&mut watched).await, a2a::TaskState::Canceled);

    // Once it has ended, any replica reads the same task.
    let stored = on_b
        .get_task(v1(a2a::GetTaskRequest {
            id: task.id.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stored.status.as_ref().map(|s| s.state),
        Some(a2a::TaskState::Canceled as i32)
    );
}
