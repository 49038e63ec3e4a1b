//! Typed turn events and the stream that yields them.

//!
//! [`EventStream`] yields [`Event`]s. An event whose kind this client does
//! not know (added to the protocol after it was built) arrives as
//! [`ChatEvent::Unknown`], never as an error, so a newer server never breaks
//! an older client's stream. A stream from [`crate::Client::chat`] with
//! [`crate::OnDisconnect::Continue`] resumes after a dropped connection
//! (see there).

use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::Stream;
use futures::stream::BoxStream;
use tonic::{Code, Status};

use crate::options::{ResumeNotice, ResumePolicy};
use crate::{Client, Error, proto};

/// What happened in a turn (the `kind` of `agentrt.v1.ChatEvent`).
/// Non-exhaustive: newer versions add kinds, so match with a `_` arm.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ChatEvent {
    /// First event: effective model and options, the stored user message.
    TurnStarted(proto::TurnStarted),
    /// Assistant text delta.
    Text(String),
    /// Reasoning delta.
    Reasoning(String),
    /// Model step boundary.
    Step {
        /// START or FINISH.
        kind: proto::StepKind,
        /// 1-based step index.
        index: u32,
    },
    /// A message was durably stored.
    MessageStored {
        /// Its per-session seq.
        seq: u64,
        /// Its id.
        id: String,
        /// Its role.
        role: proto::Role,
    },
    /// Usage of one model step.
    Usage {
        /// Token counts.
        usage: proto::Usage,
        /// The model.
        model: String,
    },
    /// The turn failed.
    Error {
        /// Status code of the cause.
        code: proto::ErrorCode,
        /// Message.
        message: String,
    },
    /// Keep-alive on a quiet stream, with what the turn is doing.
    Heartbeat {
        /// e.g. "model" or "tool".
        phase: String,
        /// The tool waited for, in phase "tool".
        tool_name: String,
    },
    /// Tool lifecycle (RUNNING, then DONE or ERROR).
    ToolUse(proto::ToolUse),
    /// A caller-executed tool call: answer it with
    /// [`crate::Client::submit_tool_result`].
    ToolCall {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// A server tool call that requires approval: decide it with
    /// [`crate::Client::submit_tool_approval`]; the turn waits (paused).
    ApprovalRequired {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// Compaction of the context before the first model step (STARTED,
    /// then COMPLETED or FAILED).
    Compaction(proto::Compaction),
    /// An image a tool returned (its bytes inline when small; otherwise
    /// read them with [`crate::Client::get_blob`]).
    Image(proto::ImageEvent),
    /// A file a tool returned or wrote.
    File(proto::FileEvent),
    /// Resources a tool cited.
    References(proto::ReferencesEvent),
    /// Something worth knowing that is not an error (e.g. media the model
    /// could not read).
    Notice {
        /// e.g. `MEDIA_NOT_SHOWN`.
        code: String,
        /// For a person.
        message: String,
    },
    /// The message was queued in the session's inbox
    /// ([`crate::OnBusy::Enqueue`]); its turn (the event's `turn_id`)
    /// follows once the turns before it ended.
    Queued {
        /// 1-based place in the inbox.
        position: u64,
    },
    /// The message joined the live turn ([`crate::OnBusy::Steer`]) as the
    /// user message with this seq; 0 when the turn ended first (a
    /// [`ChatEvent::Queued`] follows and it runs as a later turn).
    Steered {
        /// Seq of the stored user message.
        message_seq: u64,
    },
    /// (Subscribe) events were skipped; the next one has this seq.
    ReplayGap {
        /// Seq of the next event delivered.
        first_available_seq: u64,
        /// The watcher fell behind.
        lagged: bool,
    },
    /// Last event.
    TurnFinished {
        /// How it ended.
        outcome: proto::TurnOutcome,
        /// Why, when cancelled.
        cancel_reason: proto::CancelReason,
        /// Total usage.
        usage: proto::Usage,
        /// Wall time.
        duration: Duration,
    },
    /// An event of a kind this client does not know (a newer server's):
    /// its envelope is in the [`Event`]; skip it or log it.
    Unknown,
}

/// One event with its envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Session id.
    pub session_id: String,
    /// Turn id.
    pub turn_id: String,
    /// Per-turn sequence number (1, 2, ...).
    pub seq: u64,
    /// Server time of the event.
    pub at: Option<SystemTime>,
    /// What happened.
    pub kind: ChatEvent,
    /// The event as received.
    raw: proto::ChatEvent,
}

