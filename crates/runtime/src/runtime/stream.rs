//! [`TurnStream`]: the events of one turn, for the caller that started it,
//! for a watcher (Subscribe, or a retried request joining a live turn), or
//! replayed from the store (a retried request whose turn already ended).

use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};

use super::slots::{LiveTurn, WaitEnded, Wake};
use super::{EventRx, OnDisconnect};
use crate::events::{EventKind, TurnEvent};
use crate::hub::TurnHub;
use crate::types::CancelReason;

/// Follows a hub: backlog first, then live events; when the live channel
/// closes early (the watcher lagged and was detached) it re-attaches from
/// the replay, reporting a gap only if events were really lost.
#[derive(Debug)]
struct Watch {
    hub: Arc<TurnHub>,
    backlog: VecDeque<Arc<TurnEvent>>,
    live: Option<mpsc::Receiver<Arc<TurnEvent>>>,
    last_seq: u64,
}

impl Watch {
    fn new(hub: Arc<TurnHub>, after_seq: u64) -> (Self, Option<Arc<TurnEvent>>) {
        let mut watch = Self {
            hub,
            backlog: VecDeque::new(),
            live: None,
            last_seq: after_seq,
        };
        let gap = watch.attach(false);
        (watch, gap)
    }

    fn attach(&mut self, lagged: bool) -> Option<Arc<TurnEvent>> {
        let att = self.hub.attach(self.last_seq);
        self.last_seq = att.after_seq;
        self.backlog = att.backlog.into();
        self.live = att.live;
        att.gap_from.map(|first| {
            Arc::new(TurnEvent {
                seq: 0,
                at: SystemTime::now(),
                kind: EventKind::ReplayGap {
                    first_available_seq: first,
                    lagged,
                },
            })
        })
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Arc<TurnEvent>>> {
        loop {
            if let Some(event) = self.backlog.pop_front() {
                self.last_seq = event.seq;
                return Poll::Ready(Some(event));
            }
            let Some(live) = self.live.as_mut() else {
                return Poll::Ready(None);
            };
            match live.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(event)) => {
                    if event.seq <= self.last_seq {
                        continue;
                    }
                    self.last_seq = event.seq;
                    return Poll::Ready(Some(event));
                }
                Poll::Ready(None) => {
                    if let Some(gap) = self.attach(true) {
                        return Poll::Ready(Some(gap));
                    }
                }
            }
        }
    }
}

#[derive(Debug)]
enum Source {
    /// The caller that started the turn.
    Own(EventRx),
    /// A watcher of a live turn.
    Watch(Watch),
    /// Waiting for the session's next turn (Subscribe with wait_for_turn).
    Waiting {
        rx: oneshot::Receiver<Wake>,
        after_seq: u64,
    },
    /// A finished turn rebuilt from the store.
    Replay(VecDeque<Arc<TurnEvent>>),
    /// Events of its own (`Queued`, `Steered`), then a wait for the turn
    /// to follow (a queued or steering Chat's).
    Pending {
        prefix: VecDeque<Arc<TurnEvent>>,
        wait: Pending,
    },
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// A future the stream waits on for its turn.
pub(crate) struct Pending(pub(crate) Pin<Box<dyn std::future::Future<Output = Found> + Send>>);

/// What a stream waiting for its turn found.
pub(crate) enum Found {
    /// The turn is live here: follow it from after this seq.
    Live(Arc<LiveTurn>, u64),
    /// The turn ended: its events rebuilt from the store.
    Replay(Vec<Arc<TurnEvent>>),
    /// No turn to follow here (see [`WaitEnded`]).
    Ended(WaitEnded),
    /// These events first (of turn `.0` from now on, when set), then wait
    /// again.
    Then(Option<String>, Vec<Arc<TurnEvent>>, Pending),
}

/// The events of one turn: `TurnStarted` first, `TurnFinished` last.
///
/// For the caller that started the turn, dropping the stream before the end
/// means the caller went away: with [`OnDisconnect::Cancel`] the turn is
/// cancelled (reason `ClientGone`) and its partial output stored. Watcher
/// and replay streams never affect the turn.
#[derive(Debug)]
pub struct TurnStream {
    session_id: String,
    turn_id: String,
    source: Source,
    /// Cancelled with `ClientGone` if dropped before the final event.
    cancel_on_drop: Option<Arc<LiveTurn>>,
    finished: bool,
    /// Why a wait for the next turn ended without one here (the session
    /// was deleted, or its turn was admitted on another replica).
    wait_ended: Option<WaitEnded>,
    /// Counts a watching stream in `agentrt.watchers` while it is open.
    _watcher: Option<crate::telemetry::metrics::LiveGuard>,
}

impl TurnStream {
    pub(crate) fn own(
        session_id: String,
        turn_id: String,
        rx: EventRx,
        live: Arc<LiveTurn>,
        on_disconnect: OnDisconnect,
    ) -> Self {
        Self {
            session_id,
            turn_id,
            source: Source::Own(rx),
            cancel_on_drop: (on_disconnect == OnDisconnect::Cancel).then_some(live),
            finished: false,
            wait_ended: None,
            _watcher: None,
        }
    }

    /// The turn this stream's caller started, when dropping the stream
    /// ends it.
    pub(crate) fn live(&self) -> Option<Arc<LiveTurn>> {
        self.cancel_on_drop.clone()
    }

