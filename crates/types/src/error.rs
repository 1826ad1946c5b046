//! Errors as the user sees them: a stable code and a message that says what to do.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A stable, machine-readable error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request was malformed (unknown language, bad limit, missing file, ...).
    InvalidInput,
    /// The C source did not compile; the compiler's messages are in `stderr`.
    CompileError,
    /// The program could not be started inside the sandbox (not found, not executable).
    ExecFailed,
    /// The host cannot run this tier (no user namespaces, no cgroups, not root, ...).
    HostUnsupported,
    /// sandkasten itself failed while setting up or tearing down the sandbox.
    SandboxError,
}

/// An error with a code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorInfo {
    /// Stable code.
    pub code: ErrorCode,
    /// What went wrong and how to fix it.
    pub message: String,
}

impl ErrorInfo {
    /// Builds an error from a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorInfo { code, message: message.into() }
    }
}
