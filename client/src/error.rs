//! The client's errors: one variant per status code the contract names
//! (docs/contract.md §3.1), decoded from the status and its details, plus
//! the connection failures the client itself sees.

use std::error::Error as StdError;
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// The `google.rpc.ErrorInfo` reason of a busy session.
pub const SESSION_BUSY: &str = "SESSION_BUSY";

/// Errors of the client. Every variant from the server carries the
/// server's message and the status as received (`status`), so nothing of
/// the answer is lost; the `Display` text says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `ABORTED` with `ErrorInfo{reason: SESSION_BUSY}`: the session already
    /// has a live turn.
    #[error(
        "session {session_id} is running turn {turn_id}; wait for it to finish, watch it \
         or stop it"
    )]
    Busy {
        /// The session of the call.
        session_id: String,
        /// The live turn.
        turn_id: String,
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `ABORTED` with `ErrorInfo{reason: SESSION_BUSY, compacting}`: the
    /// session is being compacted.
    #[error("session {session_id} is being compacted; retry when that compaction has returned")]
    Compacting {
        /// The session of the call.
        session_id: String,
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `NOT_FOUND`: no such session (or another user's), turn or call.
    #[error("not found: {message}")]
    NotFound {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `INVALID_ARGUMENT`, with the `BadRequest` field violations.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The first violated field (empty when the server named none).
        field: String,
        /// The server's message.
        message: String,
        /// Every `(field, description)` violation the server listed.
        violations: Vec<(String, String)>,
        /// The status as received.
        status: Box<Status>,
    },
    /// `PERMISSION_DENIED`: the credentials do not allow this call.
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `UNAUTHENTICATED`: missing or unknown credentials.
    #[error("unauthenticated: {message} (check the API key / client certificate)")]
    Unauthenticated {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `FAILED_PRECONDITION` (e.g. an archived session).
    #[error("failed precondition: {message}")]
    FailedPrecondition {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `ALREADY_EXISTS`.
    #[error("already exists: {message}")]
    AlreadyExists {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `RESOURCE_EXHAUSTED`: a queue or limit is full; retry later.
    #[error("resource exhausted: {message}{}", retry_hint(.message, *.retry_after))]
    ResourceExhausted {
        /// The server's message.
        message: String,
        /// How long to wait, when the server said (`RetryInfo`).
        retry_after: Option<Duration>,
        /// The status as received.
        status: Box<Status>,
    },
    /// `DEADLINE_EXCEEDED`: the call's deadline or the turn's time limit.
    #[error("deadline exceeded: {message}")]
    DeadlineExceeded {
        /// The server's (or the client's) message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `UNAVAILABLE` from the server (draining, store down, model down).
    #[error("unavailable: {message}{}", unless_said(.message))]
    Unavailable {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// `CANCELLED` (e.g. a stopped turn).
    #[error("cancelled: {message}")]
    Cancelled {
        /// The server's message.
        message: String,
        /// The status as received.
        status: Box<Status>,
    },
    /// Any other status (`INTERNAL`, `DATA_LOSS`, `UNIMPLEMENTED`, ...).
    #[error("{}: {}", .0.code(), .0.message())]
    Rpc(Box<Status>),
    /// The server could not be reached (refused, DNS, TLS handshake,
    /// timeout): `cause` is the underlying error chain.
    #[error("cannot connect to {url}: {cause}")]
    Connect {
        /// The server URL.
        url: String,
        /// What went wrong, from the error's `source()` chain.
        cause: String,
    },
    /// The connection broke during a call (after it was set up).
    #[error("the connection to {url} broke: {cause}")]
    Disconnected {
        /// The server URL.
        url: String,
        /// What went wrong, from the error's `source()` chain.
        cause: String,
    },
    /// The server sent something this client does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The client's own configuration is unusable (a URL without a scheme,
    /// `https://` with the system roots off and no CA, a bearer token over plaintext to another
    /// host, an unreadable file, a bad token).
    #[error("{0}")]
    Config(String),
}

/// When to retry: the server's delay, else "retry later" unless its
/// message already says when (no "retry later; retry later").
fn retry_hint(message: &str, after: Option<Duration>) -> String {
    match after {
        Some(d) if d >= Duration::from_secs(2) => format!(" (retry in {} s)", d.as_secs()),
        Some(d) => format!(" (retry in {} ms)", d.as_millis()),
        None if message.contains("retry") => String::new(),
        None => " (retry later)".to_owned(),
    }
}

impl Error {
    /// The gRPC code of an error the server (or tonic) answered with;
    /// `None` for the client's own errors.
    pub fn code(&self) -> Option<Code> {
        self.status().map(Status::code)
    }

    /// The server could not be reached or the client's settings are
    /// unusable ([`Error::Connect`], [`Error::Disconnected`],
    /// [`Error::Config`]).
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. } | Error::Disconnected { .. } | Error::Config(_)
        )
    }

    /// The session has a live turn or is being compacted
    /// ([`Error::Busy`], [`Error::Compacting`]).
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. } | Error::Compacting { .. })
    }

    /// The status as received, for the variants that came from one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Error::Busy { status, .. }
            | Error::Compacting { status, .. }
            | Error::NotFound { status, .. }
            | Error::InvalidArgument { status, .. }
            | Error::PermissionDenied { status, .. }
            | Error::Unauthenticated { status, .. }
            | Error::FailedPrecondition { status, .. }
            | Error::AlreadyExists { status, .. }
            | Error::ResourceExhausted { status, .. }
            | Error::DeadlineExceeded { status, .. }
            | Error::Unavailable { status, .. }
            | Error::Cancelled { status, .. } => Some(status),
            Error::Rpc(status) => Some(status),
            Error::Connect { .. }
            | Error::Disconnected { .. }
            | Error::Protocol(_)
            | Error::Config(_) => None,
        }
    }

    /// Decodes a status of a call on `session_id` (empty when the call is
    /// not session-scoped) made to `url`. A status tonic made from a
    /// transport failure (it has a `source()`) becomes [`Error::Connect`]
    /// or [`Error::Disconnected`] with the cause named.
    pub fn from_status(status: Status, session_id: &str, url: &str) -> Self {
        if let Some(source) = StdError::source(&status) {
            let cause = cause_chain(source);
            let cause = plaintext_hint(url, cause);
            // tonic answers a call it could not send (no connection) with
            // UNAVAILABLE; a connection lost under a call with other codes.
            return if status.code() == Code::Unavailable {
                Error::Connect {
                    url: url.to_owned(),
                    cause,
                }
            } else {
                Error::Disconnected {
                    url: url.to_owned(),
                    cause,
                }
            };
        }
        let message = status.message().to_owned();
        let session_id = session_id.to_owned();
        let details = status.get_error_details();
        let boxed = Box::new(status);
        match boxed.code() {
            Code::Aborted => match details.error_info() {
                Some(info) if info.reason == SESSION_BUSY => {
                    if info.metadata.get("compacting").map(String::as_str) == Some("true") {
                        Error::Compacting {
                            session_id,
                            message,
                            status: boxed,
                        }
                    } else {
                        Error::Busy {
                            session_id,
                            turn_id: info.metadata.get("turn_id").cloned().unwrap_or_default(),
                            message,
                            status: boxed,
                        }
                    }
                }
                Some(_) | None => Error::Rpc(boxed),
            },
            Code::NotFound => Error::NotFound {
                message,
                status: boxed,
            },
            Code::InvalidArgument => {
                let violations: Vec<(String, String)> = details
                    .bad_request()
                    .map(|b| {
                        b.field_violations
                            .iter()
                            .map(|v| (v.field.clone(), v.description.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                Error::InvalidArgument {
                    field: violations.first().map(|v| v.0.clone()).unwrap_or_default(),
                    message,
                    violations,
                    status: boxed,
                }
            }
            Code::PermissionDenied => Error::PermissionDenied {
                message,
                status: boxed,
            },
            Code::Unauthenticated => Error::Unauthenticated {
                message,
                status: boxed,
            },
            Code::FailedPrecondition => Error::FailedPrecondition {
                message,
                status: boxed,
            },
            Code::AlreadyExists => Error::AlreadyExists {
                message,
                status: boxed,
            },
            Code::ResourceExhausted => Error::ResourceExhausted {
                message,
                retry_after: details.retry_info().and_then(|r| r.retry_delay),
                status: boxed,
            },
            Code::DeadlineExceeded => Error::DeadlineExceeded {
                message,
                status: boxed,
            },
            Code::Unavailable => Error::Unavailable {
                message,
                status: boxed,
            },
            Code::Cancelled => Error::Cancelled {
                message,
                status: boxed,
            },
            Code::Ok
            | Code::Unknown
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Internal
            | Code::DataLoss => Error::Rpc(boxed),
        }
    }

    /// A connection failure of `url` from tonic's transport error.
    pub(crate) fn connect(url: &str, err: &tonic::transport::Error) -> Self {
        Error::Connect {
            url: url.to_owned(),
            cause: plaintext_hint(url, cause_chain(err)),
        }
    }
}

/// A plaintext (`http://`) connection that the server cuts at once is
/// most often one to a TLS port: the server reads the HTTP/2 preface as a
/// broken TLS hello and hangs up, or answers with a TLS alert that is no
/// HTTP/2 frame. Say so, instead of only "broken pipe".
fn plaintext_hint(url: &str, cause: String) -> String {
    if !url.starts_with("http://") {
        return cause;
    }
    let lower = cause.to_lowercase();
    let cut = [
        "broken pipe",
        "connection reset",
        "frame with invalid size",
        "invalid frame",
        "connection closed",
        "unexpected end of file",
        "unexpected eof",
        "protocol error",
        "early eof",
    ]
    .iter()
    .any(|w| lower.contains(w));
    if !cut {
        return cause;
    }
    format!(
        "the server closed the plaintext connection ({cause}); if it serves TLS, use {}",
        url.replacen("http://", "https://", 1)
    )
}

/// The messages of `err` and its `source()` chain, joined with `: `,
/// without the generic wrappers ("transport error") and repeats, and with
/// a hint for the common causes.
pub(crate) fn cause_chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut hint = None;
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            hint = hint.or(match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    Some("is the server running and listening there?")
                }
                std::io::ErrorKind::TimedOut => Some("is the address reachable?"),
                _ => None,
            });
        }
        let text = e.to_string();
        let generic = matches!(
            text.as_str(),
            "transport error" | "error trying to connect" | "client error (Connect)"
        );
        if !generic && !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    let lower = parts.join(": ").to_lowercase();
    if hint.is_none() {
        if lower.contains("dns error") || lower.contains("failed to lookup") {
            hint = Some("check the host name");
        } else if ["certificate", "tls", "corrupt message", "handshake"]
            .iter()
            .any(|w| lower.contains(w))
        {
            hint = Some(
                "the TLS handshake failed: is the server serving TLS there, and is its \
                 certificate from this CA (--ca) and for this name?",
            );
        } else if lower.contains("timed out") || lower.contains("elapsed") {
            hint = Some("is the address reachable?");
        }
    }
    let mut out = if parts.is_empty() {
        "transport error".to_owned()
    } else {
        parts.join(": ")
    };
    if let Some(h) = hint {
        out.push_str(" (");
        out.push_str(h);
        out.push(')');
    }
    out
}

