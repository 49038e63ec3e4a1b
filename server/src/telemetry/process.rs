//! Process and build series, read when metrics are collected: what every
//! Prometheus process collector exports, under the same names, and one
//! build-info series.
//!
//! - `process_cpu_seconds_total` (user + system), `process_resident_memory_bytes`,
//!   `process_virtual_memory_bytes`, `process_start_time_seconds` (Unix
//!   time), `process_open_fds` and `process_max_fds` (the soft limit):
//!   from `/proc/self` on Linux; elsewhere none of them.
//! - `agentrt_build_info` = 1, labelled `version` (the crate's), `revision`
//!   (the git revision it was built from, when known) and `rustc` (the
//!   compiler's version, when known).
//!
//! The instruments are named so that the usual OTLP → Prometheus mapping
//! (`.` → `_`, the unit as a suffix, `_total` on counters) gives these
//! names, whichever path the series take.

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

/// The version, revision and compiler of this build, as
/// `agentrt_build_info` labels them (an unknown one is left out).
pub fn build_labels() -> Vec<KeyValue> {
    let mut labels = vec![KeyValue::new("version", env!("CARGO_PKG_VERSION"))];
    for (key, value) in [
        ("revision", env!("AGENTRT_GIT_REVISION")),
        ("rustc", env!("AGENTRT_RUSTC_VERSION")),
    ] {
        if !value.is_empty() {
            labels.push(KeyValue::new(key, value));
        }
    }
    labels
}

/// Registers the process and build series with `meter`.
pub fn register(meter: &Meter) {
    let labels = build_labels();
    let _build = meter
        .u64_observable_gauge("agentrt.build.info")
        .with_description("Always 1; the labels name the version, git revision and compiler")
        .with_callback(move |observer| observer.observe(1, &labels))
        .build();
    #[cfg(target_os = "linux")]
    linux::register(meter);
}

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::OnceLock;

    use nix::unistd::{SysconfVar, sysconf};
    use opentelemetry::metrics::Meter;

    /// What one read of `/proc/self/stat` says.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub(super) struct Stat {
        /// User plus system CPU time, in clock ticks.
        pub(super) cpu_ticks: u64,
        /// Start time, in clock ticks after boot.
        pub(super) start_ticks: u64,
        /// Virtual memory size, in bytes.
        pub(super) vsize: u64,
        /// Resident set size, in pages.
        pub(super) rss_pages: u64,
    }

    /// `/proc/self/stat`'s fields after the command name, which may hold
    /// spaces and parentheses (hence the split at the last `)`).
    pub(super) fn parse_stat(text: &str) -> Option<Stat> {
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field N of proc(5) is fields[N - 3]: the state (field 3) first.
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            cpu_ticks: field(14)? + field(15)?,
            start_ticks: field(22)?,
            vsize: field(23)?,
            rss_pages: field(24)?,
        })
    }

    /// The boot time (`btime`, Unix seconds) in `/proc/stat`.
    pub(super) fn parse_btime(text: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }

    fn stat() -> Option<Stat> {
        parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
    }

    fn positive(var: SysconfVar) -> Option<u64> {
        sysconf(var)
            .ok()
            .flatten()
            .and_then(|v| u64::try_from(v).ok())
            .filter(|&v| v > 0)
    }

    fn ticks_per_second() -> Option<u64> {
        static TICKS: OnceLock<Option<u64>> = OnceLock::new();
        *TICKS.get_or_init(|| positive(SysconfVar::CLK_TCK))
    }

    fn page_size() -> Option<u64> {
        static PAGE: OnceLock<Option<u64>> = OnceLock::new();
        *PAGE.get_or_init(|| positive(SysconfVar::PAGE_SIZE))
    }

    #[allow(clippy::cast_precision_loss)]
    fn seconds(ticks: u64) -> Option<f64> {
        Some(ticks as f64 / ticks_per_second()? as f64)
    }

    /// The process's start, Unix seconds; it does not change, so it is
    /// read once.
    fn start_time() -> Option<f64> {
        static START: OnceLock<Option<f64>> = OnceLock::new();
        *START.get_or_init(|| {
            let btime = parse_btime(&std::fs::read_to_string("/proc/stat").ok()?)?;
            #[allow(clippy::cast_precision_loss)]
            Some(btime as f64 + seconds(stat()?.start_ticks)?)
        })
    }

    fn open_fds() -> Option<u64> {
        let entries = std::fs::read_dir("/proc/self/fd").ok()?;
        Some(entries.count() as u64)
    }

    fn max_fds() -> Option<u64> {
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
        Some(soft)
    }

    pub(super) fn register(meter: &Meter) {
        let _cpu = meter
            .f64_observable_counter("process.cpu")
            .with_unit("s")
            .with_description("User and system CPU time spent")
            .with_callback(|o| {
                if let Some(s) = stat().and_then(|s| seconds(s.cpu_ticks)) {
                    o.observe(s, &[]);
                }
            })
            .build();
        let _rss = meter
            .u64_observable_gauge("process.resident_memory")
            .with_unit("By")
            .with_description("Resident memory size")
            .with_callback(|o| {
                if let (Some(s), Some(page)) = (stat(), page_size()) {
                    o.observe(s.rss_pages.saturating_mul(page), &[]);
                }
            })
            .build();
        let _vsize = meter
            .u64_observable_gauge("process.virtual_memory")
            .with_unit("By")
            .with_description("Virtual memory size")
            .with_callback(|o| {
                if let Some(s) = stat() {
                    o.observe(s.vsize, &[]);
                }
            })
            .build();
        let _start = meter
            .f64_observable_gauge("process.start_time")
            .with_unit("s")
            .with_description("Start time of the process since the Unix epoch")
            .with_callback(|o| {
                if let Some(t) = start_time() {
                    o.observe(t, &[]);
                }
            })
            .build();
        let _open = meter
            .u64_observable_gauge("process.open_fds")
            .with_description("Open file descriptors")
            .with_callback(|o| {
                if let Some(n) = open_fds() {
                    o.observe(n, &[]);
                }
            })
            .build();
        let _max = meter
            .u64_observable_gauge("process.max_fds")
            .with_description("Most open file descriptors allowed (the soft limit)")
            .with_callback(|o| {
                if let Some(n) = max_fds() {
                    o.observe(n, &[]);
                }
            })
            .build();
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::linux::{Stat, parse_btime, parse_stat};

    #[test]
    fn stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let text = "4242 (agent (rt) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 75 0 0 20 0 9 0 987654 123456789 2048 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 17664 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_ticks: 325,
                start_ticks: 987_654,
                vsize: 123_456_789,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("4242 (truncated) S 1 2"), None);
        assert_eq!(
            parse_btime("cpu  1 2 3\nintr 5\nbtime 1764000000\nprocesses 9\n"),
            Some(1_764_000_000)
        );
        assert_eq!(parse_btime("cpu 1\n"), None);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let text = std::fs::read_to_string("/proc/self/stat").unwrap();
        let stat = parse_stat(&text).unwrap();
        assert!(stat.vsize > 0 && stat.rss_pages > 0, "{stat:?}");
    }
}
