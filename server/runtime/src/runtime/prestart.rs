//! Overlapping admission's flush with the turn's first model request.
//!
//! Admission must not return before the user message is durable, and the
//! flush is a device write. Once the user message's transaction is applied
//! (visible to readers, not yet durable), a task loads the turn's context
//! and — unless it needs compaction first — starts the model request, while
//! admission waits for the flush. If the flush fails, admission is rejected
//! and dropping the [`Prestart`] aborts the task, which drops (closes) the
//! upstream request. Nothing is acknowledged before the flush: the turn
//! emits `turn_started` and the user message's `message_stored` only after
//! admission returned.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::compact::Context;
use super::{Inner, Runner};
use crate::model::{ModelError, ModelRequest, ModelStream, ToolSpec};
use crate::store::StoreError;
use crate::types::{Message, Session};

/// The loaded context, as the prestart task found it.
pub(crate) enum Loaded {
    /// Within the budget: these messages were sent with the first model
    /// request (whose start is the [`FirstStep`]).
    Sent(Vec<Message>),
    /// Over the budget (estimated at `tokens`): the turn compacts before
    /// its first model request.
    NeedsCompaction {
        /// The loaded context.
        context: Context,
        /// Its estimated size.
        tokens: u64,
    },
}

/// The first model request, started during admission.
pub(crate) struct FirstStep(JoinHandle<Option<Result<ModelStream, ModelError>>>);

impl Drop for FirstStep {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Future for FirstStep {
    type Output = Result<ModelStream, ModelError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|joined| match joined {
            Ok(Some(started)) => started,
            // The task sent `NeedsCompaction` (never awaited then), failed
            // to load, or panicked.
            Ok(None) | Err(_) => Err(ModelError::Unavailable(
                "the model request could not be started".to_owned(),
            )),
        })
    }
}

/// A started prestart task; dropping it aborts the task.
pub(crate) struct Prestart {
    loaded: oneshot::Receiver<Result<Loaded, StoreError>>,
    first: FirstStep,
}

impl Prestart {
    /// The loaded context and, when it was sent, the first request.
    pub(crate) async fn loaded(self) -> Result<(Loaded, Option<FirstStep>), StoreError> {
        let Self { loaded, first } = self;
        match loaded.await {
            Ok(Ok(Loaded::Sent(messages))) => Ok((Loaded::Sent(messages), Some(first))),
            Ok(Ok(other)) => Ok((other, None)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Backend(
                "loading the conversation was interrupted".to_owned(),
            )),
        }
    }
}

/// Starts loading `session`'s context and, when it fits the budget, the
/// first model request of a turn.
pub(crate) fn spawn(
    inner: &Arc<Inner>,
    runner: &Arc<Runner>,
    session: &Session,
    user: &Message,
    system_prompt: Option<String>,
    tools: Vec<ToolSpec>,
) -> Prestart {
    let (tx, loaded) = oneshot::channel();
    let (inner, runner) = (Arc::clone(inner), Arc::clone(runner));
    // The runner's cached context, when it is exactly the store's.
    let cached = super::lock(&runner.context)
        .take()
        .and_then(|c| c.take_for(session, user));
    let (id, through, summary_seq) = (
        session.id.clone(),
        session.compacted_through,
        session.summary_seq,
    );
    let handle = tokio::spawn(async move {
        let context = match cached {
            Some(messages) => Ok(Context::from_messages(messages)),
            None => Context::load(inner.store.as_ref(), &id, through, summary_seq).await,
        };
        let context = match context {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(e));
                return None;
            }
        };
        if let Some(tokens) =
            context.over_budget(system_prompt.as_deref(), &inner.config.compaction)
        {
            let _ = tx.send(Ok(Loaded::NeedsCompaction { context, tokens }));
            return None;
        }
        let messages = context.into_messages();
        let request = ModelRequest {
            model: runner.provider_model.clone(),
            system_prompt,
            messages: messages.clone(),
            thinking: runner.key.thinking,
            tools,
        };
        if tx.send(Ok(Loaded::Sent(messages))).is_err() {
            return None;
        }
        Some(runner.provider.stream(request).await)
    });
    Prestart {
        loaded,
        first: FirstStep(handle),
    }
}
