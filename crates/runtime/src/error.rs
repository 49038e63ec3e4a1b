//! [`RuntimeError`]: every way a core call can fail before a turn starts.
//! The gRPC adapter maps each variant to a status code in one exhaustive
//! match; failures after admission travel inside the turn's event stream.
//! It also owns the bounds on what an error carries back — however long the
//! caller's input, an error about it stays short and on one line.

use crate::model::ModelLookupError;
use crate::quota::QuotaExceeded;
use crate::store::{Lease, StoreError};

/// Most field violations reported in one error; the rest are counted.
pub const MAX_VIOLATIONS: usize = 10;
/// Longest field path in a reported violation, in characters.
pub const MAX_FIELD_CHARS: usize = 128;
/// Longest description of a reported violation, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 256;
/// Longest echo of a caller's value inside a description, in characters.
pub const MAX_ECHO_CHARS: usize = 40;
/// Longest id (turn, replica, address) in an error's `Display`, in
/// characters.
pub const MAX_DISPLAY_ID_CHARS: usize = 64;
/// Longest free text (a compaction failure's cause) in an error's
/// `Display`, in characters.
pub const MAX_DISPLAY_TEXT_CHARS: usize = 512;

/// `value` as it may appear in an error: at most `chars` characters (with
/// `…` when cut), control characters escaped, so an echoed value can
/// neither grow an error nor break its line.
pub fn display_clip(value: &str, chars: usize) -> String {
    let mut out = String::new();
    for (i, c) in value.chars().enumerate() {
        if i == chars {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// One invalid field of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field path, as named in the API (e.g. `content[0].image.mime_type`).
    pub field: String,
    /// What is wrong, phrased so a person can fix it.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`. Both texts are clipped
    /// ([`MAX_FIELD_CHARS`],
    /// [`MAX_DESCRIPTION_CHARS`]) and
    /// their control characters escaped: a description may echo caller
    /// input, which must not grow the error or break its line.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
        .bounded()
    }

    /// The violation with both texts within their bounds, for values built
    /// without [`FieldViolation::new`] (the fields are public).
    pub fn bounded(self) -> Self {
        Self {
            field: clean(self.field, MAX_FIELD_CHARS),
            description: clean(self.description, MAX_DESCRIPTION_CHARS),
        }
    }
}

fn clean(text: String, chars: usize) -> String {
    let fine = text.len() <= chars && !text.chars().any(char::is_control);
    if fine {
        text
    } else {
        display_clip(&text, chars)
    }
}

/// At most [`MAX_VIOLATIONS`] of
/// `violations`, each within its bounds, then — when some were left out —
/// one more saying how many: what an error may carry, however many fields
/// were wrong.
pub fn capped_violations(violations: Vec<FieldViolation>) -> Vec<FieldViolation> {
    let total = violations.len();
    let mut shown: Vec<FieldViolation> = violations
        .into_iter()
        .take(MAX_VIOLATIONS)
        .map(FieldViolation::bounded)
        .collect();
    if total > shown.len() {
        let more = total - shown.len();
        shown.push(FieldViolation::new(
            "",
            format!("{more} more invalid fields not listed; fix the ones above first"),
        ));
    }
    shown
}

/// Why a hook stopped what it guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookStop {
    /// The hook refused (or denied), saying why.
    Refused {
        /// The hook's name.
        hook: String,
        /// Its reason, clipped to `hooks::MAX_REASON_CHARS`.
        reason: String,
    },
    /// A fail-closed hook did not answer usably in time.
    Failed {
        /// The hook's name.
        hook: String,
    },
}

impl std::fmt::Display for HookStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused { hook, reason } => {
                write!(f, "refused by the operator's hook {hook:?}: {reason}")
            }
            Self::Failed { hook } => write!(
                f,
                "the operator's hook {hook:?} did not answer in time (it is fail-closed)"
            ),
        }
    }
}

