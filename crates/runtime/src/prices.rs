//! What tokens cost: a price table per `provider/model`, and the cost of a
//! turn's [`Usage`] by it.
//!
//! Prices are US dollars per million tokens. Cached input tokens are part
//! of the input tokens (as [`Usage`] counts them) and cost the cached
//! price when one is set, else the input price; reasoning tokens are part
//! of the output tokens and cost the output price. Costs are kept in
//! billionths of a dollar (nano-USD), an integer, so sums are exact.

use std::collections::BTreeMap;

use crate::types::Usage;

/// The price of one model, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    /// Input (prompt) tokens not served from a cache.
    pub input: f64,
    /// Input tokens served from a prompt cache; the input price when
    /// `None`.
    pub cached_input: Option<f64>,
    /// Output tokens, reasoning included.
    pub output: f64,
}

impl Price {
    /// `None` when every price is a finite number ≥ 0, else what is wrong
    /// (for the configuration's error message).
    pub fn problem(&self) -> Option<String> {
        let bad = |v: f64| !v.is_finite() || v < 0.0;
        [
            ("input", Some(self.input)),
            ("cached_input", self.cached_input),
            ("output", Some(self.output)),
        ]
        .into_iter()
        .find_map(|(name, v)| {
            v.filter(|v| bad(*v))
                .map(|v| format!("{name} = {v} is not a price (a number of US dollars ≥ 0)"))
        })
    }

    /// What `usage` costs, in nano-USD (saturating).
    pub fn cost_nano_usd(&self, usage: &Usage) -> u64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let uncached = usage.input_tokens - cached;
        let cached_price = self.cached_input.unwrap_or(self.input);
        // A million tokens at one dollar is 1e9 nano-USD: 1,000 per token.
        let nanos = 1_000.0
            * (tokens(uncached) * self.input
                + tokens(cached) * cached_price
                + tokens(usage.output_tokens) * self.output);
        // `as` saturates (and maps NaN to 0); prices are checked finite.
        nanos.round() as u64
    }
}

/// Token counts are far below 2^53, where f64 stops being exact.
fn tokens(count: u64) -> f64 {
    count as f64
}

/// Prices by `provider/model`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

impl Prices {
    /// The table; `Err` names the first model whose price is not one.
    pub fn new(table: BTreeMap<String, Price>) -> Result<Self, String> {
        match table.iter().find_map(|(m, p)| p.problem().map(|e| (m, e))) {
            Some((model, problem)) => Err(format!("prices.\"{model}\": {problem}")),
            None => Ok(Self(table)),
        }
    }

    /// What `usage` of `model` costs in nano-USD; `None` when the model has
    /// no price.
    pub fn cost_nano_usd(&self, model: &str, usage: &Usage) -> Option<u64> {
        self.0.get(model).map(|price| price.cost_nano_usd(usage))
    }
}

/// US dollars as nano-USD; `None` for a value that is not a cost (not a
/// finite number ≥ 0, or 10^10 dollars and more).
pub fn nano_usd(usd: f64) -> Option<u64> {
    (usd.is_finite() && (0.0..1e10).contains(&usd)).then(|| (usd * 1e9).round() as u64)
}

/// Nano-USD as US dollars (for the wire, which shows dollars).
pub fn usd(nano_usd: u64) -> f64 {
    nano_usd as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, cached: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            cached_input_tokens: cached,
            output_tokens: output,
            reasoning_tokens: output / 2,
        }
    }

    #[test]
    fn input_cached_and_output_tokens_each_cost_their_price() {
        let price = Price {
            input: 3.0,
            cached_input: Some(0.3),
            output: 15.0,
        };
        // 1M uncached input ($3) + 1M cached ($0.30) + 2M output ($30).
        let cost = price.cost_nano_usd(&usage(2_000_000, 1_000_000, 2_000_000));
        assert_eq!(cost, 33_300_000_000);
        assert_eq!(usd(cost), 33.3);
        // Without a cached price, cached input costs the input price.
        let plain = Price {
            cached_input: None,
            ..price
        };
        assert_eq!(plain.cost_nano_usd(&usage(1_000, 500, 0)), 3_000_000);
        // A usage reporting more cached than input tokens is read as all cached.
        assert_eq!(price.cost_nano_usd(&usage(10, 50, 0)), 3_000);
        assert_eq!(price.cost_nano_usd(&Usage::default()), 0);
    }

    #[test]
    fn a_model_without_a_price_has_no_cost_and_bad_prices_are_refused() {
        let table = BTreeMap::from([(
            "openai/gpt".to_owned(),
            Price {
                input: 1.0,
                cached_input: None,
                output: 2.0,
            },
        )]);
        let prices = Prices::new(table).expect("valid");
        assert_eq!(
            prices.cost_nano_usd("openai/gpt", &usage(1_000_000, 0, 0)),
            Some(1_000_000_000)
        );
        assert_eq!(prices.cost_nano_usd("openai/other", &usage(1, 0, 0)), None);
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let table = BTreeMap::from([(
                "m/x".to_owned(),
                Price {
                    output: bad,
                    ..Price::default()
                },
            )]);
            let err = Prices::new(table).expect_err("refused");
            assert!(err.starts_with("prices.\"m/x\": output = "), "{err}");
        }
    }
}
