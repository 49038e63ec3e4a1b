//! The `[quotas]` table: limits per principal (an API key's user, an mTLS
//! identity), enforced by the runtime core and the stores
//! (`agentrt_runtime::quota`).
//!
//! ```toml
//! [quotas]
//! enabled = true            # default true
//! admins_exempt = true      # default true
//! sessions = 10000          # sessions stored per user
//! stored_bytes = 1073741824 # bytes of user messages stored per user (1 GiB)
//! live_turns = 32           # turns running at once per user
//! turns_per_minute = 600    # turns begun per calendar minute per user
//! detached_tasks = 16       # A2A tasks running with no caller, per user
//! daily_tokens = 5000000    # tokens (input + output) per user per UTC day; default none
//! daily_cost = 20.0         # US dollars per user per UTC day, by [prices]; default none
//!
//! [quotas.users.alice]      # an override: unset fields keep the values above
//! sessions = 50000          # 0 is no limit
//!
//! [quotas.restricted]       # restricted keys and identities (`restricted = true`),
//! sessions = 100            # instead of everything above; unset fields keep
//! stored_bytes = 16777216   # these defaults (16 MiB), 0 is no limit
//! live_turns = 2
//! turns_per_minute = 10
//! detached_tasks = 1
//! daily_tokens = 200000     # a daily budget by default
//! daily_cost = 1.0          # default none
//! queued_per_session = 4    # a restricted Chat finds at most 3 queued before it
//! ```
//!
//! The defaults are on and generous: far above what one person or one
//! service account uses, low enough that one key cannot fill the disk or
//! take every turn slot of a shared server. A server without credentials
//! serves the single local user, an admin, who is exempt — so a fresh
//! loopback install sees no limit at all.

use std::collections::BTreeMap;

use agentrt_runtime::quota::{QuotaLimits, QuotaPolicy};
use serde::Deserialize;

/// Default `sessions`.
const DEFAULT_SESSIONS: u64 = 10_000;
/// Default `stored_bytes` (1 GiB).
const DEFAULT_STORED_BYTES: u64 = 1 << 30;
/// Default `live_turns`.
const DEFAULT_LIVE_TURNS: u64 = 32;
/// Default `turns_per_minute`.
const DEFAULT_TURNS_PER_MINUTE: u64 = 600;
/// Default `detached_tasks`.
const DEFAULT_DETACHED_TASKS: u64 = 16;

/// Restricted principals' defaults (`[quotas.restricted]`): low enough
/// that a guest key cannot hold much of a shared server.
const RESTRICTED_SESSIONS: u64 = 100;
/// 16 MiB.
const RESTRICTED_STORED_BYTES: u64 = 16 << 20;
const RESTRICTED_LIVE_TURNS: u64 = 2;
const RESTRICTED_TURNS_PER_MINUTE: u64 = 10;
const RESTRICTED_DETACHED_TASKS: u64 = 1;
const RESTRICTED_DAILY_TOKENS: u64 = 200_000;
const RESTRICTED_QUEUED: u64 = 4;

/// One set of limits as written; unset fields take the table's (or the
/// built-in) value, 0 is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// Sessions stored.
    pub sessions: Option<u64>,
    /// Bytes of user messages stored.
    pub stored_bytes: Option<u64>,
    /// Turns running at once.
    pub live_turns: Option<u64>,
    /// Turns begun per calendar minute.
    pub turns_per_minute: Option<u64>,
    /// A2A tasks running with no caller attached.
    pub detached_tasks: Option<u64>,
    /// Tokens (input plus output) per UTC day.
    pub daily_tokens: Option<u64>,
    /// Cost per UTC day, written in US dollars, kept in nano-USD.
    #[serde(default, deserialize_with = "usd")]
    pub daily_cost: Option<u64>,
}

/// A cost in US dollars (a number ≥ 0) as nano-USD.
fn usd<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let Some(dollars) = Option::<f64>::deserialize(d)? else {
        return Ok(None);
    };
    if !dollars.is_finite() || !(0.0..=1e9).contains(&dollars) {
        return Err(serde::de::Error::custom(format!(
            "{dollars} is not a cost in US dollars (a number from 0 to 1e9)"
        )));
    }
    // In range: at most 1e18 nano-USD.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some((dollars * 1e9).round() as u64))
}

