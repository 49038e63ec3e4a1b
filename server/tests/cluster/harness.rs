//! Three (or more) `agentrt-server` processes on loopback sharing one
//! PostgreSQL database: each with its own config file (`[store] kind =
//! "postgres"` with the URL in an environment variable, a short lease,
//! `[cluster]` on `127.0.0.1:0` with a shared key), all on one
//! [`Upstream`]. A replica is started, SIGKILLed, SIGTERMed and restarted
//! by index; its public, cluster and metrics addresses come from the three
//! lines it prints on stdout. With [`Tls`] every replica serves `[tls]`
//! and the internal listener mTLS ([`Cluster::start_tls`]).

use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, Error, Event, EventStream, TurnSummary, proto};
use agentrt_testkit::pg::TestDb;
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use super::upstream::{TOOL, Upstream};

/// `[store] lease_ttl_ms` of every replica.
pub(crate) const LEASE_TTL: Duration = Duration::from_millis(1500);
const URL_ENV: &str = "AGENTRT_CLUSTER_TEST_DATABASE_URL";
const KEY_ENV: &str = "AGENTRT_CLUSTER_TEST_KEY";
/// How long a debug build may take to start (migrations included).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The tests of this file run one at a time: three server processes each
/// are plenty for two cores, and the timing bounds they assert (Stop
/// within 1 s, takeover within the lease plus 1 s) should not measure the
/// other tests' load.
pub(crate) async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// One running replica.
pub(crate) struct Replica {
    child: Child,
    /// `http://127.0.0.1:PORT` of the public gRPC listener.
    pub(crate) url: String,
    /// `127.0.0.1:PORT` of the internal cluster service.
    pub(crate) cluster_addr: String,
    /// `127.0.0.1:PORT` of its `/metrics` listener.
    pub(crate) metrics_addr: String,
    pub(crate) client: Client,
    db_url: String,
    /// Reads what the process prints after its address lines, so a write
    /// to stdout never fails on a closed pipe.
    _stdout: tokio::task::JoinHandle<()>,
}

impl Replica {
    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.child.id().expect("the replica runs")).unwrap()
    }
}

pub(crate) struct Cluster {
    pub(crate) upstream: Upstream,
    pub(crate) db: TestDb,
    dir: tempfile::TempDir,
    key: String,
    grace: &'static str,
    /// Extra `[store]` lines (TLS settings) of every replica's config.
    store_tls: String,
    tls: Option<Tls>,
    replicas: Vec<Option<Replica>>,
}

/// `[tls]` of every replica (one certificate they share) and the cluster's
/// CA: both of their listeners then speak TLS, the internal one mTLS.
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    pub(crate) cert: std::path::PathBuf,
    pub(crate) key: std::path::PathBuf,
    /// `[cluster] ca_file`.
    pub(crate) ca: std::path::PathBuf,
    /// The CA's PEM, which the test's clients trust.
    pub(crate) ca_pem: String,
    /// `[cluster] server_name`, when set.
    pub(crate) server_name: Option<String>,
    /// The name the test's clients verify the public port's certificate
    /// for (default: the host of its URL, 127.0.0.1).
    pub(crate) client_domain: Option<String>,
}

impl Cluster {
    /// `n` replicas on a fresh database, or `None` when there is no
    /// PostgreSQL (the testkit printed why; under `CI=true` it panicked).
    pub(crate) async fn start(n: usize) -> Option<Self> {
        Self::start_with(n, "1s").await
    }

    /// Like [`Cluster::start`], with this `shutdown_grace`.
    pub(crate) async fn start_with(n: usize, grace: &'static str) -> Option<Self> {
        Self::start_full(n, grace, None).await
    }

    /// Like [`Cluster::start`], every replica serving `tls`.
    pub(crate) async fn start_tls(n: usize, tls: Tls) -> Option<Self> {
        Self::start_full(n, "1s", Some(tls)).await
    }

    async fn start_full(n: usize, grace: &'static str, tls: Option<Tls>) -> Option<Self> {
        let db = agentrt_testkit::pg::database().await?;
        Some(Self::start_on(n, grace, db, String::new(), tls).await)
    }

