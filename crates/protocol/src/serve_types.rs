//! Small types carried by the serve-mode messages: running commands and the size limits both sides rely on (output
//! streams are `sandkasten_types::StreamKind`, failures `sandkasten_types::Failure`).

use serde::{Deserialize, Serialize};

/// Most raw bytes of command output carried by one `Output` frame.
pub const MAX_OUTPUT_CHUNK_BYTES: usize = 64 << 10;

/// Most raw bytes of file content carried by one `FileData` frame.
pub const MAX_FILE_CHUNK_BYTES: u64 = 1 << 20;

/// Most events carried by one `WatchEvents` frame.
pub const MAX_WATCH_EVENTS_PER_FRAME: usize = 256;

/// Most raw bytes carried by one `PortData` frame.
pub const MAX_PORT_CHUNK_BYTES: usize = 64 << 10;

/// Most bytes of one port stream, per direction, sent and not yet acknowledged (`PortAck`): what each side may have
/// to hold for it.
pub const PORT_WINDOW_BYTES: u64 = 256 << 10;

/// Most port streams one sandbox has open at once.
pub const MAX_PORT_STREAMS: usize = 32;

/// A command the agent has started and not yet reported as exited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningCommand {
    /// The command's id (the envelope id of its `Exec`).
    pub id: u64,
    /// Its pid inside the sandbox (also its process group id).
    pub pid: u32,
    /// What it runs.
    pub argv: Vec<String>,
}
