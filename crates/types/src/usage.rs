//! What a running sandbox holds and has used at one moment (`SandboxUsage`), as the runtime reads it for the
//! server's metrics samples: CPU time from its cgroup, memory held now, and its writable filesystems' fill.

use serde::{Deserialize, Serialize};

/// How full a sandbox's writable filesystems are (its home, `/tmp` and `/dev/shm` together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Bytes in use.
    pub used_bytes: u64,
    /// Their sizes added up, in bytes.
    pub total_bytes: u64,
}

/// A reading of what a running sandbox uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SandboxUsage {
    /// CPU time (user and kernel, all processes) its current cgroup has used, in nanoseconds. A gVisor sandbox gets a
    /// new cgroup at each resume, so this may go down between two readings.
    pub cpu_ns: u64,
    /// Memory it holds now that is not reclaimable file cache (processes, tmpfs files), in bytes.
    pub memory_used_bytes: u64,
    /// File page cache charged to it now, in bytes.
    pub memory_cache_bytes: u64,
    /// Its writable filesystems.
    pub disk: DiskUsage,
}
