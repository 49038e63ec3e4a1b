//! Session registry calls (create, get, list, update, delete, history), all
//! scoped to the calling principal: another user's session is reported as
//! not found.

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::ChatInput;
use super::Runtime;
use super::slots::{Holder, WaitEnded};
use super::stream::TurnStream;
use crate::error::RuntimeError;
use crate::limits::{
    MAX_ID_BYTES, MAX_TEXT_FIELD_BYTES, check_model_name, check_short, validate_session_id,
};
use crate::quota::{QuotaLimits, WriteQuota};
use crate::store::{CreateOutcome, HistoryQuery, ListCursor, ListQuery};
use crate::types::{CancelReason, Message, NewSession, Principal, Session, SessionUpdate};

/// `session` as its client knows it: its client id, not its stored key.
fn for_client(mut session: Session) -> Session {
    let id = super::keys::client_id(&session.id);
    if id.len() != session.id.len() {
        session.id = id.to_owned();
    }
    let parent = super::keys::client_id(&session.agent.parent_session_id);
    if parent.len() != session.agent.parent_session_id.len() {
        session.agent.parent_session_id = parent.to_owned();
    }
    // The prompt's snapshot is the runtime's, not the caller's to read here
    // (GetMemory reads memory).
    session.agent.memory_snapshot = None;
    session
}

/// Default and largest page sizes.
const LIST_DEFAULT: usize = 50;
const LIST_MAX: usize = 500;
const HISTORY_DEFAULT: usize = 100;
const HISTORY_MAX: usize = 1_000;
/// Most bytes of one page of history or sessions, as estimated by
/// [`crate::store::message_wire_bytes`] / [`crate::store::session_wire_bytes`]
/// (upper bounds of the protobuf encoding): half of gRPC's default 4 MiB
/// receive limit, so every client can read every page. A single message or
/// session larger than this still comes alone on its page — every page
/// makes progress; what the server stores is bounded (a user message by
/// `max_input_bytes`, 1 MiB by default, session fields below), so such a
/// page stays under 4 MiB too.
pub(crate) const PAGE_BYTES: usize = 2 << 20;
/// Upper bounds on caller-supplied session fields.
const MAX_FIELD_BYTES: usize = MAX_TEXT_FIELD_BYTES;
const MAX_METADATA_ENTRIES: usize = 64;
/// Longest page tokens: a history token is a seq, a listing token the
/// base64 of a time and a session id.
const MAX_HISTORY_TOKEN: usize = 20;
const MAX_LIST_TOKEN: usize = 256;
/// How long DeleteSession waits for a live turn to end.
const DELETE_STOP_WAIT: Duration = Duration::from_secs(5);

/// How [`Runtime::delete_stored`] went.
pub(super) enum Deleted {
    /// Deleted (`false`: it was gone already).
    Deleted(bool),
    /// Its live turn did not end within 5 s: nothing was deleted.
    StillEnding,
}

/// A page of sessions with the token for the next one.
#[derive(Debug, Clone, Default)]
pub struct SessionList {
    /// Newest activity first.
    pub sessions: Vec<Session>,
    /// Empty when there are no more pages.
    pub next_page_token: String,
}

/// A page of history.
#[derive(Debug, Clone, Default)]
pub struct HistoryPage {
    /// In seq order.
    pub messages: Vec<Message>,
    /// Empty when there are no more messages.
    pub next_page_token: String,
}

