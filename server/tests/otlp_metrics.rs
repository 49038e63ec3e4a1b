//! OTLP metrics end to end, in process: with `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`
//! (through the injectable `OTEL_*` lookup) the periodic exporter sends a
//! test receiver the turn, RPC, process and build series of a server that
//! ran one turn, under the configured service name.
//!
//! One test per file: it installs the process-wide meter provider.

#[path = "support/otlp.rs"]
mod otlp;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use agentrt_client::Client;
use agentrt_server::config::LogFormat;
use agentrt_server::telemetry::{OtelEnv, Telemetry};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::server::InProcessServer;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_s_metrics_and_the_process_and_build_series_reach_an_otlp_receiver() {
    let mut receiver = otlp::MetricsReceiver::start().await;
    let vars: HashMap<&str, String> = HashMap::from([
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            receiver.endpoint.clone(),
        ),
        ("OTEL_TRACES_EXPORTER", "none".to_owned()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200".to_owned()),
        ("OTEL_SERVICE_NAME", "agentrt-metrics-under-test".to_owned()),
    ]);
    let otel = OtelEnv::from_lookup(&|k| vars.get(k).cloned()).unwrap();
    let telemetry = Telemetry::init(LogFormat::Json, Some("warn"), &otel, false).unwrap();
    assert!(!telemetry.traces_on());

    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    let client = Client::connect(server.url()).await.unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let turn = client
        .chat(&session, "hello")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(turn.status.is_none(), "{:?}", turn.status);

    // Every export carries every series (cumulative); wait for one that
    // has them all.
    let wanted = [
        "agentrt.turns",
        "rpc.server.call.duration",
        "process.cpu",
        "process.resident_memory",
        "agentrt.build.info",
    ];
    let mut seen: HashMap<String, otlp::GotMetric> = HashMap::new();
    let deadline = Instant::now() + WAIT;
    let succeeded = loop {
        let metric = tokio::time::timeout_at(deadline.into(), receiver.metrics.recv())
            .await
            .unwrap_or_else(|_| {
                let names: HashSet<&String> = seen.keys().collect();
                panic!("not every series arrived within {WAIT:?}; got {names:?}")
            })
            .expect("the receiver runs");
        assert_eq!(
            metric.service_name.as_deref(),
            Some("agentrt-metrics-under-test")
        );
        seen.insert(metric.name.clone(), metric);
        let turns = seen
            .get("agentrt.turns")
            .and_then(|m| m.value(&[("agentrt.turn.outcome", "success")]));
        if turns == Some(1.0) && wanted.iter().all(|w| seen.contains_key(*w)) {
            break turns;
        }
    };
    assert_eq!(succeeded, Some(1.0));
    let chat = seen["rpc.server.call.duration"].value(&[
        ("rpc.method", "agentrt.v1.AgentRuntime/Chat"),
        ("rpc.response.status_code", "OK"),
    ]);
    assert_eq!(chat, Some(1.0), "{:?}", seen["rpc.server.call.duration"]);
    assert!(
        seen["process.resident_memory"]
            .value(&[])
            .is_some_and(|v| v > 0.0)
    );
    let build = &seen["agentrt.build.info"];
    assert_eq!(
        build.value(&[("version", env!("CARGO_PKG_VERSION"))]),
        Some(1.0),
        "{build:?}"
    );

    drop(client);
    server.stop().await;
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
}
