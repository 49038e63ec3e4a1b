//! The one place where core errors become gRPC statuses. Every match here is
//! exhaustive with no catch-all arm: a new error variant must force a
//! decision about its status code.
//!
//! The lint below holds that rule: clippy refuses a `_ =>` arm over an
//! enum in this module (the workspace allows one elsewhere).

#![deny(clippy::wildcard_enum_match_arm)]

use agentrt_runtime::RuntimeError;
use agentrt_runtime::error::{FieldViolation, describe};
use agentrt_runtime::events::{ErrorCode, TurnOutcome};
use agentrt_runtime::hooks::HookStop;
use agentrt_runtime::quota::{Quota, QuotaExceeded};
use agentrt_runtime::store::StoreError;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, QuotaViolation, StatusExt as _};

use crate::clip;

/// The `google.rpc.ErrorInfo` domain of our errors.
pub const DOMAIN: &str = "agentrt";
/// ErrorInfo reason of a busy session.
pub const SESSION_BUSY: &str = "SESSION_BUSY";
/// ErrorInfo reason of a turn an operator hook refused (metadata `hook`).
pub const HOOK_REFUSED: &str = "HOOK_REFUSED";
/// ErrorInfo reason of a turn refused because a fail-closed operator hook
/// did not answer in time (metadata `hook`).
pub const HOOK_UNAVAILABLE: &str = "HOOK_UNAVAILABLE";

/// Maps a core error to the status the contract names, its message within
/// [`clip::MAX_MESSAGE_WIRE_BYTES`] whatever the error echoes.
pub fn from_runtime(err: RuntimeError) -> Status {
    clip::status(status_of(err))
}

fn status_of(err: RuntimeError) -> Status {
    match err {
        RuntimeError::SessionNotFound => Status::not_found("session not found"),
        RuntimeError::SessionBusy { turn_id } => Status::with_error_details(
            Code::Aborted,
            "the session already has a live turn; wait for it to finish, watch it with Subscribe, or stop it",
            ErrorDetails::with_error_info(
                SESSION_BUSY,
                DOMAIN,
                [("turn_id".to_owned(), clip::id(&turn_id).into_owned())],
            ),
        ),
        RuntimeError::SessionCompacting => Status::with_error_details(
            Code::Aborted,
            "the session is being compacted; retry when the compaction has finished",
            ErrorDetails::with_error_info(
                SESSION_BUSY,
                DOMAIN,
                [("compacting".to_owned(), "true".to_owned())],
            ),
        ),
        RuntimeError::CompactionFailed(why) => {
            Status::unavailable(format!("{why}; the session was left unchanged"))
        }
        RuntimeError::SessionArchived => Status::failed_precondition(
            "the session is archived; unarchive it (set archived to false) to start new turns",
        ),
        RuntimeError::SessionExists => {
            Status::already_exists("a session with this id already exists")
        }
        RuntimeError::InvalidArgument(violations) => invalid_argument(violations),
        RuntimeError::Unavailable(why) => Status::unavailable(why),
        RuntimeError::PermissionDenied(why) => Status::permission_denied(why),
        RuntimeError::FailedPrecondition(why) => Status::failed_precondition(why),
        RuntimeError::AlreadyExists(why) => Status::already_exists(why),
        RuntimeError::ResourceExhausted(why) => Status::resource_exhausted(why),
        // Reached only on a replica that cannot forward (no `[cluster]`
        // table): one with it forwards every call the core answers with
        // `Elsewhere`, and reports an unreachable owner itself.
        RuntimeError::Elsewhere(lease) => Status::unavailable(format!(
            "the session's live turn {} runs on replica {}, which cannot be reached from here \
             (this replica has no [cluster] table to forward the call); retry when the turn \
             has ended, or send the call to that replica",
            clip::id(&lease.turn_id),
            clip::id(&lease.replica_id)
        )),
        RuntimeError::QuotaExceeded(quota) => quota_exceeded(&quota),
        RuntimeError::AgentNotFound => Status::not_found(
            "agent not found: no agent (or no such version of it) with this id; ListAgents lists them",
        ),
        RuntimeError::AgentPrompt(why) => Status::failed_precondition(format!(
            "the session's agent has a system prompt template that could not be rendered \
             ({why}); fix the agent with UpdateAgent (or the server's config)"
        )),
        RuntimeError::Hook(stop) => hook_stopped(stop),
        RuntimeError::Store(err) => from_store(err),
    }
}

