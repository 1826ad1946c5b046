//! The manifest: what one snapshot is made of, stored as `manifests/<snapshot_id>.json` and written last, so a
//! manifest in the store always lists chunks that were stored before it. Format version 1:
//!
//! ```json
//! {"format": 1, "snapshot_id": "sb-1", "logical_bytes": 5, "stored_bytes": 14,
//!  "parts": [{"name": "rootfs.tar", "logical_bytes": 5,
//!             "chunks": [{"hash": "<64 hex>", "len": 5, "stored_len": 14}]}],
//!  "metadata": {"caller": "anything"}}
//! ```

use std::collections::HashSet;

use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::chunk::ChunkHash;
use crate::chunker::ChunkSizes;
use crate::error::StoreError;

/// The manifest format this build writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// The folder of every manifest in the store.
pub(crate) const MANIFESTS_PREFIX: &str = "manifests";

/// One stored snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`] when written.
    pub format: u32,
    /// The snapshot's id (`[a-z0-9-]{1,64}`).
    pub snapshot_id: String,
    /// Sum of the parts' uncompressed sizes, in bytes.
    pub logical_bytes: u64,
    /// Sum of the compressed sizes of the distinct chunks this snapshot references, in bytes: what its tenant is
    /// charged. A chunk shared with other snapshots is counted in each of them.
    pub stored_bytes: u64,
    /// The parts in the order they were added.
    pub parts: Vec<PartManifest>,
    /// Whatever the caller stored with the snapshot.
    pub metadata: serde_json::Value,
}

/// One named byte stream of a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartManifest {
    /// The part's name, unique within the snapshot.
    pub name: String,
    /// The part's uncompressed size in bytes.
    pub logical_bytes: u64,
    /// Its chunks, in order.
    pub chunks: Vec<ChunkRef>,
}

/// One chunk of a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// BLAKE3 of the uncompressed bytes: the chunk's address.
    pub hash: ChunkHash,
    /// Uncompressed length in bytes.
    pub len: u64,
    /// Compressed length in the store, in bytes.
    pub stored_len: u64,
}

impl Manifest {
    /// The part called `name`.
    pub fn part(&self, name: &str) -> Option<&PartManifest> {
        self.parts.iter().find(|part| part.name == name)
    }

    /// Every distinct chunk the snapshot references.
    pub fn chunk_hashes(&self) -> HashSet<ChunkHash> {
        self.parts.iter().flat_map(|part| part.chunks.iter().map(|chunk| chunk.hash)).collect()
    }

    /// Reads a stored manifest of `snapshot_id`, checking its format and that it is consistent.
    pub(crate) fn parse(snapshot_id: &str, bytes: &[u8]) -> Result<Manifest, StoreError> {
        let damaged = |reason: String| StoreError::ManifestDamaged { snapshot_id: snapshot_id.to_owned(), reason };
        #[derive(Deserialize)]
        struct FormatOnly {
            format: u32,
        }
        let format = serde_json::from_slice::<FormatOnly>(bytes).map_err(|error| damaged(error.to_string()))?.format;
        if format != MANIFEST_FORMAT {
            return Err(StoreError::ManifestVersion {
                snapshot_id: snapshot_id.to_owned(),
                found: format,
                supported: MANIFEST_FORMAT,
            });
        }
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(|error| damaged(error.to_string()))?;
        if manifest.snapshot_id != snapshot_id {
            return Err(damaged(format!("it describes snapshot {:?}", manifest.snapshot_id)));
        }
        for part in &manifest.parts {
            if part.chunks.iter().map(|chunk| chunk.len).sum::<u64>() != part.logical_bytes {
                return Err(damaged(format!("the chunks of part {:?} do not add up to its size", part.name)));
            }
            if let Some(chunk) = part.chunks.iter().find(|chunk| chunk.len > ChunkSizes::STANDARD.max as u64) {
                return Err(damaged(format!("chunk {} of part {:?} is longer than any chunk", chunk.hash, part.name)));
            }
        }
        if manifest.parts.iter().map(|part| part.logical_bytes).sum::<u64>() != manifest.logical_bytes {
            return Err(damaged("its parts do not add up to its size".to_owned()));
        }
        Ok(manifest)
    }
}

