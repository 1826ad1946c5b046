//! The phases of one `POST /v1/run`, from the request to its end: when the sandbox was there (created, or claimed
//! from a warm pool: ≈ 0 on a hit; for a microVM booted for this run, when its VMM was launched), when its guest
//! booted (`vm_boot`, the runtime's `VmBoot`; 0 on the other tiers and for a pooled VM), when its files were written, when the program's `execve` succeeded, when the
//! first output byte came, and the end. Reported in the answer (`phases`, the same `PhaseTimings` as every exec
//! result, cumulative milliseconds; `duration_ms` is the end) and in `sandkasten_run_phase_seconds{phase}`.

use std::sync::OnceLock;
use std::time::Instant;

use sandkasten_runtime::VmBoot;
use sandkasten_types::{CommandExit, PhaseTimings};

use crate::metrics::Metrics;

/// Marks the phases of one run as they pass; each mark counts once.
#[derive(Debug)]
pub(crate) struct RunClock {
    started: Instant,
    /// `started` on CLOCK_MONOTONIC (ns), the clock of `VmBoot`.
    started_ns: u64,
    allocated: OnceLock<f64>,
    vm: OnceLock<VmBoot>,
    files_ready: OnceLock<f64>,
    program_started: OnceLock<f64>,
    first_output: OnceLock<f64>,
}

impl RunClock {
    /// A clock started at `started` (when the request arrived).
    pub(crate) fn new(started: Instant) -> RunClock {
        let since = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        RunClock {
            started,
            started_ns: sandkasten_runtime::monotonic_ns().saturating_sub(since),
            allocated: OnceLock::new(),
            vm: OnceLock::new(),
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

    /// How the sandbox's microVM started, as the runtime says (`None`: not a microVM). A VM launched before the
    /// request (a warm pool's) did not boot for this run and leaves `vm_boot` 0.
    pub(crate) fn vm_booted(&self, vm: Option<VmBoot>) {
        if let Some(vm) = vm.filter(|vm| vm.launched_ns >= self.started_ns) {
            self.vm.get_or_init(|| vm);
        }
    }

    /// Milliseconds from the request to `ns` (CLOCK_MONOTONIC).
    fn ms_at(&self, ns: u64) -> f64 {
        ns.saturating_sub(self.started_ns) as f64 / 1e6
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
        let allocated = self.allocated.get().copied().unwrap_or(total);
        let (allocate, vm_boot) = match self.vm.get() {
            Some(vm) => {
                let allocate = self.ms_at(vm.launched_ns).min(allocated);
                (allocate, self.ms_at(vm.booted_ns).clamp(allocate, allocated))
            }
            None => (allocated, 0.0),
        };
        let filesystem_ready = self.files_ready.get().copied().unwrap_or(allocated).max(allocated);
        let runtime_ready = self.program_started.get().copied().unwrap_or(filesystem_ready).max(filesystem_ready);
        let first_command = self.first_output.get().copied().unwrap_or(total).max(runtime_ready);
        let phases = PhaseTimings { allocate, vm_boot, filesystem_ready, runtime_ready, first_command };
        if vm_boot > 0.0 {
            metrics.run_phase("vm_boot", vm_boot / 1000.0);
        }
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
    fn a_vm_booted_for_the_run_has_its_phase_between_allocate_and_the_files() {
        let clock = RunClock::new(Instant::now());
        let launched_ns = sandkasten_runtime::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let booted_ns = sandkasten_runtime::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(1));
        clock.allocated();
        clock.vm_booted(Some(VmBoot { accel: sandkasten_types::MicrovmAccel::Tcg, booted_ns, launched_ns }));
        clock.files_ready();
        let (phases, _) = clock.finish(&Metrics::new());
        assert!(phases.vm_boot - phases.allocate >= 3.0, "the boot took 3 ms: {phases:?}");
        assert!(phases.vm_boot <= phases.filesystem_ready, "{phases:?}");

        let pooled = RunClock::new(Instant::now());
        pooled.allocated();
        pooled.vm_booted(Some(VmBoot { accel: sandkasten_types::MicrovmAccel::Tcg, booted_ns, launched_ns }));
        let (phases, _) = pooled.finish(&Metrics::new());
        assert_eq!(phases.vm_boot, 0.0, "a pooled VM booted before the request: {phases:?}");
    }

    #[test]
    fn a_silent_command_has_its_first_command_phase_at_the_end() {
        let clock = RunClock::new(Instant::now());
        clock.allocated();
        let (phases, total) = clock.finish(&Metrics::new());
        assert!(phases.first_command <= total && phases.first_command >= phases.runtime_ready, "{phases:?}");
    }
}
