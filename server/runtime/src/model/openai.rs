//! OpenAI-compatible provider (placeholder while it is written).
