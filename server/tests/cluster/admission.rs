//! `ABORTED`/SESSION_BUSY is decided cluster-wide: of two Chats on one
//! session sent at once to two replicas, exactly one is admitted — and
//! the admitted turn keeps its lease to the end (a lease renewal that runs
//! while an admission is between claiming its slot and committing its
//! lease must not take the turn for lost).

use std::time::Duration;

use agentrt_client::proto;

use super::harness::{
    Cluster, aborted_reason, assert_history_sound, errors, finish, outcome, serial, text_request,
};

const ROUNDS: usize = 200;

#[tokio::test]
async fn two_concurrent_chats_on_two_replicas_admit_exactly_one_and_history_stays_whole() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(3).await else {
        return;
    };
    let addrs: std::collections::HashSet<_> = (0..3)
        .flat_map(|i| {
            [
                cluster.replica(i).url.clone(),
                cluster.replica(i).cluster_addr.clone(),
            ]
        })
        .collect();
    assert_eq!(addrs.len(), 6, "every listener has an address of its own");
    let session = cluster.session().await;
    for round in 0..ROUNDS {
        let (a, b) = (round % 3, (round + 1) % 3);
        // The admitted turn holds its model request until released, so
        // the other Chat is decided while it is live.
        let key = format!("r{round}");
        let text = format!("hold {key} 1");
        let (first, second) = tokio::join!(
            cluster.client(a).chat_with(text_request(&session, &text)),
            cluster.client(b).chat_with(text_request(&session, &text)),
        );
        let (admitted, refused) = match (first, second) {
            (Ok(events), Err(e)) | (Err(e), Ok(events)) => (events, e),
            (Ok(_), Ok(_)) => panic!("round {round}: both replicas admitted a turn"),
            (Err(x), Err(y)) => panic!("round {round}: neither admitted: {x}; {y}"),
        };
        assert_eq!(
            aborted_reason(&refused).as_deref(),
            Some("SESSION_BUSY"),
            "round {round}: {refused}"
        );
        cluster.upstream.release(&key);
        let summary = finish(admitted, Duration::from_secs(10)).await;
        assert_eq!(
            outcome(&summary),
            Some((
                proto::TurnOutcome::Success,
                proto::CancelReason::Unspecified
            )),
            "round {round}: {}",
            errors(&summary)
        );
        assert_eq!(
            cluster.upstream.requests(&key),
            1,
            "round {round}: one model request"
        );
    }
    let history = cluster.client(2).history(&session).await.unwrap();
    let users = assert_history_sound(&history, "after the rounds");
    assert_eq!(
        history.len(),
        2 * ROUNDS,
        "a user message and an answer per round"
    );
    let want: Vec<String> = (0..ROUNDS).map(|r| format!("hold r{r} 1")).collect();
    assert_eq!(users, want, "each round's user message once, in order");
}