/// "; retry later" unless the server's message already says when to retry
/// (the store's and the draining messages do), so the CLI does not print
/// the advice twice.
fn unless_said(message: &str) -> &'static str {
    if message.contains("retry") {
        ""
    } else {
        "; retry later"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    #[test]
    fn unavailable_advises_a_retry_once() {
        let said = Error::from_status(
            Status::unavailable("the store is unavailable; retry later"),
            "s",
            "http://127.0.0.1:1",
        );
        assert_eq!(
            said.to_string(),
            "unavailable: the store is unavailable; retry later"
        );
        let unsaid = Error::from_status(Status::unavailable("draining"), "s", "http://127.0.0.1:1");
        assert_eq!(unsaid.to_string(), "unavailable: draining; retry later");
    }

    #[test]
    fn busy_and_bad_request_are_decoded_from_the_details() {
        let status = Status::with_error_details(
            Code::Aborted,
            "busy",
            ErrorDetails::with_error_info(
                SESSION_BUSY,
                "agentrt",
                [("turn_id".to_owned(), "t-9".to_owned())],
            ),
        );
        let err = Error::from_status(status, "s-1", "http://x");
        let Error::Busy {
            session_id,
            turn_id,
            ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((session_id.as_str(), turn_id.as_str()), ("s-1", "t-9"));
        assert!(err.to_string().contains("session s-1 is running turn t-9"));
        assert_eq!(err.code(), Some(Code::Aborted));

        let mut details = ErrorDetails::new();
        details.add_bad_request_violation("content", "too long");
        let status =
            Status::with_error_details(Code::InvalidArgument, "content: too long", details);
        match Error::from_status(status, "", "http://x") {
            Error::InvalidArgument {
                field, violations, ..
            } => {
                assert_eq!(field, "content");
                assert_eq!(violations, vec![("content".into(), "too long".into())]);
            }
            other => panic!("{other:?}"),
        }
        let plain_aborted = Error::from_status(Status::aborted("x"), "s", "u");
        assert!(matches!(plain_aborted, Error::Rpc(_)), "{plain_aborted:?}");
    }

    #[test]
    fn a_quota_refusal_carries_its_retry_delay() {
        let mut details = ErrorDetails::with_quota_failure_violation("live_turns", "at most 1");
        details.set_retry_info(Some(std::time::Duration::from_millis(1500)));
        let status = Status::with_error_details(Code::ResourceExhausted, "quota", details);
        let err = Error::from_status(status, "s", "http://x");
        let Error::ResourceExhausted { retry_after, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*retry_after, Some(std::time::Duration::from_millis(1500)));
        assert!(err.to_string().contains("retry in 1500 ms"), "{err}");
        let without = Error::from_status(Status::resource_exhausted("full"), "s", "http://x");
        assert!(
            matches!(
                without,
                Error::ResourceExhausted {
                    retry_after: None,
                    ..
                }
            ),
            "{without:?}"
        );
    }
}
