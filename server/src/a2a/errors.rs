//! A2A errors on the gRPC binding: the status code and the
//! `google.rpc.ErrorInfo` (domain `a2a-protocol.org`, the A2A reason) the
//! SDKs' gRPC clients decode into their typed errors, and the one mapping
//! from core errors to them. Every match is exhaustive, with no catch-all
//! arm.

#![deny(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;

use agentrt_runtime::RuntimeError;
use agentrt_runtime::error::{FieldViolation, describe};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::clip;

/// The `google.rpc.ErrorInfo` domain of A2A errors.
pub const A2A_DOMAIN: &str = "a2a-protocol.org";

/// The A2A errors this binding answers with (the protocol's error
/// catalogue, as far as agentrt can hit it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum A2aError {
    /// The task (or context) does not exist for this caller.
    TaskNotFound,
    /// The task has already ended.
    TaskNotCancelable,
    /// Push notifications are not supported.
    PushNotificationNotSupported,
    /// The operation is not supported (in the task's or context's state).
    UnsupportedOperation,
    /// A part kind agentrt does not accept.
    ContentTypeNotSupported,
    /// The request's parameters are invalid.
    InvalidParams,
    /// The `A2A-Version` the caller speaks is not served here.
    VersionNotSupported,
}

impl A2aError {
    /// The reason string of `google.rpc.ErrorInfo`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TaskNotFound => "TASK_NOT_FOUND",
            Self::TaskNotCancelable => "TASK_NOT_CANCELABLE",
            Self::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation => "UNSUPPORTED_OPERATION",
            Self::ContentTypeNotSupported => "CONTENT_TYPE_NOT_SUPPORTED",
            Self::InvalidParams => "INVALID_PARAMS",
            Self::VersionNotSupported => "VERSION_NOT_SUPPORTED",
        }
    }

    /// The gRPC code the A2A specification binds the error to.
    pub fn code(self) -> Code {
        match self {
            Self::TaskNotFound => Code::NotFound,
            Self::TaskNotCancelable
            | Self::PushNotificationNotSupported
            | Self::UnsupportedOperation
            | Self::VersionNotSupported => Code::FailedPrecondition,
            Self::ContentTypeNotSupported | Self::InvalidParams => Code::InvalidArgument,
        }
    }

    /// The status: `message` for the person reading it, the ErrorInfo for
    /// the SDK.
    pub fn status(self, message: impl Into<String>) -> Status {
        self.status_with(message, HashMap::new())
    }

    /// [`A2aError::status`] with ErrorInfo metadata. The message and the
    /// metadata values are clipped ([`clip::message`], [`clip::id`]).
    pub fn status_with(
        self,
        message: impl Into<String>,
        metadata: HashMap<String, String>,
    ) -> Status {
        let metadata = metadata
            .into_iter()
            .map(|(k, v)| (clip::id(&k).into_owned(), clip::id(&v).into_owned()))
            .collect::<HashMap<_, _>>();
        let mut details = ErrorDetails::new();
        details.set_error_info(self.reason(), A2A_DOMAIN, metadata);
        Status::with_error_details(self.code(), clip::message(message.into()), details)
    }
}

/// The A2A error for a task id that names nothing this caller can see (the
/// id quoted clipped, so the trailers stay small however long it was).
pub fn task_not_found(task_id: &str) -> Status {
    A2aError::TaskNotFound.status(format!(
        "task {} not found: it is not a task id this server returned, or it belongs to \
         another user or a deleted context",
        clip::quoted(task_id)
    ))
}

/// `InvalidParamsError` about `violations`, also as a `BadRequest`
/// (clipped and counted as [`clip::violations`] does).
pub fn invalid_params(violations: Vec<FieldViolation>) -> Status {
    let message = clip::message(describe(&violations));
    let mut details = ErrorDetails::new();
    details.set_error_info(A2aError::InvalidParams.reason(), A2A_DOMAIN, HashMap::new());
    for v in clip::violations(violations) {
        details.add_bad_request_violation(v.field, v.description);
    }
    Status::with_error_details(A2aError::InvalidParams.code(), message, details)
}

/// Maps a core error to the A2A error (or plain gRPC status, where A2A has
/// no error of its own) the SDKs expect, its message clipped
/// ([`clip::status`]).
pub fn from_runtime(err: RuntimeError) -> Status {
    clip::status(status_of(err))
}

fn status_of(err: RuntimeError) -> Status {
    match err {
        RuntimeError::SessionNotFound => A2aError::TaskNotFound.status(
            "context not found: it is not a context id this server returned, or it belongs to \
             another user or was deleted",
        ),
        RuntimeError::SessionBusy { turn_id } => A2aError::UnsupportedOperation.status_with(
            "the context already has a working task; wait for it to finish, follow it with \
             SubscribeToTask, or cancel it with CancelTask",
            HashMap::from([
                (
                    "agentrt_reason".to_owned(),
                    crate::status::SESSION_BUSY.to_owned(),
                ),
                ("turn_id".to_owned(), turn_id),
            ]),
        ),
        RuntimeError::SessionCompacting => A2aError::UnsupportedOperation.status_with(
            "the context is being compacted; retry when that has finished",
            HashMap::from([(
                "agentrt_reason".to_owned(),
                crate::status::SESSION_BUSY.to_owned(),
            )]),
        ),
        RuntimeError::SessionArchived => A2aError::UnsupportedOperation.status(
            "the context's session is archived; unarchive it (agentrt.v1 UpdateSession) to send \
             new messages",
        ),
        RuntimeError::InvalidArgument(violations) => invalid_params(violations),
        // No A2A error of their own: the agentrt.v1 status, which the SDKs
        // raise as their generic client error with this code and message.
        err @ (RuntimeError::CompactionFailed(_)
        | RuntimeError::SessionExists
        | RuntimeError::Unavailable(_)
        | RuntimeError::PermissionDenied(_)
        | RuntimeError::FailedPrecondition(_)
        | RuntimeError::AlreadyExists(_)
        | RuntimeError::ResourceExhausted(_)
        | RuntimeError::QuotaExceeded(_)
        | RuntimeError::Elsewhere(_)
        | RuntimeError::AgentNotFound
        | RuntimeError::AgentPrompt(_)
        | RuntimeError::Hook(_)
        | RuntimeError::Store(_)) => crate::status::from_runtime(err),
    }
}

