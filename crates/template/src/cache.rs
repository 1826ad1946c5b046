//! The local template cache (`/var/lib/sandkasten/templates` by default): unpacked layers by digest
//! (`layers/<digest>/`), the step cache (`keys/<key>` → the layer's digest) and the templates themselves
//! (`templates/<name>.json`). Everything appears by rename of a finished temporary, so a build killed at any point
//! leaves nothing a later build would take for finished; `collect_garbage` removes leftovers and unused layers.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::CacheError;
use crate::layer;
use crate::steps::{hex, sha256_hex};

/// The cache's default root.
pub const DEFAULT_ROOT: &str = "/var/lib/sandkasten/templates";
/// Marks a temporary (unfinished) entry's name.
const PARTIAL: &str = ".partial-";

/// A finished template: what a sandbox of it mounts and how it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRecord {
    /// Its name.
    pub name: String,
    /// SHA-256 of its layer list (`sha256:` + hex): changes whenever any layer does.
    pub digest: String,
    /// What it was built on (`host`, or the template it extends).
    pub base: String,
    /// What its lowest layer lies on: `host` (the host's read-only `/usr`) for every template built so far; a
    /// template extending another has that one's root.
    #[serde(default = "host_root")]
    pub root: crate::Base,
    /// Its layers' digests, lowest first.
    pub layers: Vec<String>,
    /// Its sandboxes' environment (the spec's `env` plus `PATH`/`NODE_PATH` for its venv and npm prefix).
    pub env: std::collections::BTreeMap<String, String>,
    /// Its sandboxes' working directory, if not the home.
    pub workdir: Option<String>,
    /// The sandbox user's name.
    pub user: String,
    /// Python modules a pool's zygote may preload.
    pub preload: Vec<String>,
    /// The unpacked layers' total size, bytes.
    pub size_bytes: u64,
    /// When it was made, seconds since the Unix epoch.
    pub created: u64,
}

fn host_root() -> crate::Base {
    crate::Base::Host
}

/// The digest of a layer list.
pub fn template_digest(layers: &[String]) -> String {
    format!("sha256:{}", sha256_hex(layers.join("\n").as_bytes()))
}

/// The local cache of layers and templates.
#[derive(Debug, Clone)]
pub struct TemplateCache {
    root: PathBuf,
}

fn create_dir(path: &Path) -> Result<(), CacheError> {
    fs::DirBuilder::new().recursive(true).mode(0o755).create(path).map_err(CacheError::io("creating", path))
}

/// Writes `contents` to `path` through a temporary and a rename.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), CacheError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = path.with_file_name(format!("{PARTIAL}{}-{name}", std::process::id()));
    let mut file = fs::File::create(&temporary).map_err(CacheError::io("creating", &temporary))?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(CacheError::io("writing", &temporary))?;
    fs::rename(&temporary, path).map_err(CacheError::io("renaming into place", path))
}

fn size_of(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(path).map(|entries| entries.flatten().map(|e| size_of(&e.path())).sum()).unwrap_or(0)
}

