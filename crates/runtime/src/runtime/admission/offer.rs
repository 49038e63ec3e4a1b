//! What a turn is offered at admission: the tools the model sees, and
//! whether the runner's model can take the turn (tool support, output
//! bound, the provider's queue).

use crate::error::{FieldViolation, RuntimeError};
use crate::model::{Reservation, ToolSpec};
use crate::runtime::runners::Runner;

/// The tools offered to the model for one call: the runner's server tools
/// and the caller's, minus the excluded names. A caller tool may not take
/// a server tool's name.
pub(super) fn offered(
    runner: &Runner,
    extra: Vec<ToolSpec>,
    excluded: &[String],
) -> Result<Vec<ToolSpec>, RuntimeError> {
    let violations: Vec<_> = extra
        .iter()
        .enumerate()
        .filter(|(_, t)| runner.tools.iter().any(|s| s.name == t.name))
        .map(|(i, t)| {
            FieldViolation::new(
                format!("extra_tools[{i}].name"),
                format!("{:?} is the name of a server tool", t.name),
            )
        })
        .collect();
    if !violations.is_empty() {
        return Err(RuntimeError::InvalidArgument(violations));
    }
    let all = runner.tools.iter().cloned().chain(extra).collect();
    Ok(crate::runtime::caller_tools::offered(all, excluded))
}

/// Whether the runner's model can take this turn: a model that cannot call
/// tools is not offered any (the caller learns why instead of the model
/// silently ignoring them), `max_output_tokens` is within the provider's
/// maximum, and a provider whose queue is full refuses the turn now rather
/// than admitting it into a long wait. The capacity it reserves for the
/// first step (if the provider bounds its queue) is returned, to go with
/// the first request; dropping it gives it back.
pub(super) fn admit_model(
    runner: &Runner,
    offered: &[ToolSpec],
    max_output_tokens: Option<u32>,
) -> Result<Option<Reservation>, RuntimeError> {
    if !offered.is_empty()
        && !runner
            .model
            .provider
            .supports_tools(&runner.model.provider_model)
    {
        let field = if runner.tools.is_empty() {
            "extra_tools"
        } else {
            "model"
        };
        return Err(RuntimeError::invalid(
            field,
            format!(
                "model {} cannot call tools, and this turn offers {} tool(s); remove extra_tools \
                 (or exclude the server tools with excluded_tools), choose a model that can call \
                 tools, or let the operator allow running it without tools",
                runner.key.model,
                offered.len()
            ),
        ));
    }
    if let Some(asked) = max_output_tokens {
        let limit = runner
            .model
            .provider
            .max_output_tokens_limit(&runner.model.provider_model);
        if asked == 0 {
            return Err(RuntimeError::invalid(
                "max_output_tokens",
                "must be at least 1 (leave it unset for the model's default)",
            ));
        }
        if let Some(limit) = limit.filter(|limit| asked > *limit) {
            return Err(RuntimeError::invalid(
                "max_output_tokens",
                format!(
                    "{asked} is more than the maximum of {limit} for model {}",
                    runner.key.model
                ),
            ));
        }
    }
    runner
        .model
        .provider
        .reserve(&runner.model.provider_model)
        .map_err(|_| {
            RuntimeError::ResourceExhausted(
                "the model is busy: too many turns are queued for it; retry later",
            )
        })
}
