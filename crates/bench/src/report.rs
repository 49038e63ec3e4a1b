//! The report: every part's results in one serializable record (the
//! `--json` file), the targets they are held against, and the markdown of
//! the whole run. It only aggregates: each part's record and section are
//! defined by the part's own module.

use std::fmt::Write as _;

use serde::Serialize;

use crate::burst::{self, BurstLevel, Sessions};
use crate::context::{self, ContextLoad};
use crate::durable::{self, S7};
use crate::latency::{self, S1, S2Level};
use crate::load::Load;
use crate::local::{self, LocalModel};
use crate::markdown::{num, table};
use crate::otel::{self, OtelCompare};
use crate::saturation::{self, Baselines, S3, S4Level};
use crate::shared_store;

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Machine {
    pub(crate) nproc: String,
    pub(crate) cpu_model: String,
    pub(crate) memory: String,
    pub(crate) kernel: String,
    pub(crate) rustc: String,
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
    /// Agent sessions beside plain ones (`agents` part).
    pub(crate) agents: Option<crate::agents::AgentsPart>,
    pub(crate) s2: Vec<S2Level>,
    /// S2 bursts beside the minimal relay (`s2` part).
    pub(crate) s2_burst: Vec<BurstLevel>,
    pub(crate) s3: Option<S3>,
    pub(crate) s4: Vec<S4Level>,
    pub(crate) s6: Vec<Load>,
    pub(crate) s7: Option<S7>,
    /// S9 context load (sizes in messages).
    pub(crate) s9: Vec<ContextLoad>,
    /// The local model (`local` part).
    pub(crate) local: Option<LocalModel>,
    /// Why the local part did not run.
    pub(crate) local_skipped: Option<String>,
    /// S2 with telemetry off and on (`otel` part).
    pub(crate) otel: Option<OtelCompare>,
    /// PostgreSQL beside sled, and forwarding (`p10` part).
    pub(crate) p10: Option<shared_store::P10>,
    /// Why the p10 part did not run.
    pub(crate) p10_skipped: Option<String>,
    /// LangGraph's Agent Server beside agentrt (`langgraph` part).
    pub(crate) langgraph: Option<crate::langgraph::LangGraphPart>,
    /// Why the langgraph part did not run.
    pub(crate) langgraph_skipped: Option<String>,
    pub(crate) targets: Vec<Target>,
    pub(crate) failures: Vec<String>,
}

