//! Who the host's OOM killer picks in a gVisor sandbox's cgroup. A program's memory there is mapped into a systrap
//! stub process of its own, which the OOM killer weighs against the Sentry (its Go heap, the runsc binary, the parts
//! of the memory file it touched): with a Python memory bomb in a 96 MiB sandbox both hold ~55 MiB, so either was
//! picked. A stub killed ends its program and the sandbox lives on, reporting `oom_killed`; the Sentry killed ends the
//! whole sandbox. So the stubs carry an OOM score adjustment `HANDICAP` above the Sentry's: a stub is the pick unless
//! the Sentry alone holds the memory (tmpfs files no program maps), and then the sandbox dies whole.
//!
//! How: runsc starts with the raised score (`raised_score`, written in its pre-exec), so everything it starts inherits
//! it, among them systrap's source stub, from which the Sentry forks every later stub; once the sandbox runs,
//! `shield_runtime` sets runsc and its children (the Sentry, the gofer) back to our own score. Both directions stay
//! at or above our own score, so no capability is needed (root on some hosts, this project's CI among them, lacks
//! CAP_SYS_RESOURCE, without which no score can go below its floor; runsc's own way, the spec's `oomScoreAdj`, lowers
//! and fails there, and the runsc this project installs writes the number as a character besides).

use crate::guard::SandboxGuard;

/// How much more likely than the Sentry a stub is to be picked: in thousandths of the cgroup's limit
/// (`oom_score_adj`), so half the limit.
const HANDICAP: i32 = 500;

/// The score runsc starts with, as `/proc/self/oom_score_adj` takes it: `HANDICAP` above our own, at most 1000.
pub(super) fn raised_score() -> String {
    raised(own()).to_string()
}

/// Sets runsc and its children in `guard`'s cgroup back to our own OOM score (see the module doc). Best effort: a
/// sandbox whose scores stay raised works, only its memory limit may end it whole; that is logged.
pub(super) fn shield_runtime(guard: &SandboxGuard) {
    let Some(runsc) = guard.init_pid else { return };
    let pids = match guard.cgroup().map(|cgroup| cgroup.pids()) {
        Ok(Ok(pids)) => pids,
        Ok(Err(error)) => return tracing::warn!(sandbox = %guard.id, %error, "listing a gVisor sandbox's processes"),
        Err(error) => return tracing::warn!(sandbox = %guard.id, %error, "listing a gVisor sandbox's processes"),
    };
    let processes: Vec<(u32, Option<u32>)> = pids.into_iter().map(|pid| (pid, parent_of(pid))).collect();
    let score = own();
    for pid in runtime_processes(runsc, &processes) {
        if let Err(error) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), score.to_string()) {
            tracing::warn!(sandbox = %guard.id, pid, %error, "lowering the OOM score of a gVisor sandbox's runtime");
        }
    }
}

/// Our own OOM score adjustment (0 when unreadable).
fn own() -> i32 {
    crate::backend::process::launch::own_oom_score_adj()
}

/// The stubs' adjustment: `HANDICAP` above `own`, at most 1000.
fn raised(own: i32) -> i32 {
    own.saturating_add(HANDICAP).min(1000)
}

/// Of `processes` (pid, parent), runsc itself and its direct children (the Sentry, the gofer); the stubs are the
/// Sentry's children and theirs.
fn runtime_processes(runsc: u32, processes: &[(u32, Option<u32>)]) -> Vec<u32> {
    processes.iter().filter(|(pid, parent)| *pid == runsc || *parent == Some(runsc)).map(|(pid, _)| *pid).collect()
}

/// The parent of `pid` (`PPid:` in its status), if it still runs.
fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| line.strip_prefix("PPid:")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runsc_and_its_children_are_the_runtime_and_the_stubs_below_them_are_not() {
        // runsc 10 → gofer 11, Sentry 12 → stubs 13, 14 → 15.
        let processes = [(10, Some(1)), (11, Some(10)), (12, Some(10)), (13, Some(12)), (14, Some(12)), (15, Some(14))];
        assert_eq!(runtime_processes(10, &processes), vec![10, 11, 12]);
        assert_eq!(runtime_processes(99, &processes), Vec::<u32>::new());
    }

    #[test]
    fn a_stub_is_half_the_limit_more_likely_and_never_above_the_ceiling() {
        assert_eq!(raised(0), 500);
        assert_eq!(raised(-1000), -500);
        assert_eq!(raised(700), 1000);
    }

    #[test]
    fn a_process_parent_is_read_from_proc() {
        assert_eq!(parent_of(std::process::id()), Some(std::os::unix::process::parent_id()));
    }
}