/// A turn an operator hook stopped before it started: `PERMISSION_DENIED`
/// with the hook's reason when it refused, `UNAVAILABLE` when a fail-closed
/// hook did not answer; `ErrorInfo` names the hook either way.
fn hook_stopped(stop: HookStop) -> Status {
    let (code, reason, message, hook) = match stop {
        HookStop::Refused { hook, reason } => (
            Code::PermissionDenied,
            HOOK_REFUSED,
            format!("the turn was refused by the server's policy ({hook}): {reason}"),
            hook,
        ),
        HookStop::Failed { hook } => (
            Code::Unavailable,
            HOOK_UNAVAILABLE,
            format!(
                "the turn was not started: the server's policy check ({hook}) did not answer \
                 in time; nothing was stored — retry later"
            ),
            hook,
        ),
    };
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, DOMAIN, [("hook".to_owned(), hook)]),
    )
}

/// `RESOURCE_EXHAUSTED` with a `QuotaFailure` naming the quota (its
/// `subject` and `quota_id`) and its limit (`quota_value`), and a
/// `RetryInfo` when waiting helps.
pub fn quota_exceeded(quota: &QuotaExceeded) -> Status {
    let name = quota.quota.name();
    let mut details = ErrorDetails::with_quota_failure(vec![QuotaViolation {
        subject: name.to_owned(),
        description: match quota.quota {
            Quota::SessionBudgetTokens => format!("at most {} tokens in this session", quota.limit),
            Quota::SessionBudgetCost => {
                format!("at most {} micro-USD in this session", quota.limit)
            }
            Quota::Inbox => format!("at most {} queued messages per session", quota.limit),
            Quota::DailyTokens => format!("at most {} tokens per user per UTC day", quota.limit),
            Quota::DailyCost => {
                format!("at most {} micro-USD per user per UTC day", quota.limit)
            }
            Quota::BlobBytes => {
                format!("at most {} bytes of images and files per user", quota.limit)
            }
            Quota::Sessions
            | Quota::StoredBytes
            | Quota::LiveTurns
            | Quota::TurnsPerMinute
            | Quota::DetachedTasks => format!("at most {} {name} per user", quota.limit),
        },
        api_service: "agentrt".to_owned(),
        quota_metric: format!("agentrt/{name}"),
        quota_id: name.to_owned(),
        quota_value: i64::try_from(quota.limit).unwrap_or(i64::MAX),
        ..QuotaViolation::default()
    }]);
    if let Some(delay) = quota.retry_after {
        details.set_retry_info(Some(delay));
    }
    let hint = match quota.quota {
        Quota::Sessions | Quota::StoredBytes => "; delete sessions to make room",
        Quota::BlobBytes => "; delete sessions that hold images or files to make room",
        Quota::LiveTurns | Quota::DetachedTasks => "; retry when one has finished",
        Quota::TurnsPerMinute => "; retry after the delay this answer gives",
        Quota::SessionBudgetTokens | Quota::SessionBudgetCost => {
            "; raise the session's budget or start a new session"
        }
        Quota::Inbox => "; retry when the queued messages have run",
        Quota::DailyTokens | Quota::DailyCost => "; retry after midnight UTC",
    };
    Status::with_error_details(Code::ResourceExhausted, format!("{quota}{hint}"), details)
}

/// `INVALID_ARGUMENT` with a `BadRequest`: the first violations (each
/// clipped, within [`clip::MAX_VIOLATION_BYTES`]) and a count of the rest,
/// so the trailers stay a few KiB however many fields a request got wrong —
/// a client must see the error, not "metadata too large".
fn invalid_argument(violations: Vec<FieldViolation>) -> Status {
    let message = clip::message(describe(&violations));
    let mut details = ErrorDetails::new();
    for v in clip::violations(violations) {
        details.add_bad_request_violation(v.field, v.description);
    }
    Status::with_error_details(Code::InvalidArgument, message, details)
}

