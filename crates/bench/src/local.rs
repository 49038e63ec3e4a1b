//! The local model (`local/smollm2`) served by the real binary: load time,
//! time to first token, decode rate and memory, measured over gRPC like a
//! caller sees them, beside the feasibility study's figures.
//!
//! The server runs with no `default_model` and `[local_model] path` set,
//! so the local model is the default; each run is a new session with the
//! study's prompt ("Write a short story about a robot learning to paint.",
//! 41 tokens with the default system prompt), greedy, at most
//! `max_tokens` tokens.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use futures::StreamExt as _;
use serde::Serialize;

use crate::markdown::table;
use crate::proc_stats::RssSampler;
use crate::scenarios::Env;
use crate::server::Child;

/// The study's prompt.
const PROMPT: &str = "Write a short story about a robot learning to paint.";

/// Results of the local-model scenario.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct LocalModel {
    /// The GGUF file.
    pub(crate) model: String,
    /// Spawn → readiness SERVING (process start + model load).
    pub(crate) start_to_ready_ms: f64,
    /// The server's own "open → ready" of the model (from its log).
    pub(crate) load_ms: Option<f64>,
    /// Chat call → first text event, per run.
    pub(crate) ttft_ms: Vec<f64>,
    /// Prompt tokens (from usage).
    pub(crate) prompt_tokens: u64,
    /// Generated tokens per run.
    pub(crate) output_tokens: Vec<u64>,
    /// (output tokens − 1) ÷ (last text − first text), per run.
    pub(crate) decode_tok_s: Vec<f64>,
    /// Peak resident set of the server (VmHWM), MB.
    pub(crate) peak_rss_mb: f64,
    /// Threads of the server process at the end.
    pub(crate) threads: u64,
}

/// Where to look for the model when `--local-model` is not given.
pub(crate) fn default_candidates() -> Vec<PathBuf> {
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    vec![
        PathBuf::from(".ci/models").join(file),
        PathBuf::from("agentrt-data/models").join(file),
    ]
}

