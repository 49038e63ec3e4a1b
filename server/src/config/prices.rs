//! The `[prices]` table: what each model's tokens cost, in US dollars per
//! million tokens. A turn of a listed model records its cost (`Turn.cost`
//! of ListTurns/GetTurn); a model not listed has none.
//!
//! ```toml
//! [prices."openai/gpt-4.1"]
//! input = 2.0          # per million input tokens not served from a cache
//! cached_input = 0.5   # per million cached input tokens (default: input)
//! output = 8.0         # per million output tokens, reasoning included
//! ```

use std::collections::BTreeMap;

use agentrt_runtime::prices::{Price, Prices};
use serde::Deserialize;

use super::ConfigError;

/// One model's prices as written.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PriceSettings {
    input: f64,
    cached_input: Option<f64>,
    output: f64,
}

/// The table, checked: every price a finite number ≥ 0, every key a
/// `provider/model`.
pub(super) fn prices(table: BTreeMap<String, PriceSettings>) -> Result<Prices, ConfigError> {
    if let Some(key) = table.keys().find(|k| !is_model(k)) {
        return Err(ConfigError(format!(
            "prices.{key:?}: the key is not a provider/model name (e.g. [prices.\"openai/gpt-4.1\"])"
        )));
    }
    let table = table
        .into_iter()
        .map(|(model, p)| {
            let price = Price {
                input: p.input,
                cached_input: p.cached_input,
                output: p.output,
            };
            (model, price)
        })
        .collect();
    Prices::new(table).map_err(ConfigError)
}

fn is_model(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(provider, model)| !provider.is_empty() && !model.is_empty())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn prices_are_read_and_bad_ones_refused_naming_the_model() {
        let config = Config::parse_toml(
            "[prices.\"openai/gpt\"]\ninput = 2.0\ncached_input = 0.5\noutput = 8.0\n",
        )
        .expect("valid");
        let usage = agentrt_runtime::types::Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            ..Default::default()
        };
        assert_eq!(
            config.prices.cost_nano_usd("openai/gpt", &usage),
            Some(10_000_000_000)
        );
        for (text, wanted) in [
            (
                "[prices.\"openai/gpt\"]\ninput = -1.0\noutput = 1.0\n",
                "input = -1",
            ),
            (
                "[prices.gpt]\ninput = 1.0\noutput = 1.0\n",
                "not a provider/model",
            ),
            ("[prices.\"a/b\"]\ninput = 1.0\n", "output"),
            (
                "[prices.\"a/b\"]\ninput = 1.0\noutput = 1.0\ncache = 1.0\n",
                "cache",
            ),
        ] {
            let err = Config::parse_toml(text).expect_err(text).to_string();
            assert!(err.contains(wanted), "{text}: {err}");
        }
    }
}
