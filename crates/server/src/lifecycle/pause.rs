//! Pausing and resuming a sandbox, one transition at a time per sandbox (`transitions`), each run to its end even
//! when the caller goes away. A pause with memory (`PauseMode::Memory`) marks the database first (a paused sandbox
//! leaves the running quota and its timeout clock stops), then asks the runtime's tier (the process tier freezes the
//! cgroup, gVisor checkpoints); a runtime that refuses undoes the database step, so the two never disagree for longer
//! than a call. A filesystem pause saves the files and releases the sandbox (`pause_files`). A resume is admitted
//! like a create (the quota must have room again). `auto_pause` sandboxes are paused by the expiry sweeper instead of
//! destroyed, as their `pause_mode` says.

use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::lifecycle::detached::to_completion;
use crate::lifecycle::error::LifecycleError;
use crate::lifecycle::pause_files::{pause_to_files, resume_from_files};
use crate::sandbox_lifecycle::PauseMode;
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// Pauses the tenant's running sandbox as `mode` says; `NotRunning` when it is not running (paused already, or
/// ended).
pub(crate) async fn pause(state: &AppState, tenant: &Tenant, id: &str, mode: PauseMode) -> Result<(), LifecycleError> {
    let (state, tenant, id) = (state.clone(), tenant.clone(), id.to_owned());
    to_completion(async move {
        let _transition = state.transitions().begin(&id).await;
        let record = state.store().sandbox(&tenant.name, &id).await?;
        let Some(record) = record.filter(|record| record.state == SandboxState::Running) else {
            return Err(LifecycleError::NotRunning(id));
        };
        match mode {
            PauseMode::Memory => pause_in_place(&state, &id).await?,
            PauseMode::Filesystem => pause_to_files(&state, &tenant, &record).await?,
        }
        tracing::info!(sandbox = %id, mode = mode.as_str(), "sandbox paused");
        Ok(())
    })
    .await
}

/// The tier's own pause: the database first, undone when the runtime refuses.
async fn pause_in_place(state: &AppState, id: &str) -> Result<(), LifecycleError> {
    if !state.store().pause_sandbox(id, now_ms()).await? {
        return Err(LifecycleError::NotRunning(id.to_owned()));
    }
    if let Err(failure) = state.runtime().set_paused(id, true).await {
        state.store().unpause_sandbox(id).await?;
        return Err(failure.into());
    }
    Ok(())
}

/// Resumes a paused sandbox of `tenant` if its quota has room (one paused at its timeout gets the server's default
/// timeout from now); `NotPaused` when it is not paused.
pub(crate) async fn resume(state: &AppState, tenant: &Tenant, id: &str) -> Result<(), LifecycleError> {
    let (state, tenant, id) = (state.clone(), tenant.clone(), id.to_owned());
    to_completion(async move {
        let _transition = state.transitions().begin(&id).await;
        let record = state.store().sandbox(&tenant.name, &id).await?;
        let Some(record) = record.filter(|record| record.state == SandboxState::Paused) else {
            return Err(LifecycleError::NotPaused(id));
        };
        match &record.pause_snapshot {
            None => resume_in_place(&state, &tenant, &record).await?,
            Some(snapshot) => resume_from_files(&state, &tenant, &record, snapshot).await?,
        }
        tracing::info!(sandbox = %id, tenant = %tenant.name, "sandbox resumed");
        Ok(())
    })
    .await
}

/// The database's resume (admitted against the quota, the expiry moved on); false when it was not paused.
pub(super) async fn admit_resume(state: &AppState, tenant: &Tenant, id: &str) -> Result<bool, LifecycleError> {
    let renewal_ms = i64::try_from(state.settings().default_timeout_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    Ok(state.store().resume_sandbox(&tenant.name, id, tenant.quota, (now_ms(), renewal_ms)).await??)
}

/// The tier's own resume of a sandbox paused in place.
async fn resume_in_place(state: &AppState, tenant: &Tenant, record: &SandboxRecord) -> Result<(), LifecycleError> {
    if !admit_resume(state, tenant, &record.id).await? {
        return Err(LifecycleError::NotPaused(record.id.clone()));
    }
    if let Err(failure) = state.runtime().set_paused(&record.id, false).await {
        // Still paused in the runtime: say so in the database again (its clock restarts from now).
        state.store().pause_sandbox(&record.id, now_ms()).await?;
        return Err(failure.into());
    }
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

/// The expiry of an `auto_pause` sandbox: paused as its `pause_mode` says instead of destroyed (it stays until
/// deleted or resumed); false when it could not be paused (then it is destroyed as any other).
pub(crate) async fn pause_at_timeout(state: &AppState, record: &SandboxRecord) -> bool {
    let Some(tenant) = state.keyring().tenants().find(|tenant| *tenant.name == *record.tenant).cloned() else {
        tracing::warn!(sandbox = %record.id, tenant = %record.tenant, "its tenant is no longer configured; destroying");
        return false;
    };
    match pause(state, &tenant, &record.id, record.lifecycle.pause_mode).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(sandbox = %record.id, %error, "pausing at the timeout failed; destroying instead");
            false
        }
    }
}
