//! Messages between the owner and the spawner, one JSON object per packet.

use sandkasten_types::{ResourceUsage, SandboxSpec};
use serde::{Deserialize, Serialize};

/// owner → spawner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SpawnerRequest {
    /// Create a long-lived sandbox; the reply carries the agent's channel as a file descriptor.
    Spawn {
        /// Sandbox id (chosen by the owner).
        id: String,
        /// What to create.
        spec: SandboxSpec,
    },
    /// Kill and remove a sandbox.
    Destroy {
        /// Sandbox id.
        id: String,
    },
    /// Pause a sandbox (its tier's `pause`: the process tier freezes its cgroup, gVisor checkpoints it to disk).
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Continue a paused sandbox.
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Save a running sandbox's memory into `dir` while it runs on (its tier's `memory_snapshot`; gVisor only).
    MemorySnapshot {
        /// Sandbox id.
        id: String,
        /// Where the image goes (created 0700; the caller's to remove).
        dir: std::path::PathBuf,
    },
    /// Create a sandbox from a memory snapshot of one made with the same spec; replied to like `Spawn`.
    SpawnFromMemory {
        /// The new sandbox's id.
        id: String,
        /// Its spec (the source's).
        spec: SandboxSpec,
        /// The image's directory.
        dir: std::path::PathBuf,
    },
}

/// spawner → owner: replies (in request order) and events (at any time).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SpawnerResponse {
    /// The first packet: the spawner checked the host and serves.
    Ready,
    /// The first packet instead of `Ready`: the spawner cannot run here, and exits.
    Unusable {
        /// Why (e.g. no usable cgroup hierarchy).
        message: String,
    },
    /// Reply to `Spawn` and `SpawnFromMemory`: the agent runs; its channel is attached to this packet.
    Spawned {
        /// Sandbox id.
        id: String,
        /// The agent's host pid.
        pid: u32,
        /// How a microVM's guest started (microvm tier only).
        #[serde(default)]
        vm_boot: Option<crate::VmBoot>,
    },
    /// Reply to `Destroy`.
    Destroyed {
        /// Sandbox id.
        id: String,
        /// Resources the sandbox used over its life.
        usage: ResourceUsage,
    },
    /// Reply to `Pause`, `Resume` or `MemorySnapshot`: done.
    Done {
        /// Sandbox id.
        id: String,
    },
    /// Reply to `Resume` of a sandbox that was restored (gVisor): its agent serves on a new channel, attached to
    /// this packet; the old one has ended.
    Restored {
        /// Sandbox id.
        id: String,
        /// The new host pid of the sandbox's first process.
        pid: u32,
    },
    /// Reply to a request that failed; for `Spawn`, nothing of the sandbox is left; for `Pause`, the sandbox is as it
    /// was; a failed `Resume` of a restored sandbox (gVisor) destroys it (an `Exited` event follows).
    Failed {
        /// Sandbox id.
        id: String,
        /// True when the request itself was invalid (the caller's mistake), false for a host failure.
        invalid_input: bool,
        /// True when the isolation tier failed to start the sandbox (runsc); `message` is then what it said.
        #[serde(default)]
        tier_failed: bool,
        /// What went wrong.
        message: String,
    },
    /// Event: a sandbox's agent exited on its own (e.g. killed by its memory limit); its resources are removed.
    Exited {
        /// Sandbox id.
        id: String,
        /// Why, where the tier could tell (a microVM guest's kernel panic line).
        #[serde(default)]
        why: Option<String>,
    },
}

/// True for replies, false for events.
impl SpawnerResponse {
    /// Whether this packet answers a request (rather than reporting an event).
    pub fn is_reply(&self) -> bool {
        !matches!(self, SpawnerResponse::Exited { .. } | SpawnerResponse::Ready | SpawnerResponse::Unusable { .. })
    }
}