impl Event {
    /// The event as the server sent it (every field, including those of a
    /// kind this client does not know), e.g. to print it in the protobuf
    /// JSON mapping.
    pub fn proto(&self) -> &proto::ChatEvent {
        &self.raw
    }
}

fn enum_or<E: TryFrom<i32> + Default>(v: i32) -> E {
    E::try_from(v).unwrap_or_default()
}

impl From<proto::ChatEvent> for Event {
    fn from(e: proto::ChatEvent) -> Self {
        use proto::chat_event::Kind;
        let raw = e.clone();
        let kind = match e.kind {
            Some(Kind::TurnStarted(t)) => ChatEvent::TurnStarted(t),
            Some(Kind::Text(t)) => ChatEvent::Text(t.text),
            Some(Kind::Reasoning(t)) => ChatEvent::Reasoning(t.text),
            Some(Kind::Step(s)) => ChatEvent::Step {
                kind: enum_or(s.kind),
                index: s.index,
            },
            Some(Kind::MessageStored(m)) => ChatEvent::MessageStored {
                seq: m.message_seq,
                id: m.message_id,
                role: enum_or(m.role),
            },
            Some(Kind::Usage(u)) => ChatEvent::Usage {
                usage: u.usage.unwrap_or_default(),
                model: u.model,
            },
            Some(Kind::Error(err)) => ChatEvent::Error {
                code: enum_or(err.code),
                message: err.message,
            },
            Some(Kind::Heartbeat(h)) => ChatEvent::Heartbeat {
                phase: h.phase,
                tool_name: h.tool_name,
            },
            Some(Kind::ToolUse(t)) => ChatEvent::ToolUse(t),
            Some(Kind::ToolCall(c)) => ChatEvent::ToolCall {
                call_id: c.call_id,
                name: c.name,
                arguments_json: c.arguments_json,
            },
            Some(Kind::ApprovalRequired(a)) => ChatEvent::ApprovalRequired {
                call_id: a.call_id,
                name: a.name,
                arguments_json: a.arguments_json,
            },
            Some(Kind::Compaction(c)) => ChatEvent::Compaction(c),
            Some(Kind::Image(i)) => ChatEvent::Image(i),
            Some(Kind::File(f)) => ChatEvent::File(f),
            Some(Kind::References(r)) => ChatEvent::References(r),
            Some(Kind::Notice(n)) => ChatEvent::Notice {
                code: n.code,
                message: n.message,
            },
            Some(Kind::Queued(q)) => ChatEvent::Queued {
                position: q.position,
            },
            Some(Kind::Steered(s)) => ChatEvent::Steered {
                message_seq: s.message_seq,
            },
            Some(Kind::ReplayGap(g)) => ChatEvent::ReplayGap {
                first_available_seq: g.first_available_seq,
                lagged: g.lagged,
            },
            Some(Kind::TurnFinished(f)) => ChatEvent::TurnFinished {
                outcome: enum_or(f.outcome),
                cancel_reason: enum_or(f.cancel_reason),
                usage: f.usage.unwrap_or_default(),
                duration: f
                    .duration
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default(),
            },
            // prost decodes a oneof case it does not know as no case.
            None => ChatEvent::Unknown,
        };
        let at = e.at.and_then(|t| {
            let secs = u64::try_from(t.seconds).ok()?;
            let nanos = u32::try_from(t.nanos).ok()?;
            Some(UNIX_EPOCH + Duration::new(secs, nanos))
        });
        Self {
            session_id: e.session_id,
            turn_id: e.turn_id,
            seq: e.seq,
            at,
            kind,
            raw,
        }
    }
}

