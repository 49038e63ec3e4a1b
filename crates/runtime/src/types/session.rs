//! The rules every store applies to a session record, in one place: how a
//! new session starts, what an update changes, how activity, seqs, the
//! latest turn, the title and compaction move. The stores (memory, sled)
//! differ only in how they keep records durable and indexed; what a write
//! does to a record is decided here, so they cannot drift apart.

use std::time::SystemTime;

use super::{
    LastTurn, Message, NewMessage, NewSession, Role, Session, SessionUpdate, TurnRecord,
    TurnStatus, new_id,
};

impl NewSession {
    /// The record of this new session under `id`, created `now`: no
    /// history (the first message gets seq 1), never compacted, and a
    /// fresh incarnation.
    pub(crate) fn into_session(self, id: String, now: SystemTime) -> Session {
        Session {
            id,
            owner: self.owner,
            agent_id: self.agent_id,
            project_id: self.project_id,
            title: self.title,
            model: self.model,
            system_prompt: self.system_prompt,
            metadata: self.metadata,
            created_at: now,
            last_active_at: now,
            archived: false,
            last_turn: None,
            message_count: 0,
            next_seq: 1,
            compacted_through: 0,
            summary_seq: 0,
            incarnation: new_id(),
            budget: self.budget,
            spent: super::Spent::default(),
            agent: self.agent,
        }
    }
}

impl Session {
    /// Whether this record is incarnation `incarnation`: a write meant for
    /// a deleted session must not land in a new one with the same id.
    pub(crate) fn is_incarnation(&self, incarnation: &str) -> bool {
        self.incarnation == incarnation
    }

    /// Applies the fields set in `update` (the caller also
    /// [touches](Self::touch) the session: an update is activity).
    pub(crate) fn apply(&mut self, update: SessionUpdate) {
        let SessionUpdate {
            title,
            model,
            system_prompt,
            metadata,
            archived,
            budget,
            agent_version,
            refresh_memory,
            memory_snapshot,
        } = update;
        if let Some(version) = agent_version {
            self.agent.version = version;
        }
        if let Some(refresh) = refresh_memory {
            self.agent.refresh_memory = refresh;
        }
        if let Some(snapshot) = memory_snapshot {
            self.agent.memory_snapshot = Some(snapshot);
        }
        if let Some(title) = title {
            self.title = title;
        }
        if let Some(model) = model {
            self.model = model;
        }
        if let Some(system_prompt) = system_prompt {
            self.system_prompt = system_prompt;
        }
        if let Some(metadata) = metadata {
            self.metadata = metadata;
        }
        if let Some(archived) = archived {
            self.archived = archived;
        }
        if let Some(budget) = budget {
            self.budget = budget;
        }
    }

    /// Records activity at `now`. Activity never moves backwards, so a
    /// clock step back cannot reorder a session behind its own past.
    pub(crate) fn touch(&mut self, now: SystemTime) {
        self.last_active_at = now.max(self.last_active_at);
    }

    /// Appends `body` at `now`: it takes the next seq, counts, and is
    /// activity. `None` (and nothing changed) when the seq space is
    /// exhausted.
    pub(crate) fn append(&mut self, body: NewMessage, now: SystemTime) -> Option<Message> {
        let seq = self.next_seq;
        self.next_seq = seq.checked_add(1)?;
        self.message_count = self.message_count.saturating_add(1);
        self.touch(now);
        Some(Message {
            seq,
            body,
            compacted: false,
        })
    }

    /// Adds an ended turn's usage and cost to what the session spent —
    /// once: only when its stored record (`before`) was still running.
    /// Whether it changed the record.
    pub(crate) fn spend(&mut self, before: Option<&TurnRecord>, turn: &TurnRecord) -> bool {
        let was_running = before.is_none_or(|b| !b.status.is_final());
        let ends_now = was_running && turn.status.is_final();
        if ends_now {
            self.spent = (self.spent)
                .plus(&turn.usage, turn.cost_nano_usd)
                .add(&turn.delegated);
        }
        ends_now
    }

    /// The turn the session waits on, when its latest turn is paused.
    pub fn paused_turn(&self) -> Option<&str> {
        self.last_turn
            .as_ref()
            .filter(|t| t.status == TurnStatus::Paused)
            .map(|t| t.turn_id.as_str())
    }

