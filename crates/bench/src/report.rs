//! Results: serializable records (the `--json` file); rendered by
//! [`crate::markdown`].

use serde::Serialize;

use crate::driver::{Hist, Totals};
use crate::markdown::num;

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

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Machine {
    pub(crate) nproc: String,
    pub(crate) cpu_model: String,
    pub(crate) memory: String,
    pub(crate) kernel: String,
    pub(crate) rustc: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Baselines {
    /// Bare echo, 1 stream, 1 token, sequential calls: tonic's own TTFE.
    pub(crate) echo_ttfe: Load,
    /// Bare echo, many paced streams: the transport limit (events/s).
    pub(crate) echo_saturation: Load,
    /// Bare echo, unpaced streams (tonic batches events): informational.
    pub(crate) echo_unpaced: Load,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S1 {
    pub(crate) agentrt: Load,
    pub(crate) direct: Load,
    pub(crate) ttfe_overhead_p50_us: f64,
    pub(crate) ttfe_overhead_p99_us: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S2Level {
    pub(crate) sessions: usize,
    pub(crate) agentrt: Load,
    pub(crate) direct: Load,
    pub(crate) echo: Load,
    pub(crate) ttfe_overhead_p50_us: f64,
    pub(crate) ttfe_overhead_p99_us: f64,
    /// agentrt CPU/event ÷ echo CPU/event.
    pub(crate) cpu_ratio: f64,
    /// agentrt lag p99 ÷ echo lag p99.
    pub(crate) lag_ratio: f64,
    /// agentrt KB/session ÷ echo KB/stream.
    pub(crate) mem_ratio: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S3 {
    pub(crate) agentrt: Vec<Load>,
    pub(crate) direct: Vec<Load>,
    pub(crate) max_tokens_per_s: f64,
    pub(crate) direct_max_tokens_per_s: f64,
    /// ÷ the paced echo saturation (baseline a).
    pub(crate) ratio_echo: f64,
    /// ÷ the unpaced echo (same stream shape, tonic batching freely).
    pub(crate) ratio_echo_unpaced: f64,
    /// ÷ the fake read directly (baseline b).
    pub(crate) ratio_direct: f64,
    /// ÷ min(a, b).
    pub(crate) throughput_ratio: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S4Level {
    pub(crate) watchers: usize,
    /// The watchers' streams merged.
    pub(crate) watch: Load,
    /// The Chat caller's stream.
    pub(crate) caller: Load,
    /// Tokens delivered to watchers per second of streaming.
    pub(crate) delivered_per_s: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S7 {
    pub(crate) sessions: usize,
    /// Creating every session and running its echo turn.
    pub(crate) fill_s: f64,
    pub(crate) fill_turns_per_s: f64,
    pub(crate) rss_startup_kb: u64,
    pub(crate) rss_filled_kb: u64,
    pub(crate) kb_per_idle_session: f64,
    pub(crate) list_ms: f64,
    pub(crate) list_pages: u64,
    pub(crate) listed: u64,
    pub(crate) drain_ms: f64,
    pub(crate) drain_exit_ok: bool,
    pub(crate) restart_listening_ms: f64,
    pub(crate) restart_ready_ms: f64,
    pub(crate) rss_restarted_kb: u64,
    pub(crate) list_after_restart_ms: f64,
    pub(crate) rss_after_list_kb: u64,
    pub(crate) failures: u64,
}

/// A target beside its measured value.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) target: String,
    pub(crate) measured: String,
    /// measured ÷ target bound (≤ 1 is good for "at most" targets, ≥ 1 for
    /// "at least" ones).
    pub(crate) ratio: f64,
    pub(crate) met: bool,
}

impl Target {
    /// A target of at most `bound`.
    pub(crate) fn at_most(name: &str, bound: f64, value: f64, unit: &str) -> Self {
        Self {
            name: name.to_owned(),
            target: format!("≤ {} {unit}", num(bound)),
            measured: format!("{} {unit}", num(value)),
            ratio: ratio(value, bound),
            met: value <= bound,
        }
    }

    /// A target of at least `bound`.
    pub(crate) fn at_least(name: &str, bound: f64, value: f64, unit: &str) -> Self {
        Self {
            name: name.to_owned(),
            target: format!("≥ {} {unit}", num(bound)),
            measured: format!("{} {unit}", num(value)),
            ratio: ratio(value, bound),
            met: value >= bound,
        }
    }
}

fn ratio(value: f64, bound: f64) -> f64 {
    if bound == 0.0 { 0.0 } else { value / bound }
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) mode: String,
    pub(crate) command: String,
    pub(crate) machine: Machine,
    pub(crate) server_cpus: Option<String>,
    pub(crate) server_binary: String,
    /// `git rev-parse --short HEAD` where the bench ran.
    pub(crate) git_commit: String,
    pub(crate) duration_s: f64,
    pub(crate) baselines: Baselines,
    pub(crate) s1: Option<S1>,
    pub(crate) s2: Vec<S2Level>,
    pub(crate) s3: Option<S3>,
    pub(crate) s4: Vec<S4Level>,
    pub(crate) s6: Vec<Load>,
    pub(crate) s7: Option<S7>,
    /// S9 context load (sizes in messages).
    pub(crate) s9: Vec<crate::context::ContextLoad>,
    /// The local model (`local` part).
    pub(crate) local: Option<crate::local::LocalModel>,
    /// Why the local part did not run.
    pub(crate) local_skipped: Option<String>,
    /// S2 with telemetry off and on (`otel` part).
    pub(crate) otel: Option<crate::otel::OtelCompare>,
    pub(crate) targets: Vec<Target>,
    pub(crate) failures: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::new_hist;

    #[test]
    fn targets_compare_in_the_right_direction() {
        let t = Target::at_most("lag p99", 1.0, 0.25, "ms");
        assert!(t.met);
        assert_eq!(t.target, "≤ 1.00 ms");
        assert!((t.ratio - 0.25).abs() < 1e-9);
        let t = Target::at_least("events/s", 60_000.0, 30_000.0, "ev/s");
        assert!(!t.met);
        assert_eq!(t.measured, "30,000 ev/s");
    }

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
