//! The store's behaviour, written once and run against every backend: a local directory (`tests/local.rs`) and a
//! real S3-compatible server (`tests/s3.rs`). Each case gets a fresh, empty store and a raw handle on the same
//! objects, to damage them the way a disk or a bucket can.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::HashSet;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sandkasten_snapshot_store::{ChunkHash, Manifest, SnapshotStore, StoreConfig, StoreError};

/// A fresh store and raw access to its objects.
pub struct Harness {
    /// Opens the store (grace 0).
    pub config: StoreConfig,
    /// The same objects, bypassing the store.
    pub raw: Arc<dyn ObjectStore>,
}

impl Harness {
    pub fn store(&self) -> SnapshotStore {
        SnapshotStore::open(&self.config).unwrap()
    }

    pub fn store_with_grace(&self, gc_grace: Duration) -> SnapshotStore {
        SnapshotStore::open(&StoreConfig { gc_grace, ..self.config.clone() }).unwrap()
    }

    /// Every chunk in the store.
    pub async fn stored_chunks(&self) -> HashSet<String> {
        let listed: Vec<_> = self.raw.list(Some(&Path::from("chunks"))).try_collect().await.unwrap();
        listed.into_iter().map(|object| object.location.to_string()).collect()
    }
}

/// Every case, by name, for a backend's test to run one after another.
pub type Case = for<'a> fn(&'a Harness) -> futures::future::BoxFuture<'a, ()>;

pub const ALL: &[(&str, Case)] = &[
    ("empty_one_byte_and_multi_chunk_parts_round_trip", |h| Box::pin(parts_round_trip(h))),
    ("the_input_is_read_at_most_a_few_chunks_ahead_of_what_is_stored", |h| Box::pin(bounded_read_ahead(h))),
    ("a_corrupted_chunk_is_named_with_snapshot_and_part", |h| Box::pin(corrupted_chunk_is_named(h))),
    ("a_missing_chunk_is_named_with_snapshot_and_part", |h| Box::pin(missing_chunk_is_named(h))),
    ("a_put_failing_half_way_leaves_no_manifest_and_gc_removes_its_chunks", |h| Box::pin(failed_put(h))),
    ("deleting_one_of_two_snapshots_keeps_the_shared_chunks", |h| Box::pin(delete_keeps_shared(h))),
    ("two_tars_that_differ_a_little_share_most_chunks", |h| Box::pin(tar_dedup(h))),
    ("gc_keeps_orphans_younger_than_the_grace_period", |h| Box::pin(grace_keeps_young(h))),
    ("gc_spares_orphan_chunks_a_put_in_progress_reuses", |h| Box::pin(gc_spares_chunks_in_use(h))),
    ("an_old_orphan_a_put_reuses_survives_another_processs_gc", |h| Box::pin(old_orphan_reused_is_refreshed(h))),
    ("ids_duplicates_and_unknown_snapshots_are_refused", |h| Box::pin(refusals(h))),
    ("a_damaged_manifest_stops_gc_before_it_deletes", |h| Box::pin(damaged_manifest_stops_gc(h))),
];

/// Deterministic incompressible bytes.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    blake3::Hasher::new().update(&seed.to_le_bytes()).finalize_xof().fill(&mut bytes);
    bytes
}

/// `data` as a stream of 64 KiB pieces, as a tar writer or an HTTP body would deliver it.
pub fn pieces(data: &[u8]) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    let pieces: Vec<_> = data.chunks(64 << 10).map(|piece| Ok(Bytes::copy_from_slice(piece))).collect();
    futures::stream::iter(pieces)
}

async fn put(store: &SnapshotStore, id: &str, parts: &[(&str, &[u8])]) -> Manifest {
    let mut writer = store.writer(id).unwrap();
    for (name, data) in parts {
        writer.add_part(name, pieces(data), None).await.unwrap();
    }
    writer.commit(serde_json::json!({"id": id})).await.unwrap()
}

async fn read(store: &SnapshotStore, manifest: &Manifest, part: &str) -> Result<Vec<u8>, StoreError> {
    let pieces: Vec<Bytes> = store.read_part(manifest, part).try_collect().await?;
    Ok(pieces.concat())
}

