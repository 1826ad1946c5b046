//! Snapshots of a sandbox's files (and, on gVisor and microVM, its memory: `memory_snapshot`): taking one (the sandbox's writable directories as one tar, streamed from inside it
//! into the snapshot store: content-addressed chunks, then the manifest), restoring one into a new sandbox, deleting
//! one (its chunks no other snapshot uses go with it), and at start reconciling the database with the store.
//!
//! Order, so that a crash at any point leaves no snapshot that lists but cannot restore: the row is written
//! `saving` before the first chunk, the manifest after the last, the row `ready` after the manifest. At start,
//! `saving` rows are removed with whatever the store has of them, manifests no row names are deleted, and GC removes
//! the chunks nothing references. A snapshot is charged to its tenant by the bytes its chunks take in the store
//! (`max_snapshot_bytes`, 429 beyond).

use std::convert::Infallible;

use bytes::Bytes;
use futures::StreamExt;
use sandkasten_runtime::writable_dirs;
use sandkasten_snapshot_store::{Manifest, SnapshotWriter, StoreError as SnapshotStoreError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::Tenant;
use crate::clock::now_ms;
use crate::ids;
use std::collections::BTreeMap;

use sandkasten_types::SandboxSpec;

use crate::lifecycle::detached::to_completion;
use crate::lifecycle::error::LifecycleError;
use crate::lifecycle::memory_snapshot::{clear_work_dir, save_memory};
use crate::lifecycle::pause_snapshot::delete_pause_snapshot;
use crate::lifecycle::snapshot_errors::{damaged_or_failed, store_failed};
use crate::lifecycle::start::{abandon, start_sandbox};
use crate::sandbox_lifecycle::Lifecycle;
use crate::state::AppState;
use crate::store::{SandboxRecord, StoreError};
use crate::store_snapshots::{SnapshotRecord, SnapshotState};
use crate::transfers::TransferDirection;

/// The part of a snapshot that holds the files.
const FILES_PART: &str = "files.tar";
/// Archive chunks in flight between the sandbox and the store.
const IN_FLIGHT: usize = 4;

/// Takes a snapshot of the running sandbox `sandbox`'s files; returns its row (`ready`). Nothing of it remains when
/// it fails.
pub(crate) async fn take_snapshot(
    state: &AppState,
    tenant: &Tenant,
    sandbox: &SandboxRecord,
    memory: bool,
    name: Option<String>,
) -> Result<SnapshotRecord, LifecycleError> {
    let (state, tenant, sandbox) = (state.clone(), tenant.clone(), sandbox.clone());
    to_completion(async move { take_now(&state, &tenant, &sandbox, (memory, name), false).await }).await
}

/// Takes the snapshot of the running sandbox `sandbox`'s files that holds them while it is paused to the filesystem
/// (`for_pause`: the tenant neither sees nor restores it); returns its row (`ready`). Nothing of it remains when it
/// fails.
pub(crate) async fn take_pause_snapshot(
    state: &AppState,
    tenant: &Tenant,
    sandbox: &SandboxRecord,
) -> Result<SnapshotRecord, LifecycleError> {
    let (state, tenant, sandbox) = (state.clone(), tenant.clone(), sandbox.clone());
    to_completion(async move { take_now(&state, &tenant, &sandbox, (false, None), true).await }).await
}

async fn take_now(
    state: &AppState,
    tenant: &Tenant,
    sandbox: &SandboxRecord,
    (memory, name): (bool, Option<String>),
    for_pause: bool,
) -> Result<SnapshotRecord, LifecycleError> {
    if memory && !sandbox.spec.tier().saves_memory() {
        return Err(LifecycleError::SnapshotRefused(format!(
            "memory snapshots need the gvisor or microvm tier (they save processes and memory); sandbox {} is on the \
             {} tier: take a filesystem snapshot with \"memory\": false, or create the sandbox with isolation \
             \"gvisor\" or \"microvm\"",
            sandbox.id,
            sandbox.spec.tier()
        )));
    }
    let record = SnapshotRecord {
        id: ids::snapshot_id()?,
        tenant: tenant.name.to_string(),
        name,
        source_sandbox: sandbox.id.clone(),
        memory,
        spec: sandbox.spec.clone(),
        dirs: writable_dirs(sandbox.spec.template),
        state: SnapshotState::Saving,
        size_bytes: 0,
        stored_bytes: 0,
        created_ms: now_ms(),
        for_pause,
    };
    state.store().begin_snapshot(record.clone(), tenant.quota).await??;
    match save(state, &record).await {
        Ok(manifest) => {
            let sizes = (manifest.logical_bytes, manifest.stored_bytes);
            match state.store().finish_snapshot(&record.id, sizes, tenant.quota).await {
                Ok(Ok(())) => {}
                Ok(Err(exceeded)) => {
                    discard(state, &record.id).await;
                    return Err(exceeded.into());
                }
                Err(error) => {
                    discard(state, &record.id).await;
                    return Err(error.into());
                }
            }
            tracing::info!(
                snapshot = %record.id, sandbox = %sandbox.id, tenant = %tenant.name,
                bytes = manifest.logical_bytes, stored = manifest.stored_bytes, "snapshot taken"
            );
            let taken = if for_pause {
                state.store().pause_snapshot(&record.id).await?
            } else {
                state.store().snapshot(&tenant.name, &record.id).await?
            };
            taken.ok_or_else(|| LifecycleError::SnapshotNotFound(record.id.clone()))
        }
        Err(error) => {
            discard(state, &record.id).await;
            Err(error)
        }
    }
}

/// Streams the sandbox's files into the store and writes the manifest.
async fn save(state: &AppState, record: &SnapshotRecord) -> Result<Manifest, LifecycleError> {
    let mut writer = state.snapshots().writer(&record.id).map_err(|e| store_failed("snapshot store", &e))?;
    let transfer = state.transfers().begin(&record.id, TransferDirection::Saving);
    let counter = transfer.counter();
    if record.memory {
        save_memory(state, record, &mut writer, &counter).await?;
        return commit(writer, record).await;
    }
    // The archive is about as large as what the writable filesystems hold.
    if let Ok(usage) = state.runtime().usage(&record.source_sandbox).await {
        counter.set_total(usage.disk.used_bytes);
    }
    let (sink, archive) = mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let chunks = ReceiverStream::new(archive).map(move |chunk| {
        counter.add(chunk.len() as u64);
        Ok::<Bytes, Infallible>(Bytes::from(chunk))
    });
    let export = state.runtime().export_files(&record.source_sandbox, record.dirs.clone(), sink);
    let (exported, stored) = tokio::join!(export, writer.add_part(FILES_PART, chunks, None));
    if let Err(failure) = exported {
        return Err(LifecycleError::FilesNotCopied(format!(
            "archiving the files of sandbox {} failed: {}; no snapshot was kept",
            record.source_sandbox, failure.message
        )));
    }
    stored.map_err(|e| store_failed("storing the snapshot", &e))?;
    commit(writer, record).await
}

/// Writes the manifest: the snapshot exists from here on.
async fn commit(writer: SnapshotWriter, record: &SnapshotRecord) -> Result<Manifest, LifecycleError> {
    let metadata = serde_json::json!({
        "tenant": record.tenant, "source_sandbox": record.source_sandbox, "dirs": record.dirs, "memory": record.memory,
    });
    writer.commit(metadata).await.map_err(|e| store_failed("writing the snapshot's manifest", &e))
}

/// Removes a snapshot that did not come to be (or is deleted): its row, its manifest if written, its chunks that
/// nothing else uses. Failures are logged: the next start's reconcile finishes the job.
async fn discard(state: &AppState, id: &str) {
    match state.snapshots().delete(id).await {
        Ok(_) | Err(SnapshotStoreError::NotFound { .. }) => {}
        Err(error) => tracing::warn!(snapshot = %id, %error, "could not delete a snapshot from the store"),
    }
    if let Err(error) = state.snapshots().gc().await {
        tracing::warn!(snapshot = %id, %error, "snapshot store gc failed");
    }
    if let Err(error) = state.store().forget_snapshot(id).await {
        tracing::error!(snapshot = %id, %error, "could not remove a snapshot's row");
    }
}

/// The tenant's snapshot `id`, ready to restore.
pub(crate) async fn usable_snapshot(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
) -> Result<SnapshotRecord, LifecycleError> {
    let record = state.store().snapshot(&tenant.name, id).await?;
    let record = record.ok_or_else(|| LifecycleError::SnapshotNotFound(id.to_owned()))?;
    if record.state != SnapshotState::Ready {
        return Err(LifecycleError::SnapshotRefused(format!(
            "snapshot {id} is still being saved; wait until it is ready (GET /v1/snapshots/{id})"
        )));
    }
    Ok(record)
}

/// Starts a sandbox of `tenant` for `spec` on the files of the filesystem snapshot `snapshot`; when they cannot be
/// unpacked the sandbox is abandoned (destroyed, its row removed), so nothing half-made remains. Runs to its end even
/// when the caller goes away, and so holds `starting` (its template's layers, `template_use`) until the sandbox's
/// row names them.
pub(crate) async fn start_on_files(
    state: &AppState,
    tenant: &Tenant,
    spec: SandboxSpec,
    metadata: BTreeMap<String, String>,
    expiry: (i64, Lifecycle),
    snapshot: &SnapshotRecord,
    starting: Option<crate::template_use::Starting>,
) -> Result<SandboxRecord, LifecycleError> {
    let (state, tenant, snapshot) = (state.clone(), tenant.clone(), snapshot.clone());
    to_completion(async move {
        let started = start_sandbox(&state, &tenant, spec, metadata, expiry).await;
        drop(starting);
        let current = started?;
        if let Err(error) = restore_files(&state, &snapshot, &current.id).await {
            abandon(&state, &current.id).await;
            return Err(error);
        }
        Ok(current)
    })
    .await
}

/// Unpacks the snapshot's files into the new sandbox `sandbox_id`, each chunk verified against its hash on the way.
pub(crate) async fn restore_files(
    state: &AppState,
    snapshot: &SnapshotRecord,
    sandbox_id: &str,
) -> Result<(), LifecycleError> {
    let manifest = match state.snapshots().manifest(&snapshot.id).await {
        Ok(manifest) => manifest,
        Err(error) => return Err(damaged_or_failed(&snapshot.id, &error)),
    };
    let transfer = state.transfers().begin(&snapshot.id, TransferDirection::Restoring);
    let counter = transfer.counter();
    counter.set_total(manifest.part(FILES_PART).map_or(0, |part| part.logical_bytes));
    let (input, source) = mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let store = state.snapshots().clone();
    let feed = async move {
        let mut chunks = std::pin::pin!(store.read_part(&manifest, FILES_PART));
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            counter.add(chunk.len() as u64);
            if input.send(chunk.to_vec()).await.is_err() {
                break;
            }
        }
        Ok::<(), SnapshotStoreError>(())
    };
    let (fed, imported) = tokio::join!(feed, state.runtime().import_files(sandbox_id, source));
    // A chunk that fails its check cuts the archive short: the damage is the cause, tar's complaint the consequence.
    fed.map_err(|error| damaged_or_failed(&snapshot.id, &error))?;
    imported.map_err(|failure| {
        LifecycleError::FilesNotCopied(format!(
            "unpacking snapshot {} into sandbox {sandbox_id} failed: {}",
            snapshot.id, failure.message
        ))
    })
}

