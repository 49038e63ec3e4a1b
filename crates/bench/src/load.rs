//! The measurement every scenario produces: a [`Load`] (counts, rates,
//! latency distributions as [`Lat`], CPU and memory of one run against one
//! process), and how a load reads in the report's tables.

use serde::Serialize;

use crate::driver::{Hist, Totals};
use crate::markdown::{ms, num, table};

/// A latency distribution in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub(crate) struct Lat {
    pub(crate) count: u64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) mean_us: f64,
}

impl Lat {
    pub(crate) fn from_hist(h: &Hist) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let us = |v: u64| v as f64 / 1_000.0;
        Self {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1_000.0,
        }
    }
}

/// One measured load against one server process.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Load {
    pub(crate) label: String,
    /// Concurrent sessions / streams / watchers.
    pub(crate) sessions: usize,
    pub(crate) turns: u64,
    pub(crate) failures: u64,
    pub(crate) first_failures: Vec<String>,
    /// Events of any kind received by the bench clients.
    pub(crate) events: u64,
    /// Text tokens received.
    pub(crate) tokens: u64,
    /// Replay gaps / heartbeats seen.
    pub(crate) gaps: u64,
    pub(crate) elapsed_s: f64,
    pub(crate) events_per_s: f64,
    pub(crate) tokens_per_s: f64,
    pub(crate) turns_per_s: f64,
    /// Request sent → first text event.
    pub(crate) ttfe: Lat,
    /// Per token: received − emitted.
    pub(crate) lag: Lat,
    /// Request sent → the fake had the upstream request.
    pub(crate) admission: Lat,
    /// Fake's first emit → first text event received.
    pub(crate) first_relay: Lat,
    /// Request sent → stream end.
    pub(crate) turn: Lat,
    /// Server (or echo) process CPU over the run, µs (`/proc/<pid>/stat`).
    pub(crate) server_cpu_us: u64,
    /// Server CPU µs / events received.
    pub(crate) cpu_us_per_event: f64,
    /// Server CPU µs / text tokens received (per model message relayed,
    /// whatever the number of events they came in).
    pub(crate) cpu_us_per_token: f64,
    /// Server CPU in cores (CPU time / wall time).
    pub(crate) server_cores: f64,
    /// The bench process (clients + fake) in cores.
    pub(crate) bench_cores: f64,
    /// Server `VmRSS` after start-up and warm-up, before the load (kB).
    pub(crate) rss_startup_kb: u64,
    /// Peak sampled `VmRSS` during the load (kB).
    pub(crate) rss_peak_kb: u64,
    /// `VmHWM` (peak since the process started) at the end (kB).
    pub(crate) rss_hwm_kb: u64,
    /// (peak − start-up) / sessions, kB.
    pub(crate) rss_per_session_kb: f64,
    /// Most threads the server process had during the load.
    pub(crate) threads_peak: u64,
}

impl Load {
    /// Fills the counts and latencies from `t`.
    pub(crate) fn with_totals(mut self, t: &Totals, elapsed_s: f64) -> Self {
        self.turns = t.turns;
        self.failures = t.failures;
        self.first_failures.clone_from(&t.first_failures);
        self.events = t.events;
        self.tokens = t.tokens;
        self.gaps = t.gaps;
        self.elapsed_s = elapsed_s;
        let per_s = |n: u64| {
            if elapsed_s > 0.0 {
                n as f64 / elapsed_s
            } else {
                0.0
            }
        };
        self.events_per_s = per_s(t.events);
        self.tokens_per_s = per_s(t.tokens);
        self.turns_per_s = per_s(t.turns);
        self.ttfe = Lat::from_hist(&t.ttfe);
        self.lag = Lat::from_hist(&t.lag);
        self.admission = Lat::from_hist(&t.admission);
        self.first_relay = Lat::from_hist(&t.first_relay);
        self.turn = Lat::from_hist(&t.turn);
        self
    }
}

/// agentrt ÷ the minimal relay (baseline c) on the same load: each field
/// is agentrt's value over the relay's (NaN when the relay's is 0).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub(crate) struct VsRelay {
    /// Chat sent → the upstream request received by the fake, p50.
    pub(crate) admission_p50: f64,
    pub(crate) admission_p99: f64,
    /// The fake's first token → the first text event received, p50.
    pub(crate) first_event_p50: f64,
    pub(crate) first_event_p99: f64,
    /// Chat sent → first text event, p99.
    pub(crate) ttfe_p99: f64,
    /// Text tokens (model messages) delivered per second.
    pub(crate) tokens_per_s: f64,
    /// Server CPU per text token.
    pub(crate) cpu_per_token: f64,
    /// RSS growth per concurrent call.
    pub(crate) rss_per_call: f64,
}

