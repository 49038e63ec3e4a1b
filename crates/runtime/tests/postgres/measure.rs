//! What the schema costs: the history query's plan on a 10,000-message
//! session (it must be an index scan), and the latency of a turn's three
//! writes. Numbers are printed (`--nocapture`), never asserted; they are
//! in `docs/postgres.md`.

use std::time::{Duration, Instant, SystemTime};

use agentrt_runtime::store::{HistoryQuery, Store};
use agentrt_runtime::types::{Message, NewMessage, Role, TurnRecord, TurnStatus};
use agentrt_testkit::contract::text_message;
use agentrt_testkit::pg;

const MESSAGES: u64 = 10_000;

/// Stores `MESSAGES` messages in `session_id` in a few statements (through
/// the store it would take minutes), encoded as the store encodes them: a
/// version byte, then the message's JSON.
async fn seed(client: &tokio_postgres::Client, session_id: &str) {
    for chunk in (1..=MESSAGES).collect::<Vec<_>>().chunks(1_000) {
        let (mut seqs, mut records) = (Vec::new(), Vec::new());
        for &seq in chunk {
            let body = text_message(
                "t",
                Role::Assistant,
                &format!("message {seq} {}", "x".repeat(200)),
            );
            let message = Message {
                seq,
                body,
                compacted: false,
            };
            let mut record = vec![1u8];
            serde_json::to_writer(&mut record, &message).expect("encode");
            seqs.push(i64::try_from(seq).expect("small"));
            records.push(record);
        }
        client
            .execute(
                "INSERT INTO messages (session_id, seq, turn_id, record) \
                 SELECT $1, s, 't', r FROM unnest($2::bigint[], $3::bytea[]) AS m(s, r)",
                &[&session_id, &seqs, &records],
            )
            .await
            .expect("seed messages");
    }
    let next = i64::try_from(MESSAGES + 1).expect("small");
    client
        .execute(
            "UPDATE sessions SET next_seq = $2::bigint, message_count = $2::bigint - 1 WHERE id = $1",
            &[&session_id, &next],
        )
        .await
        .expect("seed counters");
    client
        .batch_execute("ANALYZE messages")
        .await
        .expect("analyze");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

#[tokio::test]
async fn history_pages_of_a_long_session_are_index_scans() {
    let Some(db) = pg::database().await else {
        return;
    };
    let store = super::store(&db, "a", Duration::from_secs(10)).await;
    let s = super::session(&store).await;
    let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    seed(&client, &s.id).await;
    // The store's statement, as a prepared (generic) plan and with values.
    client
        .batch_execute(
            "PREPARE page(text, bigint, bigint) AS SELECT seq, record FROM messages \
             WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3; \
             SET plan_cache_mode = force_generic_plan",
        )
        .await
        .expect("prepare");
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS) EXECUTE page('{}', 5000, 100)",
        s.id
    );
    let plan: Vec<String> = client
        .query(&explain, &[])
        .await
        .expect("explain")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    println!("history page on {MESSAGES} messages (generic plan):\n{plan}");
    assert!(plan.contains("Index Scan using messages_pkey"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");

    let mut times = Vec::new();
    for after in (0..MESSAGES).step_by(100) {
        let query = HistoryQuery::unbounded(after, 100, false);
        let started = Instant::now();
        let page = store.history_page(&s.id, &query).await.expect("page");
        times.push(started.elapsed());
        assert_eq!(page.messages.first().map(|m| m.seq), Some(after + 1));
        assert_eq!(page.messages.len(), 100);
    }
    times.sort_unstable();
    println!(
        "history_page of 100 messages on {MESSAGES}: p50 {:?}, p99 {:?} ({} pages)",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.len()
    );
    let tail = HistoryQuery {
        max_bytes: 2_000,
        ..HistoryQuery::unbounded(9_000, 1_000, false)
    };
    let page = store.history_page(&s.id, &tail).await.expect("budget page");
    assert!(
        page.more && page.messages.len() < 10,
        "the byte budget cut the page"
    );
    drop(client);
    let _ = conn.await;
}

#[tokio::test]
async fn latency_of_a_turns_writes() {
    let Some(db) = pg::database().await else {
        return;
    };
    let store = super::store(&db, "a", Duration::from_secs(10)).await;
    let s = super::session(&store).await;
    let (mut begin, mut append, mut finish, mut total) = (vec![], vec![], vec![], vec![]);
    for i in 0..200 {
        let turn_id = format!("t{i}");
        let started = Instant::now();
        let user = store
            .begin_turn(super::running(&s, &turn_id), super::user(&turn_id))
            .await
            .expect("begin");
        let begun = started.elapsed();
        let answer = NewMessage::new(&turn_id, Role::Assistant, vec![]);
        store
            .append_message(&s.id, &s.incarnation, answer)
            .await
            .expect("append");
        let appended = started.elapsed();
        let record = TurnRecord {
            status: TurnStatus::Success,
            finished_at: Some(SystemTime::now()),
            user_message_seq: user.seq,
            ..super::running(&s, &turn_id)
        };
        store.finish_turn(record).await.expect("finish");
        let done = started.elapsed();
        begin.push(begun);
        append.push(appended - begun);
        finish.push(done - appended);
        total.push(done);
    }
    assert_eq!(super::seqs(&store, &s.id).await.len(), 400);
    for (name, times) in [
        ("begin_turn", &mut begin),
        ("append_message", &mut append),
        ("finish_turn", &mut finish),
        ("all three", &mut total),
    ] {
        times.sort_unstable();
        println!(
            "{name}: p50 {:?}, p99 {:?} (200 turns)",
            percentile(times, 0.5),
            percentile(times, 0.99)
        );
    }
}
