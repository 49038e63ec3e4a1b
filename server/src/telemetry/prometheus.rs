//! `/metrics`: the SDK's metrics, read on demand by a pull reader and
//! rendered in the Prometheus text exposition format (0.0.4), on a listener
//! of its own (`--metrics-listen`).
//!
//! One instrumentation path: the instruments are the OpenTelemetry ones
//! (the same that a periodic OTLP reader exports when the environment asks
//! for it); this module only renders. Names follow the usual OTLP →
//! Prometheus mapping: `.` → `_`, the unit as a suffix (`_seconds`), `_total`
//! on counters; units in braces (`{token}`) are annotations and add nothing.
//!
//! The listener speaks just enough HTTP/1.1 for a scraper: one `GET` per
//! connection, answered and closed, with bounded request size and
//! concurrency, and deadlines that hold for clients without credentials
//! that connect and never send, or never read: the request within
//! [`REQUEST_TIMEOUT`], each write within [`WRITE_TIMEOUT`], the whole
//! connection within [`TOTAL_TIMEOUT`]. [`MAX_CONNECTIONS`] is far above
//! what a few slow clients hold, so a scrape is answered at once; at the
//! cap, connections wait for one of those deadlines. The port should be
//! reachable by the scraper only (the deploy's NetworkPolicy limits it).

use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::health::HealthProbe;

/// Largest request head a scraper may send.
const MAX_REQUEST: usize = 8 << 10;
/// Connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;
/// A client that has not sent its request within this time is dropped (a
/// scraper sends it at once).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A write of the answer that makes no progress for this long drops the
/// connection (a client that does not read).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is served, request and answer together.
pub const TOTAL_TIMEOUT: Duration = Duration::from_secs(15);
/// Bytes written per write call, each under [`WRITE_TIMEOUT`].
const WRITE_CHUNK: usize = 64 << 10;

/// The pull reader behind `/metrics`.
#[derive(Debug, Clone)]
pub struct Registry {
    reader: Arc<ManualReader>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

/// The reader handed to the meter provider, sharing [`Registry`]'s.
#[derive(Debug)]
pub struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

impl Registry {
    /// A registry with a cumulative pull reader.
    pub fn new() -> Self {
        Self {
            reader: Arc::new(
                ManualReader::builder()
                    .with_temporality(Temporality::Cumulative)
                    .build(),
            ),
        }
    }

    /// The reader to register with the meter provider (once).
    pub fn reader(&self) -> SharedReader {
        SharedReader(Arc::clone(&self.reader))
    }

    /// Every series now, as Prometheus text.
    pub fn render(&self) -> String {
        let mut rm = ResourceMetrics::default();
        let mut out = String::new();
        if let Err(err) = self.reader.collect(&mut rm) {
            tracing::warn!(error = %err, "collecting metrics failed");
            return out;
        }
        for scope in rm.scope_metrics() {
            for metric in scope.metrics() {
                render_metric(&mut out, metric);
            }
        }
        out
    }
}

/// `name` made a valid Prometheus metric or label name.
fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

fn unit_suffix(unit: &str) -> &'static str {
    match unit {
        "s" => "_seconds",
        "ms" => "_milliseconds",
        "By" => "_bytes",
        _ => "",
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        format!("{v}")
    }
}

fn labels<'a>(attrs: impl Iterator<Item = &'a KeyValue>, extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = attrs
        .map(|kv| {
            let value = match &kv.value {
                Value::String(s) => s.as_str().to_owned(),
                other => other.to_string(),
            };
            format!("{}=\"{}\"", sanitize(kv.key.as_str()), escape(&value))
        })
        .collect();
    parts.sort();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// A value type the SDK aggregates.
trait Num: Copy {
    fn f(self) -> f64;
}
impl Num for f64 {
    fn f(self) -> f64 {
        self
    }
}
impl Num for u64 {
    #[allow(clippy::cast_precision_loss)]
    fn f(self) -> f64 {
        self as f64
    }
}
impl Num for i64 {
    #[allow(clippy::cast_precision_loss)]
    fn f(self) -> f64 {
        self as f64
    }
}

