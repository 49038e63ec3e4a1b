//! The `[transport]` table: how connections and streams are accepted and
//! bounded before any request reaches a handler, so that nobody who can
//! reach the port (credentials are checked only inside a request) can use up
//! the server's file descriptors, memory or CPU.

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
    pub max_connections_per_ip: usize,
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
    /// across all of a peer's connections. 0: no cap. Default 1024.
    pub max_pending_requests_per_ip: usize,
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
            handshake_timeout: Duration::from_secs(10),
            max_concurrent_streams: 256,
            max_requests_per_connection: 256,
            max_pending_requests_per_ip: 1024,
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
        let secs = |d: Duration| d.as_secs_f64();
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
