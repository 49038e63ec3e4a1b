//! The probes of the `langgraph` part, one fresh server per runtime: memory
//! per idle thread (session), what a second run on a busy thread gets, how
//! long a cancelled run's stream takes to close, and saturation with
//! unpaced turns.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client};
use futures::StreamExt as _;

use super::client::{Item, LgClient, RunStream, TurnEnd};
use super::peer::{Peer, process_tree};
use super::{LgPlan, Probe, Probes, WARM, create_threads, peer_loops, warm};
use crate::driver::{Recorder, agentrt_turn, chat_request};
use crate::load::Lat;
use crate::proc_stats::sample_all;
use crate::scenarios::{Env, Measure, agentrt_loops, create_session, create_sessions};

/// Latencies and outcomes of a probe's samples.
#[derive(Default)]
struct ProbeRec {
    hist: Option<crate::driver::Hist>,
    outcomes: BTreeMap<String, u64>,
    samples: u64,
}

impl ProbeRec {
    fn add(&mut self, latency: Duration, outcome: String) {
        let h = self.hist.get_or_insert_with(crate::driver::new_hist);
        h.saturating_record(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1));
        *self.outcomes.entry(outcome).or_default() += 1;
        self.samples += 1;
    }

    fn probe(self) -> Probe {
        Probe {
            samples: self.samples,
            latency: self.hist.as_ref().map(Lat::from_hist).unwrap_or_default(),
            outcome: self
                .outcomes
                .iter()
                .map(|(o, n)| format!("{o} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Reads a run's stream until its first token (bounded).
async fn first_token(stream: &mut RunStream, limit: Duration) -> Result<(), String> {
    let read = async {
        loop {
            match stream.next().await? {
                Some(Item::Text(t)) if !t.is_empty() => return Ok(()),
                Some(Item::Error(e)) => return Err(format!("error event: {e}")),
                Some(_) => {}
                None => return Err("the stream closed before its first token".to_owned()),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("no first token within {limit:?}"))?
}

/// Reads a run's stream to its end (bounded).
async fn drain_stream(stream: &mut RunStream, limit: Duration) -> Result<(), String> {
    let read = async {
        while let Some(item) = stream.next().await? {
            if let Item::Error(e) = item {
                return Err(format!("error event: {e}"));
            }
        }
        Ok(())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("the stream did not close within {limit:?}"))?
}

/// A LangGraph server's probes: idle threads, busy thread, cancel,
/// saturation.
pub(super) async fn peer_probes(
    env: &Env,
    peer: &Peer,
    plan: &LgPlan,
    label: &str,
) -> Result<Probes, String> {
    let client = LgClient::new(peer.url())?;
    warm(env, &client, plan).await?;
    let tree = process_tree(peer.pid());
    let limit = plan.turn_limit;

    // Idle: threads that each had one short turn.
    let rss0 = sample_all(&tree).rss_kb;
    let idle: Vec<Result<(), String>> = futures::stream::iter(0..plan.idle_threads)
        .map(|_| {
            let client = client.clone();
            async move {
                let thread = client.create_thread().await?;
                let ticket = env.fake.ticket(WARM);
                match client
                    .turn(&thread, ticket, WARM.tokens, Instant::now() + limit)
                    .await
                {
                    TurnEnd::Done(obs) => obs.error.map_or(Ok(()), Err),
                    TurnEnd::Unfinished => Err("idle turn did not finish".to_owned()),
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    idle.into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map_err(|e| format!("idle threads: {e}"))?;
    let rss1 = sample_all(&tree).rss_kb;

    // Busy: a second run on a thread whose run is streaming.
    let mut busy = ProbeRec::default();
    for _ in 0..plan.probes {
        let thread = client.create_thread().await?;
        let first = env.fake.ticket(plan.paced);
        let mut a = client
            .start_run(&thread, &first.key)
            .await?
            .map_err(|(s, b)| format!("busy probe: first run refused: {s}: {b}"))?;
        first_token(&mut a, limit).await?;
        let second = env.fake.ticket(WARM);
        let t0 = Instant::now();
        let outcome = match client.start_run(&thread, &second.key).await? {
            Err((status, _)) => format!("HTTP {status}"),
            Ok(mut b) => {
                drain_stream(&mut b, limit).await?;
                "accepted".to_owned()
            }
        };
        busy.add(t0.elapsed(), outcome);
        drain_stream(&mut a, limit).await?;
    }

    // Cancel: the time from the cancel request to the stream's close.
    let mut cancel = ProbeRec::default();
    for _ in 0..plan.probes {
        let thread = client.create_thread().await?;
        let ticket = env.fake.ticket(plan.cancel);
        let mut run = client
            .start_run(&thread, &ticket.key)
            .await?
            .map_err(|(s, b)| format!("cancel probe: run refused: {s}: {b}"))?;
        if run.run_id.is_empty() {
            return Err("cancel probe: the run stream named no run".into());
        }
        first_token(&mut run, limit).await?;
        let t0 = Instant::now();
        let canceller = {
            let (client, thread, id) = (client.clone(), thread.clone(), run.run_id.clone());
            tokio::spawn(async move { client.cancel(&thread, &id).await })
        };
        drain_stream(&mut run, limit).await?;
        let latency = t0.elapsed();
        canceller.await.map_err(|e| format!("cancel task: {e}"))??;
        let status = client.run_status(&thread, &run.run_id).await?;
        cancel.add(latency, format!("run {status}"));
    }

    // Saturation: unpaced turns.
    let threads = create_threads(&client, plan.sat_sessions).await?;
    let rss_sat = sample_all(&tree).rss_kb;
    let measure = Measure::begin_tree(tree);
    let (totals, unfinished, elapsed) =
        peer_loops(env, &client, threads, plan.sat, plan.sat_window, plan.drain).await;
    let saturation = measure
        .end(
            &format!("{label} saturation"),
            plan.sat_sessions,
            &totals,
            elapsed,
            rss_sat,
        )
        .await;
    Ok(Probes {
        runtime: label.to_owned(),
        idle_threads: plan.idle_threads,
        kb_per_idle_thread: rss1.saturating_sub(rss0) as f64 / plan.idle_threads.max(1) as f64,
        busy: busy.probe(),
        cancel: cancel.probe(),
        saturation,
        saturation_unfinished: unfinished,
    })
}

/// Reads an agentrt turn's stream until its first text event (bounded).
async fn agentrt_first_text(
    stream: &mut agentrt_client::EventStream,
    limit: Duration,
) -> Result<(), String> {
    let read = async {
        while let Some(item) = stream.next().await {
            if let ChatEvent::Text(_) = item.map_err(|e| format!("stream: {e}"))?.kind {
                return Ok(());
            }
        }
        Err("the stream ended before its first text".to_owned())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("no first text within {limit:?}"))?
}

/// Reads an agentrt turn's stream to its end: the turn's outcome. A turn
/// that did not succeed ends its stream with an error status after its
/// `turn_finished` (e.g. CANCELLED for a stopped turn): that is its end.
async fn agentrt_drain(
    stream: &mut agentrt_client::EventStream,
    limit: Duration,
) -> Result<String, String> {
    let read = async {
        let mut outcome = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(e) => {
                    if let ChatEvent::TurnFinished { outcome: o, .. } = e.kind {
                        outcome = Some(format!("{o:?}"));
                    }
                }
                Err(e) if outcome.is_none() => return Err(format!("stream: {e}")),
                Err(_) => break,
            }
        }
        outcome.ok_or_else(|| "the stream ended without turn_finished".to_owned())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("the stream did not end within {limit:?}"))?
}

/// The outcome of a Chat sent to a busy session: its error, or what its
/// stream started with.
async fn agentrt_second_chat(client: &Client, id: &str, key: &str, limit: Duration) -> String {
    let describe = |e: agentrt_client::Error| match (e.code(), e.is_busy()) {
        (Some(code), true) => format!("{code:?} (SESSION_BUSY)"),
        (Some(code), false) => format!("{code:?}"),
        (None, _) => format!("client error: {e}"),
    };
    match client.chat_with(chat_request(id, key, "")).await {
        Err(e) => describe(e),
        Ok(mut s) => match tokio::time::timeout(limit, s.next()).await {
            Ok(Some(Err(e))) => describe(e),
            Ok(Some(Ok(_))) => {
                let _ = agentrt_drain(&mut s, limit).await;
                "accepted".to_owned()
            }
            Ok(None) => "empty stream".to_owned(),
            Err(_) => "no answer".to_owned(),
        },
    }
}

/// agentrt's probes on a fresh server, as [`peer_probes`].
pub(super) async fn agentrt_probes(env: &Env, plan: &LgPlan) -> Result<Probes, String> {
    let run = env.fresh_server("lg-agentrt-probes", 1).await?;
    let client = &run.clients[0];
    let limit = plan.turn_limit;

    let rss0 = run.server.stats().rss_kb;
    let idle: Vec<Result<(), String>> = futures::stream::iter(0..plan.idle_threads)
        .map(|i| async move {
            let id = format!("idle-{i}");
            create_session(client, &id).await?;
            let obs = agentrt_turn(client, &id, Some((&env.fake, WARM)), "", limit).await;
            obs.error.map_or(Ok(()), Err)
        })
        .buffer_unordered(16)
        .collect()
        .await;
    idle.into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map_err(|e| format!("idle sessions: {e}"))?;
    let rss1 = run.server.stats().rss_kb;

    let mut busy = ProbeRec::default();
    for i in 0..plan.probes {
        let id = format!("busy-{i}");
        create_session(client, &id).await?;
        let first = env.fake.ticket(plan.paced);
        let mut a = client
            .chat_with(chat_request(&id, &first.key, ""))
            .await
            .map_err(|e| format!("busy probe: {e}"))?;
        agentrt_first_text(&mut a, limit).await?;
        let second = env.fake.ticket(WARM);
        let t0 = Instant::now();
        let outcome = agentrt_second_chat(client, &id, &second.key, limit).await;
        busy.add(t0.elapsed(), outcome);
        agentrt_drain(&mut a, limit).await?;
    }

    let mut cancel = ProbeRec::default();
    for i in 0..plan.probes {
        let id = format!("cancel-{i}");
        create_session(client, &id).await?;
        let ticket = env.fake.ticket(plan.cancel);
        let mut s = client
            .chat_with(chat_request(&id, &ticket.key, ""))
            .await
            .map_err(|e| format!("cancel probe: {e}"))?;
        agentrt_first_text(&mut s, limit).await?;
        let t0 = Instant::now();
        let stopper = {
            let (client, id) = (client.clone(), id.clone());
            tokio::spawn(async move { client.stop_session(&id).await })
        };
        let outcome = agentrt_drain(&mut s, limit).await?;
        let latency = t0.elapsed();
        stopper
            .await
            .map_err(|e| format!("stop task: {e}"))?
            .map_err(|e| format!("stop session: {e}"))?;
        cancel.add(latency, format!("turn {outcome}"));
    }

    let ids: Vec<String> = (0..plan.sat_sessions).map(|i| format!("sat-{i}")).collect();
    create_sessions(&run.clients, &ids).await?;
    let rss_sat = run.server.stats().rss_kb;
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(run.server.pid());
    let windows = (
        plan.sat_window,
        Duration::ZERO,
        plan.drain + Duration::from_secs(5),
    );
    let elapsed = agentrt_loops(env, &run.clients, ids, &rec, plan.sat, windows).await;
    let saturation = measure
        .end(
            "agentrt saturation",
            plan.sat_sessions,
            &rec.take(),
            elapsed,
            rss_sat,
        )
        .await;
    run.server.terminate(Duration::from_secs(10)).await;
    Ok(Probes {
        runtime: "agentrt".into(),
        idle_threads: plan.idle_threads,
        kb_per_idle_thread: rss1.saturating_sub(rss0) as f64 / plan.idle_threads.max(1) as f64,
        busy: busy.probe(),
        cancel: cancel.probe(),
        saturation,
        saturation_unfinished: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_count_outcomes() {
        let mut r = ProbeRec::default();
        r.add(Duration::from_millis(2), "HTTP 409".into());
        r.add(Duration::from_millis(4), "HTTP 409".into());
        r.add(Duration::from_millis(3), "accepted".into());
        let p = r.probe();
        assert_eq!(p.samples, 3);
        assert_eq!(p.outcome, "HTTP 409 ×2, accepted ×1");
        assert!((p.latency.p50_us - 3_000.0).abs() < 10.0, "{:?}", p.latency);
        assert_eq!(ProbeRec::default().probe().latency, Lat::default());
    }
}
