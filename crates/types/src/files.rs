//! Files inside a sandbox as the files API describes them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// Metadata of one path inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileInfo {
    /// Base name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (e.g. 420 = 0o644).
    pub mode: u32,
    /// Last modification, milliseconds since the Unix epoch.
    pub modified_unix_ms: i64,
    /// Target of a symlink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Owner's uid inside the sandbox (1000 the sandbox user, 0 the sandbox's root).
    #[serde(default)]
    pub uid: u32,
    /// Group's gid inside the sandbox.
    #[serde(default)]
    pub gid: u32,
}

/// A file created inside a sandbox's filesystem before it is sealed (the synthesised `/etc`, the code under
/// `/sandbox`) or right after (uploads), carried to the agent in its plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxFile {
    /// Absolute path inside the sandbox.
    pub path: std::path::PathBuf,
    /// Contents (base64 in JSON).
    #[serde(with = "crate::result::base64_bytes")]
    pub contents: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
    /// Owned by the sandbox user (true) or by the sandbox's root (false).
    pub owned_by_sandbox_user: bool,
}
