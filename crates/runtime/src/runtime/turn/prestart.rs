//! The pre-start of a turn's first model request, during admission.
//!
//! The model must not be called before the turn's user message is durable
//! (see `admission`), but loading the context need not wait: once the
//! session's slot is held nothing else writes to it, so its record
//! (re-read under the slot) says exactly which messages precede the new
//! one. So while admission writes the user message, a task started here
//! loads that context — from the runner's cache, or from the store, on the
//! calling thread when short — and, unless it needs compaction first,
//! builds the model request; it sends the request once admission says the
//! write is durable. If the write fails, admission is rejected and dropping
//! the [`Prestart`] aborts the task before it called the model.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::step_end::StepEnd;
use crate::model::{ModelError, ModelRequest, ModelStream, Reservation, ToolSpec};
use crate::runtime::Inner;
use crate::runtime::context::Context;
use crate::runtime::media::{self, NotShown};
use crate::runtime::runners::Runner;
use crate::store::StoreError;
use crate::types::{Message, Session};

/// The loaded context, as the prestart task found it.
pub(crate) enum Loaded {
    /// Within the budget: these messages were sent with the first model
    /// request (whose start is the [`FirstStep`]), with what the model was
    /// not shown of their media.
    Sent(Arc<Vec<Message>>, NotShown),
    /// Over the budget (estimated at `tokens`): the turn compacts before
    /// its first model request.
    NeedsCompaction {
        /// The loaded context (boxed: the rare variant is the large one).
        context: Box<Context>,
        /// Its estimated size.
        tokens: u64,
    },
}

/// The first model request, started during admission (once the
/// `BeforeModelCall` hooks let it).
pub(crate) struct FirstStep(JoinHandle<Option<Result<ModelStream, StepEnd>>>);

impl Drop for FirstStep {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Future for FirstStep {
    type Output = Result<ModelStream, StepEnd>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|joined| match joined {
            Ok(Some(started)) => started,
            // The task sent `NeedsCompaction` (never awaited then), failed
            // to load, or panicked.
            Ok(None) | Err(_) => Err(StepEnd::Failed(ModelError::Unavailable(
                "the model request could not be started".to_owned(),
            ))),
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
            Ok(Ok(Loaded::Sent(messages, not_shown))) => {
                Ok((Loaded::Sent(messages, not_shown), Some(first)))
            }
            Ok(Ok(other)) => Ok((other, None)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Backend(
                "loading the conversation was interrupted".to_owned(),
            )),
        }
    }
}

/// What the first model request carries besides the context: the tools
/// offered, the call's `max_output_tokens`, and the capacity admission
/// reserved for the step, which is given back if the request is never sent
/// (a rejected write, or a context that must be compacted first).
#[derive(Debug, Clone)]
pub(crate) struct FirstRequest {
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) reservation: Option<Reservation>,
    /// The first model step's `chat` span: the request (and its
    /// `traceparent`) starts under it here, the turn relays under it.
    pub(crate) span: tracing::Span,
    /// The turn, as the operator's hooks are told of it.
    pub(crate) turn: crate::hooks::TurnContext,
}