/// The events of one turn. Ends after `TurnFinished`; when the outcome is
/// not SUCCESS the trailing status follows as an `Err` (e.g.
/// [`Error::Cancelled`] for a stopped turn, [`Error::DeadlineExceeded`] for
/// a timed-out one).
///
/// A resuming stream (from [`Client::chat`] with
/// [`crate::OnDisconnect::Continue`]) survives a dropped connection: it
/// reconnects per its [`ResumePolicy`] and re-attaches with `Subscribe`
/// after the last seq it yielded while the turn is live, or — once the turn
/// has ended — re-sends the Chat with its `request_id`, which replays the
/// finished turn; every event is yielded once, in order. A replayed
/// finished turn has only its stored parts: the rest of the text and
/// reasoning (what was not yet seen), the `message_stored` events not yet
/// seen, the error and `turn_finished`, numbered on from the last seq seen;
/// steps, usage and tool progress of the missed part are not replayed.
pub struct EventStream {
    inner: BoxStream<'static, Result<Event, Error>>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

/// What a resuming stream needs to re-attach.
pub(crate) struct Attach {
    pub(crate) client: Client,
    /// The Chat to retry (none for a watch).
    pub(crate) request: Option<proto::ChatRequest>,
    pub(crate) metadata: Vec<(String, String)>,
    pub(crate) policy: ResumePolicy,
    pub(crate) deadline_at: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The original call, or a Chat retry that found nothing seen yet.
    Live,
    /// A re-subscription: its first event must be of our turn.
    Subscribed { got_any: bool },
}

struct State {
    url: String,
    session_id: String,
    current: Option<tonic::Streaming<proto::ChatEvent>>,
    mode: Mode,
    attach: Option<Attach>,
    last_seq: u64,
    turn_id: Option<String>,
    finished: bool,
    done: bool,
    /// The turn is no longer live: re-attach by the Chat retry.
    need_retry: bool,
    seen_started: bool,
    /// Text and reasoning seen since the last `message_stored`.
    pending_text: String,
    pending_reasoning: String,
    /// Message seqs whose `message_stored` was yielded.
    stored: HashSet<u64>,
    queue: VecDeque<Result<Event, Error>>,
}

/// A transport failure (tonic made the status from an error), or a status
/// that says the server side is briefly unreachable.
fn is_disconnect(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
        || matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Internal
        )
}

impl State {
    fn can_resume(&self) -> bool {
        self.attach.as_ref().is_some_and(|a| a.policy.attempts > 0)
    }

    fn notify(&self, notice: ResumeNotice) {
        if let Some(a) = &self.attach {
            a.policy.notify(notice);
        }
    }

    /// Tracks `ev` (seq, text, stored messages, the end).
    fn track(&mut self, ev: &Event) {
        self.last_seq = self.last_seq.max(ev.seq);
        if self.turn_id.is_none() && !ev.turn_id.is_empty() {
            self.turn_id = Some(ev.turn_id.clone());
        }
        match &ev.kind {
            ChatEvent::TurnStarted(_) => self.seen_started = true,
            ChatEvent::Text(t) => self.pending_text.push_str(t),
            ChatEvent::Reasoning(t) => self.pending_reasoning.push_str(t),
            ChatEvent::MessageStored { seq, .. } => {
                self.stored.insert(*seq);
                self.pending_text.clear();
                self.pending_reasoning.clear();
            }
            ChatEvent::TurnFinished { .. } => self.finished = true,
            _ => {}
        }
    }

    /// The event to yield for `ev` from the current stream, if any.
    fn accept(&mut self, ev: Event) -> Option<Event> {
        if let Mode::Subscribed { got_any } = &mut self.mode {
            if !*got_any && self.turn_id.as_deref().is_some_and(|t| t != ev.turn_id) {
                // Another turn is live now: ours has ended.
                self.current = None;
                self.need_retry = true;
                return None;
            }
            *got_any = true;
        }
        if self.attach.is_some() && ev.seq <= self.last_seq {
            return None;
        }
        self.track(&ev);
        Some(ev)
    }

    fn remaining(&self) -> Option<Duration> {
        let at = self.attach.as_ref()?.deadline_at?;
        Some(at.saturating_duration_since(Instant::now()))
    }

