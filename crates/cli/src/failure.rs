//! A command's failure (its message and exit code), connecting to the
//! server, and reading a command's text from its arguments or stdin.

use std::io::{IsTerminal as _, Read as _};

use agentrt_client::{Client, Error};

use crate::args::Cli;

/// A failure of the command: what to print and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) message: String,
    pub(crate) code: u8,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code,
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        use tonic::Code;
        let code = match err.code() {
            None if err.is_connection() => 3,
            None => 1,
            Some(Code::NotFound) => 4,
            Some(Code::Aborted) if err.is_busy() => 5,
            Some(Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists) => 6,
            Some(Code::Unauthenticated | Code::PermissionDenied) => 7,
            Some(Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded) => 8,
            Some(
                Code::Ok
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted
                | Code::OutOfRange
                | Code::Unimplemented
                | Code::Internal
                | Code::DataLoss,
            ) => 1,
        };
        let message = if let Error::Busy {
            session_id,
            turn_id,
            ..
        } = &err
        {
            format!(
                "session {session_id} is running turn {turn_id}; watch it with `agentrt watch \
                 {session_id}` or stop it with `agentrt stop {session_id}`"
            )
        } else if let Error::NotFound { message, .. } = &err {
            format!("{message} (list your sessions with `agentrt sessions list`)")
        } else if let Error::FailedPrecondition { message, .. } = &err
            && message.contains("archived")
        {
            format!("{message} (`agentrt sessions update SESSION --archived false` unarchives it)")
        } else {
            err.to_string()
        };
        Self { message, code }
    }
}

pub(crate) type Outcome = Result<(), Failure>;

pub(crate) async fn connect(cli: &Cli) -> Result<Client, Failure> {
    let mut builder = Client::builder(cli.url.clone()).allow_insecure_token(cli.insecure);
    if let Some(t) = &cli.token {
        builder = builder.token(t.clone());
    }
    if let Some(ca) = &cli.ca {
        builder = builder.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
        builder = builder.identity_files(cert, key);
    }
    Ok(builder.connect().await?)
}

/// The text of a command that reads it from its arguments or stdin.
pub(crate) fn text_or_stdin(parts: &[String], what: &str) -> Result<String, Failure> {
    let joined = parts.join(" ");
    if !(joined.is_empty() || joined == "-") {
        return Ok(joined);
    }
    let stdin = std::io::stdin();
    if joined.is_empty() && stdin.is_terminal() {
        return Err(Failure::new(
            2,
            format!("no {what}: give it as an argument, or pipe it on stdin"),
        ));
    }
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .map_err(|e| Failure::new(1, format!("cannot read the {what} from stdin: {e}")))?;
    let text = text.trim_end_matches(['\n', '\r']).to_owned();
    if text.is_empty() {
        return Err(Failure::new(2, format!("the {what} on stdin is empty")));
    }
    Ok(text)
}
