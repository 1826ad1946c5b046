//! A command or code cell running in its own task (a client that leaves does not cut it in half): its output
//! chunks as they come, its result at the end, and when it started; [`pump`] hands the chunks on in order and
//! answers the result once the output is drained.

use std::time::Instant;

use sandkasten_types::{Failure, FailureKind, OutputChunk};
use tokio::sync::{mpsc, oneshot};

/// A running command (`T` = `CommandExit`) or cell (`T` = `CellOutcome`).
pub(crate) struct Started<T> {
    /// Output chunks, in the order the runtime read them.
    pub(crate) chunks: mpsc::Receiver<OutputChunk>,
    /// The result, once it has ended.
    pub(crate) done: oneshot::Receiver<Result<T, Failure>>,
    /// When it started.
    pub(crate) started: Instant,
}

/// Hands each output chunk to `on_chunk` as it arrives, then answers the result (after the last chunk).
pub(crate) async fn pump<T, F, Fut>(mut started: Started<T>, mut on_chunk: F) -> Result<T, Failure>
where
    F: FnMut(OutputChunk) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        tokio::select! {
            biased;
            Some(chunk) = started.chunks.recv() => on_chunk(chunk).await,
            result = &mut started.done => {
                while let Ok(chunk) = started.chunks.try_recv() {
                    on_chunk(chunk).await;
                }
                return result.unwrap_or_else(|_| Err(Failure::new(
                    FailureKind::Internal,
                    "the task running it ended without a result",
                )));
            }
        }
    }
}
