//! Quotas per principal: how much one user may hold and run at once.
//!
//! Seven quotas, each named as the gRPC adapter reports it (a
//! `google.rpc.QuotaFailure` violation's subject):
//!
//! - `sessions`: sessions stored for the user;
//! - `stored_bytes`: bytes of the user messages stored in the user's
//!   sessions (what callers make the server store; an answer is bounded
//!   per turn by the model's output limit and is not counted);
//! - `live_turns`: turns running at once for the user;
//! - `turns_per_minute`: turns admitted per calendar minute (a fixed
//!   window; the refusal says when the next minute starts);
//! - `detached_tasks`: A2A tasks running with no caller attached (the
//!   A2A adapter enforces it; the core only names it);
//! - `daily_tokens`, `daily_cost`: what the user's turns may use (input
//!   plus output tokens) and cost per UTC day, summed over their ended
//!   turns by the store; a turn that crosses it ends after its step
//!   (`BUDGET_EXCEEDED`), the next Chat is refused until midnight UTC.
//!
//! The counts live where the data does: a store counts sessions and
//! stored bytes in the transaction that writes them (PostgreSQL under a
//! per-owner lock, so every replica sees one count); live turns and the
//! minute's turns are counted in the database on a shared store and in the
//! process on a store only this process writes. A refused call stores
//! nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::types::Principal;

/// One of the quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    /// Sessions stored.
    Sessions,
    /// Bytes of user messages stored.
    StoredBytes,
    /// Turns running at once.
    LiveTurns,
    /// Turns admitted per calendar minute.
    TurnsPerMinute,
    /// A2A tasks running with no caller attached.
    DetachedTasks,
    /// A session's budget of tokens (its limit in tokens).
    SessionBudgetTokens,
    /// A session's budget of cost (its limit in micro-USD).
    SessionBudgetCost,
    /// Messages queued in one session's inbox.
    Inbox,
    /// Tokens the user's turns may use per UTC day.
    DailyTokens,
    /// Cost the user's turns may run up per UTC day (its limit in
    /// micro-USD).
    DailyCost,
    /// Bytes of blobs (images, files, uploads in progress) the user holds.
    BlobBytes,
}

impl Quota {
    /// The quota's name, as the configuration and the error detail spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sessions => "sessions",
            Self::StoredBytes => "stored_bytes",
            Self::LiveTurns => "live_turns",
            Self::TurnsPerMinute => "turns_per_minute",
            Self::DetachedTasks => "detached_tasks",
            Self::SessionBudgetTokens => "session_budget_tokens",
            Self::SessionBudgetCost => "session_budget_cost",
            Self::Inbox => "inbox",
            Self::DailyTokens => "daily_tokens",
            Self::DailyCost => "daily_cost",
            Self::BlobBytes => "blob_bytes",
        }
    }
}

/// A refusal: which quota, its limit, and when retrying may help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// The quota that is full.
    pub quota: Quota,
    /// Its limit for this principal.
    pub limit: u64,
    /// How long to wait before a retry may succeed; `None` when waiting
    /// alone does not help (something must be deleted first).
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let limit = self.limit;
        match self.quota {
            Quota::SessionBudgetTokens => {
                write!(f, "the session's budget of {limit} tokens is spent")
            }
            Quota::SessionBudgetCost => write!(
                f,
                "the session's budget of ${}.{:06} is spent",
                limit / 1_000_000,
                limit % 1_000_000
            ),
            Quota::Inbox => write!(
                f,
                "the session's inbox holds {limit} queued messages already"
            ),
            Quota::DailyTokens => write!(
                f,
                "the user's budget of {limit} tokens for today (UTC) is spent"
            ),
            Quota::DailyCost => write!(
                f,
                "the user's budget of ${}.{:06} for today (UTC) is spent",
                limit / 1_000_000,
                limit % 1_000_000
            ),
            Quota::BlobBytes => write!(
                f,
                "the user's storage for images and files ({limit} bytes) is full"
            ),
            Quota::Sessions
            | Quota::StoredBytes
            | Quota::LiveTurns
            | Quota::TurnsPerMinute
            | Quota::DetachedTasks => {
                write!(f, "quota {} exceeded (limit {limit})", self.quota.name())
            }
        }
    }
}

impl QuotaExceeded {
    /// The refusal of more blobs for a user holding `limit` bytes of them
    /// (or close enough that what is added would pass it).
    pub fn blob_bytes(limit: u64) -> Self {
        Self {
            quota: Quota::BlobBytes,
            limit,
            retry_after: None,
        }
    }

