//! Admission refuses a turn its provider's queue cannot take, storing
//! nothing, and gives back what it reserved for a turn it then refuses.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::StreamExt as _;

use crate::error::RuntimeError;
use crate::events::EventKind;
use crate::model::{
    ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, Models, NoCapacity,
    Reservation,
};
use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
use crate::store::{MemoryStore, Store};
use crate::types::{ContentBlock, NewSession, Principal};

/// One unit of [`Queue`]'s capacity, given back when dropped.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A provider with a bounded queue, like the local model: a step holds
/// one of `capacity` slots while its stream lives (the stream never
/// finishes), taken at admission when reserved, else at `stream()`,
/// which then fails when none is left.
#[derive(Debug)]
struct Queue {
    capacity: usize,
    taken: Arc<AtomicUsize>,
    refused_in_stream: AtomicUsize,
}

impl Queue {
    fn take(&self) -> Option<Slot> {
        let before = self.taken.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(Arc::clone(&self.taken));
        (before < self.capacity).then_some(slot)
    }

    fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ModelProvider for Queue {
    async fn stream(&self, mut request: ModelRequest) -> Result<ModelStream, ModelError> {
        let slot = match request
            .reservation
            .take()
            .and_then(Reservation::slot::<Slot>)
        {
            Some(slot) => slot,
            None => match self.take() {
                Some(slot) => Arc::new(slot),
                None => {
                    self.refused_in_stream.fetch_add(1, Ordering::SeqCst);
                    return Err(ModelError::RateLimited("the queue is full".into()));
                }
            },
        };
        let first = futures::stream::iter([Ok(ModelEvent::TextDelta("working".into()))]);
        // Holds the slot until the turn drops the stream.
        let rest = futures::stream::once(async move {
            let _slot = slot;
            std::future::pending::<()>().await;
            Err(ModelError::Truncated("unreachable".into()))
        });
        Ok(Box::pin(first.chain(rest)))
    }

    fn has_capacity(&self, _model: &str) -> bool {
        self.taken() < self.capacity
    }

    fn reserve(&self, _model: &str) -> Result<Option<Reservation>, NoCapacity> {
        self.take()
            .map(|slot| Some(Reservation::new(slot)))
            .ok_or(NoCapacity)
    }
}

fn say(session_id: &str) -> ChatInput {
    ChatInput {
        session_id: session_id.to_owned(),
        content: vec![ContentBlock::text("hello")],
        model: Some("queue/m".to_owned()),
        ..ChatInput::default()
    }
}

#[tokio::test]
async fn a_burst_over_the_providers_queue_is_refused_at_admission_with_nothing_stored() {
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(Queue {
        capacity: 2,
        taken: Arc::new(AtomicUsize::new(0)),
        refused_in_stream: AtomicUsize::new(0),
    });
    let mut models = Models::with_builtin();
    models.insert("queue", Arc::clone(&queue) as Arc<dyn ModelProvider>);
    let rt = Runtime::open(
        RuntimeConfig::default(),
        Arc::clone(&store) as Arc<dyn Store>,
        models,
    )
    .await
    .unwrap();
    let who = Principal::local();
    let mut sessions = Vec::new();
    for _ in 0..5 {
        let id = rt
            .create_session(&who, NewSession::default())
            .await
            .unwrap()
            .id;
        sessions.push(id);
    }

    // All five at once: each checks the queue before any request is sent.
    let results = futures::future::join_all(sessions.iter().map(|id| rt.chat(&who, say(id)))).await;
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for (id, result) in sessions.iter().zip(results) {
        match result {
            Ok(stream) => admitted.push((id.clone(), stream)),
            Err(RuntimeError::ResourceExhausted(_)) => refused.push(id.clone()),
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        (admitted.len(), refused.len()),
        (2, 3),
        "exactly the queue's capacity is admitted"
    );
    for id in &refused {
        assert!(
            store.history(id, 0, 10, true).await.unwrap().is_empty(),
            "a refused turn stores nothing"
        );
    }
    // The admitted turns are running: each relays its first delta.
    for (_, stream) in &mut admitted {
        loop {
            let event = stream.next().await.expect("the turn is live");
            if matches!(event.kind, EventKind::Text(_)) {
                break;
            }
        }
    }
    assert_eq!(queue.refused_in_stream.load(Ordering::SeqCst), 0);
    assert_eq!(queue.taken(), 2);

    // Stopping a turn drops its stream and with it its slot.
    let (stopped_id, stopped) = admitted.remove(0);
    assert!(rt.stop_session(&who, &stopped_id).await.unwrap());
    let _: Vec<_> = stopped.collect().await;
    assert_eq!(queue.taken(), 1);

    // A slot reserved for a turn that is then refused (its session is
    // busy) is given back.
    let busy = rt.chat(&who, say(&admitted[0].0)).await;
    assert!(
        matches!(busy, Err(RuntimeError::SessionBusy { .. })),
        "{busy:?}"
    );
    assert_eq!(queue.taken(), 1);

    // So the freed slot admits a refused session's next turn.
    let mut again = rt.chat(&who, say(&refused[0])).await.unwrap();
    while !matches!(again.next().await.unwrap().kind, EventKind::Text(_)) {}
    assert_eq!(queue.taken(), 2);
    assert_eq!(queue.refused_in_stream.load(Ordering::SeqCst), 0);
}
