//! The report: every part's results in one serializable record (the
//! `--json` file), the targets they are held against, and the markdown of
//! the whole run. It only aggregates: each part's record and section are
//! defined by the part's own module.

use std::fmt::Write as _;

use serde::Serialize;

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
    if [&b.echo_ttfe, &b.echo_saturation, &b.echo_unpaced]
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
