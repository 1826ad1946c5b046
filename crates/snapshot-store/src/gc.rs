//! Garbage collection: delete every chunk that no manifest references and that is older than the grace period
//! (and a local store's crash-left staging files: the `staging` module).
//!
//! What keeps a chunk a put still needs:
//! - in this process, the put's pins (the `pins` module): GC never deletes a chunk a put found already stored
//!   (possibly an orphan, however old) or uploaded, from before the put looks for it until its manifest is written;
//! - from other processes on the same store (several servers or hosts sharing a bucket), the grace period: a chunk
//!   they upload is young and kept, and a put that finds a chunk already stored but older than half the grace
//!   period writes it again (`writer::put_chunk_if_absent`), so an old orphan it reuses is young again. What stays
//!   unprotected is a put that takes longer than half the grace period between finding a chunk and committing its
//!   manifest: keep the grace period (`gc_grace_s`, an hour by default) well above the longest put.
//!
//! A manifest that cannot be read stops GC before anything is deleted: its chunks may be referenced.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::chunk::{CHUNKS_PREFIX, ChunkHash};
use crate::error::StoreError;
use crate::store::SnapshotStore;

/// What one collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Manifests read (live snapshots).
    pub manifests: usize,
    /// Chunks kept because a manifest references them.
    pub chunks_referenced: usize,
    /// Unreferenced chunks kept because they are younger than the grace period.
    pub chunks_too_young: usize,
    /// Unreferenced chunks kept because a put of this process in progress is using them.
    pub chunks_in_use: usize,
    /// Chunks deleted.
    pub chunks_deleted: usize,
    /// Stored (compressed) bytes of the deleted chunks.
    pub bytes_deleted: u64,
    /// Staging files of chunk writes a crash cut off (local stores only: the `staging` module) deleted.
    pub staging_files_deleted: usize,
}

/// Runs one collection over `store` (after any other running one).
pub(crate) async fn collect(store: &SnapshotStore, grace: Duration) -> Result<GcReport, StoreError> {
    let collection = store.pins().begin_collection().await;
    let objects = store.objects();
    let mut report = GcReport::default();
    let mut referenced = HashSet::new();
    for snapshot_id in store.list().await? {
        match store.manifest(&snapshot_id).await {
            Ok(manifest) => referenced.extend(manifest.chunk_hashes()),
            // Deleted since the listing: its chunks are garbage now.
            Err(StoreError::NotFound { .. }) => continue,
            Err(error) => return Err(error),
        }
        report.manifests += 1;
    }

    let chunks_prefix = Path::from(CHUNKS_PREFIX);
    let mut listing = objects.list(Some(&chunks_prefix));
    let now = SystemTime::now();
    while let Some(object) =
        listing.try_next().await.map_err(|source| StoreError::object_store("list", &chunks_prefix, source))?
    {
        let Some(hash) = ChunkHash::from_path(&object.location) else { continue };
        if referenced.contains(&hash) {
            report.chunks_referenced += 1;
            continue;
        }
        let modified = SystemTime::from(object.last_modified);
        // A modification time in the future (clock skew with the store) counts as young.
        let old_enough = grace.is_zero() || now.duration_since(modified).is_ok_and(|age| age >= grace);
        if !old_enough {
            report.chunks_too_young += 1;
            continue;
        }
        let Some(mark) = collection.start_deleting(hash) else {
            report.chunks_in_use += 1;
            continue;
        };
        let deleted = objects.delete(&object.location).await;
        drop(mark);
        match deleted {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => return Err(StoreError::object_store("delete", &object.location, source)),
        }
        report.chunks_deleted += 1;
        report.bytes_deleted += object.size;
    }
    if let Some(directory) = store.local_directory() {
        report.staging_files_deleted = crate::staging::sweep(directory, grace, &collection).await?;
    }
    tracing::info!(
        manifests = report.manifests,
        chunks_deleted = report.chunks_deleted,
        bytes_deleted = report.bytes_deleted,
        chunks_too_young = report.chunks_too_young,
        staging_files_deleted = report.staging_files_deleted,
        "snapshot gc done"
    );
    Ok(report)
}
