//! Printing results: text for people, or JSON (one document per unary
//! result, one object per line for event streams) for scripts.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentrt_client::{ChatEvent, Event, proto};
use serde_json::{Value, json};

/// Where and how results go.
#[derive(Debug, Clone)]
pub(crate) struct Out {
    pub(crate) json: bool,
    /// ANSI dim for reasoning (stdout is a terminal).
    dim: bool,
    reasoning: bool,
}

fn timestamp(t: Option<&prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => json!({"seconds": t.seconds, "nanos": t.nanos}),
        None => Value::Null,
    }
}

fn time(t: Option<SystemTime>) -> Value {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(Value::Null, |d| json!(d.as_secs_f64()))
}

fn role(r: i32) -> String {
    proto::Role::try_from(r)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("ROLE_")
        .to_lowercase()
}

fn usage(u: &proto::Usage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "reasoning_tokens": u.reasoning_tokens,
        "cached_input_tokens": u.cached_input_tokens,
    })
}

fn session_json(s: &proto::Session) -> Value {
    json!({
        "session_id": s.session_id,
        "owner": s.owner,
        "agent_id": s.agent_id,
        "agent_version": s.agent_version,
        "parent_session_id": s.parent_session_id,
        "project_id": s.project_id,
        "title": s.title,
        "model": s.model,
        "system_prompt": s.system_prompt,
        "metadata": s.metadata,
        "created_at": timestamp(s.created_at.as_ref()),
        "last_active_at": timestamp(s.last_active_at.as_ref()),
        "archived": s.archived,
        "message_count": s.message_count,
    })
}

fn block_json(b: &proto::ContentBlock) -> Value {
    use proto::content_block::Block;
    match &b.block {
        Some(Block::Text(t)) => json!({"type": "text", "text": t.text}),
        Some(Block::Thinking(t)) => json!({"type": "thinking", "thinking": t.thinking}),
        Some(Block::Image(i)) => json!({
            "type": "image", "mime_type": i.mime_type, "blob_id": i.blob_id,
            "size": i.size, "name": i.name
        }),
        Some(Block::File(f)) => json!({
            "type": "file", "mime_type": f.mime_type, "blob_id": f.blob_id,
            "size": f.size, "name": f.name
        }),
        Some(Block::ToolCall(c)) => json!({
            "type": "tool_call", "id": c.id, "name": c.name, "arguments_json": c.arguments_json
        }),
        Some(Block::ToolResult(r)) => json!({
            "type": "tool_result", "call_id": r.call_id, "content": r.content, "is_error": r.is_error,
            "media": r.media.iter().map(blob_json).collect::<Vec<_>>()
        }),
        None => json!({"type": "unknown"}),
    }
}

fn blob_json(b: &proto::BlobRef) -> Value {
    json!({
        "blob_id": b.blob_id,
        "kind": b.kind().as_str_name().trim_start_matches("MEDIA_KIND_").to_lowercase(),
        "mime_type": b.mime_type,
        "size": b.size,
        "name": b.name,
    })
}

fn reference_json(r: &proto::Reference) -> Value {
    json!({
        "kind": r.kind, "id": r.id, "uri": r.uri, "title": r.title,
        "preview": r.preview, "mime_type": r.mime_type, "intent": r.intent,
    })
}

/// "cat.png (image/png, 12 KB)".
fn describe_blob(name: &str, mime_type: &str, size: u64) -> String {
    let size = if size < 1024 {
        format!("{size} B")
    } else if size < 1 << 20 {
        format!("{} KB", size.div_ceil(1024))
    } else {
        format!(
            "{}.{} MB",
            size >> 20,
            ((size & ((1 << 20) - 1)) * 10) >> 20
        )
    };
    if name.is_empty() {
        format!("{mime_type}, {size}")
    } else {
        format!("{name} ({mime_type}, {size})")
    }
}

