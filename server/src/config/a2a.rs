//! The `[a2a]` table: how the A2A agent card names this agent to callers.

use serde::Deserialize;

use super::{Config, ConfigError};

/// Longest `public_url` accepted.
const MAX_PUBLIC_URL: usize = 2048;

/// The `[a2a]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct A2aSettings {
    /// The address A2A callers reach this agent's gRPC interface at, as the
    /// agent card advertises it (`supported_interfaces[].url`): what gRPC
    /// clients dial, `host:port` (`agent.example.com:443`), or an
    /// `http://` / `https://` URL for callers that take one. Also
    /// `--a2a-public-url` / `AGENTRT_A2A_PUBLIC_URL`. Default: the address
    /// the server is bound to — right on one machine, wrong behind a load
    /// balancer or in a pod (`0.0.0.0:50051`).
    pub public_url: Option<String>,
}

impl Config {
    /// Checks `[a2a] public_url`: an absolute `http(s)://` URL with a host,
    /// or `host:port`; no spaces or credentials.
    pub(super) fn validate_a2a(&self) -> Result<(), ConfigError> {
        let Some(url) = &self.a2a.public_url else {
            return Ok(());
        };
        let bad = |why: &str| {
            Err(ConfigError(format!(
                "[a2a] public_url (AGENTRT_A2A_PUBLIC_URL) {why}; give the address callers reach \
                 this agent at, e.g. agent.example.com:443 or https://agent.example.com"
            )))
        };
        if url.len() > MAX_PUBLIC_URL {
            return bad(&format!("is longer than {MAX_PUBLIC_URL} bytes"));
        }
        if url.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad("must be non-empty and hold no spaces");
        }
        let authority = match url.split_once("://") {
            Some(("http" | "https", rest)) => rest.split(['/', '?', '#']).next().unwrap_or(""),
            Some(_) => return bad("must be http:// or https://, or host:port"),
            None => {
                let port = url.rsplit_once(':').map(|(_, port)| port);
                if !port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0)) {
                    return bad("without a scheme must be host:port");
                }
                url.as_str()
            }
        };
        if authority.contains('@') {
            return bad("must not hold credentials");
        }
        if authority.is_empty() || authority.starts_with(':') {
            return bad("has no host");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str) -> Result<(), ConfigError> {
        let mut config = Config::default();
        config.a2a.public_url = Some(url.to_owned());
        config.validate_a2a()
    }

    #[test]
    fn public_url_is_host_port_or_an_http_url_with_a_host() {
        for good in [
            "agent.example.com:443",
            "10.0.0.5:50051",
            "[::1]:50051",
            "https://agent.example.com",
            "http://agent.example.com:8080/a2a",
        ] {
            check(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in [
            "",
            "agent.example.com",
            "agent.example.com:0",
            "https://",
            "https://:443",
            "ftp://agent.example.com",
            "https://user:pw@agent.example.com",
            "agent example.com:443",
        ] {
            let err = check(bad).expect_err(bad);
            assert!(err.0.contains("[a2a] public_url"), "{err}");
            assert!(!bad.contains("pw") || !err.0.contains("pw"), "{err}");
        }
    }

    #[test]
    fn the_table_and_the_flag_set_it_and_the_flag_wins() {
        let config = Config::parse_toml("[a2a]\npublic_url = \"a2a.example.com:443\"\n").unwrap();
        assert_eq!(
            config.a2a.public_url.as_deref(),
            Some("a2a.example.com:443")
        );
        assert!(Config::parse_toml("[a2a]\nurl = \"x:1\"\n").is_err());
        let cli = super::super::Cli {
            a2a_public_url: Some("https://agent.example.com".to_owned()),
            ..Default::default()
        };
        let config = config.with_overrides(&cli);
        assert_eq!(
            config.a2a.public_url.as_deref(),
            Some("https://agent.example.com")
        );
    }
}
