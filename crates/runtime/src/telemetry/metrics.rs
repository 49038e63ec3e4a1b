//! The core's instruments, created once from the global meter provider on
//! first use: the server installs its provider before it builds the
//! runtime, so they bind to it; without one they are no-ops.
//!
//! Labels are bounded: outcomes, token types, provider and model names
//! from the configuration, never a session, turn or user id. A caller may
//! name any model of a provider without an allow-list, so model and
//! provider labels are kept only when they were registered with
//! [`allow_model_labels`] (the server registers its configured models);
//! any other is [`OTHER`].

use std::collections::BTreeSet;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};

/// The meter (instrumentation scope) name of everything agentrt measures.
pub const METER: &str = "agentrt";

/// Seconds-valued boundaries for short operations (relay latency, store
/// writes): 0.5 ms … 10 s.
pub const FAST_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The semantic conventions' boundaries for `gen_ai.client.operation.duration`
/// and `rpc.server.call.duration`-like long calls.
pub const CALL_SECONDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// The semantic conventions' boundaries for `gen_ai.client.token.usage`.
const TOKENS: &[f64] = &[
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

/// Every instrument of the core.
#[derive(Debug)]
pub struct Metrics {
    /// `gen_ai.client.token.usage` {token}, by type, provider, model.
    pub token_usage: Histogram<u64>,
    /// `gen_ai.client.operation.duration` (s) of a model step.
    pub operation_duration: Histogram<f64>,
    /// `agentrt.turns` finished, by outcome (`interrupted`: turns of a dead
    /// replica that the lease sweeper ended).
    pub turns: Counter<u64>,
    /// `agentrt.turns.interrupted`: turns ended without finishing, by
    /// `agentrt.reason` — `restart` (found running at start-up, left by a
    /// previous process on this store), `lease_expired` (a replica that
    /// stopped renewing its lease; counted by the replica that swept it),
    /// `lease_lost` (this replica lost the session's lease and stopped its
    /// own turn; the replica that sweeps it counts it again as
    /// `lease_expired`).
    pub interrupted_turns: Counter<u64>,
    /// `agentrt.turns.live`: turns running now.
    pub live_turns: UpDownCounter<i64>,
    /// `agentrt.turn.time_to_first_event` (s): admission to the first
    /// model output relayed.
    pub time_to_first_event: Histogram<f64>,
    /// `agentrt.relay.events`: events a turn emitted.
    pub relay_events: Counter<u64>,
    /// `agentrt.watchers`: Subscribe/attached streams open now.
    pub watchers: UpDownCounter<i64>,
    /// `agentrt.store.write.duration` (s) of a durable write.
    pub store_write: Histogram<f64>,
    /// `agentrt.store.flush.duration` (s) of a store flush.
    pub store_flush: Histogram<f64>,
    /// `agentrt.cost.usd`: what turns cost in US dollars by the price table, by
    /// provider and model.
    pub cost: Counter<f64>,
    /// `agentrt.tools.processes`: tool server child processes running now,
    /// by `scope` (`global`, `session`).
    pub tool_processes: UpDownCounter<i64>,
    /// `agentrt.hooks.calls`: operator hook calls, by `hook` (its
    /// configured name), `point` and `outcome` (the decision — `allow`,
    /// `refuse`, `deny`, `rewrite`, `keep`, `redact`, `observed` — or
    /// `error`, `timeout`).
    pub hook_calls: Counter<u64>,
    /// `agentrt.hooks.duration` (s) of an operator hook call, by `hook`
    /// and `point`.
    pub hook_duration: Histogram<f64>,
}

impl Metrics {
    fn new(meter: &Meter) -> Self {
        Self {
            token_usage: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens used per model step, by token type")
                .with_boundaries(TOKENS.to_vec())
                .build(),
            operation_duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("Duration of a model step")
                .with_boundaries(CALL_SECONDS.to_vec())
                .build(),
            turns: meter
                .u64_counter("agentrt.turns")
                .with_unit("{turn}")
                .with_description("Turns finished, by outcome")
                .build(),
            interrupted_turns: meter
                .u64_counter("agentrt.turns.interrupted")
                .with_unit("{turn}")
                .with_description("Turns ended without finishing, by reason")
                .build(),
            live_turns: meter
                .i64_up_down_counter("agentrt.turns.live")
                .with_unit("{turn}")
                .with_description("Turns running now")
                .build(),
            time_to_first_event: meter
                .f64_histogram("agentrt.turn.time_to_first_event")
                .with_unit("s")
                .with_description("From admission to the first model output relayed")
                .with_boundaries(FAST_SECONDS.to_vec())
                .build(),
            relay_events: meter
                .u64_counter("agentrt.relay.events")
                .with_unit("{event}")
                .with_description("Events emitted by turns")
                .build(),
            watchers: meter
                .i64_up_down_counter("agentrt.watchers")
                .with_unit("{stream}")
                .with_description("Watching streams (Subscribe, attached retries) open now")
                .build(),
            store_write: meter
                .f64_histogram("agentrt.store.write.duration")
                .with_unit("s")
                .with_description("Duration of a durable store write")
                .with_boundaries(FAST_SECONDS.to_vec())
                .build(),
            store_flush: meter
                .f64_histogram("agentrt.store.flush.duration")
                .with_unit("s")
                .with_description("Duration of a store flush")
                .with_boundaries(FAST_SECONDS.to_vec())
                .build(),
            cost: meter
                .f64_counter("agentrt.cost.usd")
                .with_unit("{USD}")
                .with_description("What turns cost by the price table, by model")
                .build(),
            tool_processes: meter
                .i64_up_down_counter("agentrt.tools.processes")
                .with_unit("{process}")
                .with_description("Tool server child processes running now, by scope")
                .build(),
            hook_calls: meter
                .u64_counter("agentrt.hooks.calls")
                .with_unit("{call}")
                .with_description("Operator hook calls, by hook, point and outcome")
                .build(),
            hook_duration: meter
                .f64_histogram("agentrt.hooks.duration")
                .with_unit("s")
                .with_description("Duration of an operator hook call, by hook and point")
                .with_boundaries(FAST_SECONDS.to_vec())
                .build(),
        }
    }
}

/// The instruments, bound to the global meter provider at first use.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| Metrics::new(&opentelemetry::global::meter(METER)))
}