/// Deletes the tenant's snapshot `id` with its chunks that no other snapshot uses.
pub(crate) async fn delete_snapshot(state: &AppState, tenant: &Tenant, id: &str) -> Result<(), LifecycleError> {
    let record = state.store().snapshot(&tenant.name, id).await?;
    let record = record.ok_or_else(|| LifecycleError::SnapshotNotFound(id.to_owned()))?;
    if record.state != SnapshotState::Ready {
        return Err(LifecycleError::SnapshotRefused(format!(
            "snapshot {id} is still being saved; delete it once it is ready"
        )));
    }
    // The row last: a crash in between leaves a row whose manifest is gone, which the reconcile removes.
    match state.snapshots().delete(id).await {
        Ok(_) | Err(SnapshotStoreError::NotFound { .. }) => {}
        Err(error) => return Err(store_failed(&format!("deleting snapshot {id}"), &error)),
    }
    state.store().forget_snapshot(id).await?;
    tracing::info!(snapshot = %id, tenant = %tenant.name, "snapshot deleted");
    Ok(())
}

/// At start: rows still `saving` (a crash cut them off) are removed with what the store has of them, `ready` rows
/// whose manifest is gone are removed (they could not restore), manifests no row names are deleted, and GC removes
/// the chunks nothing references. Returns how many rows and manifests it removed.
pub(crate) async fn reconcile_snapshots(state: &AppState) -> Result<usize, StoreError> {
    clear_work_dir(state);
    let mut removed = 0;
    // A pause snapshot whose sandbox is no longer paused (a crash came between its resume or end and the delete).
    for id in state.store().orphaned_pause_snapshots().await? {
        tracing::warn!(snapshot = %id, "deleting the pause snapshot of a sandbox that is no longer paused");
        match delete_pause_snapshot(state, &id).await {
            Ok(()) => removed += 1,
            Err(error) => tracing::warn!(snapshot = %id, %error, "could not delete a pause snapshot"),
        }
    }
    let rows = state.store().all_snapshots().await?;
    let stored = match state.snapshots().list().await {
        Ok(stored) => stored,
        Err(error) => {
            tracing::error!(%error, "cannot list the snapshot store; snapshots are not reconciled");
            return Ok(0);
        }
    };
    for (id, row_state) in &rows {
        let has_manifest = stored.binary_search(id).is_ok();
        if *row_state == SnapshotState::Saving || !has_manifest {
            tracing::warn!(snapshot = %id, state = row_state.as_str(), has_manifest, "removing an unfinished snapshot");
            if has_manifest && let Err(error) = state.snapshots().delete(id).await {
                tracing::warn!(snapshot = %id, %error, "could not delete a snapshot from the store");
                continue;
            }
            state.store().forget_snapshot(id).await?;
            removed += 1;
        }
    }
    for id in stored.iter().filter(|id| !rows.iter().any(|(row, _)| row == *id)) {
        tracing::warn!(snapshot = %id, "deleting a manifest that no snapshot row names");
        match state.snapshots().delete(id).await {
            Ok(_) => removed += 1,
            Err(error) => tracing::warn!(snapshot = %id, %error, "could not delete a snapshot from the store"),
        }
    }
    if let Err(error) = state.snapshots().gc().await {
        tracing::warn!(%error, "snapshot store gc failed");
    }
    Ok(removed)
}