    /// Reconnects and re-attaches, or says why it could not.
    async fn reconnect(&mut self) -> Result<(), Error> {
        let Some(attach) = &self.attach else {
            return Err(Error::Protocol("no stream to resume".into()));
        };
        let policy = attach.policy.clone();
        let client = attach.client.clone();
        let mut backoff = policy.initial_backoff;
        let mut last_cause = String::from("the connection broke");
        for attempt in 1..=policy.attempts {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(policy.max_backoff);
            let remaining = self.remaining();
            if remaining.is_some_and(|r| r.is_zero()) {
                return Err(Error::Disconnected {
                    url: self.url.clone(),
                    cause: format!("{last_cause}; the call's deadline passed while reconnecting"),
                });
            }
            let request = self.attach.as_ref().and_then(|a| a.request.clone());
            if request.is_none() && self.need_retry {
                // A watch whose turn ended meanwhile: nothing to replay.
                self.done = true;
                return Ok(());
            }
            let outcome = if request.is_none() || (self.last_seq > 0 && !self.need_retry) {
                client
                    .subscribe_raw(&self.session_id, self.last_seq, false, remaining)
                    .await
                    .map(|s| {
                        self.current = Some(s);
                        self.mode = Mode::Subscribed { got_any: false };
                        self.notify(ResumeNotice::Resubscribed {
                            after_seq: self.last_seq,
                        });
                    })
            } else {
                let metadata = self
                    .attach
                    .as_ref()
                    .map(|a| a.metadata.clone())
                    .unwrap_or_default();
                let Some(request) = request else {
                    return Err(Error::Protocol("no request to retry".into()));
                };
                match client.chat_raw(request, &metadata, remaining).await {
                    Ok(stream) if self.last_seq == 0 => {
                        self.current = Some(stream);
                        self.mode = Mode::Live;
                        self.notify(ResumeNotice::Retried { after_seq: 0 });
                        Ok(())
                    }
                    Ok(stream) => self.replayed(stream).await.map(|()| {
                        self.notify(ResumeNotice::Retried {
                            after_seq: self.last_seq,
                        })
                    }),
                    Err(status) => Err(status),
                }
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(status) if is_disconnect(&status) => {
                    last_cause =
                        Error::from_status(status, &self.session_id, &self.url).to_string();
                    self.notify(ResumeNotice::AttemptFailed {
                        attempt,
                        cause: last_cause.clone(),
                    });
                }
                Err(status) => return Err(Error::from_status(status, &self.session_id, &self.url)),
            }
        }
        Err(Error::Disconnected {
            url: self.url.clone(),
            cause: format!(
                "{last_cause}; gave up after {} reconnect attempts",
                policy.attempts
            ),
        })
    }

    /// Reads a finished turn's replay and queues what was not yet seen.
    async fn replayed(
        &mut self,
        mut stream: tonic::Streaming<proto::ChatEvent>,
    ) -> Result<(), Status> {
        let mut events = Vec::new();
        let trailing = loop {
            match stream.message().await {
                Ok(Some(raw)) => events.push(Event::from(raw)),
                Ok(None) => break None,
                Err(status) => {
                    let ended = events
                        .iter()
                        .any(|e: &Event| matches!(e.kind, ChatEvent::TurnFinished { .. }));
                    // A break before the end: nothing is queued yet, so the
                    // whole replay is simply fetched again.
                    if !ended && is_disconnect(&status) {
                        return Err(status);
                    }
                    break Some(status);
                }
            }
        };
        let mut out = Vec::new();
        let mut group: Vec<Event> = Vec::new();
        for ev in events {
            match &ev.kind {
                ChatEvent::TurnStarted(_) if self.seen_started => {}
                ChatEvent::Text(_) | ChatEvent::Reasoning(_) => group.push(ev),
                ChatEvent::MessageStored { seq, .. } => {
                    if self.stored.contains(seq) {
                        group.clear();
                        continue;
                    }
                    for mut g in group.drain(..) {
                        let (seen, text) = match &mut g.kind {
                            ChatEvent::Text(t) => (&mut self.pending_text, t),
                            ChatEvent::Reasoning(t) => (&mut self.pending_reasoning, t),
                            _ => continue,
                        };
                        if !seen.is_empty() && text.starts_with(seen.as_str()) {
                            text.drain(..seen.len());
                        }
                        seen.clear();
                        if !text.is_empty() {
                            out.push(g);
                        }
                    }
                    out.push(ev);
                }
                _ => {
                    out.append(&mut group);
                    out.push(ev);
                }
            }
        }
        out.append(&mut group);
        for mut ev in out {
            ev.seq = self.last_seq + 1;
            if let Some(t) = &self.turn_id {
                ev.turn_id = t.clone();
            }
            self.track(&ev);
            self.queue.push_back(Ok(ev));
        }
        if let Some(status) = trailing {
            self.queue
                .push_back(Err(Error::from_status(status, &self.session_id, &self.url)));
        }
        self.done = true;
        Ok(())
    }
}

