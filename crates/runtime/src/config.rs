//! Host-side settings of the runtime, each with its safe default.

use std::path::PathBuf;

use sandkasten_types::{GvisorSettings, MicrovmSettings};

/// Where the runtime keeps state and which host resources it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Directory of durable sandbox records (one JSON file per sandbox). Default `/run/sandkasten`: a tmpfs, cleared
    /// at boot together with the cgroups the records describe.
    pub state_dir: PathBuf,
    /// Name of the cgroup (in each controller) under which sandboxes' cgroups are created. Default `sandkasten`.
    pub cgroup_parent: String,
    /// First host uid/gid of the range sandbox ids map to (inside 0..65536 → base..base+65536). Must not overlap real
    /// users. Default 1 000 000 000.
    pub host_id_base: u32,
    /// How the gvisor tier runs runsc (binary, platform).
    pub gvisor: GvisorSettings,
    /// How the microvm tier runs its VMs (QEMU, guest kernel and images, acceleration).
    pub microvm: MicrovmSettings,
    /// The agent executable every sandbox runs as its init (`PATH agent`). Default: this process's own executable
    /// (the `sandkasten` binary, whose `agent` subcommand is the agent).
    pub agent_program: Option<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            state_dir: PathBuf::from("/run/sandkasten"),
            cgroup_parent: "sandkasten".to_owned(),
            host_id_base: 1_000_000_000,
            gvisor: GvisorSettings::default(),
            microvm: MicrovmSettings::default(),
            agent_program: None,
        }
    }
}

impl RuntimeConfig {
    /// Directory of sandbox records.
    pub fn records_dir(&self) -> PathBuf {
        self.state_dir.join("sandboxes")
    }
}
