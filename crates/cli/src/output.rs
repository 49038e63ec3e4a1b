//! Printing results: text for people, or JSON (one document per unary
//! result, one object per line for event streams) for scripts, in the
//! protobuf JSON mapping (see `json.rs`).
//!
//! Everything bound for stdout goes through [`outln!`] / [`out!`]: when
//! stdout is closed under us (`agentrt chat ... | head -c 10`) the command
//! ends quietly with exit code 0, as a filter in a pipe should, instead of
//! panicking.

use std::cell::Cell;
use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use agentrt_client::{ChatEvent, Event, proto};
use serde_json::{Value, json};

use crate::json;

/// Writes to stdout; a closed stdout ends the process with exit code 0.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| {
        if newline {
            stdout.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(err) = written {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("agentrt: cannot write the output: {err}");
        std::process::exit(1);
    }
}

/// Flushes stdout (a partial line of streamed text); a closed stdout ends
/// the process with exit code 0.
pub(crate) fn flush_stdout() {
    if let Err(err) = std::io::stdout().flush()
        && err.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// Where and how results go.
#[derive(Debug, Clone)]
pub(crate) struct Out {
    pub(crate) json: bool,
    /// Stdout is a terminal: reasoning goes there, dimmed; otherwise it
    /// goes to stderr, so stdout carries the answer alone.
    terminal: bool,
    reasoning: bool,
    /// The last thing printed was reasoning (a line break is due before
    /// the answer).
    in_reasoning: Cell<bool>,
}

fn role(r: i32) -> String {
    proto::Role::try_from(r)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("ROLE_")
        .to_lowercase()
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

/// `rows` in columns two spaces apart (the last one unpadded).
fn table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        outln!("{}", line.trim_end());
    }
}

/// A time as its distance from now: `12s ago`, `in 9s`; `-` when unset.
fn when(at: Option<&prost_types::Timestamp>) -> String {
    let Some(at) = at.and_then(|t| std::time::SystemTime::try_from(*t).ok()) else {
        return "-".to_owned();
    };
    let now = std::time::SystemTime::now();
    match now.duration_since(at) {
        Ok(ago) => format!("{} ago", short(ago)),
        Err(ahead) => format!("in {}", short(ahead.duration())),
    }
}

/// `850ms`, `12s`, `5m`, `3h`, `2d`.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

fn print_json(v: &Value) {
    outln!("{v}");
}

impl Out {
    pub(crate) fn new(json: bool) -> Self {
        Self {
            json,
            terminal: std::io::stdout().is_terminal(),
            reasoning: true,
            in_reasoning: Cell::new(false),
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
            print_json(&json::of(s));
        } else {
            outln!("{}", s.session_id);
        }
    }

    pub(crate) fn session(&self, s: &proto::Session) {
        if self.json {
            print_json(&json::of(s));
            return;
        }
        outln!("session   {}", s.session_id);
        outln!("title     {}", s.title);
        if !s.agent_id.is_empty() {
            match s.agent_version {
                0 => outln!("agent     {} (latest)", s.agent_id),
                v => outln!("agent     {} v{v}", s.agent_id),
            }
        }
        if !s.parent_session_id.is_empty() {
            outln!("parent    {}", s.parent_session_id);
        }
        outln!(
            "model     {}",
            if s.model.is_empty() {
                "(default)"
            } else {
                &s.model
            }
        );
        if !s.system_prompt.is_empty() {
            outln!("system    {}", s.system_prompt);
        }
        outln!("messages  {}", s.message_count);
        outln!("archived  {}", s.archived);
    }

    pub(crate) fn sessions(&self, sessions: &[proto::Session]) {
        if self.json {
            print_json(&json!({"sessions": json::list(sessions)}));
            return;
        }
        for s in sessions {
            outln!(
                "{}\t{} messages\t{}",
                s.session_id,
                s.message_count,
                s.title
            );
        }
    }

