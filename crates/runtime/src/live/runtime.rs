//! `LiveRuntime`: long-lived sandboxes for an async owner. Creation and destruction go through the spawner (a
//! single-threaded helper process); everything else goes straight to each sandbox's agent. Code contexts live in
//! `Contexts`, background commands in `BackgroundCommands`; both are forgotten with their sandbox.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sandkasten_types::{
    CellOutcome, CodeLanguage, CodeRun, CommandEvent, CommandExit, CommandSpec, CommandStatus, ContextInfo, Entrance,
    Failure, FailureKind, OutputChunk, ResourceUsage, SandboxSpec, Tier,
};
use tokio::sync::mpsc;

use super::agent_client::{AgentClient, sandbox_gone};
use super::commands::BackgroundCommands;
use super::contexts::{CellOutput, Contexts};
use crate::backend::gvisor;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::spawner::{SpawnerClient, SpawnerEvent};
use sandkasten_cgroups::{Cgroup, Hierarchy};

/// A live sandbox as the owner sees it: its agent's channel and a pidfd of the agent (for joining its network
/// namespace without a pid-reuse race).
struct Member {
    agent: Arc<AgentClient>,
    pidfd: Arc<OwnedFd>,
    tier: Tier,
    /// The sandbox's cgroup, read (never written) for what its commands used.
    cgroup: Option<Arc<Cgroup>>,
}

type Agents = Arc<Mutex<HashMap<String, Member>>>;

/// Long-lived sandboxes of one owner.
pub struct LiveRuntime {
    config: RuntimeConfig,
    hierarchy: Option<Hierarchy>,
    runsc_found: bool,
    spawner: Arc<SpawnerClient>,
    agents: Agents,
    contexts: Arc<Contexts>,
    commands: Arc<BackgroundCommands>,
}

fn lock_poisoned() -> RuntimeError {
    RuntimeError::sys("sandbox table", std::io::Error::other("lock poisoned"))
}

impl LiveRuntime {
    /// Starts the spawner (`program spawner`, normally the running `sandkasten` binary).
    pub fn start(program: &Path, config: RuntimeConfig) -> Result<LiveRuntime, RuntimeError> {
        let agents: Agents = Arc::default();
        let contexts: Arc<Contexts> = Arc::default();
        let commands: Arc<BackgroundCommands> = Arc::default();
        let (forget, forget_contexts) = (Arc::clone(&agents), Arc::clone(&contexts));
        let forget_commands = Arc::clone(&commands);
        let spawner = SpawnerClient::start(program, &config.gvisor, move |event| {
            if let Ok(mut map) = forget.lock() {
                match event {
                    SpawnerEvent::Exited { id } => {
                        map.remove(&id);
                        forget_contexts.forget(&id);
                        forget_commands.forget(&id);
                    }
                    SpawnerEvent::SpawnerGone => {
                        map.clear();
                        forget_contexts.forget_all();
                        forget_commands.forget_all();
                    }
                }
            }
        })?;
        let runsc_found = gvisor::runsc_installed(&config);
        let hierarchy = Hierarchy::detect().ok();
        Ok(LiveRuntime { config, hierarchy, runsc_found, spawner: Arc::new(spawner), agents, contexts, commands })
    }

    /// Creates a sandbox under `id`; it is ready for commands when this returns. A spec the spawner refuses is
    /// `InvalidPath` (the request's fault), anything else `Internal`.
    pub async fn create(&self, id: &str, spec: &SandboxSpec) -> Result<(), Failure> {
        self.spawn(id, spec).await.map_err(|error| match error {
            RuntimeError::InvalidInput(message) => Failure::new(FailureKind::InvalidPath, message),
            other => Failure::new(FailureKind::Internal, other.to_string()),
        })
    }

