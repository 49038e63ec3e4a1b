//! The battery's markdown report and the violations it collected.

use std::fmt::Write as _;

use crate::{abuse, crash, disk, races};

/// Sections in run order, and every violation.
#[derive(Debug)]
pub(crate) struct Report {
    head: String,
    sections: Vec<String>,
    pub(crate) violations: Vec<String>,
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn table(rows: &[(&str, String)]) -> String {
    let mut out = String::from("| measure | value |\n|---|---|\n");
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    out
}

impl Report {
    pub(crate) fn new(seed: u64, args: &[String]) -> Self {
        Self {
            head: format!(
                "# agentrt-reliability (seed {seed})\n\n`{}`\n",
                args.join(" ")
            ),
            sections: Vec::new(),
            violations: Vec::new(),
        }
    }

    pub(crate) fn crash(&mut self, f: &crash::Figures, plan: &crash::Plan) {
        let kills: Vec<f64> = f.kill_events.iter().map(|&k| k as f64).collect();
        let kills = sorted(&kills);
        let restart = sorted(&f.restart_ms);
        let settle = sorted(&f.settle_ms);
        let rows = [
            ("store", f.store.clone()),
            (
                "cycles (kill -9 + restart)",
                format!("{} of {}", f.cycles, plan.cycles),
            ),
            (
                "sessions / connections",
                format!("{} / {}", plan.sessions, plan.connections),
            ),
            (
                "kill point (events received) min / p50 / max",
                format!(
                    "{} / {} / {}",
                    pct(&kills, 0.0),
                    pct(&kills, 0.5),
                    pct(&kills, 1.0)
                ),
            ),
            (
                "turns started / finished before a kill",
                format!("{} / {}", f.turns_started, f.turns_finished),
            ),
            (
                "caller tool results submitted",
                f.caller_tool_results.to_string(),
            ),
            (
                "server tools (MCP test__slow)",
                if plan.server_tools { "yes" } else { "no" }.to_owned(),
            ),
            (
                "unfinished requests sent again after a restart (same request_id)",
                f.retried.to_string(),
            ),
            (
                "fresh turns ended other than SUCCESS before a kill",
                format!(
                    "{}{}",
                    f.failed_turns,
                    if plan.strict_outcomes {
                        " (each a violation)"
                    } else {
                        " (counted: lease fencing under load)"
                    }
                ),
            ),
            ("acknowledged messages checked", f.acks_checked.to_string()),
            (
                "turns found INTERRUPTED after a restart",
                f.interrupted.to_string(),
            ),
            ("messages in history at the end", f.messages.to_string()),
            (
                "restart → readiness ms p50 / max",
                format!("{:.0} / {:.0}", pct(&restart, 0.5), pct(&restart, 1.0)),
            ),
            (
                "restart → all sessions settled and checked, ms p50 / max",
                format!("{:.0} / {:.0}", pct(&settle, 0.5), pct(&settle, 1.0)),
            ),
            ("wall time", format!("{:.1} s", f.wall.as_secs_f64())),
            ("violations", f.violations.len().to_string()),
        ];
        self.sections.push(format!(
            "## Crash (kill -9): {}\n\n{}",
            f.store,
            table(&rows)
        ));
        self.violations.extend(f.violations.iter().cloned());
    }

    pub(crate) fn races(&mut self, f: &races::Figures) {
        let rows = [
            ("rounds", f.rounds.to_string()),
            ("connections racing per round", f.racers.to_string()),
            ("admitted (want = rounds)", f.admitted.to_string()),
            (
                "SESSION_BUSY (want = rounds x (connections - 1))",
                f.busy.to_string(),
            ),
            (
                "messages stored and checked",
                f.messages_checked.to_string(),
            ),
            ("wall time", format!("{:.1} s", f.wall.as_secs_f64())),
            ("violations", f.violations.len().to_string()),
        ];
        self.sections
            .push(format!("## Admission races\n\n{}", table(&rows)));
        self.violations.extend(f.violations.iter().cloned());
    }

