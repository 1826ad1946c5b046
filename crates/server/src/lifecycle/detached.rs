//! Lifecycle work that must not stop half-way because its caller went away: an HTTP client that hangs up makes axum
//! drop the request's handler, and with it any future the handler awaits. A snapshot cut off there would leave its row
//! `saving` until the next start, a fork or a restore a sandbox nobody was told about. `to_completion` runs the work
//! as a task of its own, so it always finishes, or undoes what it did, whoever waits for it.

use std::future::Future;

use crate::lifecycle::error::LifecycleError;

/// Runs `work` as its own task and waits for its result.
pub(crate) async fn to_completion<T: Send + 'static>(
    work: impl Future<Output = Result<T, LifecycleError>> + Send + 'static,
) -> Result<T, LifecycleError> {
    tokio::spawn(work).await.unwrap_or_else(|error| Err(LifecycleError::TaskFailed(error.to_string())))
}
