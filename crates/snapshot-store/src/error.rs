//! The one error type of the snapshot store. Damage to a stored snapshot (a chunk missing, or one whose bytes are not
//! what its manifest says) has variants of its own that name the snapshot, the part and the chunk, so the caller can
//! tell "snapshot X is damaged" apart from "the object store is unreachable".

use std::error::Error as StdError;
use std::path::PathBuf;

use crate::chunk::ChunkHash;

/// What went wrong in the snapshot store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The configured URL is neither `file:///absolute/dir` nor `s3://bucket[/prefix]`.
    #[error("snapshot store url {url:?} is not usable: {reason} (use file:///absolute/dir or s3://bucket/prefix)")]
    InvalidUrl {
        /// The URL as configured.
        url: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The local snapshot directory could not be created.
    #[error("cannot create the snapshot directory {path}: {source} (create it, mode 0700, or choose another url)")]
    CreateDirectory {
        /// The directory.
        path: PathBuf,
        /// The error of `mkdir`.
        source: std::io::Error,
    },
    /// object_store refused the local directory or the S3 settings.
    #[error("cannot open the snapshot store at {url}: {source}")]
    Open {
        /// The URL as configured.
        url: String,
        /// What object_store said.
        source: object_store::Error,
    },
    /// A snapshot id outside `[a-z0-9-]{1,64}`.
    #[error("snapshot id {id:?} is not valid: use 1 to 64 characters of a-z, 0-9 and -")]
    InvalidSnapshotId {
        /// The id given.
        id: String,
    },
    /// A part name outside `[A-Za-z0-9._-]{1,128}`.
    #[error("part name {name:?} is not valid: use 1 to 128 characters of A-Z, a-z, 0-9, '.', '_' and '-'")]
    InvalidPartName {
        /// The name given.
        name: String,
    },
    /// The same part name was added twice to one snapshot.
    #[error("part {part:?} was already added to snapshot {snapshot_id}: give each part its own name")]
    DuplicatePart {
        /// The snapshot being written.
        snapshot_id: String,
        /// The part name.
        part: String,
    },
    /// An earlier `add_part` of this writer failed, so the snapshot would be incomplete.
    #[error("snapshot {snapshot_id} cannot be committed: an earlier part failed to store (start a new writer)")]
    WriterFailed {
        /// The snapshot being written.
        snapshot_id: String,
    },
    /// A snapshot with this id is already stored.
    #[error("snapshot {snapshot_id} already exists: delete it first or use a new id")]
    AlreadyExists {
        /// The snapshot id.
        snapshot_id: String,
    },
    /// No manifest for this snapshot id.
    #[error("snapshot {snapshot_id} not found")]
    NotFound {
        /// The snapshot id.
        snapshot_id: String,
    },
    /// The manifest has no part of this name.
    #[error("snapshot {snapshot_id} has no part {part:?}")]
    PartNotFound {
        /// The snapshot id.
        snapshot_id: String,
        /// The part asked for.
        part: String,
    },
    /// The manifest is not JSON of the manifest format, or describes another snapshot.
    #[error("snapshot {snapshot_id} is damaged: its manifest is unreadable: {reason}")]
    ManifestDamaged {
        /// The snapshot id.
        snapshot_id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The manifest was written by a newer format than this build reads.
    #[error("snapshot {snapshot_id} has manifest format {found}; this build reads format {supported} (upgrade)")]
    ManifestVersion {
        /// The snapshot id.
        snapshot_id: String,
        /// The manifest's format version.
        found: u32,
        /// The one this build reads.
        supported: u32,
    },
    /// A chunk the manifest lists is not in the store.
    #[error("snapshot {snapshot_id} is damaged: chunk {chunk} of part {part:?} is missing from the store")]
    ChunkMissing {
        /// The snapshot id.
        snapshot_id: String,
        /// The part being read.
        part: String,
        /// The chunk's hash.
        chunk: ChunkHash,
    },
    /// A stored chunk does not decompress to the bytes its hash names.
    #[error("snapshot {snapshot_id} is damaged: chunk {chunk} of part {part:?} {problem}")]
    ChunkCorrupt {
        /// The snapshot id.
        snapshot_id: String,
        /// The part being read.
        part: String,
        /// The chunk's hash.
        chunk: ChunkHash,
        /// What is wrong ("does not decompress: …", "has the wrong hash", …).
        problem: String,
    },
    /// The caller's input stream of a part failed.
    #[error("reading the input of part {part:?} failed: {source}")]
    Input {
        /// The part being written.
        part: String,
        /// The input's error.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// Compressing a chunk failed (zstd out of memory).
    #[error("compressing a chunk failed: {0}")]
    Compress(std::io::Error),
    /// An object store request failed.
    #[error("object store {operation} of {path} failed: {source}")]
    ObjectStore {
        /// `get`, `put`, `head`, `delete` or `list`.
        operation: &'static str,
        /// The object's path in the store.
        path: String,
        /// What object_store said.
        source: object_store::Error,
    },
    /// A file operation on a local store's directory failed (GC's sweep of crash-left staging files).
    #[error("{operation} of {path} in the snapshot store failed: {source}")]
    LocalFile {
        /// `read_dir`, `stat` or `remove`.
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error of the call.
        source: std::io::Error,
    },
    /// A blocking worker (compression, verification) panicked or was cancelled.
    #[error("a chunk worker failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

impl StoreError {
    /// The id of the snapshot this error shows to be damaged (a chunk missing or corrupt, the manifest unreadable),
    /// or `None` when the error says nothing about the stored snapshot (bad input, an unreachable store, …).
    pub fn damaged_snapshot(&self) -> Option<&str> {
        match self {
            StoreError::ChunkMissing { snapshot_id, .. }
            | StoreError::ChunkCorrupt { snapshot_id, .. }
            | StoreError::ManifestDamaged { snapshot_id, .. } => Some(snapshot_id),
            _ => None,
        }
    }

    /// An object store failure of `operation` on `path`.
    pub(crate) fn object_store(
        operation: &'static str,
        path: &object_store::path::Path,
        source: object_store::Error,
    ) -> Self {
        StoreError::ObjectStore { operation, path: path.to_string(), source }
    }
}
