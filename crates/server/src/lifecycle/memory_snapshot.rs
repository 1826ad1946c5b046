//! Memory snapshots (gVisor and microVM): the runtime checkpoints the running sandbox into a private directory on this host
//! (`SandboxRuntime::memory_snapshot`; processes, memory, its tmpfs files), each image file becomes a part of the
//! snapshot (`memory.<file>`) in the snapshot store, and the directory is removed. A sandbox made from one gets the
//! parts back into a directory of its own (each chunk verified) and is created from it
//! (`SandboxRuntime::create_from_memory`): it runs on where the source was, with the source's spec. The directories
//! live under `AppState::snapshot_work` (0700), hold sandbox memory, and never outlive the request: removed when done,
//! and whatever a crash left is removed at the next start.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use sandkasten_snapshot_store::{Manifest, SnapshotWriter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::auth::Tenant;
use crate::lifecycle::detached::to_completion;
use crate::lifecycle::error::LifecycleError;
use crate::lifecycle::snapshot_errors::damaged_or_failed;
use crate::lifecycle::start::{Birth, abandon, start_born};
use crate::sandbox_lifecycle::Lifecycle;
use crate::state::AppState;
use crate::store::SandboxRecord;
use crate::store_snapshots::SnapshotRecord;
use crate::transfers::{Counter, TransferDirection};

/// What every part of a memory snapshot is named by: `memory.` + the image file's name.
const PART_PREFIX: &str = "memory.";
/// Bytes read from an image file at a time.
const READ_BYTES: usize = 1 << 20;

fn io_failed(what: &str, path: &Path, error: &std::io::Error) -> LifecycleError {
    LifecycleError::SnapshotStore(format!("{what} {}: {error}", path.display()))
}

/// A fresh, empty directory of this process's only (0700) under the work directory.
fn private_dir(state: &AppState, name: &str) -> Result<PathBuf, LifecycleError> {
    let work = state.snapshot_work();
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(work).map_err(|e| io_failed("creating", work, &e))?;
    let dir = work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| io_failed("creating", &dir, &e))?;
    Ok(dir)
}