    /// `n` replicas on a fresh database of the testkit's TLS-only
    /// PostgreSQL, each connecting with `tls = "verify-full"` and the test
    /// CA as `ca_file`.
    pub(crate) async fn start_db_tls(n: usize) -> Option<Self> {
        let tls = agentrt_testkit::pg::tls_database().await?;
        let store_tls = format!(
            "tls = \"verify-full\"\nca_file = {:?}\n",
            tls.ca_file.display().to_string()
        );
        Some(Self::start_on(n, "1s", tls.db, store_tls, None).await)
    }

    async fn start_on(
        n: usize,
        grace: &'static str,
        db: TestDb,
        store_tls: String,
        tls: Option<Tls>,
    ) -> Self {
        let mut cluster = Self {
            upstream: Upstream::start().await,
            db,
            dir: tempfile::tempdir().unwrap(),
            key: format!("cluster-test-key-0123456789abcdef-{}", std::process::id()),
            grace,
            store_tls,
            tls,
            replicas: Vec::new(),
        };
        for _ in 0..n {
            let url = cluster.db.url.clone();
            cluster.add(&url).await;
        }
        cluster
    }

    /// Starts one more replica whose database URL is `db_url` (the test
    /// database's, or a proxy's in front of it); returns its index.
    pub(crate) async fn add(&mut self, db_url: &str) -> usize {
        let index = self.replicas.len();
        let replica = self.spawn(index, db_url).await;
        self.replicas.push(Some(replica));
        index
    }

    pub(crate) fn replica(&self, i: usize) -> &Replica {
        self.replicas[i]
            .as_ref()
            .unwrap_or_else(|| panic!("replica {i} is not running"))
    }

    pub(crate) fn client(&self, i: usize) -> &Client {
        &self.replica(i).client
    }

    /// A new session (created through replica 0).
    pub(crate) async fn session(&self) -> String {
        self.client(0)
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .session_id
    }

    /// SIGKILL: the process ends at once, holding whatever leases it had.
    pub(crate) async fn kill(&mut self, i: usize) {
        let mut replica = self.replicas[i].take().expect("a running replica");
        replica.child.kill().await.unwrap();
    }

    /// Starts replica `i` again (after [`Cluster::kill`] or an exit), on the
    /// same database URL.
    pub(crate) async fn restart(&mut self, i: usize, db_url: &str) {
        assert!(self.replicas[i].is_none(), "replica {i} still runs");
        let replica = self.spawn(i, db_url).await;
        self.replicas[i] = Some(replica);
    }

    /// The database URL replica `i` was started with.
    pub(crate) fn db_url(&self, i: usize) -> String {
        self.replica(i).db_url.clone()
    }

