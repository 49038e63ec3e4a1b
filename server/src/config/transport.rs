//! The `[transport]` table: how connections and streams are accepted and
//! bounded before any request reaches a handler, so that nobody who can
//! reach the port (credentials are checked only inside a request) can use up
//! the server's file descriptors, memory or CPU.
//!
//! Behind a proxy or a mesh sidecar every caller has the proxy's address,
//! so the per-address caps (`*_per_ip`) would make one caller's abuse
//! everyone's: set them to 0 there (the mesh overlays in `deploy/` do). The
//! other limits hold either way: they are keyed by connection, by principal
//! (after authentication), or shared by callers without credentials in
//! pools of their own that evict their oldest member instead of refusing
//! newcomers.

use std::time::Duration;

use serde::Deserialize;

use super::tools::de_duration_value;
use super::{Config, ConfigError};

/// The `[transport]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportSettings {
    /// Most connections open at once (handshaking or serving); at the cap
    /// the server stops accepting until one closes. Default 10000. The fd
    /// soft limit is raised to the hard limit at start; a cap above it is
    /// logged as a warning.
    pub max_connections: usize,
    /// Most connections open at once from one IP address; more are closed
    /// as soon as they are accepted. 0: no per-address cap. Default 256.
    /// Set 0 behind a proxy or mesh sidecar (every caller has its address).
    pub max_connections_per_ip: usize,
    /// Most connections that have not carried an authenticated call yet
    /// (idle, handshaking, or used only for health and reflection). At the
    /// cap the oldest of them is closed to make room, so connections
    /// without credentials cannot keep anyone else out. Above
    /// `max_connections` it changes nothing. Default 1024.
    pub max_unauthenticated_connections: usize,
    /// A connection is closed this long after it was accepted: new calls
    /// are refused with GOAWAY (clients reconnect, possibly to another
    /// replica), calls in flight get [`Self::max_connection_age_grace`].
    /// 0s: no maximum age. Default 30 min.
    #[serde(deserialize_with = "de_duration_value")]
    pub max_connection_age: Duration,
    /// After the GOAWAY of [`Self::max_connection_age`], how long calls in
    /// flight get before the connection is closed regardless. Default
    /// 5 min (a Subscribe stream resumes on a new connection).
    #[serde(deserialize_with = "de_duration_value")]
    pub max_connection_age_grace: Duration,
    /// A connection with no call open for this long is closed (including a
    /// connection that never carried one). 0s: never. Default 5 min.
    #[serde(deserialize_with = "de_duration_value")]
    pub idle_timeout: Duration,
    /// A connection that has not finished its TLS handshake (with `[tls]`)
    /// and sent the HTTP/2 preface within this time is closed. Default 10 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub handshake_timeout: Duration,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: streams one connection may
    /// have open at once. Default 256.
    pub max_concurrent_streams: u32,
    /// Requests of one connection being handled at once (the rest wait).
    /// Default 256.
    pub max_requests_per_connection: usize,
    /// Most calls from one IP address whose request is still arriving
    /// (HEADERS received, request not complete); more are answered
    /// RESOURCE_EXHAUSTED at once. Bounds what half-open streams cost
    /// across all of a peer's connections. 0: no cap. Default 1024. Set 0
    /// behind a proxy or mesh sidecar (every caller has its address).
    pub max_pending_requests_per_ip: usize,
    /// Most calls to the services served without credentials (health,
    /// reflection) whose request is still arriving, across all
    /// connections: a pool of its own, so half-open streams there never
    /// hold anything authenticated calls need. At the cap the oldest is
    /// ended RESOURCE_EXHAUSTED to make room, so a prober is not kept out
    /// by half-open streams. Default 64.
    pub max_pending_anonymous_requests: usize,
    /// Most calls one authenticated principal (API key user, mTLS
    /// identity) may have open at once across all connections, streams
    /// included; more are answered RESOURCE_EXHAUSTED with a
    /// `QuotaFailure`. 0: no cap. Default 1024.
    pub max_streams_per_principal: usize,
    /// Longest time the request message of a call may take to arrive
    /// (from the stream's HEADERS to the end of its request); for calls
    /// that stream requests (reflection), the longest silence between two
    /// request frames. Past it the call ends DEADLINE_EXCEEDED. It never
    /// limits a response stream such as Chat's. Default 10 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub request_timeout: Duration,
    /// Largest request message in bytes; a larger one is refused with
    /// INVALID_ARGUMENT naming this limit. Default 4 MiB (the input itself
    /// is limited to 1 MiB of text by the runtime).
    pub max_request_bytes: usize,
    /// HTTP/2 PING interval on an idle connection. Default 30 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub keepalive_interval: Duration,
    /// A PING not answered within this time closes the connection (a dead
    /// peer). Default 20 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub keepalive_timeout: Duration,
    /// TCP keepalive idle time. Default 60 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub tcp_keepalive: Duration,
    /// Pause of the accept loop after an accept error such as EMFILE
    /// (out of file descriptors), instead of retrying at once. Default
    /// 100 ms.
    #[serde(deserialize_with = "de_duration_value")]
    pub accept_error_backoff: Duration,
}

