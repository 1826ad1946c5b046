//! Each running sandbox's usage samples (CPU use, memory held, disk fill), taken every `[metrics]
//! sample_interval_s` by the sampler (`usage_sampler`) and on each metrics request, kept in the server's memory: the last
//! `samples_kept` per sandbox (a few dozen bytes each), kept while it is paused (nothing is sampled then), forgotten
//! when it ends. What
//! `GET /v1/sandboxes/{id}/metrics` and the E2B facade's `get_metrics()` answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use sandkasten_types::SandboxUsage;
use serde::Serialize;

use crate::store::SandboxRecord;

/// A request-time reading this close to the last sample replaces it instead of adding one.
const MIN_SPACING_MS: i64 = 1000;

/// One sample of what a sandbox used.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct UsageSample {
    /// When it was taken, ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// CPU used since the sample before (or since the sandbox started), in percent of the sandbox's `limits.cpus`
    /// (100 = all of its CPU allowance).
    pub cpu_used_pct: f64,
    /// Memory held that is not reclaimable file cache (processes, tmpfs files), in bytes.
    pub memory_used_bytes: u64,
    /// File page cache charged to the sandbox, in bytes.
    pub memory_cache_bytes: u64,
    /// Bytes in use on its writable filesystems (home, `/tmp`, `/dev/shm`).
    pub disk_used_bytes: u64,
    /// Their sizes added up, in bytes.
    pub disk_total_bytes: u64,
}

/// One sandbox's samples and the CPU reading the next one is measured from.
#[derive(Debug, Default)]
struct Series {
    /// When the last reading was taken and the CPU time it showed.
    last_reading: Option<(i64, u64)>,
    /// The reading the last sample's CPU share was measured from (`None`: the sandbox's start).
    baseline: Option<(i64, u64)>,
    samples: VecDeque<UsageSample>,
}

/// The samples of every running sandbox.
#[derive(Debug)]
pub(crate) struct UsageSamples {
    kept: usize,
    series: Mutex<HashMap<String, Series>>,
}

impl UsageSamples {
    /// Keeps the last `kept` samples of each sandbox.
    pub(crate) fn new(kept: usize) -> UsageSamples {
        UsageSamples { kept: kept.max(1), series: Mutex::default() }
    }

    /// Adds a reading of `sandbox` taken at `now_ms`. Unless `always`, a reading closer than [`MIN_SPACING_MS`] to
    /// the last sample replaces it (so the newest sample is fresh, and requests cannot flood the series).
    pub(crate) fn add(&self, sandbox: &SandboxRecord, usage: &SandboxUsage, now_ms: i64, always: bool) {
        let Ok(mut book) = self.series.lock() else { return };
        let series = book.entry(sandbox.id.clone()).or_default();
        let replace = !always && series.samples.back().is_some_and(|last| now_ms - last.timestamp_ms < MIN_SPACING_MS);
        let base = if replace { series.baseline } else { series.last_reading };
        let (since_ms, since_cpu_ns) = match base {
            // A gVisor sandbox's cgroup is new after each resume: its CPU time starts again from 0.
            Some((at, cpu_ns)) if cpu_ns <= usage.cpu_ns => (at, cpu_ns),
            Some((at, _)) => (at, 0),
            None => (sandbox.created_ms, 0),
        };
        if replace {
            series.samples.pop_back();
        }
        series.baseline = base;
        series.last_reading = Some((now_ms, usage.cpu_ns));
        let wall_ns = (now_ms - since_ms).max(1) as f64 * 1e6;
        let allowance = sandbox.spec.limits.cpus.max(0.01);
        let cpu_used_pct = ((usage.cpu_ns - since_cpu_ns) as f64 / (wall_ns * allowance) * 100.0).clamp(0.0, 100.0);
        series.samples.push_back(UsageSample {
            timestamp_ms: now_ms,
            cpu_used_pct: (cpu_used_pct * 100.0).round() / 100.0,
            memory_used_bytes: usage.memory_used_bytes,
            memory_cache_bytes: usage.memory_cache_bytes,
            disk_used_bytes: usage.disk.used_bytes,
            disk_total_bytes: usage.disk.total_bytes,
        });
        while series.samples.len() > self.kept {
            series.samples.pop_front();
        }
    }

