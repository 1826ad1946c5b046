//! Sandbox snapshots stored as content-addressed chunks plus a manifest in an object store (a local directory by
//! default, S3-compatible when configured).
//!
//! A snapshot is a set of named parts (byte streams: the tar of a sandbox's writable filesystem, a gVisor
//! checkpoint's image files). Each part is cut into chunks by content (FastCDC 2020, 256 KiB / 1 MiB / 4 MiB:
//! the `chunker` module says why), each chunk is named by the BLAKE3 hash of its bytes and stored zstd-compressed
//! at `chunks/<first 2 hex>/<hash>.zst` unless the store already has it, so snapshots of one sandbox share their
//! unchanged chunks. The manifest (`manifests/<id>.json`) is written last: a put that fails or crashes leaves only
//! orphan chunks, which [`SnapshotStore::gc`] removes (in a local store also the
//! half-written staging file of a chunk write a crash cut off: the `staging` module).
//!
//! BLAKE3 rather than SHA-256: a content address needs collision resistance, not a standard; BLAKE3 gives 256 bits
//! of it at several GB/s per core (SHA-256 without SHA extensions manages a few hundred MB/s), which matters on the
//! dedup path, where every byte of a snapshot is hashed but almost none compressed or uploaded.
//!
//! ```no_run
//! # async fn example(tar: impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>>)
//! # -> Result<(), sandkasten_snapshot_store::StoreError> {
//! use futures::TryStreamExt;
//! use sandkasten_snapshot_store::{SnapshotStore, StoreConfig};
//!
//! let store = SnapshotStore::open(&StoreConfig::default())?;
//! let mut writer = store.writer("sb-1")?;
//! writer.add_part("rootfs.tar", tar, Some(&|done| println!("{done} bytes stored"))).await?;
//! let manifest = writer.commit(serde_json::json!({"tenant": "acme"})).await?;
//! let restored: Vec<bytes::Bytes> = store.read_part(&manifest, "rootfs.tar").try_collect().await?;
//! store.delete("sb-1").await?;
//! # Ok(()) }
//! ```

mod chunk;
mod chunker;
mod config;
mod error;
mod gc;
mod manifest;
mod pins;
mod reader;
mod staging;
mod store;
mod writer;

pub use chunk::{ChunkHash, InvalidChunkHash};
pub use config::{S3Options, StoreConfig};
pub use error::StoreError;
pub use gc::GcReport;
pub use manifest::{ChunkRef, MANIFEST_FORMAT, Manifest, PartManifest};
pub use store::SnapshotStore;
pub use writer::{PartSummary, SnapshotWriter};
