//! Small types carried by the serve-mode messages: running commands, failure codes, and the size limits both sides
//! rely on (output streams are `sandkasten_types::StreamKind`).

use serde::{Deserialize, Serialize};

/// Most raw bytes of command output carried by one `Output` frame.
pub const MAX_OUTPUT_CHUNK_BYTES: usize = 64 << 10;

/// Most raw bytes of file content carried by one `FileData` frame.
pub const MAX_FILE_CHUNK_BYTES: u64 = 1 << 20;

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

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureCode {
    /// The path, command or stream does not exist (or is closed).
    NotFound,
    /// The sandbox user may not do this.
    PermissionDenied,
    /// The path is not absolute, contains NUL, crosses a magic link, loops, or names something that cannot be used.
    InvalidPath,
    /// The target exists already.
    AlreadyExists,
    /// A directory was expected.
    NotADirectory,
    /// A directory was not expected.
    IsADirectory,
    /// The directory is not empty.
    NotEmpty,
    /// Too big: the disk is full, or the answer would exceed the frame limit.
    TooLarge,
    /// The command could not be started.
    ExecFailed,
    /// The agent cannot take this now (too many commands, stdin buffer full, a mount point).
    Busy,
    /// Anything else, including malformed requests.
    Internal,
}
