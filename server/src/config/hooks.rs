//! The `[[hooks]]` entries: the operator's hooks (`agentrt.hooks.v1`
//! `HookService`, or the same messages as HTTP JSON), called around every
//! turn (docs/contract.md, "Operator hooks").

use std::time::Duration;

use agentrt_runtime::hooks::{DEFAULT_TIMEOUT, HookPoint, MAX_TIMEOUT};
use serde::Deserialize;

use super::tools::de_duration_value;
use super::{Config, ConfigError};

/// One `[[hooks]]` entry.
///
/// ```toml
/// [[hooks]]
/// name = "guard"
/// url = "grpc://127.0.0.1:7000"   # or http(s)://host/path for HTTP JSON
/// points = ["before_turn", "before_tool_call"]
/// timeout = "2s"
/// fail_open = false
/// bearer_env = "GUARD_TOKEN"
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Its name in spans, metrics, logs and statuses: 1-64 characters of
    /// `a-z 0-9 _ -`; unique.
    pub name: String,
    /// Where it is: `grpc://host:port` (the gRPC `HookService`, plaintext
    /// HTTP/2), or `http://…` / `https://…` (HTTP JSON: a `POST` to
    /// `<url>/<Rpc>` per call).
    pub url: String,
    /// The points it serves: `before_turn`, `before_model_call`,
    /// `after_step`, `before_tool_call`, `after_tool_call`. Default: all.
    #[serde(default)]
    pub points: Option<Vec<String>>,
    /// Longest a call may take, e.g. `"500ms"`. Default 2 s; at most 60 s.
    #[serde(default = "default_timeout", deserialize_with = "de_duration_value")]
    pub timeout: Duration,
    /// What a call that fails or times out means: `false` (the default,
    /// fail-closed) refuses what the hook guards — the turn, the model
    /// call, the tool call, the tool's result; `true` ignores the hook for
    /// that call.
    #[serde(default)]
    pub fail_open: bool,
    /// An environment variable holding a bearer token sent with every call
    /// (`authorization: Bearer …`, as HTTP header or gRPC metadata); never
    /// logged. Default: none.
    #[serde(default)]
    pub bearer_env: Option<String>,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

impl std::fmt::Debug for HookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("points", &self.points)
            .field("timeout", &self.timeout)
            .field("fail_open", &self.fail_open)
            .field("bearer_env", &self.bearer_env)
            .finish()
    }
}

/// How a hook is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookTransport {
    /// The gRPC `HookService` at this `http://host:port` endpoint.
    Grpc(String),
    /// HTTP JSON at this URL.
    Http(String),
}

impl HookConfig {
    /// The points it serves (all when `points` is absent); validated by
    /// [`Config::validate`].
    pub fn hook_points(&self) -> Vec<HookPoint> {
        match &self.points {
            None => HookPoint::ALL.to_vec(),
            Some(names) => names
                .iter()
                .filter_map(|n| HookPoint::from_name(n))
                .collect(),
        }
    }

    /// How it is reached; validated by [`Config::validate`].
    pub fn transport(&self) -> Result<HookTransport, String> {
        if let Some(authority) = self.url.strip_prefix("grpc://") {
            let authority = authority.trim_end_matches('/');
            let port = authority
                .rsplit_once(':')
                .and_then(|(host, port)| (!host.is_empty()).then_some(port));
            return match port.map(str::parse::<u16>) {
                Some(Ok(port)) if port != 0 && !authority.contains('/') => {
                    Ok(HookTransport::Grpc(format!("http://{authority}")))
                }
                _ => Err("a grpc:// url is grpc://host:port, with no path".to_owned()),
            };
        }
        if self.url.starts_with("http://") || self.url.starts_with("https://") {
            return Ok(HookTransport::Http(self.url.clone()));
        }
        Err("url must start with grpc://, http:// or https://".to_owned())
    }

    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let fail = |what: String| Err(ConfigError(format!("{at}: {what}")));
        let name_ok = (1..=64).contains(&self.name.len())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !name_ok {
            return fail("name must be 1-64 characters of a-z 0-9 _ -".to_owned());
        }
        if let Err(why) = self.transport() {
            return fail(why);
        }
        if let Some(names) = &self.points {
            if names.is_empty() {
                return fail(
                    "points is empty; leave it out to serve every point, or remove the hook"
                        .to_owned(),
                );
            }
            let mut seen = std::collections::BTreeSet::new();
            for name in names {
                if HookPoint::from_name(name).is_none() {
                    let known: Vec<_> = HookPoint::ALL.iter().map(|p| p.name()).collect();
                    return fail(format!(
                        "points: {:?} is not a hook point (one of {})",
                        agentrt_runtime::error::display_clip(name, 40),
                        known.join(", ")
                    ));
                }
                if !seen.insert(name) {
                    return fail(format!("points: {name:?} is listed twice"));
                }
            }
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return fail(format!(
                "timeout is {:?}; it must be positive and at most {}s",
                self.timeout,
                MAX_TIMEOUT.as_secs()
            ));
        }
        if self.bearer_env.as_deref().is_some_and(str::is_empty) {
            return fail("bearer_env is empty".to_owned());
        }
        Ok(())
    }
}