impl Default for TransportSettings {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_connections_per_ip: 256,
            max_unauthenticated_connections: 1024,
            max_connection_age: Duration::from_secs(30 * 60),
            max_connection_age_grace: Duration::from_secs(5 * 60),
            idle_timeout: Duration::from_secs(5 * 60),
            handshake_timeout: Duration::from_secs(10),
            max_concurrent_streams: 256,
            max_requests_per_connection: 256,
            max_pending_requests_per_ip: 1024,
            max_pending_anonymous_requests: 64,
            max_streams_per_principal: 1024,
            request_timeout: Duration::from_secs(10),
            max_request_bytes: 4 << 20,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            tcp_keepalive: Duration::from_secs(60),
            accept_error_backoff: Duration::from_millis(100),
        }
    }
}

impl TransportSettings {
    fn check(&self) -> Result<(), String> {
        let t = self;
        if !(1..=1_000_000).contains(&t.max_connections) {
            return Err(format!(
                "max_connections is {}; it must be between 1 and 1000000",
                t.max_connections
            ));
        }
        if t.max_connections_per_ip > t.max_connections {
            return Err(format!(
                "max_connections_per_ip is {}; it must be at most max_connections ({}), or 0 for no per-address cap",
                t.max_connections_per_ip, t.max_connections
            ));
        }
        if !(1..=1_000_000).contains(&t.max_unauthenticated_connections) {
            return Err(format!(
                "max_unauthenticated_connections is {}; it must be between 1 and 1000000",
                t.max_unauthenticated_connections
            ));
        }
        let secs = |d: Duration| d.as_secs_f64();
        if !t.max_connection_age.is_zero()
            && !(1.0..=30.0 * 86400.0).contains(&secs(t.max_connection_age))
        {
            return Err(format!(
                "max_connection_age is {:?}; it must be between 1s and 720h, or 0s for none",
                t.max_connection_age
            ));
        }
        if !(0.1..=86400.0).contains(&secs(t.max_connection_age_grace)) {
            return Err(format!(
                "max_connection_age_grace is {:?}; it must be between 100ms and 24h",
                t.max_connection_age_grace
            ));
        }
        if !t.idle_timeout.is_zero() && !(0.1..=86400.0).contains(&secs(t.idle_timeout)) {
            return Err(format!(
                "idle_timeout is {:?}; it must be between 100ms and 24h, or 0s for none",
                t.idle_timeout
            ));
        }
        if !(0.1..=300.0).contains(&secs(t.handshake_timeout)) {
            return Err(format!(
                "handshake_timeout is {:?}; it must be between 100ms and 5m",
                t.handshake_timeout
            ));
        }
        if !(1..=10_000).contains(&t.max_concurrent_streams) {
            return Err(format!(
                "max_concurrent_streams is {}; it must be between 1 and 10000",
                t.max_concurrent_streams
            ));
        }
        if !(1..=10_000).contains(&t.max_requests_per_connection) {
            return Err(format!(
                "max_requests_per_connection is {}; it must be between 1 and 10000",
                t.max_requests_per_connection
            ));
        }
        if t.max_pending_requests_per_ip > 1_000_000 {
            return Err(format!(
                "max_pending_requests_per_ip is {}; it must be at most 1000000 (0: no cap)",
                t.max_pending_requests_per_ip
            ));
        }
        if !(1..=100_000).contains(&t.max_pending_anonymous_requests) {
            return Err(format!(
                "max_pending_anonymous_requests is {}; it must be between 1 and 100000",
                t.max_pending_anonymous_requests
            ));
        }
        if t.max_streams_per_principal > 1_000_000 {
            return Err(format!(
                "max_streams_per_principal is {}; it must be at most 1000000 (0: no cap)",
                t.max_streams_per_principal
            ));
        }
        if !(0.1..=3600.0).contains(&secs(t.request_timeout)) {
            return Err(format!(
                "request_timeout is {:?}; it must be between 100ms and 1h",
                t.request_timeout
            ));
        }
        if !((64 << 10)..=(256 << 20)).contains(&t.max_request_bytes) {
            return Err(format!(
                "max_request_bytes is {}; it must be between 65536 (64 KiB) and 268435456 (256 MiB)",
                t.max_request_bytes
            ));
        }
        if !(1.0..=3600.0).contains(&secs(t.keepalive_interval))
            || !(1.0..=600.0).contains(&secs(t.keepalive_timeout))
        {
            return Err(format!(
                "keepalive_interval ({:?}) must be between 1s and 1h and keepalive_timeout ({:?}) between 1s and 10m",
                t.keepalive_interval, t.keepalive_timeout
            ));
        }
        if !(1.0..=7200.0).contains(&secs(t.tcp_keepalive)) {
            return Err(format!(
                "tcp_keepalive is {:?}; it must be between 1s and 2h",
                t.tcp_keepalive
            ));
        }
        if !(0.001..=10.0).contains(&secs(t.accept_error_backoff)) {
            return Err(format!(
                "accept_error_backoff is {:?}; it must be between 1ms and 10s",
                t.accept_error_backoff
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Checks `[transport]`.
    pub(super) fn validate_transport(&self) -> Result<(), ConfigError> {
        self.transport
            .check()
            .map_err(|why| ConfigError(format!("transport.{why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_address_flags_override_the_file() {
        let c = Config::parse_toml(
            "[transport]\nmax_connections_per_ip = 5\nmax_pending_requests_per_ip = 7\n",
        )
        .unwrap();
        let cli = crate::config::Cli {
            max_connections_per_ip: Some(0),
            max_pending_requests_per_ip: Some(0),
            ..crate::config::Cli::default()
        };
        let c = c.with_overrides(&cli);
        c.validate().unwrap();
        assert_eq!(c.transport.max_connections_per_ip, 0);
        assert_eq!(c.transport.max_pending_requests_per_ip, 0);
        let kept = Config::parse_toml("[transport]\nmax_connections_per_ip = 5\n")
            .unwrap()
            .with_overrides(&crate::config::Cli::default());
        assert_eq!(kept.transport.max_connections_per_ip, 5);
    }

    #[test]
    fn transport_defaults_validate_and_keys_parse() {
        let c = Config::parse_toml(
            "[transport]\nmax_connections = 50\nmax_connections_per_ip = 5\nhandshake_timeout = \"2s\"\nrequest_timeout = \"500ms\"\nmax_request_bytes = 1048576\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.transport.max_connections, 50);
        assert_eq!(c.transport.handshake_timeout, Duration::from_secs(2));
        assert_eq!(c.transport.request_timeout, Duration::from_millis(500));
        assert_eq!(c.transport.max_concurrent_streams, 256);
        Config::default().validate().unwrap();
        // Behind a mesh: per-address caps off, no age, no idle timeout.
        let c = Config::parse_toml(
            "[transport]\nmax_connections_per_ip = 0\nmax_pending_requests_per_ip = 0\nmax_connection_age = \"0s\"\nidle_timeout = \"0s\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c.transport.max_connection_age.is_zero());
    }

    #[test]
    fn transport_values_out_of_range_are_refused_naming_the_key() {
        for (toml, key) in [
            ("max_connections = 0", "transport.max_connections"),
            (
                "max_connections = 10\nmax_connections_per_ip = 11",
                "transport.max_connections_per_ip",
            ),
            ("handshake_timeout = \"0s\"", "transport.handshake_timeout"),
            (
                "max_concurrent_streams = 0",
                "transport.max_concurrent_streams",
            ),
            ("request_timeout = \"2h\"", "transport.request_timeout"),
            (
                "max_pending_requests_per_ip = 2000000",
                "transport.max_pending_requests_per_ip",
            ),
            ("max_request_bytes = 10", "transport.max_request_bytes"),
            (
                "max_unauthenticated_connections = 0",
                "transport.max_unauthenticated_connections",
            ),
            (
                "max_connection_age = \"10ms\"",
                "transport.max_connection_age",
            ),
            (
                "max_connection_age_grace = \"0s\"",
                "transport.max_connection_age_grace",
            ),
            ("idle_timeout = \"25h\"", "transport.idle_timeout"),
            (
                "max_pending_anonymous_requests = 0",
                "transport.max_pending_anonymous_requests",
            ),
            ("keepalive_timeout = \"0s\"", "keepalive_timeout"),
            (
                "accept_error_backoff = \"1m\"",
                "transport.accept_error_backoff",
            ),
        ] {
            let c = Config::parse_toml(&format!("[transport]\n{toml}\n")).unwrap();
            let err = c.validate().unwrap_err().0;
            assert!(err.contains(key), "{toml}: {err}");
        }
        assert!(Config::parse_toml("[transport]\nmax_conections = 1\n").is_err());
    }
}