fn chunk_path(hash: &ChunkHash) -> Path {
    let hex = hash.to_string();
    Path::from(format!("chunks/{}/{hex}.zst", &hex[..2]))
}

/// A part of 9 MiB: noise with a compressible stretch in the middle.
fn multi_chunk_data() -> Vec<u8> {
    let mut data = noise(4 << 20, 1);
    data.extend(b"compressible ".repeat(200_000));
    data.extend(noise(3 << 20, 2));
    data
}

async fn parts_round_trip(harness: &Harness) {
    let store = harness.store();
    let big = multi_chunk_data();
    let mut writer = store.writer("round-trip").unwrap();
    assert_eq!(writer.add_part("empty", pieces(&[]), None).await.unwrap().chunks, 0);
    assert_eq!(writer.add_part("one", pieces(b"x"), None).await.unwrap().chunks, 1);
    let done = AtomicU64::new(0);
    let progress = |bytes: u64| {
        assert!(bytes >= done.swap(bytes, Ordering::SeqCst), "progress went backwards");
    };
    let summary = writer.add_part("big.tar", pieces(&big), Some(&progress)).await.unwrap();
    assert_eq!(done.load(Ordering::SeqCst), big.len() as u64);
    assert!(summary.chunks >= 4, "9 MiB in {} chunks", summary.chunks);
    assert_eq!(summary.new_chunks, summary.chunks);
    let manifest = writer.commit(serde_json::json!({"tenant": "acme", "size": 9})).await.unwrap();

    let again = store.manifest("round-trip").await.unwrap();
    assert_eq!(again, manifest);
    assert_eq!(manifest.metadata["tenant"], "acme");
    assert_eq!(manifest.logical_bytes, big.len() as u64 + 1);
    let distinct: u64 = {
        let mut seen = HashSet::new();
        manifest.parts.iter().flat_map(|p| &p.chunks).filter(|c| seen.insert(c.hash)).map(|c| c.stored_len).sum()
    };
    assert_eq!(manifest.stored_bytes, distinct);
    assert!(manifest.stored_bytes < manifest.logical_bytes, "the compressible stretch was not compressed");
    assert_eq!(read(&store, &manifest, "empty").await.unwrap(), b"");
    assert_eq!(read(&store, &manifest, "one").await.unwrap(), b"x");
    assert!(read(&store, &manifest, "big.tar").await.unwrap() == big, "big.tar came back different");
    assert_eq!(store.list().await.unwrap(), vec!["round-trip".to_owned()]);
    let outliving = {
        let store = harness.store();
        let manifest = store.manifest("round-trip").await.unwrap();
        store.read_part(&manifest, "one")
    };
    let pieces: Vec<Bytes> = outliving.try_collect().await.unwrap();
    assert_eq!(pieces.concat(), b"x", "a stream that outlived its store and manifest");
    let missing_part = read(&store, &manifest, "nope").await.unwrap_err();
    assert!(matches!(missing_part, StoreError::PartNotFound { .. }), "{missing_part}");
}

async fn bounded_read_ahead(harness: &Harness) {
    const PART: u64 = 32 << 20;
    const PIECE: u64 = 64 << 10;
    // The chunker's window and four chunks being stored, each at most 4 MiB, and the piece just read.
    const BOUND: u64 = 5 * (4 << 20) + PIECE;
    let store = harness.store();
    let stored = Arc::new(AtomicU64::new(0));
    let most_ahead = Arc::new(AtomicU64::new(0));
    let input = futures::stream::unfold(0u64, {
        let (stored, most_ahead) = (stored.clone(), most_ahead.clone());
        move |produced| {
            let (stored, most_ahead) = (stored.clone(), most_ahead.clone());
            async move {
                if produced == PART {
                    return None;
                }
                most_ahead.fetch_max(produced + PIECE - stored.load(Ordering::SeqCst), Ordering::SeqCst);
                let piece = Bytes::from(noise(PIECE as usize, produced));
                Some((Ok::<_, io::Error>(piece), produced + PIECE))
            }
        }
    });
    let progress = |bytes: u64| stored.store(bytes, Ordering::SeqCst);
    let mut writer = store.writer("streamed").unwrap();
    let summary = writer.add_part("rootfs.tar", input, Some(&progress)).await.unwrap();
    assert_eq!(summary.logical_bytes, PART);
    let ahead = most_ahead.load(Ordering::SeqCst);
    println!("read ahead of what was stored: at most {} KiB", ahead >> 10);
    assert!(ahead <= BOUND, "the writer read {ahead} bytes ahead of what it had stored (bound {BOUND})");
}

