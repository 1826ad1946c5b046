//! Why an operation on a sandbox failed, from the agent to the HTTP answer: one `FailureKind` and a message (the
//! agent's `Failed` reply, the runtime's errors, the server's `SandboxRuntime` seam). The server maps each kind to
//! one HTTP status.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What kind of failure it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The sandbox, the path, the command, the code context or the stream does not exist (or is closed).
    NotFound,
    /// The sandbox user may not do this (file permissions inside the sandbox).
    PermissionDenied,
    /// The path is not acceptable: not absolute, contains NUL, crosses a magic link, loops, escapes the sandbox, or
    /// names something that cannot be used.
    InvalidPath,
    /// The target exists already.
    AlreadyExists,
    /// A path component, or the target, is not a directory.
    NotADirectory,
    /// The target is a directory where a file was expected.
    IsADirectory,
    /// The directory is not empty (remove without `recursive`).
    NotEmpty,
    /// Too big: the caller's maximum, the sandbox's disk, or the frame limit.
    TooLarge,
    /// The command (or the interpreter of a code context) could not be started.
    ExecFailed,
    /// The request conflicts with the target's state: a background command that has ended or whose stdin is closed,
    /// too many commands, a mount point in the way, a tree too deep, a port taken.
    Conflict,
    /// A command's stdin buffer in the agent is full: the program has not read what was sent before. Nothing of this
    /// request was queued; sending it again later can succeed (a writer that keeps pace waits and retries).
    StdinFull,
    /// The sandbox died or was removed underneath the request (its agent's channel is gone).
    SandboxGone,
    /// The isolation tier could not start the sandbox (runsc refused or died); the message says what it said.
    /// Never the client's fault; nothing of the sandbox is left.
    TierFailed,
    /// Nothing in the sandbox listens on the port a connection was opened to (it was refused inside the sandbox).
    NothingListening,
    /// Anything else, including malformed requests between host and agent; never the client's fault.
    Internal,
}

/// A failed operation: its kind and a human message (lowercase, no full stop, safe to show the client).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{message}")]
pub struct Failure {
    /// What kind of failure it is.
    pub kind: FailureKind,
    /// What went wrong.
    pub message: String,
}

impl Failure {
    /// A failure of `kind` saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure { kind, message: message.into() }
    }
}
