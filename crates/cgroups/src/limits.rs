//! The limits a cgroup is created with, each with its unit; `None` leaves a resource unlimited.

/// Limits to apply when creating a cgroup; `None` = leave unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory in bytes (v1 `memory.limit_in_bytes`, v2 `memory.max`); swap is limited to 0 alongside it.
    pub memory_bytes: Option<u64>,
    /// Processes and threads alive at once (`pids.max`).
    pub pids_max: Option<u64>,
    /// CPU time per period in microseconds (v1 `cpu.cfs_quota_us`, v2 first field of `cpu.max`).
    pub cpu_quota_us: Option<u64>,
    /// Length of the CPU bandwidth period in microseconds; used only with `cpu_quota_us`. Default 100 000.
    pub cpu_period_us: u64,
}

impl Default for CgroupLimits {
    fn default() -> Self {
        CgroupLimits { memory_bytes: None, pids_max: None, cpu_quota_us: None, cpu_period_us: 100_000 }
    }
}

impl CgroupLimits {
    /// The controllers these limits need, in the order they are applied.
    pub(crate) fn needed_controllers(&self) -> Vec<&'static str> {
        let mut needed = Vec::new();
        if self.memory_bytes.is_some() {
            needed.push("memory");
        }
        if self.pids_max.is_some() {
            needed.push("pids");
        }
        if self.cpu_quota_us.is_some() {
            needed.push("cpu");
        }
        needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_unlimited_with_100ms_period() {
        let limits = CgroupLimits::default();
        assert_eq!(limits.cpu_period_us, 100_000);
        assert!(limits.needed_controllers().is_empty());
    }

    #[test]
    fn each_limit_needs_its_controller() {
        let limits =
            CgroupLimits { memory_bytes: Some(1), pids_max: Some(2), cpu_quota_us: Some(3), ..CgroupLimits::default() };
        assert_eq!(limits.needed_controllers(), ["memory", "pids", "cpu"]);
    }
}
