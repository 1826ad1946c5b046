//! The `process` tier: the agent runs in new user, mount, pid, ipc, uts, net and cgroup namespaces, builds the root
//! itself (pivot_root), and starts every command through the jail (caps dropped, no_new_privs, landlock, seccomp).
//! `launch` starts the agent; `netns_listener` opens the egress door inside the sandbox's network namespace.

pub(crate) mod launch;
pub(crate) mod netns_listener;

use std::os::unix::net::UnixStream;

use sandkasten_protocol::AgentPlan;
use sandkasten_types::{SandboxFile, SandboxSpec, Tier};

use super::{NotServing, TierBackend, wait_until_serving};
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;
use launch::Launcher;

/// The process tier, as one launcher sees it.
pub(crate) struct ProcessTier<'a> {
    /// Where sandboxes are recorded and which cgroup hierarchy and agent binary they use.
    pub(crate) launcher: Launcher<'a>,
}

impl TierBackend for ProcessTier<'_> {
    fn tier(&self) -> Tier {
        Tier::Process
    }

    fn probe(&self) -> Option<String> {
        // Checked once when the owner started (root, user namespaces, cgroups): it could not run otherwise.
        None
    }

    fn spawn(
        &self,
        guard: &mut SandboxGuard,
        _spec: &SandboxSpec,
        _files: &[SandboxFile],
        plan: &AgentPlan,
    ) -> Result<UnixStream, RuntimeError> {
        // The root files travel in the plan: this tier's agent builds its root itself.
        let mut channel = self.launcher.launch(guard, plan)?;
        match wait_until_serving(&mut channel) {
            Ok(()) => Ok(channel),
            Err(NotServing::SetupFailed(message)) => setup_failed(message),
            Err(NotServing::Answered(msg)) => setup_failed(format!("the agent answered {msg} before it was ready")),
            Err(NotServing::Silent) => setup_failed("the sandbox's agent exited before it was ready".to_owned()),
        }
    }

    /// The cgroup freezer: every process of the sandbox (its agent too) stops getting CPU and keeps its memory.
    fn pause(&self, guard: &mut SandboxGuard) -> Result<(), RuntimeError> {
        Ok(guard.cgroup()?.freeze()?)
    }

    fn resume(&self, guard: &mut SandboxGuard) -> Result<Option<UnixStream>, RuntimeError> {
        guard.cgroup()?.thaw()?;
        Ok(None)
    }
}

fn setup_failed(why: String) -> Result<UnixStream, RuntimeError> {
    Err(RuntimeError::TierFailed(format!("sandbox setup failed: {why}")))
}
