//! `LiveRuntime`: long-lived sandboxes for an async owner. Creation and destruction go through the spawner (a
//! single-threaded helper process); everything else goes straight to each sandbox's agent. Code contexts live in
//! `Contexts`, background commands in `BackgroundCommands`; both are forgotten with their sandbox. What the server
//! calls is its `SandboxRuntime` implementation (`sandbox_runtime.rs`); this file owns the sandbox table.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sandkasten_types::{
    CommandExit, CommandSpec, Entrance, Failure, FailureKind, OutputChunk, ResourceUsage, SandboxSpec, SandboxUsage,
    Tier,
};
use tokio::sync::mpsc;

use super::agent_client::{AgentClient, sandbox_gone};
use super::commands::BackgroundCommands;
use super::contexts::{Contexts, KernelHost};
use super::limits::Counters;
use super::supervisor::Supervisor;
use crate::backend::gvisor;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::sandbox_runtime::LostSandbox;
use crate::spawner::SpawnerEvent;
use sandkasten_cgroups::{Cgroup, Hierarchy};

/// A live sandbox as the owner sees it: its agent's channel and a pidfd of the agent (for joining its network
/// namespace without a pid-reuse race).
struct Member {
    agent: Arc<AgentClient>,
    pidfd: Arc<OwnedFd>,
    tier: Tier,
    /// The sandbox's cgroup, read (never written) for what its commands used.
    cgroup: Option<Arc<Cgroup>>,
    /// Since when it is paused, while it is.
    paused_at: Option<std::time::Instant>,
    /// A microVM's egress door, held for its life: it ends when the member is dropped.
    _door: Option<super::vm_door::VmDoor>,
    /// How its microVM's guest started (microvm tier only).
    vm_boot: Option<crate::VmBoot>,
    /// Its memory limit (kernels that size themselves by the machine's memory are told it).
    memory_bytes: u64,
}

type Agents = Arc<Mutex<HashMap<String, Member>>>;

/// How many explained endings `LiveRuntime` holds for requests that have not asked yet (each a line of a console).
const MAX_ENDINGS_HELD: usize = 256;

/// How long a request whose sandbox vanished waits for the spawner to say why (the channel breaks a moment before
/// the spawner reaps the sandbox and reports it).
const ENDING_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Long-lived sandboxes of one owner.
pub struct LiveRuntime {
    config: RuntimeConfig,
    hierarchy: Option<Hierarchy>,
    spawner: Arc<Supervisor>,
    agents: Agents,
    /// Sandboxes that died on their own (their agent, or the whole spawner), not yet reported to the owner.
    lost: Arc<Mutex<Vec<LostSandbox>>>,
    /// Why sandboxes that died on their own ended, where their tier could tell, until a request asks
    /// (`why_ended`); at most `MAX_ENDINGS_HELD`.
    endings: Arc<Mutex<HashMap<String, String>>>,
    contexts: Arc<Contexts>,
    commands: Arc<BackgroundCommands>,
}

fn lock_poisoned() -> RuntimeError {
    RuntimeError::sys("sandbox table", std::io::Error::other("lock poisoned"))
}

