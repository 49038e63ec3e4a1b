//! Caller-executed tools over A2A: how a caller offers them (request
//! metadata), how a call reaches it (an `INPUT_REQUIRED` status with a data
//! part) and how it answers (a message to the task with a data part).
//! The shapes are agentrt's own and documented in docs/a2a.md.

use agentrt_proto::a2a::v1 as a2a;
use agentrt_runtime::RuntimeError;
use agentrt_runtime::model::ToolSpec;
use prost_types::value::Kind;

/// The `SendMessageRequest.metadata` key listing the caller's tools.
pub const EXTRA_TOOLS_KEY: &str = "agentrt_extra_tools";
/// The `SendMessageRequest.metadata` key listing the server tools whose
/// calls wait for an approval (`"*"`: every one).
pub const REQUIRE_APPROVAL_KEY: &str = "agentrt_require_approval";

/// What a caller sent for a pending call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A caller-executed tool's result.
    Result(ToolResult),
    /// A decision on a call that waits for an approval.
    Decision {
        /// The call it decides.
        call_id: String,
        /// Run it.
        approved: bool,
        /// Why (told to the model on a denial).
        reason: String,
    },
}

impl Answer {
    /// The call it answers.
    pub fn call_id(&self) -> &str {
        match self {
            Self::Result(r) => &r.call_id,
            Self::Decision { call_id, .. } => call_id,
        }
    }
}

/// A tool result the caller sent for a pending call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The call it answers.
    pub call_id: String,
    /// The result, as the model will read it.
    pub content: String,
    /// The tool failed.
    pub is_error: bool,
}

/// The server tools whose calls wait for an approval, from
/// `metadata.agentrt_require_approval` (a list of tool names, `"*"`).
pub fn require_approval(
    metadata: Option<&prost_types::Struct>,
) -> Result<Vec<String>, RuntimeError> {
    let Some(value) = metadata.and_then(|m| m.fields.get(REQUIRE_APPROVAL_KEY)) else {
        return Ok(Vec::new());
    };
    let field = format!("metadata.{REQUIRE_APPROVAL_KEY}");
    let serde_json::Value::Array(items) = to_json(value) else {
        return Err(RuntimeError::invalid(field, "is not a list of tool names"));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            serde_json::Value::String(name) => Ok(name),
            _ => Err(RuntimeError::invalid(
                format!("{field}[{i}]"),
                "is not a tool name (a string)",
            )),
        })
        .collect()
}

/// The data part of an `INPUT_REQUIRED` status for a server tool call
/// that waits for an approval: `{"approval_required": {"call_id", "name",
/// "arguments"}}`.
pub fn approval_part(call_id: &str, name: &str, arguments_json: &str) -> a2a::Part {
    pending_part("approval_required", call_id, name, arguments_json)
}

/// A data part `{key: {"call_id", "name", "arguments"}}` (`arguments`
/// parsed when it is JSON, else the raw text).
fn pending_part(key: &str, call_id: &str, name: &str, arguments_json: &str) -> a2a::Part {
    let arguments = serde_json::from_str(arguments_json)
        .unwrap_or_else(|_| serde_json::Value::String(arguments_json.to_owned()));
    let mut data = serde_json::Map::new();
    data.insert(
        key.to_owned(),
        serde_json::json!({"call_id": call_id, "name": name, "arguments": arguments}),
    );
    a2a::Part {
        content: Some(a2a::part::Content::Data(from_json(
            &serde_json::Value::Object(data),
        ))),
        media_type: "application/json".to_owned(),
        ..Default::default()
    }
}

/// A protobuf `Value` as JSON.
pub fn to_json(value: &prost_types::Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(to_json).collect())
        }
    }
}

/// A protobuf `Struct` as a JSON object.
pub fn struct_to_json(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), to_json(v)))
            .collect(),
    )
}

/// JSON as a protobuf `Value`.
pub fn from_json(value: &serde_json::Value) -> prost_types::Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(from_json).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// The caller's tools from `metadata.agentrt_extra_tools`: a list of
/// `{name, description, parameters}` (`parameters`: a JSON Schema object).
pub fn extra_tools(metadata: Option<&prost_types::Struct>) -> Result<Vec<ToolSpec>, RuntimeError> {
    let Some(value) = metadata.and_then(|m| m.fields.get(EXTRA_TOOLS_KEY)) else {
        return Ok(Vec::new());
    };
    let field = format!("metadata.{EXTRA_TOOLS_KEY}");
    let serde_json::Value::Array(items) = to_json(value) else {
        return Err(RuntimeError::invalid(
            field,
            "is not a list of {name, description, parameters}",
        ));
    };
    let schemas: Vec<String> = items
        .iter()
        .map(|t| {
            t.get("parameters")
                .map_or_else(String::new, ToString::to_string)
        })
        .collect();
    let refs: Vec<&str> = schemas.iter().map(String::as_str).collect();
    agentrt_runtime::limits::check_tool_schemas(&refs)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let text = |key: &str| item.get(key).and_then(|v| v.as_str()).map(str::to_owned);
            let name = text("name").ok_or_else(|| {
                RuntimeError::invalid(format!("{field}[{i}].name"), "is required (a string)")
            })?;
            let parameters = match item.get("parameters") {
                None | Some(serde_json::Value::Null) => {
                    serde_json::json!({"type": "object", "properties": {}})
                }
                Some(p @ serde_json::Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(RuntimeError::invalid(
                        format!("{field}[{i}].parameters"),
                        "is not a JSON Schema object",
                    ));
                }
            };
            Ok(ToolSpec {
                name,
                description: text("description").unwrap_or_default(),
                parameters,
            })
        })
        .collect()
}

