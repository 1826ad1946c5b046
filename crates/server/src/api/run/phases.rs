//! The phases of one `POST /v1/run`, from the request to its end: when the sandbox was there (created, or claimed
//! from a warm pool: ≈ 0 on a hit), when its files were written, when the first output byte came, and the end of the
//! command. Reported in the answer (`phases`, cumulative milliseconds) and in `run_phase_seconds{phase}`.

use std::sync::OnceLock;
use std::time::Instant;

use serde::Serialize;
use utoipa::ToSchema;

use crate::metrics::Metrics;

/// Cumulative milliseconds since the request started, per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct RunPhases {
    /// The sandbox exists: created, or claimed from a warm pool (then about 0).
    pub allocate: f64,
    /// The run's files (source, uploads) are written in it.
    pub files_ready: f64,
    /// The first byte of output arrived (absent when the command printed nothing).
    #[schema(required = true)]
    pub first_output: Option<f64>,
    /// The command (and its compile step) ended.
    pub total: f64,
}

/// Marks the phases of one run as they pass; each mark counts once.
#[derive(Debug)]
pub(crate) struct RunClock {
    started: Instant,
    allocated: OnceLock<f64>,
    files_ready: OnceLock<f64>,
    first_output: OnceLock<f64>,
}

impl RunClock {
    /// A clock started at `started` (when the request arrived).
    pub(crate) fn new(started: Instant) -> RunClock {
        RunClock { started, allocated: OnceLock::new(), files_ready: OnceLock::new(), first_output: OnceLock::new() }
    }

    fn now_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// The sandbox is there.
    pub(crate) fn allocated(&self) {
        self.allocated.get_or_init(|| self.now_ms());
    }

    /// Its files are written.
    pub(crate) fn files_ready(&self) {
        self.files_ready.get_or_init(|| self.now_ms());
    }

    /// Output arrived (only the first call counts).
    pub(crate) fn output(&self) {
        self.first_output.get_or_init(|| self.now_ms());
    }

    /// The phases at the command's end, recorded in the metrics.
    pub(crate) fn finish(&self, metrics: &Metrics) -> RunPhases {
        let total = self.now_ms();
        let allocate = self.allocated.get().copied().unwrap_or(total);
        let phases = RunPhases {
            allocate,
            files_ready: self.files_ready.get().copied().unwrap_or(allocate),
            first_output: self.first_output.get().copied(),
            total,
        };
        metrics.run_phase("allocate", phases.allocate / 1000.0);
        metrics.run_phase("files_ready", phases.files_ready / 1000.0);
        if let Some(first) = phases.first_output {
            metrics.run_phase("first_output", first / 1000.0);
        }
        metrics.run_phase("total", phases.total / 1000.0);
        phases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_cumulative_and_each_mark_counts_once() {
        let clock = RunClock::new(Instant::now());
        clock.allocated();
        clock.files_ready();
        clock.output();
        std::thread::sleep(std::time::Duration::from_millis(2));
        clock.output();
        let phases = clock.finish(&Metrics::new());
        assert!(phases.allocate <= phases.files_ready);
        let first = phases.first_output.unwrap_or(f64::MAX);
        assert!(phases.files_ready <= first && first < phases.total, "{phases:?}");
        assert!(phases.total - first >= 2.0, "the second output mark did not move the first: {phases:?}");
    }

    #[test]
    fn a_silent_command_has_no_first_output() {
        let clock = RunClock::new(Instant::now());
        clock.allocated();
        assert_eq!(clock.finish(&Metrics::new()).first_output, None);
    }
}
