//! [`EvictingPool`]: a bounded pool for what callers without credentials
//! hold (connections that never authenticated, half-open calls to the
//! anonymous services). At the cap the oldest member is told to leave
//! (its [`PoolSlot::evicted`] completes) instead of the newcomer being
//! refused: an abuser who fills the pool only pushes out its own old
//! members, never keeps a new caller out.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

#[derive(Debug)]
struct Members {
    max: usize,
    next: u64,
    /// Oldest first; ids increase.
    members: VecDeque<(u64, CancellationToken)>,
}

/// A pool of at most `max` members that evicts its oldest to admit a new
/// one.
#[derive(Debug, Clone)]
pub(super) struct EvictingPool {
    what: &'static str,
    inner: Arc<Mutex<Members>>,
}

/// One member's place, given back on drop.
#[derive(Debug)]
pub(super) struct PoolSlot {
    id: u64,
    token: CancellationToken,
    inner: Arc<Mutex<Members>>,
}

impl EvictingPool {
    /// A pool of `max` (at least 1) members; `what` names them in logs.
    pub(super) fn new(what: &'static str, max: usize) -> Self {
        Self {
            what,
            inner: Arc::new(Mutex::new(Members {
                max: max.max(1),
                next: 0,
                members: VecDeque::new(),
            })),
        }
    }

    /// The cap.
    pub(super) fn max(&self) -> usize {
        self.lock().max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Members> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new member, evicting the oldest when full.
    pub(super) fn join(&self) -> PoolSlot {
        let mut m = self.lock();
        if m.members.len() >= m.max
            && let Some((_, oldest)) = m.members.pop_front()
        {
            oldest.cancel();
            tracing::debug!(
                pool = self.what,
                max = m.max,
                "evicted the oldest member of a full pool"
            );
        }
        let id = m.next;
        m.next += 1;
        let token = CancellationToken::new();
        m.members.push_back((id, token.clone()));
        PoolSlot {
            id,
            token,
            inner: Arc::clone(&self.inner),
        }
    }

    /// Members now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().members.len()
    }
}

impl PoolSlot {
    /// Completes when this member was evicted.
    pub(super) fn evicted(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// Whether this member was evicted.
    #[cfg(test)]
    pub(super) fn is_evicted(&self) -> bool {
        self.token.is_cancelled()
    }
}

impl Drop for PoolSlot {
    fn drop(&mut self) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(at) = m.members.binary_search_by_key(&self.id, |(id, _)| *id) {
            m.members.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pool_evicts_its_oldest_member_and_slots_are_given_back() {
        let pool = EvictingPool::new("test", 2);
        let a = pool.join();
        let b = pool.join();
        assert!(!a.is_evicted() && !b.is_evicted());
        let c = pool.join();
        assert!(a.is_evicted(), "the oldest is evicted");
        assert!(!b.is_evicted() && !c.is_evicted());
        assert_eq!(pool.len(), 2);
        drop(b);
        assert_eq!(pool.len(), 1);
        let d = pool.join();
        assert!(!c.is_evicted() && !d.is_evicted(), "room was given back");
        drop(a);
        assert_eq!(pool.len(), 2, "an evicted slot is no longer counted");
    }
}
