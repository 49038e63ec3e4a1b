//! [`TurnStream`]: the Chat caller's view of its turn.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;

use super::{EventRx, LiveTurn};
use crate::events::TurnEvent;
use crate::types::CancelReason;

/// The events of one turn, for the caller that started it: `TurnStarted`
/// first, `TurnFinished` last, seqs 1..n without gaps.
///
/// Dropping the stream before the end means the caller went away: the turn
/// is cancelled with reason `ClientGone` and its partial output stored.
#[derive(Debug)]
pub struct TurnStream {
    session_id: String,
    turn_id: String,
    rx: EventRx,
    live: Arc<LiveTurn>,
    finished: bool,
}

impl TurnStream {
    pub(crate) fn new(session_id: String, turn_id: String, rx: EventRx, live: Arc<LiveTurn>) -> Self {
        Self {
            session_id,
            turn_id,
            rx,
            live,
            finished: false,
        }
    }

    /// The session the turn runs in.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The turn's id.
    pub fn turn_id(&self) -> &str {
        &self.turn_id
    }
}

impl Stream for TurnStream {
    type Item = Arc<TurnEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(event)) = &polled {
            if event.is_final() {
                self.finished = true;
            }
        }
        polled
    }
}

impl Drop for TurnStream {
    fn drop(&mut self) {
        if !self.finished {
            self.live.cancel(CancelReason::ClientGone);
        }
    }
}