/// The `[quotas]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSettings {
    /// `false` turns every quota off. Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Admin principals have no limits unless `users` names them. Default
    /// true.
    #[serde(default = "yes")]
    pub admins_exempt: bool,
    /// Every user's sessions stored. Default 10,000.
    pub sessions: Option<u64>,
    /// Every user's bytes of user messages stored. Default 1 GiB.
    pub stored_bytes: Option<u64>,
    /// Every user's turns running at once. Default 32.
    pub live_turns: Option<u64>,
    /// Every user's turns begun per calendar minute. Default 600.
    pub turns_per_minute: Option<u64>,
    /// Every user's A2A tasks running with no caller attached. Default 16.
    pub detached_tasks: Option<u64>,
    /// Every user's tokens (input plus output) per UTC day. Default none.
    pub daily_tokens: Option<u64>,
    /// Every user's cost per UTC day, in US dollars (kept in nano-USD).
    /// Default none.
    #[serde(default, deserialize_with = "usd")]
    pub daily_cost: Option<u64>,
    /// Overrides per user id (as authenticated).
    #[serde(default)]
    pub users: BTreeMap<String, LimitSettings>,
    /// The limits of restricted principals, applied instead of the ones
    /// above (never exempt, whatever `users` says of their user).
    #[serde(default)]
    pub restricted: RestrictedSettings,
}

/// `[quotas.restricted]`: the limits of restricted principals. Unset
/// fields take the restricted defaults (not the `[quotas]` values), 0 is
/// no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestrictedSettings {
    /// Sessions stored. Default 100.
    pub sessions: Option<u64>,
    /// Bytes of user messages stored. Default 16 MiB.
    pub stored_bytes: Option<u64>,
    /// Turns running at once. Default 2.
    pub live_turns: Option<u64>,
    /// Turns begun per calendar minute. Default 10.
    pub turns_per_minute: Option<u64>,
    /// A2A tasks running with no caller attached. Default 1.
    pub detached_tasks: Option<u64>,
    /// Tokens (input plus output) per UTC day. Default 200,000.
    pub daily_tokens: Option<u64>,
    /// Cost per UTC day, in US dollars (kept in nano-USD). Default none.
    #[serde(default, deserialize_with = "usd")]
    pub daily_cost: Option<u64>,
    /// Most messages a restricted principal's Chat may find queued in a
    /// session's inbox and still be queued (within the server's
    /// `max_queued_per_session`). Default 4.
    pub queued_per_session: Option<u64>,
}

fn yes() -> bool {
    true
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            admins_exempt: true,
            sessions: None,
            stored_bytes: None,
            live_turns: None,
            turns_per_minute: None,
            detached_tasks: None,
            daily_tokens: None,
            daily_cost: None,
            users: BTreeMap::new(),
            restricted: RestrictedSettings::default(),
        }
    }
}

/// `Some(value)` unless it is 0 (no limit).
fn limit(value: u64) -> Option<u64> {
    (value != 0).then_some(value)
}

impl LimitSettings {
    /// These settings over `base`.
    fn over(&self, base: &QuotaLimits) -> QuotaLimits {
        let pick = |own: Option<u64>, base: Option<u64>| own.map_or(base, limit);
        QuotaLimits {
            sessions: pick(self.sessions, base.sessions),
            stored_bytes: pick(self.stored_bytes, base.stored_bytes),
            live_turns: pick(self.live_turns, base.live_turns),
            turns_per_minute: pick(self.turns_per_minute, base.turns_per_minute),
            detached_tasks: pick(self.detached_tasks, base.detached_tasks),
            daily_tokens: pick(self.daily_tokens, base.daily_tokens),
            daily_cost_nano_usd: pick(self.daily_cost, base.daily_cost_nano_usd),
        }
    }
}

impl QuotaSettings {
    /// The runtime's policy.
    pub fn to_policy(&self) -> QuotaPolicy {
        if !self.enabled {
            return QuotaPolicy::default();
        }
        let builtin = QuotaLimits {
            sessions: Some(DEFAULT_SESSIONS),
            stored_bytes: Some(DEFAULT_STORED_BYTES),
            live_turns: Some(DEFAULT_LIVE_TURNS),
            turns_per_minute: Some(DEFAULT_TURNS_PER_MINUTE),
            detached_tasks: Some(DEFAULT_DETACHED_TASKS),
            daily_tokens: None,
            daily_cost_nano_usd: None,
        };
        let own = LimitSettings {
            sessions: self.sessions,
            stored_bytes: self.stored_bytes,
            live_turns: self.live_turns,
            turns_per_minute: self.turns_per_minute,
            detached_tasks: self.detached_tasks,
            daily_tokens: self.daily_tokens,
            daily_cost: self.daily_cost,
        };
        let default = own.over(&builtin);
        QuotaPolicy {
            default,
            users: self
                .users
                .iter()
                .map(|(user, limits)| (user.clone(), limits.over(&default)))
                .collect(),
            admins_exempt: self.admins_exempt,
            restricted: self.restricted.limits(),
            restricted_queued: self
                .restricted
                .queued_per_session
                .map_or(Some(RESTRICTED_QUEUED), limit),
        }
    }
}

