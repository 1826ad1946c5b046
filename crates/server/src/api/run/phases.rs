//! The phases of one `POST /v1/run`, from the request to its end: when the sandbox was there (created, or claimed
//! from a warm pool: ≈ 0 on a hit), when its files were written, when the program's `execve` succeeded, when the
//! first output byte came, and the end. Reported in the answer (`phases`, the same `PhaseTimings` as every exec
//! result, cumulative milliseconds; `duration_ms` is the end) and in `sandkasten_run_phase_seconds{phase}`.

use std::sync::OnceLock;
use std::time::Instant;

use sandkasten_types::{CommandExit, PhaseTimings};

use crate::metrics::Metrics;

/// Marks the phases of one run as they pass; each mark counts once.
#[derive(Debug)]
pub(crate) struct RunClock {
    started: Instant,
    allocated: OnceLock<f64>,
    files_ready: OnceLock<f64>,
    program_started: OnceLock<f64>,
    first_output: OnceLock<f64>,
}

impl RunClock {
    /// A clock started at `started` (when the request arrived).
    pub(crate) fn new(started: Instant) -> RunClock {
        RunClock {
            started,
            allocated: OnceLock::new(),
            files_ready: OnceLock::new(),
            program_started: OnceLock::new(),
            first_output: OnceLock::new(),
        }
    }

    /// Milliseconds since the request.
    pub(crate) fn now_ms(&self) -> f64 {
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

    /// The program runs: its `execve` succeeded `at_ms` after the request (a zygote's: when it got the input).
    pub(crate) fn program_started(&self, at_ms: f64) {
        self.program_started.get_or_init(|| at_ms);
    }

    /// Output arrived (only the first call counts).
    pub(crate) fn output(&self) {
        self.first_output.get_or_init(|| self.now_ms());
    }

    /// The run's phases at its end and the end itself (ms since the request), recorded in the metrics.
    pub(crate) fn finish(&self, metrics: &Metrics) -> (PhaseTimings, f64) {
        let total = self.now_ms();
        let allocate = self.allocated.get().copied().unwrap_or(total);
        let filesystem_ready = self.files_ready.get().copied().unwrap_or(allocate).max(allocate);
        let runtime_ready = self.program_started.get().copied().unwrap_or(filesystem_ready).max(filesystem_ready);
        let first_command = self.first_output.get().copied().unwrap_or(total).max(runtime_ready);
        let phases = PhaseTimings { allocate, vm_boot: 0.0, filesystem_ready, runtime_ready, first_command };
        for (name, ms) in [
            ("allocate", allocate),
            ("filesystem_ready", filesystem_ready),
            ("runtime_ready", runtime_ready),
            ("first_command", first_command),
            ("total", total),
        ] {
            metrics.run_phase(name, ms / 1000.0);
        }
        (phases, total)
    }
}

/// Marks the program's start from its exit's phases, which count from `sent_ms` (when it was sent, ms since the
/// request).
pub(crate) fn mark_program(clock: &RunClock, sent_ms: f64, exit: &CommandExit) {
    clock.program_started(sent_ms + exit.phases.runtime_ready);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_cumulative_and_each_mark_counts_once() {
        let clock = RunClock::new(Instant::now());
        clock.allocated();
        clock.files_ready();
        clock.program_started(clock.now_ms());
        clock.output();
        std::thread::sleep(std::time::Duration::from_millis(2));
        clock.output();
        let (phases, total) = clock.finish(&Metrics::new());
        assert!(phases.allocate <= phases.filesystem_ready, "{phases:?}");
        assert!(phases.filesystem_ready <= phases.runtime_ready, "{phases:?}");
        assert!(phases.runtime_ready <= phases.first_command && phases.first_command < total, "{phases:?}");
        assert!(total - phases.first_command >= 2.0, "the second output mark moved the first: {phases:?}");
    }

    #[test]
    fn a_silent_command_has_its_first_command_phase_at_the_end() {
        let clock = RunClock::new(Instant::now());
        clock.allocated();
        let (phases, total) = clock.finish(&Metrics::new());
        assert!(phases.first_command <= total && phases.first_command >= phases.runtime_ready, "{phases:?}");
    }
}
