//! sled store (placeholder while the store is written).
#[derive(Debug)]
pub struct SledStore;