async fn step(mut st: State) -> Option<(Result<Event, Error>, State)> {
    loop {
        if let Some(item) = st.queue.pop_front() {
            return Some((item, st));
        }
        if st.done {
            return None;
        }
        let Some(stream) = st.current.as_mut() else {
            match st.reconnect().await {
                Ok(()) => continue,
                Err(e) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
            }
        };
        match stream.message().await {
            Ok(Some(raw)) => {
                if let Some(ev) = st.accept(Event::from(raw)) {
                    return Some((Ok(ev), st));
                }
            }
            Ok(None) => {
                st.current = None;
                if st.finished || !st.can_resume() {
                    st.done = true;
                    return None;
                }
                if matches!(st.mode, Mode::Subscribed { got_any: false }) {
                    // Nothing live any more: the turn ended meanwhile.
                    st.need_retry = true;
                } else {
                    st.notify(ResumeNotice::Disconnected {
                        cause: "the stream ended before turn_finished".into(),
                        last_seq: st.last_seq,
                    });
                }
            }
            Err(status) => {
                st.current = None;
                if st.finished || !st.can_resume() || !is_disconnect(&status) {
                    st.done = true;
                    let err = Error::from_status(status, &st.session_id, &st.url);
                    return Some((Err(err), st));
                }
                let cause = Error::from_status(status, &st.session_id, &st.url).to_string();
                st.notify(ResumeNotice::Disconnected {
                    cause,
                    last_seq: st.last_seq,
                });
            }
        }
    }
}

impl EventStream {
    fn from_state(state: State) -> Self {
        Self {
            inner: Box::pin(futures::stream::unfold(state, step)),
        }
    }

    /// A stream over `inner` that does not resume.
    pub(crate) fn new(
        inner: tonic::Streaming<proto::ChatEvent>,
        url: &str,
        session_id: &str,
    ) -> Self {
        Self::with_attach(inner, url, session_id, None)
    }

    /// A resuming watch over `inner`, which subscribed after `after_seq`.
    pub(crate) fn watching(
        inner: tonic::Streaming<proto::ChatEvent>,
        url: &str,
        session_id: &str,
        after_seq: u64,
        attach: Attach,
    ) -> Self {
        let mut state = Self::state(inner, url, session_id, Some(attach));
        state.last_seq = after_seq;
        Self::from_state(state)
    }

    /// A stream over `inner` that resumes with `attach` when it is set.
    pub(crate) fn with_attach(
        inner: tonic::Streaming<proto::ChatEvent>,
        url: &str,
        session_id: &str,
        attach: Option<Attach>,
    ) -> Self {
        Self::from_state(Self::state(inner, url, session_id, attach))
    }

    fn state(
        inner: tonic::Streaming<proto::ChatEvent>,
        url: &str,
        session_id: &str,
        attach: Option<Attach>,
    ) -> State {
        State {
            url: url.to_owned(),
            session_id: session_id.to_owned(),
            current: Some(inner),
            mode: Mode::Live,
            attach,
            last_seq: 0,
            turn_id: None,
            finished: false,
            done: false,
            need_retry: false,
            seen_started: false,
            pending_text: String::new(),
            pending_reasoning: String::new(),
            stored: HashSet::new(),
            queue: VecDeque::new(),
        }
    }

    /// Reads the whole turn. A trailing status (a turn that did not
    /// succeed) lands in [`TurnSummary::status`] / [`TurnSummary::error`];
    /// any other error is returned.
    pub async fn finish(mut self) -> Result<TurnSummary, Error> {
        use futures::StreamExt as _;
        let mut summary = TurnSummary::default();
        while let Some(item) = self.next().await {
            match item {
                Ok(event) => {
                    match &event.kind {
                        ChatEvent::Text(t) => summary.text.push_str(t),
                        ChatEvent::Reasoning(t) => summary.reasoning.push_str(t),
                        ChatEvent::TurnFinished { outcome, .. } => summary.outcome = Some(*outcome),
                        _ => {}
                    }
                    summary.events.push(event);
                }
                Err(err) if err.status().is_some() => {
                    summary.status = err.status().cloned();
                    summary.error = Some(err);
                }
                Err(other) => return Err(other),
            }
        }
        Ok(summary)
    }
}

impl Stream for EventStream {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// A whole turn, read by [`EventStream::finish`].
#[derive(Debug, Default)]
pub struct TurnSummary {
    /// Every event, in order.
    pub events: Vec<Event>,
    /// The concatenated text deltas.
    pub text: String,
    /// The concatenated reasoning deltas.
    pub reasoning: String,
    /// The outcome of `TurnFinished`, if it arrived.
    pub outcome: Option<proto::TurnOutcome>,
    /// The trailing status, when not OK.
    pub status: Option<tonic::Status>,
    /// The trailing status decoded, when not OK.
    pub error: Option<Error>,
}