    pub(crate) fn sigterm(&self, i: usize) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.replica(i).pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }

    /// Waits (at most `within`) for replica `i` to exit on its own.
    pub(crate) async fn wait_exit(&mut self, i: usize, within: Duration) -> ExitStatus {
        let mut replica = self.replicas[i].take().expect("a running replica");
        tokio::time::timeout(within, replica.child.wait())
            .await
            .unwrap_or_else(|_| panic!("replica {i} did not exit within {within:?}"))
            .unwrap()
    }

    async fn spawn(&self, i: usize, db_url: &str) -> Replica {
        let config = self.dir.path().join(format!("replica-{i}.toml"));
        std::fs::write(&config, self.config_text()).unwrap();
        let workdir = self.dir.path().join(format!("replica-{i}"));
        std::fs::create_dir_all(&workdir).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .current_dir(&workdir)
            .env("AGENTRT_LOG", "warn")
            .env(URL_ENV, db_url)
            .env(KEY_ENV, &self.key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut cluster_addr = None;
        let url = loop {
            let line = tokio::time::timeout(START_TIMEOUT, lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!("replica {i} printed no address within {START_TIMEOUT:?}")
                })
                .unwrap()
                .unwrap_or_else(|| panic!("replica {i} exited before listening (see its stderr)"));
            if let Some(addr) = line.strip_prefix("agentrt-server cluster service listening on ") {
                cluster_addr = Some(addr.to_owned());
            } else if let Some(addr) = line.strip_prefix("agentrt-server listening on ") {
                let scheme = if self.tls.is_some() { "https" } else { "http" };
                break format!("{scheme}://{addr}");
            } else {
                panic!("replica {i}: unexpected line on stdout {line:?}");
            }
        };
        let cluster_addr = cluster_addr.unwrap_or_else(|| {
            panic!("replica {i} announced no cluster service before its address")
        });
        let line = tokio::time::timeout(START_TIMEOUT, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("replica {i} printed no metrics address"))
            .unwrap()
            .unwrap_or_else(|| panic!("replica {i} exited before serving metrics"));
        let metrics_addr = line
            .strip_prefix("agentrt-server metrics on http://")
            .and_then(|l| l.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("replica {i}: unexpected line on stdout {line:?}"))
            .to_owned();
        let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let client = match &self.tls {
            None => Client::connect(url.clone()).await.unwrap(),
            Some(tls) => {
                let mut builder = Client::builder(url.clone()).ca_pem(tls.ca_pem.clone());
                if let Some(domain) = &tls.client_domain {
                    builder = builder.tls_domain(domain.clone());
                }
                builder.connect().await.unwrap()
            }
        };
        Replica {
            child,
            url,
            cluster_addr,
            metrics_addr,
            client,
            db_url: db_url.to_owned(),
            _stdout: drain,
        }
    }

    fn config_text(&self) -> String {
        let mut text = self.base_config();
        if let Some(tls) = &self.tls {
            text.push_str(&format!(
                "\n[tls]\ncert = {:?}\nkey = {:?}\n",
                tls.cert, tls.key
            ));
            // Keys of [cluster], right after its header.
            let mut cluster = format!("ca_file = {:?}\n", tls.ca);
            if let Some(name) = &tls.server_name {
                cluster.push_str(&format!("server_name = {name:?}\n"));
            }
            let at =
                text.find("[cluster]\n").expect("the config has [cluster]") + "[cluster]\n".len();
            text.insert_str(at, &cluster);
        }
        text
    }

    fn base_config(&self) -> String {
        format!(
            "default_model = \"fake/m\"\n\
             shutdown_grace = \"{grace}\"\n\
             metrics_listen = \"127.0.0.1:0\"\n\
             \n\
             [store]\n\
             kind = \"postgres\"\n\
             url_env = \"{URL_ENV}\"\n\
             pool_size = 4\n\
             lease_ttl_ms = {ttl}\n\
             {store_tls}\
             \n\
             [cluster]\n\
             listen = \"127.0.0.1:0\"\n\
             key_env = \"{KEY_ENV}\"\n\
             \n\
             [[providers]]\n\
             name = \"fake\"\n\
             kind = \"openai\"\n\
             base_url = \"{base}\"\n",
            grace = self.grace,
            ttl = LEASE_TTL.as_millis(),
            store_tls = self.store_tls,
            base = self.upstream.base_url(),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for replica in self.replicas.iter_mut().flatten() {
            let _ = replica.child.start_kill();
        }
    }
}

/// A Chat of one text block.
/// Replica `metrics_addr`'s `/metrics` text.
pub(crate) async fn scrape(metrics_addr: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(metrics_addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .expect("a scrape answered in time")
    .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// The value of the series `name{labels}` (labels as rendered, sorted).
pub(crate) fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

pub(crate) fn text_request(session: &str, text: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }],
        ..Default::default()
    }
}

/// A Chat that offers the caller tool the upstream's `tool KEY` calls.
pub(crate) fn tool_request(session: &str, key: &str) -> proto::ChatRequest {
    let mut req = text_request(session, &format!("tool {key}"));
    req.extra_tools = vec![proto::ToolDefinition {
        name: TOOL.to_owned(),
        description: "looks something up (the caller runs it)".to_owned(),
        parameters_json_schema: r#"{"type":"object","properties":{}}"#.to_owned(),
    }];
    req
}

/// The `google.rpc.ErrorInfo` reason of an ABORTED admission, or `None`
/// for any other outcome.
pub(crate) fn aborted_reason(err: &Error) -> Option<String> {
    use tonic_types::StatusExt as _;
    match err {
        e if e.code() == Some(tonic::Code::Aborted) => Some(
            e.status()
                .and_then(|s| s.get_details_error_info())
                .map(|i| i.reason)
                .unwrap_or_default(),
        ),
        _ => None,
    }
}

