//! The session's budget — and its owner's budget for the day — at a step
//! boundary: once what the session (the owner, today) spent before this
//! turn plus what the turn used so far reaches a limit, the
//! turn ends after the step that crossed it (its tool results stored, no
//! further model request), with a notice in history and outcome
//! `BudgetExceeded`. Admission refuses the session's next turn.

use super::emitter::Emitter;
use super::{Turn, TurnEnd};
use crate::events::{ErrorCode, TurnOutcome};
use crate::quota::QuotaExceeded;
use crate::types::{Budget, ContentBlock, NewMessage, Role, Spent};

impl Turn {
    /// What the turn's delegate sessions used and cost so far.
    pub(super) fn delegated(&self) -> Spent {
        *crate::runtime::lock(&self.delegated)
    }

    /// What is left of the session's budget, after what the turn (and its
    /// delegates) used so far: a delegate session's budget.
    pub(super) fn budget_left(&self) -> Budget {
        let budget = self.session.budget;
        if budget == Budget::NONE {
            return budget;
        }
        let cost = (self.inner.config.prices).cost_nano_usd(&self.record.model, &self.usage);
        let spent = self
            .session
            .spent
            .plus(&self.usage, cost)
            .add(&self.delegated());
        Budget {
            max_tokens: budget.max_tokens.map(|m| m.saturating_sub(spent.tokens())),
            max_cost_nano_usd: (budget.max_cost_nano_usd)
                .map(|m| m.saturating_sub(spent.cost_nano_usd)),
        }
    }

    /// The end of the turn when the session's budget (or its owner's for
    /// the day) is reached after step `index` (its notice stored); `None`
    /// while there is budget left.
    pub(super) async fn budget_end(
        &mut self,
        index: u32,
        emitter: &mut Emitter,
    ) -> Option<TurnEnd> {
        let prices = &self.inner.config.prices;
        let cost = prices.cost_nano_usd(&self.record.model, &self.usage);
        let spent = self
            .session
            .spent
            .plus(&self.usage, cost)
            .add(&self.delegated());
        let reached = match self.session.budget.reached(&spent) {
            Some((limit, value)) => QuotaExceeded::budget(limit, value),
            None => {
                let daily = self.daily.as_ref()?;
                // The turn's and its delegates' (their turns count for
                // the owner's day too, once they end).
                let delegated = self.delegated();
                let turn = crate::quota::DailySpent {
                    tokens: (self.usage.input_tokens)
                        .saturating_add(self.usage.output_tokens)
                        .saturating_add(delegated.tokens()),
                    cost_nano_usd: cost.unwrap_or(0).saturating_add(delegated.cost_nano_usd),
                };
                let today = daily.spent.plus(turn.tokens, turn.cost_nano_usd);
                daily
                    .limits
                    .daily_reached(today, std::time::SystemTime::now())?
            }
        };
        let message =
            format!("{reached}: the turn ended after step {index} without a final answer");
        let notice = NewMessage::new(
            &self.record.turn_id,
            Role::Notice,
            vec![ContentBlock::text(message.clone())],
        );
        // The outcome is the budget's whatever this write does.
        self.store(notice, emitter).await.ok();
        Some(TurnEnd {
            suspended: false,
            outcome: TurnOutcome::BudgetExceeded,
            error: Some((ErrorCode::ResourceExhausted, message)),
        })
    }
}
