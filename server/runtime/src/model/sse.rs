//! SSE parser (placeholder while it is written).