/// Counts one live turn for as long as it is held.
#[derive(Debug)]
pub(crate) struct LiveGuard(&'static UpDownCounter<i64>);

impl LiveGuard {
    pub(crate) fn turn() -> Self {
        let m = &get().live_turns;
        m.add(1, &[]);
        Self(m)
    }

    pub(crate) fn watcher() -> Self {
        let m = &get().watchers;
        m.add(1, &[]);
        Self(m)
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.add(-1, &[]);
    }
}

/// Counts one tool server child process of `scope` (`global` or
/// `session`) for as long as it is held.
#[derive(Debug)]
pub(crate) struct ProcessGuard(&'static str);

impl ProcessGuard {
    pub(crate) fn new(scope: &'static str) -> Self {
        get()
            .tool_processes
            .add(1, &[KeyValue::new("scope", scope)]);
        Self(scope)
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        get()
            .tool_processes
            .add(-1, &[KeyValue::new("scope", self.0)]);
    }
}

/// The label of a model or provider that was not registered.
pub const OTHER: &str = "other";

/// The registered label values.
#[derive(Debug, Default)]
struct Labels {
    providers: BTreeSet<String>,
    /// `provider/model`.
    models: BTreeSet<String>,
}

fn labels() -> &'static RwLock<Labels> {
    static LABELS: OnceLock<RwLock<Labels>> = OnceLock::new();
    LABELS.get_or_init(RwLock::default)
}

/// Registers the provider names and `provider/model` names that metrics
/// may carry as `gen_ai.provider.name` and `gen_ai.request.model`: the
/// configured ones, never caller-chosen ones. Adds to what was registered
/// before (the labels are process-wide, like the instruments). A model's
/// provider is registered with it.
pub fn allow_model_labels<P, M>(providers: P, models: M)
where
    P: IntoIterator,
    P::Item: Into<String>,
    M: IntoIterator,
    M::Item: Into<String>,
{
    let mut labels = labels().write().unwrap_or_else(|e| e.into_inner());
    labels
        .providers
        .extend(providers.into_iter().map(Into::into));
    for model in models {
        let model: String = model.into();
        if let Some((provider, _)) = model.split_once('/') {
            labels.providers.insert(provider.to_owned());
        }
        labels.models.insert(model);
    }
}

/// The labels of `provider`/`model`: themselves when registered, else
/// [`OTHER`].
pub fn model_labels(provider: &str, model: &str) -> (String, String) {
    let labels = labels().read().unwrap_or_else(|e| e.into_inner());
    let known_provider = labels.providers.contains(provider);
    let known_model = known_provider && labels.models.contains(&format!("{provider}/{model}"));
    (
        if known_provider { provider } else { OTHER }.to_owned(),
        if known_model { model } else { OTHER }.to_owned(),
    )
}

/// Records a model step's duration and token usage.
pub(crate) fn model_step(
    provider: &str,
    model: &str,
    took: Duration,
    usage: Option<(u64, u64)>,
    error: Option<&'static str>,
) {
    let m = get();
    let (provider, model) = model_labels(provider, model);
    let mut attrs = vec![
        KeyValue::new(
            super::semconv::GEN_AI_OPERATION_NAME,
            super::semconv::OP_CHAT,
        ),
        KeyValue::new(super::semconv::GEN_AI_PROVIDER_NAME, provider),
        KeyValue::new(super::semconv::GEN_AI_REQUEST_MODEL, model),
    ];
    if let Some((input, output)) = usage {
        attrs.push(KeyValue::new(super::semconv::GEN_AI_TOKEN_TYPE, "input"));
        m.token_usage.record(input, &attrs);
        attrs.pop();
        attrs.push(KeyValue::new(super::semconv::GEN_AI_TOKEN_TYPE, "output"));
        m.token_usage.record(output, &attrs);
        attrs.pop();
    }
    if let Some(error) = error {
        attrs.push(KeyValue::new(super::semconv::ERROR_TYPE, error));
    }
    m.operation_duration.record(took.as_secs_f64(), &attrs);
}

/// Adds what a turn of `provider`/`model` cost (nano-USD) to `agentrt.cost.usd`.
pub(crate) fn turn_cost(provider: &str, model: &str, nano_usd: u64) {
    let (provider, model) = model_labels(provider, model);
    let attrs = [
        KeyValue::new(super::semconv::GEN_AI_PROVIDER_NAME, provider),
        KeyValue::new(super::semconv::GEN_AI_REQUEST_MODEL, model),
    ];
    get().cost.add(crate::prices::usd(nano_usd), &attrs);
}

/// Why a turn was interrupted: the `agentrt.reason` of
/// `agentrt.turns.interrupted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interruption {
    /// Found running at start-up: a previous process on this store ended
    /// without finishing it. Its record is now interrupted.
    Restart,
    /// Swept: its replica let the session's lease expire. Its record is now
    /// interrupted.
    LeaseExpired,
    /// This replica lost the session's lease and stopped the turn, which
    /// stores nothing more (another replica ends its record).
    LeaseLost,
}

