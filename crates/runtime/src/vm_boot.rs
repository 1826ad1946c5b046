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
}
