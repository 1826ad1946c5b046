//! Staging files a crash left in a local store. object_store's `LocalFileSystem` writes each object to
//! `<path>#<N>` (N a decimal number) and renames it into place; a process killed in between leaves that file behind,
//! and object_store's own listing hides such names, so GC would never see it. GC therefore walks the chunk folders of
//! a local store itself and deletes `chunks/<xx>/<hash>.zst#<N>` files older than the grace period whose chunk no put
//! of this process is using (a live upload's staging file belongs to a pinned chunk, and is young anyway).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::chunk::{CHUNKS_PREFIX, ChunkHash};
use crate::error::StoreError;
use crate::pins::CollectionGuard;

/// A staging file found under `chunks/`: the chunk it was to become and when it was last written.
#[derive(Debug)]
struct StagingFile {
    path: PathBuf,
    hash: ChunkHash,
    modified: SystemTime,
}

/// Deletes the crash-left staging files under `root/chunks` (see the module comment); returns how many went.
pub(crate) async fn sweep(root: &Path, grace: Duration, collection: &CollectionGuard) -> Result<usize, StoreError> {
    let chunks = root.join(CHUNKS_PREFIX);
    let found = tokio::task::spawn_blocking(move || find_staging_files(&chunks)).await??;
    let now = SystemTime::now();
    let mut deleted = 0;
    for staging in found {
        // A modification time in the future (clock skew) counts as young.
        let old_enough = grace.is_zero() || now.duration_since(staging.modified).is_ok_and(|age| age >= grace);
        if !old_enough {
            continue;
        }
        let Some(mark) = collection.start_deleting(staging.hash) else { continue };
        let removed = tokio::fs::remove_file(&staging.path).await;
        drop(mark);
        match removed {
            Ok(()) => deleted += 1,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(StoreError::LocalFile { operation: "remove", path: staging.path, source }),
        }
    }
    Ok(deleted)
}

/// Every staging file in the chunk folders under `chunks` (none when the folder does not exist yet).
fn find_staging_files(chunks: &Path) -> Result<Vec<StagingFile>, StoreError> {
    let read_dir = |dir: &Path| match std::fs::read_dir(dir) {
        Ok(entries) => Ok(Some(entries)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::LocalFile { operation: "read_dir", path: dir.to_owned(), source }),
    };
    let mut found = Vec::new();
    let Some(folders) = read_dir(chunks)? else { return Ok(found) };
    for folder in folders {
        let folder = folder.map_err(failed("read_dir", chunks))?.path();
        let Some(files) = read_dir(&folder)? else { continue };
        for file in files {
            let file = file.map_err(failed("read_dir", &folder))?;
            let Some(hash) = file.file_name().to_str().and_then(|name| staged_chunk(&folder, name)) else { continue };
            let path = file.path();
            let metadata = match file.metadata() {
                Ok(metadata) => metadata,
                // Renamed into place (or removed) since the listing.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(StoreError::LocalFile { operation: "stat", path, source }),
            };
            if !metadata.is_file() {
                continue;
            }
            let modified = metadata.modified().map_err(failed("stat", &path))?;
            found.push(StagingFile { path, hash, modified });
        }
    }
    Ok(found)
}