impl LiveRuntime {
    /// Starts the spawner (`program spawner`, normally the running `sandkasten` binary), supervised: restarted if it
    /// dies (`supervisor`).
    pub fn start(program: &Path, config: RuntimeConfig) -> Result<LiveRuntime, RuntimeError> {
        let agents: Agents = Arc::default();
        let contexts: Arc<Contexts> = Arc::default();
        let commands: Arc<BackgroundCommands> = Arc::default();
        let lost: Arc<Mutex<Vec<LostSandbox>>> = Arc::default();
        let endings: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let (forget, forget_contexts) = (Arc::clone(&agents), Arc::clone(&contexts));
        let (forget_commands, report, explain) = (Arc::clone(&commands), Arc::clone(&lost), Arc::clone(&endings));
        let on_event = Arc::new(move |event| {
            let Ok(mut map) = forget.lock() else { return };
            let (gone, why): (Vec<(String, Member)>, Option<String>) = match event {
                SpawnerEvent::Exited { id, why } => {
                    // Held before the member goes, so a request that finds no member finds the reason.
                    if let (Some(why), Ok(mut endings)) = (&why, explain.lock()) {
                        if endings.len() >= MAX_ENDINGS_HELD {
                            endings.clear();
                        }
                        endings.insert(id.clone(), why.clone());
                    }
                    (map.remove(&id).map(|member| (id, member)).into_iter().collect(), why)
                }
                SpawnerEvent::SpawnerGone => (map.drain().collect(), None),
            };
            // A paused gVisor sandbox has no channel to end: its waiting requests learn it here.
            let gone: Vec<String> = gone
                .into_iter()
                .map(|(id, member)| {
                    member.agent.close();
                    id
                })
                .collect();
            for id in &gone {
                forget_contexts.forget(id);
                forget_commands.forget(id);
            }
            if let Ok(mut lost) = report.lock() {
                lost.extend(gone.into_iter().map(|id| LostSandbox { id, why: why.clone() }));
            }
        });
        let spawner = Supervisor::start(program.to_owned(), config.gvisor.clone(), config.microvm.clone(), on_event)?;
        let hierarchy = Hierarchy::detect().ok();
        Ok(LiveRuntime { config, hierarchy, spawner, agents, lost, endings, contexts, commands })
    }

    /// How the microVM sandbox `id`'s guest started, if it is one and runs.
    pub(super) fn vm_boot(&self, id: &str) -> Option<crate::VmBoot> {
        self.agents.lock().ok()?.get(id)?.vm_boot
    }

    /// Sandboxes that died on their own since the last call (their agent exited, or the spawner died with them).
    pub(super) fn take_lost(&self) -> Vec<LostSandbox> {
        self.lost.lock().map(|mut lost| std::mem::take(&mut *lost)).unwrap_or_default()
    }

    /// Why sandbox `id`, which a request just found gone, ended, where its tier could tell: waits (up to
    /// `ENDING_WAIT`) while the spawner has not reported it yet.
    pub(super) async fn why_ended(&self, id: &str) -> Option<String> {
        let deadline = tokio::time::Instant::now() + ENDING_WAIT;
        loop {
            let reported = self.agents.lock().map(|agents| !agents.contains_key(id)).unwrap_or(true);
            if let Some(why) = self.endings.lock().ok().and_then(|mut endings| endings.remove(id)) {
                return Some(why);
            }
            if reported || tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Why sandboxes cannot be created now (the spawner died and is being restarted), if they cannot.
    pub(super) fn spawner_down(&self) -> Option<String> {
        self.spawner.down()
    }

    /// Spawns the sandbox `id` through the spawner and takes over its agent's channel.
    pub(super) async fn spawn(&self, id: &str, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let spawner = self.spawner.client()?;
        let (owned_id, owned_spec) = (id.to_owned(), spec.clone());
        let spawned = tokio::task::spawn_blocking(move || spawner.spawn(&owned_id, &owned_spec))
            .await
            .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))??;
        self.adopt(id, spec, spawned, None).await
    }