/// The data part of an `INPUT_REQUIRED` status: the call the caller is to
/// run, `{"tool_call": {"call_id", "name", "arguments"}}` (`arguments`
/// parsed when it is JSON, else the raw text).
pub fn call_part(call_id: &str, name: &str, arguments_json: &str) -> a2a::Part {
    pending_part("tool_call", call_id, name, arguments_json)
}

/// The answer in a message to a task: a data part `{"call_id",
/// "approved", "reason"?}` decides a call that waits for an approval; any
/// other is a tool result (see [`tool_result`]). `None` when the message
/// has no data part.
pub fn answer(message: &a2a::Message) -> Result<Option<Answer>, RuntimeError> {
    let decision = message
        .parts
        .iter()
        .enumerate()
        .find_map(|(i, p)| match &p.content {
            Some(a2a::part::Content::Data(v)) => {
                let data = to_json(v);
                data.get("approved").map(|a| (i, a.clone(), data.clone()))
            }
            _ => None,
        });
    let Some((i, approved, data)) = decision else {
        return Ok(tool_result(message)?.map(Answer::Result));
    };
    let field = format!("message.parts[{i}].data");
    let approved = approved
        .as_bool()
        .ok_or_else(|| RuntimeError::invalid(format!("{field}.approved"), "is not a boolean"))?;
    let call_id = data
        .get("call_id")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| RuntimeError::invalid(format!("{field}.call_id"), "is required (a string)"))?
        .to_owned();
    let reason = data
        .get("reason")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    Ok(Some(Answer::Decision {
        call_id,
        approved,
        reason,
    }))
}

/// The tool result in a message to a task: a data part
/// `{"call_id", "content", "is_error"?}` (a non-string `content` is sent
/// to the model as JSON text). `None` when the message has no data part.
pub fn tool_result(message: &a2a::Message) -> Result<Option<ToolResult>, RuntimeError> {
    let Some((i, data)) = message
        .parts
        .iter()
        .enumerate()
        .find_map(|(i, p)| match &p.content {
            Some(a2a::part::Content::Data(v)) => Some((i, to_json(v))),
            _ => None,
        })
    else {
        return Ok(None);
    };
    let field = format!("message.parts[{i}].data");
    let call_id = data
        .get("call_id")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| RuntimeError::invalid(format!("{field}.call_id"), "is required (a string)"))?
        .to_owned();
    let content = match data.get("content") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => {
            return Err(RuntimeError::invalid(
                format!("{field}.content"),
                "is required",
            ));
        }
    };
    let is_error = data
        .get("is_error")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Ok(Some(ToolResult {
        call_id,
        content,
        is_error,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(tools: serde_json::Value) -> prost_types::Struct {
        let prost_types::Value {
            kind: Some(Kind::StructValue(s)),
        } = from_json(&serde_json::json!({ EXTRA_TOOLS_KEY: tools }))
        else {
            panic!("a struct")
        };
        s
    }

    #[test]
    fn tools_come_from_the_metadata_list() {
        let m = metadata(serde_json::json!([
            {"name": "lookup", "description": "finds", "parameters": {"type": "object"}},
            {"name": "bare"}
        ]));
        let tools = extra_tools(Some(&m)).unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].name, "lookup");
        assert_eq!(tools[1].parameters["type"], "object");
        assert!(extra_tools(None).unwrap().is_empty());
        for bad in [
            serde_json::json!("lookup"),
            serde_json::json!([{"description": "no name"}]),
            serde_json::json!([{"name": "x", "parameters": "not an object"}]),
        ] {
            assert!(matches!(
                extra_tools(Some(&metadata(bad))),
                Err(RuntimeError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn a_result_is_a_data_part_with_call_id_and_content() {
        let part = |v: serde_json::Value| a2a::Part {
            content: Some(a2a::part::Content::Data(from_json(&v))),
            ..Default::default()
        };
        let message = |v| a2a::Message {
            parts: vec![part(v)],
            ..Default::default()
        };
        assert_eq!(
            tool_result(&message(
                serde_json::json!({"call_id": "c1", "content": "42"})
            ))
            .unwrap(),
            Some(ToolResult {
                call_id: "c1".into(),
                content: "42".into(),
                is_error: false
            })
        );
        let structured = tool_result(&message(
            serde_json::json!({"call_id": "c1", "content": {"n": 1}, "is_error": true}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (structured.content.as_str(), structured.is_error),
            ("{\"n\":1.0}", true)
        );
        assert!(tool_result(&message(serde_json::json!({"content": "x"}))).is_err());
        assert_eq!(tool_result(&a2a::Message::default()).unwrap(), None);
    }

    #[test]
    fn a_call_part_carries_the_parsed_arguments() {
        let Some(a2a::part::Content::Data(v)) = call_part("c1", "lookup", "{\"q\":\"x\"}").content
        else {
            panic!("a data part")
        };
        assert_eq!(
            to_json(&v),
            serde_json::json!({"tool_call": {"call_id": "c1", "name": "lookup", "arguments": {"q": "x"}}})
        );
    }
}
