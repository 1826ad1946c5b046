//! The `process` tier: the agent runs in new user, mount, pid, ipc, uts, net and cgroup namespaces, builds the root
//! itself (pivot_root), and starts every command through the jail (caps dropped, no_new_privs, landlock, seccomp).
//! `launch` starts the agent; `netns_listener` opens the egress door inside the sandbox's network namespace; the
//! one-shot fast path (the program's streams as pipes straight from the agent) is `io_loop`, `stdin_pump`, `result`.

pub(crate) mod io_loop;
pub(crate) mod launch;
pub(crate) mod netns_listener;
pub(crate) mod result;
pub(crate) mod stdin_pump;

use std::os::unix::net::UnixStream;

use sandkasten_protocol::AgentPlan;
use sandkasten_types::{SandboxFile, SandboxSpec, Tier};

use super::TierBackend;
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
        self.launcher.launch(guard, plan, &[], &[])
    }
}
