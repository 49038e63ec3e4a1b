//! Per-peer-address caps, shared by the accept loop (connections per
//! address) and the request limits (requests per address waiting for their
//! body): a [`PeerSlot`] holds one place and gives it back on drop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Connections per peer address, when capped.
#[derive(Debug, Clone)]
pub(super) struct PeerCounts {
    max: usize,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place in [`PeerCounts`], given back on drop.
#[derive(Debug)]
pub(super) struct PeerSlot {
    ip: IpAddr,
    counts: Option<Arc<Mutex<HashMap<IpAddr, usize>>>>,
}

impl PeerCounts {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            counts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The cap (0: none).
    pub(super) fn max(&self) -> usize {
        self.max
    }

    pub(super) fn claim(&self, ip: IpAddr) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        if self.max == 0 {
            return Some(PeerSlot { ip, counts: None });
        }
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            ip,
            counts: Some(Arc::clone(&self.counts)),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some(counts) = &self.counts {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = counts.get_mut(&self.ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&self.ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_slots_are_capped_and_given_back() {
        let peers = PeerCounts::new(2);
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let a = peers.claim(ip).unwrap();
        let _b = peers.claim(ip).unwrap();
        assert!(peers.claim(ip).is_none());
        assert!(peers.claim("127.0.0.1".parse().unwrap()).is_some());
        drop(a);
        assert!(peers.claim(ip).is_some());
    }
}