    /// The refusal of a session whose budget `limit` is reached.
    pub fn budget(limit: crate::types::BudgetLimit, value: u64) -> Self {
        let (quota, limit) = match limit {
            crate::types::BudgetLimit::Tokens => (Quota::SessionBudgetTokens, value),
            // Micro-USD: QuotaFailure's value is an integer.
            crate::types::BudgetLimit::Cost => (Quota::SessionBudgetCost, value / 1_000),
        };
        Self {
            quota,
            limit,
            retry_after: None,
        }
    }
}

impl QuotaExceeded {
    /// The refusal of a user whose budget for today (`limit` of `quota`,
    /// `DailyTokens` or `DailyCost`; cost in nano-USD) is reached at
    /// `now`: retry at the next midnight UTC.
    pub fn daily(quota: Quota, limit: u64, now: SystemTime) -> Self {
        let limit = match quota {
            // Micro-USD: QuotaFailure's value is an integer.
            Quota::DailyCost => limit / 1_000,
            _ => limit,
        };
        Self {
            quota,
            limit,
            retry_after: Some(day_window(now).1),
        }
    }
}

/// The UTC day holding `now` (days since the epoch), and how long until
/// the next one starts.
pub fn day_window(now: SystemTime) -> (u64, Duration) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let day = since.as_secs() / 86_400;
    let next = Duration::from_secs((day + 1) * 86_400);
    (
        day,
        next.saturating_sub(since).max(Duration::from_millis(1)),
    )
}

/// What a user's ended turns used and cost on one UTC day
/// ([`crate::store::Store::daily_spent`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DailySpent {
    /// Input plus output tokens.
    pub tokens: u64,
    /// Cost in nano-USD.
    pub cost_nano_usd: u64,
}

impl DailySpent {
    /// `self` plus `tokens` and `cost_nano_usd`.
    pub fn plus(self, tokens: u64, cost_nano_usd: u64) -> Self {
        Self {
            tokens: self.tokens.saturating_add(tokens),
            cost_nano_usd: self.cost_nano_usd.saturating_add(cost_nano_usd),
        }
    }

    /// What `turn` adds (its usage and cost).
    pub fn of(turn: &crate::types::TurnRecord) -> Self {
        Self {
            tokens: turn
                .usage
                .input_tokens
                .saturating_add(turn.usage.output_tokens),
            cost_nano_usd: turn.cost_nano_usd.unwrap_or(0),
        }
    }
}

/// The hint given with a refusal of `live_turns`: a turn usually ends
/// within seconds.
pub const LIVE_TURNS_RETRY: Duration = Duration::from_secs(1);

/// One principal's limits; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Most sessions stored.
    pub sessions: Option<u64>,
    /// Most bytes of user messages stored.
    pub stored_bytes: Option<u64>,
    /// Most turns running at once.
    pub live_turns: Option<u64>,
    /// Most turns admitted per calendar minute.
    pub turns_per_minute: Option<u64>,
    /// Most A2A tasks running with no caller attached.
    pub detached_tasks: Option<u64>,
    /// Most tokens (input plus output) per UTC day.
    pub daily_tokens: Option<u64>,
    /// Most cost per UTC day, in nano-USD.
    pub daily_cost_nano_usd: Option<u64>,
}

impl QuotaLimits {
    /// No limit at all.
    pub const NONE: Self = Self {
        sessions: None,
        stored_bytes: None,
        live_turns: None,
        turns_per_minute: None,
        detached_tasks: None,
        daily_tokens: None,
        daily_cost_nano_usd: None,
    };

    /// Whether a daily budget is set.
    pub fn limits_days(&self) -> bool {
        self.daily_tokens.is_some() || self.daily_cost_nano_usd.is_some()
    }

    /// The first daily limit `spent` reached, as the refusal at `now`.
    pub fn daily_reached(&self, spent: DailySpent, now: SystemTime) -> Option<QuotaExceeded> {
        if let Some(max) = self.daily_tokens
            && spent.tokens >= max
        {
            return Some(QuotaExceeded::daily(Quota::DailyTokens, max, now));
        }
        match self.daily_cost_nano_usd {
            Some(max) if spent.cost_nano_usd >= max => {
                Some(QuotaExceeded::daily(Quota::DailyCost, max, now))
            }
            Some(_) | None => None,
        }
    }

