//! The client side of every measurement: one turn through agentrt, one call
//! to the bare echo, one stream read directly from the fake; each yields a
//! [`TurnObs`], merged per scenario into a [`Recorder`] of histograms. Also
//! the loop that keeps N sessions busy for a time window.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agentrt_client::proto;
use agentrt_client::{ChatEvent, Client};
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use serde::Deserialize;

use crate::fake::{FakeServer, SseReader, StreamParams, Ticket, token_indices};

/// Nanosecond histograms, 1 ns to 10 min, 3 significant digits.
pub(crate) type Hist = Histogram<u64>;

pub(crate) fn new_hist() -> Hist {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// What one turn (or baseline call) showed.
#[derive(Debug, Default)]
pub(crate) struct TurnObs {
    /// Request sent → first text event received.
    pub(crate) ttfe: Option<Duration>,
    /// Per text token: received − emitted.
    pub(crate) lags: Vec<Duration>,
    /// Request sent → the fake had the whole upstream request.
    pub(crate) admission: Option<Duration>,
    /// First token emitted by the fake → first text event received.
    pub(crate) first_relay: Option<Duration>,
    /// Request sent → last event.
    pub(crate) total: Duration,
    /// Events of any kind received.
    pub(crate) events: u64,
    /// Text tokens received.
    pub(crate) tokens: u64,
    /// Heartbeats / replay gaps seen (should be 0 in these runs).
    pub(crate) gaps: u64,
    pub(crate) error: Option<String>,
}

/// Merged observations of one measurement.
#[derive(Debug)]
pub(crate) struct Totals {
    pub(crate) ttfe: Hist,
    pub(crate) lag: Hist,
    pub(crate) admission: Hist,
    pub(crate) first_relay: Hist,
    pub(crate) turn: Hist,
    pub(crate) turns: u64,
    pub(crate) events: u64,
    pub(crate) tokens: u64,
    pub(crate) gaps: u64,
    pub(crate) failures: u64,
    pub(crate) first_failures: Vec<String>,
}

impl Default for Totals {
    fn default() -> Self {
        Self {
            ttfe: new_hist(),
            lag: new_hist(),
            admission: new_hist(),
            first_relay: new_hist(),
            turn: new_hist(),
            turns: 0,
            events: 0,
            tokens: 0,
            gaps: 0,
            failures: 0,
            first_failures: Vec::new(),
        }
    }
}

/// Shared sink of [`TurnObs`]; one lock per turn.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    totals: Mutex<Totals>,
}

impl Recorder {
    pub(crate) fn add(&self, obs: TurnObs) {
        let mut t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        t.turns += 1;
        t.events += obs.events;
        t.tokens += obs.tokens;
        t.gaps += obs.gaps;
        if let Some(e) = obs.error {
            t.failures += 1;
            if t.first_failures.len() < 5 {
                t.first_failures.push(e);
            }
        }
        if let Some(d) = obs.ttfe {
            t.ttfe.saturating_record(ns(d));
        }
        if let Some(d) = obs.admission {
            t.admission.saturating_record(ns(d));
        }
        if let Some(d) = obs.first_relay {
            t.first_relay.saturating_record(ns(d));
        }
        t.turn.saturating_record(ns(obs.total));
        for d in obs.lags {
            t.lag.saturating_record(ns(d));
        }
    }

    pub(crate) fn take(&self) -> Totals {
        std::mem::take(&mut *self.totals.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Received token indices and instants of one stream.
#[derive(Debug, Default)]
pub(crate) struct Received {
    tokens: Vec<(u32, Instant)>,
}

impl Received {
    pub(crate) fn text(&mut self, text: &str, at: Instant) {
        self.tokens.extend(token_indices(text).map(|i| (i, at)));
    }

    /// Fills ttfe, lags, admission and first_relay from the fake's record.
    pub(crate) async fn finish(self, sent: Instant, ticket: Option<&Ticket>, obs: &mut TurnObs) {
        obs.tokens = self.tokens.len() as u64;
        obs.ttfe = self.tokens.first().map(|(_, t)| *t - sent);
        let Some(ticket) = ticket else { return };
        let Some(times) = ticket.record.wait(Duration::from_secs(2)).await else {
            obs.error
                .get_or_insert_with(|| "the fake kept no times".into());
            return;
        };
        obs.admission = Some(times.received.saturating_duration_since(sent));
        if let (Some(first), Some((_, got))) = (times.emits.first(), self.tokens.first()) {
            obs.first_relay = Some(got.saturating_duration_since(*first));
        }
        obs.lags = self
            .tokens
            .iter()
            .filter_map(|(i, at)| {
                let emitted = times.emits.get(*i as usize)?;
                Some(at.saturating_duration_since(*emitted))
            })
            .collect();
    }
}

/// A ChatRequest with one text block.
pub(crate) fn chat_request(session_id: &str, text: &str, model: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session_id.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }],
        model: model.to_owned(),
        ..Default::default()
    }
}

