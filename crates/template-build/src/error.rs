//! Why a build failed: the spec as written (a field, a base that is not built), a step or `ready` that failed with
//! its output (both the user's to fix: exit 2, HTTP 422 or a `failed` event), or sandkasten itself.

use sandkasten_template::SpecError;

use crate::event::FailedAt;

/// A failed build.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The spec cannot be built as written; nothing ran.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A step or `ready` failed: `message` says how, `output` is the tail of what it printed.
    #[error("{message}")]
    Failed {
        /// Which step (or `ready`).
        at: FailedAt,
        /// How it failed, e.g. `step 2 (run make) exited with 2`.
        message: String,
        /// The last 64 KiB of its output.
        output: String,
    },
    /// sandkasten failed (a build sandbox, the cache, the proxy), with what it was doing.
    #[error("{0}")]
    Internal(String),
}

/// Maps an error to [`BuildError::Internal`] saying what was being done.
pub(crate) fn internal<E: std::fmt::Display>(doing: &str) -> impl FnOnce(E) -> BuildError + '_ {
    move |error| BuildError::Internal(format!("{doing}: {error}"))
}
