//! The runner cache: for each session, the resolved model selection, the
//! server tools listed for it and — when long — its context between turns,
//! with the byte budget all cached contexts share.
//!
//! One lock guards the map. A runner's own state is an atomic (when it was
//! last used) or locked alone (its cached context), never while the map is
//! locked, so there is no lock order to keep. A turn keeps the `Arc` of the
//! runner it was admitted with: replacing or evicting the cache entry never
//! affects it.
//!
//! The same lock guards each session's session-scoped tools
//! ([`SessionTools`]: its tool processes and workspace). They belong to the
//! session, not to one runner: a runner rebuilt for another model keeps
//! them. Once the session has no cached runner and no live turn they are
//! *orphaned*: every eviction path (the idle reaper, reset, close, delete)
//! takes the orphans ([`Runners::take_orphans`]) and closes them, and
//! shutdown closes them all.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::context::cache::{Budget, CachedContext};
use super::lock;
use super::models::{Resolved, Selection};
use crate::error::RuntimeError;
use crate::model::ToolSpec;
use crate::toolbox::{Listing, SessionTools, Toolbox};
use crate::types::{Message, Session, ThinkingLevel};

/// The model selection a runner was built with; a turn asking for another
/// one rebuilds the session's runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunnerKey {
    pub(crate) model: String,
    pub(crate) thinking: Option<ThinkingLevel>,
    /// The session incarnation: a session created again under the same id
    /// never inherits the old one's runner (or its cached context).
    pub(crate) incarnation: String,
    /// A restricted principal's runner: capability-free, with no server
    /// tools and no session-scoped tools (see `runtime::restricted`).
    pub(crate) restricted: bool,
}

/// A session's cached, resolved model selection and server tools.
#[derive(Debug)]
pub(crate) struct Runner {
    pub(crate) key: RunnerKey,
    pub(crate) owner: String,
    /// `key.model`, resolved.
    pub(crate) model: Resolved,
    /// The toolbox's tools, listed when the runner was built.
    pub(crate) tools: Vec<ToolSpec>,
    /// The toolbox generation of `tools`.
    pub(crate) tools_generation: u64,
    /// The session's own tool sources (session-scoped), when any.
    pub(crate) session_tools: Option<Arc<SessionTools>>,
    built: Instant,
    /// When it was last used, in nanoseconds after `built`.
    last_used: AtomicU64,
    /// The session's context after its last turn, when long.
    context: Mutex<Option<CachedContext>>,
    /// The budget `context` counts against.
    budget: Arc<Budget>,
}

impl Runner {
    /// Marks the runner used now.
    pub(crate) fn touch(&self) {
        let nanos = u64::try_from(self.built.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_used.store(nanos, Ordering::Relaxed);
    }

    /// How long the runner had been unused at `now`.
    fn idle_at(&self, now: Instant) -> Duration {
        let used = self.built + Duration::from_nanos(self.last_used.load(Ordering::Relaxed));
        now.saturating_duration_since(used)
    }

    /// The cached context for a turn of `session` whose user message is
    /// `user` (with `user` appended), when it provably equals the store's;
    /// the cache is emptied either way.
    pub(crate) fn take_context(&self, session: &Session, user: &Message) -> Option<Vec<Message>> {
        let cached = lock(&self.context).take();
        cached.and_then(|c| c.take_for(session, user))
    }

    /// Keeps `messages`, the context after a turn whose last stored
    /// message has seq `next_seq - 1`, for the next turn (when long enough
    /// and within the budget).
    pub(crate) fn keep_context(&self, session: &Session, next_seq: u64, messages: Vec<Message>) {
        let kept = CachedContext::keep(&self.budget, session, next_seq, messages);
        *lock(&self.context) = kept;
    }
}

/// The cache of runners by session id (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Runners {
    map: Mutex<Maps>,
    budget: Arc<Budget>,
}

#[derive(Debug, Default)]
struct Maps {
    runners: HashMap<String, Arc<Runner>>,
    /// Each session's session-scoped tools, by session id.
    tools: HashMap<String, Arc<SessionTools>>,
}

