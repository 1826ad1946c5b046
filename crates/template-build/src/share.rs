//! Templates in an object store, so several hosts share them: the store is the snapshot store's configuration with
//! `templates` appended to its URL (a local directory by default, `s3://bucket/prefix/templates` when configured), a
//! store of its own so the server's snapshot reconcile and GC never see template manifests. Each pushed version of
//! a template is one manifest, `t-<SHA-256 of the name, 20 hex>-<the template's digest, 40 hex>`, whose parts are
//! its layers as tar (`layer-0`, … lowest first, packed from the cache) and whose metadata is the template record;
//! the pull takes the newest version of a name (its record's `created`), unpacks each layer the cache lacks under the
//! digest its record names, and writes the record last (`prune` deletes old versions). The store is the operator's
//! and trusted like the cache: a layer is not re-hashed on pull (chunks are checked against their BLAKE3 names as
//! they are read).

mod prune;

use futures::TryStreamExt;
use sandkasten_snapshot_store::{SnapshotStore, StoreConfig, StoreError};
use sandkasten_template::steps::sha256_hex;
use sandkasten_template::{CacheError, TemplateCache, TemplateRecord};

pub use prune::{PruneFailure, PruneReport, PrunedVersion};

/// Why a push or pull failed.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The object store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The local cache failed (or has no template of that name to push).
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// No version of the template is in the store.
    #[error("no template named {0:?} is in the template store: push it from the host that built it")]
    NotInStore(String),
    /// A stored template's manifest does not hold what a pushed template does.
    #[error("the stored template {id}: {reason}")]
    Damaged {
        /// The manifest's id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// A temporary file for a layer on its way failed.
    #[error("{doing}: {source}")]
    Io {
        /// What was being done.
        doing: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Runs the cache's disk `work` on a blocking thread.
async fn blocking<T: Send + 'static>(
    doing: &str,
    work: impl FnOnce() -> Result<T, CacheError> + Send + 'static,
) -> Result<T, ShareError> {
    let joined = tokio::task::spawn_blocking(work).await;
    joined
        .map_err(|error| ShareError::Io { doing: doing.to_owned(), source: std::io::Error::other(error) })?
        .map_err(Into::into)
}

fn io(doing: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShareError {
    let doing = doing.into();
    move |source| ShareError::Io { doing, source }
}

/// The templates of an object store.
#[derive(Clone, Debug)]
pub struct TemplateStore {
    store: SnapshotStore,
}

impl TemplateStore {
    /// The template store beside the snapshot store `snapshots` configures (`<url>/templates`).
    pub fn beside(snapshots: &StoreConfig) -> Result<TemplateStore, StoreError> {
        let mut config = snapshots.clone();
        config.url = format!("{}/templates", snapshots.url.trim_end_matches('/'));
        Ok(TemplateStore { store: SnapshotStore::open(&config)? })
    }

    /// Copies the cached template `name` into the store (a version already there is left as it is); returns its
    /// record.
    pub async fn push(&self, cache: &TemplateCache, name: &str) -> Result<TemplateRecord, ShareError> {
        let record = cache.template(name)?;
        let id = version_id(&record);
        match self.store.manifest(&id).await {
            Ok(_) => return Ok(record),
            Err(StoreError::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        let mut writer = self.store.writer(&id)?;
        for (index, digest) in record.layers.iter().enumerate() {
            let scratch = scratch_file(cache, "push")?;
            let (packing_cache, packing_digest, file) =
                (cache.clone(), digest.clone(), scratch.reopen().map_err(io("reopening a layer's archive"))?);
            blocking("packing a layer", move || {
                packing_cache.pack_layer(&packing_digest, std::io::BufWriter::new(file))
            })
            .await?;
            let file = tokio::fs::File::open(scratch.path()).await.map_err(io("reading a layer's archive"))?;
            writer.add_part(&format!("layer-{index}"), tokio_util::io::ReaderStream::new(file), None).await?;
        }
        let metadata = serde_json::to_value(&record)
            .map_err(|error| ShareError::Damaged { id: id.clone(), reason: error.to_string() })?;
        match writer.commit(metadata).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(record),
            Err(error) => Err(error.into()),
        }
    }

    /// The newest version of `name` in the store, copied into the cache (its layers, then its record); returns the
    /// record. The caller holds the cache's lock.
    pub async fn pull(&self, cache: &TemplateCache, name: &str) -> Result<TemplateRecord, ShareError> {
        let mut versions = self.stored_versions(Some(name)).await?;
        newest_first(&mut versions);
        let newest = versions.into_iter().next();
        let Some((record, manifest)) = newest else { return Err(ShareError::NotInStore(name.to_owned())) };
        for (index, digest) in record.layers.iter().enumerate() {
            if cache.layer_dir(digest).is_dir() {
                continue;
            }
            let part = format!("layer-{index}");
            if manifest.part(&part).is_none() {
                return Err(ShareError::Damaged { id: manifest.snapshot_id, reason: format!("no part {part}") });
            }
            let scratch = scratch_file(cache, "pull")?;
            let mut file = tokio::fs::File::from_std(scratch.reopen().map_err(io("reopening a layer's archive"))?);
            let mut chunks = std::pin::pin!(self.store.read_part(&manifest, &part));
            while let Some(chunk) = chunks.try_next().await? {
                tokio::io::AsyncWriteExt::write_all(&mut file, &chunk)
                    .await
                    .map_err(io("writing a layer's archive"))?;
            }
            tokio::io::AsyncWriteExt::flush(&mut file).await.map_err(io("writing a layer's archive"))?;
            let (importing_cache, importing_digest) = (cache.clone(), digest.clone());
            let archive = scratch.reopen().map_err(io("reading a layer's archive"))?;
            blocking("unpacking a layer", move || {
                importing_cache.import_layer(&importing_digest, std::io::BufReader::new(archive))
            })
            .await?;
        }
        cache.put_template(&record)?;
        Ok(record)
    }
}

impl TemplateStore {
    /// The versions in the store (of the template `name`, when given) whose records check, with their manifests,
    /// by version id; a version that fails is skipped with a warning.
    async fn stored_versions(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<(TemplateRecord, sandkasten_snapshot_store::Manifest)>, ShareError> {
        let prefix = name.map_or_else(|| "t-".to_owned(), |name| format!("{}-", name_prefix(name)));
        let mut versions = Vec::new();
        for id in self.store.list().await?.into_iter().filter(|id| id.starts_with(&prefix)) {
            let manifest = match self.store.manifest(&id).await {
                Ok(manifest) => manifest,
                // Deleted since the listing (a prune elsewhere).
                Err(StoreError::NotFound { .. }) => continue,
                Err(error @ StoreError::ManifestDamaged { .. }) => {
                    tracing::warn!(version = %id, %error, "skipping a damaged template version in the store");
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            let record = match serde_json::from_value::<TemplateRecord>(manifest.metadata.clone())
                .map_err(|error| format!("its record does not parse: {error}"))
                .and_then(|record| check_record(&record, name.unwrap_or(&record.name), &id).map(|()| record))
            {
                Ok(record) => record,
                Err(reason) => {
                    tracing::warn!(version = %id, %reason, "skipping a damaged template version in the store");
                    continue;
                }
            };
            versions.push((record, manifest));
        }
        Ok(versions)
    }
}

/// Sorts `versions` newest first: by their records' `created` (seconds, the building host's clock), then by version
/// id; a pull takes the first, a prune keeps the first ones.
fn newest_first<T>(versions: &mut [(TemplateRecord, T)]) {
    versions.sort_by_cached_key(|(record, _)| std::cmp::Reverse((record.created, version_id(record))));
}

/// The manifest id of a template's version.
fn version_id(record: &TemplateRecord) -> String {
    let digest = record.digest.trim_start_matches("sha256:");
    format!("{}-{}", name_prefix(&record.name), digest.get(..40).unwrap_or(digest))
}

/// Checks a record read from the store (version `id`, wanted as `name`) before anything of it is used: every layer
/// digest is hex (a digest becomes a path under the cache: `/root` or `../x` would mount a host directory), the
/// template digest is its layers', and env, workdir, user and preload are what a build could have made.
fn check_record(record: &TemplateRecord, name: &str, id: &str) -> Result<(), String> {
    use sandkasten_template::spec::{check_name, is_clean_absolute, is_env_name, is_module_name};
    if record.name != name || check_name(&record.name).is_err() || version_id(record) != id {
        return Err(format!("its record names another template ({:?})", record.name));
    }
    if let Some(bad) = record.layers.iter().find(|digest| !sandkasten_template::cache::is_layer_digest(digest)) {
        return Err(format!("layer {bad:?} is not a layer digest (64 hex digits)"));
    }
    if record.digest != sandkasten_template::cache::template_digest(&record.layers) {
        return Err("its digest is not its layers'".to_owned());
    }
    if record.root != sandkasten_template::Base::Host {
        return Err(format!("its root {} is not one this sandkasten runs", record.root));
    }
    if let Some((key, _)) = record.env.iter().find(|(key, value)| !is_env_name(key) || value.contains('\0')) {
        return Err(format!("env {key:?} is not a variable a build makes"));
    }
    if record.workdir.as_deref().is_some_and(|workdir| !is_clean_absolute(workdir)) {
        return Err("its workdir is not a clean absolute path".to_owned());
    }
    sandkasten_types::check_user_name(&record.user).map_err(|reason| format!("its user: {reason}"))?;
    if let Some(bad) = record.preload.iter().find(|name| !is_module_name(name)) {
        return Err(format!("preload {bad:?} is not a Python module name"));
    }
    Ok(())
}

fn name_prefix(name: &str) -> String {
    format!("t-{}", &sha256_hex(name.as_bytes())[..20])
}

/// A temporary file in the cache's build directory (same filesystem as the layers; removed when dropped).
fn scratch_file(cache: &TemplateCache, what: &str) -> Result<tempfile::NamedTempFile, ShareError> {
    let dir = cache.build_dir();
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    tempfile::Builder::new().prefix(&format!("{what}-")).tempfile_in(&dir).map_err(io("creating a layer's archive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, digest: &str, created: u64) -> TemplateRecord {
        TemplateRecord {
            name: name.into(),
            digest: format!("sha256:{digest}"),
            base: "host".into(),
            root: sandkasten_template::Base::Host,
            layers: Vec::new(),
            env: Default::default(),
            workdir: None,
            user: "sandbox".into(),
            preload: Vec::new(),
            size_bytes: 0,
            created,
        }
    }

    #[test]
    fn a_stored_record_naming_a_path_or_a_bad_digest_is_refused() {
        let good = |layers: Vec<String>| {
            let mut record = record("t", "", 1);
            record.digest = sandkasten_template::cache::template_digest(&layers);
            record.layers = layers;
            record
        };
        let fine = good(vec!["a".repeat(64)]);
        assert_eq!(check_record(&fine, "t", &version_id(&fine)), Ok(()));
        for layers in [vec!["/root".to_owned()], vec!["../../..".to_owned()], vec!["A".repeat(64)]] {
            let bad = good(layers);
            let refused = check_record(&bad, "t", &version_id(&bad));
            assert!(refused.as_ref().is_err_and(|e| e.contains("not a layer digest")), "{refused:?}");
        }
        let mut lying = good(vec!["a".repeat(64)]);
        lying.layers = vec!["b".repeat(64)];
        assert!(check_record(&lying, "t", &version_id(&lying)).is_err());
        let mut env = good(vec![]);
        env.env.insert("LD_PRELOAD\0".into(), "x".into());
        assert!(check_record(&env, "t", &version_id(&env)).is_err());
        let mut workdir = good(vec![]);
        workdir.workdir = Some("/opt/../etc".into());
        assert!(check_record(&workdir, "t", &version_id(&workdir)).is_err());
        assert!(check_record(&fine, "other", &version_id(&fine)).is_err());
        let multibyte = record("t", &"é".repeat(30), 1);
        let _ = version_id(&multibyte);
    }

    #[test]
    fn versions_sort_newest_first_and_ties_by_version_id() {
        let mut versions: Vec<(TemplateRecord, u8)> = vec![
            (record("t", &"1".repeat(64), 1), 1),
            (record("t", &"2".repeat(64), 3), 2),
            (record("t", &"3".repeat(64), 3), 3),
            (record("t", &"4".repeat(64), 2), 4),
        ];
        newest_first(&mut versions);
        let order: Vec<u8> = versions.iter().map(|(_, tag)| *tag).collect();
        assert_eq!(order, [3, 2, 4, 1]);
    }

    #[test]
    fn versions_of_a_name_share_a_prefix_and_fit_a_manifest_id() {
        let a = version_id(&record("python-data", &"a".repeat(64), 1));
        let b = version_id(&record("python-data", &"b".repeat(64), 2));
        assert_eq!(a[..23], b[..23]);
        assert_ne!(a, b);
        assert!(a.len() <= 64 && a.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'));
        assert!(!version_id(&record("python_data", &"a".repeat(64), 1)).starts_with(&a[..23]));
    }
}