impl TemplateCache {
    /// The cache at `root`, its directories created (0755, the root too: sandboxes' unprivileged ids read the
    /// layers). It must not be under `/tmp`, where a sandbox's root is assembled (that would hide it).
    pub fn open(root: impl Into<PathBuf>) -> Result<TemplateCache, CacheError> {
        let cache = TemplateCache { root: std::path::absolute(root.into()).map_err(CacheError::io("resolving", "."))? };
        if cache.root.starts_with("/tmp") {
            return Err(CacheError::Unusable(format!(
                "{} is under /tmp, which sandboxes cover with their own root: choose a cache elsewhere, e.g. {DEFAULT_ROOT}",
                cache.root.display()
            )));
        }
        create_dir(&cache.root)?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&cache.root, fs::Permissions::from_mode(0o755))
            .map_err(CacheError::io("chmod", &cache.root))?;
        for dir in ["layers", "keys", "templates", "build"] {
            create_dir(&cache.root.join(dir))?;
        }
        Ok(cache)
    }

    /// The cache's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where build steps' scratch directories go.
    pub fn build_dir(&self) -> PathBuf {
        self.root.join("build")
    }

    /// The unpacked directory of layer `digest`.
    pub fn layer_dir(&self, digest: &str) -> PathBuf {
        self.root.join("layers").join(digest)
    }

    /// The layers of `record` as a sandbox mounts them at `/opt`, named after it.
    pub fn layers_of(&self, record: &TemplateRecord) -> sandkasten_types::TemplateLayers {
        sandkasten_types::TemplateLayers {
            name: Some(record.name.clone()),
            layers: record.layers.iter().map(|digest| self.layer_dir(digest)).collect(),
            capture: None,
            workdir: record.workdir.clone(),
            user: (record.user != crate::spec::DEFAULT_USER).then(|| record.user.clone()),
        }
    }

    /// The layer a step with `key` made before, if it is still there.
    pub fn cached_layer(&self, key: &str) -> Option<String> {
        let digest = fs::read_to_string(self.root.join("keys").join(key)).ok()?;
        let digest = digest.trim().to_owned();
        self.layer_dir(&digest).is_dir().then_some(digest)
    }

    /// Packs the overlay upper directory `upper` into a layer, unpacks it into the cache (unless a layer of the same
    /// digest is there) and records it as the layer of `key`; returns its digest.
    pub fn add_layer(&self, key: &str, upper: &Path) -> Result<String, CacheError> {
        let scratch = self.root.join("layers").join(format!("{PARTIAL}{}-{key}", std::process::id()));
        let archive_path = scratch.with_extension("tar");
        let archive = fs::File::create(&archive_path).map_err(CacheError::io("creating", &archive_path))?;
        let result = (|| {
            layer::pack(upper, std::io::BufWriter::new(&archive))?;
            let digest = digest_file(&archive_path)?;
            let dest = self.layer_dir(&digest);
            if !dest.is_dir() {
                create_dir(&scratch)?;
                let reader = fs::File::open(&archive_path).map_err(CacheError::io("reading", &archive_path))?;
                layer::unpack(std::io::BufReader::new(reader), &scratch)?;
                fs::rename(&scratch, &dest).map_err(CacheError::io("renaming into place", &dest))?;
            }
            write_atomically(&self.root.join("keys").join(key), digest.as_bytes())?;
            Ok(digest)
        })();
        let _ = fs::remove_file(&archive_path);
        let _ = fs::remove_dir_all(&scratch);
        result
    }

    /// Packs the cached layer `digest` into the tar `out` (as `add_layer` packed it, modes as unpacked), to copy it
    /// to an object store.
    pub fn pack_layer(&self, digest: &str, out: impl Write) -> Result<(), CacheError> {
        check_digest(digest)?;
        layer::pack(&self.layer_dir(digest), out)
    }

    /// Unpacks the layer archive `archive` (from an object store, where the layer was stored under `digest`) into
    /// the cache as the layer `digest`, unless it is there; by rename of a finished temporary, as `add_layer`.
    pub fn import_layer(&self, digest: &str, archive: impl std::io::Read) -> Result<(), CacheError> {
        check_digest(digest)?;
        let dest = self.layer_dir(digest);
        if dest.is_dir() {
            return Ok(());
        }
        // A directory of this import's own: two imports of one digest (a pull cut off and retried) never share one.
        static IMPORTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nth = IMPORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch = self.root.join("layers").join(format!("{PARTIAL}{}-import-{nth}-{digest}", std::process::id()));
        let result = (|| {
            create_dir(&scratch)?;
            layer::unpack(archive, &scratch)?;
            match fs::rename(&scratch, &dest) {
                // Another import of the digest finished first: its layer is whole, this one is not needed.
                Err(_) if dest.is_dir() => Ok(()),
                renamed => renamed.map_err(CacheError::io("renaming into place", &dest)),
            }
        })();
        let _ = fs::remove_dir_all(&scratch);
        result
    }

    /// Makes `record` the template of its name (replacing an older one).
    pub fn put_template(&self, record: &TemplateRecord) -> Result<(), CacheError> {
        let path = self.record_path(&record.name);
        let json = serde_json::to_vec_pretty(record)
            .map_err(|e| CacheError::Corrupt { path: path.clone(), message: e.to_string() })?;
        write_atomically(&path, &json)
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.root.join("templates").join(format!("{name}.json"))
    }

    /// The template `name`.
    pub fn template(&self, name: &str) -> Result<TemplateRecord, CacheError> {
        if crate::spec::check_name(name).is_err() {
            return Err(CacheError::UnknownTemplate(name.to_owned()));
        }
        let path = self.record_path(name);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(CacheError::UnknownTemplate(name.into())),
            Err(e) => return Err(CacheError::Io { action: "reading", path, source: e }),
        };
        serde_json::from_slice(&text).map_err(|e| CacheError::Corrupt { path, message: e.to_string() })
    }

    /// Every template, by name.
    pub fn templates(&self) -> Result<Vec<TemplateRecord>, CacheError> {
        let dir = self.root.join("templates");
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).map_err(CacheError::io("reading", &dir))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".json").filter(|_| !name.starts_with(PARTIAL)) {
                found.push(self.template(stem)?);
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// Takes the cache's lock, waiting while a build holds it.
    pub fn lock(&self) -> Result<CacheLock, CacheError> {
        let file = self.lock_file()?;
        file.lock().map_err(CacheError::io("locking", &self.root.join("lock")))?;
        Ok(CacheLock(file))
    }

    /// Takes the cache's lock if nobody holds it; `None` while a build does.
    pub fn try_lock(&self) -> Result<Option<CacheLock>, CacheError> {
        let file = self.lock_file()?;
        match file.try_lock() {
            Ok(()) => Ok(Some(CacheLock(file))),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(error)) => Err(CacheError::io("locking", &self.root.join("lock"))(error)),
        }
    }

    fn lock_file(&self) -> Result<fs::File, CacheError> {
        let path = self.root.join("lock");
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(CacheError::io("opening", &path))
    }

    /// Removes the template `name`, then every layer no template uses and no sandbox reads (`in_use`: layer
    /// directories, as the runtime's sandbox records name them).
    pub fn remove_template(&self, name: &str, in_use: &HashSet<PathBuf>) -> Result<GcReport, CacheError> {
        self.template(name)?;
        let path = self.record_path(name);
        fs::remove_file(&path).map_err(CacheError::io("removing", &path))?;
        self.collect_garbage(in_use)
    }

    /// The total size of `layers`, bytes.
    pub fn size_of_layers(&self, layers: &[String]) -> u64 {
        layers.iter().map(|digest| size_of(&self.layer_dir(digest))).sum()
    }

    /// Removes what no template uses and no sandbox reads (`in_use`: layer directories, as the runtime's sandbox
    /// records name them; a template removed while its sandboxes run keeps its layers until a later collection):
    /// layers (and the step-cache entries naming them) and the temporaries of builds that did not finish. Call it
    /// only while no build runs (the CLI holds the cache's lock).
    pub fn collect_garbage(&self, in_use: &HashSet<PathBuf>) -> Result<GcReport, CacheError> {
        let mut used: HashSet<String> = self.templates()?.into_iter().flat_map(|t| t.layers).collect();
        let mut report = GcReport::default();
        let layers = self.root.join("layers");
        for entry in fs::read_dir(&layers).map_err(CacheError::io("reading", &layers))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(PARTIAL) && !used.contains(&name) && in_use.contains(&entry.path()) {
                report.layers_in_use += 1;
                used.insert(name);
                continue;
            }
            if name.starts_with(PARTIAL) || !used.contains(&name) {
                let path = entry.path();
                let removed = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
                removed.map_err(CacheError::io("removing", &path))?;
                report.layers_removed += usize::from(!name.starts_with(PARTIAL));
            }
        }
        let keys = self.root.join("keys");
        for entry in fs::read_dir(&keys).map_err(CacheError::io("reading", &keys))?.flatten() {
            let digest = fs::read_to_string(entry.path()).unwrap_or_default();
            if entry.file_name().to_string_lossy().starts_with(PARTIAL) || !used.contains(digest.trim()) {
                let _ = fs::remove_file(entry.path());
            }
        }
        for entry in fs::read_dir(self.root.join("templates")).map_err(CacheError::io("reading", &keys))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(PARTIAL) {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(report)
    }

    /// Removes the temporaries a killed build left (partial layers, records, step-cache entries), keeping finished
    /// layers for the next build's cache hits.
    pub fn remove_partials(&self) -> Result<(), CacheError> {
        for dir in ["layers", "keys", "templates"] {
            let path = self.root.join(dir);
            for entry in fs::read_dir(&path).map_err(CacheError::io("reading", &path))?.flatten() {
                if entry.file_name().to_string_lossy().starts_with(PARTIAL) {
                    let path = entry.path();
                    let _ = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
                }
            }
        }
        Ok(())
    }
}

