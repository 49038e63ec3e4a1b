//! The inbox across replicas on one PostgreSQL database: messages queued
//! (ON_BUSY_ENQUEUE) on one replica while another runs the session's turn
//! are listed by either, and when the owner dies — its database link cut,
//! then the process gone, so it can write nothing more — another replica
//! takes the queue over: the dead turn is reported INTERRUPTED once its
//! lease lapses, and each queued message runs there exactly once, its Chat
//! following it to the end.

use std::sync::Arc;

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::proto;
use agentrt_client::proto::chat_event::Kind;
use agentrt_client::proto::session_service_client::SessionServiceClient;
use agentrt_runtime::model::ModelProvider;
use agentrt_testkit::gate::GateProvider;
use support::*;

#[tokio::test]
async fn a_dead_owners_queue_is_taken_over_and_each_message_runs_once() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let proxy = agentrt_testkit::tcp_proxy::TcpProxy::start(&db.addr).await;
    let via_proxy = db.url.replace(&db.addr, &proxy.addr().to_string());
    // `gate/*` holds the first turn on A; `queued/*` answers at once.
    let gate = Arc::new(GateProvider::default());
    let queued_model = Arc::new(GateProvider::default());
    queued_model.release(16);
    let models: Vec<(&str, Arc<dyn ModelProvider>)> = vec![
        ("gate", Arc::clone(&gate) as Arc<dyn ModelProvider>),
        (
            "queued",
            Arc::clone(&queued_model) as Arc<dyn ModelProvider>,
        ),
    ];
    let fast = |c: &mut agentrt_server::Config| {
        c.store.lease_ttl_ms = Some(1_000);
        c.inbox_sweep = std::time::Duration::from_millis(200);
    };
    let a = replica_with(&via_proxy, true, &models, fast).await;
    let b = replica_with(&db.url, true, &models, fast).await;
    let session = new_session(&a).await;
    let first = live_gate_turn(&a, &session).await;

    // Queued on B while A runs the turn: B's store refuses the turn (A's
    // lease), so the message goes to the shared inbox.
    let queue = |text: &str, rid: &str| {
        let mut req = chat(&session, "queued/x", rid);
        req.content = vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }];
        req.on_busy = proto::OnBusy::Enqueue as i32;
        req
    };
    let mut streams = Vec::new();
    for (i, (text, rid)) in [("q1", "r1"), ("q2", "r2")].into_iter().enumerate() {
        let mut events = runtime(&b)
            .await
            .chat(queue(text, rid))
            .await
            .unwrap()
            .into_inner();
        let event = next(&mut events).await.unwrap().unwrap();
        let Some(Kind::Queued(q)) = &event.kind else {
            panic!("expected queued, got {event:?}");
        };
        assert_eq!(q.position, i as u64 + 1);
        streams.push((events, event.turn_id));
    }
    // Either replica lists the inbox (B's call is answered by the owner).
    let status = runtime(&b)
        .await
        .get_session_status(proto::GetSessionStatusRequest {
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(status.live);
    let listed: Vec<_> = status.queued.iter().map(|q| q.id.clone()).collect();
    let ids: Vec<_> = streams.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(listed, ids);

    // A dies: its database link is cut, then it is gone.
    proxy.cut();
    drop(a);
    drop(first);

    for (mut events, id) in streams {
        let (seen, trailer) = drain(&mut events).await;
        assert!(trailer.is_none(), "{trailer:?}");
        assert!(seen.iter().all(|e| e.turn_id == id));
        assert_eq!(outcome(&seen), Some(proto::TurnOutcome::Success));
    }
    let mut sessions = SessionServiceClient::new(channel(b.server.url()).await);
    let turns = sessions
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .turns;
    let outcomes: Vec<_> = turns.iter().rev().map(|t| t.outcome()).collect();
    assert_eq!(
        outcomes,
        [
            proto::TurnOutcome::Interrupted,
            proto::TurnOutcome::Success,
            proto::TurnOutcome::Success
        ]
    );
    let history = sessions
        .get_history(proto::GetHistoryRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let users: Vec<String> = history
        .iter()
        .filter(|m| m.role() == proto::Role::User)
        .map(|m| match &m.content[0].block {
            Some(proto::content_block::Block::Text(t)) => t.text.clone(),
            _ => String::new(),
        })
        .collect();
    assert_eq!(users, ["hello", "q1", "q2"]);
    b.server.stop().await;
}

#[tokio::test]
async fn interrupt_and_steer_sent_to_another_replica_reach_the_owners_turn() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let quick = Arc::new(GateProvider::default());
    quick.release(16);
    let models: Vec<(&str, Arc<dyn ModelProvider>)> = vec![
        ("gate", Arc::clone(&gate) as Arc<dyn ModelProvider>),
        ("queued", Arc::clone(&quick) as Arc<dyn ModelProvider>),
    ];
    let a = replica(&db.url, true, &models).await;
    let b = replica(&db.url, true, &models).await;
    let session = new_session(&a).await;
    let busy = |text: &str, on_busy: proto::OnBusy| {
        let mut req = chat(&session, "queued/x", "");
        req.content = vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }];
        req.on_busy = on_busy as i32;
        req
    };

    // INTERRUPT on B: A's turn ends CANCELED (INTERRUPTED), the new one runs.
    let mut first = live_gate_turn(&a, &session).await;
    let mut instead = busy("instead", proto::OnBusy::Interrupt);
    instead.speaker = Some(proto::Speaker {
        id: "u-9".to_owned(),
        display_name: "Nine".to_owned(),
    });
    let mut interrupting = runtime(&b).await.chat(instead).await.unwrap().into_inner();
    let (events, _) = drain(&mut first).await;
    let finished = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::TurnFinished(f)) => Some((f.outcome(), f.cancel_reason())),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        finished,
        (
            proto::TurnOutcome::Canceled,
            proto::CancelReason::Interrupted
        )
    );
    let (events, trailer) = drain(&mut interrupting).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    // Stored by the owner with the provenance B authenticated: the whole
    // principal crossed (the unauthenticated loopback user, an admin).
    let history = SessionServiceClient::new(channel(b.server.url()).await)
        .get_history(proto::GetHistoryRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let stored = history
        .iter()
        .find(|m| m.role() == proto::Role::User && m.speaker.is_some())
        .expect("the interrupting message");
    let actor = stored.input_actor.clone().unwrap();
    assert_eq!(
        (
            stored.speaker.clone().map(|s| s.display_name),
            actor.kind(),
            actor.id.as_str(),
            actor.admin
        ),
        (
            Some("Nine".to_owned()),
            proto::InputActorKind::Local,
            "local",
            true
        )
    );

    // STEER on B: handed to A's live turn (B's status, answered by A, shows
    // it waiting); a gated step has no boundary left, so it runs next.
    let first = live_gate_turn(&a, &session).await;
    let mut steering = runtime(&b)
        .await
        .chat(busy("also", proto::OnBusy::Steer))
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(WAIT, async {
        loop {
            let status = runtime(&b)
                .await
                .get_session_status(proto::GetSessionStatusRequest {
                    session_id: session.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if status.steering == 1 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the steering message reached the owner's turn");
    gate.release(1);
    drop(first);
    let (events, trailer) = drain(&mut steering).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert!(matches!(
        &events[0].kind,
        Some(Kind::Steered(s)) if s.message_seq == 0
    ));
    assert!(matches!(&events[1].kind, Some(Kind::Queued(_))));
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));

    // Queued on B, run by A when its turn ends: B's stream follows it
    // there (or replays it, if it ended before B looked).
    let first = live_gate_turn(&a, &session).await;
    let mut queued = runtime(&b)
        .await
        .chat(busy("after it", proto::OnBusy::Enqueue))
        .await
        .unwrap()
        .into_inner();
    let head = next(&mut queued).await.unwrap().unwrap();
    assert!(matches!(head.kind, Some(Kind::Queued(_))));
    gate.release(1);
    drop(first);
    let (events, trailer) = drain(&mut queued).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert!(matches!(events[0].kind, Some(Kind::TurnStarted(_))));
    assert!(events.iter().all(|e| e.turn_id == head.turn_id));
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));

    // StopSession with clear_inbox on B: the owner stops its turn, B
    // cleared the shared inbox; the answer counts what was cleared.
    let _live = live_gate_turn(&a, &session).await;
    let mut queued = runtime(&b)
        .await
        .chat(busy("later", proto::OnBusy::Enqueue))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        next(&mut queued).await.unwrap().unwrap().kind,
        Some(Kind::Queued(_))
    ));
    let stopped = runtime(&b)
        .await
        .stop_session(proto::StopSessionRequest {
            session_id: session.clone(),
            clear_inbox: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stopped.stopped, stopped.cleared), (true, 1));
    let (events, trailer) = drain(&mut queued).await;
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(trailer.map(|s| s.code()), Some(tonic::Code::Cancelled));
    a.server.stop().await;
    b.server.stop().await;
}
