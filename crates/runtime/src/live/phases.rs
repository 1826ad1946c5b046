//! The phases of one command in a sandbox that already exists, as the host sees them: from the request, when the
//! agent said the command's `execve` succeeded (`runtime_ready`) and when its first output byte came
//! (`first_command`, or its end without output). `allocate` and `filesystem_ready` are 0: the sandbox was there.

use std::time::Instant;

use sandkasten_types::PhaseTimings;

/// Marks a command's phases as its replies arrive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommandClock {
    sent: Instant,
    started_ms: Option<f64>,
    first_output_ms: Option<f64>,
}

impl CommandClock {
    /// A clock started now (the request is being sent).
    pub(crate) fn start() -> CommandClock {
        CommandClock { sent: Instant::now(), started_ms: None, first_output_ms: None }
    }

    fn now_ms(&self) -> f64 {
        self.sent.elapsed().as_secs_f64() * 1000.0
    }

    /// The agent reported the command started.
    pub(crate) fn started(&mut self) {
        if self.started_ms.is_none() {
            self.started_ms = Some(self.now_ms());
        }
    }

    /// Output arrived (only the first call counts).
    pub(crate) fn output(&mut self) {
        if self.first_output_ms.is_none() {
            self.first_output_ms = Some(self.now_ms());
        }
    }

    /// The phases at the command's end.
    pub(crate) fn finish(&self) -> PhaseTimings {
        let end = self.now_ms();
        let runtime_ready = self.started_ms.unwrap_or(end);
        let first_command = self.first_output_ms.unwrap_or(end).max(runtime_ready);
        PhaseTimings { allocate: 0.0, vm_boot: 0.0, filesystem_ready: 0.0, runtime_ready, first_command }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_cumulative_and_only_the_first_output_counts() {
        let mut clock = CommandClock::start();
        clock.started();
        std::thread::sleep(std::time::Duration::from_millis(2));
        clock.output();
        let first = clock.first_output_ms;
        std::thread::sleep(std::time::Duration::from_millis(2));
        clock.output();
        assert_eq!(clock.first_output_ms, first, "a later output moved the first");
        let phases = clock.finish();
        assert_eq!((phases.allocate, phases.filesystem_ready), (0.0, 0.0));
        assert!(phases.runtime_ready <= phases.first_command, "{phases:?}");
        assert!(phases.first_command >= 2.0, "{phases:?}");
    }

    #[test]
    fn a_command_without_output_has_its_first_command_phase_at_its_end() {
        let mut clock = CommandClock::start();
        clock.started();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let phases = clock.finish();
        assert!(phases.first_command >= 2.0 && phases.runtime_ready < phases.first_command, "{phases:?}");
    }
}