/// Stores a two-part snapshot and returns it with the hash of a chunk of the second part's middle.
async fn snapshot_to_damage(store: &SnapshotStore, id: &str) -> (Manifest, ChunkHash) {
    let manifest = put(store, id, &[("rootfs.tar", &multi_chunk_data()), ("pages.img", &noise(6 << 20, 9))]).await;
    let chunks = &manifest.part("pages.img").unwrap().chunks;
    (manifest.clone(), chunks[chunks.len() / 2].hash)
}

async fn corrupted_chunk_is_named(harness: &Harness) {
    let store = harness.store();
    let (manifest, victim) = snapshot_to_damage(&store, "damaged").await;
    let other_content = zstd::bulk::compress(&noise(1 << 20, 77), 3).unwrap();
    for stored in [other_content, b"not zstd at all".to_vec()] {
        harness.raw.put(&chunk_path(&victim), PutPayload::from(stored)).await.unwrap();
        let error = read(&store, &manifest, "pages.img").await.unwrap_err();
        assert!(matches!(&error, StoreError::ChunkCorrupt { chunk, .. } if *chunk == victim), "{error}");
        let message = error.to_string();
        for expected in ["snapshot damaged is damaged", "\"pages.img\"", &victim.to_string()] {
            assert!(message.contains(expected), "{message:?} does not name {expected}");
        }
        assert_eq!(error.damaged_snapshot(), Some("damaged"));
    }
    assert!(read(&store, &manifest, "rootfs.tar").await.is_ok(), "the undamaged part still reads");
}

async fn missing_chunk_is_named(harness: &Harness) {
    let store = harness.store();
    let (manifest, victim) = snapshot_to_damage(&store, "holey").await;
    harness.raw.delete(&chunk_path(&victim)).await.unwrap();
    let error = read(&store, &manifest, "pages.img").await.unwrap_err();
    assert!(matches!(&error, StoreError::ChunkMissing { chunk, .. } if *chunk == victim), "{error}");
    let message = error.to_string();
    for expected in ["snapshot holey is damaged", "\"pages.img\"", &victim.to_string(), "missing"] {
        assert!(message.contains(expected), "{message:?} does not name {expected}");
    }
}

/// A put of `data` whose input fails at the end (like a tar of a sandbox that died mid-read), once at least one
/// chunk is stored; the writer is dropped afterwards. Returns the error of `add_part`.
async fn put_failing_at_the_end(store: &SnapshotStore, id: &str, data: &[u8]) -> StoreError {
    let stored = Arc::new(AtomicU64::new(0));
    let waiting = stored.clone();
    let failure = futures::stream::once(async move {
        while waiting.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(io::Error::other("the sandbox went away"))
    });
    let progress = |bytes: u64| stored.store(bytes, Ordering::SeqCst);
    let mut writer = store.writer(id).unwrap();
    let error = writer.add_part("rootfs.tar", pieces(data).chain(failure), Some(&progress)).await.unwrap_err();
    let refused = writer.commit(serde_json::Value::Null).await.unwrap_err();
    assert!(matches!(refused, StoreError::WriterFailed { .. }), "{refused}");
    error
}

async fn failed_put(harness: &Harness) {
    let store = harness.store();
    let error = put_failing_at_the_end(&store, "half", &noise(10 << 20, 3)).await;
    assert!(matches!(error, StoreError::Input { .. }), "{error}");
    assert!(error.to_string().contains("the sandbox went away"), "{error}");

    assert!(matches!(store.manifest("half").await, Err(StoreError::NotFound { .. })));
    assert!(store.list().await.unwrap().is_empty());
    let orphans = harness.stored_chunks().await.len();
    assert!(orphans >= 1, "no chunk was stored before the failure");
    let report = store.gc().await.unwrap();
    assert_eq!((report.chunks_deleted, report.manifests), (orphans, 0), "{report:?}");
    assert!(harness.stored_chunks().await.is_empty());
}

