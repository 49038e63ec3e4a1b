//! How a model step ended ([`StepEnd`]) — shared by the step, the
//! pre-started first request and the hooks, so none of them needs another.

use crate::events::ErrorCode;
use crate::hooks::HookStop;
use crate::model::ModelError;
use crate::types::{CancelReason, StopReason};

/// How the model step ended.
pub(crate) enum StepEnd {
    Finished(StopReason),
    Failed(ModelError),
    Cancelled(CancelReason),
    TimedOut,
    /// An operator hook ended the turn (see `hooks`).
    Hook(HookStop),
}

/// The in-stream error of a turn a hook ended.
pub(super) fn stop_error(stop: &HookStop) -> (ErrorCode, String) {
    let code = match stop {
        HookStop::Refused { .. } => ErrorCode::PermissionDenied,
        HookStop::Failed { .. } => ErrorCode::Unavailable,
    };
    (code, stop.to_string())
}
