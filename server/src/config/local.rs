//! The `[local_model]` table: the built-in CPU model (`local/smollm2`).

use std::path::{Path, PathBuf};

use agentrt_local_model::LocalModelConfig;
use serde::Deserialize;

use super::{Config, ConfigError};

/// The `[local_model]` table. Every key is optional; the defaults are those
/// of [`LocalModelConfig`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalModelSettings {
    /// The GGUF file (also `--model-path` / `AGENTRT_MODEL_PATH`). Default
    /// `<data-dir>/models/SmolLM2-135M-Instruct.Q4_1.gguf`. When set, a
    /// missing or unusable file stops the server at start-up; the default
    /// file being absent only means the server uses `builtin/echo`.
    pub path: Option<PathBuf>,
    /// `false` never loads a local model. Default true.
    pub enabled: Option<bool>,
    /// Inference threads (turns generated at once). Default 1.
    pub threads: Option<usize>,
    /// Turns that may wait for an inference thread. Default 8.
    pub queue_depth: Option<usize>,
    /// 0 is greedy. Default 0.
    pub temperature: Option<f64>,
    /// Nucleus sampling cut-off. Default 0.9.
    pub top_p: Option<f64>,
    /// Sampler seed. Default 299792458.
    pub seed: Option<u64>,
    /// Most generated tokens per model step. Default 512.
    pub max_tokens: Option<usize>,
    /// Run turns that offer tools without showing them to the model.
    /// Default false: such turns are rejected with `INVALID_ARGUMENT`.
    pub allow_without_tools: Option<bool>,
}

impl LocalModelSettings {
    /// Whether a local model may be loaded at all.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The provider's settings, with the model file under `data_dir` unless
    /// a path is set.
    pub fn resolve(&self, data_dir: &Path) -> LocalModelConfig {
        let d = LocalModelConfig::new(data_dir);
        LocalModelConfig {
            path: self.path.clone().unwrap_or(d.path),
            threads: self.threads.unwrap_or(d.threads),
            queue_depth: self.queue_depth.unwrap_or(d.queue_depth),
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            seed: self.seed.unwrap_or(d.seed),
            max_tokens: self.max_tokens.unwrap_or(d.max_tokens),
            allow_without_tools: self.allow_without_tools.unwrap_or(d.allow_without_tools),
        }
    }
}

impl Config {
    pub(super) fn validate_local_model(&self) -> Result<(), ConfigError> {
        let l = &self.local_model;
        let bad = |what: &str| Err(ConfigError(format!("local_model.{what}")));
        if l.threads.is_some_and(|n| n == 0 || n > 64) {
            return bad("threads must be between 1 and 64");
        }
        if l.queue_depth.is_some_and(|n| n > 4096) {
            return bad("queue_depth must be at most 4096");
        }
        if l.temperature
            .is_some_and(|t| !t.is_finite() || !(0.0..=5.0).contains(&t))
        {
            return bad("temperature must be between 0 and 5");
        }
        if l.top_p
            .is_some_and(|p| !p.is_finite() || p <= 0.0 || p > 1.0)
        {
            return bad("top_p must be in (0, 1]");
        }
        if l.max_tokens.is_some_and(|n| n == 0 || n > 4096) {
            return bad("max_tokens must be between 1 and 4096");
        }
        if self.providers.iter().any(|p| p.name == "local") {
            return Err(ConfigError(
                "provider name \"local\" is reserved for the built-in local model".to_owned(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_model_table_parses_and_overrides_defaults() {
        let c = Config::parse_toml(
            "[local_model]\npath = \"/m/x.gguf\"\nthreads = 2\ntemperature = 0.7\nallow_without_tools = true\n",
        )
        .unwrap();
        c.validate().unwrap();
        let r = c.local_model.resolve(Path::new("/data"));
        assert_eq!(r.path, PathBuf::from("/m/x.gguf"));
        assert_eq!((r.threads, r.queue_depth, r.max_tokens), (2, 8, 512));
        assert!(r.allow_without_tools);
        let d = Config::default().local_model.resolve(Path::new("/data"));
        assert_eq!(
            d.path,
            PathBuf::from("/data/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert_eq!(d.threads, 1);
    }

    #[test]
    fn bad_local_model_values_are_refused() {
        for bad in [
            "threads = 0",
            "temperature = -1.0",
            "top_p = 0.0",
            "max_tokens = 0",
        ] {
            let c = Config::parse_toml(&format!("[local_model]\n{bad}\n")).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
        assert!(Config::parse_toml("[local_model]\nthreds = 1\n").is_err());
    }
}