async fn delete_keeps_shared(harness: &Harness) {
    let store = harness.store();
    let shared = noise(8 << 20, 4);
    let mut changed = shared.clone();
    changed.extend(noise(3 << 20, 5));
    let first = put(&store, "first", &[("rootfs.tar", &shared), ("own.img", &noise(3 << 20, 6))]).await;
    let second = put(&store, "second", &[("rootfs.tar", &changed)]).await;
    let only_first: HashSet<_> = first.chunk_hashes().difference(&second.chunk_hashes()).copied().collect();
    let in_both = first.chunk_hashes().intersection(&second.chunk_hashes()).count();
    assert!(in_both >= 3, "only {in_both} shared chunks");

    let report = store.delete("first").await.unwrap();
    assert_eq!(report.chunks_deleted, only_first.len(), "{report:?}");
    assert_eq!(report.manifests, 1);
    let left = harness.stored_chunks().await;
    let expected: HashSet<String> = second.chunk_hashes().iter().map(|hash| chunk_path(hash).to_string()).collect();
    assert_eq!(left, expected);
    assert!(read(&store, &second, "rootfs.tar").await.unwrap() == changed);
    assert!(matches!(store.delete("first").await, Err(StoreError::NotFound { .. })));
}

/// A tar of `files` (name, content), as a sandbox's writable filesystem is snapshotted.
fn tar_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        tar.append_data(&mut header, name, content.as_slice()).unwrap();
    }
    tar.into_inner().unwrap()
}

async fn tar_dedup(harness: &Harness) {
    let store = harness.store();
    let mut files: Vec<(String, Vec<u8>)> =
        (0..60).map(|i| (format!("workspace/file-{i:02}.bin"), noise(100_000 + i * 5_000, 100 + i as u64))).collect();
    let before = tar_of(&files);
    files[30].1[1000..1100].copy_from_slice(&[0xAA; 100]);
    files.insert(45, ("workspace/new.txt".to_owned(), b"a new small file\n".to_vec()));
    let after = tar_of(&files);

    let mut writer = store.writer("tar-before").unwrap();
    let first = writer.add_part("rootfs.tar", pieces(&before), None).await.unwrap();
    writer.commit(serde_json::Value::Null).await.unwrap();
    let mut writer = store.writer("tar-after").unwrap();
    let second = writer.add_part("rootfs.tar", pieces(&after), None).await.unwrap();
    let manifest = writer.commit(serde_json::Value::Null).await.unwrap();

    let reused = second.chunks - second.new_chunks;
    println!(
        "tar dedup: {} of {} chunks reused; {} of {} bytes uploaded again",
        reused, second.chunks, second.uploaded_bytes, first.uploaded_bytes
    );
    assert!(second.chunks >= 5);
    assert!(second.new_chunks <= 3, "{} of {} chunks were new", second.new_chunks, second.chunks);
    assert!(second.uploaded_bytes * 2 < first.uploaded_bytes, "most of the second tar was uploaded again");
    assert!(read(&store, &manifest, "rootfs.tar").await.unwrap() == after);
}

async fn grace_keeps_young(harness: &Harness) {
    let store = harness.store_with_grace(Duration::from_secs(3600));
    put_failing_at_the_end(&store, "young", &noise(6 << 20, 7)).await;
    let orphans = harness.stored_chunks().await.len();
    assert!(orphans >= 1);
    let report = store.gc().await.unwrap();
    assert_eq!((report.chunks_too_young, report.chunks_deleted), (orphans, 0), "{report:?}");
    assert_eq!(harness.store().gc().await.unwrap().chunks_deleted, orphans);
}

