//! Bounds on what a caller may send, in one place: every string and bytes
//! field of every request has one, and an error about a field never grows
//! with the caller's input. The transport adapter uses the same limits to
//! refuse oversized tool schemas before it parses them. The bounds on what
//! an error carries back are the error type's ([`crate::error`]); they are
//! re-exported here with the rest.

use crate::error::{FieldViolation, RuntimeError};
pub use crate::error::{
    MAX_DESCRIPTION_CHARS, MAX_ECHO_CHARS, MAX_FIELD_CHARS, MAX_VIOLATIONS, display_clip,
};

/// Longest id-like string a caller sends: agent and project ids, tool names
/// in `excluded_tools`, tool call and turn ids, user ids.
pub const MAX_ID_BYTES: usize = 256;
/// Longest session id.
const MAX_SESSION_ID: usize = 128;
/// Longest `provider/model` name.
pub const MAX_MODEL_NAME: usize = 256;
/// Longest free-text session field (title, system prompt) and the most
/// bytes of a session's metadata.
pub const MAX_TEXT_FIELD_BYTES: usize = 64 << 10;
/// Most content blocks in one user message.
pub const MAX_BLOCKS: usize = 256;
/// Most tools declared in one Chat (`extra_tools`), and most names in
/// `excluded_tools`.
pub const MAX_TOOLS: usize = 128;
/// Largest JSON schema of one declared tool.
pub const MAX_SCHEMA_BYTES: usize = 16 << 10;
/// Largest sum of the JSON schemas of one Chat's declared tools.
pub const MAX_SCHEMAS_BYTES: usize = 256 << 10;
/// Deepest nesting of objects and arrays in a tool's JSON schema.
pub const MAX_SCHEMA_DEPTH: usize = 32;

/// Session ids are 1–128 characters of `[A-Za-z0-9._:-]`, so they are safe in
/// store keys, logs and URLs.
pub(crate) fn validate_session_id(field: &str, id: &str) -> Result<(), RuntimeError> {
    if id.is_empty() {
        return Err(RuntimeError::invalid(field, "is required"));
    }
    if id.len() > MAX_SESSION_ID
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return Err(RuntimeError::invalid(
            field,
            format!("must be 1-{MAX_SESSION_ID} characters of A-Z a-z 0-9 . _ : -"),
        ));
    }
    Ok(())
}

/// `value` is at most `max` bytes.
pub fn check_short(field: &str, value: &str, max: usize) -> Result<(), RuntimeError> {
    if value.len() > max {
        return Err(RuntimeError::invalid(
            field,
            format!("is {} bytes; the limit is {max}", value.len()),
        ));
    }
    Ok(())
}

/// A `provider/model` name (empty: none chosen) is short and printable;
/// whether a provider serves it is checked when it is resolved.
pub fn check_model_name(field: &str, value: &str) -> Result<(), RuntimeError> {
    check_short(field, value, MAX_MODEL_NAME)?;
    if value.chars().any(char::is_control) {
        return Err(RuntimeError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A user message has at most [`MAX_BLOCKS`] content blocks.
pub fn check_block_count(field: &str, blocks: usize) -> Result<(), RuntimeError> {
    if blocks > MAX_BLOCKS {
        return Err(RuntimeError::invalid(
            field,
            format!("has {blocks} blocks; the limit is {MAX_BLOCKS} blocks per message"),
        ));
    }
    Ok(())
}

/// How deeply `json` nests objects and arrays, counting no further than
/// `stop` (so a hostile document costs one pass and no allocation).
fn nesting_depth(json: &str, stop: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > stop {
                    return deepest;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Checks the count and sizes of a Chat's declared tools from their raw
/// JSON schemas, before anything parses them: a request can make the
/// server parse at most [`MAX_SCHEMAS_BYTES`] of JSON, nested at most
/// [`MAX_SCHEMA_DEPTH`] deep.
pub fn check_tool_schemas(schemas: &[&str]) -> Result<(), RuntimeError> {
    if schemas.len() > MAX_TOOLS {
        return Err(RuntimeError::invalid(
            "extra_tools",
            format!("has {} tools; the limit is {MAX_TOOLS}", schemas.len()),
        ));
    }
    let mut violations = Vec::new();
    let mut total = 0usize;
    for (i, schema) in schemas.iter().enumerate() {
        let field = || format!("extra_tools[{i}].parameters_json_schema");
        total += schema.len();
        if schema.len() > MAX_SCHEMA_BYTES {
            violations.push(FieldViolation::new(
                field(),
                format!("is {} bytes; the limit is {MAX_SCHEMA_BYTES}", schema.len()),
            ));
        } else if nesting_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH {
            violations.push(FieldViolation::new(
                field(),
                format!(
                    "nests objects and arrays deeper than the limit of {MAX_SCHEMA_DEPTH} levels"
                ),
            ));
        }
    }
    if total > MAX_SCHEMAS_BYTES {
        violations.push(FieldViolation::new(
            "extra_tools",
            format!("the parameter schemas total {total} bytes; the limit is {MAX_SCHEMAS_BYTES}"),
        ));
    }
    RuntimeError::check(violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert_eq!(nesting_depth(r#"{"a":[{"b":"[[[{"}]}"#, 10), 3);
        assert_eq!(nesting_depth(r#"{"a":"\"{{{"}"#, 10), 1);
        assert_eq!(nesting_depth(&"[".repeat(1000), 32), 33);
    }

    #[test]
    fn schemas_are_bounded_before_parsing() {
        let small = r#"{"type":"object"}"#;
        assert!(check_tool_schemas(&[small; 128]).is_ok());
        let Err(RuntimeError::InvalidArgument(v)) = check_tool_schemas(&[small; 129]) else {
            panic!("129 tools accepted");
        };
        assert!(v[0].description.contains("limit is 128"), "{v:?}");
        let big = format!(r#"{{"description":"{}"}}"#, "x".repeat(MAX_SCHEMA_BYTES));
        let Err(RuntimeError::InvalidArgument(v)) = check_tool_schemas(&[small, &big]) else {
            panic!("an oversized schema was accepted");
        };
        assert_eq!(v[0].field, "extra_tools[1].parameters_json_schema");
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        assert!(check_tool_schemas(&[&deep]).is_err());
        let near = format!(r#"{{"d":"{}"}}"#, "x".repeat(MAX_SCHEMA_BYTES - 16));
        let many = vec![near.as_str(); 17];
        let Err(RuntimeError::InvalidArgument(v)) = check_tool_schemas(&many) else {
            panic!("17 schemas of 16 KiB were accepted");
        };
        assert_eq!(v[0].field, "extra_tools");
    }
}
