//! Per-turn event fan-out: every event of a turn is published here once; the
//! hub keeps a bounded replay (by count and bytes, oldest dropped first) and
//! forwards to attached watchers without ever blocking the turn.
//!
//! A watcher whose buffer is full is detached (its channel closes without the
//! final event). Its reader then re-attaches from the replay with the last seq
//! it saw: if the replay still holds the next event nothing is lost, otherwise
//! the attach reports a gap. So a slow watcher costs the turn one failed
//! `try_send`, never a wait.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

use crate::events::TurnEvent;

/// Replay bounds of one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayLimits {
    /// Most events kept (default 65,536).
    pub max_events: usize,
    /// Most bytes kept, by [`TurnEvent::approx_size`] (default 8 MiB).
    pub max_bytes: usize,
    /// Per-watcher live buffer (default 1,024 events).
    pub watcher_buffer: usize,
}

impl Default for ReplayLimits {
    fn default() -> Self {
        Self {
            max_events: 65_536,
            max_bytes: 8 << 20,
            watcher_buffer: 1_024,
        }
    }
}

/// The result of [`TurnHub::attach`].
#[derive(Debug)]
pub struct Attachment {
    /// The `after_seq` the attachment starts after: the one asked for, or
    /// the last published seq when that was beyond it.
    pub after_seq: u64,
    /// Set when events after `after_seq` were already dropped from the
    /// replay: the seq of the first event still available (the backlog then
    /// starts there).
    pub gap_from: Option<u64>,
    /// Replayed events, in order.
    pub backlog: Vec<Arc<TurnEvent>>,
    /// Live events after the backlog; `None` when the turn already finished
    /// (the backlog then ends with the final event, unless it was dropped).
    pub live: Option<mpsc::Receiver<Arc<TurnEvent>>>,
}

#[derive(Debug, Default)]
struct State {
    replay: VecDeque<Arc<TurnEvent>>,
    bytes: usize,
    watchers: Vec<mpsc::Sender<Arc<TurnEvent>>>,
    last_seq: u64,
    finished: bool,
}

/// The fan-out of one turn.
#[derive(Debug)]
pub struct TurnHub {
    limits: ReplayLimits,
    state: Mutex<State>,
}

impl TurnHub {
    /// An empty hub.
    pub fn new(limits: ReplayLimits) -> Self {
        Self {
            limits,
            state: Mutex::new(State::default()),
        }
    }

    // A panic while holding the lock cannot leave the state inconsistent in a
    // way that matters more than losing the turn's watchers, so poisoning is
    // ignored rather than propagated into every later turn event.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `event` and forwards it to every watcher that has room.
    pub fn publish(&self, event: Arc<TurnEvent>) {
        let mut state = self.lock();
        let size = event.approx_size();
        state.bytes += size;
        state.last_seq = event.seq;
        state.replay.push_back(Arc::clone(&event));
        while state.replay.len() > self.limits.max_events
            || (state.bytes > self.limits.max_bytes && !state.replay.is_empty())
        {
            if let Some(old) = state.replay.pop_front() {
                state.bytes -= old.approx_size();
            }
        }
        if event.is_final() {
            state.finished = true;
        }
        state
            .watchers
            .retain(|tx| tx.try_send(Arc::clone(&event)).is_ok());
        if state.finished {
            // Dropping the senders ends every live stream right after the
            // final event.
            state.watchers.clear();
        }
    }

