//! Reading a part back: its chunks fetched in order (the next one already on its way while the caller consumes the
//! current), each decompressed and its hash verified before a byte of it is handed out.
//!
//! Progress: the stream yields one chunk (at most 4 MiB) at a time, so the caller's running sum of the yielded
//! lengths against [`PartManifest::logical_bytes`] is the bytes done, with no callback to pass in.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};

use crate::chunk::decode_verified;
use crate::error::StoreError;
use crate::manifest::{ChunkRef, Manifest, PartManifest};

/// Chunks fetched ahead of the one the caller is consuming.
const CHUNKS_READ_AHEAD: usize = 2;

/// The bytes of `part` of the snapshot `manifest` describes, chunk by chunk; the first error ends the stream.
pub(crate) fn read_part(
    objects: Arc<dyn ObjectStore>,
    manifest: &Manifest,
    part: &str,
) -> BoxStream<'static, Result<Bytes, StoreError>> {
    let Some(PartManifest { name, chunks, .. }) = manifest.part(part).cloned() else {
        let missing = StoreError::PartNotFound { snapshot_id: manifest.snapshot_id.clone(), part: part.to_owned() };
        return stream::once(async { Err(missing) }).boxed();
    };
    let snapshot_id = manifest.snapshot_id.clone();
    stream::iter(chunks)
        .map(move |chunk| read_chunk(objects.clone(), snapshot_id.clone(), name.clone(), chunk))
        .buffered(CHUNKS_READ_AHEAD)
        .into_stream()
        .boxed()
}

/// One chunk, verified.
async fn read_chunk(
    objects: Arc<dyn ObjectStore>,
    snapshot_id: String,
    part: String,
    chunk: ChunkRef,
) -> Result<Bytes, StoreError> {
    let path = chunk.hash.path();
    let stored = match objects.get(&path).await {
        Ok(found) => found.bytes().await,
        Err(error) => Err(error),
    };
    let stored = match stored {
        Ok(stored) => stored,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(StoreError::ChunkMissing { snapshot_id, part, chunk: chunk.hash });
        }
        Err(source) => return Err(StoreError::object_store("get", &path, source)),
    };
    match tokio::task::spawn_blocking(move || decode_verified(&stored, &chunk.hash, chunk.len)).await? {
        Ok(data) => Ok(data),
        Err(problem) => Err(StoreError::ChunkCorrupt { snapshot_id, part, chunk: chunk.hash, problem }),
    }
}