    /// Whether any limit a store checks at `begin_turn` is set.
    pub fn limits_turns(&self) -> bool {
        self.stored_bytes.is_some() || self.live_turns.is_some() || self.turns_per_minute.is_some()
    }

    /// The refusal when `used + adding` would pass `limit` of `quota`.
    pub fn check(
        quota: Quota,
        limit: Option<u64>,
        used: u64,
        adding: u64,
    ) -> Result<(), QuotaExceeded> {
        match limit {
            Some(limit) if used.saturating_add(adding) > limit => Err(QuotaExceeded {
                quota,
                limit,
                retry_after: (quota == Quota::LiveTurns).then_some(LIVE_TURNS_RETRY),
            }),
            _ => Ok(()),
        }
    }
}

/// Who gets which limits: a default for every user, overrides per user id,
/// whether admins are exempt, and the limits of restricted principals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaPolicy {
    /// Limits of a user without an override.
    pub default: QuotaLimits,
    /// Complete limits of named users (ids as authenticated).
    pub users: HashMap<String, QuotaLimits>,
    /// Admin principals have no limits (unless they have an override).
    pub admins_exempt: bool,
    /// Limits of restricted principals, instead of `default` and `users`:
    /// a restricted key of a user with an override still gets these.
    pub restricted: QuotaLimits,
    /// Most messages a restricted principal's Chat may find queued in the
    /// session's inbox and still be queued (`None`: the server's
    /// `max_queued_per_session` alone).
    pub restricted_queued: Option<u64>,
}

impl Default for QuotaPolicy {
    /// No limits for anyone.
    fn default() -> Self {
        Self {
            default: QuotaLimits::NONE,
            users: HashMap::new(),
            admins_exempt: true,
            restricted: QuotaLimits::NONE,
            restricted_queued: None,
        }
    }
}

impl QuotaPolicy {
    /// The limits that apply to `who`.
    pub fn limits_for(&self, who: &Principal) -> QuotaLimits {
        if who.restricted {
            return self.restricted;
        }
        if let Some(limits) = self.users.get(&who.user_id) {
            return *limits;
        }
        if who.admin && self.admins_exempt {
            return QuotaLimits::NONE;
        }
        self.default
    }
}

/// The limits a store checks in one write, for the session's owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteQuota {
    /// The owner's limits.
    pub limits: QuotaLimits,
    /// Whether the store counts live turns and the minute's turns itself
    /// (a shared store); otherwise the runtime counts them in the process.
    pub count_turns: bool,
}

/// The start of the calendar minute holding `now`, and how long until the
/// next one starts.
pub fn minute_window(now: SystemTime) -> (u64, Duration) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let minute = since.as_secs() / 60;
    let next = Duration::from_secs((minute + 1) * 60);
    (
        minute,
        next.saturating_sub(since).max(Duration::from_millis(1)),
    )
}

/// Live turns and the minute's turns per owner, counted in this process
/// (for a store only this process writes).
#[derive(Debug, Default)]
pub(crate) struct TurnMeter {
    owners: Mutex<HashMap<String, OwnerTurns>>,
}

#[derive(Debug, Default)]
struct OwnerTurns {
    live: u64,
    minute: u64,
    in_minute: u64,
}

impl TurnMeter {
    /// Counts one more live turn and one more turn this minute for
    /// `owner`, or refuses. The turn stays counted live until the guard
    /// drops; [`LiveTurnGuard::refund`] also takes back the minute's count
    /// (the turn was not admitted after all).
    pub(crate) fn admit(
        self: &Arc<Self>,
        owner: &str,
        limits: &QuotaLimits,
        now: SystemTime,
    ) -> Result<Option<LiveTurnGuard>, QuotaExceeded> {
        if limits.live_turns.is_none() && limits.turns_per_minute.is_none() {
            return Ok(None);
        }
        let (minute, until_next) = minute_window(now);
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = owners.entry(owner.to_owned()).or_default();
        if entry.minute != minute {
            entry.minute = minute;
            entry.in_minute = 0;
        }
        let refused = QuotaLimits::check(Quota::LiveTurns, limits.live_turns, entry.live, 1)
            .and_then(|()| {
                QuotaLimits::check(
                    Quota::TurnsPerMinute,
                    limits.turns_per_minute,
                    entry.in_minute,
                    1,
                )
                .map_err(|e| QuotaExceeded {
                    retry_after: Some(until_next),
                    ..e
                })
            });
        if let Err(e) = refused {
            if entry.live == 0 && entry.in_minute == 0 {
                owners.remove(owner);
            }
            return Err(e);
        }
        entry.live += 1;
        entry.in_minute += 1;
        Ok(Some(LiveTurnGuard {
            meter: Arc::clone(self),
            owner: owner.to_owned(),
            minute,
            refund: false,
        }))
    }

