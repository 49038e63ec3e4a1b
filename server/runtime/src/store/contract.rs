//! The store contract suite (filled in by the store work).
