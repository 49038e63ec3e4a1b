//! SIGTERM of one replica drains only its own live turns: turns owned by
//! the other replicas keep streaming to `turn_finished` SUCCESS, during
//! the drain and after the drained replica exited.

use std::time::Duration;

use agentrt_client::{EventStream, proto};

use super::harness::{
    Cluster, assert_history_sound, errors, finish, is_text, outcome, read_until, serial,
    text_request,
};

const PER_REPLICA: usize = 2;

#[tokio::test]
async fn sigterm_of_one_replica_cancels_only_its_own_turns() {
    let _serial = serial().await;
    // A grace longer than the lease TTL (1.5 s): a draining replica must
    // keep renewing its turns' leases until they end, or their partial
    // output could not be stored.
    let Some(mut cluster) = Cluster::start_with(3, "2s").await else {
        return;
    };
    // (replica, key, session, events) of every live turn.
    let mut live: Vec<(usize, String, String, EventStream)> = Vec::new();
    for replica in 0..3 {
        for j in 0..PER_REPLICA {
            let session = cluster.session().await;
            let key = format!("d{replica}_{j}");
            let mut events = cluster
                .client(replica)
                .chat_with(text_request(&session, &format!("hold {key} 2")))
                .await
                .unwrap();
            read_until(&mut events, Duration::from_secs(10), is_text).await;
            live.push((replica, key, session, events));
        }
    }
    cluster.sigterm(0);

    let (drained, others): (Vec<_>, Vec<_>) = live.into_iter().partition(|(r, ..)| *r == 0);
    let mut others = others.into_iter();
    // While replica 0 drains, a turn of replica 1 runs to its end.
    let (_, key, session, events) = others.next().unwrap();
    cluster.upstream.release(&key);
    let during = finish(events, Duration::from_secs(10)).await;
    assert_eq!(
        outcome(&during),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        )),
        "{key} finished while replica 0 drained: {}",
        errors(&during)
    );
    let mut sessions = vec![session];

    for (_, key, session, events) in drained {
        let end = finish(events, Duration::from_secs(10)).await;
        assert_eq!(
            outcome(&end),
            Some((proto::TurnOutcome::Canceled, proto::CancelReason::Shutdown)),
            "{key}: the drained replica's own turn: {}",
            errors(&end)
        );
        cluster
            .upstream
            .wait_gone(&key, Duration::from_secs(5))
            .await
            .unwrap_or_else(|()| panic!("{key}: its model request stayed open"));
        sessions.push(session);
    }
    let status = cluster.wait_exit(0, Duration::from_secs(10)).await;
    assert!(status.success(), "replica 0 exited with {status:?}");

    for (replica, key, session, events) in others {
        assert!(
            !cluster.upstream.gone(&key),
            "{key} on replica {replica} was disturbed"
        );
        cluster.upstream.release(&key);
        let end = finish(events, Duration::from_secs(10)).await;
        assert_eq!(
            outcome(&end),
            Some((
                proto::TurnOutcome::Success,
                proto::CancelReason::Unspecified
            )),
            "{key} on replica {replica}: {}",
            errors(&end)
        );
        sessions.push(session);
    }
    for session in &sessions {
        let history = cluster.client(2).history(session).await.unwrap();
        assert_history_sound(&history, session);
        assert_eq!(
            history.len(),
            2,
            "{session}: the user message and the answer"
        );
    }
}
