//! Files inside a sandbox as the files API describes them, and the user metadata a file may carry (`user.e2b.*`
//! extended attributes, envd's file metadata).

use std::collections::BTreeMap;

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
    /// User metadata of a regular file or directory: its `user.e2b.*` extended attributes, the prefix taken off
    /// (what envd reports; other `user.*` attributes are not metadata). Entries whose key or value is not UTF-8 are
    /// left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: FileMetadata,
}

/// User metadata of a file: key → value, stored as the extended attribute `user.e2b.<key>`.
pub type FileMetadata = BTreeMap<String, String>;

/// The extended-attribute namespace of file metadata.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// Longest metadata key, in bytes: the kernel's 255-byte attribute name less the prefix.
pub const MAX_METADATA_KEY_BYTES: usize = 255 - METADATA_XATTR_PREFIX.len();
/// Most metadata bytes on one file: every key with the prefix, plus every value (envd's bound, within one ext4
/// block of attributes).
pub const MAX_METADATA_BYTES: usize = 4096;

/// Checks metadata as envd does: keys non-empty and at most `MAX_METADATA_KEY_BYTES`, keys and values printable
/// US-ASCII (0x20 to 0x7e), at most `MAX_METADATA_BYTES` in all. The error names what is wrong.
pub fn check_metadata(metadata: &FileMetadata) -> Result<(), String> {
    let printable = |label: &str, text: &str| match text.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
        Some(at) => Err(format!(
            "metadata {label} contains non-printable-ASCII byte 0x{:02x} at offset {at}",
            text.as_bytes()[at]
        )),
        None => Ok(()),
    };
    let mut total = 0;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err("metadata key must not be empty".to_owned());
        }
        if key.len() > MAX_METADATA_KEY_BYTES {
            return Err(format!("metadata key {key:?} exceeds {MAX_METADATA_KEY_BYTES} bytes"));
        }
        printable("key", key)?;
        printable(&format!("value for key {key:?}"), value)?;
        total += METADATA_XATTR_PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(format!("total metadata size {total} exceeds {MAX_METADATA_BYTES} bytes"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod metadata_tests {
    use super::*;

    #[test]
    fn metadata_is_bounded_as_envd_bounds_it() {
        let one = |key: &str, value: &str| FileMetadata::from([(key.to_owned(), value.to_owned())]);
        assert!(check_metadata(&one("author", "a b ~")).is_ok());
        assert!(check_metadata(&FileMetadata::new()).is_ok());
        assert!(check_metadata(&one("", "x")).unwrap_err().contains("must not be empty"));
        assert!(check_metadata(&one("a\nb", "x")).unwrap_err().contains("non-printable-ASCII byte 0x0a at offset 1"));
        assert!(check_metadata(&one("k", "caf\u{e9}")).unwrap_err().contains("value for key \"k\""));
        assert!(check_metadata(&one(&"k".repeat(247), "x")).unwrap_err().contains("exceeds 246 bytes"));
        assert!(check_metadata(&one(&"k".repeat(246), "x")).is_ok());
        assert!(check_metadata(&one("k", &"v".repeat(4096))).unwrap_err().contains("exceeds 4096 bytes"));
    }
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
