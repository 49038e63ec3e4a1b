//! The `[compaction]` table (docs/contract.md §3.6).

use std::time::Duration;

use agentrt_runtime::compaction::CompactionConfig;
use serde::Deserialize;

use super::ConfigError;
use super::tools::de_duration_value;

/// The `[compaction]` table: when long conversations are summarised.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionSettings {
    /// Compact before a turn whose context is estimated above this many
    /// tokens. Default 80,000.
    pub max_tokens: u64,
    /// User turns kept verbatim after the summary. Default 6.
    pub keep_tail: usize,
    /// How long the summariser may take before the turn falls back to a
    /// truncated context. Default 2 min.
    #[serde(deserialize_with = "de_duration_value")]
    pub timeout: Duration,
}

impl Default for CompactionSettings {
    fn default() -> Self {
        let d = CompactionConfig::default();
        Self {
            max_tokens: d.max_tokens,
            keep_tail: d.keep_tail,
            timeout: d.timeout,
        }
    }
}

impl CompactionSettings {
    /// Rejects values that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_tokens < 1_000 {
            return Err(ConfigError(format!(
                "compaction.max_tokens is {}; it must be at least 1000",
                self.max_tokens
            )));
        }
        if !(1..=1_000).contains(&self.keep_tail) {
            return Err(ConfigError(format!(
                "compaction.keep_tail is {}; it must be between 1 and 1000",
                self.keep_tail
            )));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError(
                "compaction.timeout must be positive".to_owned(),
            ));
        }
        Ok(())
    }

    /// The runtime's form.
    pub fn to_runtime(&self) -> CompactionConfig {
        CompactionConfig {
            max_tokens: self.max_tokens,
            keep_tail: self.keep_tail,
            timeout: self.timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn compaction_table_parses_and_is_validated() {
        let c = Config::parse_toml(
            "[compaction]\nmax_tokens = 20000\nkeep_tail = 2\ntimeout = \"10s\"\n",
        )
        .unwrap();
        assert_eq!(c.compaction.max_tokens, 20_000);
        assert_eq!(c.compaction.keep_tail, 2);
        assert_eq!(c.compaction.timeout, std::time::Duration::from_secs(10));
        c.validate().unwrap();
        let defaults = Config::parse_toml("").unwrap();
        assert_eq!(defaults.compaction.max_tokens, 80_000);
        assert_eq!(defaults.compaction.keep_tail, 6);
        for bad in ["max_tokens = 10", "keep_tail = 0", "timeout = \"0s\""] {
            let c = Config::parse_toml(&format!("[compaction]\n{bad}\n")).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("compaction."), "{err}");
        }
        assert!(Config::parse_toml("[compaction]\nbogus = 1\n").is_err());
    }
}
