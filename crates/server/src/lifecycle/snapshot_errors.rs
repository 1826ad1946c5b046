//! How the snapshot store's failures are told: damage to a stored snapshot (a chunk missing or not what its manifest
//! says, the manifest gone) is the snapshot's own 409 naming it and what to do; anything else is the store failing
//! (503 `store_failed`). Shared by filesystem and memory snapshots.

use sandkasten_snapshot_store::StoreError as SnapshotStoreError;

use crate::lifecycle::error::LifecycleError;

/// The store failed at `what`.
pub(crate) fn store_failed(what: &str, error: &SnapshotStoreError) -> LifecycleError {
    LifecycleError::SnapshotStore(format!("{what}: {error}"))
}

/// A failure reading snapshot `id`: damage (409, naming it) or the store failing.
pub(crate) fn damaged_or_failed(id: &str, error: &SnapshotStoreError) -> LifecycleError {
    if matches!(error, SnapshotStoreError::NotFound { .. }) {
        return LifecycleError::SnapshotRefused(format!(
            "snapshot {id} is damaged: its manifest is missing from the store; delete it and take a new one"
        ));
    }
    if error.damaged_snapshot().is_some() {
        return LifecycleError::SnapshotRefused(format!(
            "snapshot {id} is damaged and cannot be restored ({error}); delete it and take a new one"
        ));
    }
    store_failed(&format!("reading snapshot {id}"), error)
}
