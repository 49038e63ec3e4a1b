//! In-memory store (placeholder while the store is written).
#[derive(Debug)]
pub struct MemoryStore;
