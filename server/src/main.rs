//! `agentrt-server`: parses the configuration, sets up telemetry (logs,
//! and OpenTelemetry as the `OTEL_*` environment asks), fetches the local
//! model when asked (`fetch-model`, `--fetch-model`), binds the listeners
//! (gRPC, and `/metrics` with `--metrics-listen`) and runs the server until
//! SIGTERM or SIGINT.

use std::process::ExitCode;

use agentrt_server::config::Command;
use agentrt_server::telemetry::{OtelEnv, Telemetry, prometheus};
use agentrt_server::{Cli, Config, ServerError};
use clap::Parser as _;

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed
/// when this is called, not when it is first polled: a supervisor may
/// signal as soon as it reads the address lines, and must not find the
/// default action (an exit without the drain) there.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &'static str| {
            signal(kind)
                .inspect_err(|err| tracing::error!(error = %err, "cannot listen for {name}"))
                .ok()
        };
        (
            listen(SignalKind::terminate(), "SIGTERM"),
            listen(SignalKind::interrupt(), "SIGINT"),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let next = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = next(int) => tracing::info!("SIGINT received"),
                () = next(term) => tracing::info!("SIGTERM received"),
            }
        }
        #[cfg(not(unix))]
        {
            if let Err(err) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %err, "cannot listen for SIGINT");
                std::future::pending::<()>().await;
            }
            tracing::info!("SIGINT received");
        }
    }
}

fn main() -> ExitCode {
    // Started as the launcher of a sandboxed tool server: this process
    // becomes the tool (and never returns) or fails here. First, before
    // any thread exists.
    if let Some(code) = agentrt_runtime::toolbox::sandbox::run_if_asked() {
        return code;
    }
    // clap's own errors quote the bad value (it may be a secret).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return agentrt_server::config::cli_error_exit(&err),
    };
    let config = match Config::load(&cli) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("agentrt-server: {err}");
            return ExitCode::from(2);
        }
    };
    // Before any thread exists: candle's compute pools and glibc's malloc
    // arenas are sized from the environment only (see process.rs). When
    // something is missing this re-executes the binary with it and, on
    // success, does not return.
    let mut env = agentrt_local_model::threads::thread_env(
        config.local_model.resolve(&config.data_dir).threads,
    );
    env.extend(agentrt_server::process::malloc_env(|name| {
        std::env::var_os(name)
    }));
    let reexec = agentrt_server::process::reexec_with(env);
    let otel = match OtelEnv::from_lookup(&|name| std::env::var(name).ok()) {
        Ok(o) => o,
        Err(err) => {
            eprintln!("agentrt-server: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(err) => {
            eprintln!("agentrt-server: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // The OTLP exporters' gRPC channels live on the runtime.
    let telemetry = {
        let _entered = runtime.enter();
        let filter = std::env::var("AGENTRT_LOG").ok();
        match Telemetry::init(
            config.log_format,
            filter.as_deref(),
            &otel,
            config.metrics_listen.is_some(),
        ) {
            Ok(t) => t,
            Err(err) => {
                eprintln!("agentrt-server: {err}");
                return ExitCode::from(2);
            }
        }
    };
    if let Err(why) = reexec {
        tracing::warn!(%why, "candle keeps its default thread count and malloc its default arenas");
    }
    // Every connection is a descriptor: the default soft limit (often
    // 1024) would be met long before transport.max_connections.
    agentrt_server::transport::raise_fd_limit();
    if cli.fetch_model || cli.command == Some(Command::FetchModel) {
        if let Err(err) = agentrt_server::local::fetch(&config) {
            eprintln!("agentrt-server: {err}");
            return ExitCode::FAILURE;
        }
        if cli.command == Some(Command::FetchModel) {
            return ExitCode::SUCCESS;
        }
    }
    let code = runtime.block_on(serve(config, telemetry.prometheus()));
    // Export what is queued while the runtime (the exporters' channels)
    // still runs, off its workers.
    telemetry.shutdown();
    code
}

async fn serve(config: Config, metrics: Option<prometheus::Registry>) -> ExitCode {
    // Everything that can fail at start-up (the config's files and keys, a
    // bad model, a provider, the store) fails here, before any port is
    // bound and so before the "listening" line: a script or an operator
    // waiting for that line never sees it for a server about to exit.
    let mut builder = agentrt_server::ServerBuilder::new(config);
    match agentrt_runtime::toolbox::sandbox::Launcher::this_binary() {
        Ok(launcher) => builder = builder.tool_launcher(launcher),
        Err(err) => tracing::warn!(error = %err,
            "cannot find this binary: MCP servers start without limits or the parent-death signal"),
    }
    let prepared = match builder.prepare().await {
        Ok(p) => p,
        Err(err) => {
            eprintln!("agentrt-server: {err}");
            // A configuration error exits 2, as one found by Config::load.
            return match err {
                ServerError::Config(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            };
        }
    };
    let config = prepared.config();
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(err) => {
            eprintln!("agentrt-server: cannot listen on {}: {err}", config.listen);
            return ExitCode::from(2);
        }
    };
    // Bound before the listening line, so whoever reads it can scrape.
    let agent_card: std::sync::Arc<str> = prepared
        .public_agent_card(listener.local_addr().ok())
        .into();
    let metrics_task = match (config.metrics_listen, metrics) {
        (Some(addr), Some(registry)) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some((
                l.local_addr().ok(),
                tokio_util::task::AbortOnDropHandle::new(tokio::spawn(prometheus::serve(
                    l,
                    registry,
                    prepared.health_probe(),
                    Some(agent_card),
                ))),
            )),
            Err(err) => {
                eprintln!("agentrt-server: cannot listen on {addr} (metrics_listen): {err}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let shutdown = shutdown_signal();
    if let Some(addr) = prepared.cluster_addr() {
        // Before the public line: whoever waits for that one can already
        // read this.
        println!("agentrt-server cluster service listening on {addr}");
    }
    if let Ok(addr) = listener.local_addr() {
        // One stable line on stdout, so scripts and tests that start the
        // server on port 0 learn the address it got.
        println!("agentrt-server listening on {addr}");
        if let Some((Some(bound), _)) = &metrics_task {
            // Second line: where Prometheus scrapes.
            println!("agentrt-server metrics on http://{bound}/metrics");
        }
    }
    match prepared.serve(listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("agentrt-server: {err}");
            ExitCode::FAILURE
        }
    }
}
