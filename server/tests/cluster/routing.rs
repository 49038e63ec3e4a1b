//! Calls for a live turn work on any replica: the one that does not own
//! the turn forwards to the owner (StopSession, Subscribe,
//! SubmitToolResult, GetSessionStatus), and a watcher waiting for the next
//! turn follows it to the replica that admitted it.

use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, proto};

use super::harness::{
    Cluster, assert_contiguous, assert_history_sound, finish, finished, is_text, outcome,
    read_until, results_of, serial, text_request, tool_request,
};

const A: usize = 0;
const B: usize = 1;
const C: usize = 2;

#[tokio::test]
async fn stop_sent_to_another_replica_ends_the_turn_within_a_second() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(3).await else {
        return;
    };
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold stop 2"))
        .await
        .unwrap();
    read_until(&mut events, Duration::from_secs(10), is_text).await;

    let status = cluster.client(B).session_status(&session).await.unwrap();
    assert!(status.live, "B sees A's live turn: {status:?}");

    let sent = Instant::now();
    let stopped = cluster.client(B).stop_session(&session).await.unwrap();
    assert!(stopped, "B's Stop reached the live turn on A");
    cluster
        .upstream
        .wait_gone(
            "stop",
            Duration::from_secs(1).saturating_sub(sent.elapsed()),
        )
        .await
        .unwrap_or_else(|()| {
            panic!(
                "A's model request still open {:?} after Stop",
                sent.elapsed()
            )
        });
    let rest = finish(events, Duration::from_secs(5)).await;
    assert_eq!(
        outcome(&rest),
        Some((proto::TurnOutcome::Canceled, proto::CancelReason::Stopped))
    );
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "took {:?}",
        sent.elapsed()
    );
    let status = cluster.client(C).session_status(&session).await.unwrap();
    assert!(!status.live, "{status:?}");
    assert!(
        !cluster.client(C).stop_session(&session).await.unwrap(),
        "nothing live any more"
    );
    let history = cluster.client(C).history(&session).await.unwrap();
    assert_history_sound(&history, "after stop");
    assert_eq!(history.len(), 2, "the user message and the partial answer");
    assert_eq!(history[1].stop_reason, "cancelled");
}

#[tokio::test]
async fn subscribe_on_another_replica_replays_and_follows_the_turn_to_its_end() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(3).await else {
        return;
    };
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold sub 3"))
        .await
        .unwrap();
    let mut seen = read_until(
        &mut events,
        Duration::from_secs(10),
        |e| matches!(&e.kind, ChatEvent::Text(t) if t.starts_with("d2")),
    )
    .await;
    let status = cluster.client(B).session_status(&session).await.unwrap();
    assert!(status.live);
    assert_eq!(status.turn_id, seen[0].turn_id);

    let mut watch = cluster
        .client(B)
        .subscribe(&session, 0, false)
        .await
        .unwrap();
    // The replay: everything the caller saw so far, in order.
    let replayed = read_until(
        &mut watch,
        Duration::from_secs(5),
        |e| matches!(&e.kind, ChatEvent::Text(t) if t.starts_with("d2")),
    )
    .await;
    assert_eq!(replayed, seen, "the replay is the turn's events as sent");
    cluster.upstream.release("sub");
    let rest = finish(events, Duration::from_secs(10)).await;
    seen.extend(rest.events);
    let followed = finish(watch, Duration::from_secs(10)).await;
    let mut watched = replayed;
    watched.extend(followed.events);
    assert_contiguous(&watched, "the subscriber");
    assert_eq!(
        watched.last().and_then(finished),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        )),
        "followed to turn_finished"
    );
    assert_eq!(
        watched, seen,
        "the subscriber saw exactly the caller's events"
    );
}

#[tokio::test]
async fn a_tool_result_submitted_to_a_third_replica_reaches_the_turn() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(3).await else {
        return;
    };
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(tool_request(&session, "tc"))
        .await
        .unwrap();
    let seen = read_until(&mut events, Duration::from_secs(10), |e| {
        matches!(e.kind, ChatEvent::ToolCall { .. })
    })
    .await;
    let last = seen.last().unwrap();
    let ChatEvent::ToolCall { call_id, .. } = &last.kind else {
        unreachable!("read_until stops at the tool call")
    };
    assert_eq!(call_id, "call-tc");
    cluster
        .client(C)
        .submit_tool_result(&session, &last.turn_id, call_id, "forty-two", false)
        .await
        .unwrap();
    let rest = finish(events, Duration::from_secs(10)).await;
    assert_eq!(
        outcome(&rest),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        ))
    );
    assert_eq!(rest.text, "after tool");
    let sent = cluster
        .upstream
        .tool_result_request("tc")
        .expect("A called the model again with the result");
    let messages = sent["messages"].as_array().unwrap();
    let result = messages.last().unwrap();
    assert_eq!(result["tool_call_id"], "call-tc");
    assert_eq!(result["content"], "forty-two");

    let history = cluster.client(B).history(&session).await.unwrap();
    assert_history_sound(&history, "after the tool turn");
    let results = results_of(&history, "call-tc");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].content, "forty-two");
    assert!(!results[0].is_error);
}

#[tokio::test]
async fn a_watcher_waiting_on_one_replica_follows_the_next_turn_admitted_on_another() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(2).await else {
        return;
    };
    let session = cluster.session().await;
    // Nothing is live: B's watcher waits for the session's next turn.
    let mut watch = cluster
        .client(B)
        .subscribe(&session, 0, true)
        .await
        .unwrap();
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold next 2"))
        .await
        .unwrap();
    let mut seen = read_until(&mut events, Duration::from_secs(10), is_text).await;
    // The turn is held until the watcher on B has followed it to A.
    let mut watched = read_until(&mut watch, Duration::from_secs(10), is_text).await;
    cluster.upstream.release("next");
    let rest = finish(events, Duration::from_secs(10)).await;
    seen.extend(rest.events);
    watched.extend(finish(watch, Duration::from_secs(10)).await.events);
    assert_contiguous(&watched, "the waiting watcher");
    assert_eq!(
        watched.last().and_then(finished),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        )),
        "followed to turn_finished"
    );
    assert_eq!(
        watched, seen,
        "the watcher on B saw the turn admitted on A, from its first event"
    );
}
