//! Why a lifecycle operation failed: one variant per cause, each answered by the API (`api::error`) and the E2B
//! facade (`e2b::error`, through the API's mapping) with the status and message it has always had.

use crate::egress::PrepareError;
use crate::ids::IdError;
use crate::store::{QuotaExceeded, StoreError};
use sandkasten_types::Failure;

/// A failed start, destroy or timeout change.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The isolation tier cannot run here: not in this build yet, or not installed on this host (the reason says
    /// what to install).
    #[error("{0}")]
    TierUnavailable(String),
    /// A timeout outside `1..=max_timeout_s`.
    #[error("timeout_s must be between 1 and {max} seconds, got {got}")]
    TimeoutOutOfRange {
        /// The largest accepted timeout, in seconds.
        max: u64,
        /// The timeout asked for, in seconds.
        got: u64,
    },
    /// The spec asks for more processes than one sandbox may have here (the message names the cap).
    #[error("{0}")]
    TooManyPids(String),
    /// The spec's network policy or secrets were refused.
    #[error(transparent)]
    Egress(#[from] PrepareError),
    /// No randomness for the sandbox's id.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The tenant's quota refused the sandbox.
    #[error(transparent)]
    Quota(#[from] QuotaExceeded),
    /// The runtime failed to create the sandbox or open its egress door.
    #[error(transparent)]
    Runtime(#[from] Failure),
    /// A pause of a sandbox that is not running.
    #[error("sandbox {0} is not running (it is paused, or it ended)")]
    NotRunning(String),
    /// A resume of a sandbox that is not paused.
    #[error("sandbox {0} is not paused (it is running, or it ended)")]
    NotPaused(String),
    /// A request to a paused sandbox (created without `lifecycle.auto_resume`).
    #[error(
        "sandbox {0} is paused; resume it first (POST /v1/sandboxes/{0}/resume), or create sandboxes with \
         lifecycle.auto_resume so that requests resume them"
    )]
    Paused(String),
    /// The admission neither admitted nor refused (cannot happen; kept so that no path is silent).
    #[error("sandbox admission failed")]
    AdmissionFailed,
    /// Expiry ended the sandbox while the runtime was creating it; it has been destroyed.
    #[error("sandbox {0} ended while it was being created; create a new one")]
    EndedWhileCreating(String),
    /// The runtime could not destroy a running sandbox; it stays running (and is retried by expiry).
    #[error("runtime could not destroy sandbox {0}")]
    DestroyFailed(String),
    /// A fork's count out of range.
    #[error("count must be between 1 and {max}, got {got}")]
    ForkCountOutOfRange {
        /// The most copies one fork makes.
        max: u64,
        /// The count asked for.
        got: u64,
    },
    /// Copying a sandbox's files (a fork, a snapshot, a restore) failed; nothing of the new sandbox or snapshot was
    /// kept. The message says what failed and why.
    #[error("{0}")]
    FilesNotCopied(String),
    /// No such snapshot for this tenant.
    #[error("snapshot {0} not found")]
    SnapshotNotFound(String),
    /// A snapshot that cannot be used (still being saved, damaged) or taken (memory on a tier that cannot); the
    /// message says what to do.
    #[error("{0}")]
    SnapshotRefused(String),
    /// The snapshot store failed (unreachable, refused a write); the message names the operation.
    #[error("the snapshot store failed: {0}")]
    SnapshotStore(String),
    /// A lifecycle task panicked or was cancelled (a bug: the server logs it).
    #[error("a lifecycle task failed: {0}")]
    TaskFailed(String),
}