impl VsRelay {
    pub(crate) fn of(agentrt: &Load, relay: &Load) -> Self {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let (a, r) = (agentrt, relay);
        Self {
            admission_p50: div(a.admission.p50_us, r.admission.p50_us),
            admission_p99: div(a.admission.p99_us, r.admission.p99_us),
            first_event_p50: div(a.first_relay.p50_us, r.first_relay.p50_us),
            first_event_p99: div(a.first_relay.p99_us, r.first_relay.p99_us),
            ttfe_p99: div(a.ttfe.p99_us, r.ttfe.p99_us),
            tokens_per_s: div(a.tokens_per_s, r.tokens_per_s),
            cpu_per_token: div(a.cpu_us_per_token, r.cpu_us_per_token),
            rss_per_call: div(a.rss_per_session_kb, r.rss_per_session_kb),
        }
    }
}

/// A ratio as `2.35×` (`n/a` when undefined).
pub(crate) fn times(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}×")
    } else {
        "n/a".into()
    }
}

/// Every [`load_row`] column.
pub(crate) const LOAD_HEAD: &[&str] = &[
    "run",
    "sessions",
    "turns",
    "tokens/s",
    "TTFE p50 / p99 ms",
    "lag p50 / p99 / p99.9 ms",
    "server CPU µs/event",
    "cores server / bench",
    "RSS KB/session",
    "server threads (peak)",
];

/// p50 / p99 / p99.9 in ms, or "–" for an empty distribution.
pub(crate) fn lat3(l: &Lat) -> String {
    if l.count == 0 {
        return "–".into();
    }
    format!("{} / {} / {}", ms(l.p50_us), ms(l.p99_us), ms(l.p999_us))
}

/// p50 / p99 in ms, or "–" for an empty distribution.
pub(crate) fn lat2(l: &Lat) -> String {
    if l.count == 0 {
        return "–".into();
    }
    format!("{} / {}", ms(l.p50_us), ms(l.p99_us))
}

/// A load as a row under [`LOAD_HEAD`].
pub(crate) fn load_row(l: &Load) -> Vec<String> {
    vec![
        l.label.clone(),
        l.sessions.to_string(),
        format!("{}{}", l.turns, fail_note(l.failures)),
        num(l.tokens_per_s),
        lat2(&l.ttfe),
        lat3(&l.lag),
        num(l.cpu_us_per_event),
        format!("{:.2} / {:.2}", l.server_cores, l.bench_cores),
        num(l.rss_per_session_kb),
        if l.threads_peak > 0 {
            l.threads_peak.to_string()
        } else {
            "–".into()
        },
    ]
}

/// " (N failed)", or nothing when none did.
pub(crate) fn fail_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} failed)")
    }
}

/// Where the TTFE goes: request → upstream request, first emit → first event.
pub(crate) fn decomposition(loads: &[&Load]) -> String {
    let rows: Vec<_> = loads
        .iter()
        .filter(|l| l.admission.count > 0)
        .map(|l| {
            vec![
                l.label.clone(),
                lat3(&l.admission),
                lat3(&l.first_relay),
                lat3(&l.turn),
            ]
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nTTFE decomposition (fake's own timestamps):\n\n");
    out.push_str(&table(
        &[
            "run",
            "send → upstream request received p50 / p99 / p99.9 ms",
            "first emit → first text event ms",
            "whole turn ms",
        ],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::new_hist;

    #[test]
    fn latencies_come_from_histograms_in_microseconds() {
        let mut h = new_hist();
        for v in 1..=1000u64 {
            h.record(v * 1_000).unwrap();
        }
        let l = Lat::from_hist(&h);
        assert_eq!(l.count, 1000);
        assert!((l.p50_us - 500.0).abs() < 1.0, "{l:?}");
        assert!((l.p99_us - 990.0).abs() < 1.0, "{l:?}");
        assert_eq!(Lat::from_hist(&new_hist()), Lat::default());
    }
}