/// Where the manifest of `snapshot_id` is stored.
pub(crate) fn manifest_path(snapshot_id: &str) -> Path {
    Path::from(format!("{MANIFESTS_PREFIX}/{snapshot_id}.json"))
}

/// The snapshot id a manifest path names, or `None` for anything else under `manifests/`.
pub(crate) fn snapshot_id_of(path: &Path) -> Option<String> {
    let mut parts = path.parts();
    if parts.next()?.as_ref() != MANIFESTS_PREFIX {
        return None;
    }
    let file = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let id = file.as_ref().strip_suffix(".json")?;
    validate_snapshot_id(id).ok().map(|()| id.to_owned())
}

/// A snapshot id is 1 to 64 characters of `a-z`, `0-9` and `-`: safe as a file name and an object key as it is.
pub(crate) fn validate_snapshot_id(id: &str) -> Result<(), StoreError> {
    let valid =
        (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid { Ok(()) } else { Err(StoreError::InvalidSnapshotId { id: id.to_owned() }) }
}

/// A part name is 1 to 128 characters of `A-Z`, `a-z`, `0-9`, `.`, `_` and `-`, not `.` or `..`.
pub(crate) fn validate_part_name(name: &str) -> Result<(), StoreError> {
    let valid = (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && name != "."
        && name != "..";
    if valid { Ok(()) } else { Err(StoreError::InvalidPartName { name: name.to_owned() }) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sample() -> Manifest {
        let chunk = ChunkRef { hash: ChunkHash::of(b"hello"), len: 5, stored_len: 14 };
        Manifest {
            format: MANIFEST_FORMAT,
            snapshot_id: "sb-1".to_owned(),
            logical_bytes: 5,
            stored_bytes: 14,
            parts: vec![PartManifest { name: "rootfs.tar".to_owned(), logical_bytes: 5, chunks: vec![chunk] }],
            metadata: serde_json::json!({"caller": "anything"}),
        }
    }

    #[test]
    fn manifest_round_trips_through_json() {
        let bytes = serde_json::to_vec(&sample()).unwrap();
        assert_eq!(Manifest::parse("sb-1", &bytes).unwrap(), sample());
    }

    #[test]
    fn newer_formats_and_inconsistent_manifests_are_refused() {
        let mut newer = serde_json::to_value(sample()).unwrap();
        newer["format"] = 2.into();
        let error = Manifest::parse("sb-1", &serde_json::to_vec(&newer).unwrap()).unwrap_err();
        assert!(matches!(error, StoreError::ManifestVersion { found: 2, .. }), "{error}");

        let mut wrong_size = sample();
        wrong_size.parts[0].logical_bytes = 6;
        let error = Manifest::parse("sb-1", &serde_json::to_vec(&wrong_size).unwrap()).unwrap_err();
        assert_eq!(error.damaged_snapshot(), Some("sb-1"));

        let error = Manifest::parse("sb-2", &serde_json::to_vec(&sample()).unwrap()).unwrap_err();
        assert!(error.to_string().contains("describes snapshot \"sb-1\""), "{error}");
        assert!(Manifest::parse("sb-1", b"{not json").unwrap_err().damaged_snapshot().is_some());
    }

    #[test]
    fn snapshot_ids_and_part_names() {
        for id in ["a", "sb-0123", &"x".repeat(64)] {
            validate_snapshot_id(id).unwrap();
            assert_eq!(snapshot_id_of(&manifest_path(id)).as_deref(), Some(id));
        }
        for id in ["", "A", "a_b", "a/b", "..", &"x".repeat(65)] {
            assert!(validate_snapshot_id(id).is_err(), "{id:?}");
        }
        for name in ["rootfs.tar", "pages-0.img", "A_b"] {
            validate_part_name(name).unwrap();
        }
        for name in ["", ".", "..", "a/b", "a b", &"x".repeat(129)] {
            assert!(validate_part_name(name).is_err(), "{name:?}");
        }
    }
}
