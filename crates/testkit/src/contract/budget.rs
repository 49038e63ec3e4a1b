//! Contract checks for pages cut by bytes.

use super::{append, create_new, new_session};
use agentrt_runtime::store::{
    HistoryQuery, ListQuery, Store, message_wire_bytes, session_wire_bytes,
};
use agentrt_runtime::types::{Message, NewSession};

/// Message bodies of very different sizes, so budgets fall at odd places.
const BODIES: [usize; 8] = [10, 5_000, 200, 40_000, 1, 12_000, 3_000, 25_000];

async fn seeded(store: &dyn Store) -> (String, Vec<Message>) {
    let id = create_new(store, new_session("alice", "agent")).await.id;
    for (i, len) in BODIES.into_iter().enumerate() {
        append(store, &id, &format!("{i}{}", "x".repeat(len))).await;
    }
    let all = store.history(&id, 0, 100, true).await.expect("history");
    assert_eq!(all.len(), BODIES.len());
    (id, all)
}

/// What a page of `max_bytes` from `after_seq` must hold: the longest run
/// whose sizes sum to at most the budget, and never nothing.
fn expected(all: &[Message], after_seq: u64, limit: usize, max_bytes: usize) -> (Vec<u64>, bool) {
    let rest: Vec<&Message> = all.iter().filter(|m| m.seq > after_seq).collect();
    let (mut seqs, mut used) = (Vec::new(), 0usize);
    for m in &rest {
        let size = message_wire_bytes(m);
        if !seqs.is_empty() && used + size > max_bytes {
            return (seqs, true);
        }
        used += size;
        seqs.push(m.seq);
        if seqs.len() == limit {
            return (seqs, false);
        }
    }
    (seqs, false)
}

/// `history_page` stops before the message that would take the page past
/// its byte budget, always returns at least one message, says when more
/// follow, and paging by budget walks the whole history exactly once.
pub async fn history_stops_at_the_byte_budget(store: &dyn Store) {
    let (id, all) = seeded(store).await;
    let sizes: Vec<usize> = all.iter().map(message_wire_bytes).collect();
    assert!(
        all.iter()
            .zip(&BODIES)
            .all(|(m, len)| message_wire_bytes(m) > *len),
        "the estimate is below the payload"
    );
    let exact_two = sizes[0] + sizes[1];
    for (after, limit, max_bytes) in [
        (0, 100, 1),
        (0, 100, exact_two),
        (0, 100, exact_two - 1),
        (0, 100, exact_two + 1),
        (0, 2, usize::MAX),
        (0, 3, 50_000),
        (3, 100, 1),
        (1, 100, 46_000),
        (7, 100, 1),
        (0, 100, usize::MAX),
    ] {
        let query = HistoryQuery {
            after_seq: after,
            limit,
            max_bytes,
            include_compacted: false,
        };
        let page = store.history_page(&id, &query).await.expect("history_page");
        let got: Vec<u64> = page.messages.iter().map(|m| m.seq).collect();
        assert_eq!(
            (got, page.more),
            expected(&all, after, limit, max_bytes),
            "after {after}, limit {limit}, max_bytes {max_bytes}"
        );
    }
    for max_bytes in [1, 6_000, 30_000, 60_000] {
        let (mut after, mut walked, mut pages) = (0, Vec::new(), 0);
        loop {
            let query = HistoryQuery {
                after_seq: after,
                limit: 100,
                max_bytes,
                include_compacted: true,
            };
            let page = store.history_page(&id, &query).await.expect("history_page");
            pages += 1;
            let Some(last) = page.messages.last() else {
                break;
            };
            let bytes: usize = page.messages.iter().map(message_wire_bytes).sum();
            assert!(
                page.messages.len() == 1 || bytes <= max_bytes,
                "a page of {bytes} bytes over a budget of {max_bytes}"
            );
            after = last.seq;
            walked.extend(page.messages.iter().cloned());
            if !page.more {
                break;
            }
        }
        assert_eq!(walked, all, "walk with budget {max_bytes}");
        assert!(pages <= all.len() + 1);
    }
}

/// `list_sessions` ends a page before the session that would take it past
/// its byte budget (always at least one) and sets the cursor so that paging
/// by budget lists every session once.
pub async fn list_stops_at_the_byte_budget(store: &dyn Store) {
    for (i, len) in BODIES.into_iter().enumerate() {
        let new = NewSession {
            title: format!("{i}"),
            system_prompt: "p".repeat(len),
            metadata: [("k".to_owned(), "v".repeat(len / 2))].into(),
            ..new_session("alice", "agent")
        };
        create_new(store, new).await;
    }
    let everything = ListQuery {
        limit: 100,
        ..ListQuery::default()
    };
    let full = store
        .list_sessions("alice", &everything)
        .await
        .expect("list");
    assert_eq!((full.sessions.len(), &full.next), (BODIES.len(), &None));
    let sizes: Vec<usize> = full.sessions.iter().map(session_wire_bytes).collect();
    assert!(sizes.iter().all(|s| *s > 0));
    let first_two = sizes[0] + sizes[1];
    for (max_bytes, want) in [(1, 1), (first_two, 2), (first_two - 1, 1)] {
        let query = ListQuery {
            max_bytes,
            ..everything.clone()
        };
        let page = store.list_sessions("alice", &query).await.expect("list");
        assert_eq!(page.sessions.len(), want, "max_bytes {max_bytes}");
        let last = page.sessions.last().expect("a page");
        assert_eq!(page.next.as_ref().map(|c| &c.id), Some(&last.id));
    }
    for max_bytes in [1, 30_000, 80_000, usize::MAX] {
        let mut query = ListQuery {
            max_bytes,
            ..everything.clone()
        };
        let mut ids = Vec::new();
        for _ in 0..=BODIES.len() {
            let page = store.list_sessions("alice", &query).await.expect("list");
            let bytes: usize = page.sessions.iter().map(session_wire_bytes).sum();
            assert!(page.sessions.len() == 1 || bytes <= max_bytes);
            ids.extend(page.sessions.into_iter().map(|s| s.id));
            match page.next {
                Some(next) => query.after = Some(next),
                None => break,
            }
        }
        let want: Vec<String> = full.sessions.iter().map(|s| s.id.clone()).collect();
        assert_eq!(ids, want, "walk with budget {max_bytes}");
    }
}