    /// Attaches a watcher that wants events with seq > `after_seq`.
    pub fn attach(&self, after_seq: u64) -> Attachment {
        let mut state = self.lock();
        // Nobody has seen events that were not published yet: a watcher
        // claiming more starts from now, and so never misses the end.
        let after_seq = after_seq.min(state.last_seq);
        // With an empty replay (everything evicted, or nothing published
        // yet) the next live event is the first one available.
        let first_available = state
            .replay
            .front()
            .map_or(state.last_seq.saturating_add(1), |e| e.seq);
        let gap_from = (first_available > after_seq.saturating_add(1)).then_some(first_available);
        let backlog: Vec<_> = state
            .replay
            .iter()
            .filter(|e| e.seq > after_seq)
            .cloned()
            .collect();
        let live = if state.finished {
            None
        } else {
            let (tx, rx) = mpsc::channel(self.limits.watcher_buffer);
            state.watchers.push(tx);
            Some(rx)
        };
        Attachment {
            after_seq,
            gap_from,
            backlog,
            live,
        }
    }

    /// Ends the hub without a final event (the turn never started): live
    /// watchers' streams close and later attaches get nothing.
    pub fn abort(&self) {
        let mut state = self.lock();
        state.finished = true;
        state.watchers.clear();
    }

    /// Live watchers attached now.
    pub fn watcher_count(&self) -> usize {
        let mut state = self.lock();
        state.watchers.retain(|tx| !tx.is_closed());
        state.watchers.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::events::EventKind;

    fn text(seq: u64, s: &str) -> Arc<TurnEvent> {
        Arc::new(TurnEvent {
            seq,
            at: SystemTime::now(),
            kind: EventKind::Text(s.to_owned()),
        })
    }

    #[test]
    fn late_watcher_gets_replay_then_live_events() {
        let hub = TurnHub::new(ReplayLimits::default());
        hub.publish(text(1, "a"));
        hub.publish(text(2, "b"));
        let mut att = hub.attach(0);
        assert_eq!(att.gap_from, None);
        assert_eq!(
            att.backlog.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2]
        );
        hub.publish(text(3, "c"));
        assert_eq!(att.live.as_mut().unwrap().try_recv().unwrap().seq, 3);
    }

    #[test]
    fn attach_after_seq_skips_what_the_watcher_has() {
        let hub = TurnHub::new(ReplayLimits::default());
        for seq in 1..=5 {
            hub.publish(text(seq, "x"));
        }
        let att = hub.attach(2);
        assert_eq!(
            att.backlog.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [3, 4, 5]
        );
    }

    #[test]
    fn evicted_replay_reports_a_gap_at_the_first_available_seq() {
        let limits = ReplayLimits {
            max_events: 3,
            ..ReplayLimits::default()
        };
        let hub = TurnHub::new(limits);
        for seq in 1..=10 {
            hub.publish(text(seq, "x"));
        }
        let att = hub.attach(0);
        assert_eq!(att.gap_from, Some(8));
        assert_eq!(
            att.backlog.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [8, 9, 10]
        );
    }

    #[test]
    fn a_full_watcher_is_detached_without_blocking_publish() {
        let limits = ReplayLimits {
            watcher_buffer: 2,
            ..ReplayLimits::default()
        };
        let hub = TurnHub::new(limits);
        let mut att = hub.attach(0);
        for seq in 1..=300 {
            hub.publish(text(seq, "x"));
        }
        let rx = att.live.as_mut().unwrap();
        assert_eq!(rx.try_recv().unwrap().seq, 1);
        assert_eq!(rx.try_recv().unwrap().seq, 2);
        // Closed: the reader re-attaches from the replay.
        assert!(rx.try_recv().is_err());
        assert_eq!(hub.watcher_count(), 0);
        let again = hub.attach(2);
        assert_eq!(again.backlog.first().unwrap().seq, 3);
    }

    #[test]
    fn byte_budget_drops_oldest_events() {
        let limits = ReplayLimits {
            max_bytes: 2_000,
            ..ReplayLimits::default()
        };
        let hub = TurnHub::new(limits);
        let big = "y".repeat(900);
        for seq in 1..=5 {
            hub.publish(text(seq, &big));
        }
        let att = hub.attach(0);
        assert!(att.gap_from.is_some());
        assert!(att.backlog.len() < 5);
        assert_eq!(att.backlog.last().unwrap().seq, 5);
    }
}