/// Removes what a crash left in the work directory (at start, before anything uses it).
pub(crate) fn clear_work_dir(state: &AppState) {
    let work = state.snapshot_work();
    for entry in std::fs::read_dir(work).into_iter().flatten().flatten() {
        tracing::warn!(path = %entry.path().display(), "removing a memory snapshot image a crash left");
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// Checkpoints `record.source_sandbox` and adds each image file to `writer` as a part.
pub(crate) async fn save_memory(
    state: &AppState,
    record: &SnapshotRecord,
    writer: &mut SnapshotWriter,
    counter: &Arc<Counter>,
) -> Result<(), LifecycleError> {
    let dir = private_dir(state, &record.id)?;
    let saved = save_images(state, record, writer, &dir, counter).await;
    let _ = std::fs::remove_dir_all(&dir);
    saved
}

async fn save_images(
    state: &AppState,
    record: &SnapshotRecord,
    writer: &mut SnapshotWriter,
    dir: &Path,
    counter: &Arc<Counter>,
) -> Result<(), LifecycleError> {
    state.runtime().memory_snapshot(&record.source_sandbox, dir).await.map_err(|failure| {
        LifecycleError::FilesNotCopied(format!(
            "saving the memory of sandbox {} failed: {}; no snapshot was kept",
            record.source_sandbox, failure.message
        ))
    })?;
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map_err(|e| io_failed("listing", dir, &e))?.flatten().map(|e| e.path()).collect();
    files.sort();
    counter.set_total(files.iter().filter_map(|path| path.metadata().ok()).map(|m| m.len()).sum());
    for path in files.into_iter().filter(|path| path.is_file()) {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let file = tokio::fs::File::open(&path).await.map_err(|e| io_failed("opening", &path, &e))?;
        let counter = Arc::clone(counter);
        let chunks = futures::stream::unfold(file, move |mut file| {
            let counter = Arc::clone(&counter);
            async move {
                let mut buffer = vec![0u8; READ_BYTES];
                match file.read(&mut buffer).await {
                    Ok(0) => None,
                    Ok(n) => {
                        counter.add(n as u64);
                        buffer.truncate(n);
                        Some((Ok::<Bytes, std::io::Error>(Bytes::from(buffer)), file))
                    }
                    Err(error) => Some((Err(error), file)),
                }
            }
        });
        writer.add_part(&format!("{PART_PREFIX}{name}"), chunks, None).await.map_err(|e| {
            LifecycleError::SnapshotStore(format!("storing the memory image {name} of snapshot {}: {e}", record.id))
        })?;
    }
    Ok(())
}

/// Starts a sandbox of `tenant` from the memory snapshot `snapshot` (its spec as it was); returns its row.
pub(crate) async fn start_from_memory(
    state: &AppState,
    tenant: &Tenant,
    snapshot: &SnapshotRecord,
    metadata: std::collections::BTreeMap<String, String>,
    expiry: (i64, Lifecycle),
) -> Result<SandboxRecord, LifecycleError> {
    // Its own task: a caller that goes away cannot leave the image's directory or an unannounced sandbox.
    let (state, tenant, snapshot) = (state.clone(), tenant.clone(), snapshot.clone());
    to_completion(async move { start_from_memory_now(&state, &tenant, &snapshot, metadata, expiry).await }).await
}

async fn start_from_memory_now(
    state: &AppState,
    tenant: &Tenant,
    snapshot: &SnapshotRecord,
    metadata: std::collections::BTreeMap<String, String>,
    expiry: (i64, Lifecycle),
) -> Result<SandboxRecord, LifecycleError> {
    let dir = private_dir(state, &format!("{}-{}", snapshot.id, crate::ids::random_hex(4)?))?;
    let started = async {
        fetch_images(state, snapshot, &dir).await?;
        let birth = Birth::Memory(&dir);
        start_born(state, tenant, snapshot.spec.clone(), metadata, expiry, birth).await.map(|(record, _)| record)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    started
}

/// Writes every `memory.` part of the snapshot into `dir` (0600 files), each chunk verified on the way.
async fn fetch_images(state: &AppState, snapshot: &SnapshotRecord, dir: &Path) -> Result<(), LifecycleError> {
    let manifest: Manifest =
        state.snapshots().manifest(&snapshot.id).await.map_err(|error| damaged_or_failed(&snapshot.id, &error))?;
    let transfer = state.transfers().begin(&snapshot.id, TransferDirection::Restoring);
    let counter = transfer.counter();
    let images = manifest.parts.iter().filter(|part| part.name.starts_with(PART_PREFIX));
    counter.set_total(images.map(|part| part.logical_bytes).sum());
    for part in &manifest.parts {
        let Some(name) = part.name.strip_prefix(PART_PREFIX) else { continue };
        let path = dir.join(name);
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .await
            .map_err(|e| io_failed("creating", &path, &e))?;
        let mut chunks = std::pin::pin!(state.snapshots().read_part(&manifest, &part.name));
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| damaged_or_failed(&snapshot.id, &error))?;
            counter.add(chunk.len() as u64);
            file.write_all(&chunk).await.map_err(|e| io_failed("writing", &path, &e))?;
        }
        file.flush().await.map_err(|e| io_failed("writing", &path, &e))?;
    }
    Ok(())
}

/// Forks the running gVisor or microVM sandbox `source` with its memory: one memory snapshot into a work directory, and
/// `count` sandboxes restored from it, each admitted as a create; when one cannot be made, none is kept.
pub(crate) async fn fork_with_memory(
    state: &AppState,
    tenant: &Tenant,
    source: &SandboxRecord,
    count: u64,
    expires_ms: i64,
) -> Result<Vec<SandboxRecord>, LifecycleError> {
    let dir = private_dir(state, &format!("fork-{}-{}", source.id, crate::ids::random_hex(4)?))?;
    let forked = async {
        state.runtime().memory_snapshot(&source.id, &dir).await.map_err(|failure| {
            LifecycleError::FilesNotCopied(format!(
                "saving the memory of sandbox {} failed: {}; no copy was made",
                source.id, failure.message
            ))
        })?;
        let mut copies: Vec<SandboxRecord> = Vec::new();
        for _ in 0..count {
            let expiry = (expires_ms, source.lifecycle);
            let birth = Birth::Memory(&dir);
            match start_born(state, tenant, source.spec.clone(), source.metadata.clone(), expiry, birth).await {
                Ok((copy, _)) => copies.push(copy),
                Err(error) => {
                    for copy in &copies {
                        abandon(state, &copy.id).await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(copies)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    forked
}