/// Wraps an `io::Error` of `operation` on `path`.
fn failed(operation: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + use<> {
    let path = path.to_owned();
    move |source| StoreError::LocalFile { operation, path, source }
}

/// The chunk a file named `name` in `folder` stages (`<hash>.zst#<digits>`, in the hash's own folder), or `None`.
fn staged_chunk(folder: &Path, name: &str) -> Option<ChunkHash> {
    let (object, suffix) = name.split_once('#')?;
    if suffix.is_empty() || !suffix.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let folder = folder.file_name()?.to_str()?;
    ChunkHash::from_path(&object_store::path::Path::from(format!("{CHUNKS_PREFIX}/{folder}/{object}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::fs::File;

    use bytes::Bytes;

    use super::*;
    use crate::config::StoreConfig;
    use crate::store::SnapshotStore;

    fn local_store(dir: &Path, grace: Duration) -> SnapshotStore {
        let config =
            StoreConfig { url: format!("file://{}", dir.display()), gc_grace: grace, ..StoreConfig::default() };
        SnapshotStore::open(&config).unwrap()
    }

    /// Leaves a staging file for the chunk of `content`, as a crash during its write would, last written `age` ago.
    fn leave_staging_file(dir: &Path, content: &[u8], suffix: &str, age: Duration) -> PathBuf {
        let hash = ChunkHash::of(content);
        let path = dir.join(format!("{}#{suffix}", hash.path()));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"half a chunk").unwrap();
        File::options().write(true).open(&path).unwrap().set_modified(SystemTime::now() - age).unwrap();
        path
    }

    async fn store_snapshot(store: &SnapshotStore, id: &str, content: &'static [u8]) {
        let mut writer = store.writer(id).unwrap();
        let data = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(content))]);
        writer.add_part("data", data, None).await.unwrap();
        writer.commit(serde_json::Value::Null).await.unwrap();
    }

    fn files_under(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { found.extend(files_under(&path)) } else { found.push(path) }
        }
        found.sort();
        found
    }

    #[tokio::test]
    async fn gc_deletes_the_staging_files_a_crash_left_and_keeps_the_chunks_in_use() {
        let temp = tempfile::tempdir().unwrap();
        let store = local_store(temp.path(), Duration::from_secs(3600));
        store_snapshot(&store, "kept", b"a chunk a manifest references").await;
        let stored = files_under(&temp.path().join(CHUNKS_PREFIX));
        let two_hours = Duration::from_secs(7200);
        let orphans = [
            leave_staging_file(temp.path(), b"an upload cut off by kill -9", "1", two_hours),
            leave_staging_file(temp.path(), b"another one", "17", two_hours),
        ];
        let report = store.gc().await.unwrap();
        assert_eq!(report.staging_files_deleted, 2, "{report:?}");
        for orphan in &orphans {
            assert!(!orphan.exists(), "{} survived GC", orphan.display());
        }
        assert_eq!(files_under(&temp.path().join(CHUNKS_PREFIX)), stored, "GC touched a stored chunk");
    }

    #[tokio::test]
    async fn young_staging_files_and_those_of_a_put_in_progress_survive_gc() {
        let temp = tempfile::tempdir().unwrap();
        let young = leave_staging_file(temp.path(), b"being written elsewhere", "1", Duration::from_secs(60));
        let store = local_store(temp.path(), Duration::from_secs(3600));
        assert_eq!(store.gc().await.unwrap().staging_files_deleted, 0);
        assert!(young.exists());

        // Grace 0 deletes at once, except the staging file of a chunk a put of this process has pinned.
        let store = local_store(temp.path(), Duration::ZERO);
        let live = leave_staging_file(temp.path(), b"being written here", "3", Duration::ZERO);
        let mut pins = crate::pins::PinSet::new(store.pins());
        pins.pin(ChunkHash::of(b"being written here"));
        assert_eq!(store.gc().await.unwrap().staging_files_deleted, 1);
        assert!(live.exists(), "the live upload's staging file was deleted");
        assert!(!young.exists());
        drop(pins);
        assert_eq!(store.gc().await.unwrap().staging_files_deleted, 1);
        assert!(!live.exists());
    }

    #[tokio::test]
    async fn files_that_are_not_staged_chunks_are_left_alone() {
        let temp = tempfile::tempdir().unwrap();
        let store = local_store(temp.path(), Duration::ZERO);
        let hex = ChunkHash::of(b"x").to_string();
        let folder = temp.path().join(CHUNKS_PREFIX).join(&hex[..2]);
        std::fs::create_dir_all(&folder).unwrap();
        let other_folder = temp.path().join(CHUNKS_PREFIX).join("00");
        std::fs::create_dir_all(&other_folder).unwrap();
        let foreign = [
            folder.join(format!("{hex}.zst#")),
            folder.join(format!("{hex}.zst#1a")),
            folder.join(format!("{hex}#1")),
            folder.join("notes.txt#1"),
            other_folder.join(format!("{hex}.zst#1")),
        ];
        for path in &foreign {
            std::fs::write(path, b"not ours").unwrap();
        }
        assert_eq!(store.gc().await.unwrap().staging_files_deleted, 0);
        for path in &foreign {
            assert!(path.exists(), "{} was deleted", path.display());
        }
    }
}
