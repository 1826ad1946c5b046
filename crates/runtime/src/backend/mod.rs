//! The isolation tiers behind one seam, `TierBackend` (the shape of cloud-hypervisor's `Hypervisor`): a tier knows
//! whether this host can run it (`probe`), how to start a sandbox's agent in the host resources the caller allocated
//! (`spawn` → the agent's channel, connected and serving), how to `pause` and `resume` one (the process tier's cgroup
//! freezer, gVisor's checkpoint to disk and restore), and how to take a memory snapshot of a running one and start a
//! new one from it (gVisor and microVM; the process tier answers which tiers can). Destroying is the
//! same for every tier (kill the cgroup, reap, read usage, release: `SandboxGuard`). Everything above the seam
//! (commands, files, code contexts, pools, the server) speaks the agent protocol and is written once for all tiers.
//!
//! One folder per tier: `process/` (namespaces + pivot_root + seccomp + landlock + cgroups), `gvisor/` (runsc) and
//! `microvm/` (a guest kernel in QEMU, the VMM itself in a process-tier jail).
//! `runner` runs one-shot executions on either; `oneshot` is that run over the agent protocol (spawn → uploads → exec
//! → destroy), the same protocol long-lived sandboxes speak.

pub mod gvisor;
pub(crate) mod microvm;
pub(crate) mod oneshot;
pub(crate) mod process;
pub mod runner;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use sandkasten_protocol::{AgentPlan, Envelope, Message, read_frame};
use sandkasten_types::{SandboxFile, SandboxSpec, Tier};

use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// One isolation tier. The lifecycle hooks after `spawn`: `pause`/`resume` (the spawner's `Pause`/`Resume`), and
/// `memory_snapshot`/`spawn_from_memory` (`MemorySnapshot`, `SpawnFromMemory`).
#[allow(dead_code)]
pub(crate) trait TierBackend {
    /// Which tier this is.
    fn tier(&self) -> Tier;

    /// Why this host cannot run the tier, if it cannot: a message that says how to fix it. Cheap (cached).
    fn probe(&self) -> Option<String>;

    /// Starts the agent of the sandbox whose record and cgroup `guard` holds, with `plan` (its `mode` is `Serve`)
    /// and the sandbox's root `files`; returns the host end of its channel once the agent serves. On error the caller
    /// drops the guard, which removes everything.
    fn spawn(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        files: &[SandboxFile],
        plan: &AgentPlan,
    ) -> Result<UnixStream, RuntimeError>;

    /// Pauses a sandbox: no CPU while paused, and whatever else the tier can release (the process tier keeps its
    /// memory; gVisor keeps nothing running). A tier that cannot says which can.
    fn pause(&self, guard: &mut SandboxGuard) -> Result<(), RuntimeError> {
        let _ = guard;
        Err(RuntimeError::InvalidInput(format!(
            "the {} tier cannot pause sandboxes yet; the process tier can (create the sandbox with isolation \"process\")",
            self.tier()
        )))
    }

    /// Continues a paused sandbox where it was; returns the host end of its new channel when the agent's old one
    /// ended with the pause (gVisor: the restored sandbox's), `None` when the old one serves on.
    fn resume(&self, guard: &mut SandboxGuard) -> Result<Option<UnixStream>, RuntimeError> {
        let _ = guard;
        Err(not_supported(self.tier(), "resume"))
    }

    /// Whether the tier takes memory snapshots (`Ok`), or why not.
    fn memory_snapshot_supported(&self) -> Result<(), RuntimeError> {
        Err(no_memory_snapshots(self.tier()))
    }

    /// Saves the running sandbox's whole state (memory, processes, its tmpfs files) into `dir` while it keeps
    /// running; the agent is quiesced by the caller. A tier that cannot says which can.
    fn memory_snapshot(&self, guard: &SandboxGuard, dir: &Path) -> Result<(), RuntimeError> {
        let _ = (guard, dir);
        Err(no_memory_snapshots(self.tier()))
    }

    /// Starts a new sandbox (the record and cgroup `guard` holds) from a memory snapshot in `dir` taken of a sandbox
    /// with the same `spec` (its root `files` and `plan` are written as for `spawn`, but the agent is the source's,
    /// plan included); returns the host end of its channel once it runs (its agent is quiet until `Resumed`).
    fn spawn_from_memory(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        files: &[SandboxFile],
        plan: &AgentPlan,
        dir: &Path,
    ) -> Result<UnixStream, RuntimeError> {
        let _ = (guard, spec, files, plan, dir);
        Err(no_memory_snapshots(self.tier()))
    }
}

/// A tier's helper program (runsc, QEMU): `program` itself when it is a path, else the first executable of that
/// name on this process's PATH (what the availability check and the start both use, so they cannot disagree).
pub(crate) fn resolve_program(program: &Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.components().count() > 1 {
        return executable(program).then(|| program.to_path_buf());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|candidate| executable(candidate))
}