    pub(crate) fn deleted(&self, session: &str, deleted: bool) {
        if self.json {
            print_json(&json!({"session_id": session, "deleted": deleted}));
        } else if deleted {
            outln!("deleted {session}");
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
            outln!("stopped the live turn of {session}");
        } else {
            outln!("nothing was running in {session}");
        }
        if cleared > 0 {
            outln!("took {cleared} queued message(s) out of its inbox");
        }
    }

    pub(crate) fn status(&self, session: &str, s: &proto::SessionStatus) {
        if self.json {
            let mut v = json::of(s);
            v["session_id"] = json!(session);
            print_json(&v);
            return;
        }
        if s.live {
            outln!(
                "{session}: turn {} live, phase {}, {} watcher(s)",
                s.turn_id,
                s.phase,
                s.watcher_count
            );
        } else if !s.paused_turn_id.is_empty() {
            outln!(
                "{session}: turn {} paused, waiting for its pending calls",
                s.paused_turn_id
            );
        } else {
            outln!("{session}: idle");
        }
        for c in &s.pending_calls {
            let how = match c.wait() {
                proto::PendingCallWait::Approval => "an approval; decide it with `agentrt approve`",
                proto::PendingCallWait::Result | proto::PendingCallWait::Unspecified => {
                    "its result; answer it with `agentrt tool-result`"
                }
            };
            outln!(
                "  waits for tool call {} {}({}): {how}",
                c.call_id,
                c.tool_name,
                c.arguments_json
            );
        }
        if s.steering > 0 {
            outln!(
                "  {} steering message(s) wait for its next step",
                s.steering
            );
        }
        for (i, q) in s.queued.iter().enumerate() {
            outln!("  queued #{}: {} (runs as turn {})", i + 1, q.id, q.id);
        }
    }

    pub(crate) fn compacted(&self, session: &str, c: &proto::CompactSessionResponse) {
        if self.json {
            let mut v = json::of(c);
            v["session_id"] = json!(session);
            print_json(&v);
        } else if c.compacted {
            outln!(
                "compacted {} messages: ~{} -> ~{} tokens (summary #{})",
                c.messages_compacted,
                c.tokens_before,
                c.tokens_after,
                c.summary_seq
            );
        } else {
            outln!("nothing to compact in {session}");
        }
    }

    pub(crate) fn tool_result(&self, session: &str, call: &str) {
        if self.json {
            print_json(&json!({"session_id": session, "call_id": call, "submitted": true}));
        } else {
            outln!("submitted the result of {call}");
        }
    }

    pub(crate) fn approval(&self, session: &str, call: &str, approved: bool) {
        if self.json {
            print_json(&json!({"session_id": session, "call_id": call, "approved": approved}));
        } else if approved {
            outln!("approved {call}");
        } else {
            outln!("denied {call}");
        }
    }

