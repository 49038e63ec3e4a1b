//! A real PostgreSQL server for tests: one throwaway cluster per test
//! process, started from the system's PostgreSQL binaries (`initdb` +
//! `postgres`) in a temporary directory on a free loopback port, and one
//! fresh database per test. With `AGENTRT_TEST_PG_URL` set, that server is
//! used instead (a database per test is created on it).
//!
//! When neither is available the tests that need PostgreSQL skip, saying
//! so — except under `CI=true`, where they fail: CI installs PostgreSQL and
//! must run them.
//!
//! [`tls_database`] gives a database on a second cluster (started on first
//! use) that takes TLS connections only: `ssl = on` with a certificate for
//! `localhost` and `127.0.0.1` issued by a CA made up for the process
//! ([`TlsTestDb::ca_file`]), and `hostssl`-only `pg_hba.conf` lines, so a
//! plaintext TCP connection is refused. It always runs from the system's
//! binaries (`AGENTRT_TEST_PG_URL` cannot be given TLS settings); the
//! harness itself reaches it over its Unix socket.
//!
//! Each cluster ends with the test process: `postgres` runs under a small
//! shell that waits on a pipe from this process, so when the process exits
//! (however it exits) the pipe closes, the shell stops the server
//! (immediate shutdown) and removes its directory. No server outlives the
//! tests.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A database of its own for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its connection URL (`postgresql://user@127.0.0.1:port/name`).
    pub url: String,
    /// The database's name.
    pub name: String,
    /// The server's address, `127.0.0.1:port` (for a test that cuts it).
    pub addr: String,
}

/// A database of its own for one test on the TLS-only server (see the
/// module documentation).
#[derive(Debug, Clone)]
pub struct TlsTestDb {
    /// The database; its URL (`postgresql://agentrt@127.0.0.1:port/name`)
    /// names no TLS setting.
    pub db: TestDb,
    /// PEM of the CA that issued the server's certificate (SANs
    /// `localhost` and `127.0.0.1`).
    pub ca_file: PathBuf,
    /// The database's URL for a superuser that logs in with a password
    /// (SCRAM-SHA-256), not trusted like `agentrt`, for channel binding.
    pub scram_url: String,
}

/// The role and password of [`TlsTestDb::scram_url`].
const SCRAM_USER: &str = "agentrt_scram";
const SCRAM_PASSWORD: &str = "scram-test-password";

/// Where tests find PostgreSQL: a cluster this process started, or the
/// server `AGENTRT_TEST_PG_URL` names.
#[derive(Debug)]
struct Server {
    /// How to reach the maintenance database (`postgres`), where
    /// databases are created.
    admin: tokio_postgres::Config,
    /// `user@host:port` part, to build per-database URLs.
    base: String,
    addr: String,
    /// The CA of the TLS-only cluster.
    ca_file: Option<PathBuf>,
    /// The shell that owns the cluster (its stdin is the lifeline pipe).
    _keeper: Option<Mutex<Child>>,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static TLS_SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// A fresh, empty database for one test, or `None` (after printing why)
/// when no PostgreSQL is available. Under `CI=true` a missing PostgreSQL
/// panics instead: CI must run these tests.
pub async fn database() -> Option<TestDb> {
    let server = available(SERVER.get_or_init(start_server))?;
    Some(create_database(server).await)
}

/// A fresh, empty database on the TLS-only server, or `None` (after
/// printing why) when the PostgreSQL binaries are missing; under
/// `CI=true` that panics instead.
pub async fn tls_database() -> Option<TlsTestDb> {
    let server = available(TLS_SERVER.get_or_init(|| {
        let bin = find_binaries().ok_or_else(|| {
            "no initdb/postgres found on PATH or under /usr/lib/postgresql/*/bin".to_owned()
        })?;
        start_cluster(&bin, true)
    }))?;
    let db = create_database(server).await;
    let port = server.addr.rsplit_once(':').map_or("", |(_, port)| port);
    Some(TlsTestDb {
        scram_url: format!(
            "postgresql://{SCRAM_USER}:{SCRAM_PASSWORD}@127.0.0.1:{port}/{}",
            db.name
        ),
        ca_file: server.ca_file.clone().expect("the TLS cluster has a CA"),
        db,
    })
}

/// The started server, or `None` after saying why there is none (a panic
/// under `CI=true`).
fn available(server: &Result<Server, String>) -> Option<&Server> {
    match server {
        Ok(server) => Some(server),
        Err(why) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("PostgreSQL is required under CI=true: {why}");
            }
            eprintln!(
                "skipping: no PostgreSQL ({why}); install the postgresql package or set AGENTRT_TEST_PG_URL"
            );
            None
        }
    }
}

