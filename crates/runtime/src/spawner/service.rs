//! The spawner's side: a single-threaded loop over the control socket and a signalfd for SIGCHLD.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use rustix::event::{PollFd, PollFlags, poll};
use sandkasten_cgroups::Hierarchy;
use sandkasten_jail::seccomp::SandboxFilter;
use sandkasten_types::ResourceUsage;

use super::messages::{SpawnerRequest, SpawnerResponse};
use super::transport::{receive, send, send_with};
use crate::backend::process::launch::{self, AgentBinary, Launcher};
use crate::backend::{Tiers, backend_for};
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;
use crate::{gc, plan};

/// A spawned sandbox as the spawner hands it on: its first host pid, the agent's channel, a microVM's egress door
/// channel and how its guest started.
type Spawned = (u32, OwnedFd, Option<OwnedFd>, Option<crate::VmBoot>);

/// Runs the spawner on `control` until the owner closes it; returns the process exit code.
pub fn run_spawner(control: OwnedFd, config: RuntimeConfig) -> i32 {
    let started = Spawner::new(config);
    let first = match &started {
        Ok(_) => SpawnerResponse::Ready,
        Err(error) => SpawnerResponse::Unusable { message: error.to_string() },
    };
    if let Err(error) = send(control.as_fd(), &first, None) {
        tracing::error!(%error, "the spawner could not report to its owner");
        return 1;
    }
    match started.and_then(|mut spawner| spawner.serve(&control)) {
        Ok(()) => 0,
        Err(error) => {
            tracing::error!(%error, "the spawner failed");
            1
        }
    }
}

struct Spawner {
    config: RuntimeConfig,
    hierarchy: Hierarchy,
    sandboxes: HashMap<String, SandboxGuard>,
    agent: AgentBinary,
}