    /// How many turns `owner` has live in this process.
    #[cfg(test)]
    pub(crate) fn live(&self, owner: &str) -> u64 {
        let owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        owners.get(owner).map_or(0, |o| o.live)
    }
}

/// One live turn counted by a [`TurnMeter`]; dropping it ends the count.
#[derive(Debug)]
pub(crate) struct LiveTurnGuard {
    meter: Arc<TurnMeter>,
    owner: String,
    minute: u64,
    refund: bool,
}

impl LiveTurnGuard {
    /// Drops the guard and takes back its turn of the minute too: the turn
    /// was refused after all.
    pub(crate) fn refund(mut self) {
        self.refund = true;
    }
}

impl Drop for LiveTurnGuard {
    fn drop(&mut self) {
        let mut owners = self
            .meter
            .owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = owners.get_mut(&self.owner) {
            entry.live = entry.live.saturating_sub(1);
            if self.refund && entry.minute == self.minute {
                entry.in_minute = entry.in_minute.saturating_sub(1);
            }
            if entry.live == 0 && entry.in_minute == 0 {
                owners.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricted_principals_get_the_restricted_limits_whatever_their_user() {
        let tight = QuotaLimits {
            live_turns: Some(1),
            ..QuotaLimits::NONE
        };
        let mut policy = QuotaPolicy {
            default: QuotaLimits {
                live_turns: Some(10),
                ..QuotaLimits::NONE
            },
            restricted: tight,
            ..QuotaPolicy::default()
        };
        policy.users.insert("u".into(), QuotaLimits::NONE);
        let guest = Principal {
            restricted: true,
            ..user(false)
        };
        assert_eq!(policy.limits_for(&guest), tight);
        assert_eq!(policy.limits_for(&user(false)), QuotaLimits::NONE);
    }

    fn user(admin: bool) -> Principal {
        Principal::new("u", admin, crate::types::ActorKind::ApiKey)
    }

    #[test]
    fn admins_are_exempt_unless_configured() {
        let mut policy = QuotaPolicy {
            default: QuotaLimits {
                sessions: Some(1),
                ..QuotaLimits::NONE
            },
            ..QuotaPolicy::default()
        };
        assert_eq!(policy.limits_for(&user(false)).sessions, Some(1));
        assert_eq!(policy.limits_for(&user(true)), QuotaLimits::NONE);
        policy.admins_exempt = false;
        assert_eq!(policy.limits_for(&user(true)).sessions, Some(1));
        policy.users.insert("u".into(), QuotaLimits::NONE);
        assert_eq!(policy.limits_for(&user(false)), QuotaLimits::NONE);
    }

    #[test]
    fn meter_counts_live_turns_and_the_minute() {
        let meter = Arc::new(TurnMeter::default());
        let limits = QuotaLimits {
            live_turns: Some(1),
            turns_per_minute: Some(2),
            ..QuotaLimits::NONE
        };
        let now = UNIX_EPOCH + Duration::from_secs(600 + 50);
        let first = meter.admit("a", &limits, now).unwrap().unwrap();
        let busy = meter.admit("a", &limits, now).unwrap_err();
        assert_eq!(busy.quota, Quota::LiveTurns);
        assert_eq!(busy.retry_after, Some(LIVE_TURNS_RETRY));
        assert!(meter.admit("b", &limits, now).unwrap().is_some());
        drop(first);
        assert_eq!(meter.live("a"), 0);
        let second = meter.admit("a", &limits, now).unwrap().unwrap();
        drop(second);
        let rate = meter.admit("a", &limits, now).unwrap_err();
        assert_eq!(rate.quota, Quota::TurnsPerMinute);
        assert_eq!(rate.limit, 2);
        assert_eq!(rate.retry_after, Some(Duration::from_secs(10)));
        // A refunded turn gives its place in the minute back.
        let later = UNIX_EPOCH + Duration::from_secs(660 + 5);
        let third = meter.admit("a", &limits, later).unwrap().unwrap();
        third.refund();
        for _ in 0..2 {
            assert!(meter.admit("a", &limits, later).unwrap().is_some());
        }
    }
}
