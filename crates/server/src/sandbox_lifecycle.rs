//! A sandbox's lifecycle settings (`lifecycle` in `POST /v1/sandboxes`): what happens at its timeout and to requests
//! while it is paused, and how it is paused. Stored with the sandbox (`lifecycle_json`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What happens to a sandbox at its timeout, and to requests while it is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Lifecycle {
    /// At its timeout the sandbox is paused instead of destroyed (it stays until deleted or resumed).
    pub auto_pause: bool,
    /// A request to the sandbox while it is paused resumes it first (instead of answering 409 `paused`).
    pub auto_resume: bool,
    /// How `auto_pause` pauses it.
    pub pause_mode: PauseMode,
}

/// How a sandbox is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// With its processes and memory: the process tier freezes them in place (memory stays held, no CPU), gVisor
    /// checkpoints them to disk and releases everything; a resume continues where they were.
    #[default]
    Memory,
    /// Its writable files (home, `/tmp`, `/dev/shm`) are saved to the snapshot store (charged to the tenant's
    /// `max_snapshot_bytes`) and everything else is released on every tier; a resume starts fresh processes on them
    /// under the same id. Survives a server restart.
    Filesystem,
}

impl PauseMode {
    /// The name shown.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Memory => "memory",
            PauseMode::Filesystem => "filesystem",
        }
    }
}
