//! Ending a sandbox: destroying it in the runtime ("already gone" counts as done) with what the server holds for it
//! (its egress door and secrets, its E2B session), and recording why it ended: deleted, its run finished, or lost
//! (its processes vanished under a call, as the startup reconcile finds at start).

use sandkasten_types::{Failure, FailureKind};

use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::lifecycle::error::LifecycleError;
use crate::metrics::ExitReason;
use crate::state::AppState;
use crate::store::{SandboxState, StoreError};

/// Destroys a sandbox in the runtime, treating "already gone" as done (its E2B session, if any, goes with it).
pub(crate) async fn destroy_quietly(state: &AppState, id: &str) -> bool {
    let destroyed = release_quietly(state, id).await;
    if destroyed {
        state.e2b().close(id);
    }
    destroyed
}

/// Destroys a sandbox in the runtime with its egress door, keeping what belongs to its id beyond this life (its E2B
/// session): a filesystem pause releases it this way and its resume makes it again under the same id.
pub(crate) async fn release_quietly(state: &AppState, id: &str) -> bool {
    state.egress().detach(id);
    let destroyed = destroy_in_runtime(state, id).await;
    // Again after the destroy: an attach racing this delete may have opened a door in between.
    state.egress().detach(id);
    destroyed
}

async fn destroy_in_runtime(state: &AppState, id: &str) -> bool {
    match state.runtime().destroy(id).await {
        Ok(()) => true,
        Err(failure) if matches!(failure.kind, FailureKind::NotFound | FailureKind::SandboxGone) => true,
        Err(failure) => {
            tracing::error!(sandbox = id, kind = ?failure.kind, reason = %failure.message, "destroy failed");
            false
        }
    }
}

/// Destroys a running sandbox and records it as deleted.
pub(crate) async fn end_running(state: &AppState, tenant: &Tenant, id: &str) -> Result<(), LifecycleError> {
    if !destroy_quietly(state, id).await {
        return Err(LifecycleError::DestroyFailed(id.to_owned()));
    }
    let pause_snapshot = state.store().sandbox(&tenant.name, id).await?.and_then(|record| record.pause_snapshot);
    if state.store().end_sandbox(id, SandboxState::Destroyed, "deleted", now_ms()).await? {
        state.metrics().sandbox_exited(ExitReason::Deleted);
        tracing::info!(sandbox = %id, tenant = %tenant.name, "sandbox deleted");
    }
    // A sandbox paused to the filesystem: its files go with it (the next start's reconcile retries a failure).
    if let Some(snapshot) = pause_snapshot
        && let Err(error) = super::pause_snapshot::delete_pause_snapshot(state, &snapshot).await
    {
        tracing::warn!(sandbox = %id, %snapshot, %error, "could not delete a deleted sandbox's pause snapshot");
    }
    Ok(())
}

/// Destroys a `POST /v1/run`'s sandbox and records its end. A sandbox the runtime cannot destroy stays running in the
/// store, and the expiry sweeper retries when its lifetime is over.
pub(crate) async fn finish_run(state: &AppState, id: &str) {
    if !destroy_quietly(state, id).await {
        return;
    }
    match state.store().end_sandbox(id, SandboxState::Destroyed, "run finished", now_ms()).await {
        Ok(ended) => {
            if ended {
                state.metrics().sandbox_exited(ExitReason::RunFinished);
            }
            tracing::info!(sandbox = %id, "run finished; sandbox destroyed");
        }
        Err(error) => tracing::error!(sandbox = %id, %error, "could not record the end of a run's sandbox"),
    }
}

/// When `failure` says the sandbox vanished: releases what the server still holds for it (its egress door and
/// secrets, its E2B session, whatever the runtime kept) and marks it lost, as the startup reconcile does. Returns
/// the failure, with why the sandbox ended added where its tier could tell (a microVM guest's kernel panic).
pub(crate) async fn note_lost(state: &AppState, id: &str, mut failure: Failure) -> Result<Failure, StoreError> {
    if failure.kind != FailureKind::SandboxGone {
        return Ok(failure);
    }
    if let Ok(Some(why)) = state.runtime().why_ended(id).await {
        failure.message = format!("{}: {why}", failure.message);
    }
    tracing::warn!(sandbox = id, reason = %failure.message, "sandbox lost");
    destroy_quietly(state, id).await;
    if state.store().mark_lost(id, &failure.message).await? {
        state.metrics().sandbox_exited(ExitReason::Lost);
    }
    Ok(failure)
}