fn from_store(err: StoreError) -> Status {
    match err {
        StoreError::SessionNotFound => Status::not_found("session not found"),
        StoreError::Corrupt { .. } => {
            tracing::error!(error = %err, "corrupt record");
            Status::data_loss("a stored record is corrupt; the operator has been told")
        }
        StoreError::Backend(_) => {
            tracing::error!(error = %err, "store failure");
            Status::unavailable("the store is unavailable; retry later")
        }
        StoreError::DiskFull(_) => {
            tracing::error!(error = %err, "store disk full");
            Status::unavailable(
                "the server's disk is full: nothing was stored; retry once space is freed (or on \
                 another replica)",
            )
        }
        StoreError::Failed(_) => {
            tracing::error!(error = %err, "store failed");
            Status::unavailable(
                "the server's store failed a write (its disk is full or failing) and takes none \
                 until the server restarts; this call's data may or may not have been stored — \
                 retry with the same request_id once it is back",
            )
        }
        StoreError::Unavailable(_) => {
            tracing::warn!(error = %err, "store unreachable");
            Status::unavailable("the database cannot be reached; retry later")
        }
        StoreError::Busy(lease) => from_runtime(RuntimeError::SessionBusy {
            turn_id: lease.turn_id,
        }),
        StoreError::QuotaExceeded(quota) => quota_exceeded(&quota),
        StoreError::NotQueued { .. } => Status::failed_precondition(
            "the queued message is no longer in the inbox (it ran, failed or was cleared)",
        ),
        StoreError::Paused { turn_id } => from_runtime(RuntimeError::SessionBusy { turn_id }),
        StoreError::NotPaused { .. } => Status::failed_precondition(
            "the turn is no longer paused: it resumed elsewhere, or ended",
        ),
        StoreError::LeaseLost { .. } => {
            tracing::warn!(error = %err, "lease lost");
            Status::unavailable(
                "this replica lost the session's lease; retry (another replica takes over)",
            )
        }
    }
}

/// The gRPC code of an in-stream error code.
pub fn code_of(code: ErrorCode) -> Code {
    match code {
        ErrorCode::Cancelled => Code::Cancelled,
        ErrorCode::InvalidArgument => Code::InvalidArgument,
        ErrorCode::DeadlineExceeded => Code::DeadlineExceeded,
        ErrorCode::ResourceExhausted => Code::ResourceExhausted,
        ErrorCode::FailedPrecondition => Code::FailedPrecondition,
        ErrorCode::Internal => Code::Internal,
        ErrorCode::Unavailable => Code::Unavailable,
        ErrorCode::PermissionDenied => Code::PermissionDenied,
    }
}

/// The trailing status of a finished turn: `None` (OK) on success,
/// otherwise the outcome's code with the turn error's message.
pub fn trailing_status(outcome: TurnOutcome, error: Option<(ErrorCode, &str)>) -> Option<Status> {
    let status = match outcome {
        TurnOutcome::Success => None,
        TurnOutcome::Error => {
            let (code, message) = error.unwrap_or((ErrorCode::Internal, "the turn failed"));
            Some(Status::new(code_of(code), message))
        }
        TurnOutcome::Canceled => Some(Status::cancelled("the turn was cancelled")),
        TurnOutcome::TimedOut => Some(Status::deadline_exceeded(
            error.map_or("the turn reached its time limit", |(_, m)| m),
        )),
        TurnOutcome::BudgetExceeded => Some(Status::resource_exhausted(
            error.map_or("the session's budget was reached", |(_, m)| m),
        )),
    };
    status.map(clip::status)
}

