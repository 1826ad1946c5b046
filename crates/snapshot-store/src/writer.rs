//! Writing one snapshot: each part is chunked by content as it streams in, each chunk hashed, and stored compressed
//! unless the store already holds it; the manifest is written last, by [`SnapshotWriter::commit`], and only if every
//! part was stored. A writer dropped or failed half way leaves orphan chunks (which GC removes), never a manifest.
//!
//! Memory: the chunker's window (one maximum-size chunk) plus at most [`CHUNKS_IN_FLIGHT`] chunks being stored.

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, Stream, StreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::chunk::{ChunkHash, compress};
use crate::chunker::{ChunkSizes, Chunker};
use crate::error::StoreError;
use crate::manifest::{ChunkRef, MANIFEST_FORMAT, Manifest, PartManifest, manifest_path, validate_part_name};
use crate::pins::PinSet;
use crate::store::SnapshotStore;

/// Chunks hashed, compressed and uploaded at once per part: enough to keep an S3 connection busy, few enough that
/// memory stays at a handful of chunks.
const CHUNKS_IN_FLIGHT: usize = 4;

/// What one stored part came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartSummary {
    /// The part's name.
    pub name: String,
    /// Uncompressed bytes read from the input.
    pub logical_bytes: u64,
    /// Number of chunks.
    pub chunks: usize,
    /// Chunks that had to be uploaded (the rest were already in the store).
    pub new_chunks: usize,
    /// Compressed bytes uploaded for this part.
    pub uploaded_bytes: u64,
}

/// Writes one snapshot; made by [`SnapshotStore::writer`]. Until it commits or is dropped, it pins every chunk it
/// uses, so this process's GC leaves them alone.
pub struct SnapshotWriter {
    store: SnapshotStore,
    snapshot_id: String,
    parts: Vec<PartManifest>,
    /// Chunks of this snapshot already stored, with their stored size (a repeated chunk costs no request).
    known: HashMap<ChunkHash, u64>,
    failed: bool,
    pins: PinSet,
}

impl SnapshotWriter {
    pub(crate) fn new(store: SnapshotStore, snapshot_id: String) -> Self {
        let pins = PinSet::new(store.pins());
        SnapshotWriter { store, snapshot_id, parts: Vec::new(), known: HashMap::new(), failed: false, pins }
    }

