//! Process CPU time and memory from `/proc`: `utime + stime` from
//! `/proc/<pid>/stat` (whole process, threads that already exited
//! included), `VmRSS` / `VmHWM` from `/proc/<pid>/status`.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// `utime + stime` in clock ticks, from the text of `/proc/<pid>/stat`.
///
/// The command name (field 2) may contain spaces and parentheses, so the
/// fields are counted from the last `)`: after it come field 3 (`state`)
/// onwards, which puts `utime` (field 14) at index 11 and `stime` at 12.
pub(crate) fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The value in kB of a `Name:   1234 kB` line of `/proc/<pid>/status`.
pub(crate) fn parse_status_kb(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        let mut parts = value.split_whitespace();
        let n = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | None => Some(n),
            Some(_) => None,
        }
    })
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 when that fails).
pub(crate) fn clk_tck() -> u64 {
    static TCK: OnceLock<u64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|&t| t > 0)
            .unwrap_or(100)
    })
}

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcSample {
    /// CPU time (user + system) in microseconds.
    pub(crate) cpu_us: u64,
    /// Resident set in kB.
    pub(crate) rss_kb: u64,
    /// Peak resident set in kB.
    pub(crate) hwm_kb: u64,
    /// Threads.
    pub(crate) threads: u64,
}

/// Reads `/proc/<pid>`; `None` when the process is gone.
pub(crate) fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ticks = parse_stat_cpu_ticks(&stat)?;
    Some(ProcSample {
        cpu_us: ticks * 1_000_000 / clk_tck(),
        rss_kb: parse_status_kb(&status, "VmRSS").unwrap_or(0),
        hwm_kb: parse_status_kb(&status, "VmHWM").unwrap_or(0),
        threads: parse_status_kb(&status, "Threads").unwrap_or(0),
    })
}

/// This process.
pub(crate) fn sample_self() -> ProcSample {
    sample(std::process::id()).unwrap_or_default()
}

/// The sum over `pids` (those still alive).
pub(crate) fn sample_all(pids: &[u32]) -> ProcSample {
    let mut total = ProcSample::default();
    for s in pids.iter().filter_map(|&p| sample(p)) {
        total.cpu_us += s.cpu_us;
        total.rss_kb += s.rss_kb;
        total.hwm_kb += s.hwm_kb;
        total.threads += s.threads;
    }
    total
}

/// Samples the summed `VmRSS` and thread count of some processes (one, or
/// a process tree) every `every` in the background and keeps the largest
/// values seen, until [`RssSampler::stop`].
#[derive(Debug)]
pub(crate) struct RssSampler {
    peak_kb: Arc<AtomicU64>,
    peak_threads: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub(crate) fn start(pids: Vec<u32>, every: Duration) -> Self {
        let peak_kb = Arc::new(AtomicU64::new(0));
        let peak_threads = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let peak_kb = Arc::clone(&peak_kb);
            let peak_threads = Arc::clone(&peak_threads);
            let stop = Arc::clone(&stop);
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let s = sample_all(&pids);
                    peak_kb.fetch_max(s.rss_kb, Ordering::Relaxed);
                    peak_threads.fetch_max(s.threads, Ordering::Relaxed);
                    tokio::time::sleep(every).await;
                }
            }
        });
        Self {
            peak_kb,
            peak_threads,
            stop,
            task,
        }
    }

    /// The peak `VmRSS` seen (kB) and the peak thread count.
    pub(crate) async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
        (
            self.peak_kb.load(Ordering::Relaxed),
            self.peak_threads.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_is_utime_plus_stime_even_with_odd_command_names() {
        let stat = "4242 (agent (rt) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 \
                    731 269 0 0 20 0 5 0 123456 1000000 2000 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(1000));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        assert_eq!(parse_stat_cpu_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn status_lines_are_read_in_kb() {
        let status =
            "Name:\tagentrt-server\nVmHWM:\t   20480 kB\nVmRSS:\t   12345 kB\nThreads:\t5\n";
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(12_345));
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(20_480));
        assert_eq!(parse_status_kb(status, "Threads"), Some(5));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
        // A prefix of another name does not match.
        assert_eq!(parse_status_kb("VmRSSx:\t1 kB\n", "VmRSS"), None);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample_self();
        assert!(s.rss_kb > 0);
        assert!(s.hwm_kb >= s.rss_kb);
    }
}