impl Runners {
    /// The session's cached runner, or a new one when the model selection
    /// changed or the toolbox's tools did (a new runner lists them again,
    /// which also reconnects sources that lost their connection).
    /// `model_field` names the field an unknown model came from.
    pub(crate) async fn runner_for(
        &self,
        models: &Selection,
        toolbox: &Toolbox,
        (session_id, owner): (&str, &str),
        key: RunnerKey,
        model_field: &str,
    ) -> Result<Arc<Runner>, RuntimeError> {
        // Touched under the map lock: the reaper sees it used, or it is
        // gone and a new one is built.
        if let Some(runner) = lock(&self.map).runners.get(session_id)
            && runner.key == key
            && (key.restricted || !toolbox.is_stale(runner.tools_generation))
            && !runner
                .session_tools
                .as_ref()
                .is_some_and(|t| t.is_closed() || t.needs_refresh())
        {
            runner.touch();
            return Ok(Arc::clone(runner));
        }
        let model = models.resolve(&key.model, model_field)?;
        // A restricted runner lists no tool and starts no tool process.
        let session_tools = if key.restricted {
            None
        } else {
            self.session_tools(toolbox, (session_id, owner), &key.incarnation)
                .await
        };
        let mut listing = if toolbox.is_empty() || key.restricted {
            Listing::default()
        } else {
            toolbox.list().await
        };
        if let Some(tools) = &session_tools {
            listing.tools.extend(tools.list().await);
        }
        let runner = Arc::new(Runner {
            key,
            owner: owner.to_owned(),
            model,
            tools: listing.tools,
            tools_generation: listing.generation,
            session_tools,
            built: Instant::now(),
            last_used: AtomicU64::new(0),
            context: Mutex::new(None),
            budget: Arc::clone(&self.budget),
        });
        lock(&self.map)
            .runners
            .insert(session_id.to_owned(), Arc::clone(&runner));
        Ok(runner)
    }

    /// The session's session-scoped tools (`None` without any): the ones
    /// it has, or new ones. Those of an earlier incarnation of the session
    /// are closed first.
    async fn session_tools(
        &self,
        toolbox: &Toolbox,
        (session_id, owner): (&str, &str),
        incarnation: &str,
    ) -> Option<Arc<SessionTools>> {
        if !toolbox.has_session_sources() {
            return None;
        }
        let stale = {
            let mut maps = lock(&self.map);
            match maps.tools.get(session_id) {
                Some(tools) if tools.incarnation() == incarnation && !tools.is_closed() => {
                    return Some(Arc::clone(tools));
                }
                _ => {}
            }
            let tools = Arc::new(toolbox.session_tools(owner, session_id, incarnation)?);
            maps.tools.insert(session_id.to_owned(), Arc::clone(&tools))
        };
        if let Some(stale) = stale {
            stale.close().await;
        }
        lock(&self.map).tools.get(session_id).cloned()
    }

    /// Number of cached runners.
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).runners.len()
    }

    /// Number of sessions with session-scoped tools.
    pub(crate) fn session_tools_len(&self) -> usize {
        lock(&self.map).tools.len()
    }

    /// Evicts the session's runner; `true` when one was cached.
    pub(crate) fn remove(&self, session_id: &str) -> bool {
        lock(&self.map).runners.remove(session_id).is_some()
    }

    /// Takes the session-scoped tools of every session with neither a
    /// cached runner nor a live turn (`busy`), for closing.
    pub(crate) fn take_orphans(&self, busy: &HashSet<String>) -> Vec<Arc<SessionTools>> {
        let mut maps = lock(&self.map);
        let Maps { runners, tools } = &mut *maps;
        let orphaned: Vec<String> = tools
            .keys()
            .filter(|id| !runners.contains_key(*id) && !busy.contains(*id))
            .cloned()
            .collect();
        orphaned.iter().filter_map(|id| tools.remove(id)).collect()
    }

    /// Takes every session's session-scoped tools (at shutdown).
    pub(crate) fn take_all_tools(&self) -> Vec<Arc<SessionTools>> {
        lock(&self.map).tools.drain().map(|(_, t)| t).collect()
    }

    /// Evicts runners unused for `idle_for` at `now`, except those of the
    /// `busy` sessions. Returns how many.
    pub(crate) fn reap(&self, now: Instant, idle_for: Duration, busy: &HashSet<String>) -> usize {
        let map = &mut lock(&self.map).runners;
        let before = map.len();
        map.retain(|session_id, runner| {
            busy.contains(session_id) || runner.idle_at(now) < idle_for
        });
        before - map.len()
    }

    /// Evicts every runner, or `user`'s. Returns how many.
    pub(crate) fn reset(&self, user: Option<&str>) -> usize {
        let map = &mut lock(&self.map).runners;
        let before = map.len();
        map.retain(|_, r| user.is_some_and(|u| r.owner != u));
        before - map.len()
    }
}