async fn gc_spares_chunks_in_use(harness: &Harness) {
    let store = harness.store();
    let data = noise(6 << 20, 8);
    // Orphans of any age: a snapshot whose manifest went without a GC after it.
    put(&store, "orphaned", &[("rootfs.tar", &data)]).await;
    harness.raw.delete(&Path::from("manifests/orphaned.json")).await.unwrap();
    let orphans = harness.stored_chunks().await.len();

    let mut writer = store.writer("reuses").unwrap();
    let summary = writer.add_part("rootfs.tar", pieces(&data), None).await.unwrap();
    assert_eq!(summary.new_chunks, 0, "the orphans were not reused: {summary:?}");
    let report =
        tokio::time::timeout(Duration::from_secs(30), store.gc()).await.expect("gc waited for the put").unwrap();
    assert_eq!((report.chunks_in_use, report.chunks_deleted), (orphans, 0), "{report:?}");
    let manifest = writer.commit(serde_json::Value::Null).await.unwrap();
    assert_eq!(store.gc().await.unwrap().chunks_referenced, orphans);
    assert!(read(&store, &manifest, "rootfs.tar").await.unwrap() == data);

    // A writer that gives up releases what it pinned.
    let mut abandoned = store.writer("abandoned").unwrap();
    abandoned.add_part("extra.img", pieces(&noise(2 << 20, 12)), None).await.unwrap();
    drop(abandoned);
    assert!(store.gc().await.unwrap().chunks_deleted >= 1);
}

/// Another process (another server or host on the same store) knows nothing of this one's pins: only age protects a
/// chunk from its collection. A put that reuses a stored chunk older than half the grace period writes it again, so
/// an old orphan it dedups against (its snapshot deleted, not yet collected) is young when the other process collects.
async fn old_orphan_reused_is_refreshed(harness: &Harness) {
    let store = harness.store_with_grace(Duration::from_secs(4));
    let data = noise(3 << 20, 13);
    put(&store, "orphaned", &[("layer.tar", &data)]).await;
    harness.raw.delete(&Path::from("manifests/orphaned.json")).await.unwrap();
    let orphans = harness.stored_chunks().await.len();
    // Older than half the writer's grace period, and than the other process's whole one.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let mut writer = store.writer("reuses-old").unwrap();
    let summary = writer.add_part("layer.tar", pieces(&data), None).await.unwrap();
    assert_eq!(summary.chunks, orphans, "{summary:?}");
    let elsewhere = harness.store_with_grace(Duration::from_secs(2)).gc().await.unwrap();
    assert_eq!(elsewhere.chunks_deleted, 0, "the other process collected chunks the put reuses: {elsewhere:?}");
    let manifest = writer.commit(serde_json::Value::Null).await.unwrap();
    assert!(read(&store, &manifest, "layer.tar").await.unwrap() == data);
}

async fn refusals(harness: &Harness) {
    let store = harness.store();
    for id in ["", "Upper", "a/b", "../x"] {
        assert!(matches!(store.writer(id), Err(StoreError::InvalidSnapshotId { .. })), "{id:?}");
        assert!(matches!(store.manifest(id).await, Err(StoreError::InvalidSnapshotId { .. })), "{id:?}");
    }
    assert!(matches!(store.manifest("never-stored").await, Err(StoreError::NotFound { .. })));
    put(&store, "taken", &[("a", b"1")]).await;
    let mut writer = store.writer("taken").unwrap();
    writer.add_part("a", pieces(b"2"), None).await.unwrap();
    let error = writer.add_part("a", pieces(b"3"), None).await.unwrap_err();
    assert!(matches!(error, StoreError::DuplicatePart { .. }), "{error}");
    let error = writer.add_part("a/b", pieces(b"3"), None).await.unwrap_err();
    assert!(matches!(error, StoreError::InvalidPartName { .. }), "{error}");
    let error = writer.commit(serde_json::Value::Null).await.unwrap_err();
    assert!(matches!(error, StoreError::AlreadyExists { .. }), "{error}");
    assert_eq!(read(&store, &store.manifest("taken").await.unwrap(), "a").await.unwrap(), b"1");
}

async fn damaged_manifest_stops_gc(harness: &Harness) {
    let store = harness.store();
    put(&store, "fine", &[("a", &noise(1 << 20, 10))]).await;
    put_failing_at_the_end(&store, "orphans", &noise(5 << 20, 11)).await;
    harness.raw.put(&Path::from("manifests/broken.json"), PutPayload::from_static(b"{\"format\": 1, ")).await.unwrap();
    let chunks = harness.stored_chunks().await;

    let error = store.manifest("broken").await.unwrap_err();
    assert_eq!(error.damaged_snapshot(), Some("broken"), "{error}");
    let error = store.gc().await.unwrap_err();
    assert_eq!(error.damaged_snapshot(), Some("broken"), "{error}");
    assert_eq!(harness.stored_chunks().await, chunks, "gc deleted chunks despite an unreadable manifest");
}
