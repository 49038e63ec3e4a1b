//! A replica cut off from PostgreSQL reports readiness NOT_SERVING and
//! refuses Chats with UNAVAILABLE, while the other replicas serve on; it
//! recovers when the database is reachable again, with nothing lost.

use std::time::Duration;

use agentrt_client::proto;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use agentrt_testkit::tcp_proxy::TcpProxy;

use super::harness::{
    Cluster, assert_history_sound, errors, finish, outcome, serial, text_request,
};

/// How long a replica may take to notice the database left or came back.
const NOTICE: Duration = Duration::from_secs(20);

async fn until_status(
    watch: &mut tonic::Streaming<HealthCheckResponse>,
    want: ServingStatus,
    within: Duration,
) {
    let wait = async {
        loop {
            let message = watch
                .message()
                .await
                .unwrap()
                .expect("the watch stays open");
            if message.status() == want {
                return;
            }
        }
    };
    tokio::time::timeout(within, wait)
        .await
        .unwrap_or_else(|_| panic!("readiness not {want:?} within {within:?}"));
}

async fn chat_succeeds(cluster: &Cluster, replica: usize, session: &str, text: &str) {
    let events = cluster
        .client(replica)
        .chat_with(text_request(session, text))
        .await
        .unwrap_or_else(|e| panic!("replica {replica}: {text}: {e}"));
    let summary = finish(events, Duration::from_secs(10)).await;
    assert_eq!(
        outcome(&summary),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        )),
        "replica {replica}: {text}: {}",
        errors(&summary)
    );
}

#[tokio::test]
async fn a_replica_without_the_database_is_not_ready_refuses_chats_and_recovers() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(1).await else {
        return;
    };
    let proxy = TcpProxy::start(&cluster.db.addr).await;
    let proxied = cluster
        .db
        .url
        .replace(&cluster.db.addr, &proxy.addr().to_string());
    assert_ne!(proxied, cluster.db.url);
    let cut_off = cluster.add(&proxied).await;
    assert_eq!(cluster.db_url(cut_off), proxied);
    let session = cluster.session().await;
    chat_succeeds(&cluster, cut_off, &session, "quick one").await;

    let channel = tonic::transport::Endpoint::from_shared(cluster.replica(cut_off).url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut readiness = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .unwrap()
        .into_inner();
    until_status(&mut readiness, ServingStatus::Serving, NOTICE).await;

    proxy.cut();
    until_status(&mut readiness, ServingStatus::NotServing, NOTICE).await;
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        cluster
            .client(cut_off)
            .chat_with(text_request(&session, "quick lost")),
    )
    .await
    .expect("the refusal is prompt");
    match refused {
        Err(e) if e.status().is_some() => {
            assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e:?}")
        }
        Err(e) => panic!("expected UNAVAILABLE, got {e}"),
        Ok(_) => panic!("a replica without its database admitted a turn"),
    }
    // The database itself is fine: the other replica serves the session.
    chat_succeeds(&cluster, 0, &session, "quick elsewhere").await;

    proxy.restore();
    until_status(&mut readiness, ServingStatus::Serving, NOTICE).await;
    chat_succeeds(&cluster, cut_off, &session, "quick two").await;

    let history = cluster.client(0).history(&session).await.unwrap();
    let users = assert_history_sound(&history, "after the outage");
    assert_eq!(users, ["quick one", "quick elsewhere", "quick two"]);
    assert_eq!(history.len(), 6);
}