/// One turn through agentrt: with `fake` the answer streams from a fresh
/// ticket on the fake, otherwise `model` answers (e.g. `builtin/echo`).
/// Anything but a SUCCESS outcome is an error.
pub(crate) async fn agentrt_turn(
    client: &Client,
    session_id: &str,
    fake: Option<(&FakeServer, StreamParams)>,
    model: &str,
    limit: Duration,
) -> TurnObs {
    let ticket = fake.map(|(f, p)| f.ticket(p));
    agentrt_turn_with(client, session_id, ticket, model, limit).await
}

/// [`agentrt_turn`] with a ticket made by the caller (shared with watchers).
pub(crate) async fn agentrt_turn_with(
    client: &Client,
    session_id: &str,
    ticket: Option<Ticket>,
    model: &str,
    limit: Duration,
) -> TurnObs {
    let text = ticket.as_ref().map_or("hi", |t| t.key.as_str());
    let mut obs = TurnObs::default();
    let mut got = Received::default();
    let sent = Instant::now();
    let run = async {
        let mut stream = client
            .chat_with(chat_request(session_id, text, model))
            .await
            .map_err(|e| format!("chat: {e}"))?;
        let mut outcome = None;
        while let Some(item) = stream.next().await {
            let now = Instant::now();
            let event = item.map_err(|e| format!("stream: {e}"))?;
            obs.events += 1;
            match event.kind {
                ChatEvent::Text(t) => got.text(&t, now),
                ChatEvent::TurnFinished { outcome: o, .. } => outcome = Some(o),
                ChatEvent::Error { code, message } => {
                    return Err(format!("turn error {code:?}: {message}"));
                }
                ChatEvent::ReplayGap { .. } | ChatEvent::Heartbeat { .. } => obs.gaps += 1,
                _ => {}
            }
        }
        match outcome {
            Some(proto::TurnOutcome::Success) => Ok(()),
            Some(o) => Err(format!("turn outcome {o:?}")),
            None => Err("stream ended without turn_finished".into()),
        }
    };
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => obs.error = Some(e),
        Err(_) => obs.error = Some(format!("turn took longer than {limit:?}")),
    }
    obs.total = sent.elapsed();
    got.finish(sent, ticket.as_ref(), &mut obs).await;
    obs
}

/// Reads a Subscribe stream to its end, with lags against `ticket`.
pub(crate) async fn watch_turn(
    mut stream: agentrt_client::EventStream,
    ticket: Ticket,
    limit: Duration,
) -> TurnObs {
    let mut obs = TurnObs::default();
    let mut got = Received::default();
    let start = Instant::now();
    let run = async {
        let mut finished = false;
        while let Some(item) = stream.next().await {
            let now = Instant::now();
            let event = item.map_err(|e| format!("subscribe stream: {e}"))?;
            obs.events += 1;
            match event.kind {
                ChatEvent::Text(t) => got.text(&t, now),
                ChatEvent::TurnFinished { .. } => finished = true,
                ChatEvent::ReplayGap { .. } => obs.gaps += 1,
                _ => {}
            }
        }
        if finished {
            Ok(())
        } else {
            Err("watch ended without turn_finished".to_owned())
        }
    };
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => obs.error = Some(e),
        Err(_) => obs.error = Some(format!("watch took longer than {limit:?}")),
    }
    obs.total = start.elapsed();
    got.finish(start, Some(&ticket), &mut obs).await;
    // A watcher's "ttfe" is meaningless (it waited for the turn).
    obs.ttfe = None;
    obs.admission = None;
    obs
}

/// The model name that tells the bare echo what to stream.
pub(crate) fn echo_model(p: StreamParams) -> String {
    format!("echo/{}/{}/{}", p.tokens, p.rate, p.ttft.as_micros())
}

/// One call to the bare tonic echo; lag is receive wall time − the event's
/// `at` (set by the echo process just before it queued the event).
pub(crate) async fn echo_call(client: &Client, p: StreamParams, limit: Duration) -> TurnObs {
    let mut obs = TurnObs::default();
    let sent = Instant::now();
    let run = async {
        let mut stream = client
            .chat_with(chat_request("echo", "x", &echo_model(p)))
            .await
            .map_err(|e| format!("echo chat: {e}"))?;
        let mut finished = false;
        while let Some(item) = stream.next().await {
            let now = Instant::now();
            let event = item.map_err(|e| format!("echo stream: {e}"))?;
            obs.events += 1;
            match event.kind {
                ChatEvent::Text(_) => {
                    obs.tokens += 1;
                    obs.ttfe.get_or_insert(now - sent);
                    if let Some(at) = event.at {
                        let lag = SystemTime::now().duration_since(at).unwrap_or_default();
                        obs.lags.push(lag);
                    }
                }
                ChatEvent::TurnFinished { .. } => finished = true,
                _ => {}
            }
        }
        if finished {
            Ok(())
        } else {
            Err("echo stream ended without turn_finished".to_owned())
        }
    };
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => obs.error = Some(e),
        Err(_) => obs.error = Some(format!("echo call took longer than {limit:?}")),
    }
    obs.total = sent.elapsed();
    obs
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Vec<WireChoice>,
}