    /// Creates the sandbox `id` from the memory snapshot in `dir` (of a sandbox with the same `spec`): its agent is
    /// the source's as it was then, told first how long ago that was (`Resumed`: its commands' deadlines move on).
    pub(super) async fn spawn_from_memory(&self, id: &str, spec: &SandboxSpec, dir: &Path) -> Result<(), RuntimeError> {
        if !spec.tier().saves_memory() {
            return Err(crate::backend::no_memory_snapshots(spec.tier()));
        }
        // A microVM's guest clocks stopped with it when it was saved: nothing of the time since counts.
        let taken = match spec.tier() {
            Tier::Microvm => None,
            _ => std::fs::metadata(dir.join("checkpoint.img")).and_then(|m| m.modified()).ok(),
        };
        let spawner = self.spawner.client()?;
        let (owned_id, owned_spec, owned_dir) = (id.to_owned(), spec.clone(), dir.to_owned());
        let spawned =
            tokio::task::spawn_blocking(move || spawner.spawn_from_memory(&owned_id, &owned_spec, &owned_dir))
                .await
                .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))??;
        let since = taken.and_then(|at| at.elapsed().ok()).unwrap_or_default();
        let paused_ns = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        self.adopt(id, spec, spawned, Some(sandkasten_protocol::Message::Resumed { paused_ns })).await
    }

    /// Saves the running gVisor or microVM sandbox `id`'s memory into `dir` while it runs on; its agent is quiesced meanwhile
    /// (requests wait; no partial frame and no host connection in the image).
    pub(super) async fn memory_snapshot(&self, id: &str, dir: &Path) -> Result<(), RuntimeError> {
        let (agent, tier) = self
            .agents
            .lock()
            .map_err(|_| lock_poisoned())?
            .get(id)
            .map(|member| (Arc::clone(&member.agent), member.tier))
            .ok_or_else(|| RuntimeError::InvalidInput(format!("no sandbox {id} is running")))?;
        if !tier.saves_memory() {
            return Err(crate::backend::no_memory_snapshots(tier));
        }
        agent.quiesce().await.map_err(|f| RuntimeError::TierFailed(f.message))?;
        let owned_id = id.to_owned();
        let owned_dir = dir.to_owned();
        let taken = match self.spawner.client() {
            Ok(spawner) => tokio::task::spawn_blocking(move || spawner.memory_snapshot(&owned_id, &owned_dir))
                .await
                .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))
                .and_then(|taken| taken),
            Err(error) => Err(error),
        };
        agent.unquiesce().await;
        taken
    }

    /// Takes over a spawned sandbox's agent channel (`first` its first frame) and adds it to the table.
    async fn adopt(
        &self,
        id: &str,
        spec: &SandboxSpec,
        spawned: crate::spawner::SpawnedSandbox,
        first: Option<sandkasten_protocol::Message>,
    ) -> Result<(), RuntimeError> {
        // A restored agent (a first frame to send) holds the source's commands under the source's request ids: number
        // this client's requests from far above any id a client has used (a random start in 2^40..2^41).
        let first_id = if first.is_some() { restored_first_id() } else { 1 };
        let client =
            AgentClient::with_first_id(spawned.channel, first_id).map_err(|e| RuntimeError::sys("agent channel", e))?;
        if let Some(first) = first {
            client.send(0, first).await.map_err(|f| RuntimeError::TierFailed(f.message))?;
        }
        // The agent is the spawner's child and cannot be reaped before the spawner hears of its exit, which reaches
        // us after this reply: the pid still names our agent here.
        let pidfd = pidfd_of(spawned.pid)?;
        let cgroup = self
            .hierarchy
            .as_ref()
            .and_then(|hierarchy| hierarchy.open(&self.config.cgroup_parent, id).ok().flatten())
            .map(Arc::new);
        let door = match spawned.door {
            Some(channel) => Some(
                super::vm_door::VmDoor::start(&self.config, id, channel)
                    .map_err(|e| RuntimeError::sys("starting the microVM's egress door", e))?,
            ),
            None => None,
        };
        let member = Member {
            agent: Arc::new(client),
            pidfd: Arc::new(pidfd),
            tier: spec.tier(),
            cgroup,
            paused_at: None,
            _door: door,
            vm_boot: spawned.vm_boot,
            memory_bytes: spec.limits.memory_bytes,
        };
        self.agents.lock().map_err(|_| lock_poisoned())?.insert(id.to_owned(), member);
        Ok(())
    }

    /// Pauses (`pause: true`) or resumes the sandbox `id` through its tier (the spawner holds it). The agent is told
    /// how long it was paused (`Resumed`), so its commands' timeouts do not count the pause: on the process tier
    /// before the thaw (the message waits in its channel and is read before it next checks a deadline), on gVisor as
    /// the first frame on the restored sandbox's new channel. A gVisor checkpoint ends the agent's channel: the
    /// client quiesces before it and switches to the new channel after the restore, keeping every route.
    pub(super) async fn set_paused(&self, id: &str, pause: bool) -> Result<(), RuntimeError> {
        let no_sandbox = || RuntimeError::InvalidInput(format!("no sandbox {id} is running"));
        let (agent, tier, since) = self
            .agents
            .lock()
            .map_err(|_| lock_poisoned())?
            .get(id)
            .map(|member| (Arc::clone(&member.agent), member.tier, member.paused_at))
            .ok_or_else(no_sandbox)?;
        // A microVM's guest clocks stop with its vCPUs (QMP `stop`): its deadlines need no moving on.
        let paused_ns = match tier {
            Tier::Microvm => 0,
            _ => since.map_or(0, |at| u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX)),
        };
        // A gVisor pause, and a microVM's that releases the VM, end the agent's channel: a new one comes with the
        // resume.
        let checkpointed = tier == Tier::Gvisor || (tier == Tier::Microvm && self.config.microvm.release_paused);
        if pause && checkpointed {
            agent.quiesce().await.map_err(|f| RuntimeError::TierFailed(f.message))?;
        }
        if !pause && !checkpointed {
            agent.resumed(paused_ns).await.map_err(|f| RuntimeError::TierFailed(f.message))?;
        }
        let owned_id = id.to_owned();
        let done = match self.spawner.client() {
            Ok(spawner) => tokio::task::spawn_blocking(move || spawner.set_paused(&owned_id, pause))
                .await
                .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))
                .and_then(|done| done),
            Err(error) => Err(error),
        };
        let restored = match done {
            Ok(restored) => restored,
            Err(error) => {
                // A checkpoint that failed leaves the sandbox running on its old channel; one that failed with the
                // sandbox dead (and a restore that failed, which destroys it) is reported by the spawner as an exit.
                if pause && checkpointed {
                    agent.unquiesce().await;
                }
                return Err(error);
            }
        };
        let pidfd = match restored {
            Some(spawned) => {
                agent
                    .reconnect(spawned.channel, sandkasten_protocol::Message::Resumed { paused_ns })
                    .await
                    .map_err(|f| RuntimeError::TierFailed(format!("sandbox {id} was restored but {}", f.message)))?;
                let door = match spawned.door {
                    Some(channel) => Some(
                        super::vm_door::VmDoor::start(&self.config, id, channel)
                            .map_err(|e| RuntimeError::sys("starting the microVM's egress door", e))?,
                    ),
                    None => None,
                };
                Some((pidfd_of(spawned.pid)?, door))
            }
            None => None,
        };
        if let Ok(mut map) = self.agents.lock()
            && let Some(member) = map.get_mut(id)
        {
            member.paused_at = pause.then(std::time::Instant::now);
            if let Some((pidfd, door)) = pidfd {
                member.pidfd = Arc::new(pidfd);
                if door.is_some() {
                    member._door = door;
                }
            }
        }
        Ok(())
    }

    /// Forgets the sandbox `id` and has the spawner kill and remove it; returns what it used.
    pub(super) async fn remove(&self, id: &str) -> Result<ResourceUsage, RuntimeError> {
        let member = self.agents.lock().map_err(|_| lock_poisoned())?.remove(id);
        if let Some(member) = &member {
            // Requests waiting for a paused sandbox's new channel learn that there will be none.
            member.agent.close();
        }
        self.contexts.forget(id);
        self.commands.forget(id);
        let spawner = self.spawner.client()?;
        let owned_id = id.to_owned();
        let destroyed = tokio::task::spawn_blocking(move || spawner.destroy(&owned_id))
            .await
            .map_err(|e| RuntimeError::sys("spawner task", std::io::Error::other(e.to_string())))?;
        // The channel stays open until the spawner has the sandbox: an agent that saw it close would exit first, and
        // the spawner would report it exited (and not what it used) instead of destroying it.
        drop(member);
        destroyed
    }

    /// Runs a command to its end; output chunks go to `output` as they arrive. The exit says which limit fired
    /// (the agent's timeout and disk checks, the cgroup's OOM kills and refused forks) and what the sandbox used
    /// meanwhile.
    pub(super) async fn run_command(
        &self,
        id: &str,
        spec: CommandSpec,
        output_limit: u64,
        output: mpsc::Sender<OutputChunk>,
    ) -> Result<CommandExit, Failure> {
        let (agent, cgroup) = self.running_agent_and_cgroup(id)?;
        let counters = Counters::before(cgroup);
        let mut exit = agent.exec(spec, Some(output_limit), output).await?;
        counters.annotate(&mut exit);
        Ok(exit)
    }

    /// The agent of a live sandbox and its cgroup (which says which limits fired), or `SandboxGone`.
    pub(super) fn running_agent_and_cgroup(
        &self,
        id: &str,
    ) -> Result<(Arc<AgentClient>, Option<Arc<Cgroup>>), Failure> {
        self.agents
            .lock()
            .ok()
            .and_then(|map| map.get(id).map(|member| (Arc::clone(&member.agent), member.cgroup.clone())))
            .ok_or_else(sandbox_gone)
    }

    /// What the running sandbox `id` uses now: CPU time and memory from its cgroup, disk fill from its agent. A
    /// paused sandbox is `Conflict` (its agent does not answer until it runs again).
    pub(super) async fn usage(&self, id: &str) -> Result<SandboxUsage, Failure> {
        let (agent, cgroup, paused) = self
            .agents
            .lock()
            .ok()
            .and_then(|map| {
                map.get(id).map(|member| (Arc::clone(&member.agent), member.cgroup.clone(), member.paused_at.is_some()))
            })
            .ok_or_else(sandbox_gone)?;
        if paused {
            return Err(Failure::new(FailureKind::Conflict, format!("sandbox {id} is paused: nothing of it runs")));
        }
        let disk = agent.disk_usage().await?;
        let cgroup_failure = |e: sandkasten_cgroups::CgroupError| {
            Failure::new(FailureKind::Internal, format!("reading the cgroup of sandbox {id}: {e}"))
        };
        let (cpu_ns, memory) = match cgroup {
            Some(cgroup) => {
                let used = cgroup.usage().map_err(cgroup_failure)?;
                (used.cpu_user_ns.saturating_add(used.cpu_system_ns), cgroup.memory_now().map_err(cgroup_failure)?)
            }
            None => (0, sandkasten_cgroups::MemoryNow::default()),
        };
        Ok(SandboxUsage { cpu_ns, memory_used_bytes: memory.used_bytes, memory_cache_bytes: memory.cache_bytes, disk })
    }

    /// The agent of a live sandbox.
    fn agent(&self, id: &str) -> Option<Arc<AgentClient>> {
        self.agents.lock().ok().and_then(|map| map.get(id).map(|member| Arc::clone(&member.agent)))
    }

    /// The agent of a live sandbox, or `SandboxGone` saying "the sandbox is gone" (code contexts and commands).
    pub(super) fn running_agent(&self, id: &str) -> Result<Arc<AgentClient>, Failure> {
        self.agent(id).ok_or_else(sandbox_gone)
    }

    /// What a code kernel of a live sandbox starts with (its agent and memory limit), or `SandboxGone` as
    /// `running_agent`.
    pub(super) fn kernel_host(&self, id: &str) -> Result<KernelHost, Failure> {
        let (agent, memory_bytes, tier) = self
            .agents
            .lock()
            .ok()
            .and_then(|map| map.get(id).map(|member| (Arc::clone(&member.agent), member.memory_bytes, member.tier)))
            .ok_or_else(sandbox_gone)?;
        let emulated = tier == Tier::Microvm && self.microvm_accel() == sandkasten_types::MicrovmAccel::Tcg;
        Ok(KernelHost { agent, memory_bytes, emulated })
    }

    /// The agent of a live sandbox, or `SandboxGone` naming the sandbox (file operations).
    pub(super) fn file_agent(&self, id: &str) -> Result<Arc<AgentClient>, Failure> {
        self.agent(id).ok_or_else(|| Failure::new(FailureKind::SandboxGone, format!("sandbox {id} is not running")))
    }

    /// A non-blocking listener on `127.0.0.1:port` inside the sandbox's network namespace (the egress proxy's
    /// entrance), or the gVisor or microVM sandbox's door socket. `None` when the sandbox is not alive.
    pub(super) fn listen(&self, id: &str, port: u16) -> Option<std::io::Result<Entrance>> {
        let (pidfd, tier) = self
            .agents
            .lock()
            .ok()
            .and_then(|map| map.get(id).map(|member| (Arc::clone(&member.pidfd), member.tier)))?;
        Some(match tier {
            // The Sentry's network stack is its own: the agent bridges the port to this socket instead.
            Tier::Gvisor => listen_on_door_socket(&gvisor::door_socket(&self.config, id), 0o666),
            // The guest has no network device: its agent carries the port's connections over the door's serial
            // port, and the host's door connects each to this socket.
            Tier::Microvm => listen_on_door_socket(&super::vm_door::door_socket(&self.config, id), 0o600),
            _ => crate::backend::process::netns_listener::listen_in_netns(pidfd.as_fd(), port).map(Entrance::Tcp),
        })
    }

    /// Why gVisor sandboxes cannot start, when `runsc` is not installed. Looked up on every request (a few `stat`s),
    /// so a runsc removed or installed while the server runs is a 422 saying so, not a failed start.
    pub(super) fn runsc_missing(&self) -> Option<String> {
        (!gvisor::runsc_installed(&self.config)).then(|| gvisor::runsc_missing(&self.config))
    }

    /// Why microVM sandboxes cannot start here (QEMU or the boot files missing, emulation forbidden), looked up on
    /// every request like `runsc_missing`.
    pub(super) fn microvm_unusable(&self) -> Option<String> {
        crate::backend::microvm::unusable(&self.config.microvm)
    }

    /// The acceleration the spawner's microvm backend starts guests with (the same function chooses it there).
    pub(super) fn microvm_accel(&self) -> sandkasten_types::MicrovmAccel {
        crate::backend::microvm::accel(&self.config.microvm)
    }

    pub(super) fn contexts(&self) -> &Contexts {
        &self.contexts
    }

    pub(super) fn commands(&self) -> &BackgroundCommands {
        &self.commands
    }
}

