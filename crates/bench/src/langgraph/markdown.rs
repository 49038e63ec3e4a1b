//! The `langgraph` part's section of the report: the levels side by side,
//! their ratios, the probes and theirs.

use std::fmt::Write as _;

use super::LangGraphPart;
use crate::load::{Load, fail_note, lat2};
use crate::markdown::{ms, num, table};

/// `a ÷ b`, NaN when `b` is not positive (shown as "–").
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 && a.is_finite() {
        a / b
    } else {
        f64::NAN
    }
}

fn times(r: f64) -> String {
    if r.is_finite() {
        format!("{}×", num(r))
    } else {
        "–".into()
    }
}

/// Server CPU per text token (µs).
fn cpu_per_token(l: &Load) -> f64 {
    if l.tokens > 0 {
        l.server_cpu_us as f64 / l.tokens as f64
    } else {
        f64::NAN
    }
}

/// A latency quantile pair as "p50 / p99" ms, or "–".
fn pair(p50_us: f64, p99_us: f64) -> String {
    format!("{} / {}", ms(p50_us), ms(p99_us))
}

/// The part's section of the report.
pub(crate) fn section(p: &LangGraphPart) -> String {
    let mut out = String::new();
    let v = |k: &str| p.versions.get(k).map_or("?", String::as_str);
    let _ = writeln!(
        out,
        "\n## Side by side with LangGraph\n\n\
         LangGraph's in-memory Agent Server: langgraph-cli {}, langgraph-api {}, \
         langgraph-runtime-inmem {}, langgraph {}, langchain-openai {}, Python {} (venv `{}`). \
         Its graph streams from the same fake upstream as agentrt; paced turns: \
         first token after {} ms, {} tokens at {} tokens/s, back to back for {} s \
         (+ up to {} s to finish). Configurations:\n",
        v("langgraph-cli"),
        v("langgraph-api"),
        v("langgraph-runtime-inmem"),
        v("langgraph"),
        v("langchain-openai"),
        p.python,
        p.venv,
        num(p.paced.ttft_ms),
        p.paced.tokens,
        num(p.paced.rate),
        num(p.window_s),
        num(p.drain_s),
    );
    for c in &p.configs {
        let _ = writeln!(
            out,
            "- {}: `{}` (jobs the server logged: {})",
            c.label,
            c.command,
            c.jobs_logged.map_or("?".to_owned(), |n| n.to_string())
        );
    }
    let _ = writeln!(
        out,
        "\nEnvironment: {}; removed: {}.\n",
        p.env_set
            .iter()
            .map(|e| format!("`{e}`"))
            .collect::<Vec<_>>()
            .join(", "),
        p.env_removed.join(", ")
    );
    let rows: Vec<Vec<String>> = p
        .levels
        .iter()
        .flat_map(|l| {
            let d = &l.direct;
            let direct = vec![
                l.sessions.to_string(),
                "fake read directly".into(),
                format!("{}{}", d.turns, fail_note(d.failures)),
                "–".into(),
                lat2(&d.ttfe),
                "–".into(),
                "–".into(),
                lat2(&d.lag),
                num(d.tokens_per_s),
                "–".into(),
                "–".into(),
                "–".into(),
            ];
            let runs = l.runs.iter().map(move |r| {
                let a = &r.load;
                vec![
                    l.sessions.to_string(),
                    r.runtime.clone(),
                    format!("{}{}", a.turns, fail_note(a.failures)),
                    r.unfinished.to_string(),
                    lat2(&a.ttfe),
                    pair(a.ttfe.p50_us - d.ttfe.p50_us, a.ttfe.p99_us - d.ttfe.p99_us),
                    lat2(&a.admission),
                    lat2(&a.first_relay),
                    lat2(&a.lag),
                    num(a.tokens_per_s),
                    format!("{} / {}", num(a.cpu_us_per_event), num(cpu_per_token(a))),
                    num(a.rss_per_session_kb),
                ]
            });
            std::iter::once(direct).chain(runs)
        })
        .collect();
    out.push_str(&table(
        &[
            "sessions",
            "runtime",
            "turns",
            "unfinished",
            "TTFE p50 / p99 ms",
            "TTFE overhead p50 / p99 ms",
            "send → upstream request p50 / p99 ms",
            "upstream first token → first event p50 / p99 ms",
            "lag p50 / p99 ms",
            "tokens/s",
            "server CPU µs/event / µs/token",
            "RSS KB/live session",
        ],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\nRatios, LangGraph ÷ agentrt (how many times LangGraph's cost; tokens/s: agentrt ÷ LangGraph):\n"
    );
    let rows: Vec<Vec<String>> = p
        .levels
        .iter()
        .flat_map(|l| {
            let agentrt = l.runs.iter().find(|r| r.runtime == "agentrt");
            l.runs
                .iter()
                .filter(|r| r.runtime != "agentrt")
                .filter_map(move |r| {
                    let (a, g, d) = (&agentrt?.load, &r.load, &l.direct);
                    Some(vec![
                        l.sessions.to_string(),
                        r.runtime.clone(),
                        times(ratio(
                            g.ttfe.p50_us - d.ttfe.p50_us,
                            a.ttfe.p50_us - d.ttfe.p50_us,
                        )),
                        times(ratio(g.admission.p50_us, a.admission.p50_us)),
                        format!(
                            "{} / {}",
                            times(ratio(g.first_relay.p50_us, a.first_relay.p50_us)),
                            times(ratio(g.first_relay.p99_us, a.first_relay.p99_us))
                        ),
                        times(ratio(g.lag.p99_us, a.lag.p99_us)),
                        times(ratio(cpu_per_token(g), cpu_per_token(a))),
                        times(ratio(g.rss_per_session_kb, a.rss_per_session_kb)),
                        times(ratio(a.tokens_per_s, g.tokens_per_s)),
                    ])
                })
        })
        .collect();
    out.push_str(&table(
        &[
            "sessions",
            "LangGraph",
            "TTFE overhead p50",
            "send → upstream request p50",
            "first token → first event p50 / p99",
            "lag p99",
            "CPU per token",
            "RSS per live session",
            "tokens/s (agentrt ÷ LangGraph)",
        ],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\nProbes (fresh server each): memory per idle thread/session (each had one short turn); \
         a second run on a thread whose run is streaming (`multitask_strategy: \"reject\"`; \
         agentrt: a second Chat, `on_busy` REJECT); cancelling a streaming run \
         (LangGraph: `POST …/cancel?action=interrupt`; agentrt: `StopSession`), timed to the \
         stream's close; saturation: unpaced turns of {} tokens.\n",
        p.saturation.tokens
    );
    let rows: Vec<Vec<String>> = p
        .probes
        .iter()
        .map(|q| {
            let s = &q.saturation;
            vec![
                q.runtime.clone(),
                format!("{} ({})", num(q.kb_per_idle_thread), q.idle_threads),
                format!("{}: {}", q.busy.outcome, lat2(&q.busy.latency)),
                format!("{}: {}", q.cancel.outcome, lat2(&q.cancel.latency)),
                format!(
                    "{}{}{}",
                    s.sessions,
                    fail_note(s.failures),
                    if q.saturation_unfinished > 0 {
                        format!(" ({} unfinished)", q.saturation_unfinished)
                    } else {
                        String::new()
                    }
                ),
                num(s.tokens_per_s),
                num(s.events_per_s),
                format!("{} / {}", num(s.cpu_us_per_event), num(cpu_per_token(s))),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "runtime",
            "KB per idle thread (threads)",
            "busy: answer: p50 / p99 ms",
            "cancel → stream closed: p50 / p99 ms",
            "saturation sessions",
            "tokens/s",
            "events/s",
            "CPU µs/event / µs/token",
        ],
        &rows,
    ));
    if let Some(a) = p.probes.iter().find(|q| q.runtime == "agentrt") {
        let rows: Vec<Vec<String>> = p
            .probes
            .iter()
            .filter(|q| q.runtime != "agentrt")
            .map(|g| {
                vec![
                    g.runtime.clone(),
                    times(ratio(g.kb_per_idle_thread, a.kb_per_idle_thread)),
                    times(ratio(g.busy.latency.p50_us, a.busy.latency.p50_us)),
                    times(ratio(g.cancel.latency.p50_us, a.cancel.latency.p50_us)),
                    times(ratio(a.saturation.tokens_per_s, g.saturation.tokens_per_s)),
                    times(ratio(
                        cpu_per_token(&g.saturation),
                        cpu_per_token(&a.saturation),
                    )),
                ]
            })
            .collect();
        let _ = writeln!(out, "\nProbe ratios, LangGraph ÷ agentrt:\n");
        out.push_str(&table(
            &[
                "LangGraph",
                "KB per idle thread",
                "busy answer p50",
                "cancel → closed p50",
                "saturation tokens/s (agentrt ÷ LangGraph)",
                "CPU per token at saturation",
            ],
            &rows,
        ));
    }
    if !p.notes.is_empty() {
        let _ = writeln!(out, "\nServers: {}.", p.notes.join("; "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::langgraph::{Level, PeerConfig, Run};
    use crate::load::Lat;

    #[test]
    fn ratios_read_as_times_and_refuse_nonsense() {
        assert_eq!(times(ratio(30.0, 10.0)), "3.00×");
        assert_eq!(times(ratio(1.0, 0.0)), "–");
        assert_eq!(times(ratio(1.0, -2.0)), "–");
        assert_eq!(times(ratio(f64::NAN, 2.0)), "–");
    }

    #[test]
    fn the_section_shows_levels_ratios_and_probes() {
        let load = |label: &str, ttfe: f64, tokens_per_s: f64| Load {
            label: label.into(),
            sessions: 10,
            turns: 20,
            tokens: 1000,
            server_cpu_us: 50_000,
            tokens_per_s,
            ttfe: Lat {
                count: 20,
                p50_us: ttfe,
                p99_us: ttfe * 2.0,
                ..Lat::default()
            },
            ..Load::default()
        };
        let part = LangGraphPart {
            python: "3.11.7".into(),
            versions: [("langgraph-cli".to_owned(), "0.4.40".to_owned())].into(),
            configs: vec![PeerConfig {
                label: "LangGraph stock".into(),
                command: "langgraph dev".into(),
                jobs_flag: None,
                jobs_logged: Some(1),
            }],
            levels: vec![Level {
                sessions: 10,
                direct: load("direct", 20_000.0, 500.0),
                runs: vec![
                    Run {
                        runtime: "agentrt".into(),
                        load: load("agentrt", 21_000.0, 500.0),
                        unfinished: 0,
                    },
                    Run {
                        runtime: "LangGraph stock".into(),
                        load: load("lg", 520_000.0, 50.0),
                        unfinished: 7,
                    },
                ],
            }],
            ..LangGraphPart::default()
        };
        let md = section(&part);
        assert!(md.contains("## Side by side with LangGraph"), "{md}");
        assert!(md.contains("langgraph-cli 0.4.40"), "{md}");
        assert!(md.contains("(jobs the server logged: 1)"), "{md}");
        // TTFE overhead 500 ms vs 1 ms: 500×; tokens/s 500 vs 50: 10×.
        assert!(md.contains("| 10 | LangGraph stock | 500× |"), "{md}");
        assert!(md.contains("| 10.0× |"), "{md}");
        assert!(md.contains("| 10 | LangGraph stock | 20 | 7 |"), "{md}");
    }
}