/// Starts loading `session`'s context (the messages before `user`, which
/// must be its next seq) and, when it fits the budget, building the first
/// model request of a turn, which is sent once `durable` fires (the user
/// message is stored and flushed); never when it is dropped.
pub(crate) fn spawn(
    inner: &Arc<Inner>,
    runner: &Arc<Runner>,
    session: &Session,
    user: Message,
    system_prompt: Option<String>,
    first: FirstRequest,
    durable: oneshot::Receiver<()>,
) -> Prestart {
    let (tx, loaded) = oneshot::channel();
    let (shared, runner) = (Arc::clone(inner), Arc::clone(runner));
    // The runner's cached context, when it is exactly the store's.
    let cached = runner.take_context(session, &user);
    let session = session.clone();
    let span = first.span.clone();
    // Tracked with the turns: shutdown and drain wait for it.
    let handle = inner.lifecycle.spawn_turn(tracing::Instrument::instrument(
        async move {
            let context = match cached {
                Some(messages) => Ok(Context::from_messages(messages)),
                None => Context::load(shared.store.as_ref(), &session)
                    .await
                    .map(|mut context| {
                        context.tail.push(user);
                        context
                    }),
            };
            let context = match context {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return None;
                }
            };
            if let Some(tokens) =
                context.over_budget(system_prompt.as_deref(), &shared.config.compaction)
            {
                let _ = tx.send(Ok(Loaded::NeedsCompaction {
                    context: Box::new(context),
                    tokens,
                }));
                return None;
            }
            let messages = Arc::new(context.into_messages());
            let support = runner
                .model
                .provider
                .media_support(&runner.model.provider_model);
            let (shown, not_shown) =
                media::for_model(&shared, &session.owner, support, Arc::clone(&messages)).await;
            let request = ModelRequest {
                model: runner.model.provider_model.clone(),
                system_prompt,
                messages: shown,
                thinking: runner.key.thinking,
                tools: first.tools,
                max_output_tokens: first.max_output_tokens,
                reservation: first.reservation,
            };
            // The hooks are asked while the user message is made durable;
            // the model is called only after both. The turn takes the
            // context as soon as it is durable, and waits for the request
            // where Stop, the deadline and heartbeats reach it.
            let gate = crate::runtime::hooks::before_model_call(
                &shared,
                &first.turn,
                1,
                request.messages.len(),
                &request.tools,
            );
            let loaded = async move {
                durable.await.is_ok() && tx.send(Ok(Loaded::Sent(messages, not_shown))).is_ok()
            };
            let (loaded, gate) = tokio::join!(loaded, gate);
            if !loaded {
                return None;
            }
            if let Err(stop) = gate {
                return Some(Err(StepEnd::Hook(stop)));
            }
            Some(
                runner
                    .model
                    .provider
                    .stream(request)
                    .await
                    .map_err(StepEnd::Failed),
            )
        },
        span,
    ));
    Prestart {
        loaded,
        first: FirstStep(handle),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::Ordering;

    use async_trait::async_trait;
    use futures::StreamExt as _;

    use super::*;
    use crate::error::RuntimeError;
    use crate::events::EventKind;
    use crate::model::{ModelEvent, ModelProvider, Models};
    use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
    use crate::store::{MemoryStore, Store};
    use crate::types::{ContentBlock, NewSession, Principal, StopReason};

    /// Records each request's message texts, and whether its last message
    /// was already in the store when the model was called; answers "ok".
    #[derive(Debug, Default)]
    struct Probe {
        requests: Mutex<Vec<Vec<(u64, String)>>>,
        stored_before_call: Mutex<Vec<bool>>,
        store: std::sync::OnceLock<(Arc<MemoryStore>, String)>,
    }

    #[async_trait]
    impl ModelProvider for Probe {
        async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
            let last = request.messages.last().expect("a user message");
            let (store, session) = self.store.get().expect("the store and session");
            let history = store.history(session, 0, 1_000, true).await.unwrap();
            let stored = history.iter().any(|m| m.body.id == last.body.id);
            self.stored_before_call.lock().unwrap().push(stored);
            let texts = request
                .messages
                .iter()
                .map(|m| (m.seq, crate::types::flatten_text(&m.body.content)))
                .collect();
            self.requests.lock().unwrap().push(texts);
            Ok(Box::pin(futures::stream::iter([
                Ok(ModelEvent::TextDelta("ok".into())),
                Ok(ModelEvent::Finished(StopReason::Stop)),
            ])))
        }
    }

    /// A runtime whose `probe` model checks the store, and a session in it.
    async fn runtime() -> (Runtime, Arc<MemoryStore>, Arc<Probe>, String) {
        let store = Arc::new(MemoryStore::new());
        let probe = Arc::new(Probe::default());
        let mut models = Models::with_builtin();
        models.insert("probe", Arc::clone(&probe) as Arc<dyn ModelProvider>);
        let rt = Runtime::open(
            RuntimeConfig::default(),
            Arc::clone(&store) as Arc<dyn Store>,
            models,
        )
        .await
        .unwrap();
        let id = rt
            .create_session(&Principal::local(), NewSession::default())
            .await
            .unwrap()
            .id;
        probe.store.set((Arc::clone(&store), id.clone())).unwrap();
        (rt, store, probe, id)
    }

    fn say(session_id: &str, text: &str) -> ChatInput {
        ChatInput {
            session_id: session_id.to_owned(),
            content: vec![ContentBlock::text(text)],
            model: Some("probe/m".to_owned()),
            ..ChatInput::default()
        }
    }

    #[tokio::test]
    async fn each_request_holds_exactly_the_stored_history_and_the_new_message() {
        let (rt, store, probe, id) = runtime().await;
        let who = Principal::local();
        for i in 1..=4u64 {
            let events: Vec<_> = rt
                .chat(&who, say(&id, &format!("q{i}")))
                .await
                .unwrap()
                .collect()
                .await;
            assert!(matches!(
                events.last().unwrap().kind,
                EventKind::TurnFinished { .. }
            ));
            let stored = store.history(&id, 0, 100, true).await.unwrap();
            let sent = probe.requests.lock().unwrap().last().cloned().unwrap();
            // Everything stored before this turn's answer, in order.
            let expected: Vec<(u64, String)> = stored[..stored.len() - 1]
                .iter()
                .map(|m| (m.seq, crate::types::flatten_text(&m.body.content)))
                .collect();
            assert_eq!(sent, expected, "turn {i}");
            assert_eq!(sent.last().unwrap(), &(2 * i - 1, format!("q{i}")));
        }
        // docs/contract.md §3.3: the user message is stored before the model is called.
        assert_eq!(*probe.stored_before_call.lock().unwrap(), [true; 4]);
    }

    #[tokio::test]
    async fn a_failed_write_rejects_the_turn_and_never_calls_the_model() {
        let (rt, store, probe, id) = runtime().await;
        let who = Principal::local();
        store.fail_begin_turn.store(true, Ordering::SeqCst);
        let rejected = rt.chat(&who, say(&id, "lost?")).await;
        assert!(
            matches!(rejected, Err(RuntimeError::Store(_))),
            "{rejected:?}"
        );
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(probe.requests.lock().unwrap().is_empty());
        assert!(store.history(&id, 0, 10, true).await.unwrap().is_empty());

        // Nothing left behind: the session is free and the next turn works.
        store.fail_begin_turn.store(false, Ordering::SeqCst);
        let events: Vec<_> = rt
            .chat(&who, say(&id, "again"))
            .await
            .unwrap()
            .collect()
            .await;
        assert!(matches!(
            events.last().unwrap().kind,
            EventKind::TurnFinished { .. }
        ));
        let history = store.history(&id, 0, 10, true).await.unwrap();
        assert_eq!(history.len(), 2);
        assert_eq!(probe.requests.lock().unwrap().last().unwrap().len(), 1);
    }
}
