//! The `sslmode` and `sslrootcert` parameters of a connection string, taken
//! out before tokio-postgres parses it (it refuses `verify-ca`,
//! `verify-full` and `sslrootcert`). Both forms: the URL
//! (`postgres://…?sslmode=verify-full`, percent-encoded) and key=value
//! (`host=db sslmode=verify-full`, quoted with `'…'` and `\`), split the
//! way tokio-postgres splits them. Everything else is kept byte for byte.

/// The parameters taken out (the last one of each name wins, as in libpq).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SslParams {
    pub(super) sslmode: Option<String>,
    pub(super) sslrootcert: Option<String>,
}

impl SslParams {
    /// Records `key = value` if it is ours; whether it was.
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.sslmode = Some(value),
            "sslrootcert" => self.sslrootcert = Some(value),
            _ => return false,
        }
        true
    }
}

/// `conn` without its `sslmode` and `sslrootcert`, and their values.
/// Errors never show the string (it holds the password).
pub(super) fn take_ssl_params(conn: &str) -> Result<(String, SslParams), String> {
    match ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| conn.strip_prefix(scheme).map(|rest| (scheme, rest)))
    {
        Some((scheme, rest)) => from_url(scheme, rest),
        None => Ok(from_key_values(conn)),
    }
}

fn from_url(scheme: &str, rest: &str) -> Result<(String, SslParams), String> {
    // tokio-postgres ends the credentials at the first `@`, and the query
    // starts at the first `?` after them.
    let after_credentials = rest.find('@').map_or(0, |at| at + 1);
    let Some(q) = rest[after_credentials..].find('?') else {
        return Ok((format!("{scheme}{rest}"), SslParams::default()));
    };
    let (head, query) = rest.split_at(after_credentials + q);
    let mut params = SslParams::default();
    let mut kept = Vec::new();
    for pair in query[1..].split('&') {
        let ours = match pair.split_once('=') {
            Some((key, value)) => {
                let key = decode(key);
                let value = decode(value);
                match (key, value) {
                    (Ok(key), Ok(value)) => params.take(&key, value),
                    (Ok(key), Err(())) if matches!(key.as_str(), "sslmode" | "sslrootcert") => {
                        return Err(format!(
                            "{key} in the URL is not UTF-8 once percent-decoded"
                        ));
                    }
                    // tokio-postgres reports it.
                    _ => false,
                }
            }
            None => false,
        };
        if !ours {
            kept.push(pair);
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    Ok((format!("{scheme}{head}{query}"), params))
}

/// Percent-decoding, as tokio-postgres does it (no `+` for space).
fn decode(s: &str) -> Result<String, ()> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let byte = hex(h).zip(hex(l)).map(|(h, l)| h * 16 + l);
                out.push(byte.and_then(|b| u8::try_from(b).ok()).ok_or(())?);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(drop)
}

/// The key=value form. A string this does not follow (an unterminated
/// quote, a key without `=`) is returned unchanged for tokio-postgres to
/// report.
fn from_key_values(conn: &str) -> (String, SslParams) {
    let mut params = SslParams::default();
    let mut kept = Vec::new();
    let mut rest = conn;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let Some((key, value, after)) = key_value(rest) else {
            return (conn.to_owned(), SslParams::default());
        };
        let raw = &rest[..rest.len() - after.len()];
        if !params.take(key, value) {
            kept.push(raw);
        }
        rest = after;
    }
    (kept.join(" "), params)
}

/// One `key = value` at the start of `s`: the key, the unquoted value, and
/// what follows.
fn key_value(s: &str) -> Option<(&str, String, &str)> {
    let key_end = s.find(|c: char| c.is_whitespace() || c == '=')?;
    let (key, rest) = s.split_at(key_end);
    let rest = rest.trim_start().strip_prefix('=')?.trim_start();
    let mut value = String::new();
    let mut chars = rest.char_indices();
    let quoted = rest.starts_with('\'');
    if quoted {
        chars.next();
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' if quoted => return Some((key, value, &rest[i + 1..])),
            c if c.is_whitespace() && !quoted => {
                return (!value.is_empty()).then_some((key, value, &rest[i..]));
            }
            '\\' => value.extend(chars.next().map(|(_, c)| c)),
            c => value.push(c),
        }
    }
    (!quoted && !value.is_empty()).then_some((key, value, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(conn: &str) -> (String, Option<String>, Option<String>) {
        let (rest, p) = take_ssl_params(conn).unwrap();
        (rest, p.sslmode, p.sslrootcert)
    }

    #[test]
    fn url_parameters_are_taken_out_and_the_rest_is_kept() {
        assert_eq!(
            take("postgres://u:p@h:5432/db"),
            ("postgres://u:p@h:5432/db".to_owned(), None, None)
        );
        assert_eq!(
            take(
                "postgresql://u:p@h/db?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3"
            ),
            (
                "postgresql://u:p@h/db?application_name=x&connect_timeout=3".to_owned(),
                Some("verify-full".to_owned()),
                Some("/etc/ca.pem".to_owned())
            )
        );
        assert_eq!(
            take("postgres://h/db?sslmode=require&sslmode=verify-ca"),
            (
                "postgres://h/db".to_owned(),
                Some("verify-ca".to_owned()),
                None
            )
        );
        // A `?` in the password is not the query.
        assert_eq!(
            take("postgres://u:p?ss@h/db?sslmode=disable"),
            (
                "postgres://u:p?ss@h/db".to_owned(),
                Some("disable".to_owned()),
                None
            )
        );
        assert!(
            take_ssl_params("postgres://h/db?sslrootcert=%FF")
                .unwrap_err()
                .contains("sslrootcert in the URL")
        );
    }

    #[test]
    fn key_value_parameters_are_taken_out_and_the_rest_is_kept() {
        assert_eq!(
            take(
                "host=h password='a b\\'c' sslmode = verify-full sslrootcert='/etc/my ca.pem' dbname=db"
            ),
            (
                "host=h password='a b\\'c' dbname=db".to_owned(),
                Some("verify-full".to_owned()),
                Some("/etc/my ca.pem".to_owned())
            )
        );
        assert_eq!(
            take("host=h sslmode=ver\\ify"),
            ("host=h".to_owned(), Some("verify".to_owned()), None)
        );
        // Malformed: left to tokio-postgres.
        let (rest, mode, _) = take("host=h sslmode='verify-full");
        assert_eq!(rest, "host=h sslmode='verify-full");
        assert_eq!(mode, None);
    }
}
