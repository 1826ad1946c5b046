//! Filesystem watches: what happened under a watched directory (inotify inside the sandbox), as the agent reports it
//! and the server hands it on (E2B's `files.watch_dir`).

use serde::{Deserialize, Serialize};

/// What happened to an entry under a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// It was created (or moved in).
    Create,
    /// Its contents were written.
    Write,
    /// It was removed.
    Remove,
    /// It was moved away (renamed; its new name, if still watched, is a `Create`).
    Rename,
    /// Its metadata changed (mode, owner, times).
    Chmod,
}

/// One event under a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// The entry's path relative to the watched directory (`""`: the directory itself).
    pub name: String,
    /// What happened.
    pub kind: FsEventKind,
}
