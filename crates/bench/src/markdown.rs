//! The markdown rendering of a [`Report`] (stdout, `--markdown`, pasted
//! into BENCHMARKS.md).

use std::fmt::Write as _;

use crate::report::{Lat, Load, Report};

/// A number with sensible precision: 3 significant digits below 1000,
/// thousands separated above.
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let mut digits = format!("{a:.0}");
        let mut out = String::new();
        while digits.len() > 3 {
            let tail = digits.split_off(digits.len() - 3);
            out = format!(",{tail}{out}");
        }
        format!("{}{digits}{out}", if v < 0.0 { "-" } else { "" })
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

/// Microseconds shown in ms.
pub(crate) fn ms(us: f64) -> String {
    num(us / 1000.0)
}

/// A markdown table.
pub(crate) fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", head.iter().map(|_| "---|").collect::<String>());
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

fn lat3(l: &Lat) -> String {
    if l.count == 0 {
        return "–".into();
    }
    format!("{} / {} / {}", ms(l.p50_us), ms(l.p99_us), ms(l.p999_us))
}

fn lat2(l: &Lat) -> String {
    if l.count == 0 {
        return "–".into();
    }
    format!("{} / {}", ms(l.p50_us), ms(l.p99_us))
}

fn load_row(l: &Load) -> Vec<String> {
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

fn fail_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} failed)")
    }
}

