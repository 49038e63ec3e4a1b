//! How long a connection lives: [`ConnState`] (shared with every request
//! of the connection through [`ConnInfo`](super::ConnInfo)) counts its open
//! calls and whether one was authenticated; [`Lifetime`] (inside the
//! connection's I/O) closes it when it was idle for `idle_timeout`, when
//! `max_connection_age` plus its grace has passed (tonic sends the GOAWAY
//! at the age itself), or when it was evicted from the pool of
//! connections that never authenticated.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::pool::PoolSlot;

/// What one connection's requests share.
#[derive(Debug)]
pub(crate) struct ConnState {
    open: AtomicUsize,
    /// When the last call ended (or the connection was accepted).
    idle_since: Mutex<Instant>,
    /// The connection's place among those that never authenticated; taken
    /// out by the first authenticated call.
    unauthenticated: Mutex<Option<PoolSlot>>,
}

impl ConnState {
    pub(super) fn new(unauthenticated: PoolSlot) -> Self {
        Self {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            unauthenticated: Mutex::new(Some(unauthenticated)),
        }
    }

    /// A call began; it counts as open until the guard is dropped.
    pub(super) fn open_call(self: &Arc<Self>) -> OpenCall {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenCall(Arc::clone(self))
    }

    /// An authenticated call arrived: the connection leaves the pool of
    /// those that never authenticated.
    pub(super) fn authenticated(&self) {
        let slot = self
            .unauthenticated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(slot);
    }

    /// Whether the connection was idle for at least `idle`; if not, when to
    /// look again.
    fn idle_for(&self, idle: Duration) -> Result<(), Instant> {
        let now = Instant::now();
        if self.open.load(Ordering::Acquire) > 0 {
            return Err(now + idle);
        }
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(since) >= idle {
            Ok(())
        } else {
            Err(since + idle)
        }
    }
}

/// One open call of a connection, given back on drop (`ConnState::open_call`).
#[derive(Debug)]
pub struct OpenCall(Arc<ConnState>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

/// Why a connection was closed by its [`Lifetime`].
#[derive(Debug, Clone, Copy)]
enum Closed {
    Idle,
    Aged,
    Evicted,
}

/// The timers of one connection, polled from its reads and writes (hyper
/// always has one of them pending, so a timer that fires wakes it).
#[derive(Debug)]
pub(super) struct Lifetime {
    state: Arc<ConnState>,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    /// Accepted + max_connection_age + grace.
    hard_close: Option<Pin<Box<Sleep>>>,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
    closed: Option<Closed>,
}

impl Lifetime {
    pub(super) fn new(
        state: Arc<ConnState>,
        evicted: WaitForCancellationFutureOwned,
        idle_timeout: Duration,
        max_age: Duration,
        grace: Duration,
    ) -> Self {
        let now = Instant::now();
        Self {
            state,
            idle: (!idle_timeout.is_zero()).then(|| {
                (
                    idle_timeout,
                    Box::pin(tokio::time::sleep_until(now + idle_timeout)),
                )
            }),
            hard_close: (!max_age.is_zero())
                .then(|| Box::pin(tokio::time::sleep_until(now + max_age + grace))),
            evicted: Box::pin(evicted),
            closed: None,
        }
    }

    /// The shared state.
    pub(super) fn state(&self) -> &Arc<ConnState> {
        &self.state
    }

    /// An error once the connection must close (then always).
    pub(super) fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if self.closed.is_none() {
            self.closed = self.poll_close(cx);
            if let Some(why) = self.closed {
                tracing::debug!(reason = ?why, "closing a connection");
            }
        }
        match self.closed {
            None => Ok(()),
            Some(why) => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                match why {
                    Closed::Idle => "closed: idle for transport.idle_timeout",
                    Closed::Aged => {
                        "closed: transport.max_connection_age plus max_connection_age_grace passed"
                    }
                    Closed::Evicted => {
                        "closed: evicted from the connections that never authenticated \
                         (transport.max_unauthenticated_connections)"
                    }
                },
            )),
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Option<Closed> {
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Some(Closed::Evicted);
        }
        if let Some(hard) = self.hard_close.as_mut()
            && hard.as_mut().poll(cx).is_ready()
        {
            return Some(Closed::Aged);
        }
        if let Some((idle, sleep)) = self.idle.as_mut() {
            // Re-armed until the connection really was idle that long.
            while sleep.as_mut().poll(cx).is_ready() {
                match self.state.idle_for(*idle) {
                    Ok(()) => return Some(Closed::Idle),
                    Err(next) => sleep.as_mut().reset(next),
                }
            }
        }
        None
    }
}

/// Wraps a poll so that it fails once the lifetime says close.
pub(super) fn guarded<T>(
    life: &mut Lifetime,
    cx: &mut Context<'_>,
    poll: impl FnOnce(&mut Context<'_>) -> Poll<std::io::Result<T>>,
) -> Poll<std::io::Result<T>> {
    if let Err(err) = life.check(cx) {
        return Poll::Ready(Err(err));
    }
    poll(cx)
}