fn render_metric(out: &mut String, metric: &Metric) {
    let base = format!("{}{}", sanitize(metric.name()), unit_suffix(metric.unit()));
    match metric.data() {
        AggregatedMetrics::F64(d) => render_data(out, &base, metric.description(), d),
        AggregatedMetrics::U64(d) => render_data(out, &base, metric.description(), d),
        AggregatedMetrics::I64(d) => render_data(out, &base, metric.description(), d),
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn render_data<T: Num>(out: &mut String, base: &str, help: &str, data: &MetricData<T>) {
    match data {
        MetricData::Gauge(g) => {
            header(out, base, help, "gauge");
            for p in g.data_points() {
                let _ = writeln!(
                    out,
                    "{base}{} {}",
                    labels(p.attributes(), None),
                    number(p.value().f())
                );
            }
        }
        MetricData::Sum(s) => {
            let name = if s.is_monotonic() {
                format!("{base}_total")
            } else {
                base.to_owned()
            };
            header(
                out,
                &name,
                help,
                if s.is_monotonic() { "counter" } else { "gauge" },
            );
            for p in s.data_points() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(p.attributes(), None),
                    number(p.value().f())
                );
            }
        }
        MetricData::Histogram(h) => {
            header(out, base, help, "histogram");
            for p in h.data_points() {
                let attrs: Vec<&KeyValue> = p.attributes().collect();
                let mut cumulative = 0u64;
                for (bound, count) in p.bounds().zip(p.bucket_counts()) {
                    cumulative += count;
                    let le = number(bound);
                    let _ = writeln!(
                        out,
                        "{base}_bucket{} {cumulative}",
                        labels(attrs.iter().copied(), Some(("le", &le)))
                    );
                }
                let _ = writeln!(
                    out,
                    "{base}_bucket{} {}",
                    labels(attrs.iter().copied(), Some(("le", "+Inf"))),
                    p.count()
                );
                let plain = labels(attrs.iter().copied(), None);
                let _ = writeln!(out, "{base}_sum{plain} {}", number(p.sum().f()));
                let _ = writeln!(out, "{base}_count{plain} {}", p.count());
            }
        }
        // Not produced: no instrument here asks for exponential buckets.
        MetricData::ExponentialHistogram(_) => {}
    }
}

/// Serves `GET /metrics`, `GET /readyz` and `GET /livez` from `health`
/// (200 when SERVING, 503 otherwise), and with `agent_card` (the A2A public
/// card's JSON) `GET /.well-known/agent-card.json`, on `listener` until the
/// task is dropped.
pub async fn serve(
    listener: TcpListener,
    registry: Registry,
    health: HealthProbe,
    agent_card: Option<Arc<str>>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(error = %err, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let health = health.clone();
        let agent_card = agent_card.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let answer = scrape(stream, &registry, &health, agent_card.as_deref());
            match tokio::time::timeout(TOTAL_TIMEOUT, answer).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::debug!(error = %err, "a metrics scrape failed"),
                Err(_) => tracing::debug!(
                    "dropped a metrics connection still open after {TOTAL_TIMEOUT:?}"
                ),
            }
        });
    }
}

