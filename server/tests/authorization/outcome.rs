//! What a call answered, in a form two answers can be compared in: the
//! status (where it came, code, message, every error detail) or a summary
//! of the success, with the ids the caller named replaced by placeholders.

use std::fmt::Debug;

use futures::{Stream, StreamExt as _};
use tonic::{Response, Status};
use tonic_types::StatusExt as _;

use super::world::{Target, WAIT};

/// Where a failure came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum At {
    /// As the call's answer (a unary error, or a stream refused at once).
    Call,
    /// As the first item of an accepted stream.
    Stream,
}

/// One call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A status: where, code, message, details (rendered).
    Failed {
        at: At,
        code: tonic::Code,
        message: String,
        details: String,
    },
    /// Success: a summary for comparison, and everything sent, for the
    /// leak check.
    Ok { summary: String, full: String },
    /// A stream that sent nothing within [`WAIT`]: attached to something.
    Hung,
}

impl Outcome {
    pub(crate) fn failed(status: &Status, at: At) -> Self {
        let details = status
            .get_error_details_vec()
            .iter()
            .map(|d| format!("{d:?}"))
            .collect::<Vec<_>>()
            .join("; ");
        Self::Failed {
            at,
            code: status.code(),
            message: status.message().to_owned(),
            details,
        }
    }

    pub(crate) fn is_ok(&self) -> bool {
        matches!(self, Self::Ok { .. })
    }

    pub(crate) fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Failed { code, .. } => Some(*code),
            Self::Ok { .. } | Self::Hung => None,
        }
    }

    /// Everything the caller got, as text.
    pub(crate) fn text(&self) -> String {
        match self {
            Self::Failed {
                message, details, ..
            } => format!("{message} {details}"),
            Self::Ok { summary, full } => format!("{summary} {full}"),
            Self::Hung => String::new(),
        }
    }

    /// The outcome with `target`'s ids (also clipped ones) replaced by
    /// placeholders, and only the summary of a success.
    pub(crate) fn normalized(&self, target: &Target) -> Self {
        let ids = [
            (target.task(), "<TASK>"),
            (target.session.clone(), "<SESSION>"),
            (target.turn.clone(), "<TURN>"),
            (target.request_id.clone(), "<REQUEST>"),
            (target.call_id.clone(), "<CALL>"),
        ];
        let scrub = |text: &str| {
            let mut text = text.to_owned();
            for (id, placeholder) in &ids {
                text = scrub_id(&text, id, placeholder);
            }
            text
        };
        match self {
            Self::Failed {
                at,
                code,
                message,
                details,
            } => Self::Failed {
                at: at.clone(),
                code: *code,
                message: scrub(message),
                details: scrub(details),
            },
            Self::Ok { summary, .. } => Self::Ok {
                summary: scrub(summary),
                full: String::new(),
            },
            Self::Hung => Self::Hung,
        }
    }
}

/// `text` with `id` — whole, or cut to any prefix of 8 characters or more,
/// as a clipped echo is — replaced by `placeholder`.
fn scrub_id(text: &str, id: &str, placeholder: &str) -> String {
    let mut text = text.to_owned();
    let mut end = id.len();
    while end >= 8.min(id.len()) && end > 0 {
        if id.is_char_boundary(end) && text.contains(&id[..end]) {
            text = text.replace(&id[..end], placeholder);
        }
        end -= 1;
    }
    text
}

/// The outcome of a unary call; `summary` says what of a success counts.
pub(crate) fn unary<T: Debug>(
    answer: Result<Response<T>, Status>,
    summary: impl FnOnce(&T) -> String,
) -> Outcome {
    match answer {
        Ok(response) => {
            let body = response.into_inner();
            Outcome::Ok {
                summary: summary(&body),
                full: format!("{body:?}"),
            }
        }
        Err(status) => Outcome::failed(&status, At::Call),
    }
}

/// The outcome of a streaming call: its refusal, or its first item (a
/// failure, or an event summarised by `summary`), or `Hung`. With `read`
/// false an accepted stream is not read (a caller's own stream may rightly
/// wait for a turn).
pub(crate) async fn streamed<S, T>(
    answer: Result<Response<S>, Status>,
    read: bool,
    summary: impl FnOnce(&T) -> String,
) -> Outcome
where
    S: Stream<Item = Result<T, Status>> + Unpin,
    T: Debug,
{
    let mut stream = match answer {
        Ok(response) => response.into_inner(),
        Err(status) => return Outcome::failed(&status, At::Call),
    };
    if !read {
        return Outcome::Ok {
            summary: "stream".into(),
            full: String::new(),
        };
    }
    match tokio::time::timeout(WAIT, stream.next()).await {
        Err(_) => Outcome::Hung,
        Ok(None) => Outcome::Ok {
            summary: "empty stream".into(),
            full: String::new(),
        },
        Ok(Some(Err(status))) => Outcome::failed(&status, At::Stream),
        Ok(Some(Ok(item))) => Outcome::Ok {
            summary: summary(&item),
            full: format!("{item:?}"),
        },
    }
}

#[test]
fn clipped_and_whole_ids_are_scrubbed() {
    let id = "0198f5d2-6a4e-7c0e-9d4b-3f2a1b0c9d8e";
    assert_eq!(scrub_id(&format!("x {id} y"), id, "<S>"), "x <S> y");
    assert_eq!(
        scrub_id(&format!("x \"{}…\"", &id[..20]), id, "<S>"),
        "x \"<S>…\""
    );
    assert_eq!(scrub_id("x 0198 y", id, "<S>"), "x 0198 y");
}
