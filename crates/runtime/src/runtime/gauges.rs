//! The gauges read off the runtime's state when metrics are collected
//! (never on the hot path): cached runners, the store's health as the
//! pinger last saw it, and — on a shared store — the session leases this
//! replica holds.
//!
//! Every callback holds a weak reference, so the meter provider does not
//! keep a stopped runtime alive; once it is gone the gauges report
//! nothing.

use std::sync::Arc;

use opentelemetry::metrics::Meter;

use super::Runtime;
use super::store_health::StoreHealth;
use crate::telemetry::metrics::METER;

/// Registers the runtime's gauges with the global meter provider.
pub(super) fn register(runtime: &Runtime) {
    let meter = opentelemetry::global::meter(METER);
    runners(&meter, runtime);
    store(&meter, runtime);
    if runtime.inner.shared {
        leases(&meter, runtime);
    }
}

fn runners(meter: &Meter, runtime: &Runtime) {
    let weak = Arc::downgrade(&runtime.inner);
    let _gauge = meter
        .u64_observable_gauge("agentrt.runners.cached")
        .with_unit("{runner}")
        .with_description("Session runners cached in memory")
        .with_callback(move |observer| {
            if let Some(inner) = weak.upgrade() {
                observer.observe(inner.runners.len() as u64, &[]);
            }
        })
        .build();
}

/// `agentrt.store.reachable`: 1 while the store answers its pings in time,
/// 0 while a shared store (PostgreSQL) does not. `agentrt.store.writable`:
/// 1 while new turns may write, 0 while the store is unreachable, its
/// disk is under the reserve, or it failed for good (sled).
fn store(meter: &Meter, runtime: &Runtime) {
    let weak = Arc::downgrade(&runtime.inner);
    let _reachable = meter
        .u64_observable_gauge("agentrt.store.reachable")
        .with_description("1 while the store answers its pings (every second), 0 while it does not")
        .with_callback(move |observer| {
            if let Some(inner) = weak.upgrade() {
                let health = inner.health.now();
                observer.observe(u64::from(health != StoreHealth::Unreachable), &[]);
            }
        })
        .build();
    let weak = Arc::downgrade(&runtime.inner);
    let _writable = meter
        .u64_observable_gauge("agentrt.store.writable")
        .with_description(
            "1 while the store takes new turns' writes; 0 while it is unreachable, out of disk \
             or failed",
        )
        .with_callback(move |observer| {
            if let Some(inner) = weak.upgrade() {
                let health = inner.health.now();
                observer.observe(u64::from(health == StoreHealth::Writable), &[]);
            }
        })
        .build();
}

/// `agentrt.leases.held`: the session leases this replica holds and
/// renews now (one per live turn it runs on a shared store).
fn leases(meter: &Meter, runtime: &Runtime) {
    let weak = Arc::downgrade(&runtime.inner);
    let _gauge = meter
        .u64_observable_gauge("agentrt.leases.held")
        .with_unit("{lease}")
        .with_description("Session leases this replica holds (its live turns on a shared store)")
        .with_callback(move |observer| {
            if let Some(inner) = weak.upgrade() {
                observer.observe(inner.slots.leased_count() as u64, &[]);
            }
        })
        .build();
}
