//! `VmBoot`: what a microVM's start reports beside its channel: the acceleration its guest runs with (as its backend
//! chose it for QEMU's command line) and when the guest said it had booted. The spawner sends it with `Spawned`; the
//! live runtime keeps it per sandbox for the server (`SandboxRuntime::vm_boot`), a one-shot run puts it in its result.

use sandkasten_types::MicrovmAccel;
use serde::{Deserialize, Serialize};

/// How a microVM sandbox's guest started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmBoot {
    /// The acceleration QEMU ran the guest with: `kvm` or `tcg` (never `auto`).
    pub accel: MicrovmAccel,
    /// When the guest agent's `GuestBooted` greeting arrived at the host (CLOCK_MONOTONIC, ns: the same clock in
    /// every process of the host).
    pub booted_ns: u64,
    /// When its VMM was launched (CLOCK_MONOTONIC, ns): the sandbox's cgroup and disk existed by then, so a result's
    /// `allocate` phase ends here at the latest, and `booted_ns - launched_ns` is the boot.
    #[serde(default)]
    pub launched_ns: u64,
}

impl VmBoot {
    /// The boot's length in milliseconds (QEMU's launch to the agent's greeting).
    pub fn boot_ms(&self) -> f64 {
        self.booted_ns.saturating_sub(self.launched_ns) as f64 / 1e6
    }
}