/// A pidfd of the sandbox's first host process `pid` (the spawner's child, which it cannot reap before it reported
/// it: the pid still names that process).
fn pidfd_of(pid: u32) -> Result<OwnedFd, RuntimeError> {
    let pid = rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| RuntimeError::sys("agent pid", std::io::Error::other("pid 0")))?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| RuntimeError::sys("pidfd_open of the agent", std::io::Error::from(e)))
}

/// A non-blocking unix listener at a sandbox's door socket `path` with permissions `mode` (gVisor: in its bundle,
/// bound into the sandbox, whose agent connects from inside: 0666; microVM: in its directory, where only this
/// server's door connects: 0600, so no other host user reaches the sandbox's egress, its header rules included).
fn listen_on_door_socket(path: &Path, mode: u32) -> std::io::Result<Entrance> {
    use std::os::unix::fs::PermissionsExt;
    // A socket left by an earlier door of this sandbox (the policy went to none and back) is replaced.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    listener.set_nonblocking(true)?;
    Ok(Entrance::Unix(listener))
}

/// Where a restored agent's new client starts numbering its requests: random in 2^40..2^41, far above the ids of
/// the source's client (which counts from 1) and, with overwhelming odds, apart from any other restore's.
fn restored_first_id() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    (1 << 40) | (u64::from_le_bytes(bytes) & ((1 << 40) - 1))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_microvm_door_socket_is_the_servers_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("door.sock");
        for mode in [0o600, 0o666] {
            let entrance = listen_on_door_socket(&path, mode).expect("listen");
            let found = std::fs::metadata(&path).expect("socket").permissions().mode() & 0o777;
            assert_eq!(found, mode, "the door socket's permissions");
            drop(entrance);
        }
    }
}