#[derive(Deserialize)]
struct WireChoice {
    delta: Option<WireDelta>,
}

#[derive(Deserialize)]
struct WireDelta {
    content: Option<String>,
}

/// The text delta of one OpenAI chat-completion chunk (`choices[0].delta.
/// content`), `None` for a chunk without one (finish reason, usage).
pub(crate) fn delta_content(data: &str) -> Result<Option<String>, serde_json::Error> {
    let chunk: WireChunk = serde_json::from_str(data)?;
    Ok(chunk
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.delta?.content))
}

/// One stream read directly from the fake with reqwest (the upstream
/// limit): SSE split, JSON decoded, as a minimal client would.
pub(crate) async fn direct_stream(
    http: &reqwest::Client,
    fake: &FakeServer,
    p: StreamParams,
    limit: Duration,
) -> TurnObs {
    let ticket = fake.ticket(p);
    let body = serde_json::json!({
        "model": "m",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": ticket.key}],
    });
    let url = format!("{}/chat/completions", fake.base_url());
    let mut obs = TurnObs::default();
    let mut got = Received::default();
    let sent = Instant::now();
    let run = async {
        let mut resp = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(serde_json::to_vec(&body).unwrap_or_default())
            .send()
            .await
            .map_err(|e| format!("direct request: {e}"))?;
        let mut reader = SseReader::default();
        let mut events = Vec::new();
        let mut done = false;
        // Read to the end of the body (not just [DONE]) so the connection
        // goes back to the pool.
        while let Some(bytes) = resp
            .chunk()
            .await
            .map_err(|e| format!("direct read: {e}"))?
        {
            let now = Instant::now();
            reader.push(&bytes, &mut events);
            for data in events.drain(..) {
                obs.events += 1;
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let delta = delta_content(&data).map_err(|e| format!("direct json: {e}"))?;
                if let Some(text) = delta {
                    got.text(&text, now);
                }
            }
        }
        if done {
            Ok(())
        } else {
            Err("direct stream ended without [DONE]".to_owned())
        }
    };
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => obs.error = Some(e),
        Err(_) => obs.error = Some(format!("direct stream took longer than {limit:?}")),
    }
    obs.total = sent.elapsed();
    got.finish(sent, Some(&ticket), &mut obs).await;
    obs
}

/// Keeps `sessions` loops running turns until `window` has passed since the
/// start; loop `i` starts after `stagger * i / sessions`. Turns in flight at
/// the end finish. Returns the wall time from start to the last turn's end.
/// Bounded: loops still running `window + grace` after the start are
/// aborted.
pub(crate) async fn run_loops<F, Fut>(
    sessions: usize,
    window: Duration,
    stagger: Duration,
    grace: Duration,
    turn: F,
) -> Duration
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let turn = Arc::new(turn);
    let start = Instant::now();
    let end = start + window;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..sessions {
        let turn = Arc::clone(&turn);
        let offset = stagger.mul_f64(i as f64 / sessions.max(1) as f64);
        set.spawn(async move {
            tokio::time::sleep_until((start + offset).into()).await;
            while Instant::now() < end {
                turn(i).await;
            }
        });
    }
    let all = async { while set.join_next().await.is_some() {} };
    if tokio::time::timeout(window + grace, all).await.is_err() {
        eprintln!(
            "agentrt-bench: loops still running after {:?}; aborted",
            window + grace
        );
    }
    start.elapsed()
}

/// `n` client connections to `url`.
pub(crate) async fn connect_clients(url: &str, n: usize) -> Result<Vec<Client>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let c = Client::builder(url)
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("connect {url}: {e}"))?;
        out.push(c);
    }
    Ok(out)
}

/// Connections used for `sessions` concurrent sessions: one per 100, at most 16.
pub(crate) fn connections_for(sessions: usize) -> usize {
    sessions.div_ceil(100).clamp(1, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_merges_turns() {
        let r = Recorder::default();
        r.add(TurnObs {
            ttfe: Some(Duration::from_micros(300)),
            lags: vec![Duration::from_micros(50); 10],
            events: 14,
            tokens: 10,
            ..TurnObs::default()
        });
        r.add(TurnObs {
            error: Some("boom".into()),
            ..TurnObs::default()
        });
        let t = r.take();
        assert_eq!((t.turns, t.events, t.tokens, t.failures), (2, 14, 10, 1));
        assert_eq!(t.lag.len(), 10);
        assert_eq!(t.ttfe.len(), 1);
        assert!((t.ttfe.value_at_quantile(0.5) as i64 - 300_000).abs() < 1_000);
        assert_eq!(t.first_failures, ["boom"]);
    }

    #[test]
    fn connections_scale_with_sessions() {
        assert_eq!(connections_for(1), 1);
        assert_eq!(connections_for(100), 1);
        assert_eq!(connections_for(1000), 10);
        assert_eq!(connections_for(5000), 16);
    }
}