    /// The kept samples of `id` taken in `from_ms..=to_ms`, oldest first.
    pub(crate) fn between(&self, id: &str, from_ms: i64, to_ms: i64) -> Vec<UsageSample> {
        let Ok(book) = self.series.lock() else { return Vec::new() };
        book.get(id)
            .map(|series| {
                let within = |s: &&UsageSample| (from_ms..=to_ms).contains(&s.timestamp_ms);
                series.samples.iter().filter(within).copied().collect()
            })
            .unwrap_or_default()
    }

    /// Forgets every sandbox not in `running` (running or paused).
    pub(crate) fn keep_only(&self, running: &[SandboxRecord]) {
        if let Ok(mut book) = self.series.lock() {
            book.retain(|id, _| running.iter().any(|record| &record.id == id));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sandkasten_types::{DiskUsage, SandboxSpec};

    fn record(cpus: f64) -> SandboxRecord {
        let mut spec = SandboxSpec::default();
        spec.limits.cpus = cpus;
        SandboxRecord {
            id: "sb-0000000000000001".into(),
            tenant: "t".into(),
            state: crate::store::SandboxState::Running,
            spec,
            isolation: Default::default(),
            metadata: Default::default(),
            created_ms: 10_000,
            expires_ms: 99_000,
            paused_ms: None,
            pause_snapshot: None,
            lifecycle: Default::default(),
            ended_ms: None,
            end_reason: None,
        }
    }

    fn usage(cpu_ms: u64) -> SandboxUsage {
        SandboxUsage {
            cpu_ns: cpu_ms * 1_000_000,
            memory_used_bytes: 5,
            memory_cache_bytes: 6,
            disk: DiskUsage { used_bytes: 7, total_bytes: 8 },
        }
    }

    #[test]
    fn cpu_is_a_share_of_the_allowance_since_the_sample_before() {
        let samples = UsageSamples::new(10);
        let sandbox = record(0.5);
        // 250 ms of CPU in the first 1 s of its life, at half a CPU: 50 %.
        samples.add(&sandbox, &usage(250), 11_000, false);
        // Then 500 ms more in 1 s: all of it.
        samples.add(&sandbox, &usage(750), 12_000, false);
        // A restored gVisor sandbox's new cgroup: 100 ms since the last reading, counted from 0.
        samples.add(&sandbox, &usage(100), 14_000, false);
        let got: Vec<f64> = samples.between(&sandbox.id, 0, i64::MAX).iter().map(|s| s.cpu_used_pct).collect();
        assert_eq!(got, [50.0, 100.0, 10.0]);
        let first = samples.between(&sandbox.id, 0, 11_000);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].memory_used_bytes, first[0].disk_total_bytes), (5, 8));
    }

    #[test]
    fn the_series_is_bounded_and_requests_cannot_flood_it() {
        let samples = UsageSamples::new(3);
        let sandbox = record(1.0);
        for second in 0..10 {
            // The sampler's reading, then a request's a moment later, which replaces it (measured from the same
            // reading as the sample it replaces).
            samples.add(&sandbox, &usage(second * 10), 20_000 + second as i64 * 1000, true);
            samples.add(&sandbox, &usage(second * 10 + 1), 20_100 + second as i64 * 1000, false);
        }
        let kept = samples.between(&sandbox.id, 0, i64::MAX);
        assert_eq!(kept.iter().map(|s| s.timestamp_ms).collect::<Vec<_>>(), [27_100, 28_100, 29_100]);
        // From the reading at 28 100 (81 ms) to 29 100 (91 ms): 10 ms in 1 s at one CPU.
        assert_eq!(kept[2].cpu_used_pct, 1.0);
        samples.keep_only(&[]);
        assert!(samples.between(&sandbox.id, 0, i64::MAX).is_empty());
    }
}
