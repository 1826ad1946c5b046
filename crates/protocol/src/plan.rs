//! The agent's plan: everything a guest agent needs to serve a sandbox, sent as the first message on its channel.
//! The agent is its own executable (started by `runsc` as the container's init, or by a VMM as the guest's PID 1),
//! so nothing reaches it through shared memory: what it needs to know is here, by value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use sandkasten_types::{SandboxFile, TemplateLayers, Tier};

/// How a guest agent confines and serves the sandbox whose root it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentPlan {
    /// The tier the agent runs under (decides which host-kernel mechanisms it may expect: landlock, for one, is
    /// absent under gVisor and then skipped).
    pub tier: Tier,
    /// The sandbox user's home and every command's default working directory (`/workspace`, `/home/user`).
    pub home: String,
    /// The unprivileged user commands run as.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Every command's base environment (PATH, HOME, LANG, the spec's variables, the proxy variables).
    pub env: BTreeMap<String, String>,
    /// The disk limit in bytes (sizes `RLIMIT_FSIZE` of every command).
    pub disk_bytes: u64,
    /// The sandbox's process limit enforced inside as `RLIMIT_NPROC` of every command, where the host's pids cgroup
    /// cannot count the sandbox's processes (gVisor: it counts the Sentry's threads). `None` on the process tier.
    pub processes: Option<u64>,
    /// Directories commands may write beneath (landlock, where the kernel has it).
    pub writable_dirs: Vec<String>,
    /// Single files commands may write (landlock), e.g. `/dev/null`.
    pub writable_files: Vec<String>,
    /// The seccomp policy commands run under, by name (the agent compiles it; `sandbox` is the only one today).
    pub seccomp: SeccompPolicy,
    /// Files of the root the agent builds itself (process tier: the synthesised `/etc`, the code), written before the
    /// root is sealed read-only. Empty where the root is given (gVisor: they are in the bundle).
    pub root_files: Vec<SandboxFile>,
    /// The OOM score adjustment every command gets: the owner's own (the agent itself may run at -1000 so that the
    /// OOM killer picks a program, never the reporter).
    pub oom_score_adj: i32,
    /// The egress door: when set, the agent listens on `127.0.0.1:{port}` inside the sandbox and forwards each
    /// connection to the host's egress proxy, which decides, by the door's `exit`.
    pub door: Option<DoorPlan>,
    /// Set for the jail of a microVM's VMM (a process-tier sandbox of its own): instead of serving, the agent
    /// executes this program through the jail once it is in the cgroup, keeping the descriptors it names open.
    #[serde(default)]
    pub vmm: Option<VmmPlan>,
    /// A built template's layers, mounted read-only at `/opt` by the agent of a process-tier sandbox (with the
    /// build sandbox's capture as the overlay's upper).
    #[serde(default, skip_serializing_if = "TemplateLayers::is_empty")]
    pub template: TemplateLayers,
    /// Files the agent creates in the home when it starts serving, as the sandbox user, each only if nothing is at
    /// its path yet (the E2B user's skeleton: `.bashrc`, `.profile`, `.bash_logout`, as `useradd -m` copies them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub home_files: Vec<SandboxFile>,
}

/// The VMM a process-tier agent becomes (`AgentPlan::vmm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmPlan {
    /// Its command line, program first (a path inside the jail's root).
    pub argv: Vec<String>,
    /// Descriptors the agent inherited from its starter that the VMM keeps (its disks, kernel, channels), by the
    /// numbers its command line uses.
    pub keep_fds: Vec<i32>,
    /// Its standard error (one of `keep_fds`: the host's log of the VMM, where QEMU says why it failed).
    pub stderr_fd: i32,
    /// Host directories the jail shows read-only at the same path (the guest kernel and initramfs, which QEMU's
    /// loader opens by path).
    pub host_read_only: Vec<String>,
}

/// The seccomp policies the agent knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeccompPolicy {
    /// The sandbox allowlist (`resources/seccomp`): what every sandboxed program runs under.
    Sandbox,
    /// The sandbox allowlist with the VMM's few relaxations (`sandkasten_jail::seccomp::VMM_RELAXED`): a microVM's
    /// QEMU.
    Vmm,
}

/// Where the egress door listens inside and where it leads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoorPlan {
    /// The loopback port inside the sandbox (3128).
    pub port: u16,
    /// How each connection reaches the host.
    pub exit: DoorExit,
}

/// How the egress door's connections leave the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoorExit {
    /// Each one is a connection to this unix socket path inside the sandbox (a host socket bound in: gVisor).
    Socket(String),
    /// All of them are streams of the door mux (`Mux`) over the virtio-serial port of this name (a microVM: the
    /// guest has no network device, the host connects each stream to the proxy).
    VirtioPort(String),
}
