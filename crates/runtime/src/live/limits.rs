//! What only the host sees of a command in a long-lived sandbox: the sandbox's cgroup counters before and after it
//! say whether the OOM killer struck, whether forks hit the pids limit, and how much CPU the sandbox spent meanwhile.
//! The agent reports the rest (its exit, the timeout, a full disk).

use std::sync::Arc;

use sandkasten_cgroups::{Cgroup, Usage};
use sandkasten_types::{CommandExit, LimitKind, ResourceUsage};

/// A sandbox's cgroup and its counters when a command started.
pub(crate) struct Counters {
    cgroup: Option<Arc<Cgroup>>,
    before: Option<Usage>,
}

impl Counters {
    /// Reads the counters of `cgroup` (none: the exit stays as the agent reported it).
    pub(crate) fn before(cgroup: Option<Arc<Cgroup>>) -> Counters {
        let before = cgroup.as_ref().and_then(|cgroup| cgroup.usage().ok());
        Counters { cgroup, before }
    }

    /// Completes `exit` from the counters now.
    pub(crate) fn annotate(&self, exit: &mut CommandExit) {
        if let (Some(cgroup), Some(before)) = (&self.cgroup, &self.before)
            && let Ok(after) = cgroup.usage()
        {
            annotate(exit, before, &after);
        }
    }
}

/// Completes `exit` from the sandbox's cgroup counters taken when the command started (`before`) and ended.
pub(crate) fn annotate(exit: &mut CommandExit, before: &Usage, after: &Usage) {
    // A microVM's agent reports its guest kernel's OOM kills itself; the host's cgroup sees the others.
    exit.oom_killed |= after.oom_kills > before.oom_kills;
    let pids_hit = after.pids_limit_hits > before.pids_limit_hits;
    exit.limit = match exit.limit {
        Some(LimitKind::Time) => Some(LimitKind::Time),
        _ if exit.oom_killed => Some(LimitKind::Memory),
        Some(other) => Some(other),
        None if pids_hit => Some(LimitKind::Pids),
        None => None,
    };
    exit.usage = ResourceUsage {
        cpu_user_ms: after.cpu_user_ns.saturating_sub(before.cpu_user_ns) / 1_000_000,
        cpu_system_ms: after.cpu_system_ns.saturating_sub(before.cpu_system_ns) / 1_000_000,
        memory_peak_bytes: after.memory_peak_bytes,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_that_moved_name_the_limit_and_cpu_is_the_difference() {
        let before = Usage { cpu_user_ns: 1_000_000, oom_kills: 1, ..Usage::default() };
        let after = Usage { cpu_user_ns: 6_000_000, oom_kills: 2, memory_peak_bytes: 9, ..Usage::default() };
        let mut exit = CommandExit { signal: Some(9), ..CommandExit::default() };
        annotate(&mut exit, &before, &after);
        assert!(exit.oom_killed);
        assert_eq!(exit.limit, Some(LimitKind::Memory));
        assert_eq!(exit.usage, ResourceUsage { cpu_user_ms: 5, cpu_system_ms: 0, memory_peak_bytes: 9 });

        let mut timed_out = CommandExit { timed_out: true, limit: Some(LimitKind::Time), ..CommandExit::default() };
        annotate(&mut timed_out, &Usage::default(), &Usage { pids_limit_hits: 3, ..Usage::default() });
        assert_eq!(timed_out.limit, Some(LimitKind::Time), "the timeout is what ended it");

        let mut forks = CommandExit { exit_code: Some(1), ..CommandExit::default() };
        annotate(&mut forks, &Usage::default(), &Usage { pids_limit_hits: 3, ..Usage::default() });
        assert_eq!(forks.limit, Some(LimitKind::Pids));
    }
}
