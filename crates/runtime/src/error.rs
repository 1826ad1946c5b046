//! Runtime errors: what failed on the host side, with the step named.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// A failure of the runtime itself (not of the sandboxed program).
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The request or spec is invalid.
    #[error("{0}")]
    InvalidInput(String),
    /// The host lacks something the tier needs.
    #[error("{0}")]
    HostUnsupported(String),
    /// Writing or removing a durable record failed.
    #[error("sandbox record {path}: {source}")]
    Record {
        /// The record file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup operation failed.
    #[error("cgroup: {0}")]
    Cgroup(#[from] sandkasten_cgroups::CgroupError),
    /// A jail step on the host side failed.
    #[error("jail: {0}")]
    Jail(#[from] sandkasten_jail::JailError),
    /// The agent broke the protocol.
    #[error("agent protocol: {0}")]
    Protocol(#[from] sandkasten_protocol::ProtocolError),
    /// A host system call failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A host operation on a named object failed (creating a bundle file, starting runsc).
    #[error("{what} failed: {source}")]
    Io {
        /// The operation and its object.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// gVisor's `runsc` refused or failed; the message is what it said.
    #[error("runsc failed: {0}")]
    Runsc(String),
    /// A tier could not start a sandbox (its agent could not build or confine it, or the tier's own runtime failed);
    /// the message says which step and why.
    #[error("{0}")]
    TierFailed(String),
    /// The runtime was interrupted by a signal; the sandbox was destroyed.
    #[error("interrupted by signal {0}; the sandbox was destroyed")]
    Interrupted(i32),
}

impl RuntimeError {
    /// Wraps an I/O error from an operation described at run time.
    pub(crate) fn sys_owned(what: String, source: io::Error) -> Self {
        RuntimeError::Io { what, source }
    }

    /// Wraps an errno from a named call.
    pub(crate) fn sys(call: &'static str, source: impl Into<io::Error>) -> Self {
        RuntimeError::Sys { call, source: source.into() }
    }
}
