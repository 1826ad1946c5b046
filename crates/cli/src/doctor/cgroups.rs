//! The cgroups check: which hierarchy `sandkasten_cgroups` detects, and whether a cgroup with memory, pids and CPU
//! limits can really be created (and removed) in it.

use std::sync::atomic::{AtomicU32, Ordering};

use sandkasten_cgroups::{CgroupLimits, Hierarchy};

use super::host;
use super::report::{Check, CheckId};

/// Limits for the probe cgroup: one of each kind, so every controller a sandbox uses is exercised.
fn probe_limits() -> CgroupLimits {
    CgroupLimits {
        memory_bytes: Some(64 << 20),
        pids_max: Some(16),
        cpu_quota_us: Some(50_000),
        ..CgroupLimits::default()
    }
}

/// A cgroup name no other doctor run (or concurrent check in this process) uses.
fn probe_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("sandkasten-doctor-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Detects the hierarchy and creates/removes `sandkasten-doctor-<pid>-<n>` at its root with all three limits.
pub fn check() -> Check {
    let hierarchy = match Hierarchy::detect() {
        Ok(hierarchy) => hierarchy,
        Err(e) => {
            return Check::fail(
                CheckId::Cgroups,
                host::error_chain(&e),
                "mount cgroup v2 at /sys/fs/cgroup (or the v1 memory, pids, cpu,cpuacct and freezer controllers)",
            );
        }
    };
    let description = hierarchy.describe();
    let name = probe_name();
    match hierarchy.create("", &name, &probe_limits()) {
        Ok(cgroup) => {
            let missing = cgroup.missing_controllers().to_vec();
            let removed = cgroup.remove();
            match (missing.is_empty(), removed) {
                (_, Err(e)) => Check::warn(
                    CheckId::Cgroups,
                    format!("{description}; created a probe cgroup but could not remove it: {}", host::error_chain(&e)),
                    format!("remove the leftover probe cgroup {name} (rmdir in each controller)"),
                ),
                (true, Ok(())) => Check::ok(
                    CheckId::Cgroups,
                    format!("{description}; created a cgroup with memory, pids and cpu limits"),
                ),
                (false, Ok(())) => Check::warn(
                    CheckId::Cgroups,
                    format!("{description}; created a cgroup without: {}", missing.join(", ")),
                    "enable the missing controllers (v2: add them to cgroup.subtree_control up to the root)",
                ),
            }
        }
        Err(e) => Check::fail(
            CheckId::Cgroups,
            format!("{description}; creating a cgroup with limits failed: {}", host::error_chain(&e)),
            "run as root with a writable cgroup hierarchy that has the memory, pids and cpu controllers",
        ),
    }
}
