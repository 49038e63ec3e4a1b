//! candle's CPU thread count.
//!
//! candle 0.11 sizes its compute pools (a spinning "barrier pool" of
//! `candle-bp-N` threads, and a rayon pool) from the environment variables
//! `CANDLE_NUM_THREADS` and `RAYON_NUM_THREADS`, read once on first use; it
//! has no API for it. On a small machine those pools fight tokio and each
//! other (the feasibility study measured 10–20× slower decode under CPU
//! contention), so the server runs candle single-threaded by default.
//!
//! Setting a variable of our own process is `unsafe` in edition 2024 (other
//! threads may read the environment), and the workspace forbids `unsafe`.
//! Instead, the binary asks [`thread_env`] first thing in `main`, before it
//! starts any thread, and when that is not empty replaces itself (same pid,
//! same arguments) with a copy whose environment has the variables
//! (`agentrt-server`'s `process.rs`). An operator who sets either variable
//! keeps full control.
//! [`compute_threads`] reports what candle actually uses, for the log.

/// The variables candle reads.
pub const CANDLE_NUM_THREADS: &str = "CANDLE_NUM_THREADS";
/// rayon's variable, which candle falls back on.
pub const RAYON_NUM_THREADS: &str = "RAYON_NUM_THREADS";

/// What the environment must add for candle to use `threads` threads:
/// both variables, or nothing when either is set already (an operator who
/// sets one keeps full control).
pub fn thread_env(threads: usize) -> Vec<(&'static str, String)> {
    if std::env::var_os(CANDLE_NUM_THREADS).is_some()
        || std::env::var_os(RAYON_NUM_THREADS).is_some()
    {
        return Vec::new();
    }
    let n = threads.max(1).to_string();
    vec![(CANDLE_NUM_THREADS, n.clone()), (RAYON_NUM_THREADS, n)]
}

/// The compute threads candle uses: the calling thread plus its barrier
/// pool's `candle-bp-*` threads (counted from `/proc/self/task`, so only
/// meaningful after the first inference). `None` where `/proc` is missing.
pub fn compute_threads() -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let pool = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|name| name.starts_with("candle-bp"))
        .count();
    Some(pool + 1)
}

/// The thread count candle reads from the environment (`None`: unset, so
/// it uses every physical core).
pub fn configured_threads() -> Option<usize> {
    [CANDLE_NUM_THREADS, RAYON_NUM_THREADS]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}