    /// Stores the part `name` from `data`, streaming: chunks are stored as they are cut. `progress`, if given, is
    /// called with the part's bytes stored so far after each chunk. A failure (the input's or the store's) returns
    /// once the uploads already running have ended, and makes the writer unusable: [`SnapshotWriter::commit`] then
    /// refuses, and the chunks stored so far are orphans for GC.
    pub async fn add_part<S, E>(
        &mut self,
        name: &str,
        data: S,
        progress: Option<&(dyn Fn(u64) + Sync)>,
    ) -> Result<PartSummary, StoreError>
    where
        S: Stream<Item = Result<Bytes, E>>,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        validate_part_name(name)?;
        if self.failed {
            return Err(StoreError::WriterFailed { snapshot_id: self.snapshot_id.clone() });
        }
        if self.parts.iter().any(|part| part.name == name) {
            return Err(StoreError::DuplicatePart { snapshot_id: self.snapshot_id.clone(), part: name.to_owned() });
        }
        let result = self.store_part(name, data, progress).await;
        self.failed = result.is_err();
        let (part, summary) = result?;
        self.parts.push(part);
        Ok(summary)
    }

    async fn store_part<S, E>(
        &mut self,
        name: &str,
        data: S,
        progress: Option<&(dyn Fn(u64) + Sync)>,
    ) -> Result<(PartManifest, PartSummary), StoreError>
    where
        S: Stream<Item = Result<Bytes, E>>,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        let mut data = pin!(data);
        let mut chunker = Chunker::new(ChunkSizes::STANDARD);
        let mut in_flight = FuturesOrdered::new();
        let mut part = PartManifest { name: name.to_owned(), logical_bytes: 0, chunks: Vec::new() };
        let mut summary =
            PartSummary { name: name.to_owned(), logical_bytes: 0, chunks: 0, new_chunks: 0, uploaded_bytes: 0 };
        let mut at_end = false;
        let outcome = loop {
            while in_flight.len() < CHUNKS_IN_FLIGHT {
                let Some(chunk) = chunker.next_chunk(at_end) else { break };
                in_flight.push_back(self.store_chunk(chunk));
            }
            // At the end, `next_chunk` returned `None`: the chunker is empty.
            if at_end && in_flight.is_empty() {
                break Ok(());
            }
            // Below the limit, the chunker needs input (it returned `None`); at the limit, uploads must finish first.
            let read_more = !at_end && in_flight.len() < CHUNKS_IN_FLIGHT;
            tokio::select! {
                biased;
                Some(stored) = in_flight.next(), if !in_flight.is_empty() => {
                    let StoredChunk { chunk, uploaded } = match stored {
                        Ok(stored) => stored,
                        Err(error) => break Err(error),
                    };
                    self.known.insert(chunk.hash, chunk.stored_len);
                    part.logical_bytes += chunk.len;
                    part.chunks.push(chunk);
                    if uploaded {
                        summary.new_chunks += 1;
                        summary.uploaded_bytes += chunk.stored_len;
                    }
                    if let Some(progress) = progress {
                        progress(part.logical_bytes);
                    }
                }
                piece = data.next(), if read_more => match piece {
                    Some(Ok(piece)) => chunker.push(piece),
                    Some(Err(error)) => break Err(StoreError::Input { part: name.to_owned(), source: error.into() }),
                    None => at_end = true,
                },
            }
        };
        if let Err(error) = outcome {
            // Let the uploads already running end, so none lands after the caller saw the failure.
            while in_flight.next().await.is_some() {}
            return Err(error);
        }
        summary.logical_bytes = part.logical_bytes;
        summary.chunks = part.chunks.len();
        Ok((part, summary))
    }

    /// Stores one chunk unless this snapshot or the store already has it.
    fn store_chunk(&mut self, data: Bytes) -> BoxFuture<'static, Result<StoredChunk, StoreError>> {
        let objects = self.store.objects();
        // With no grace period nothing unreferenced survives a collection anyway: no refresh.
        let grace = self.store.gc_grace();
        let refresh_after = (!grace.is_zero()).then_some(grace / 2);
        let hash = ChunkHash::of(&data);
        let len = data.len() as u64;
        if let Some(&stored_len) = self.known.get(&hash) {
            return futures::future::ready(Ok(StoredChunk {
                chunk: ChunkRef { hash, len, stored_len },
                uploaded: false,
            }))
            .boxed();
        }
        let pins = self.pins.pin(hash);
        async move {
            pins.wait_while_deleting(hash).await;
            put_chunk_if_absent(objects, hash, data, refresh_after).await
        }
        .boxed()
    }

    /// Writes the manifest, making the snapshot visible, and returns it. Refused when an earlier part failed or a
    /// snapshot of this id exists.
    pub async fn commit(self, metadata: serde_json::Value) -> Result<Manifest, StoreError> {
        if self.failed {
            return Err(StoreError::WriterFailed { snapshot_id: self.snapshot_id });
        }
        let mut counted = HashSet::new();
        let stored_bytes = self
            .parts
            .iter()
            .flat_map(|part| &part.chunks)
            .filter(|chunk| counted.insert(chunk.hash))
            .map(|chunk| chunk.stored_len)
            .sum();
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            snapshot_id: self.snapshot_id.clone(),
            logical_bytes: self.parts.iter().map(|part| part.logical_bytes).sum(),
            stored_bytes,
            parts: self.parts,
            metadata,
        };
        let path = manifest_path(&self.snapshot_id);
        let json = serde_json::to_vec(&manifest).map_err(|error| StoreError::ManifestDamaged {
            snapshot_id: self.snapshot_id.clone(),
            reason: format!("cannot be written as JSON: {error}"),
        })?;
        let create = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.store.objects().put_opts(&path, PutPayload::from(json), create).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(StoreError::AlreadyExists { snapshot_id: self.snapshot_id });
            }
            Err(source) => return Err(StoreError::object_store("put", &path, source)),
        }
        self.pins.release_committed();
        tracing::debug!(snapshot_id = %manifest.snapshot_id, logical_bytes = manifest.logical_bytes,
            stored_bytes = manifest.stored_bytes, "snapshot committed");
        Ok(manifest)
    }
}

/// Whether `written` lies more than `age` in the past (a clock that disagrees counts as not).
fn is_older_than(written: std::time::SystemTime, age: std::time::Duration) -> bool {
    std::time::SystemTime::now().duration_since(written).is_ok_and(|elapsed| elapsed > age)
}

/// A chunk of a part as stored, and whether this put uploaded it.
struct StoredChunk {
    chunk: ChunkRef,
    uploaded: bool,
}

/// Uploads the chunk unless the store has it (a chunk written by any earlier or concurrent put counts: the same hash
/// is the same bytes, so a race between two uploads of it writes the same object twice). Presence is all that is
/// checked: a stored chunk damaged since it was written is reused as it is, and shows when a snapshot is read. A
/// stored chunk older than `refresh_after` (half the grace period; none without one) is written again: it may be an orphan (its snapshot deleted), which a
/// collection in another process deletes once past the grace period; written now, it is young for a whole grace
/// period, in which this put commits and references it (see `gc`).
async fn put_chunk_if_absent(
    objects: Arc<dyn ObjectStore>,
    hash: ChunkHash,
    data: Bytes,
    refresh_after: Option<std::time::Duration>,
) -> Result<StoredChunk, StoreError> {
    let path = hash.path();
    let len = data.len() as u64;
    match objects.head(&path).await {
        Ok(meta)
            if refresh_after.is_none_or(|age| !is_older_than(std::time::SystemTime::from(meta.last_modified), age)) =>
        {
            return Ok(StoredChunk { chunk: ChunkRef { hash, len, stored_len: meta.size }, uploaded: false });
        }
        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
        Err(source) => return Err(StoreError::object_store("head", &path, source)),
    }
    let compressed = tokio::task::spawn_blocking(move || compress(&data)).await?.map_err(StoreError::Compress)?;
    let stored_len = compressed.len() as u64;
    objects
        .put(&path, PutPayload::from(compressed))
        .await
        .map_err(|source| StoreError::object_store("put", &path, source))?;
    Ok(StoredChunk { chunk: ChunkRef { hash, len, stored_len }, uploaded: true })
}
