//! The commands, one module per command group.

pub(crate) mod admin;
pub(crate) mod agents;
pub(crate) mod blob;
pub(crate) mod chat;
pub(crate) mod health;
pub(crate) mod history;
pub(crate) mod sessions;
pub(crate) mod stream;