const LOAD_HEAD: &[&str] = &[
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

/// The whole report as markdown.
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
    let b = &r.baselines;
    let _ = writeln!(out, "\n## Baselines\n");
    let rows: Vec<_> = [&b.echo_ttfe, &b.echo_saturation, &b.echo_unpaced]
        .into_iter()
        .filter(|l| l.turns > 0)
        .map(load_row)
        .collect();
    out.push_str(&table(LOAD_HEAD, &rows));
    if let Some(s1) = &r.s1 {
        let _ = writeln!(
            out,
            "\n## S1 single session\n\nTTFE overhead p50 {} ms, p99 {} ms (agentrt quantile − direct quantile).\n",
            ms(s1.ttfe_overhead_p50_us),
            ms(s1.ttfe_overhead_p99_us)
        );
        out.push_str(&table(
            LOAD_HEAD,
            &[load_row(&s1.agentrt), load_row(&s1.direct)],
        ));
        out.push_str(&decomposition(&[&s1.agentrt, &s1.direct]));
    }
    if !r.s2.is_empty() {
        let _ = writeln!(out, "\n## S2 concurrency sweep\n");
        let rows: Vec<_> =
            r.s2.iter()
                .map(|l| {
                    vec![
                        l.sessions.to_string(),
                        ms(l.ttfe_overhead_p50_us),
                        ms(l.ttfe_overhead_p99_us),
                        lat3(&l.agentrt.lag),
                        lat2(&l.echo.lag),
                        num(l.agentrt.cpu_us_per_event),
                        num(l.echo.cpu_us_per_event),
                        format!("{:.2}", l.cpu_ratio),
                        num(l.agentrt.rss_per_session_kb),
                        num(l.echo.rss_per_session_kb),
                        format!(
                            "{}{}",
                            num(l.agentrt.tokens_per_s),
                            fail_note(l.agentrt.failures)
                        ),
                    ]
                })
                .collect();
        out.push_str(&table(
            &[
                "sessions",
                "TTFE overhead p50 ms",
                "p99 ms",
                "lag p50 / p99 / p99.9 ms",
                "echo lag p50 / p99 ms",
                "CPU µs/event",
                "echo µs/event",
                "cpu ratio",
                "RSS KB/session",
                "echo KB/stream",
                "tokens/s",
            ],
            &rows,
        ));
        let _ = writeln!(out, "\nEvery run:\n");
        let rows: Vec<_> =
            r.s2.iter()
                .flat_map(|l| [load_row(&l.agentrt), load_row(&l.direct), load_row(&l.echo)])
                .collect();
        out.push_str(&table(LOAD_HEAD, &rows));
        let loads: Vec<&Load> = r.s2.iter().map(|l| &l.agentrt).collect();
        out.push_str(&decomposition(&loads));
    }
    if let Some(s3) = &r.s3 {
        let _ = writeln!(
            out,
            "\n## S3 saturation (unpaced)\n\nmax {} tokens/s end to end; direct from the fake {} /s; \
             ratio to paced echo (a) {:.2}, to unpaced echo {:.3}, to direct (b) {:.2}, \
             to min(a, b) {:.2}.\n",
            num(s3.max_tokens_per_s),
            num(s3.direct_max_tokens_per_s),
            s3.ratio_echo,
            s3.ratio_echo_unpaced,
            s3.ratio_direct,
            s3.throughput_ratio
        );
        let rows: Vec<_> = s3.agentrt.iter().chain(&s3.direct).map(load_row).collect();
        out.push_str(&table(LOAD_HEAD, &rows));
    }
    if !r.s4.is_empty() {
        let _ = writeln!(out, "\n## S4 fan-out (one turn, N Subscribe watchers)\n");
        let rows: Vec<_> =
            r.s4.iter()
                .map(|l| {
                    vec![
                        l.watchers.to_string(),
                        num(l.delivered_per_s),
                        lat3(&l.watch.lag),
                        lat3(&l.caller.lag),
                        l.watch.gaps.to_string(),
                        num(l.watch.cpu_us_per_event),
                        fail_note(l.watch.failures + l.caller.failures),
                    ]
                })
                .collect();
        out.push_str(&table(
            &[
                "watchers",
                "tokens/s delivered to watchers",
                "watcher lag p50 / p99 / p99.9 ms",
                "caller lag ms",
                "gaps",
                "server CPU µs/event",
                "failures",
            ],
            &rows,
        ));
    }
    if !r.s6.is_empty() {
        let _ = writeln!(out, "\n## S6 durable short turns (builtin/echo)\n");
        let rows: Vec<_> =
            r.s6.iter()
                .map(|l| {
                    vec![
                        l.sessions.to_string(),
                        format!("{}{}", l.turns, fail_note(l.failures)),
                        num(l.turns_per_s),
                        lat3(&l.turn),
                        num(if l.turns > 0 {
                            l.server_cpu_us as f64 / l.turns as f64
                        } else {
                            0.0
                        }),
                        format!("{:.2} / {:.2}", l.server_cores, l.bench_cores),
                    ]
                })
                .collect();
        out.push_str(&table(
            &[
                "sessions",
                "turns",
                "turns/s",
                "turn p50 / p99 / p99.9 ms",
                "server CPU µs/turn",
                "cores server / bench",
            ],
            &rows,
        ));
    }
    if let Some(s7) = &r.s7 {
        let _ = writeln!(out, "\n## S7 idle capacity\n");
        let rows = vec![
            vec![
                "sessions (one echo turn each)".into(),
                s7.sessions.to_string(),
            ],
            vec![
                "fill time / turns/s".into(),
                format!("{} s / {}", num(s7.fill_s), num(s7.fill_turns_per_s)),
            ],
            vec![
                "RSS start-up → filled".into(),
                format!(
                    "{} → {} KB",
                    num(s7.rss_startup_kb as f64),
                    num(s7.rss_filled_kb as f64)
                ),
            ],
            vec!["KB per idle session".into(), num(s7.kb_per_idle_session)],
            vec![
                "ListSessions all (pages)".into(),
                format!(
                    "{} ms ({} pages, {} sessions)",
                    num(s7.list_ms),
                    s7.list_pages,
                    s7.listed
                ),
            ],
            vec![
                "SIGTERM → exit".into(),
                format!("{} ms (exit ok: {})", num(s7.drain_ms), s7.drain_exit_ok),
            ],
            vec![
                "restart: spawn → listening / → readiness SERVING".into(),
                format!(
                    "{} ms / {} ms",
                    num(s7.restart_listening_ms),
                    num(s7.restart_ready_ms)
                ),
            ],
            vec![
                "RSS after restart / after listing all".into(),
                format!(
                    "{} / {} KB",
                    num(s7.rss_restarted_kb as f64),
                    num(s7.rss_after_list_kb as f64)
                ),
            ],
            vec![
                "ListSessions all after restart".into(),
                format!("{} ms", num(s7.list_after_restart_ms)),
            ],
        ];
        out.push_str(&table(&["measure", "value"], &rows));
    }
    if !r.s9.is_empty() {
        let _ = writeln!(out, "\n## S9 context load (sled, in process)\n");
        out.push_str(&crate::context::table(&r.s9));
    }
    if let Some(l) = &r.local {
        let _ = writeln!(out, "\n{}", crate::local::markdown(l));
    } else if let Some(why) = &r.local_skipped {
        let _ = writeln!(out, "\n## Local model (local/smollm2)\n\n{why}");
    }
    if let Some(o) = &r.otel {
        let _ = writeln!(out, "\n{}", crate::otel::markdown(o));
    }
    if !r.failures.is_empty() {
        let _ = writeln!(out, "\n## Failures\n");
        for f in &r.failures {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

/// Where the TTFE goes: request → upstream request, first emit → first event.
fn decomposition(loads: &[&Load]) -> String {
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
    use crate::report::{S1, Target};

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(0.01234), "0.012");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(123.4), "123");
        assert_eq!(num(61_234.0), "61,234");
        assert_eq!(num(1_234_567.0), "1,234,567");
        assert_eq!(num(-2_500.0), "-2,500");
        assert_eq!(num(f64::NAN), "n/a");
        assert_eq!(ms(1_500.0), "1.50");
    }

    #[test]
    fn tables_are_markdown() {
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
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