async fn create_database(server: &Server) -> TestDb {
    let name = format!("t_{}", uuid_like());
    let (client, connection) = server
        .admin
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to the test PostgreSQL at {}: {e}", server.addr));
    let conn = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
    drop(client);
    let _ = conn.await;
    TestDb {
        url: format!("postgresql://{}/{name}", server.base),
        name,
        addr: server.addr.clone(),
    }
}

/// Like [`database`], for synchronous callers (process tests that pass
/// the URL to a server binary). Builds a small runtime of its own.
pub fn database_blocking() -> Option<TestDb> {
    blocking(database())
}

/// Like [`tls_database`], for synchronous callers.
pub fn tls_database_blocking() -> Option<TlsTestDb> {
    blocking(tls_database())
}

fn blocking<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for creating the test database")
        .block_on(future)
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn start_server() -> Result<Server, String> {
    if let Ok(url) = std::env::var("AGENTRT_TEST_PG_URL") {
        return external(&url);
    }
    let bin = find_binaries().ok_or_else(|| {
        "no initdb/postgres found on PATH or under /usr/lib/postgresql/*/bin".to_owned()
    })?;
    start_cluster(&bin, false)
}

/// A cluster of this process in a new temporary directory; with `tls`,
/// taking TLS connections only (see the module documentation).
fn start_cluster(bin: &Path, tls: bool) -> Result<Server, String> {
    let dir = std::env::temp_dir().join(format!("agentrt-pg-{}", uuid_like()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let ca_file = tls.then(|| tls_files(&dir)).transpose()?;
    // initdb and postgres refuse to run as root: run them as the
    // `postgres` user the package created, owning the directory.
    let as_root = is_root();
    if as_root {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .map_err(|e| format!("chown: {e}"))?;
        if !status.success() {
            return Err(format!(
                "chown {} to the postgres user failed (is the postgresql package installed?)",
                dir.display()
            ));
        }
    }
    let data = dir.join("data");
    let mut initdb = user_command(as_root, &bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-U", "agentrt", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null());
    let out = initdb.output().map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    for attempt in 0..5 {
        let port = free_port()?;
        match launch(as_root, bin, &dir, &data, port, tls) {
            Ok(keeper) => {
                let addr = format!("127.0.0.1:{port}");
                let mut admin = tokio_postgres::Config::new();
                admin.user("agentrt").dbname("postgres").port(port);
                // The TLS cluster refuses plaintext TCP: the harness uses
                // the Unix socket.
                if tls {
                    admin.host_path(&dir);
                } else {
                    admin.host("127.0.0.1");
                }
                let server = Server {
                    admin,
                    base: format!("agentrt@{addr}"),
                    addr,
                    ca_file,
                    _keeper: Some(Mutex::new(keeper)),
                };
                if tls {
                    // On a thread of its own: this may run inside a test's
                    // runtime, which cannot block on another.
                    std::thread::scope(|s| s.spawn(|| blocking(add_scram_user(&server))).join())
                        .map_err(|_| "creating the SCRAM role panicked".to_owned())??;
                }
                return Ok(server);
            }
            Err(why) if attempt < 4 => eprintln!("test PostgreSQL on port {port}: {why}; retrying"),
            Err(why) => return Err(why),
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// Writes the TLS cluster's files into `dir`: a CA made up for this
/// process (`ca.pem`), the server's certificate for `localhost` and
/// `127.0.0.1` and its key (`server.crt`, `server.key`, mode 0600 as
/// postgres demands), and `pg_hba.conf`: the Unix socket trusted (the
/// harness), TCP only with TLS — [`SCRAM_USER`] with its password, anyone
/// else trusted. Returns the CA's path.
fn tls_files(dir: &Path) -> Result<PathBuf, String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    use std::os::unix::fs::PermissionsExt as _;
    let made = |e: rcgen::Error| format!("test certificates: {e}");
    let ca_key = KeyPair::generate().map_err(made)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(made)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "agentrt test PostgreSQL CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).map_err(made)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().map_err(made)?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .map_err(made)?;
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = leaf.signed_by(&key, &issuer).map_err(made)?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("write {name}: {e}"))
    };
    write("ca.pem", &ca_pem)?;
    write("server.crt", &cert.pem())?;
    write("server.key", &key.serialize_pem())?;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .map_err(|e| format!("chmod server.key: {e}"))?;
    write(
        "pg_hba.conf",
        &format!(
            "local all all trust\n\
             hostssl all {SCRAM_USER} 127.0.0.1/32 scram-sha-256\n\
             hostssl all all 127.0.0.1/32 trust\n"
        ),
    )?;
    Ok(dir.join("ca.pem"))
}

/// Creates [`SCRAM_USER`] (a superuser, so a store can migrate as it).
async fn add_scram_user(server: &Server) -> Result<(), String> {
    let (client, connection) = server
        .admin
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connect to the TLS test PostgreSQL's socket: {e}"))?;
    let conn = tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE {SCRAM_USER} LOGIN SUPERUSER PASSWORD '{SCRAM_PASSWORD}'"
        ))
        .await
        .map_err(|e| format!("create the role {SCRAM_USER}: {e}"))?;
    drop(client);
    let _ = conn.await;
    Ok(())
}

/// Starts `postgres` under a keeper shell tied to this process's lifetime,
/// and waits until it accepts connections.
fn launch(
    as_root: bool,
    bin: &Path,
    dir: &Path,
    data: &Path,
    port: u16,
    tls: bool,
) -> Result<Child, String> {
    let log = dir.join("log");
    let tls_options = if tls {
        format!(
            "-c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key \
             -c hba_file={dir}/pg_hba.conf",
            dir = dir.display()
        )
    } else {
        String::new()
    };
    // The keeper: start the server, wait for this process's pipe to close
    // (a line or EOF), then stop it at once and remove the directory.
    let script = format!(
        "{postgres} -D {data} -p {port} -k {dir} -c listen_addresses=127.0.0.1 -c fsync=off \
         -c max_connections=300 -c shared_buffers=32MB {tls_options} >{log} 2>&1 & pid=$!; \
         read _ignored; kill -QUIT $pid 2>/dev/null; wait $pid; rm -rf {dir}",
        postgres = bin.join("postgres").display(),
        data = data.display(),
        dir = dir.display(),
        log = log.display(),
    );
    let mut keeper = user_command(as_root, Path::new("sh"));
    keeper
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = keeper.spawn().map_err(|e| format!("start postgres: {e}"))?;
    let started = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && ready(bin, port) {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("postgres exited ({status}): {}", log.trim()));
        }
        if started.elapsed() > Duration::from_secs(60) {
            if let Some(stdin) = child.stdin.as_mut() {
                let _ = stdin.write_all(b"stop\n");
            }
            let _ = child.wait();
            return Err("postgres did not accept connections within 60 s".to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the server on `port` accepts a session (not just TCP: it is
/// ready once startup recovery is done).
fn ready(bin: &Path, port: u16) -> bool {
    let isready = bin.join("pg_isready");
    if !isready.exists() {
        return true;
    }
    Command::new(isready)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "agentrt",
            "-q",
        ])
        .status()
        .is_ok_and(|s| s.success())
}

fn external(url: &str) -> Result<Server, String> {
    let cfg: tokio_postgres::Config = url
        .parse()
        .map_err(|e| format!("AGENTRT_TEST_PG_URL is not a PostgreSQL URL: {e}"))?;
    let host = cfg
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "127.0.0.1".to_owned());
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres");
    let password = cfg
        .get_password()
        .map(|p| format!(":{}", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    let base = format!("{user}{password}@{host}:{port}");
    let admin = format!("postgresql://{base}/postgres")
        .parse()
        .map_err(|e| format!("AGENTRT_TEST_PG_URL: {e}"))?;
    Ok(Server {
        admin,
        base,
        addr: format!("{host}:{port}"),
        ca_file: None,
        _keeper: None,
    })
}

fn user_command(as_root: bool, program: &Path) -> Command {
    if as_root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

fn find_binaries() -> Option<PathBuf> {
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
        && out.status.success()
    {
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        // Debian's PATH entries are wrappers or symlinks; resolve to the
        // directory holding postgres and pg_isready too.
        if let Ok(real) = std::fs::canonicalize(&path)
            && let Some(dir) = real.parent()
            && dir.join("postgres").exists()
        {
            return Some(dir.to_path_buf());
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("postgres").exists())
        .collect();
    versions.sort();
    versions.pop()
}
