//! The JSON log layer: one flat JSON object per line on stderr.
//!
//! tracing-subscriber's own JSON format nests the event's fields under
//! `fields` (or flattens them but nests every span's), and cannot add the
//! OpenTelemetry trace id. Here every line is one level deep: `timestamp`,
//! `level`, `target`, `message`, the event's fields, then the fields of
//! the spans it happened in (innermost first, never overriding), `span`
//! (the innermost span's name), and `trace_id`/`span_id` when the line is
//! emitted inside a traced span. Strings stay strings (`record_str`),
//! numbers and booleans stay JSON numbers and booleans.

use std::io::Write as _;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// Writes flat JSON lines to stderr.
#[derive(Debug, Default)]
pub struct JsonLayer {
    _private: (),
}

impl JsonLayer {
    /// The layer, writing to stderr.
    pub fn stderr() -> Self {
        Self::default()
    }
}

/// A span's recorded fields, kept in its extensions.
struct SpanFields(Map<String, Value>);

/// Records fields as plain JSON values.
struct Plain<'a>(&'a mut Map<String, Value>);

impl Visit for Plain<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%value` arrives here too, its Debug being its Display.
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
}

/// The OpenTelemetry span context of span `id`, as hex ids, when it is
/// sampled into a trace.
fn trace_ids(id: &Id) -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = tracing::dispatcher::get_default(|d| tracing_opentelemetry::get_otel_context(id, d))?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

impl<S> Layer<S> for JsonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Map::new();
        attrs.record(&mut Plain(&mut fields));
        // OpenTelemetry's own fields and the semantic-convention attributes
        // are for the trace, not the log line.
        fields.retain(|k, _| !k.starts_with("otel.") && !k.contains('.'));
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut recorded = Map::new();
        values.record(&mut Plain(&mut recorded));
        recorded.retain(|k, _| !k.starts_with("otel.") && !k.contains('.'));
        if let Some(fields) = span.extensions_mut().get_mut::<SpanFields>() {
            fields.0.extend(recorded);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut line = Map::new();
        let mut timestamp = String::new();
        if SystemTime
            .format_time(&mut Writer::new(&mut timestamp))
            .is_ok()
        {
            line.insert("timestamp".to_owned(), Value::String(timestamp));
        }
        let meta = event.metadata();
        line.insert("level".to_owned(), Value::String(meta.level().to_string()));
        line.insert("target".to_owned(), Value::String(meta.target().to_owned()));
        event.record(&mut Plain(&mut line));
        let leaf = ctx.event_span(event);
        // Before any extension of ours is borrowed: this takes the
        // OpenTelemetry layer's lock on the span.
        let ids = leaf.as_ref().and_then(|s| trace_ids(&s.id()));
        if let Some(leaf) = leaf {
            line.insert("span".to_owned(), Value::String(leaf.name().to_owned()));
            for span in leaf.scope() {
                if let Some(fields) = span.extensions().get::<SpanFields>() {
                    for (k, v) in &fields.0 {
                        if !line.contains_key(k) {
                            line.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
        if let Some((trace_id, span_id)) = ids {
            line.insert("trace_id".to_owned(), Value::String(trace_id));
            line.insert("span_id".to_owned(), Value::String(span_id));
        }
        let mut out = match serde_json::to_vec(&Value::Object(line)) {
            Ok(out) => out,
            Err(_) => return,
        };
        out.push(b'\n');
        // One write per line, under stderr's lock: lines never interleave.
        let _ = std::io::stderr().lock().write_all(&out);
    }
}