/// Why a tier cannot snapshot a sandbox's memory.
pub(crate) fn no_memory_snapshots(tier: Tier) -> RuntimeError {
    RuntimeError::InvalidInput(format!(
        "memory snapshots need the gvisor tier (runsc checkpoint) or the microvm tier (QEMU's migration to a file); \
         the {tier} tier cannot take or start one (create the sandbox with isolation \"gvisor\" or \"microvm\")"
    ))
}

#[allow(dead_code)]
fn not_supported(tier: Tier, operation: &str) -> RuntimeError {
    RuntimeError::InvalidInput(format!("{operation} is not supported by the {tier} tier yet"))
}

/// How long a new sandbox's agent may take to answer that it serves.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a new sandbox's agent did not start serving.
pub(crate) enum NotServing {
    /// It said why (`SetupFailed`).
    SetupFailed(String),
    /// It answered something other than `FilesystemReady` (this one, described).
    Answered(String),
    /// Its channel closed, or it said nothing within `READY_TIMEOUT`.
    Silent,
}

/// Waits for the agent's first frame: `FilesystemReady` (its root is built and it serves), or why not.
pub(crate) fn wait_until_serving(channel: &mut UnixStream) -> Result<(), NotServing> {
    channel.set_read_timeout(Some(READY_TIMEOUT)).map_err(|_| NotServing::Silent)?;
    let first = read_frame(channel);
    channel.set_read_timeout(None).map_err(|_| NotServing::Silent)?;
    match first {
        Ok(Some(Envelope { msg: Message::FilesystemReady { .. }, .. })) => Ok(()),
        Ok(Some(Envelope { msg: Message::SetupFailed { message }, .. })) => Err(NotServing::SetupFailed(message)),
        Ok(Some(other)) => Err(NotServing::Answered(format!("{:?}", other.msg))),
        Ok(None) | Err(_) => Err(NotServing::Silent),
    }
}

/// Every tier's backend, as one owner sees them.
pub(crate) struct Tiers<'a> {
    pub(crate) process: process::ProcessTier<'a>,
    pub(crate) gvisor: gvisor::GvisorTier<'a>,
    pub(crate) microvm: microvm::MicrovmTier<'a>,
}

impl<'a> Tiers<'a> {
    /// The tiers of `launcher`'s owner; gVisor sandboxes get `launcher` to restore into when `pausing`.
    pub(crate) fn new(launcher: process::launch::Launcher<'a>, pausing: bool) -> Tiers<'a> {
        let agent = launcher.agent.path.as_path();
        let gvisor = gvisor::GvisorTier::new(launcher.config, agent);
        Tiers {
            process: process::ProcessTier { launcher },
            gvisor: if pausing { gvisor.pausing(launcher) } else { gvisor },
            microvm: microvm::MicrovmTier::new(launcher, agent),
        }
    }
}

/// The tier backend for `tier`, or why it cannot be used.
pub(crate) fn backend_for<'a>(tier: Tier, tiers: &'a Tiers<'a>) -> Result<&'a dyn TierBackend, RuntimeError> {
    let backend: &dyn TierBackend = match tier {
        Tier::Process => &tiers.process,
        Tier::Gvisor => &tiers.gvisor,
        Tier::Microvm => &tiers.microvm,
        Tier::Auto => {
            let reason = tier.unavailable_reason().unwrap_or("this tier is not available");
            return Err(RuntimeError::InvalidInput(reason.to_owned()));
        }
    };
    if let Some(reason) = backend.probe() {
        return Err(RuntimeError::HostUnsupported(reason));
    }
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RuntimeConfig;

    #[test]
    fn auto_is_refused_with_its_reason_and_hooks_say_not_supported() {
        let config = RuntimeConfig::default();
        let hierarchy = sandkasten_cgroups::Hierarchy::detect();
        let Ok(hierarchy) = hierarchy else { return };
        let Ok(agent) = process::launch::AgentBinary::open(&RuntimeConfig {
            agent_program: Some("/proc/self/exe".into()),
            ..RuntimeConfig::default()
        }) else {
            return;
        };
        let launcher = process::launch::Launcher { config: &config, hierarchy: &hierarchy, agent: &agent };
        let tiers = Tiers::new(launcher, false);
        let refused = backend_for(Tier::Auto, &tiers).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("resolved before a sandbox exists"), "auto: {refused}");
        assert_eq!(backend_for(Tier::Process, &tiers).map(|b| b.tier()).ok(), Some(Tier::Process));
        let hook = not_supported(Tier::Gvisor, "pause").to_string();
        assert!(hook.contains("pause is not supported by the gvisor tier"), "{hook}");
    }
}
