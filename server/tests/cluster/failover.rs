//! SIGKILL of the replica owning a live turn: its lease expires, another
//! replica admits the next Chat within the lease TTL plus a second, the
//! killed turn is INTERRUPTED with its open tool call answered once, and
//! nothing is stored twice — wherever in the turn the kill lands.

use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, proto};
use futures::StreamExt as _;

use super::harness::{
    Cluster, LEASE_TTL, aborted_reason, assert_history_sound, errors, finish, outcome, read_until,
    results_of, serial, text_request, tool_request,
};

const ROUNDS: usize = 20;
/// Text deltas a held turn streams before it waits.
const DELTAS: usize = 5;

/// A deterministic spread of kill points, so a failing one can be replayed.
fn points(n: usize, max: u64) -> Vec<u64> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (max + 1)
        })
        .collect()
}

#[tokio::test]
async fn sigkill_of_the_owner_lets_another_replica_take_the_session_after_the_lease() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(3).await else {
        return;
    };
    let session = cluster.session().await;
    // A held turn's events before it waits: turn_started, step start, the
    // deltas. A kill point is how many of them were read before SIGKILL
    // (0: right after admission; DELTAS + 2: all text out, model open).
    for (round, point) in points(ROUNDS, DELTAS as u64 + 2).into_iter().enumerate() {
        let owner = round % 3;
        let other = (owner + 1) % 3;
        let key = format!("k{round}");
        // Rounds 3, 8, 13, 18: the caller's tool call open: the turn pauses
        // and is resumed on another replica by the call's result.
        let with_tool = round % 5 == 3;
        let text = if with_tool {
            format!("tool {key}")
        } else {
            format!("hold {key} {DELTAS}")
        };
        let mut req = if with_tool {
            tool_request(&session, &key)
        } else {
            text_request(&session, &text)
        };
        req.request_id = format!("kill-{round}");
        let mut events = cluster.client(owner).chat_with(req.clone()).await.unwrap();
        let turn_id = if with_tool {
            // Kill with the caller's tool call open (stored, unanswered).
            let seen = read_until(&mut events, Duration::from_secs(10), |e| {
                matches!(e.kind, ChatEvent::ToolCall { .. })
            })
            .await;
            assert!(
                seen.iter().any(|e| matches!(
                    e.kind,
                    ChatEvent::MessageStored {
                        role: proto::Role::Assistant,
                        ..
                    }
                )),
                "round {round}: the call is stored before the caller is asked: {seen:?}"
            );
            seen[0].turn_id.clone()
        } else {
            // Stop at the point, or once the last delta is out (deltas
            // may arrive merged, so there can be fewer events than DELTAS).
            let last = format!("d{} ", DELTAS - 1);
            let mut turn_id = String::new();
            for _ in 0..point {
                let e = tokio::time::timeout(Duration::from_secs(10), events.next())
                    .await
                    .unwrap_or_else(|_| panic!("round {round}: the turn stalled early"))
                    .unwrap()
                    .unwrap();
                turn_id.clone_from(&e.turn_id);
                if matches!(&e.kind, ChatEvent::Text(t) if t.ends_with(&last)) {
                    break;
                }
            }
            turn_id
        };
        cluster
            .upstream
            .wait_requested(&key, Duration::from_secs(10))
            .await;
        let running = cluster
            .client(other)
            .get_session(&session)
            .await
            .unwrap()
            .last_turn
            .expect("the live turn's record");
        assert_eq!(
            running.outcome(),
            proto::TurnOutcome::Running,
            "round {round}"
        );
        cluster.kill(owner).await;
        let killed_at = Instant::now();
        drop(events);
        if with_tool {
            paused_then_resumed(&cluster, other, &session, &turn_id, &key, killed_at, round).await;
            let url = cluster.db.url.clone();
            cluster.restart(owner, &url).await;
            continue;
        }

        // Even rounds: the sweepers of the surviving replicas (every half
        // lease time) find the lapsed lease and mark the turn INTERRUPTED
        // before anyone calls. Odd rounds: a Chat right away, admitted as
        // soon as the lease lapsed (by the admission or a sweeper, first).
        let mut deadline = killed_at + LEASE_TTL + Duration::from_secs(1);
        if round % 2 == 0 {
            deadline += LEASE_TTL / 2;
            loop {
                let s = cluster.client(other).get_session(&session).await.unwrap();
                let last = s.last_turn.expect("a last turn");
                assert_eq!(last.turn_id, running.turn_id, "round {round}");
                if last.outcome() == proto::TurnOutcome::Interrupted {
                    break;
                }
                assert_eq!(last.outcome(), proto::TurnOutcome::Running, "round {round}");
                assert!(
                    Instant::now() < deadline,
                    "round {round}: not swept {:?} after the kill",
                    killed_at.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let fresh = loop {
            match cluster
                .client(other)
                .chat_with(text_request(&session, &format!("after kill {round}")))
                .await
            {
                Ok(events) => break events,
                Err(e) if aborted_reason(&e).as_deref() == Some("SESSION_BUSY") => {
                    assert!(
                        Instant::now() < deadline,
                        "round {round}: still busy {:?} after the kill",
                        killed_at.elapsed()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("round {round}: {e}"),
            }
        };
        assert!(
            Instant::now() < deadline,
            "round {round}: admitted after {:?}",
            killed_at.elapsed()
        );
        let after = finish(fresh, Duration::from_secs(10)).await;
        assert_eq!(
            outcome(&after),
            Some((
                proto::TurnOutcome::Success,
                proto::CancelReason::Unspecified
            )),
            "round {round}: {}",
            errors(&after)
        );

        // The killed turn is over (INTERRUPTED): a retry of its request is
        // not run again nor joined, it replays the interruption.
        let replay = finish(
            cluster.client(other).chat_with(req).await.unwrap(),
            Duration::from_secs(10),
        )
        .await;
        let said = replay.events.iter().find_map(|e| match &e.kind {
            ChatEvent::Error { message, .. } => Some(message.clone()),
            _ => None,
        });
        assert!(
            said.as_deref().is_some_and(|m| m.contains("interrupted")),
            "round {round}: the retry replays the interruption, got {said:?}"
        );
        // A replayed RUNNING record would have no end (duration zero); an
        // INTERRUPTED one ended when its lapsed lease was taken over.
        let lasted = replay.events.iter().find_map(|e| match e.kind {
            ChatEvent::TurnFinished { duration, .. } => Some(duration),
            _ => None,
        });
        assert!(
            lasted.is_some_and(|d| d > Duration::ZERO),
            "round {round}: the killed turn's record was not finished: {lasted:?}"
        );
        assert!(
            !turn_id.is_empty() || point == 0 || with_tool,
            "round {round}: events carry the turn id"
        );
        if !turn_id.is_empty() {
            assert!(
                replay.events.iter().all(|e| e.turn_id == turn_id),
                "round {round}"
            );
        }
        assert!(
            matches!(replay.status, Some(ref s) if s.code() == tonic::Code::Unavailable),
            "round {round}: {:?}",
            replay.status
        );
        assert_eq!(
            cluster.upstream.requests(&key),
            1,
            "round {round}: not run again"
        );

        let history = cluster.client(other).history(&session).await.unwrap();
        let users = assert_history_sound(&history, &format!("round {round}"));
        assert_eq!(
            users.iter().filter(|u| **u == text).count(),
            1,
            "round {round}: the killed turn's user message once"
        );
        if with_tool {
            let results = results_of(&history, &format!("call-{key}"));
            assert_eq!(
                results.len(),
                1,
                "round {round}: the open call answered once"
            );
            assert!(results[0].is_error, "round {round}: {:?}", results[0]);
        }
        let s = cluster.client(other).get_session(&session).await.unwrap();
        assert_eq!(s.message_count, history.len() as u64, "round {round}");
        let url = cluster.db.url.clone();
        cluster.restart(owner, &url).await;
    }
    let history = cluster.client(0).history(&session).await.unwrap();
    assert_history_sound(&history, "after every round");
}

/// Round `round` killed its turn while it waited for the caller's tool
/// call: the turn is PAUSED once the owner's lease lapsed — not
/// interrupted — and keeps the session busy; the call's result, submitted
/// on another replica, resumes it there to one SUCCESS, the call answered
/// once in history.
async fn paused_then_resumed(
    cluster: &Cluster,
    other: usize,
    session: &str,
    turn_id: &str,
    key: &str,
    killed_at: Instant,
    round: usize,
) {
    let deadline = killed_at + LEASE_TTL * 2 + Duration::from_secs(1);
    loop {
        let s = cluster.client(other).get_session(session).await.unwrap();
        let last = s.last_turn.expect("a last turn");
        assert_eq!(last.turn_id, turn_id, "round {round}");
        if last.outcome() == proto::TurnOutcome::Paused {
            break;
        }
        assert_eq!(last.outcome(), proto::TurnOutcome::Running, "round {round}");
        assert!(
            Instant::now() < deadline,
            "round {round}: not paused {:?} after the kill",
            killed_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let busy = cluster
        .client(other)
        .chat_with(text_request(session, &format!("while paused {round}")))
        .await;
    let Err(err) = busy else {
        panic!("round {round}: admitted while paused")
    };
    assert_eq!(
        aborted_reason(&err).as_deref(),
        Some("SESSION_BUSY"),
        "round {round}"
    );
    let watch = cluster
        .client(other)
        .subscribe(session, 0, true)
        .await
        .unwrap();
    cluster
        .client(other)
        .submit_tool_result(session, turn_id, &format!("call-{key}"), "found", false)
        .await
        .unwrap();
    let resumed = finish(watch, Duration::from_secs(10)).await;
    assert_eq!(
        outcome(&resumed),
        Some((
            proto::TurnOutcome::Success,
            proto::CancelReason::Unspecified
        )),
        "round {round}: {}",
        errors(&resumed)
    );
    let history = cluster.client(other).history(session).await.unwrap();
    assert_history_sound(&history, &format!("round {round}"));
    let results = results_of(&history, &format!("call-{key}"));
    assert_eq!(results.len(), 1, "round {round}: the call answered once");
    assert!(!results[0].is_error, "round {round}: {:?}", results[0]);
    assert_eq!(results[0].content, "found", "round {round}");
}