impl RestrictedSettings {
    /// These settings over the restricted defaults.
    fn limits(&self) -> QuotaLimits {
        let builtin = QuotaLimits {
            sessions: Some(RESTRICTED_SESSIONS),
            stored_bytes: Some(RESTRICTED_STORED_BYTES),
            live_turns: Some(RESTRICTED_LIVE_TURNS),
            turns_per_minute: Some(RESTRICTED_TURNS_PER_MINUTE),
            detached_tasks: Some(RESTRICTED_DETACHED_TASKS),
            daily_tokens: Some(RESTRICTED_DAILY_TOKENS),
            daily_cost_nano_usd: None,
        };
        LimitSettings {
            sessions: self.sessions,
            stored_bytes: self.stored_bytes,
            live_turns: self.live_turns,
            turns_per_minute: self.turns_per_minute,
            detached_tasks: self.detached_tasks,
            daily_tokens: self.daily_tokens,
            daily_cost: self.daily_cost,
        }
        .over(&builtin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> QuotaSettings {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            quotas: QuotaSettings,
        }
        toml::from_str::<File>(text).expect("parses").quotas
    }

    #[test]
    fn defaults_are_on_and_generous() {
        let policy = parse("").to_policy();
        assert_eq!(policy.default.sessions, Some(DEFAULT_SESSIONS));
        assert_eq!(policy.default.live_turns, Some(DEFAULT_LIVE_TURNS));
        assert!(policy.admins_exempt);
    }

    #[test]
    fn overrides_inherit_and_zero_is_no_limit() {
        let settings = parse(
            "[quotas]\nsessions = 5\nadmins_exempt = false\n\
             [quotas.users.alice]\nlive_turns = 0\nturns_per_minute = 7\n",
        );
        let policy = settings.to_policy();
        assert_eq!(policy.default.sessions, Some(5));
        assert!(!policy.admins_exempt);
        let alice = policy.users["alice"];
        assert_eq!(alice.sessions, Some(5));
        assert_eq!(alice.live_turns, None);
        assert_eq!(alice.turns_per_minute, Some(7));
        assert_eq!(alice.stored_bytes, Some(DEFAULT_STORED_BYTES));
    }

    #[test]
    fn daily_budgets_are_off_by_default_and_cost_is_written_in_dollars() {
        assert!(!parse("").to_policy().default.limits_days());
        let policy = parse(
            "[quotas]\ndaily_tokens = 1000\ndaily_cost = 2.5\n\
             [quotas.users.batch]\ndaily_cost = 0\n",
        )
        .to_policy();
        assert_eq!(policy.default.daily_tokens, Some(1000));
        assert_eq!(policy.default.daily_cost_nano_usd, Some(2_500_000_000));
        assert_eq!(policy.users["batch"].daily_cost_nano_usd, None);
        assert_eq!(policy.users["batch"].daily_tokens, Some(1000));
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct File {
            quotas: QuotaSettings,
        }
        let err = toml::from_str::<File>("[quotas]\ndaily_cost = -1.0\n").unwrap_err();
        assert!(err.to_string().contains("US dollars"), "{err}");
    }

    #[test]
    fn restricted_limits_have_their_own_tighter_defaults() {
        let policy = parse("[quotas]\nlive_turns = 100\n").to_policy();
        assert_eq!(policy.restricted.live_turns, Some(RESTRICTED_LIVE_TURNS));
        assert_eq!(policy.restricted.sessions, Some(RESTRICTED_SESSIONS));
        assert_eq!(
            policy.restricted.daily_tokens,
            Some(RESTRICTED_DAILY_TOKENS)
        );
        assert_eq!(policy.restricted_queued, Some(RESTRICTED_QUEUED));
        assert!(policy.restricted.live_turns < policy.default.live_turns);
        let policy = parse(
            "[quotas.restricted]\nlive_turns = 1\ndaily_tokens = 0\ndaily_cost = 0.5\n\
             queued_per_session = 0\n",
        )
        .to_policy();
        assert_eq!(policy.restricted.live_turns, Some(1));
        assert_eq!(policy.restricted.daily_tokens, None);
        assert_eq!(policy.restricted.daily_cost_nano_usd, Some(500_000_000));
        assert_eq!(policy.restricted_queued, None);
        assert_eq!(
            parse("[quotas]\nenabled = false\n").to_policy().restricted,
            QuotaLimits::NONE
        );
    }

    #[test]
    fn disabled_is_no_limit_and_unknown_keys_are_refused() {
        assert_eq!(
            parse("[quotas]\nenabled = false\nsessions = 1\n")
                .to_policy()
                .default,
            QuotaLimits::NONE
        );
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct File {
            quotas: QuotaSettings,
        }
        assert!(toml::from_str::<File>("[quotas]\nsesions = 1\n").is_err());
    }
}