/// The whole report as markdown (stdout, `--markdown`, pasted into
/// BENCHMARKS.md): the run, the targets, then each part's own section.
pub(crate) fn markdown(r: &Report) -> String {
    let mut out = String::new();
    let m = &r.machine;
    let _ = writeln!(
        out,
        "## Run\n\n{} run in {:.0} s: `{}`  \nserver `{}` (git {}), pinned to CPUs: {}  \n\
         machine: {} CPUs ({}), {} RAM, {}, {}\n",
        r.mode,
        r.duration_s,
        r.command,
        r.server_binary,
        r.git_commit,
        r.server_cpus.as_deref().unwrap_or("no"),
        m.nproc,
        m.cpu_model,
        m.memory,
        m.kernel,
        m.rustc
    );
    // A run of parts without targets (e.g. `--only p10`) has no summary.
    if !r.targets.is_empty() {
        targets_table(&mut out, r);
    }
    let b = &r.baselines;
    if [
        &b.echo_ttfe,
        &b.echo_saturation,
        &b.echo_unpaced,
        &b.relay_ttfe,
    ]
    .iter()
    .any(|l| l.turns > 0)
    {
        out.push_str(&saturation::markdown_baselines(b));
    }
    if let Some(s1) = &r.s1 {
        out.push_str(&latency::markdown_s1(s1));
    }
    if let Some(a) = &r.agents {
        out.push_str(&crate::agents::markdown(a));
    }
    if !r.s2.is_empty() {
        out.push_str(&latency::markdown_s2(&r.s2));
    }
    if let Some(s3) = &r.s3 {
        out.push_str(&saturation::markdown_s3(s3));
    }
    let relay_s3 = r.s3.as_ref().filter(|s| !s.relay.is_empty());
    let relay_s2 = r.s2.iter().any(|l| l.relay.turns > 0);
    if !r.s2_burst.is_empty() || relay_s2 || relay_s3.is_some() {
        out.push_str(&burst::markdown(&r.s2_burst, &r.s2, relay_s3));
    }
    if !r.s4.is_empty() {
        out.push_str(&saturation::markdown_s4(&r.s4));
    }
    if !r.s6.is_empty() {
        out.push_str(&durable::markdown_s6(&r.s6));
    }
    if let Some(s7) = &r.s7 {
        out.push_str(&durable::markdown_s7(s7));
    }
    if !r.s9.is_empty() {
        out.push_str(&context::markdown(&r.s9));
    }
    if let Some(l) = &r.local {
        let _ = writeln!(out, "\n{}", local::markdown(l));
    } else if let Some(why) = &r.local_skipped {
        let _ = writeln!(out, "\n## Local model (local/smollm2)\n\n{why}");
    }
    if let Some(o) = &r.otel {
        let _ = writeln!(out, "\n{}", otel::markdown(o));
    }
    if let Some(p) = &r.p10 {
        out.push_str(&shared_store::markdown(p));
    } else if let Some(why) = &r.p10_skipped {
        let _ = writeln!(out, "\n## P10: PostgreSQL and forwarding\n\nskipped: {why}");
    }
    if let Some(p) = &r.langgraph {
        out.push_str(&crate::langgraph::markdown(p));
    } else if let Some(why) = &r.langgraph_skipped {
        let _ = writeln!(out, "\n## Side by side with LangGraph\n\nskipped: {why}");
    }
    if !r.failures.is_empty() {
        let _ = writeln!(out, "\n## Failures\n");
        for f in &r.failures {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

/// The targets held against the minimal relay: with the burst level
/// nearest 100 Chats at once, on new and on warm sessions, Chat → upstream
/// request p50 ≤ 2× and p99 ≤ 3× the relay's and first-event p99 ≤ 2×; S3
/// (on one session per loop, and on a new session per turn) at least 0.8×
/// the relay's tokens/s and at most 1.5× its server CPU per token.
pub(crate) fn relay_targets(r: &Report) -> Vec<Target> {
    let mut t = Vec::new();
    for kind in [Sessions::New, Sessions::Warm] {
        let Some(b) = r
            .s2_burst
            .iter()
            .filter(|b| b.kind == kind)
            .min_by_key(|b| b.sessions.abs_diff(100))
        else {
            continue;
        };
        let what = format!("{} Chats at once, {} sessions", b.sessions, kind.name());
        let v = &b.vs_relay;
        t.push(Target::at_most(
            &format!("Chat → upstream request p50 ÷ relay, {what}"),
            2.0,
            v.admission_p50,
            "×",
        ));
        t.push(Target::at_most(
            &format!("Chat → upstream request p99 ÷ relay, {what}"),
            3.0,
            v.admission_p99,
            "×",
        ));
        t.push(Target::at_most(
            &format!("first token → first event p99 ÷ relay, {what}"),
            2.0,
            v.first_event_p99,
            "×",
        ));
    }
    if let Some(s3) = r.s3.as_ref().filter(|s| !s.relay.is_empty()) {
        let variants = [
            ("S3", s3.saturation_vs_relay, s3.cpu_vs_relay),
            (
                "S3 new session per turn",
                s3.new_session_saturation_vs_relay,
                s3.new_session_cpu_vs_relay,
            ),
        ];
        for (name, saturation, cpu) in variants {
            t.push(Target::at_least(
                &format!("saturation tokens/s ÷ relay, {name}"),
                0.8,
                saturation,
                "×",
            ));
            t.push(Target::at_most(
                &format!("server CPU per token at saturation ÷ relay, {name}"),
                1.5,
                cpu,
                "×",
            ));
        }
    }
    t
}

/// The targets table (the run's summary).
fn targets_table(out: &mut String, r: &Report) {
    let _ = writeln!(out, "## Summary: targets ({} run)\n", r.mode);
    let rows: Vec<Vec<String>> = r
        .targets
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.target.clone(),
                t.measured.clone(),
                format!("{:.2}", t.ratio),
                if t.met { "met" } else { "**missed**" }.to_owned(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["target", "bound", "measured", "measured ÷ bound", ""],
        &rows,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn load(admission_p50_us: f64, first_p99_us: f64, tokens_per_s: f64, cpu: f64) -> Load {
        use crate::load::Lat;
        Load {
            turns: 10,
            tokens_per_s,
            cpu_us_per_token: cpu,
            admission: Lat {
                count: 10,
                p50_us: admission_p50_us,
                p99_us: admission_p50_us * 2.0,
                ..Lat::default()
            },
            first_relay: Lat {
                count: 10,
                p99_us: first_p99_us,
                ..Lat::default()
            },
            ..Load::default()
        }
    }

    #[test]
    fn relay_targets_are_agentrt_over_the_relay() {
        use crate::load::VsRelay;
        let burst = |sessions, kind, agentrt: Load, relay: Load| BurstLevel {
            sessions,
            kind,
            rounds: 1,
            connections: sessions,
            vs_relay: VsRelay::of(&agentrt, &relay),
            agentrt,
            relay,
        };
        let relay = load(1_000.0, 500.0, 100_000.0, 4.0);
        let r = Report {
            s2_burst: vec![
                // The level nearest 100 counts, not the other one.
                burst(
                    10,
                    Sessions::New,
                    load(9_000.0, 400.0, 0.0, 0.0),
                    relay.clone(),
                ),
                burst(
                    100,
                    Sessions::New,
                    load(1_500.0, 900.0, 0.0, 0.0),
                    relay.clone(),
                ),
                burst(
                    100,
                    Sessions::Warm,
                    load(2_500.0, 2_000.0, 0.0, 0.0),
                    relay.clone(),
                ),
            ],
            s3: Some(S3 {
                agentrt: vec![load(0.0, 0.0, 90_000.0, 5.0)],
                new_session: vec![load(0.0, 0.0, 70_000.0, 7.0)],
                relay: vec![relay],
                saturation_vs_relay: 0.9,
                new_session_saturation_vs_relay: 0.7,
                cpu_vs_relay: 1.25,
                new_session_cpu_vs_relay: 1.75,
                ..S3::default()
            }),
            ..Report::default()
        };
        let t = relay_targets(&r);
        let met: Vec<(&str, bool)> = t.iter().map(|t| (t.name.as_str(), t.met)).collect();
        assert_eq!(
            met,
            [
                (
                    "Chat → upstream request p50 ÷ relay, 100 Chats at once, new sessions",
                    true
                ),
                (
                    "Chat → upstream request p99 ÷ relay, 100 Chats at once, new sessions",
                    true
                ),
                (
                    "first token → first event p99 ÷ relay, 100 Chats at once, new sessions",
                    true
                ),
                (
                    "Chat → upstream request p50 ÷ relay, 100 Chats at once, warm sessions",
                    false
                ),
                (
                    "Chat → upstream request p99 ÷ relay, 100 Chats at once, warm sessions",
                    true
                ),
                (
                    "first token → first event p99 ÷ relay, 100 Chats at once, warm sessions",
                    false
                ),
                ("saturation tokens/s ÷ relay, S3", true),
                ("server CPU per token at saturation ÷ relay, S3", true),
                (
                    "saturation tokens/s ÷ relay, S3 new session per turn",
                    false
                ),
                (
                    "server CPU per token at saturation ÷ relay, S3 new session per turn",
                    false
                ),
            ]
        );
        assert_eq!(t[0].measured, "1.50 ×");
        // A relay without a value gives no ratio, and no met target.
        let none = VsRelay::of(&load(1_000.0, 1.0, 1.0, 1.0), &Load::default());
        assert!(none.admission_p50.is_nan());
        assert!(!Target::at_most("x", 2.0, none.admission_p50, "×").met);
        let md = markdown(&r);
        assert!(md.contains("## Against the minimal relay"), "{md}");
        assert!(
            md.contains("| 100 | warm | 1 | 2.50 / 1.00 (2.50×) | 5.00 / 2.00 (2.50×) |"),
            "{md}"
        );
    }

    #[test]
    fn the_report_renders_every_section_it_has() {
        let r = Report {
            mode: "smoke".into(),
            targets: vec![Target::at_most("TTFE overhead p50 @100", 0.5, 0.3, "ms")],
            s1: Some(S1 {
                agentrt: Load {
                    label: "agentrt".into(),
                    sessions: 1,
                    turns: 3,
                    ..Load::default()
                },
                ..S1::default()
            }),
            s6: vec![Load {
                sessions: 8,
                turns: 100,
                turns_per_s: 1234.0,
                ..Load::default()
            }],
            failures: vec!["S2: boom".into()],
            ..Report::default()
        };
        let md = markdown(&r);
        assert!(
            md.contains("| TTFE overhead p50 @100 | ≤ 0.500 ms | 0.300 ms | 0.60 | met |"),
            "{md}"
        );
        assert!(md.contains("## S1 single session"));
        assert!(md.contains("| 8 | 100 | 1,234 |"), "{md}");
        assert!(md.contains("- S2: boom"));
        assert!(!md.contains("## S3"));
    }
}