/// The A2A error of a core error met while looking a task up: a context
/// that is not found, or a malformed id, is an unknown task.
pub fn from_runtime_for_task(task_id: &str, err: RuntimeError) -> Status {
    match err {
        RuntimeError::SessionNotFound | RuntimeError::InvalidArgument(_) => task_not_found(task_id),
        err @ (RuntimeError::SessionBusy { .. }
        | RuntimeError::SessionCompacting
        | RuntimeError::CompactionFailed(_)
        | RuntimeError::SessionArchived
        | RuntimeError::SessionExists
        | RuntimeError::Unavailable(_)
        | RuntimeError::PermissionDenied(_)
        | RuntimeError::FailedPrecondition(_)
        | RuntimeError::AlreadyExists(_)
        | RuntimeError::ResourceExhausted(_)
        | RuntimeError::QuotaExceeded(_)
        | RuntimeError::Elsewhere(_)
        | RuntimeError::AgentNotFound
        | RuntimeError::AgentPrompt(_)
        | RuntimeError::Hook(_)
        | RuntimeError::Store(_)) => from_runtime(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;
    use tonic_types::pb;

    fn info(status: &Status) -> (String, String) {
        let decoded = pb::Status::decode(status.details()).expect("google.rpc.Status");
        assert_eq!(decoded.code, status.code() as i32);
        assert_eq!(decoded.message, status.message());
        let any = decoded
            .details
            .iter()
            .find(|d| d.type_url == "type.googleapis.com/google.rpc.ErrorInfo")
            .expect("an ErrorInfo");
        let info = pb::ErrorInfo::decode(any.value.as_slice()).expect("ErrorInfo decodes");
        (info.reason, info.domain)
    }

    #[test]
    fn each_error_carries_its_reason_code_and_the_a2a_domain() {
        for (err, reason, code) in [
            (A2aError::TaskNotFound, "TASK_NOT_FOUND", Code::NotFound),
            (
                A2aError::TaskNotCancelable,
                "TASK_NOT_CANCELABLE",
                Code::FailedPrecondition,
            ),
            (
                A2aError::PushNotificationNotSupported,
                "PUSH_NOTIFICATION_NOT_SUPPORTED",
                Code::FailedPrecondition,
            ),
            (
                A2aError::UnsupportedOperation,
                "UNSUPPORTED_OPERATION",
                Code::FailedPrecondition,
            ),
            (
                A2aError::ContentTypeNotSupported,
                "CONTENT_TYPE_NOT_SUPPORTED",
                Code::InvalidArgument,
            ),
            (
                A2aError::InvalidParams,
                "INVALID_PARAMS",
                Code::InvalidArgument,
            ),
            (
                A2aError::VersionNotSupported,
                "VERSION_NOT_SUPPORTED",
                Code::FailedPrecondition,
            ),
        ] {
            let status = err.status("why");
            assert_eq!(status.code(), code, "{err:?}");
            assert_eq!(info(&status), (reason.to_owned(), A2A_DOMAIN.to_owned()));
        }
    }

    #[test]
    fn a_busy_session_is_an_unsupported_operation_naming_the_live_turn() {
        let status = from_runtime(RuntimeError::SessionBusy {
            turn_id: "t1".into(),
        });
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(info(&status).0, "UNSUPPORTED_OPERATION");
    }

    #[test]
    fn invalid_arguments_are_invalid_params_with_the_violations() {
        let status = from_runtime(RuntimeError::invalid("message.parts", "is empty"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(info(&status).0, "INVALID_PARAMS");
        assert!(
            status.message().contains("message.parts"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn errors_without_an_a2a_counterpart_keep_the_agentrt_status() {
        let status = from_runtime(RuntimeError::Unavailable("draining"));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.details().is_empty());
    }

    #[test]
    fn a_huge_task_id_is_quoted_clipped() {
        let id = format!("s/{}", "\u{e9}%\n".repeat(1 << 20));
        for status in [
            task_not_found(&id),
            from_runtime_for_task(&id, RuntimeError::SessionNotFound),
        ] {
            assert_eq!(status.code(), Code::NotFound);
            assert!(crate::clip::wire_len(status.message()) < 1024);
            assert!(!status.message().contains('\n'));
            assert!(status.details().len() < 1024, "{}", status.details().len());
        }
        let busy = from_runtime(RuntimeError::SessionBusy {
            turn_id: "t".repeat(1 << 20),
        });
        assert!(busy.details().len() < 1024, "{}", busy.details().len());
    }

    #[test]
    fn an_unknown_context_while_looking_a_task_up_is_task_not_found() {
        let status = from_runtime_for_task("x/y", RuntimeError::SessionNotFound);
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(info(&status).0, "TASK_NOT_FOUND");
    }
}