async fn scrape(
    mut stream: TcpStream,
    registry: &Registry,
    health: &HealthProbe,
    agent_card: Option<&str>,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 || head.len() + n > MAX_REQUEST {
                return Ok(false);
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(true)
    })
    .await;
    if !matches!(read, Ok(Ok(true))) {
        return Ok(());
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = path.split(|b| *b == b'?').next().unwrap_or_default();
    let mut content_type = "text/plain; version=0.0.4; charset=utf-8";
    let (status, body) = match (method, path, agent_card) {
        (b"GET", b"/metrics", _) => ("200 OK", registry.render()),
        (b"GET", b"/readyz", _) if health.ready() => ("200 OK", "ready\n".to_owned()),
        (b"GET", b"/readyz", _) => ("503 Service Unavailable", "not ready\n".to_owned()),
        (b"GET", b"/livez", _) if health.live() => ("200 OK", "live\n".to_owned()),
        (b"GET", b"/livez", _) => ("503 Service Unavailable", "not live\n".to_owned()),
        (b"GET", b"/.well-known/agent-card.json", Some(card)) => {
            content_type = "application/json";
            ("200 OK", card.to_owned())
        }
        (b"GET", _, _) => (
            "404 Not Found",
            "not found; try /metrics, /readyz or /livez\n".to_owned(),
        ),
        _ => ("405 Method Not Allowed", "only GET\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    for chunk in response.as_bytes().chunks(WRITE_CHUNK) {
        write_within(&mut stream, chunk).await?;
    }
    tokio::time::timeout(WRITE_TIMEOUT, stream.shutdown())
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
}

/// Writes `chunk`, failing when a write makes no progress for
/// [`WRITE_TIMEOUT`].
async fn write_within(stream: &mut TcpStream, mut chunk: &[u8]) -> std::io::Result<()> {
    while !chunk.is_empty() {
        let n = tokio::time::timeout(WRITE_TIMEOUT, stream.write(chunk))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read")
            })??;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        chunk = &chunk[n..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    use super::*;

    #[tokio::test]
    async fn sixteen_clients_that_never_send_or_read_do_not_starve_a_scrape() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(
            listener,
            Registry::new(),
            HealthProbe::starting(),
            None,
        ));
        let mut slow = Vec::new();
        for i in 0..32 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            if i % 2 == 0 {
                // Asks and never reads the answer.
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
            }
            // The odd ones never send anything.
            slow.push(c);
        }
        let started = std::time::Instant::now();
        let mut scraper = TcpStream::connect(addr).await.unwrap();
        scraper
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(REQUEST_TIMEOUT / 2, scraper.read_to_end(&mut answer))
            .await
            .expect("the scrape is answered while 32 slow clients hold connections")
            .unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 200 OK\r\n"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(started.elapsed() < REQUEST_TIMEOUT);
        // The silent ones are dropped after the request timeout.
        let mut buf = [0u8; 16];
        let silent = &mut slow[1];
        let closed = tokio::time::timeout(REQUEST_TIMEOUT * 3, silent.read(&mut buf))
            .await
            .expect("a silent client is dropped after the request timeout");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        server.abort();
    }

    #[test]
    fn counters_histograms_and_gauges_render_in_the_text_format() {
        let registry = Registry::new();
        let provider = SdkMeterProvider::builder()
            .with_reader(registry.reader())
            .build();
        let meter = provider.meter("t");
        let c = meter
            .u64_counter("agentrt.turns")
            .with_unit("{turn}")
            .build();
        c.add(2, &[KeyValue::new("agentrt.turn.outcome", "success")]);
        let h = meter
            .f64_histogram("rpc.server.call.duration")
            .with_unit("s")
            .with_boundaries(vec![0.1, 1.0])
            .build();
        h.record(0.05, &[KeyValue::new("rpc.method", "a.B/C")]);
        h.record(0.5, &[KeyValue::new("rpc.method", "a.B/C")]);
        let g = meter.i64_up_down_counter("agentrt.turns.live").build();
        g.add(1, &[]);
        g.add(-1, &[]);
        let text = registry.render();
        assert!(
            text.contains("# TYPE agentrt_turns_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("agentrt_turns_total{agentrt_turn_outcome=\"success\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE rpc_server_call_duration_seconds histogram\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "rpc_server_call_duration_seconds_bucket{rpc_method=\"a.B/C\",le=\"0.1\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "rpc_server_call_duration_seconds_bucket{rpc_method=\"a.B/C\",le=\"1\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "rpc_server_call_duration_seconds_bucket{rpc_method=\"a.B/C\",le=\"+Inf\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("rpc_server_call_duration_seconds_count{rpc_method=\"a.B/C\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE agentrt_turns_live gauge\nagentrt_turns_live 0\n"),
            "{text}"
        );
    }
}
