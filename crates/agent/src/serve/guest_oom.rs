//! OOM kills seen by a guest kernel the agent has to itself (a microVM's): there the host's cgroup never sees the
//! guest's OOM killer, so the agent reads the guest kernel's own counter (`oom_kill` in `/proc/vmstat`) around each
//! command and reports the memory limit itself. On the other tiers the counter is the host's (every sandbox's and
//! the host's own OOM kills), so it is never read there and the host's cgroup counters decide.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once, before serving, by an agent that is its guest kernel's only tenant.
static OWN_KERNEL: AtomicBool = AtomicBool::new(false);

/// Says that this agent's kernel is its own (called by the microVM guest before it serves).
pub fn own_the_kernel() {
    OWN_KERNEL.store(true, Ordering::Relaxed);
}

/// The guest kernel's OOM kills so far, where the kernel is the agent's own; `None` elsewhere.
pub fn count() -> Option<u64> {
    if !OWN_KERNEL.load(Ordering::Relaxed) {
        return None;
    }
    let vmstat = std::fs::read_to_string("/proc/vmstat").ok()?;
    vmstat.lines().find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
}