fn message_json(m: &proto::Message) -> Value {
    let mut out = json!({
        "seq": m.seq,
        "id": m.id,
        "role": role(m.role),
        "turn_id": m.turn_id,
        "compacted": m.compacted,
        "content": m.content.iter().map(block_json).collect::<Vec<_>>(),
    });
    if let Some(s) = &m.speaker {
        out["speaker"] = json!({"id": s.id, "display_name": s.display_name});
    }
    if let Some(a) = &m.input_actor {
        out["input_actor"] = json!({"kind": actor_kind(a.kind), "id": a.id, "admin": a.admin});
    }
    out
}

fn actor_kind(k: i32) -> String {
    proto::InputActorKind::try_from(k)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("INPUT_ACTOR_KIND_")
        .to_lowercase()
}

/// `user`, or `user Alice` for a message with a speaker.
fn author(m: &proto::Message) -> String {
    match &m.speaker {
        Some(s) if s.display_name.is_empty() => format!("{} {}", role(m.role), s.id),
        Some(s) => format!("{} {}", role(m.role), s.display_name),
        None => role(m.role),
    }
}

fn outcome(o: i32) -> String {
    proto::TurnOutcome::try_from(o)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("TURN_OUTCOME_")
        .to_lowercase()
}

fn turn_json(t: &proto::Turn) -> Value {
    json!({
        "turn_id": t.turn_id,
        "request_id": t.request_id,
        "outcome": outcome(t.outcome),
        "cancel_reason": t.cancel_reason,
        "user_message_seq": t.user_message_seq,
        "started_at": timestamp(t.started_at.as_ref()),
        "finished_at": timestamp(t.finished_at.as_ref()),
        "model": t.model,
        "steps": t.steps,
        "usage": t.usage.as_ref().map(usage),
        "cost": t.cost,
        "error": t.error,
    })
}