impl Config {
    /// Checks `[[hooks]]`.
    pub(super) fn validate_hooks(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, h) in self.hooks.iter().enumerate() {
            let at = format!(
                "hooks[{i}] ({:?})",
                agentrt_runtime::error::display_clip(&h.name, 64)
            );
            h.validate(&at)?;
            if !names.insert(h.name.as_str()) {
                return Err(ConfigError(format!(
                    "{at}: a hook of that name is configured twice"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks(toml: &str) -> Result<Config, ConfigError> {
        let c = Config::parse_toml(toml)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn defaults_serve_every_point_fail_closed_within_two_seconds() {
        let c = hooks("[[hooks]]\nname = \"guard\"\nurl = \"grpc://127.0.0.1:7000\"\n").unwrap();
        let h = &c.hooks[0];
        assert_eq!(h.hook_points(), HookPoint::ALL.to_vec());
        assert_eq!(h.timeout, Duration::from_secs(2));
        assert!(!h.fail_open);
        assert_eq!(
            h.transport(),
            Ok(HookTransport::Grpc("http://127.0.0.1:7000".into()))
        );
        let c = hooks(
            "[[hooks]]\nname = \"web\"\nurl = \"https://guard.example/hooks\"\n\
             points = [\"before_tool_call\"]\ntimeout = \"250ms\"\nfail_open = true\n\
             bearer_env = \"GUARD_TOKEN\"\n",
        )
        .unwrap();
        let h = &c.hooks[0];
        assert_eq!(h.hook_points(), [HookPoint::BeforeToolCall]);
        assert_eq!(h.timeout, Duration::from_millis(250));
        assert!(h.fail_open);
        assert_eq!(
            h.transport(),
            Ok(HookTransport::Http("https://guard.example/hooks".into()))
        );
    }

    #[test]
    fn bad_entries_are_refused_naming_the_key() {
        for (entry, named) in [
            ("name = \"Guard\"\nurl = \"grpc://h:1\"", "name"),
            ("name = \"g\"\nurl = \"ftp://h\"", "url"),
            ("name = \"g\"\nurl = \"grpc://h\"", "grpc://host:port"),
            ("name = \"g\"\nurl = \"grpc://h:1/x\"", "grpc://host:port"),
            ("name = \"g\"\nurl = \"grpc://h:1\"\npoints = []", "points"),
            (
                "name = \"g\"\nurl = \"grpc://h:1\"\npoints = [\"before_lunch\"]",
                "before_lunch",
            ),
            (
                "name = \"g\"\nurl = \"grpc://h:1\"\npoints = [\"after_step\", \"after_step\"]",
                "twice",
            ),
            (
                "name = \"g\"\nurl = \"grpc://h:1\"\ntimeout = \"0ms\"",
                "timeout",
            ),
            (
                "name = \"g\"\nurl = \"grpc://h:1\"\ntimeout = \"2m\"",
                "timeout",
            ),
            (
                "name = \"g\"\nurl = \"grpc://h:1\"\nbearer_env = \"\"",
                "bearer_env",
            ),
        ] {
            let err = hooks(&format!("[[hooks]]\n{entry}\n")).unwrap_err().0;
            assert!(
                err.contains("hooks[0]") && err.contains(named),
                "{entry}: {err}"
            );
        }
        let twice = "[[hooks]]\nname = \"g\"\nurl = \"grpc://h:1\"\n\
                     [[hooks]]\nname = \"g\"\nurl = \"http://h\"\n";
        let err = hooks(twice).unwrap_err().0;
        assert!(err.contains("hooks[1]") && err.contains("twice"), "{err}");
        assert!(
            Config::parse_toml("[[hooks]]\nname = \"g\"\nurl = \"grpc://h:1\"\ntoken = \"x\"\n")
                .is_err()
        );
    }
}
