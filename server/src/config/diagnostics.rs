//! Configuration errors that never show a secret.
//!
//! The toml crate's error `Display` quotes the offending line of the file,
//! and serde's messages quote the offending value; a line holding an inline
//! API key or a database URL would put it on stderr. A TOML error is
//! therefore reported as its position and message only, with any string
//! value at that position replaced by `<redacted>`. Likewise clap's errors
//! for a bad flag or `AGENTRT_*` variable name the argument and the reason,
//! never the value given.

use std::process::ExitCode;

/// `line L, column C: message` for a TOML error in `text`, without the
/// source line and without the string value it points at.
pub(crate) fn toml_error(text: &str, err: &toml::de::Error) -> String {
    let mut message = err.message().trim().to_owned();
    let Some(span) = err.span() else {
        return message;
    };
    if let Some(value) = text.get(span.clone()).map(str::trim)
        && value.starts_with(['"', '\''])
    {
        let inner = value.trim_matches(['"', '\'']);
        if !inner.is_empty() {
            message = message.replace(inner, "<redacted>");
        }
    }
    let (line, column) = line_and_column(text, span.start);
    format!("line {line}, column {column}: {message}")
}

/// The 1-based line and column (in characters) of byte `offset`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// What is wrong with the command line or an `AGENTRT_*` variable: the
/// kind of error, the argument and the parser's reason — never the value.
pub fn cli_error_message(err: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(s)) => Some(s.join(", ")),
        _ => None,
    };
    // `--flag=value` is reported whole for an unknown flag: keep the name.
    let arg = context(ContextKind::InvalidArg)
        .map(|a| a.split('=').next().unwrap_or_default().to_owned())
        .unwrap_or_else(|| "an argument".to_owned());
    let kind = err.kind().as_str().unwrap_or("invalid command line");
    match err.kind() {
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let reason = std::error::Error::source(err)
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            let valid = context(ContextKind::ValidValue)
                .map(|v| format!(" [possible values: {v}]"))
                .unwrap_or_default();
            format!(
                "invalid value for {arg} (or its AGENTRT_* variable){reason}{valid} (the value \
                 itself is not shown)"
            )
        }
        _ => format!("{kind}: {arg}; see --help"),
    }
}

/// For `Cli::try_parse`'s error: `--help` and `--version` print as clap
/// does (exit 0); anything else prints [`cli_error_message`] and exits 2.
pub fn cli_error_exit(err: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // Printing help can only fail when stdout is gone.
            let _ = err.print();
            if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        _ => {
            eprintln!("agentrt-server: {}", cli_error_message(err));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::{Cli, Config};

    const SECRET: &str = "sk-secret-0123456789abcdef";

    #[test]
    fn a_syntax_error_on_a_secret_line_names_the_position_not_the_line() {
        for toml in [
            format!("listen = \"127.0.0.1:1\"\n[[auth.api_keys]]\nkey = \"{SECRET}\" user\n"),
            format!(
                "listen = \"127.0.0.1:1\"\n[[auth.api_keys]]\nkey = \"{SECRET}\nuser = \"a\"\n"
            ),
            format!("[[auth.api_keys]]\nkey = \"{SECRET}\"\nuser = \"a\"\nadmin = \"{SECRET}\"\n"),
            format!("store_cache_mb = \"{SECRET}\"\n"),
            format!("[store]\nkind = \"{SECRET}\"\n"),
        ] {
            let err = Config::parse_toml(&toml).unwrap_err().0;
            assert!(!err.contains("sk-secret"), "the secret leaked: {err}");
            assert!(err.contains("line ") && err.contains(", column "), "{err}");
        }
        let err = Config::parse_toml(&format!("[[auth.api_keys]]\nkey = \"{SECRET}\" user\n"))
            .unwrap_err()
            .0;
        assert!(err.starts_with("line 2, column 36"), "{err}");
    }

    #[test]
    fn unknown_keys_are_still_named() {
        let err = Config::parse_toml("\n defualt_model = \"x/y\"")
            .unwrap_err()
            .0;
        assert!(
            err.contains("defualt_model") && err.starts_with("line 2, column 2"),
            "{err}"
        );
    }

    #[test]
    fn positions_count_characters() {
        assert_eq!(line_and_column("ab\ncdé f", 8), (2, 5));
        assert_eq!(line_and_column("x", 0), (1, 1));
        assert_eq!(line_and_column("x", 99), (1, 2));
    }

    #[test]
    fn a_bad_flag_or_variable_value_is_not_echoed() {
        for args in [
            vec!["agentrt-server", "--listen", SECRET],
            vec!["agentrt-server", "--shutdown-grace", SECRET],
            vec!["agentrt-server", "--store-cache-mb", SECRET],
            vec!["agentrt-server", "--log-format", SECRET],
            vec!["agentrt-server", &format!("--token={SECRET}")],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            let message = cli_error_message(&err);
            assert!(!message.contains("sk-secret"), "{args:?}: {message}");
            assert!(message.contains("--"), "{args:?}: {message}");
        }
        let err = Cli::try_parse_from(["agentrt-server", "--log-format", SECRET]).unwrap_err();
        assert!(cli_error_message(&err).contains("text, json"));
    }
}