/// A message in one line of text.
fn message_text(m: &proto::Message) -> String {
    use proto::content_block::Block;
    m.content
        .iter()
        .filter_map(|b| match &b.block {
            Some(Block::Text(t)) => Some(t.text.clone()),
            Some(Block::Thinking(t)) => Some(format!("(thinking: {})", t.thinking)),
            Some(Block::Image(i)) => Some(format!(
                "[image {}]",
                describe_blob(&i.name, &i.mime_type, i.size)
            )),
            Some(Block::File(f)) => Some(format!(
                "[file {}]",
                describe_blob(&f.name, &f.mime_type, f.size)
            )),
            Some(Block::ToolCall(c)) => {
                Some(format!("[tool call {} {}]", c.name, c.arguments_json))
            }
            Some(Block::ToolResult(r)) => Some(format!("[tool result {}]", r.content)),
            None => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn event_json(e: &Event) -> Value {
    let (kind, data) = match &e.kind {
        ChatEvent::TurnStarted(t) => (
            "turn_started",
            json!({"model": t.model, "user_message_seq": t.user_message_seq,
                   "system_overridden": t.system_overridden}),
        ),
        ChatEvent::Text(t) => ("text", json!({"text": t})),
        ChatEvent::Reasoning(t) => ("reasoning", json!({"text": t})),
        ChatEvent::Step { kind, index } => (
            "step",
            json!({"kind": kind.as_str_name().trim_start_matches("STEP_KIND_"), "index": index}),
        ),
        ChatEvent::MessageStored { seq, id, role } => (
            "message_stored",
            json!({"message_seq": seq, "message_id": id, "role": self::role(*role as i32)}),
        ),
        ChatEvent::Usage { usage, model } => (
            "usage",
            json!({"usage": self::usage(usage), "model": model}),
        ),
        ChatEvent::Error { code, message } => (
            "error",
            json!({"code": code.as_str_name().trim_start_matches("ERROR_CODE_"), "message": message}),
        ),
        ChatEvent::Heartbeat { phase, tool_name } => {
            ("heartbeat", json!({"phase": phase, "tool_name": tool_name}))
        }
        ChatEvent::ToolUse(t) => (
            "tool_use",
            json!({"call_id": t.call_id, "name": t.tool_name,
                   "status": t.status().as_str_name().trim_start_matches("TOOL_STATUS_")}),
        ),
        ChatEvent::ToolCall {
            call_id,
            name,
            arguments_json,
        } => (
            "tool_call",
            json!({"call_id": call_id, "name": name, "arguments_json": arguments_json}),
        ),
        ChatEvent::ApprovalRequired {
            call_id,
            name,
            arguments_json,
        } => (
            "approval_required",
            json!({"call_id": call_id, "name": name, "arguments_json": arguments_json}),
        ),
        ChatEvent::Compaction(c) => (
            "compaction",
            json!({"status": c.status().as_str_name().trim_start_matches("COMPACTION_STATUS_")}),
        ),
        ChatEvent::Image(i) => (
            "image",
            json!({"call_id": i.call_id, "blob": i.blob.as_ref().map(blob_json),
                   "inline_bytes": i.data.len()}),
        ),
        ChatEvent::File(f) => (
            "file",
            json!({"call_id": f.call_id, "blob": f.blob.as_ref().map(blob_json),
                   "uri": f.uri, "inline_bytes": f.data.len()}),
        ),
        ChatEvent::References(r) => (
            "references",
            json!({"call_id": r.call_id,
                   "references": r.references.iter().map(reference_json).collect::<Vec<_>>()}),
        ),
        ChatEvent::Notice { code, message } => {
            ("notice", json!({"code": code, "message": message}))
        }
        ChatEvent::Queued { position } => ("queued", json!({"position": position})),
        ChatEvent::Steered { message_seq } => ("steered", json!({"message_seq": message_seq})),
        ChatEvent::ReplayGap {
            first_available_seq,
            lagged,
        } => (
            "replay_gap",
            json!({"first_available_seq": first_available_seq, "lagged": lagged}),
        ),
        ChatEvent::TurnFinished {
            outcome,
            cancel_reason,
            usage,
            duration,
        } => (
            "turn_finished",
            json!({
                "outcome": outcome.as_str_name().trim_start_matches("TURN_OUTCOME_"),
                "cancel_reason": cancel_reason.as_str_name().trim_start_matches("CANCEL_REASON_"),
                "usage": self::usage(usage),
                "duration_ms": duration.as_millis() as u64,
            }),
        ),
        // A kind newer than this build.
        _ => ("unknown", json!({})),
    };
    json!({
        "type": kind,
        "session_id": e.session_id,
        "turn_id": e.turn_id,
        "seq": e.seq,
        "at": time(e.at),
        "data": data,
    })
}

fn agent_json(a: &proto::Agent) -> Value {
    let spec = a.spec.clone().unwrap_or_default();
    json!({
        "agent_id": a.agent_id,
        "version": a.version,
        "source": a.source().as_str_name().trim_start_matches("AGENT_SOURCE_"),
        "created_at": timestamp(a.created_at.as_ref()),
        "description": spec.description,
        "system_prompt": spec.system_prompt,
        "model": spec.model,
        "tools": spec.tools.map(|t| t.names),
        "delegates": spec.delegates,
        "max_steps": spec.max_steps,
    })
}

fn print_json(v: &Value) {
    println!("{v}");
}

impl Out {
    pub(crate) fn new(json: bool) -> Self {
        Self {
            json,
            dim: std::io::stdout().is_terminal(),
            reasoning: true,
        }
    }

    pub(crate) fn with_reasoning(&self, show: bool) -> Self {
        Self {
            reasoning: show,
            ..self.clone()
        }
    }

    pub(crate) fn session_id(&self, s: &proto::Session) {
        if self.json {
            print_json(&session_json(s));
        } else {
            println!("{}", s.session_id);
        }
    }

    pub(crate) fn session(&self, s: &proto::Session) {
        if self.json {
            print_json(&session_json(s));
            return;
        }
        println!("session   {}", s.session_id);
        println!("title     {}", s.title);
        if !s.agent_id.is_empty() {
            match s.agent_version {
                0 => println!("agent     {} (latest)", s.agent_id),
                v => println!("agent     {} v{v}", s.agent_id),
            }
        }
        if !s.parent_session_id.is_empty() {
            println!("parent    {}", s.parent_session_id);
        }
        println!(
            "model     {}",
            if s.model.is_empty() {
                "(default)"
            } else {
                &s.model
            }
        );
        if !s.system_prompt.is_empty() {
            println!("system    {}", s.system_prompt);
        }
        println!("messages  {}", s.message_count);
        println!("archived  {}", s.archived);
    }

    pub(crate) fn sessions(&self, sessions: &[proto::Session]) {
        if self.json {
            print_json(&json!({"sessions": sessions.iter().map(session_json).collect::<Vec<_>>()}));
            return;
        }
        for s in sessions {
            println!(
                "{}\t{} messages\t{}",
                s.session_id, s.message_count, s.title
            );
        }
    }

    pub(crate) fn deleted(&self, session: &str, deleted: bool) {
        if self.json {
            print_json(&json!({"session_id": session, "deleted": deleted}));
        } else if deleted {
            println!("deleted {session}");
        }
    }

    pub(crate) fn created(&self, session: &str) {
        if self.json {
            print_json(&json!({"type": "session_created", "session_id": session}));
        } else {
            eprintln!("session {session}");
        }
    }

    pub(crate) fn stopped(&self, session: &str, stopped: bool, cleared: u64) {
        if self.json {
            print_json(&json!({"session_id": session, "stopped": stopped, "cleared": cleared}));
            return;
        }
        if stopped {
            println!("stopped the live turn of {session}");
        } else {
            println!("nothing was running in {session}");
        }
        if cleared > 0 {
            println!("took {cleared} queued message(s) out of its inbox");
        }
    }

    pub(crate) fn status(&self, session: &str, s: &proto::SessionStatus) {
        if self.json {
            print_json(&json!({
                "session_id": session,
                "live": s.live,
                "turn_id": s.turn_id,
                "phase": s.phase,
                "started_at": timestamp(s.started_at.as_ref()),
                "watcher_count": s.watcher_count,
                "steering": s.steering,
                "paused_turn_id": s.paused_turn_id,
                "pending_calls": s.pending_calls.iter().map(|c| json!({
                    "call_id": c.call_id,
                    "tool_name": c.tool_name,
                    "arguments_json": c.arguments_json,
                    "wait": c.wait().as_str_name().trim_start_matches("PENDING_CALL_WAIT_"),
                })).collect::<Vec<_>>(),
                "queued": s.queued.iter().map(|q| json!({
                    "id": q.id,
                    "enqueued_at": timestamp(q.enqueued_at.as_ref()),
                    "request_id": q.request_id,
                    "model": q.model,
                })).collect::<Vec<_>>(),
            }));
            return;
        }
        if s.live {
            println!(
                "{session}: turn {} live, phase {}, {} watcher(s)",
                s.turn_id, s.phase, s.watcher_count
            );
        } else if !s.paused_turn_id.is_empty() {
            println!(
                "{session}: turn {} paused, waiting for its pending calls",
                s.paused_turn_id
            );
        } else {
            println!("{session}: idle");
        }
        for c in &s.pending_calls {
            let how = match c.wait() {
                proto::PendingCallWait::Approval => "an approval; decide it with `agentrt approve`",
                proto::PendingCallWait::Result | proto::PendingCallWait::Unspecified => {
                    "its result; answer it with `agentrt tool-result`"
                }
            };
            println!(
                "  waits for tool call {} {}({}): {how}",
                c.call_id, c.tool_name, c.arguments_json
            );
        }
        if s.steering > 0 {
            println!(
                "  {} steering message(s) wait for its next step",
                s.steering
            );
        }
        for (i, q) in s.queued.iter().enumerate() {
            println!("  queued #{}: {} (runs as turn {})", i + 1, q.id, q.id);
        }
    }

    pub(crate) fn compacted(&self, session: &str, c: &proto::CompactSessionResponse) {
        if self.json {
            print_json(&json!({
                "session_id": session,
                "compacted": c.compacted,
                "tokens_before": c.tokens_before,
                "tokens_after": c.tokens_after,
                "summary_seq": c.summary_seq,
                "messages_compacted": c.messages_compacted,
            }));
        } else if c.compacted {
            println!(
                "compacted {} messages: ~{} -> ~{} tokens (summary #{})",
                c.messages_compacted, c.tokens_before, c.tokens_after, c.summary_seq
            );
        } else {
            println!("nothing to compact in {session}");
        }
    }

    pub(crate) fn tool_result(&self, session: &str, call: &str) {
        if self.json {
            print_json(&json!({"session_id": session, "call_id": call, "submitted": true}));
        } else {
            println!("submitted the result of {call}");
        }
    }

    pub(crate) fn approval(&self, session: &str, call: &str, approved: bool) {
        if self.json {
            print_json(&json!({"session_id": session, "call_id": call, "approved": approved}));
        } else if approved {
            println!("approved {call}");
        } else {
            println!("denied {call}");
        }
    }

    pub(crate) fn history(&self, session: &str, messages: &[proto::Message], next: &str) {
        if self.json {
            print_json(&json!({
                "session_id": session,
                "messages": messages.iter().map(message_json).collect::<Vec<_>>(),
                "next_page_token": next,
            }));
            return;
        }
        for m in messages {
            println!("#{} {}: {}", m.seq, author(m), message_text(m));
        }
        if !next.is_empty() {
            eprintln!(
                "(more: --after-seq {})",
                messages.last().map_or(0, |m| m.seq)
            );
        }
    }

    pub(crate) fn turns(&self, session: &str, turns: &[proto::Turn], next: &str) {
        if self.json {
            print_json(&json!({
                "session_id": session,
                "turns": turns.iter().map(turn_json).collect::<Vec<_>>(),
                "next_page_token": next,
            }));
            return;
        }
        for t in turns {
            let u = t.usage.unwrap_or_default();
            let cost = t.cost.map_or(String::new(), |c| format!(" ${c:.6}"));
            let error = if t.error.is_empty() {
                String::new()
            } else {
                format!(" error: {}", t.error)
            };
            println!(
                "{} {} {} steps={} tokens in={} out={}{cost}{error}",
                t.turn_id,
                outcome(t.outcome),
                t.model,
                t.steps,
                u.input_tokens,
                u.output_tokens,
            );
        }
        if !next.is_empty() {
            eprintln!("(more: --page-token {next})");
        }
    }

    pub(crate) fn show(&self, s: &proto::Session, messages: &[proto::Message]) {
        if self.json {
            print_json(&json!({
                "session": session_json(s),
                "messages": messages.iter().map(message_json).collect::<Vec<_>>(),
            }));
            return;
        }
        self.session(s);
        println!();
        for m in messages {
            println!("#{} {}: {}", m.seq, author(m), message_text(m));
        }
    }

    pub(crate) fn stats(&self, s: &proto::RuntimeStats) {
        let uptime = s
            .uptime
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        if self.json {
            print_json(&json!({
                "live_turns": s.live_turns,
                "cached_runners": s.cached_runners,
                "watchers": s.watchers,
                "sessions_stored": s.sessions_stored,
                "uptime_seconds": uptime.as_secs_f64(),
                "version": s.version,
                "draining": s.draining,
                "default_model": s.default_model,
            }));
            return;
        }
        println!("version         {}", s.version);
        println!("uptime          {}s", uptime.as_secs());
        println!("live turns      {}", s.live_turns);
        println!("cached runners  {}", s.cached_runners);
        println!("watchers        {}", s.watchers);
        println!("sessions        {}", s.sessions_stored);
        println!("default model   {}", s.default_model);
        println!("draining        {}", s.draining);
    }

    pub(crate) fn drained(&self, remaining: u32) {
        if self.json {
            print_json(&json!({"drained": remaining == 0, "remaining": remaining}));
        } else if remaining == 0 {
            println!("drained: no live turns; new turns are refused");
        } else {
            println!("{remaining} turn(s) still live; new turns are refused");
        }
    }

    pub(crate) fn reset(&self, count: u32) {
        if self.json {
            print_json(&json!({"reset": count}));
        } else {
            println!("closed {count} runner(s)");
        }
    }

    pub(crate) fn user_usage(&self, u: &proto::UserUsage) {
        let tokens = u.usage.unwrap_or_default();
        if self.json {
            print_json(&json!({
                "user_id": u.user_id,
                "sessions": u.sessions,
                "usage": usage(&tokens),
                "cost": u.cost,
            }));
        } else {
            println!(
                "{}: {} session(s), tokens in={} out={}, ${:.6}",
                u.user_id, u.sessions, tokens.input_tokens, tokens.output_tokens, u.cost
            );
        }
    }

    pub(crate) fn agents(&self, agents: &[proto::Agent]) {
        if self.json {
            print_json(&Value::Array(agents.iter().map(agent_json).collect()));
            return;
        }
        for a in agents {
            let spec = a.spec.clone().unwrap_or_default();
            println!("{}  v{}  {}", a.agent_id, a.version, spec.description);
        }
    }

    pub(crate) fn agent(&self, a: &proto::Agent) {
        if self.json {
            print_json(&agent_json(a));
            return;
        }
        let spec = a.spec.clone().unwrap_or_default();
        let source = a.source().as_str_name().trim_start_matches("AGENT_SOURCE_");
        println!(
            "agent        {} (version {}, {})",
            a.agent_id,
            a.version,
            source.to_lowercase()
        );
        println!("description  {}", spec.description);
        println!(
            "model        {}",
            if spec.model.is_empty() {
                "(server default)"
            } else {
                &spec.model
            }
        );
        match &spec.tools {
            None => println!("tools        (every server tool)"),
            Some(t) => println!("tools        {}", t.names.join(", ")),
        }
        if !spec.delegates.is_empty() {
            println!("delegates    {}", spec.delegates.join(", "));
        }
        println!("system prompt:\n{}", spec.system_prompt);
    }

    pub(crate) fn memory(
        &self,
        agent: &str,
        blocks: &std::collections::HashMap<String, String>,
        version: u64,
    ) {
        let sorted: std::collections::BTreeMap<_, _> = blocks.iter().collect();
        if self.json {
            print_json(&json!({"agent_id": agent, "version": version, "blocks": sorted}));
            return;
        }
        if sorted.is_empty() {
            println!("no memory for agent {agent} (version {version})");
        }
        for (name, text) in sorted {
            println!("[{name}]\n{text}");
        }
    }

    /// Ends a partly written text line before an error message.
    pub(crate) fn end_line(&self) {
        if !self.json {
            println!();
        }
    }

    /// A blob written to `path` by `blob get`.
    pub(crate) fn blob_saved(&self, blob: &proto::BlobRef, path: &std::path::Path) {
        if self.json {
            print_json(&json!({"blob": blob_json(blob), "path": path.display().to_string()}));
        } else {
            eprintln!(
                "saved {} to {}",
                describe_blob(&blob.name, &blob.mime_type, blob.size),
                path.display()
            );
        }
    }

    /// A session's blobs (`blob list`): one per line, id then what it is.
    pub(crate) fn blobs(&self, blobs: &[proto::BlobRef]) {
        if self.json {
            print_json(&json!({"blobs": blobs.iter().map(blob_json).collect::<Vec<_>>()}));
            return;
        }
        for b in blobs {
            println!(
                "{}  {}",
                b.blob_id,
                describe_blob(&b.name, &b.mime_type, b.size)
            );
        }
    }

    /// A blob `blob put` uploaded.
    pub(crate) fn blob_uploaded(&self, blob: &proto::BlobRef) {
        if self.json {
            print_json(&blob_json(blob));
        } else {
            println!("{}", blob.blob_id);
            eprintln!(
                "uploaded {}",
                describe_blob(&blob.name, &blob.mime_type, blob.size)
            );
        }
    }

    /// A tool's image or file saved by `chat --save-dir`.
    pub(crate) fn saved(&self, path: &std::path::Path) {
        if !self.json {
            eprintln!("[saved {}]", path.display());
        }
    }

    pub(crate) fn event(&self, e: &Event) {
        if self.json {
            print_json(&event_json(e));
            return;
        }
        let mut stdout = std::io::stdout();
        match &e.kind {
            ChatEvent::Text(t) => {
                print!("{t}");
            }
            ChatEvent::Reasoning(t) if self.reasoning => {
                if self.dim {
                    print!("\x1b[2m{t}\x1b[0m");
                } else {
                    print!("{t}");
                }
            }
            ChatEvent::ToolUse(t) => {
                let status = t.status().as_str_name().trim_start_matches("TOOL_STATUS_");
                eprintln!("\n[tool {} {}]", t.tool_name, status.to_lowercase());
            }
            ChatEvent::ToolCall {
                call_id,
                name,
                arguments_json,
            } => {
                eprintln!(
                    "\n[tool call {name}({arguments_json}); answer it with `agentrt tool-result \
                     {} --turn {} --call {call_id} RESULT`]",
                    e.session_id, e.turn_id
                );
            }
            ChatEvent::ApprovalRequired {
                call_id,
                name,
                arguments_json,
            } => {
                eprintln!(
                    "\n[approval required: {name}({arguments_json}); decide it with `agentrt \
                     approve {} {call_id}` (or --deny)]",
                    e.session_id
                );
            }
            ChatEvent::Compaction(c) => {
                let status = c
                    .status()
                    .as_str_name()
                    .trim_start_matches("COMPACTION_STATUS_");
                eprintln!("[compaction {}]", status.to_lowercase());
            }
            ChatEvent::ReplayGap {
                first_available_seq,
                ..
            } => {
                eprintln!("[events missed; continuing at #{first_available_seq}]");
            }
            ChatEvent::Image(i) => {
                if let Some(b) = &i.blob {
                    eprintln!(
                        "\n[image {}; save it with `agentrt blob get {} {}`]",
                        describe_blob(&b.name, &b.mime_type, b.size),
                        e.session_id,
                        b.blob_id
                    );
                }
            }
            ChatEvent::File(f) => {
                if let Some(b) = &f.blob {
                    eprintln!(
                        "\n[file {}; save it with `agentrt blob get {} {}`]",
                        describe_blob(&b.name, &b.mime_type, b.size),
                        e.session_id,
                        b.blob_id
                    );
                }
            }
            ChatEvent::References(r) => {
                for reference in &r.references {
                    let what = if reference.uri.is_empty() {
                        &reference.id
                    } else {
                        &reference.uri
                    };
                    eprintln!("\n[reference {} <{what}>]", reference.title);
                }
            }
            ChatEvent::Notice { message, .. } => eprintln!("\n[notice: {message}]"),
            ChatEvent::Queued { position } => {
                eprintln!(
                    "[queued: #{position} in the session's inbox; runs as turn {}]",
                    e.turn_id
                );
            }
            ChatEvent::Steered { message_seq: 0 } => {
                eprintln!("[the live turn ended first: the message runs as a later turn]");
            }
            ChatEvent::Steered { message_seq } => {
                eprintln!("[joined the live turn as message #{message_seq}]");
            }
            ChatEvent::Error { message, .. } => eprintln!("\nerror: {message}"),
            ChatEvent::TurnFinished { outcome, usage, .. } => {
                println!();
                eprintln!(
                    "[{} · {} in / {} out tokens]",
                    outcome.as_str_name().trim_start_matches("TURN_OUTCOME_"),
                    usage.input_tokens,
                    usage.output_tokens
                );
            }
            _ => {}
        }
        let _ = stdout.flush();
    }
}