/// The status a queued Chat ends with when its message did not run
/// (cleared from the inbox, or never admissible: the notice in history
/// says why).
pub fn not_run(code: ErrorCode, why: &str) -> Status {
    clip::status(Status::new(code_of(code), why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrt_runtime::limits;

    #[test]
    fn busy_is_aborted_with_session_busy_error_info() {
        let status = from_runtime(RuntimeError::SessionBusy {
            turn_id: "t1".into(),
        });
        assert_eq!(status.code(), Code::Aborted);
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, SESSION_BUSY);
        assert_eq!(info.domain, DOMAIN);
        assert_eq!(info.metadata.get("turn_id").map(String::as_str), Some("t1"));
    }

    #[test]
    fn invalid_argument_carries_field_violations() {
        let status = from_runtime(RuntimeError::invalid("content", "is empty"));
        assert_eq!(status.code(), Code::InvalidArgument);
        let bad = status.get_error_details().bad_request().cloned().unwrap();
        assert_eq!(bad.field_violations[0].field, "content");
    }

    #[test]
    fn many_violations_are_capped_and_clipped() {
        let violations = (0..100_000)
            .map(|i| FieldViolation {
                field: format!("content[{i}].image.mime_type"),
                description: format!("bad type {}\r\n", "x".repeat(10_000)),
            })
            .collect();
        let status = from_runtime(RuntimeError::InvalidArgument(violations));
        assert_eq!(status.code(), Code::InvalidArgument);
        let bad = status.get_error_details().bad_request().cloned().unwrap();
        let shown = bad.field_violations.len();
        assert!((2..=limits::MAX_VIOLATIONS + 1).contains(&shown), "{shown}");
        assert!(
            bad.field_violations[shown - 1]
                .description
                .contains(&format!("{} more", 100_000 - (shown - 1))),
            "{:?}",
            bad.field_violations[shown - 1]
        );
        assert!(
            status.details().len() < 3 << 10,
            "{}",
            status.details().len()
        );
        assert!(clip::wire_len(status.message()) <= clip::MAX_MESSAGE_WIRE_BYTES);
        assert!(!status.message().contains(['\r', '\n']));
    }

    #[test]
    fn quota_is_resource_exhausted_with_quota_failure_and_retry_info() {
        let status = from_runtime(RuntimeError::QuotaExceeded(QuotaExceeded {
            quota: Quota::TurnsPerMinute,
            limit: 7,
            retry_after: Some(std::time::Duration::from_secs(3)),
        }));
        assert_eq!(status.code(), Code::ResourceExhausted);
        let details = status.get_error_details();
        let failure = details.quota_failure().cloned().unwrap();
        assert_eq!(failure.violations[0].quota_id, "turns_per_minute");
        assert_eq!(failure.violations[0].subject, "turns_per_minute");
        assert_eq!(failure.violations[0].quota_value, 7);
        let retry = details.retry_info().cloned().unwrap();
        assert_eq!(retry.retry_delay, Some(std::time::Duration::from_secs(3)));
        let sessions = from_runtime(RuntimeError::Store(StoreError::QuotaExceeded(
            QuotaExceeded {
                quota: Quota::Sessions,
                limit: 2,
                retry_after: None,
            },
        )));
        assert_eq!(sessions.code(), Code::ResourceExhausted);
        assert!(sessions.get_error_details().retry_info().is_none());
    }

    #[test]
    fn hook_stops_name_the_hook_and_say_why() {
        let refused = from_runtime(RuntimeError::Hook(HookStop::Refused {
            hook: "guard".into(),
            reason: "off topic".into(),
        }));
        assert_eq!(refused.code(), Code::PermissionDenied);
        assert!(
            refused.message().contains("off topic"),
            "{}",
            refused.message()
        );
        let info = refused.get_error_details().error_info().cloned().unwrap();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            (HOOK_REFUSED, DOMAIN)
        );
        assert_eq!(info.metadata.get("hook").map(String::as_str), Some("guard"));
        let failed = from_runtime(RuntimeError::Hook(HookStop::Failed {
            hook: "guard".into(),
        }));
        assert_eq!(failed.code(), Code::Unavailable);
        let info = failed.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, HOOK_UNAVAILABLE);
        assert!(failed.message().contains("guard"), "{}", failed.message());
    }

    #[test]
    fn store_internals_are_not_leaked() {
        let status = from_runtime(RuntimeError::Store(StoreError::Backend(
            "/secret/path: permission denied".into(),
        )));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(!status.message().contains("/secret"));
    }
}
