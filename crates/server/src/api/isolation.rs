//! The `isolation` of requests and answers is `sandkasten_types::Tier` itself; `IsolationName` is only its OpenAPI
//! description (what each tier isolates and costs), named by `#[schema(value_type = IsolationName)]` on every
//! `Tier` field: never constructed, never converted. A create's tier is resolved (the request's, else the server's default) and refused when it cannot run
//! here by `lifecycle::resolve_tier`, before anything of the sandbox exists.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How strongly a sandbox is isolated from the host, and what that costs (the schema of `sandkasten_types::Tier`).
///
/// - `process`: Linux namespaces (user, mount, pid, ipc, uts, network, cgroup), pivot_root onto a read-only root, a
///   seccomp allowlist, landlock, no capabilities, cgroup limits. The code shares the host kernel: one kernel bug
///   is a host compromise. Fastest (milliseconds to start, no memory of its own); for code trusted not to carry a
///   kernel exploit.
/// - `gvisor`: gVisor (`runsc`): the code's system calls are served by a user-space kernel (the Sentry), itself
///   confined by a tight seccomp filter, so the code reaches only a few dozen host syscalls; gVisor's own network
///   stack (loopback only; egress through the proxy as on `process`). No KVM needed. Costs a slower start (about
///   0.15 s more), some memory per sandbox, and slower syscall-heavy code (file I/O, many small processes).
/// - `microvm`: a guest kernel of its own (Debian's cloud kernel) in QEMU's `microvm` machine, the VMM itself in a
///   process-tier jail; no network device in the guest (egress through the proxy over a virtio-serial door). A kernel
///   exploit reaches only the guest. Costs a VM boot per sandbox (seconds under software emulation, where the host
///   has no usable KVM) and the guest's RAM. Pauses (the VMM's cgroup frozen) and warm pools work on it; memory
///   snapshots not yet.
/// - `auto`: chosen per sandbox by the server. Not available yet (422 `tier_unavailable`).
#[allow(dead_code)] // a schema only: fields are `Tier`s
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IsolationName {
    /// Namespaces, seccomp, landlock and cgroups around code that shares the host kernel.
    #[default]
    Process,
    /// gVisor: a user-space kernel between the code and the host's.
    Gvisor,
    /// A guest kernel in a jailed VMM.
    Microvm,
    /// Chosen by the server (not available yet).
    Auto,
}

#[cfg(test)]
mod tests {
    use sandkasten_types::Tier;

    use super::*;

    #[test]
    fn the_schema_names_exactly_the_tiers() -> Result<(), serde_json::Error> {
        let described = [IsolationName::Process, IsolationName::Gvisor, IsolationName::Microvm, IsolationName::Auto];
        assert_eq!(described.len(), Tier::ALL.len());
        for (name, tier) in described.iter().zip(Tier::ALL) {
            assert_eq!(serde_json::to_value(name)?, serde_json::to_value(tier)?);
        }
        Ok(())
    }

    #[test]
    fn a_misspelt_or_mistyped_tier_is_refused_naming_the_allowed_values() {
        for bad in ["\"gvsior\"", "7", "null"] {
            let message = serde_json::from_str::<Tier>(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains("process, gvisor, microvm, auto"), "{bad}: {message}");
        }
    }
}