/// `text` without ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses the server log's `load_time=283.89ms` (a `Duration` debug form).
fn load_ms_from_log(log: &str) -> Option<f64> {
    let log = strip_ansi(log);
    let line = log.lines().find(|l| l.contains("local model loaded"))?;
    let value = line.split("load_time=").nth(1)?.split_whitespace().next()?;
    let (number, scale) = if let Some(v) = value.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = value.strip_suffix("µs") {
        (v, 1e-3)
    } else if let Some(v) = value.strip_suffix('s') {
        (v, 1e3)
    } else {
        return None;
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// Runs the scenario: `runs` turns of at most `max_tokens` tokens.
pub(crate) async fn local(
    env: &Env,
    model: &Path,
    runs: usize,
    max_tokens: usize,
) -> Result<LocalModel, String> {
    let model = std::fs::canonicalize(model).map_err(|e| format!("{}: {e}", model.display()))?;
    let dir = env.root.path().join("local");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).map_err(|e| format!("mkdir: {e}"))?;
    let config = format!(
        "heartbeat_interval = \"1h\"\nshutdown_grace = \"5s\"\n\n[local_model]\npath = \"{}\"\nmax_tokens = {max_tokens}\n",
        model.display()
    );
    let server = Child::agentrt_with_config(&env.spec, &dir, &data, &config).await?;
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let mut r = LocalModel {
        model: model.display().to_string(),
        start_to_ready_ms: server.ready_after.as_secs_f64() * 1e3,
        load_ms: load_ms_from_log(&log),
        ..LocalModel::default()
    };
    let client = Client::connect(server.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let sampler = RssSampler::start(vec![server.pid()], Duration::from_millis(20));
    for _ in 0..runs {
        // Titled, so no background title generation (which shares the one
        // inference thread) runs between the measured turns.
        let session = client
            .create_session(proto::CreateSessionRequest {
                title: "local model bench".into(),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("create session: {e}"))?
            .session_id;
        let start = Instant::now();
        let mut events = client
            .chat(&session, PROMPT)
            .await
            .map_err(|e| format!("chat: {e}"))?;
        let (mut first, mut last) = (None, None);
        let mut finished = None;
        while let Some(event) = events.next().await {
            let now = Instant::now();
            match event.map_err(|e| format!("stream: {e}"))?.kind {
                ChatEvent::Text(_) => {
                    first.get_or_insert(now);
                    last = Some(now);
                }
                ChatEvent::TurnFinished { outcome, usage, .. } => {
                    finished = Some((outcome, usage));
                }
                _ => {}
            }
        }
        let (outcome, usage) = finished.ok_or("no turn_finished")?;
        if outcome != proto::TurnOutcome::Success {
            return Err(format!("turn ended {outcome:?}"));
        }
        let (first, last) = first.zip(last).ok_or("no text")?;
        r.ttft_ms
            .push(first.duration_since(start).as_secs_f64() * 1e3);
        r.prompt_tokens = usage.input_tokens;
        r.output_tokens.push(usage.output_tokens);
        let span = last.duration_since(first).as_secs_f64();
        if usage.output_tokens > 1 && span > 0.0 {
            r.decode_tok_s.push((usage.output_tokens - 1) as f64 / span);
        }
    }
    let _ = sampler.stop().await;
    let stats = server.stats();
    r.peak_rss_mb = stats.hwm_kb as f64 / 1024.0;
    r.threads = stats.threads;
    let _ = server.terminate(Duration::from_secs(10)).await;
    Ok(r)
}

/// min / median / max of `v`, formatted.
fn spread(v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    format!(
        "{:.d$} (min {:.d$}, max {:.d$}, n={})",
        s[s.len() / 2],
        s[0],
        s[s.len() - 1],
        s.len(),
        d = digits
    )
}

/// The markdown section.
pub(crate) fn markdown(r: &LocalModel) -> String {
    let tokens: Vec<String> = r.output_tokens.iter().map(u64::to_string).collect();
    let rows = vec![
        vec![
            "model load (server log, open → ready)".into(),
            r.load_ms.map_or("–".into(), |ms| format!("{ms:.0} ms")),
            "0.49–0.67 s".into(),
        ],
        vec![
            "process start → readiness SERVING".into(),
            format!("{:.0} ms", r.start_to_ready_ms),
            "–".into(),
        ],
        vec![
            format!("TTFT, {}-token prompt, ms (median)", r.prompt_tokens),
            spread(&r.ttft_ms, 0),
            "450–640 ms (41 tokens)".into(),
        ],
        vec![
            "decode, tokens/s (median)".into(),
            spread(&r.decode_tok_s, 1),
            "41–48 tok/s".into(),
        ],
        vec![
            "tokens generated per turn".into(),
            tokens.join(", "),
            "100 (forced)".into(),
        ],
        vec![
            "peak RSS of the server".into(),
            format!("{:.0} MB", r.peak_rss_mb),
            "299 MB".into(),
        ],
        vec!["server threads".into(), r.threads.to_string(), "–".into()],
    ];
    format!(
        "## Local model (local/smollm2)\n\n`{}`, one inference thread, greedy, over gRPC \
         (TTFT includes admission and storing the user message). \"Study\" is the \
         feasibility study's candle Q8_0, 1-thread row (2 vCPU).\n\n{}",
        r.model,
        table(&["metric", "measured", "study"], &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_time_is_read_from_the_server_log() {
        let log = "x INFO local model loaded model=\"local/smollm2\" load_time=283.894489ms inference_threads=1\n";
        assert!((load_ms_from_log(log).unwrap() - 283.894_489).abs() < 1e-6);
        let log = "local model loaded load_time=1.5s\n";
        assert_eq!(load_ms_from_log(log), Some(1500.0));
        assert_eq!(load_ms_from_log("nothing"), None);
        let coloured = "local model loaded \u{1b}[3mload_time\u{1b}[0m\u{1b}[2m=\u{1b}[0m2ms x";
        assert_eq!(load_ms_from_log(coloured), Some(2.0));
    }
}