/// Errors of the runtime core's API.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The session does not exist or belongs to another user (the two are
    /// indistinguishable on purpose).
    #[error("session not found")]
    SessionNotFound,
    /// The session already has a live turn.
    #[error(
        "session is busy with turn {}",
        display_clip(turn_id, MAX_DISPLAY_ID_CHARS)
    )]
    SessionBusy {
        /// The live turn.
        turn_id: String,
    },
    /// A `CompactSession` call is compacting the session.
    #[error("session is being compacted")]
    SessionCompacting,
    /// `CompactSession` could not produce a summary; nothing changed.
    #[error("compaction failed: {}", display_clip(.0, MAX_DISPLAY_TEXT_CHARS))]
    CompactionFailed(String),
    /// The session is archived and takes no new turns.
    #[error("session is archived; unarchive it to start new turns")]
    SessionArchived,
    /// A client-chosen session id's stored key is another user's: only
    /// if two owners' tags collided (see `runtime::keys`; ids are unique
    /// per owner, so this is practically never).
    #[error("a session with this id already exists")]
    SessionExists,
    /// The request is malformed.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    /// The request does not fit the current state (e.g. a tool result for
    /// a call nobody waits for).
    #[error("failed precondition: {0}")]
    FailedPrecondition(&'static str),
    /// The thing was already done (e.g. a second result for one tool call).
    #[error("already exists: {0}")]
    AlreadyExists(&'static str),
    /// The runtime is closed or draining.
    #[error("the runtime is not accepting new turns: {0}")]
    Unavailable(&'static str),
    /// The caller may not do this (e.g. an admin call by a non-admin).
    #[error("permission denied: {0}")]
    PermissionDenied(&'static str),
    /// A bounded resource is full (e.g. too many waiting watchers).
    #[error("resource exhausted: {0}")]
    ResourceExhausted(&'static str),
    /// The session's live turn runs on another replica (a shared store's
    /// lease names it): the call must be sent to that replica, which the
    /// gRPC adapter does over the cluster's internal service.
    #[error(
        "the session's live turn {} runs on replica {} at {}",
        display_clip(&.0.turn_id, MAX_DISPLAY_ID_CHARS),
        display_clip(&.0.replica_id, MAX_DISPLAY_ID_CHARS),
        display_clip(&.0.address, MAX_DISPLAY_ID_CHARS)
    )]
    Elsewhere(Lease),
    /// One of the principal's quotas is full ([`crate::quota`]); nothing
    /// was stored.
    #[error("{0}")]
    QuotaExceeded(QuotaExceeded),
    /// The agent (or that version of it) does not exist.
    #[error("agent not found")]
    AgentNotFound,
    /// The session's agent's system prompt template could not be rendered
    /// (e.g. it ran out of fuel); nothing was stored.
    #[error(
        "the agent's system prompt template could not be rendered: {}",
        display_clip(.0, MAX_DISPLAY_TEXT_CHARS)
    )]
    AgentPrompt(String),
    /// An operator hook stopped the turn before it started (`BeforeTurn`):
    /// it refused, or it is fail-closed and did not answer in time. Nothing
    /// was stored.
    #[error("{0}")]
    Hook(HookStop),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for RuntimeError {
    /// A store's quota refusal and a paused session's busy refusal are
    /// the runtime's; every other store error stays one.
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::QuotaExceeded(q) => Self::QuotaExceeded(q),
            // A paused turn keeps its session busy.
            StoreError::Paused { turn_id } => Self::SessionBusy { turn_id },
            other => Self::Store(other),
        }
    }
}

/// One line naming the (capped) violations: "field: what; field: what".
pub fn describe(violations: &[FieldViolation]) -> String {
    let mut parts = violations
        .iter()
        .take(MAX_VIOLATIONS)
        .map(|v| {
            let v = v.clone().bounded();
            if v.field.is_empty() {
                v.description
            } else {
                format!("{}: {}", v.field, v.description)
            }
        })
        .collect::<Vec<_>>();
    if violations.len() > MAX_VIOLATIONS {
        parts.push(format!("and {} more", violations.len() - MAX_VIOLATIONS));
    }
    parts.join("; ")
}

impl RuntimeError {
    /// `Ok` when there are no violations, else one invalid-argument error
    /// with all of them.
    pub(crate) fn check(violations: Vec<FieldViolation>) -> Result<(), Self> {
        if violations.is_empty() {
            Ok(())
        } else {
            Err(Self::InvalidArgument(violations))
        }
    }

    /// An invalid-argument error about one field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::InvalidArgument(vec![FieldViolation::new(field, description)])
    }

    pub(crate) fn unknown_model(field: &str, err: &ModelLookupError) -> Self {
        Self::invalid(field, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_values_are_clipped_and_escaped() {
        assert_eq!(
            display_clip("image/png\r\nX-Evil: 1", 12),
            "image/png\\r\\nX…"
        );
        assert_eq!(display_clip("short", 40), "short");
    }

    #[test]
    fn displayed_errors_stay_short_whatever_they_carry() {
        let huge = "t\n".repeat(1 << 20);
        let lease = Lease {
            replica_id: huge.clone(),
            turn_id: huge.clone(),
            address: huge.clone(),
            expires_at: std::time::SystemTime::UNIX_EPOCH,
        };
        for err in [
            RuntimeError::SessionBusy {
                turn_id: huge.clone(),
            },
            RuntimeError::CompactionFailed(huge.clone()),
            RuntimeError::Elsewhere(lease),
            RuntimeError::invalid(huge.clone(), huge),
        ] {
            let text = err.to_string();
            assert!(text.len() < 2048, "{}", text.len());
            assert!(!text.contains('\n'));
        }
    }
}
