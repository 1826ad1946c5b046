//! Deleting a pause snapshot (the files of a sandbox paused to the filesystem) once its sandbox was resumed or ended.
//! Its own file so that ending a sandbox (`destroy`) needs nothing of taking or restoring snapshots.

use sandkasten_snapshot_store::StoreError as SnapshotStoreError;

use crate::lifecycle::error::LifecycleError;
use crate::lifecycle::snapshot_errors::store_failed;
use crate::state::AppState;

/// Deletes the pause snapshot `id` (its sandbox was resumed or ended) with its chunks that no other snapshot uses.
pub(crate) async fn delete_pause_snapshot(state: &AppState, id: &str) -> Result<(), LifecycleError> {
    match state.snapshots().delete(id).await {
        Ok(_) | Err(SnapshotStoreError::NotFound { .. }) => {}
        Err(error) => return Err(store_failed(&format!("deleting pause snapshot {id}"), &error)),
    }
    state.store().forget_snapshot(id).await?;
    Ok(())
}
