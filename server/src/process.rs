//! The environment the binary gives itself before any thread exists.
//!
//! Two settings can only be made through the environment, read once by
//! code that runs before or outside `main`'s control: candle's compute
//! thread count (`agentrt_local_model::threads`) and glibc malloc's arena
//! count. Setting a variable of the running process is `unsafe` in edition
//! 2024 (other threads may read the environment) and the workspace forbids
//! `unsafe`; so `main`, before it starts any thread, collects what is
//! missing and, when something is, replaces itself once (same pid, same
//! arguments) with a copy whose environment has it ([`reexec_with`]). The
//! copy finds everything set and carries on. A variable the operator set
//! is never overridden.
//!
//! # Why the arena count
//!
//! glibc gives threads up to 8 × cores malloc arenas, and after a large
//! block is freed it raises its mmap threshold, so later large buffers (a
//! 1 MiB message is copied several times per turn) are carved from those
//! arenas and each arena keeps its own high-water mark resident. Measured
//! (RELIABILITY.md, "Memory on the embedded store": 60 s of 4 clients
//! writing 1 MiB turns, release build): the resident set reached 135 MiB
//! with glibc's defaults, past the bound, and 90 MiB with two arenas, for
//! the same turns written; over 300 s (23 GB written) two arenas stayed
//! at or under 106 MiB. Pinning the mmap threshold instead
//! (`MALLOC_MMAP_THRESHOLD_=131072`) kept it at 55 MiB but cost 37 % of the
//! 1 MiB-turn throughput and 15–25 % of the CPU per short turn (sled's
//! 516 KiB log buffers are then mapped and unmapped at every flush).

use std::ffi::OsString;

/// glibc's variable for the most malloc arenas.
pub const MALLOC_ARENA_MAX: &str = "MALLOC_ARENA_MAX";

/// The arenas the server runs with unless told otherwise.
pub const ARENAS: &str = "2";

/// What the environment (`lookup`) must add for malloc: [`MALLOC_ARENA_MAX`]
/// = [`ARENAS`], unless the variable or a `glibc.malloc.arena_max`
/// tunable is set already. Nothing off glibc.
pub fn malloc_env(lookup: impl Fn(&str) -> Option<OsString>) -> Vec<(&'static str, String)> {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) || lookup(MALLOC_ARENA_MAX).is_some() {
        return Vec::new();
    }
    let tuned = lookup("GLIBC_TUNABLES")
        .is_some_and(|t| t.to_string_lossy().contains("glibc.malloc.arena_max"));
    if tuned {
        return Vec::new();
    }
    vec![(MALLOC_ARENA_MAX, ARENAS.to_owned())]
}

/// Re-executes this binary with `env` added to its environment. `Ok(())`
/// when `env` is empty (nothing to do); on success it does not return;
/// `Err` says why the re-exec failed (the caller logs it and carries on
/// without the settings).
pub fn reexec_with(env: Vec<(&'static str, String)>) -> Result<(), String> {
    if env.is_empty() {
        return Ok(());
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let mut args = std::env::args_os();
        let mut command = std::process::Command::new(exe);
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        let err = command.args(args).envs(env).exec();
        Err(format!("cannot re-execute this binary: {err}"))
    }
    #[cfg(not(unix))]
    {
        Err("re-executing is supported on unix only".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn an_unset_arena_count_is_added() {
        assert_eq!(malloc_env(env(&[])), [(MALLOC_ARENA_MAX, "2".to_owned())]);
        let other_tunable = env(&[("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")]);
        assert_eq!(malloc_env(other_tunable).len(), 1);
    }

    #[test]
    fn an_operators_setting_is_kept() {
        assert!(malloc_env(env(&[(MALLOC_ARENA_MAX, "8")])).is_empty());
        let tunable = env(&[("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")]);
        assert!(malloc_env(tunable).is_empty());
    }

    #[test]
    fn nothing_to_add_means_no_reexec() {
        assert_eq!(reexec_with(Vec::new()), Ok(()));
    }
}