    /// Records that `turn` began: it is now the latest.
    pub(crate) fn begin_turn(&mut self, turn: &TurnRecord) {
        self.last_turn = Some(LastTurn::from(turn));
    }

    /// Records the final state of `turn` as the latest — unless a newer
    /// turn began since: an older turn finishing late must not hide the
    /// newer one. Whether it changed the record.
    pub(crate) fn finish_turn(&mut self, turn: &TurnRecord) -> bool {
        let latest = self
            .last_turn
            .as_ref()
            .is_none_or(|last| last.turn_id == turn.turn_id);
        self.record_turn_if(latest, turn)
    }

    /// Records the recovered state of `turn` when it is the latest turn;
    /// whether it changed the record.
    pub(crate) fn recover_turn(&mut self, turn: &TurnRecord) -> bool {
        let latest = self
            .last_turn
            .as_ref()
            .is_some_and(|last| last.turn_id == turn.turn_id);
        self.record_turn_if(latest, turn)
    }

    fn record_turn_if(&mut self, latest: bool, turn: &TurnRecord) -> bool {
        if latest {
            self.begin_turn(turn);
        }
        latest
    }

    /// Sets the title when there is none; `false` (and the title left as
    /// it is) when one is set.
    pub(crate) fn set_title_if_empty(&mut self, title: &str) -> bool {
        if !self.title.is_empty() {
            return false;
        }
        title.clone_into(&mut self.title);
        true
    }

    /// What is wrong with recording `summary` as a compaction through
    /// `through_seq`, if anything: it must be a summary, `through_seq` must
    /// not move back, and it must stay below the summary's own seq.
    pub(crate) fn check_compaction(
        &self,
        summary: &NewMessage,
        through_seq: u64,
    ) -> Result<(), String> {
        if summary.role != Role::Summary {
            return Err(format!("the summary has role {:?}", summary.role));
        }
        if through_seq < self.compacted_through {
            return Err(format!(
                "through_seq {through_seq} is below compacted_through {}",
                self.compacted_through
            ));
        }
        if through_seq >= self.next_seq {
            return Err(format!(
                "through_seq {through_seq} is not below the summary's seq {}",
                self.next_seq
            ));
        }
        Ok(())
    }

    /// Records a compaction through `through_seq` whose summary was
    /// stored at `summary_seq`: everything up to it, and every earlier
    /// summary, now counts as compacted.
    pub(crate) fn compacted(&mut self, through_seq: u64, summary_seq: u64) {
        self.compacted_through = through_seq;
        self.summary_seq = summary_seq;
    }
}

impl TurnRecord {
    /// Marks a turn still running, whose process is gone, as interrupted
    /// at `now` — or as [`TurnStatus::Paused`] when it was waiting for
    /// caller results or approvals ([`TurnRecord::pause`]); `false` (and
    /// nothing changed) when it is not running.
    pub(crate) fn interrupt(&mut self, now: SystemTime) -> bool {
        if self.status != TurnStatus::Running {
            return false;
        }
        if self.pause.is_some() {
            self.status = TurnStatus::Paused;
        } else {
            self.status = TurnStatus::Interrupted;
            self.finished_at = Some(now);
        }
        true
    }

    /// A paused turn none of whose waited-for calls is still open (in
    /// `open`, the ids of its calls without a result) cannot resume: it is
    /// interrupted at `now` instead. Whether it changed.
    pub(crate) fn settle_pause(&mut self, open: &[String], now: SystemTime) -> bool {
        let waiting = self
            .pause
            .as_ref()
            .is_some_and(|p| p.calls.iter().any(|c| open.contains(&c.call_id)));
        if self.status != TurnStatus::Paused || waiting {
            return false;
        }
        self.status = TurnStatus::Interrupted;
        self.finished_at = Some(now);
        true
    }

    /// When the turn's pause ends unanswered, while it has one.
    pub fn paused_until(&self) -> Option<SystemTime> {
        self.pause.as_ref().map(|p| p.until)
    }

    /// Whether the call `call_id` is one the (paused) turn waits for.
    pub(crate) fn waits_for(&self, call_id: &str) -> bool {
        self.pause
            .as_ref()
            .is_some_and(|p| p.calls.iter().any(|c| c.call_id == call_id))
    }

    /// Whether the Chat with idempotency key `request_id` started it.
    pub(crate) fn started_by(&self, request_id: &str) -> bool {
        self.request_id.as_deref() == Some(request_id)
    }
}
