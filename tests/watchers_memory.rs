//! The memory bound of watchers that never read, in a test binary of its
//! own: it measures this process's RSS, so no other test may allocate in the
//! same process while it runs (in the shared e2e binary, concurrent tests
//! made the measurement flaky).

use std::time::Duration;

use agentrt_client::{ChatEvent, proto};
use futures::StreamExt as _;

#[allow(dead_code, unreachable_pub)]
#[path = "e2e/harness.rs"]
mod harness;

use harness::{Providers, TestServer, base_config, new_session, small_window_watch, text_request};

#[tokio::test]
async fn watchers_that_never_read_do_not_slow_the_turn_or_grow_memory() {
    const EVENTS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let url = server.url.clone();
    let run = |watchers: usize| {
        let url = url.clone();
        let client = client.clone();
        let session = session.clone();
        let providers = providers.clone();
        async move {
            let mut req = text_request(&session, "go");
            req.model = format!("flood/{EVENTS}");
            let started = std::time::Instant::now();
            let mut chat = client.chat_with(req).await.unwrap();
            let mut idle = Vec::new();
            for _ in 0..watchers {
                // One connection each: unread streams sharing a connection
                // would exhaust its HTTP/2 window and stall the others.
                let watch = small_window_watch(&url, &session).await;
                idle.push(watch);
            }
            let mut texts = 0;
            while let Some(e) = chat.next().await {
                if matches!(e.unwrap().kind, ChatEvent::Text(_)) {
                    texts += 1;
                    if texts == EVENTS {
                        providers.flood.release(1);
                    }
                }
            }
            (started.elapsed(), idle)
        }
    };
    let (alone, _) = run(0).await;
    let rss_before = rss_bytes();
    let (crowded, idle) = run(100).await;
    let grown = rss_bytes().saturating_sub(rss_before);
    // 100 unbounded watchers would hold 100 × 20,000 events; bounded ones
    // hold at most their buffers.
    assert!(grown < 64 << 20, "memory grew by {} MiB", grown >> 20);
    assert!(
        crowded < alone * 5 + Duration::from_secs(2),
        "with idle watchers {crowded:?}, without {alone:?}"
    );

    // An idle watcher that finally reads lost events: it is told so.
    // A watcher that finally reads still gets a contiguous turn from the
    // replay (it holds all 20,000 events) ending with turn_finished.
    let mut lagging = idle.into_iter().next().unwrap();
    let mut seqs = Vec::new();
    let mut last = None;
    while let Some(e) = lagging.message().await.unwrap() {
        if e.seq > 0 {
            seqs.push(e.seq);
        }
        last = e.kind;
    }
    assert!(matches!(
        last,
        Some(proto::chat_event::Kind::TurnFinished(_))
    ));
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    server.stop().await;
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