impl Interruption {
    fn reason(self) -> &'static str {
        match self {
            Self::Restart => "restart",
            Self::LeaseExpired => "lease_expired",
            Self::LeaseLost => "lease_lost",
        }
    }
}

/// Makes the `agentrt.turns.interrupted` series exist at 0 before the
/// first interruption (so a rate over them has a start): `restart` on
/// every store, the lease reasons on a `shared` one.
pub(crate) fn interrupted_series(shared: bool) {
    let m = &get().interrupted_turns;
    let reasons: &[Interruption] = if shared {
        &[
            Interruption::Restart,
            Interruption::LeaseExpired,
            Interruption::LeaseLost,
        ]
    } else {
        &[Interruption::Restart]
    };
    for why in reasons {
        m.add(
            0,
            &[KeyValue::new(super::semconv::AGENTRT_REASON, why.reason())],
        );
    }
}

/// Counts one interrupted turn. The turns whose record this replica ended
/// as interrupted (`Restart`, `LeaseExpired`) are also `agentrt.turns`
/// with outcome `interrupted`; a turn stopped on `LeaseLost` is counted
/// there by the outcome it reported to its callers.
pub(crate) fn turn_interrupted(why: Interruption) {
    let m = get();
    m.interrupted_turns.add(
        1,
        &[KeyValue::new(super::semconv::AGENTRT_REASON, why.reason())],
    );
    if why != Interruption::LeaseLost {
        m.turns.add(
            1,
            &[KeyValue::new(
                super::semconv::AGENTRT_TURN_OUTCOME,
                "interrupted",
            )],
        );
    }
}

/// Records a store operation's duration in `histogram`.
pub(crate) fn timed(histogram: &Histogram<f64>, took: Duration) {
    histogram.record(took.as_secs_f64(), &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_registered_models_and_providers_are_labels() {
        allow_model_labels(["labels-test-provider"], ["labels-test/model-a"]);
        assert_eq!(
            model_labels("labels-test", "model-a"),
            ("labels-test".to_owned(), "model-a".to_owned())
        );
        assert_eq!(
            model_labels("labels-test", "caller-chosen-1"),
            ("labels-test".to_owned(), OTHER.to_owned())
        );
        assert_eq!(
            model_labels("labels-test-provider", "model-a"),
            ("labels-test-provider".to_owned(), OTHER.to_owned())
        );
        assert_eq!(
            model_labels("caller-chosen", "model-a"),
            (OTHER.to_owned(), OTHER.to_owned())
        );
    }
}