fn check_len(field: &str, value: &str) -> Result<(), RuntimeError> {
    if value.len() > MAX_FIELD_BYTES {
        return Err(RuntimeError::invalid(
            field,
            format!("is longer than {MAX_FIELD_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn check_metadata(
    metadata: &std::collections::BTreeMap<String, String>,
) -> Result<(), RuntimeError> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(RuntimeError::invalid(
            "metadata",
            format!("has more than {MAX_METADATA_ENTRIES} entries"),
        ));
    }
    let bytes: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_FIELD_BYTES {
        return Err(RuntimeError::invalid(
            "metadata",
            format!("keys and values total more than {MAX_FIELD_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn clamp_page(requested: usize, default: usize, max: usize) -> usize {
    if requested == 0 {
        default
    } else {
        requested.min(max)
    }
}

fn encode_cursor(cursor: &ListCursor) -> String {
    let micros = cursor
        .last_active_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    URL_SAFE_NO_PAD.encode(format!("{micros}\n{}", cursor.id))
}

fn decode_cursor(token: &str) -> Result<ListCursor, RuntimeError> {
    let bad = || RuntimeError::invalid("page_token", "is not a token returned by ListSessions");
    if token.len() > MAX_LIST_TOKEN {
        return Err(bad());
    }
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let (micros, id) = text.split_once('\n').ok_or_else(bad)?;
    let micros: u64 = micros.parse().map_err(|_| bad())?;
    Ok(ListCursor {
        last_active_at: UNIX_EPOCH + Duration::from_micros(micros),
        id: id.to_owned(),
    })
}

impl Runtime {
    /// Creates a session owned by `who`. A client-chosen id is unique per
    /// owner (see the `keys` module): the call is idempotent for the same owner,
    /// and the same id from another owner is another session.
    pub async fn create_session(
        &self,
        who: &Principal,
        mut new: NewSession,
    ) -> Result<Session, RuntimeError> {
        if let Some(id) = &new.id {
            validate_session_id("session_id", id)?;
        }
        check_short("agent_id", &new.agent_id, MAX_ID_BYTES)?;
        check_short("project_id", &new.project_id, MAX_ID_BYTES)?;
        for (field, value) in [("title", &new.title), ("system_prompt", &new.system_prompt)] {
            check_len(field, value)?;
        }
        check_metadata(&new.metadata)?;
        check_model_name("model", &new.model)?;
        super::restricted::check_new_session(who, &new)?;
        if !new.model.is_empty() {
            self.inner.models.resolve(&new.model, "model")?;
        }
        new.owner.clone_from(&who.user_id);
        self.bind_agent(&mut new).await?;
        if let Some(id) = new.id.take() {
            new.id = Some(self.key_for_new(who, id).await?);
        }
        if let Some(id) = &new.id
            && self.id_still_in_use(id).await?
        {
            return Err(RuntimeError::Unavailable(
                "a session with this id is being deleted or is still ending its last turn; retry shortly",
            ));
        }
        let quota = self.write_quota(who);
        match self.inner.store.create_session_within(new, &quota).await? {
            CreateOutcome::Created(s) => Ok(for_client(s)),
            CreateOutcome::Existing(s) if s.owner == who.user_id => Ok(for_client(s)),
            // Only two owners' tags colliding could get here.
            CreateOutcome::Existing(_) => Err(RuntimeError::SessionExists),
        }
    }

    /// A new session's agent: the version it keeps (the one asked for, or
    /// the latest now unless it follows the latest) and the agent's
    /// default budget when the call set none. A session whose `agent_id`
    /// names no agent keeps it as a label.
    async fn bind_agent(&self, new: &mut NewSession) -> Result<(), RuntimeError> {
        if new.agent_id.is_empty() {
            return Ok(());
        }
        let asked = new.agent.version;
        let store = self.inner.store.agents();
        let found = store
            .get_agent(&new.agent_id, (asked != 0).then_some(asked))
            .await?;
        let Some(agent) = found else {
            if asked != 0 {
                return Err(RuntimeError::AgentNotFound);
            }
            return Ok(());
        };
        if !new.agent.follow_latest {
            new.agent.version = agent.version;
        } else if asked != 0 {
            return Err(RuntimeError::invalid(
                "agent_version",
                "a session follows the agent's latest version or keeps one, not both",
            ));
        }
        if new.budget == crate::types::Budget::NONE {
            new.budget = agent.spec.budget;
        }
        Ok(())
    }

    /// The stored key of the session `who` creates with client id `id`:
    /// the id itself when `who` already has a session stored under it
    /// (created before ids were scoped), else `who`'s scoped key.
    async fn key_for_new(&self, who: &Principal, id: String) -> Result<String, RuntimeError> {
        Ok(match self.inner.store.get_session(&id).await? {
            Some(s) if s.owner == who.user_id => id,
            _ => super::keys::scoped_key(&who.user_id, &id),
        })
    }

    /// The quota a store checks for a write of `who`'s.
    pub(crate) fn write_quota(&self, who: &Principal) -> WriteQuota {
        WriteQuota {
            limits: self.inner.config.quotas.limits_for(who),
            count_turns: self.inner.shared,
        }
    }

    /// `who`'s limits ([`crate::quota`]), as configured.
    pub fn quota_limits(&self, who: &Principal) -> QuotaLimits {
        self.inner.config.quotas.limits_for(who)
    }

    /// One of `who`'s sessions.
    pub async fn get_session(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<Session, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        self.owned_session(who, session_id).await.map(for_client)
    }

    /// A page of `who`'s sessions, newest activity first.
    pub async fn list_sessions(
        &self,
        who: &Principal,
        page_size: usize,
        page_token: &str,
        agent_id: Option<String>,
        parent_session_id: Option<String>,
        include_archived: bool,
    ) -> Result<SessionList, RuntimeError> {
        let after = if page_token.is_empty() {
            None
        } else {
            Some(decode_cursor(page_token)?)
        };
        let agent_id = agent_id.filter(|a| !a.is_empty());
        if let Some(agent) = &agent_id {
            check_short("agent_id", agent, MAX_ID_BYTES)?;
        }
        // A parent by the id its caller knows: its stored key (a parent
        // that is not the caller's has no children to list).
        let parent_session_id = match parent_session_id.filter(|p| !p.is_empty()) {
            None => None,
            Some(parent) => {
                validate_session_id("parent_session_id", &parent)?;
                match self.owned_session(who, &parent).await {
                    Ok(session) => Some(session.id),
                    Err(RuntimeError::SessionNotFound) => {
                        return Ok(SessionList {
                            sessions: Vec::new(),
                            next_page_token: String::new(),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let query = ListQuery {
            agent_id,
            parent_session_id,
            include_archived,
            limit: clamp_page(page_size, LIST_DEFAULT, LIST_MAX),
            after,
            max_bytes: PAGE_BYTES,
        };
        let page = self.inner.store.list_sessions(&who.user_id, &query).await?;
        Ok(SessionList {
            sessions: page.sessions.into_iter().map(for_client).collect(),
            next_page_token: page.next.as_ref().map(encode_cursor).unwrap_or_default(),
        })
    }

    /// Updates one of `who`'s sessions.
    pub async fn update_session(
        &self,
        who: &Principal,
        session_id: &str,
        update: SessionUpdate,
    ) -> Result<Session, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        for (field, value) in [
            ("title", &update.title),
            ("system_prompt", &update.system_prompt),
        ] {
            if let Some(v) = value {
                check_len(field, v)?;
            }
        }
        if let Some(model) = &update.model {
            check_model_name("model", model)?;
        }
        if let Some(model) = update.model.as_deref().filter(|m| !m.is_empty()) {
            self.inner.models.resolve(model, "model")?;
        }
        if let Some(m) = &update.metadata {
            check_metadata(m)?;
        }
        super::restricted::check_update(who, &update)?;
        let key = self.owned_session(who, session_id).await?.id;
        let updated = self.inner.store.update_session(&key, update).await?;
        Ok(for_client(updated))
    }

    /// Whether session id `id` is still held by a delete in progress or by
    /// a live turn of an earlier incarnation (a live turn while no session
    /// has the id): it is not created again until they are done.
    async fn id_still_in_use(&self, id: &str) -> Result<bool, RuntimeError> {
        Ok(match self.inner.slots.holder(id) {
            Holder::Delete => true,
            Holder::Turn => self.inner.store.get_session(id).await?.is_none(),
            Holder::Nobody => false,
        })
    }

    /// Creates a session for `who` from `new` and admits `input`'s turn in
    /// it (`input.session_id` becomes the new session's id): one step for
    /// a protocol whose first message makes its conversation (A2A's message
    /// without a context). A turn refused at admission leaves no session
    /// behind.
    pub async fn chat_in_new_session(
        &self,
        who: &Principal,
        new: NewSession,
        mut input: ChatInput,
    ) -> Result<TurnStream, RuntimeError> {
        let session = self.create_session(who, new).await?;
        input.session_id.clone_from(&session.id);
        let refused = match self.chat(who, input).await {
            Ok(turn) => return Ok(turn),
            Err(refused) => refused,
        };
        // An empty session nobody asked for otherwise.
        if let Err(cleanup) = self.delete_session(who, &session.id).await {
            tracing::warn!(session_id = %session.id, error = %cleanup,
                "could not delete the new session of a refused turn");
        }
        Err(refused)
    }

    /// Deletes the session with its history. Admission of new turns (and
    /// creating the id again) is refused from the start; watchers waiting
    /// for a turn are ended; a live turn is stopped (reason
    /// SESSION_DELETED) and waited for — when it has not ended within 5 s
    /// nothing is deleted and the call fails `UNAVAILABLE`, so success
    /// always means no turn of the session can still write.
    pub async fn delete_session(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<bool, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        match self.delete_stored(&session).await? {
            Deleted::Deleted(deleted) => Ok(deleted),
            Deleted::StillEnding => Err(RuntimeError::Unavailable(
                "the session's live turn did not stop within 5 s; nothing was deleted, retry DeleteSession",
            )),
        }
    }

    /// Deletes `session` (as just read from the store) with its history,
    /// turns, inbox and blobs, its live turn here stopped first (see
    /// [`Runtime::delete_session`]); `DeleteSession` and `DeleteSessions`
    /// both go through here.
    pub(super) async fn delete_stored(&self, session: &Session) -> Result<Deleted, RuntimeError> {
        let session_id = session.id.as_str();
        let _reserved = self.inner.slots.reserve_delete(session_id);
        self.inner
            .slots
            .end_waiters(session_id, &WaitEnded::SessionDeleted);
        match self
            .cancel_live(session, CancelReason::SessionDeleted, DELETE_STOP_WAIT)
            .await
        {
            super::Cancelled::NothingLive | super::Cancelled::Ended => {}
            super::Cancelled::StillEnding => return Ok(Deleted::StillEnding),
        }
        self.inner.runners.remove(session_id);
        self.close_orphaned_tools(&self.inner.slots.busy_sessions());
        let deleted = self
            .inner
            .store
            .delete_session(session_id, Some(&session.incarnation))
            .await?;
        // Its blobs go with it (those no other session of the owner refers
        // to). A failure leaves them counted against the owner's quota; it
        // is logged, the session is gone either way.
        if let Err(e) = self
            .inner
            .config
            .blobs
            .delete_session(&session.owner, session_id)
            .await
        {
            tracing::error!(error = %e, "deleting a deleted session's blobs failed");
        }
        Ok(Deleted::Deleted(deleted))
    }

    /// A page of one of `who`'s sessions' history. `page_token` (from a
    /// previous page) wins over `after_seq` when set.
    pub async fn history(
        &self,
        who: &Principal,
        session_id: &str,
        after_seq: u64,
        page_size: usize,
        page_token: &str,
        include_compacted: bool,
    ) -> Result<HistoryPage, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        let bad_token =
            || RuntimeError::invalid("page_token", "is not a token returned by GetHistory");
        let after = if page_token.is_empty() {
            after_seq
        } else if page_token.len() > MAX_HISTORY_TOKEN {
            return Err(bad_token());
        } else {
            page_token.parse().map_err(|_| bad_token())?
        };
        let key = self.owned_session(who, session_id).await?.id;
        let session_id = key.as_str();
        let limit = clamp_page(page_size, HISTORY_DEFAULT, HISTORY_MAX);
        // One extra row tells whether another page follows; the byte budget
        // (with room for that row) ends the read early on a long history.
        let query = HistoryQuery {
            after_seq: after,
            limit: limit + 1,
            max_bytes: PAGE_BYTES,
            include_compacted,
        };
        let page = self.inner.store.history_page(session_id, &query).await?;
        let mut messages = page.messages;
        let more = page.more || messages.len() > limit;
        messages.truncate(limit);
        let next_page_token = match messages.last() {
            Some(last) if more => last.seq.to_string(),
            _ => String::new(),
        };
        Ok(HistoryPage {
            messages,
            next_page_token,
        })
    }
}