    async fn spawn(&self, id: &str, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let spawner = Arc::clone(&self.spawner);
        let (owned_id, owned_spec) = (id.to_owned(), spec.clone());
        let spawned = tokio::task::spawn_blocking(move || spawner.spawn(&owned_id, &owned_spec))
            .await
            .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))??;
        let client = AgentClient::new(spawned.channel).map_err(|e| RuntimeError::sys("agent channel", e))?;
        // The agent is the spawner's child and cannot be reaped before the spawner hears of its exit, which reaches
        // us after this reply: the pid still names our agent here.
        let pid = rustix::process::Pid::from_raw(spawned.pid as i32)
            .ok_or_else(|| RuntimeError::sys("agent pid", std::io::Error::other("pid 0")))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| RuntimeError::sys("pidfd_open of the agent", std::io::Error::from(e)))?;
        let cgroup = self
            .hierarchy
            .as_ref()
            .and_then(|hierarchy| hierarchy.open(&self.config.cgroup_parent, id).ok().flatten())
            .map(Arc::new);
        let member = Member { agent: Arc::new(client), pidfd: Arc::new(pidfd), tier: spec.tier(), cgroup };
        self.agents.lock().map_err(|_| lock_poisoned())?.insert(id.to_owned(), member);
        Ok(())
    }

    /// Kills and removes a sandbox; returns what it used. A sandbox the spawner does not know is `NotFound`.
    pub async fn destroy(&self, id: &str) -> Result<ResourceUsage, Failure> {
        self.remove(id).await.map_err(|error| match error {
            RuntimeError::InvalidInput(message) => Failure::new(FailureKind::NotFound, message),
            other => Failure::new(FailureKind::Internal, other.to_string()),
        })
    }

    async fn remove(&self, id: &str) -> Result<ResourceUsage, RuntimeError> {
        self.agents.lock().map_err(|_| lock_poisoned())?.remove(id);
        self.contexts.forget(id);
        self.commands.forget(id);
        let spawner = Arc::clone(&self.spawner);
        let owned_id = id.to_owned();
        tokio::task::spawn_blocking(move || spawner.destroy(&owned_id))
            .await
            .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))?
    }

    /// Runs a command to its end; output chunks go to `output` as they arrive. The exit says which limit fired
    /// (the agent's timeout and disk checks, the cgroup's OOM kills and refused forks) and what the sandbox used
    /// meanwhile.
    pub async fn exec(
        &self,
        id: &str,
        spec: CommandSpec,
        output: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, Failure> {
        let (agent, cgroup) = self
            .agents
            .lock()
            .ok()
            .and_then(|map| map.get(id).map(|member| (Arc::clone(&member.agent), member.cgroup.clone())))
            .ok_or_else(sandbox_gone)?;
        let before = cgroup.as_ref().and_then(|cgroup| cgroup.usage().ok());
        let mut exit = agent.exec(spec, output).await?;
        if let (Some(cgroup), Some(before)) = (cgroup, before)
            && let Ok(after) = cgroup.usage()
        {
            super::limits::annotate(&mut exit, &before, &after);
        }
        Ok(exit)
    }

    /// The agent of a live sandbox.
    pub fn agent(&self, id: &str) -> Option<Arc<AgentClient>> {
        self.agents.lock().ok().and_then(|map| map.get(id).map(|member| Arc::clone(&member.agent)))
    }

    /// A non-blocking listener on `127.0.0.1:port` inside the sandbox's network namespace, held by the caller (the
    /// egress proxy's entrance). `None` when the sandbox is not alive.
    pub fn listen_in_sandbox(&self, id: &str, port: u16) -> Option<std::io::Result<Entrance>> {
        let (pidfd, tier) = self
            .agents
            .lock()
            .ok()
            .and_then(|map| map.get(id).map(|member| (Arc::clone(&member.pidfd), member.tier)))?;
        Some(match tier {
            // The Sentry's network stack is its own: the agent bridges the port to this socket instead.
            Tier::Gvisor => listen_on_door_socket(&self.config, id),
            _ => crate::backend::process::netns_listener::listen_in_netns(pidfd.as_fd(), port).map(Entrance::Tcp),
        })
    }

    /// Why sandboxes of `tier` cannot be created on this host, if they cannot (a message saying how to fix it).
    pub fn tier_unavailable(&self, tier: Tier) -> Option<String> {
        if let Some(reason) = tier.unavailable_reason() {
            return Some(reason.to_owned());
        }
        if tier == Tier::Gvisor && !self.runsc_found {
            return Some(gvisor::runsc_missing(&self.config));
        }
        None
    }

    /// Whether the sandbox is alive (its agent has not exited).
    pub fn is_alive(&self, id: &str) -> bool {
        self.agent(id).is_some()
    }

    fn running_agent(&self, id: &str) -> Result<Arc<AgentClient>, Failure> {
        self.agent(id).ok_or_else(sandbox_gone)
    }

    /// Creates a code context in a sandbox and starts its interpreter.
    pub async fn create_context(&self, id: &str, language: CodeLanguage) -> Result<ContextInfo, Failure> {
        let agent = self.running_agent(id)?;
        self.contexts.create(&agent, id, language).await
    }

    /// Starts a spare interpreter of `language` in a sandbox with the `preload` modules loaded; the sandbox's first
    /// context of that language adopts it instead of starting cold.
    pub async fn prepare_context(&self, id: &str, language: CodeLanguage, preload: &[String]) -> Result<(), Failure> {
        let agent = self.running_agent(id)?;
        self.contexts.prepare(&agent, id, language, preload).await
    }

    /// Kills a sandbox's spare interpreters (none of its contexts will adopt them) and waits until they have exited.
    pub async fn discard_prepared_contexts(&self, id: &str) {
        self.contexts.discard_spares(id).await;
    }

    /// The code contexts of a sandbox.
    pub fn list_contexts(&self, id: &str) -> Result<Vec<ContextInfo>, Failure> {
        self.running_agent(id)?;
        Ok(self.contexts.list(id))
    }

    /// Removes a code context (its interpreter is killed).
    pub async fn remove_context(&self, id: &str, context: &str) -> Result<(), Failure> {
        self.running_agent(id)?;
        self.contexts.remove(id, context).await
    }

    /// Restarts a code context's interpreter (its state is lost).
    pub async fn restart_context(&self, id: &str, context: &str) -> Result<ContextInfo, Failure> {
        let agent = self.running_agent(id)?;
        self.contexts.restart(&agent, id, context).await
    }

    /// Runs one cell; its output goes to `output` as it arrives.
    pub async fn run_code(&self, id: &str, request: CodeRun, output: CellOutput) -> Result<CellOutcome, Failure> {
        let agent = self.running_agent(id)?;
        self.contexts.run(&agent, id, request, output).await
    }

    /// Starts a background command under `command_id`, keeping up to `output_limit` bytes of each output stream.
    pub async fn start_command(
        &self,
        id: &str,
        command_id: &str,
        spec: CommandSpec,
        output_limit: u64,
    ) -> Result<CommandStatus, Failure> {
        let agent = self.running_agent(id)?;
        let status = self.commands.start(&agent, id, command_id, spec, output_limit).await?;
        if !self.is_alive(id) {
            // Destroyed while the command started: do not keep it.
            self.commands.forget(id);
            return Err(sandbox_gone());
        }
        Ok(status)
    }

    /// The running and recently ended background commands of a sandbox.
    pub fn list_commands(&self, id: &str) -> Result<Vec<CommandStatus>, Failure> {
        self.running_agent(id)?;
        Ok(self.commands.list(id))
    }

    /// A background command's retained output from byte `offset` on, its live output, then its end.
    pub fn stream_command(
        &self,
        id: &str,
        command_id: &str,
        offset: u64,
    ) -> Result<mpsc::Receiver<CommandEvent>, Failure> {
        self.running_agent(id)?;
        self.commands.stream(id, command_id, offset)
    }

    /// Writes to a background command's stdin; closes it when `eof` is set.
    pub async fn command_stdin(&self, id: &str, command_id: &str, data: &[u8], eof: bool) -> Result<(), Failure> {
        self.running_agent(id)?;
        self.commands.stdin(id, command_id, data, eof).await
    }

    /// Signals a background command's process group (SIGKILL on an ended command is a no-op).
    pub async fn signal_command(&self, id: &str, command_id: &str, signal: i32) -> Result<(), Failure> {
        self.running_agent(id)?;
        if signal == libc::SIGKILL {
            return self.commands.kill(id, command_id).await;
        }
        self.commands.signal(id, command_id, signal).await
    }
}

/// A non-blocking unix listener at the gVisor sandbox's door socket (in its bundle, bound into the sandbox).
fn listen_on_door_socket(config: &RuntimeConfig, id: &str) -> std::io::Result<Entrance> {
    use std::os::unix::fs::PermissionsExt;
    let path = gvisor::door_socket(config, id);
    // A socket left by an earlier door of this sandbox (the policy went to none and back) is replaced.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    Ok(Entrance::Unix(listener))
}
