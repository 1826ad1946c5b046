//! Filesystem pauses (`PauseMode::Filesystem`, E2B's `pause(keep_memory=False)`): the sandbox's writable files are
//! saved to the snapshot store as a pause snapshot (`for_pause`, charged to the tenant like any snapshot) and the
//! sandbox is released entirely on every tier (processes, memory, cgroup, egress door); only its row, its id and its
//! E2B session stay. A resume makes the sandbox again under the same id from its recorded spec, unpacks the files,
//! opens its egress door, and deletes the pause snapshot. Running processes do not survive this kind of pause.
//!
//! Crash safety: the database says "paused" from before the files are saved, and the pause snapshot is `ready` only
//! once they all are; at the next start a paused sandbox with a ready pause snapshot stays paused, one without is
//! lost (`reconcile`), and a resume cut short is paused again on the same files.

use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::egress;
use crate::lifecycle::destroy::release_quietly;
use crate::lifecycle::error::LifecycleError;
use crate::lifecycle::pause_snapshot::delete_pause_snapshot;
use crate::lifecycle::snapshot::{restore_files, take_pause_snapshot};
use crate::state::AppState;
use crate::store::SandboxRecord;

/// Pauses the running sandbox `record` of `tenant` to the filesystem. On failure it runs on as before.
pub(super) async fn pause_to_files(
    state: &AppState,
    tenant: &Tenant,
    record: &SandboxRecord,
) -> Result<(), LifecycleError> {
    let id = &record.id;
    if !state.store().pause_sandbox(id, now_ms()).await? {
        return Err(LifecycleError::NotRunning(id.clone()));
    }
    let snapshot = match take_pause_snapshot(state, tenant, record).await {
        Ok(snapshot) => snapshot,
        Err(error) => {
            state.store().unpause_sandbox(id).await?;
            return Err(error);
        }
    };
    if !release_quietly(state, id).await {
        // It still runs: it is not paused, and its files stay where they are.
        if let Err(error) = delete_pause_snapshot(state, &snapshot.id).await {
            tracing::warn!(sandbox = %id, snapshot = %snapshot.id, %error, "could not delete an unused pause snapshot");
        }
        state.store().unpause_sandbox(id).await?;
        return Err(LifecycleError::DestroyFailed(id.clone()));
    }
    tracing::info!(sandbox = %id, snapshot = %snapshot.id, bytes = snapshot.size_bytes, "files saved, sandbox released");
    Ok(())
}

/// Resumes the sandbox `record` of `tenant`, paused to the filesystem in the pause snapshot `snapshot_id`. On failure
/// it stays paused on the same files.
pub(super) async fn resume_from_files(
    state: &AppState,
    tenant: &Tenant,
    record: &SandboxRecord,
    snapshot_id: &str,
) -> Result<(), LifecycleError> {
    let id = &record.id;
    let snapshot = state.store().pause_snapshot(snapshot_id).await?;
    let snapshot = snapshot.ok_or_else(|| LifecycleError::SnapshotNotFound(snapshot_id.to_owned()))?;
    if !admit_resume(state, tenant, id).await? {
        return Err(LifecycleError::NotPaused(id.clone()));
    }
    if let Err(error) = make_again(state, tenant, record, &snapshot).await {
        tracing::warn!(sandbox = %id, %error, "resuming from the filesystem failed; it stays paused");
        release_quietly(state, id).await;
        state.store().pause_sandbox(id, now_ms()).await?;
        return Err(error);
    }
    if let Err(error) = delete_pause_snapshot(state, &snapshot.id).await {
        // The next start's reconcile deletes it (its sandbox is no longer paused).
        tracing::warn!(sandbox = %id, snapshot = %snapshot.id, %error, "could not delete a used pause snapshot");
    }
    Ok(())
}

/// The database's resume (admitted against the quota, the expiry moved on); false when it was not paused.
pub(super) async fn admit_resume(state: &AppState, tenant: &Tenant, id: &str) -> Result<bool, LifecycleError> {
    let renewal_ms = i64::try_from(state.settings().default_timeout_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    Ok(state.store().resume_sandbox(&tenant.name, id, tenant.quota, (now_ms(), renewal_ms)).await??)
}

/// The sandbox created again under its id from its recorded spec (tier checked, egress prepared anew: new secret
/// placeholders), its files unpacked, its egress door opened.
async fn make_again(
    state: &AppState,
    tenant: &Tenant,
    record: &SandboxRecord,
    snapshot: &crate::store_snapshots::SnapshotRecord,
) -> Result<(), LifecycleError> {
    let mut spec = record.spec.clone();
    if let Some(reason) =
        spec.tier().unavailable_reason().map(str::to_owned).or_else(|| state.runtime().tier_unavailable(spec.tier()))
    {
        return Err(LifecycleError::TierUnavailable(reason));
    }
    let prepared = egress::prepare(state.store(), &tenant.name, &mut spec).await?;
    state.runtime().create(&record.id, &spec).await?;
    restore_files(state, snapshot, &record.id).await?;
    state.egress().attach(state.runtime(), &record.id, &tenant.name, prepared).await?;
    Ok(())
}
