//! The turn's [`Emitter`]: every event of a turn goes through it, numbered,
//! to the turn's hub (for watchers and replay) and to the caller that
//! started the turn, for as long as that caller reads.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

use crate::events::{EventKind, TurnEvent};
use crate::runtime::slots::LiveTurn;
use crate::runtime::{OnDisconnect, RuntimeConfig};
use crate::types::CancelReason;

/// How long a cancelled turn waits, in all, for a caller that does not read
/// its last events before it ends without it.
pub(crate) const END_GRACE: Duration = Duration::from_secs(1);

/// Numbers events, publishes them to the hub and forwards them to the
/// caller while the caller is there.
///
/// A send to the caller never blocks the turn for long: it races the
/// turn's cancellation, and a caller that reads nothing for
/// `stalled_reader_timeout` is treated as gone (with `on_disconnect =
/// CANCEL` the turn is cancelled `CLIENT_GONE`; with `CONTINUE` it runs on
/// without that caller, watchable with Subscribe). Once the turn is
/// cancelled, its remaining events get [`END_GRACE`] in all to reach a
/// caller that is not reading, so Stop and Delete end a turn promptly even
/// when its caller never grants HTTP/2 flow-control window.
pub(crate) struct Emitter {
    seq: u64,
    live: Arc<LiveTurn>,
    caller: Option<mpsc::Sender<Arc<TurnEvent>>>,
    heartbeat_interval: Duration,
    stalled_reader_timeout: Duration,
    on_disconnect: OnDisconnect,
    last_emit: tokio::time::Instant,
    /// Set when the emitter first sees the turn cancelled: the caller's
    /// sends stop waiting then.
    end_by: Option<tokio::time::Instant>,
    /// `TurnFinished` was emitted.
    pub(super) finished: bool,
    /// When the turn was admitted; `None` once the first model output was
    /// emitted (and `agentrt.turn.time_to_first_event` recorded).
    admitted: Option<Instant>,
}

impl Emitter {
    pub(crate) fn new(
        live: Arc<LiveTurn>,
        caller: mpsc::Sender<Arc<TurnEvent>>,
        config: &RuntimeConfig,
        on_disconnect: OnDisconnect,
        admitted: Instant,
    ) -> Self {
        Self {
            seq: 0,
            live,
            caller: Some(caller),
            heartbeat_interval: config.heartbeat_interval,
            stalled_reader_timeout: config.stalled_reader_timeout,
            on_disconnect,
            last_emit: tokio::time::Instant::now(),
            end_by: None,
            finished: false,
            admitted: Some(admitted),
        }
    }

    /// When a heartbeat is due if nothing else is emitted.
    pub(super) fn heartbeat_due(&self) -> tokio::time::Instant {
        self.last_emit + self.heartbeat_interval
    }

    /// The seq of the last event emitted.
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// A resumed turn numbers its events on from `seq`, the last one
    /// before its pause.
    pub(super) fn continue_after(&mut self, seq: u64) {
        self.seq = seq;
    }

    pub(super) async fn emit(&mut self, kind: EventKind) {
        self.last_emit = tokio::time::Instant::now();
        self.seq += 1;
        self.finished |= matches!(kind, EventKind::TurnFinished { .. });
        let metrics = crate::telemetry::metrics::get();
        metrics.relay_events.add(1, &[]);
        if matches!(
            kind,
            EventKind::Text(_) | EventKind::Reasoning(_) | EventKind::ToolUse(_)
        ) && let Some(admitted) = self.admitted.take()
        {
            metrics
                .time_to_first_event
                .record(admitted.elapsed().as_secs_f64(), &[]);
        }
        let event = Arc::new(TurnEvent {
            seq: self.seq,
            at: SystemTime::now(),
            kind,
        });
        self.live.hub.publish(Arc::clone(&event));
        let Some(tx) = self.caller.take() else { return };
        match tx.try_send(event) {
            Ok(()) => {
                self.caller = Some(tx);
                tokio::task::consume_budget().await;
            }
            // The caller went away; its stream's drop has cancelled the
            // turn (unless it asked to continue).
            Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                if self.send_waiting(&tx, event).await {
                    self.caller = Some(tx);
                }
            }
        }
    }

    /// Sends to a caller whose buffer is full, bounded as the type says.
    /// `false` when the caller is dropped.
    async fn send_waiting(
        &mut self,
        tx: &mpsc::Sender<Arc<TurnEvent>>,
        event: Arc<TurnEvent>,
    ) -> bool {
        let now = tokio::time::Instant::now();
        let stall_by = now + self.stalled_reader_timeout;
        let cancel = self.live.cancel.clone();
        loop {
            if self.end_by.is_none() && self.live.is_cancelled() {
                self.end_by = Some(now + END_GRACE);
            }
            let give_up = self.end_by.map_or(stall_by, |end| end.min(stall_by));
            tokio::select! {
                biased;
                permit = tx.reserve() => {
                    return match permit {
                        Ok(permit) => {
                            permit.send(event);
                            true
                        }
                        Err(_) => false,
                    };
                }
                () = cancel.cancelled(), if self.end_by.is_none() => {}
                () = tokio::time::sleep_until(give_up) => {
                    if self.end_by.is_none() {
                        tracing::warn!(
                            stalled_for_ms = u64::try_from(self.stalled_reader_timeout.as_millis()).unwrap_or(u64::MAX),
                            on_disconnect = %format_args!("{:?}", self.on_disconnect),
                            "the caller has read nothing for too long; treating it as gone"
                        );
                        if self.on_disconnect == OnDisconnect::Cancel {
                            self.live.cancel(CancelReason::ClientGone);
                        }
                    }
                    return false;
                }
            }
        }
    }
}