fn child_signals() -> Result<OwnedFd, RuntimeError> {
    // SAFETY: an initialised set holding SIGCHLD; blocking it and reading it through a signalfd (owned below).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(RuntimeError::sys("pthread_sigmask", std::io::Error::last_os_error()));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(RuntimeError::sys("signalfd", std::io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

impl Spawner {
    fn new(config: RuntimeConfig) -> Result<Spawner, RuntimeError> {
        let hierarchy = Hierarchy::detect()
            .map_err(|e| RuntimeError::HostUnsupported(format!("no usable cgroup hierarchy: {e}")))?;
        // The agents compile the seccomp policy themselves; compiling it once here reports a broken policy at start.
        SandboxFilter::compile().map_err(sandkasten_jail::JailError::from)?;
        if let Err(error) = gc::collect(&config, &hierarchy) {
            tracing::warn!(%error, "garbage collection at spawner start failed");
        }
        // Every sandbox's agent is this same binary (`sandkasten agent`) unless the config names another.
        let agent = AgentBinary::open(&config)?;
        Ok(Spawner { config, hierarchy, sandboxes: HashMap::new(), agent })
    }

    fn serve(&mut self, control: &OwnedFd) -> Result<(), RuntimeError> {
        let signals = child_signals()?;
        loop {
            let mut fds = [PollFd::new(control, PollFlags::IN), PollFd::new(&signals, PollFlags::IN)];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(RuntimeError::sys("poll", e)),
            }
            let (control_ready, child_ready) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
            if child_ready {
                let mut drain = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
                while rustix::io::read(&signals, &mut drain).is_ok() {}
                self.reap_exited(control);
            }
            if control_ready {
                match receive::<SpawnerRequest>(control)? {
                    Some((request, _)) => self.handle(control, request)?,
                    None => break,
                }
            }
        }
        // The owner is gone: nothing may outlive it, not even the shared cgroup parent.
        self.sandboxes.clear();
        let _ = self.hierarchy.remove_parent(&self.config.cgroup_parent);
        Ok(())
    }

    fn handle(&mut self, control: &OwnedFd, request: SpawnerRequest) -> Result<(), RuntimeError> {
        match request {
            SpawnerRequest::Spawn { id, spec } => {
                let spawned = self.spawn(&id, &spec, None);
                self.answer_spawn(control, id, spawned)?;
            }
            SpawnerRequest::SpawnFromMemory { id, spec, dir } => {
                let spawned = self.spawn(&id, &spec, Some(&dir));
                self.answer_spawn(control, id, spawned)?;
            }
            SpawnerRequest::MemorySnapshot { id, dir } => {
                let reply = match self.lifecycle(&id, |backend, guard| backend.memory_snapshot(guard, &dir)) {
                    Ok(()) => SpawnerResponse::Done { id },
                    Err(failed) => failed,
                };
                send(control.as_fd(), &reply, None)?;
            }
            SpawnerRequest::Destroy { id } => {
                let reply = match self.sandboxes.remove(&id) {
                    Some(guard) => self.destroy(id, guard),
                    None => SpawnerResponse::Failed {
                        id: id.clone(),
                        invalid_input: true,
                        tier_failed: false,
                        message: format!("no sandbox {id} (it may have exited already)"),
                    },
                };
                send(control.as_fd(), &reply, None)?;
            }
            SpawnerRequest::Pause { id } => {
                let reply = match self.lifecycle(&id, |backend, guard| backend.pause(guard)) {
                    Ok(()) => SpawnerResponse::Done { id },
                    Err(failed) => failed,
                };
                send(control.as_fd(), &reply, None)?;
            }
            SpawnerRequest::Resume { id } => match self.lifecycle(&id, |backend, guard| backend.resume(guard)) {
                Ok(None) => send(control.as_fd(), &SpawnerResponse::Done { id }, None)?,
                Ok(Some(channel)) => {
                    let guard = self.sandboxes.get_mut(&id);
                    let pid = guard.as_ref().and_then(|guard| guard.init_pid).unwrap_or(0);
                    // A restarted microVM's new door channel goes to the runtime with the channel.
                    let door = guard.and_then(|guard| guard.door.take());
                    let fds: Vec<_> = std::iter::once(channel.as_fd()).chain(door.as_ref().map(AsFd::as_fd)).collect();
                    send_with(control.as_fd(), &SpawnerResponse::Restored { id, pid }, &fds)?;
                }
                Err(failed) => {
                    send(control.as_fd(), &failed, None)?;
                    self.lost_in_resume(control, &id);
                }
            },
        }
        Ok(())
    }

    /// Answers a `Spawn` or `SpawnFromMemory`: the channel, or why not.
    fn answer_spawn(
        &self,
        control: &OwnedFd,
        id: String,
        spawned: Result<Spawned, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        match spawned {
            Ok((pid, channel, door, vm_boot)) => {
                let fds: Vec<_> = std::iter::once(channel.as_fd()).chain(door.as_ref().map(AsFd::as_fd)).collect();
                send_with(control.as_fd(), &SpawnerResponse::Spawned { id, pid, vm_boot }, &fds)
            }
            Err(error) => {
                let invalid_input = matches!(error, RuntimeError::InvalidInput(_));
                let (tier_failed, message) = match error {
                    error @ (RuntimeError::Runsc(_) | RuntimeError::TierFailed(_)) => (true, error.to_string()),
                    other => (false, other.to_string()),
                };
                send(control.as_fd(), &SpawnerResponse::Failed { id, invalid_input, tier_failed, message }, None)
            }
        }
    }

    /// Runs a lifecycle hook of the sandbox's tier (`pause`, `resume`, `memory_snapshot`), or answers why not.
    fn lifecycle<T>(
        &mut self,
        id: &str,
        hook: impl FnOnce(&dyn crate::backend::TierBackend, &mut SandboxGuard) -> Result<T, RuntimeError>,
    ) -> Result<T, SpawnerResponse> {
        let failed = |invalid_input, message| SpawnerResponse::Failed {
            id: id.to_owned(),
            invalid_input,
            tier_failed: false,
            message,
        };
        let Some(mut guard) = self.sandboxes.remove(id) else {
            return Err(failed(true, format!("no sandbox {id} (it may have exited already)")));
        };
        let tier = guard.tier;
        let result = self.with_backend(tier, |backend| hook(backend, &mut guard));
        self.sandboxes.insert(id.to_owned(), guard);
        result.map_err(|error| match error {
            error @ RuntimeError::InvalidInput(_) => failed(true, error.to_string()),
            error => failed(false, error.to_string()),
        })
    }

    /// A sandbox whose resume failed after its tier had stopped it (a gVisor restore that did not come back): it is
    /// destroyed, never left half-alive, and reported as exited.
    fn lost_in_resume(&mut self, control: &OwnedFd, id: &str) {
        // Still checkpointed: the restore failed (a resume refused for another reason left it as it was).
        let checkpointed = |guard: &SandboxGuard| {
            guard.gvisor.as_ref().is_some_and(|files| files.checkpointed)
                || guard.microvm.as_ref().is_some_and(|files| files.released)
        };
        if !self.sandboxes.get(id).is_some_and(checkpointed) {
            return;
        }
        if let Some(guard) = self.sandboxes.remove(id)
            && let SpawnerResponse::Failed { message, .. } = self.destroy(id.to_owned(), guard)
        {
            tracing::error!(sandbox = %id, %message, "removing a sandbox that failed to resume failed; gc will retry");
        }
        let exited = SpawnerResponse::Exited { id: id.to_owned(), why: Some("its resume failed".to_owned()) };
        if let Err(error) = send(control.as_fd(), &exited, None) {
            tracing::warn!(%error, "reporting a sandbox that failed to resume failed");
        }
    }

    /// Creates a sandbox, from the memory snapshot in `memory` when given.
    fn spawn(
        &mut self,
        id: &str,
        spec: &sandkasten_types::SandboxSpec,
        memory: Option<&std::path::Path>,
    ) -> Result<Spawned, RuntimeError> {
        if self.sandboxes.contains_key(id) || id.is_empty() || id.contains('/') {
            return Err(RuntimeError::InvalidInput(format!("sandbox id '{id}' is in use or not a valid name")));
        }
        let launcher = Launcher { config: &self.config, hierarchy: &self.hierarchy, agent: &self.agent };
        let run_plan = plan::plan_live(spec)?;
        let files = run_plan.files.clone();
        let agent_plan = plan::agent_plan(spec, run_plan, launch::own_oom_score_adj());
        let tiers = Tiers::new(launcher, false);
        let backend = backend_for(spec.tier(), &tiers)?;
        if memory.is_some() {
            // Refused before anything exists.
            backend.memory_snapshot_supported()?;
        }
        let mut guard = launcher.allocate(id, spec)?;
        let channel = match memory {
            Some(dir) => backend.spawn_from_memory(&mut guard, spec, &files, &agent_plan, dir)?,
            None => backend.spawn(&mut guard, spec, &files, &agent_plan)?,
        };
        let (pid, vm_boot) = (guard.init_pid.unwrap_or(0), guard.vm_boot);
        // The door's host end goes to the runtime with the channel; the spawner keeps no copy.
        let door = guard.door.take();
        self.sandboxes.insert(id.to_owned(), guard);
        Ok((pid, channel.into(), door, vm_boot))
    }

    /// Calls `f` with the backend of `tier`.
    fn with_backend<T>(
        &self,
        tier: sandkasten_types::Tier,
        f: impl FnOnce(&dyn crate::backend::TierBackend) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let launcher = Launcher { config: &self.config, hierarchy: &self.hierarchy, agent: &self.agent };
        let tiers = Tiers::new(launcher, true);
        f(backend_for(tier, &tiers)?)
    }

    fn destroy(&self, id: String, mut guard: SandboxGuard) -> SpawnerResponse {
        guard.kill();
        guard.reap();
        let usage = guard.usage();
        match guard.release() {
            Ok(()) => {
                let _ = self.hierarchy.remove_parent(&self.config.cgroup_parent);
                SpawnerResponse::Destroyed {
                    id,
                    usage: ResourceUsage {
                        cpu_user_ms: usage.cpu_user_ns / 1_000_000,
                        cpu_system_ms: usage.cpu_system_ns / 1_000_000,
                        memory_peak_bytes: usage.memory_peak_bytes,
                    },
                }
            }
            Err(error) => {
                SpawnerResponse::Failed { id, invalid_input: false, tier_failed: false, message: error.to_string() }
            }
        }
    }

    /// Reaps agents that exited on their own, removes their resources and reports them.
    fn reap_exited(&mut self, control: &OwnedFd) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid on any child, non-blocking, writing into an owned integer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            let found =
                self.sandboxes.iter().find(|(_, guard)| guard.init_pid == Some(pid as u32)).map(|(id, _)| id.clone());
            let Some(id) = found else { continue };
            let mut why = None;
            if let Some(mut guard) = self.sandboxes.remove(&id) {
                why = guard.why_it_ended();
                guard.init_pid = None;
                guard.kill();
                if let Err(error) = guard.release() {
                    tracing::error!(%error, sandbox = %id, "removing an exited sandbox failed; gc will retry");
                }
                let _ = self.hierarchy.remove_parent(&self.config.cgroup_parent);
            }
            if let Err(error) = send(control.as_fd(), &SpawnerResponse::Exited { id, why }, None) {
                tracing::warn!(%error, "reporting an exited sandbox failed");
            }
        }
    }
}