/// Reads events until one matches `stop` (returned last), failing after
/// `within` or at the stream's end.
pub(crate) async fn read_until(
    events: &mut EventStream,
    within: Duration,
    stop: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout_at(deadline.into(), events.next())
            .await
            .unwrap_or_else(|_| panic!("no matching event within {within:?}; saw {seen:?}"));
        let event = match next {
            Some(Ok(e)) => e,
            Some(Err(e)) => panic!("stream failed: {e}; saw {seen:?}"),
            None => panic!("stream ended; saw {seen:?}"),
        };
        let done = stop(&event);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// The rest of a turn, bounded by `within`.
pub(crate) async fn finish(events: EventStream, within: Duration) -> TurnSummary {
    tokio::time::timeout(within, events.finish())
        .await
        .unwrap_or_else(|_| panic!("the turn did not finish within {within:?}"))
        .unwrap()
}

pub(crate) fn is_text(e: &Event) -> bool {
    matches!(e.kind, ChatEvent::Text(_))
}

pub(crate) fn finished(e: &Event) -> Option<(proto::TurnOutcome, proto::CancelReason)> {
    match e.kind {
        ChatEvent::TurnFinished {
            outcome,
            cancel_reason,
            ..
        } => Some((outcome, cancel_reason)),
        _ => None,
    }
}

/// The turn's end as its events say.
pub(crate) fn outcome(summary: &TurnSummary) -> Option<(proto::TurnOutcome, proto::CancelReason)> {
    summary.events.iter().find_map(finished)
}

/// The turn's `error` events and trailing status, for failure messages.
pub(crate) fn errors(summary: &TurnSummary) -> String {
    let mut out: Vec<String> = summary
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Error { code, message } => Some(format!("{code:?}: {message}")),
            _ => None,
        })
        .collect();
    if let Some(s) = &summary.status {
        out.push(format!("status {:?}: {}", s.code(), s.message()));
    }
    out.join("; ")
}

/// Event seqs are 1, 2, 3, … with no gap or repeat.
pub(crate) fn assert_contiguous(events: &[Event], what: &str) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let want: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, want, "{what}: event seqs");
}

fn text_of(m: &proto::Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match &b.block {
            Some(proto::content_block::Block::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// What must hold of any history, whatever happened to the replicas:
/// seqs 1..n with no gap, no message id twice, each turn's user message
/// once, each tool call answered exactly once. Returns the user texts.
pub(crate) fn assert_history_sound(history: &[proto::Message], what: &str) -> Vec<String> {
    let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{what}: history seqs"
    );
    let mut ids: Vec<&str> = history.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), history.len(), "{what}: a message id twice");
    let mut users = std::collections::HashMap::<&str, usize>::new();
    let mut calls = std::collections::HashMap::<String, usize>::new();
    let mut answers = std::collections::HashMap::<String, usize>::new();
    for m in history {
        if m.role() == proto::Role::User {
            *users.entry(m.turn_id.as_str()).or_default() += 1;
        }
        for block in &m.content {
            match &block.block {
                Some(proto::content_block::Block::ToolCall(c)) => {
                    *calls.entry(c.id.clone()).or_default() += 1;
                }
                Some(proto::content_block::Block::ToolResult(r)) => {
                    *answers.entry(r.call_id.clone()).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    for (turn, n) in &users {
        assert_eq!(*n, 1, "{what}: turn {turn} has {n} user messages");
    }
    for (call, n) in &calls {
        assert_eq!(*n, 1, "{what}: tool call {call} stored {n} times");
        assert_eq!(
            answers.get(call).copied().unwrap_or(0),
            1,
            "{what}: tool call {call} is not answered exactly once"
        );
    }
    assert!(
        answers.keys().all(|a| calls.contains_key(a)),
        "{what}: a result without its call"
    );
    history
        .iter()
        .filter(|m| m.role() == proto::Role::User)
        .map(text_of)
        .collect()
}

/// The tool results stored for `call_id`.
pub(crate) fn results_of<'a>(
    history: &'a [proto::Message],
    call_id: &str,
) -> Vec<&'a proto::ToolResultBlock> {
    history
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match &b.block {
            Some(proto::content_block::Block::ToolResult(r)) if r.call_id == call_id => Some(r),
            _ => None,
        })
        .collect()
}
