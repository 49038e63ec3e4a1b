//! Telemetry settings that are ours: the Prometheus listener
//! (`metrics_listen`, docs/contract.md §7) and the `[telemetry]` table. Traces and
//! OTLP metrics follow the standard `OTEL_*` environment instead (see
//! [`crate::telemetry`]), so operators configure them as for any service.

use serde::Deserialize;

use super::{Config, ConfigError};

/// The `[telemetry]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// Put message content (model output, tool arguments) on spans, as the
    /// GenAI conventions' opt-in attributes. Default false: content may be
    /// personal data, and traces often leave the trust boundary.
    pub capture_content: bool,
}

impl Config {
    /// Checks `metrics_listen` against `listen`.
    pub(super) fn validate_telemetry(&self) -> Result<(), ConfigError> {
        if let Some(metrics) = self.metrics_listen {
            let same_port = metrics.port() != 0 && metrics.port() == self.listen.port();
            let overlap = metrics.ip() == self.listen.ip()
                || metrics.ip().is_unspecified()
                || self.listen.ip().is_unspecified();
            if same_port && overlap {
                return Err(ConfigError(format!(
                    "metrics_listen ({metrics}) must differ from listen ({}): the Prometheus endpoint has its own port",
                    self.listen
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_listen_on_the_grpc_address_is_refused_and_another_port_is_fine() {
        let c = Config::parse_toml(
            "listen = \"127.0.0.1:50051\"\nmetrics_listen = \"127.0.0.1:50051\"\n",
        )
        .unwrap();
        let err = c.validate().unwrap_err().0;
        assert!(err.contains("metrics_listen"), "{err}");
        let c = Config::parse_toml(
            "listen = \"127.0.0.1:50051\"\nmetrics_listen = \"0.0.0.0:50051\"\n",
        )
        .unwrap();
        assert!(c.validate().is_err());
        let c = Config::parse_toml(
            "listen = \"127.0.0.1:50051\"\nmetrics_listen = \"127.0.0.1:9464\"\n[telemetry]\ncapture_content = true\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c.telemetry.capture_content);
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    }

    #[test]
    fn content_capture_is_off_by_default() {
        assert!(!Config::default().telemetry.capture_content);
        assert_eq!(Config::default().metrics_listen, None);
    }
}
