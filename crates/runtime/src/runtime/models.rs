//! Which model runs what: the `provider/model` registry, the default
//! selection (changed at run time by `SetDefaultModel`) and the configured
//! fast model. A name is resolved once into a [`Resolved`] model, the one
//! type turns, compaction and titles call a provider through.

use std::sync::{Arc, Mutex};

use super::{RuntimeConfig, lock};
use crate::error::RuntimeError;
use crate::model::{ModelProvider, Models};
use crate::types::{Session, ThinkingLevel};

/// A `provider/model` name resolved to its provider.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) provider: Arc<dyn ModelProvider>,
    /// The model's name without the provider prefix, as the provider takes
    /// it.
    pub(crate) provider_model: String,
    /// The `provider/model` name (what records, events and spans show).
    pub(crate) name: String,
}

/// The model selection used when neither the call nor the session names
/// one.
#[derive(Debug, Clone)]
pub(crate) struct Defaults {
    pub(crate) model: String,
    pub(crate) thinking: Option<ThinkingLevel>,
    /// The version of the cluster-wide setting these are (0: the
    /// configuration's, or set on a store one process owns).
    pub(crate) version: i64,
}

/// The runtime's models (see the module docs). Its one lock guards the
/// defaults.
#[derive(Debug)]
pub(crate) struct Selection {
    registry: Models,
    defaults: Mutex<Defaults>,
    /// The resolved `fast_model`.
    fast: Option<Resolved>,
}

fn resolve_in(registry: &Models, name: &str, field: &str) -> Result<Resolved, RuntimeError> {
    let (provider, provider_model) = registry
        .resolve(name)
        .map_err(|e| RuntimeError::unknown_model(field, &e))?;
    Ok(Resolved {
        provider,
        provider_model,
        name: name.to_owned(),
    })
}

impl Selection {
    /// The selection `config` names; `Err` when its default or fast model
    /// is not served by `registry`.
    pub(crate) fn new(registry: Models, config: &RuntimeConfig) -> Result<Self, RuntimeError> {
        resolve_in(&registry, &config.default_model, "default_model")?;
        let fast = config
            .fast_model
            .as_deref()
            .map(|name| resolve_in(&registry, name, "fast_model"))
            .transpose()?;
        Ok(Self {
            registry,
            defaults: Mutex::new(Defaults {
                model: config.default_model.clone(),
                thinking: config.default_thinking,
                version: 0,
            }),
            fast,
        })
    }

    /// `name` resolved; an unknown one is an invalid `field`.
    pub(crate) fn resolve(&self, name: &str, field: &str) -> Result<Resolved, RuntimeError> {
        resolve_in(&self.registry, name, field)
    }

    /// The configured fast model, if any.
    pub(crate) fn fast(&self) -> Option<&Resolved> {
        self.fast.as_ref()
    }

    /// The current defaults.
    pub(crate) fn defaults(&self) -> Defaults {
        lock(&self.defaults).clone()
    }

    /// Makes `model` (which must resolve) and `thinking` the defaults;
    /// returns the previous default model.
    pub(crate) fn set_defaults(
        &self,
        model: &str,
        thinking: Option<ThinkingLevel>,
        field: &str,
    ) -> Result<String, RuntimeError> {
        self.resolve(model, field)?;
        let mut defaults = lock(&self.defaults);
        let previous = std::mem::replace(&mut defaults.model, model.to_owned());
        defaults.thinking = thinking;
        Ok(previous)
    }

    /// Takes the cluster-wide default `stored` unless these defaults are
    /// already that version or a newer one; returns the previous default
    /// model when it took it. A model this replica cannot resolve is not
    /// taken (its configuration lacks the provider): `Err` says so.
    pub(crate) fn adopt(
        &self,
        stored: &crate::store::DefaultModel,
    ) -> Result<Option<String>, RuntimeError> {
        let mut defaults = lock(&self.defaults);
        if stored.version <= defaults.version {
            return Ok(None);
        }
        // Marked seen either way: an unresolvable version is reported once.
        defaults.version = stored.version;
        self.resolve(&stored.model, "model")?;
        let previous = std::mem::replace(&mut defaults.model, stored.model.clone());
        defaults.thinking = stored.thinking;
        Ok(Some(previous))
    }

    /// The model and thinking level of a turn in `session`: the call's
    /// model (`asked`), else the session's, else the default — with the
    /// field it came from, for the error should it not resolve — and the
    /// call's thinking level, else the default's.
    pub(crate) fn for_turn(
        &self,
        asked: Option<&str>,
        thinking: Option<ThinkingLevel>,
        session: &Session,
        agent: Option<&crate::agents::AgentSpec>,
    ) -> (String, Option<ThinkingLevel>, &'static str) {
        let defaults = self.defaults();
        let agent_model = agent.map(|a| a.model.as_str()).filter(|m| !m.is_empty());
        let (model, field) = match asked.filter(|m| !m.is_empty()) {
            Some(m) => (m.to_owned(), "model"),
            None if !session.model.is_empty() => (session.model.clone(), "session.model"),
            None => match agent_model {
                Some(m) => (m.to_owned(), "agent.model"),
                None => (defaults.model, "default_model"),
            },
        };
        let thinking = thinking
            .or(agent.and_then(|a| a.thinking))
            .or(defaults.thinking);
        (model, thinking, field)
    }

    /// The model that summarises `session`: the fast model, else the
    /// session's own (or the default).
    pub(crate) fn summariser(&self, session: &Session) -> Result<Resolved, RuntimeError> {
        if let Some(fast) = &self.fast {
            return Ok(fast.clone());
        }
        let model = if session.model.is_empty() {
            lock(&self.defaults).model.clone()
        } else {
            session.model.clone()
        };
        self.resolve(&model, "session.model")
    }
}
