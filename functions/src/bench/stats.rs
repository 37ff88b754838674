//! Timings and process resources: percentiles, CPU time and resident memory.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Milliseconds, fractional.
pub(super) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Percentiles of a set of timings, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct Stats {
    /// How many timings.
    #[serde(rename = "n")]
    pub(super) count: usize,
    /// The median.
    pub(super) p50_ms: f64,
    /// The 95th percentile.
    pub(super) p95_ms: f64,
    /// The longest.
    pub(super) max_ms: f64,
}

impl Stats {
    /// The percentiles of `samples` (sorted in place).
    pub(super) fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            let index = ((samples.len() as f64 * q).ceil() as usize).saturating_sub(1);
            samples.get(index).copied().unwrap_or_default()
        };
        Self {
            count: samples.len(),
            p50_ms: ms(at(0.50)),
            p95_ms: ms(at(0.95)),
            max_ms: ms(samples.last().copied().unwrap_or_default()),
        }
    }
}

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`.
pub(super) fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    // Clock ticks; Linux reports them at 100 per second on every platform Afterglow targets.
    Some((user + system) / 100.0)
}

/// Resident memory from `/proc/self/status` (Linux).
pub(super) mod memory {
    /// What the peak covers.
    pub(in crate::bench) const NOTE: &str =
        "VmHWM of a process that only opened the engine and answered the routes";

    fn status_mib(field: &str) -> Option<f64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|line| line.starts_with(field))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }

    /// The current resident size (MiB).
    pub(in crate::bench) fn current_mib() -> Option<f64> {
        status_mib("VmRSS:")
    }

    /// The peak resident size since the last reset (MiB).
    pub(in crate::bench) fn peak_mib() -> Option<f64> {
        status_mib("VmHWM:")
    }
}
