//! Pausing and resuming a sandbox: the database first (a paused sandbox leaves the running quota and its timeout
//! clock stops), then the runtime's tier (the process tier freezes the cgroup); a runtime that refuses undoes the
//! database step, so the two never disagree for longer than a call. A resume is admitted like a create (the quota
//! must have room again). `auto_pause` sandboxes are paused by the expiry sweeper instead of destroyed.

use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::lifecycle::error::LifecycleError;
use crate::state::AppState;

/// Pauses a running sandbox; `NotRunning` when it is not (paused already, or ended).
pub(crate) async fn pause(state: &AppState, id: &str) -> Result<(), LifecycleError> {
    if !state.store().pause_sandbox(id, now_ms()).await? {
        return Err(LifecycleError::NotRunning(id.to_owned()));
    }
    if let Err(failure) = state.runtime().set_paused(id, true).await {
        state.store().unpause_sandbox(id).await?;
        return Err(failure.into());
    }
    tracing::info!(sandbox = %id, "sandbox paused");
    Ok(())
}

/// Resumes a paused sandbox of `tenant` if its quota has room (one paused at its timeout gets the server's default
/// timeout from now); `NotPaused` when it is not paused.
pub(crate) async fn resume(state: &AppState, tenant: &Tenant, id: &str) -> Result<(), LifecycleError> {
    let renewal_ms = i64::try_from(state.settings().default_timeout_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    if !state.store().resume_sandbox(&tenant.name, id, tenant.quota, (now_ms(), renewal_ms)).await?? {
        return Err(LifecycleError::NotPaused(id.to_owned()));
    }
    if let Err(failure) = state.runtime().set_paused(id, false).await {
        // Still paused in the runtime: say so in the database again (its clock restarts from now).
        state.store().pause_sandbox(id, now_ms()).await?;
        return Err(failure.into());
    }
    tracing::info!(sandbox = %id, tenant = %tenant.name, "sandbox resumed");
    Ok(())
}

/// Resumes a sandbox a request found paused (`auto_resume`, or E2B's `connect`); one that a concurrent request
/// resumed already is fine.
pub(crate) async fn ensure_resumed(state: &AppState, tenant: &Tenant, id: &str) -> Result<(), LifecycleError> {
    match resume(state, tenant, id).await {
        Ok(()) | Err(LifecycleError::NotPaused(_)) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The expiry of an `auto_pause` sandbox: paused instead of destroyed (it stays until deleted or resumed); false
/// when it could not be paused (then it is destroyed as any other).
pub(crate) async fn pause_at_timeout(state: &AppState, id: &str) -> bool {
    match pause(state, id).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(sandbox = %id, %error, "pausing at the timeout failed; destroying instead");
            false
        }
    }
}
