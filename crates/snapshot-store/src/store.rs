//! [`SnapshotStore`]: the handle the server keeps (cheap to clone) and the operations on stored snapshots.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::config::{StoreConfig, local_directory, open_object_store};
use crate::error::StoreError;
use crate::gc::{GcReport, collect};
use crate::manifest::{MANIFESTS_PREFIX, Manifest, manifest_path, snapshot_id_of, validate_snapshot_id};
use crate::pins::ChunkPins;
use crate::reader::read_part;
use crate::writer::SnapshotWriter;

/// A store of snapshots. Clones share the object store connection and the pins of puts in progress.
#[derive(Clone, Debug)]
pub struct SnapshotStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    objects: Arc<dyn ObjectStore>,
    gc_grace: Duration,
    /// The directory of a local store (where crash-left staging files are looked for), `None` for S3.
    local_directory: Option<PathBuf>,
    /// Which chunks this process's puts are using (see the `pins` module).
    pins: Arc<ChunkPins>,
}

impl SnapshotStore {
    /// Opens the store `config.url` names (creating a local directory, mode 0700, if missing). Nothing is read from
    /// the store yet: an unreachable bucket shows at the first operation.
    pub fn open(config: &StoreConfig) -> Result<SnapshotStore, StoreError> {
        let objects = open_object_store(config)?;
        let inner = Inner {
            objects,
            gc_grace: config.gc_grace,
            local_directory: local_directory(config),
            pins: Arc::default(),
        };
        Ok(SnapshotStore { inner: Arc::new(inner) })
    }

    /// A writer for a new snapshot `snapshot_id` (`[a-z0-9-]{1,64}`). Nothing is visible until its commit.
    pub fn writer(&self, snapshot_id: &str) -> Result<SnapshotWriter, StoreError> {
        validate_snapshot_id(snapshot_id)?;
        Ok(SnapshotWriter::new(self.clone(), snapshot_id.to_owned()))
    }

    /// The manifest of `snapshot_id` (one small object read): [`StoreError::NotFound`] when there is none.
    pub async fn manifest(&self, snapshot_id: &str) -> Result<Manifest, StoreError> {
        validate_snapshot_id(snapshot_id)?;
        let path = manifest_path(snapshot_id);
        let bytes = match self.inner.objects.get(&path).await {
            Ok(found) => found.bytes().await,
            Err(error) => Err(error),
        };
        match bytes {
            Ok(bytes) => Manifest::parse(snapshot_id, &bytes),
            Err(object_store::Error::NotFound { .. }) => {
                Err(StoreError::NotFound { snapshot_id: snapshot_id.to_owned() })
            }
            Err(source) => Err(StoreError::object_store("get", &path, source)),
        }
    }

    /// The bytes of `part` of the snapshot `manifest` describes, chunk by chunk, each verified against its hash: a
    /// missing or damaged chunk ends the stream with [`StoreError::ChunkMissing`] or [`StoreError::ChunkCorrupt`].
    /// The stream borrows nothing: it can outlive `self` and `manifest` (e.g. as an HTTP response body).
    pub fn read_part(
        &self,
        manifest: &Manifest,
        part: &str,
    ) -> impl Stream<Item = Result<Bytes, StoreError>> + Send + use<> {
        read_part(self.objects(), manifest, part)
    }

    /// Deletes the snapshot's manifest, then collects garbage ([`SnapshotStore::gc`]): the chunks no other
    /// snapshot references go (once past the grace period).
    pub async fn delete(&self, snapshot_id: &str) -> Result<GcReport, StoreError> {
        self.delete_manifest(snapshot_id).await?;
        self.gc().await
    }

    /// Deletes the snapshot's manifest only: its chunks stay until a [`SnapshotStore::gc`] (one collection after
    /// many deletes). [`StoreError::NotFound`] when there is none.
    pub async fn delete_manifest(&self, snapshot_id: &str) -> Result<(), StoreError> {
        validate_snapshot_id(snapshot_id)?;
        let path = manifest_path(snapshot_id);
        // S3 answers a delete of a missing object with success: ask first, so an unknown id is `NotFound` everywhere.
        match self.inner.objects.head(&path).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => {
                return Err(StoreError::NotFound { snapshot_id: snapshot_id.to_owned() });
            }
            Err(source) => return Err(StoreError::object_store("head", &path, source)),
        }
        self.inner.objects.delete(&path).await.map_err(|source| StoreError::object_store("delete", &path, source))
    }

    /// Deletes every chunk no manifest references that is older than the grace period and that no put of this
    /// process is using (and, in a local store, the staging files crashed chunk writes left, on the same terms). One collection runs at a time; puts go on meanwhile.
    pub async fn gc(&self) -> Result<GcReport, StoreError> {
        collect(self, self.inner.gc_grace).await
    }

    /// The ids of every stored snapshot, sorted (to reconcile a database with the store).
    pub async fn list(&self) -> Result<Vec<String>, StoreError> {
        let prefix = Path::from(MANIFESTS_PREFIX);
        let mut ids: Vec<String> = self
            .inner
            .objects
            .list(Some(&prefix))
            .map_ok(|object| snapshot_id_of(&object.location))
            .try_filter_map(|id| async move { Ok(id) })
            .try_collect()
            .await
            .map_err(|source| StoreError::object_store("list", &prefix, source))?;
        ids.sort();
        Ok(ids)
    }

    pub(crate) fn objects(&self) -> Arc<dyn ObjectStore> {
        self.inner.objects.clone()
    }

    /// How long an unreferenced chunk is kept by a collection.
    pub(crate) fn gc_grace(&self) -> Duration {
        self.inner.gc_grace
    }

    pub(crate) fn local_directory(&self) -> Option<&std::path::Path> {
        self.inner.local_directory.as_deref()
    }

    pub(crate) fn pins(&self) -> Arc<ChunkPins> {
        self.inner.pins.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::future::Future;

    use super::*;

    fn shareable<T: Clone + Send + Sync + 'static>() {}

    /// Compiles only if the future can run on any tokio worker (axum handlers, spawned tasks).
    fn sendable<F: Future + Send>(_: F) {}

    #[test]
    fn the_store_and_its_operations_can_cross_tasks() {
        shareable::<SnapshotStore>();
        let temp = tempfile::tempdir().unwrap();
        let config = StoreConfig { url: format!("file://{}", temp.path().display()), ..StoreConfig::default() };
        let store = SnapshotStore::open(&config).unwrap();
        let mut writer = store.writer("sb-1").unwrap();
        let progress = |_: u64| {};
        sendable(writer.add_part("a", futures::stream::empty::<Result<Bytes, std::io::Error>>(), Some(&progress)));
        sendable(writer.commit(serde_json::Value::Null));
        sendable(store.gc());
        sendable(store.list());
    }
}