    pub(crate) fn abuse(&mut self, f: &abuse::Figures, plan: &abuse::Plan) {
        let mb = |kb: u64| format!("{:.0} MB", kb as f64 / 1024.0);
        let lag = |(p50, p99, max): (f64, f64, f64)| format!("{p50:.0} / {p99:.0} / {max:.0} µs");
        let rows = [
            (
                "callers that stop reading / vanish mid-turn",
                format!("{} / {}", f.stop_readers, f.vanishers),
            ),
            (
                "streams opened on one connection (admitted in the window)",
                format!("{} ({})", f.one_conn_streams, f.one_conn_admitted),
            ),
            (
                "victim sessions / turns / tokens per turn",
                format!(
                    "{} / {} / {}",
                    plan.victims, f.victim_turns, plan.victim_tokens
                ),
            ),
            (
                "window alone, then under abuse",
                format!("{:?} + {:?}", plan.window, plan.window),
            ),
            (
                "server RSS before / peak / after",
                format!(
                    "{} / {} / {} (bound {} MB)",
                    mb(f.rss_before_kb),
                    mb(f.rss_peak_kb),
                    mb(f.rss_after_kb),
                    plan.rss_limit_mb
                ),
            ),
            (
                "relay lag alone p50 / p99 / max",
                format!("{} ({} tokens)", lag(f.baseline_lag_us), f.baseline_tokens),
            ),
            (
                "relay lag under abuse p50 / p99 / max",
                format!("{} ({} tokens)", lag(f.abuse_lag_us), f.abuse_tokens),
            ),
            (
                "every abusive session idle again after",
                format!("{:.0} ms", f.idle_after_ms),
            ),
            ("wall time", format!("{:.1} s", f.wall.as_secs_f64())),
            ("violations", f.violations.len().to_string()),
        ];
        self.sections
            .push(format!("## Abusive clients\n\n{}", table(&rows)));
        self.violations.extend(f.violations.iter().cloned());
    }

    pub(crate) fn disk(&mut self, f: &disk::Figures, plan: &disk::Plan) {
        let opt = |v: Option<f64>| {
            v.map_or_else(|| "never (violation)".to_owned(), |v| format!("{v:.0}"))
        };
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
        let rows = [
            (
                "tmpfs / store_min_free_mb",
                format!("{} MiB / {} MiB", plan.size_mb, plan.min_free_mb),
            ),
            (
                "sessions / turns succeeded in all",
                format!("{} / {}", plan.sessions, f.turns_ok),
            ),
            (
                "watermark: free when checked; Chat / CreateSession refused \"disk is full\"",
                format!(
                    "{}; {} / {}",
                    mib(f.watermark_free),
                    f.refused_chat,
                    f.refused_create
                ),
            ),
            (
                "watermark: fill → readiness NOT_SERVING / filler removed → SERVING, ms",
                format!("{} / {}", opt(f.watermark_down_ms), opt(f.watermark_up_ms)),
            ),
            (
                "mid-turn: free when answers came; turns ended ERROR \"disk is full\"",
                format!(
                    "{}; {} of {}",
                    mib(f.mid_free),
                    f.mid_disk_full,
                    f.mid_turns
                ),
            ),
            (
                "mid-turn: fill → readiness NOT_SERVING / filler removed → SERVING, ms",
                format!("{} / {}", opt(f.mid_down_ms), opt(f.mid_up_ms)),
            ),
            (
                "hard full: turns ok before / ok after / refused / failed after the fill",
                format!(
                    "{} / {} / {} / {}",
                    f.hard_ok_before, f.hard_ok_after, f.hard_refused, f.hard_failed
                ),
            ),
            ("hard full: what refusals said", f.hard_refusals.join(" · ")),
            (
                "hard full: what failed turns said",
                f.hard_failures.join(" · "),
            ),
            (
                "hard full: free after the fill; → liveness NOT_SERVING, ms",
                format!("{}; {}", mib(f.hard_free), opt(f.liveness_down_ms)),
            ),
            (
                "restart (kill -9, space freed) → readiness, ms",
                opt(f.restart_ms),
            ),
            (
                "messages acknowledged (message_stored) in all / before the last restart, each checked after it",
                format!("{} / {}", f.acked, f.acks_checked),
            ),
            ("messages in history at the end", f.messages.to_string()),
            (
                "of which stored but never acknowledged to a client",
                if f.unacked.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{}: {}", f.unacked.len(), f.unacked.join(", "))
                },
            ),
            ("wall time", format!("{:.1} s", f.wall.as_secs_f64())),
            ("violations", f.violations.len().to_string()),
        ];
        self.sections
            .push(format!("## Disk full\n\n{}", table(&rows)));
        self.violations.extend(f.violations.iter().cloned());
    }

    pub(crate) fn markdown(&self) -> String {
        let mut out = self.head.clone();
        for s in &self.sections {
            out.push('\n');
            out.push_str(s);
        }
        if !self.violations.is_empty() {
            out.push_str("\n## Violations\n\n");
            for v in &self.violations {
                let _ = writeln!(out, "- {v}");
            }
        }
        out
    }
}