    pub(crate) fn history(&self, session: &str, messages: &[proto::Message], next: &str) {
        if self.json {
            print_json(&json!({
                "session_id": session,
                "messages": json::list(messages),
                "next_page_token": next,
            }));
            return;
        }
        for m in messages {
            outln!("#{} {}: {}", m.seq, author(m), message_text(m));
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
                "turns": json::list(turns),
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
            outln!(
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
                "session": json::of(s),
                "messages": json::list(messages),
            }));
            return;
        }
        self.session(s);
        outln!();
        for m in messages {
            outln!("#{} {}: {}", m.seq, author(m), message_text(m));
        }
    }

    pub(crate) fn stats(&self, s: &proto::RuntimeStats) {
        let uptime = s
            .uptime
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        if self.json {
            print_json(&json::of(s));
            return;
        }
        outln!("version         {}", s.version);
        outln!("uptime          {}s", uptime.as_secs());
        outln!("live turns      {}", s.live_turns);
        outln!("cached runners  {}", s.cached_runners);
        outln!("watchers        {}", s.watchers);
        outln!("sessions        {}", s.sessions_stored);
        outln!("default model   {}", s.default_model);
        outln!("draining        {}", s.draining);
    }

    pub(crate) fn drained(&self, remaining: u32) {
        if self.json {
            print_json(&json!({"drained": remaining == 0, "remaining": remaining}));
        } else if remaining == 0 {
            outln!("drained: no live turns; new turns are refused");
        } else {
            outln!("{remaining} turn(s) still live; new turns are refused");
        }
    }

    pub(crate) fn undrained(&self, was_draining: bool) {
        if self.json {
            print_json(&json!({"was_draining": was_draining}));
        } else if was_draining {
            outln!("undrained: new turns are admitted again");
        } else {
            outln!("not draining: new turns were already admitted");
        }
    }

    pub(crate) fn default_model(&self, model: &str, previous: &str) {
        if self.json {
            print_json(&json!({"model": model, "previous_model": previous}));
        } else {
            outln!("default model {model} (was {previous})");
        }
    }

    pub(crate) fn invalidated(&self, count: u32) {
        if self.json {
            print_json(&json!({"invalidated": count}));
        } else {
            outln!("{count} runner(s) will be rebuilt before their next turn");
        }
    }

    /// `health`: each service asked and what it reports.
    pub(crate) fn health(&self, reports: &[(String, agentrt_client::Health)]) {
        if self.json {
            let map: serde_json::Map<String, Value> = reports
                .iter()
                .map(|(name, h)| (name.clone(), json!(h.as_str())))
                .collect();
            print_json(&Value::Object(map));
            return;
        }
        for (name, h) in reports {
            let name = if name.is_empty() { "(server)" } else { name };
            outln!("{name:<10} {}", h.as_str());
        }
    }

    /// `version`: this client's and, when it answered, the server's.
    pub(crate) fn version(&self, server: Option<&str>, why_not: Option<&str>) {
        let client = env!("CARGO_PKG_VERSION");
        if self.json {
            print_json(&json!({"client": client, "server": server}));
            return;
        }
        outln!("client  {client}");
        match (server, why_not) {
            (Some(v), _) => outln!("server  {v}"),
            (None, Some(why)) => outln!("server  unknown ({why})"),
            (None, None) => outln!("server  unknown"),
        }
    }

    pub(crate) fn reset(&self, count: u32) {
        if self.json {
            print_json(&json!({"reset": count}));
        } else {
            outln!("closed {count} runner(s)");
        }
    }

    pub(crate) fn user_usage(&self, u: &proto::UserUsage) {
        let tokens = u.usage.unwrap_or_default();
        if self.json {
            print_json(&json::of(u));
        } else {
            outln!(
                "{}: {} session(s), tokens in={} out={}, ${:.6}",
                u.user_id,
                u.sessions,
                tokens.input_tokens,
                tokens.output_tokens,
                u.cost
            );
        }
    }

    pub(crate) fn replicas(
        &self,
        replicas: &[proto::Replica],
        leases: &[proto::ReplicaLease],
        next: &str,
    ) {
        if self.json {
            print_json(&json!({
                "replicas": json::list(replicas),
                "leases": json::list(leases),
                "next_page_token": next,
            }));
            return;
        }
        let mut rows = vec![
            [
                "REPLICA",
                "ADDRESS",
                "STARTED",
                "HEARTBEAT",
                "LIVE",
                "LEASES",
            ]
            .map(str::to_owned),
        ];
        for r in replicas {
            let mut id = if r.replica_id.is_empty() {
                "(single process)".to_owned()
            } else {
                r.replica_id.clone()
            };
            if r.this_replica {
                id.push_str(" *");
            }
            let held = leases
                .iter()
                .filter(|l| l.replica_id == r.replica_id)
                .count();
            rows.push([
                id,
                if r.address.is_empty() {
                    "-".to_owned()
                } else {
                    r.address.clone()
                },
                when(r.started_at.as_ref()),
                when(r.heartbeat_at.as_ref()),
                if r.live { "yes" } else { "no" }.to_owned(),
                held.to_string(),
            ]);
        }
        table(&rows);
        if !leases.is_empty() {
            outln!();
            let mut rows = vec![
                ["SESSION", "OWNER", "TURN", "REPLICA", "STARTED", "EXPIRES"].map(str::to_owned),
            ];
            for l in leases {
                rows.push([
                    l.session_id.clone(),
                    l.owner.clone(),
                    l.turn_id.clone(),
                    if l.replica_id.is_empty() {
                        "-".to_owned()
                    } else {
                        l.replica_id.clone()
                    },
                    when(l.started_at.as_ref()),
                    when(l.expires_at.as_ref()),
                ]);
            }
            table(&rows);
        }
        if !next.is_empty() {
            eprintln!("(more: --page-token {next})");
        }
    }

    pub(crate) fn agents(&self, agents: &[proto::Agent]) {
        if self.json {
            print_json(&json::list(agents));
            return;
        }
        for a in agents {
            let spec = a.spec.clone().unwrap_or_default();
            outln!("{}  v{}  {}", a.agent_id, a.version, spec.description);
        }
    }

    pub(crate) fn agent(&self, a: &proto::Agent) {
        if self.json {
            print_json(&json::of(a));
            return;
        }
        let spec = a.spec.clone().unwrap_or_default();
        let source = a.source().as_str_name().trim_start_matches("AGENT_SOURCE_");
        outln!(
            "agent        {} (version {}, {})",
            a.agent_id,
            a.version,
            source.to_lowercase()
        );
        outln!("description  {}", spec.description);
        outln!(
            "model        {}",
            if spec.model.is_empty() {
                "(server default)"
            } else {
                &spec.model
            }
        );
        match &spec.tools {
            None => outln!("tools        (every server tool)"),
            Some(t) => outln!("tools        {}", t.names.join(", ")),
        }
        if !spec.delegates.is_empty() {
            outln!("delegates    {}", spec.delegates.join(", "));
        }
        outln!("system prompt:\n{}", spec.system_prompt);
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
            outln!("no memory for agent {agent} (version {version})");
        }
        for (name, text) in sorted {
            outln!("[{name}]\n{text}");
        }
    }

    /// Ends a partly written text line before an error message.
    pub(crate) fn end_line(&self) {
        self.end_reasoning();
        if !self.json {
            outln!();
        }
    }

    /// A blob written to `path` by `blob get`.
    pub(crate) fn blob_saved(&self, blob: &proto::BlobRef, path: &std::path::Path) {
        if self.json {
            print_json(&json!({"blob": json::of(blob), "path": path.display().to_string()}));
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
            print_json(&json!({"blobs": json::list(blobs)}));
            return;
        }
        for b in blobs {
            outln!(
                "{}  {}",
                b.blob_id,
                describe_blob(&b.name, &b.mime_type, b.size)
            );
        }
    }

    /// A blob `blob put` uploaded.
    pub(crate) fn blob_uploaded(&self, blob: &proto::BlobRef) {
        if self.json {
            print_json(&json::of(blob));
        } else {
            outln!("{}", blob.blob_id);
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
            print_json(&json::event(e.proto()));
            return;
        }
        match &e.kind {
            ChatEvent::Text(t) => {
                self.end_reasoning();
                out!("{t}");
            }
            ChatEvent::Reasoning(t) if self.reasoning => {
                self.in_reasoning.set(true);
                if self.terminal {
                    out!("\x1b[2m{t}\x1b[0m");
                } else {
                    // Never on stdout when it is a pipe or file: that
                    // carries the answer alone.
                    eprint!("{t}");
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
                self.end_reasoning();
                outln!();
                eprintln!(
                    "[{} · {} in / {} out tokens]",
                    outcome.as_str_name().trim_start_matches("TURN_OUTCOME_"),
                    usage.input_tokens,
                    usage.output_tokens
                );
            }
            _ => {}
        }
        flush_stdout();
    }

    /// Ends the reasoning printed last with a line break, so that the
    /// answer starts on a line of its own.
    fn end_reasoning(&self) {
        if self.in_reasoning.replace(false) {
            if self.terminal {
                outln!();
            } else {
                eprintln!();
            }
        }
    }
}
