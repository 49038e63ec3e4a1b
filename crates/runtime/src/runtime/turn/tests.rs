//! The model step's relay loop against a provider whose items are always
//! ready: Stop and the deadline must still end it (they are checked per
//! item without polling their futures).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;

use crate::events::{EventKind, TurnOutcome};
use crate::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, Models};
use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
use crate::store::MemoryStore;
use crate::types::{ContentBlock, NewSession, Principal};

/// Streams "x" deltas, every one ready at once; so many that a turn which
/// ignored Stop or its deadline would run for seconds, then ends without
/// finishing (an error outcome).
#[derive(Debug)]
struct Endless;

#[async_trait]
impl ModelProvider for Endless {
    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        Ok(Box::pin(
            futures::stream::repeat_with(|| Ok(ModelEvent::TextDelta("x".into()))).take(2_000_000),
        ))
    }
}

async fn endless_turn(timeout: Option<Duration>) -> (Runtime, String, crate::runtime::TurnStream) {
    let mut models = Models::with_builtin();
    models.insert("endless", Arc::new(Endless));
    let rt = Runtime::open(
        RuntimeConfig::default(),
        Arc::new(MemoryStore::new()),
        models,
    )
    .await
    .unwrap();
    let who = Principal::local();
    let id = rt
        .create_session(&who, NewSession::default())
        .await
        .unwrap()
        .id;
    let input = ChatInput {
        session_id: id.clone(),
        content: vec![ContentBlock::text("go")],
        model: Some("endless/m".to_owned()),
        timeout,
        ..ChatInput::default()
    };
    let turn = rt.chat(&who, input).await.unwrap();
    (rt, id, turn)
}

/// Reads until the turn's outcome; fails instead of hanging.
async fn outcome(mut turn: crate::runtime::TurnStream) -> (TurnOutcome, usize) {
    let read = async {
        let mut texts = 0;
        while let Some(event) = turn.next().await {
            match event.kind {
                EventKind::Text(_) => texts += 1,
                EventKind::TurnFinished { outcome, .. } => return (outcome, texts),
                _ => {}
            }
        }
        panic!("the stream ended without an outcome");
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the turn did not end")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_a_step_whose_items_are_always_ready() {
    let (rt, id, mut turn) = endless_turn(None).await;
    let mut texts = 0;
    while texts < 1_000 {
        if let EventKind::Text(_) = turn.next().await.unwrap().kind {
            texts += 1;
        }
    }
    assert!(rt.stop_session(&Principal::local(), &id).await.unwrap());
    let (outcome, _) = outcome(turn).await;
    assert_eq!(outcome, TurnOutcome::Canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_ends_a_step_whose_items_are_always_ready() {
    let (_rt, _id, turn) = endless_turn(Some(Duration::from_millis(200))).await;
    let (outcome, texts) = outcome(turn).await;
    assert_eq!(outcome, TurnOutcome::TimedOut);
    assert!(texts > 0);
}
