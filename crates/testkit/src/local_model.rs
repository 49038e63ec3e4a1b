//! Finding the real local model file for tests (the local model's and the
//! server's), and loading it once per test binary.
//!
//! The file comes from `AGENTRT_TEST_MODEL` (a GGUF path), else
//! `AGENTRT_TEST_MODEL_DIR` (a directory holding it), else the CI cache
//! `.ci/models/` of this checkout (`.ci/run` provisions it there). When it
//! is absent the tests fail if `CI=true` or `AGENTRT_REQUIRE_MODEL=1`, and
//! otherwise skip with a loud message.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use agentrt_local_model::load::LoadedModel;
use agentrt_local_model::{DEFAULT_FILE, LocalModelConfig, LocalProvider};

/// The model file, if present.
pub fn model_path() -> Option<PathBuf> {
    let path = match (
        std::env::var_os("AGENTRT_TEST_MODEL"),
        std::env::var_os("AGENTRT_TEST_MODEL_DIR"),
    ) {
        (Some(p), _) => PathBuf::from(p),
        (None, Some(d)) => PathBuf::from(d).join(DEFAULT_FILE),
        (None, None) => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../.ci/models")
            .join(DEFAULT_FILE),
    };
    if path.exists() {
        return Some(path);
    }
    let required = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("AGENTRT_REQUIRE_MODEL").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "the local model file {} is missing (CI / AGENTRT_REQUIRE_MODEL=1 require it); \
         provision it with `cargo run -p agentrt-server -- --model-path {} fetch-model`",
        path.display(),
        path.display()
    );
    // Written to the real stderr, past the test harness's capture, so the
    // skip is visible in a passing run.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: no local model at {} — run `bash .ci/run test` or `cargo run -p agentrt-server -- \
         --model-path {} fetch-model` to provision it ***\n",
        path.display(),
        path.display()
    );
    None
}

/// The model, loaded once per test binary (about 300 MB).
pub fn model() -> Option<Arc<LoadedModel>> {
    static MODEL: OnceLock<Option<Arc<LoadedModel>>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = model_path()?;
            Some(Arc::new(
                agentrt_local_model::load::load(&path).expect("the model loads"),
            ))
        })
        .clone()
}

/// A provider over the shared model, with its own inference thread.
pub fn provider(edit: impl FnOnce(&mut LocalModelConfig)) -> Option<LocalProvider> {
    let model = model()?;
    let mut config = LocalModelConfig::new(std::path::Path::new("unused"));
    edit(&mut config);
    Some(LocalProvider::with_model(model, config).expect("the provider starts"))
}