/// Holds a template cache's lock (the `lock` file's): one build or removal at a time, across processes (the CLI's
/// builds, the server's removals). Released when dropped.
#[derive(Debug)]
pub struct CacheLock(#[allow(dead_code)] fs::File);

/// What a garbage collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Layers no template used.
    pub layers_removed: usize,
    /// Layers no template uses that were kept because a sandbox reads them.
    pub layers_in_use: usize,
}

/// Whether `digest` is a layer's digest: 64 lower-case hex digits (SHA-256). Anything else (a record from an object
/// store naming `/root` or `../x`) must never become a path.
pub fn is_layer_digest(digest: &str) -> bool {
    digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check_digest(digest: &str) -> Result<(), CacheError> {
    if is_layer_digest(digest) {
        Ok(())
    } else {
        Err(CacheError::BadEntry { entry: digest.to_owned(), reason: "a layer digest is 64 lower-case hex digits" })
    }
}

/// SHA-256 of a file, `sha256:`-less hex.
fn digest_file(path: &Path) -> Result<String, CacheError> {
    use sha2::{Digest, Sha256};
    let mut file = fs::File::open(path).map_err(CacheError::io("reading", path))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = std::io::Read::read(&mut file, &mut buffer).map_err(CacheError::io("reading", path))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_templates_and_garbage_collection() {
        let root = tempfile::tempdir_in("/var/tmp").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(TemplateCache::open("/tmp/x"), Err(CacheError::Unusable(_))));
        let cache = TemplateCache::open(root.path()).unwrap_or_else(|e| panic!("{e}"));
        let upper = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        fs::create_dir_all(upper.path().join("opt/x")).unwrap_or_else(|e| panic!("{e}"));
        fs::write(upper.path().join("opt/x/f"), "1").unwrap_or_else(|e| panic!("{e}"));
        let digest = cache.add_layer("k1", upper.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cache.cached_layer("k1").as_deref(), Some(digest.as_str()));
        assert_eq!(fs::read_to_string(cache.layer_dir(&digest).join("opt/x/f")).ok().as_deref(), Some("1"));
        assert_eq!(
            cache.add_layer("k2", upper.path()).ok().as_deref(),
            Some(digest.as_str()),
            "same content, same layer"
        );
        let record = TemplateRecord {
            name: "t".into(),
            digest: template_digest(std::slice::from_ref(&digest)),
            base: "host".into(),
            root: crate::Base::Host,
            layers: vec![digest.clone()],
            env: Default::default(),
            workdir: None,
            user: "sandbox".into(),
            preload: vec![],
            size_bytes: 1,
            created: 0,
        };
        cache.put_template(&record).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cache.templates().ok(), Some(vec![record]));
        let none = HashSet::new();
        assert_eq!(cache.collect_garbage(&none).ok(), Some(GcReport::default()));
        assert!(cache.cached_layer("k1").is_some(), "used layers stay");
        let read_by_a_sandbox = HashSet::from([cache.layer_dir(&digest)]);
        let report = cache.remove_template("t", &read_by_a_sandbox).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report, GcReport { layers_removed: 0, layers_in_use: 1 }, "a sandbox still reads the layer");
        assert!(cache.layer_dir(&digest).is_dir() && cache.cached_layer("k1").is_some());
        let report = cache.collect_garbage(&none).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.layers_removed, 1);
        assert!(cache.cached_layer("k1").is_none());
        assert!(matches!(cache.template("t"), Err(CacheError::UnknownTemplate(_))));
        assert!(matches!(cache.template("../etc"), Err(CacheError::UnknownTemplate(_))));
    }
}