    /// Watches `live` from `after_seq`.
    pub(crate) fn attached(session_id: String, live: &LiveTurn, after_seq: u64) -> Self {
        let (watch, gap) = Watch::new(Arc::clone(&live.hub), after_seq);
        let mut watch = watch;
        if let Some(gap) = gap {
            watch.backlog.push_front(gap);
        }
        Self {
            session_id,
            turn_id: live.turn_id.clone(),
            source: Source::Watch(watch),
            cancel_on_drop: None,
            finished: false,
            wait_ended: None,
            _watcher: Some(crate::telemetry::metrics::LiveGuard::watcher()),
        }
    }

    pub(crate) fn waiting(session_id: String, rx: oneshot::Receiver<Wake>, after_seq: u64) -> Self {
        Self {
            session_id,
            turn_id: String::new(),
            source: Source::Waiting { rx, after_seq },
            cancel_on_drop: None,
            finished: false,
            wait_ended: None,
            _watcher: Some(crate::telemetry::metrics::LiveGuard::watcher()),
        }
    }

    /// `prefix` (events of the stream's own), then the turn `wait` finds.
    pub(crate) fn pending(
        session_id: String,
        turn_id: String,
        prefix: Vec<Arc<TurnEvent>>,
        wait: Pending,
    ) -> Self {
        Self {
            session_id,
            turn_id,
            source: Source::Pending {
                prefix: prefix.into(),
                wait,
            },
            cancel_on_drop: None,
            finished: false,
            wait_ended: None,
            _watcher: Some(crate::telemetry::metrics::LiveGuard::watcher()),
        }
    }

    pub(crate) fn replayed(
        session_id: String,
        turn_id: String,
        events: Vec<Arc<TurnEvent>>,
    ) -> Self {
        Self {
            session_id,
            turn_id,
            source: Source::Replay(events.into()),
            cancel_on_drop: None,
            finished: false,
            wait_ended: None,
            _watcher: None,
        }
    }

    /// The session the turn runs in, as its client knows it.
    pub fn session_id(&self) -> &str {
        super::keys::client_id(&self.session_id)
    }

    /// The turn's id (empty while waiting for a turn to start).
    pub fn turn_id(&self) -> &str {
        &self.turn_id
    }

    /// True once the final event was yielded.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// True when the stream ended without a turn because the session was
    /// deleted while it waited for one (`Subscribe` with `wait_for_turn`).
    pub fn session_deleted(&self) -> bool {
        self.wait_ended == Some(WaitEnded::SessionDeleted)
    }

    /// Where the session's next turn runs when this stream, waiting for it
    /// (`Subscribe` with `wait_for_turn`), ended because another replica
    /// admitted it: follow it there.
    pub fn moved_to(&self) -> Option<&crate::store::Lease> {
        match &self.wait_ended {
            Some(WaitEnded::Elsewhere(lease)) => Some(lease),
            Some(WaitEnded::SessionDeleted | WaitEnded::NotRun(..)) | None => None,
        }
    }

    /// Why the queued message this stream waited for did not run (it was
    /// cleared from the inbox, or could not be admitted).
    pub fn not_run(&self) -> Option<(crate::events::ErrorCode, &str)> {
        match &self.wait_ended {
            Some(WaitEnded::NotRun(code, why)) => Some((*code, why.as_str())),
            Some(WaitEnded::SessionDeleted | WaitEnded::Elsewhere(_)) | None => None,
        }
    }
}

impl Stream for TurnStream {
    type Item = Arc<TurnEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        let polled = loop {
            match &mut this.source {
                Source::Own(rx) => break rx.poll_recv(cx),
                Source::Watch(watch) => break watch.poll_next(cx),
                Source::Replay(events) => break Poll::Ready(events.pop_front()),
                Source::Pending { prefix, wait } => {
                    if let Some(event) = prefix.pop_front() {
                        return Poll::Ready(Some(event));
                    }
                    let found = match wait.0.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(found) => found,
                    };
                    match found {
                        Found::Live(live, after_seq) => {
                            let attached =
                                TurnStream::attached(this.session_id.clone(), &live, after_seq);
                            this.turn_id = attached.turn_id.clone();
                            this.source = attached_source(attached);
                        }
                        Found::Replay(events) => this.source = Source::Replay(events.into()),
                        Found::Ended(ended) => {
                            this.wait_ended = Some(ended);
                            return Poll::Ready(None);
                        }
                        Found::Then(turn_id, events, next) => {
                            if let Some(turn_id) = turn_id {
                                this.turn_id = turn_id;
                            }
                            this.source = Source::Pending {
                                prefix: events.into(),
                                wait: next,
                            };
                        }
                    }
                }
                Source::Waiting { rx, after_seq } => match Pin::new(rx).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(_)) => return Poll::Ready(None),
                    Poll::Ready(Ok(Err(ended))) => {
                        this.wait_ended = Some(ended);
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Ok(Ok(live))) => {
                        let after_seq = *after_seq;
                        let attached =
                            TurnStream::attached(this.session_id.clone(), &live, after_seq);
                        this.turn_id = attached.turn_id.clone();
                        this.source = attached_source(attached);
                    }
                },
            }
        };
        if let Poll::Ready(Some(event)) = &polled
            && event.is_final()
        {
            this.finished = true;
        }
        polled
    }
}

fn attached_source(mut stream: TurnStream) -> Source {
    std::mem::replace(&mut stream.source, Source::Replay(VecDeque::new()))
}

impl Drop for TurnStream {
    fn drop(&mut self) {
        if !self.finished
            && let Some(live) = &self.cancel_on_drop
        {
            live.cancel(CancelReason::ClientGone);
        }
    }
}
