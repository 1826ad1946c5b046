//! Where snapshots are stored: a local directory (`file:///var/lib/sandkasten/snapshots`, the default) or an
//! S3-compatible bucket (`s3://bucket/prefix`), and how old an unreferenced chunk must be before GC removes it.

use std::fmt;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;

use crate::error::StoreError;

/// Settings of a snapshot store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `file:///absolute/dir` (created with mode 0700 if missing) or `s3://bucket[/prefix]`. Default
    /// `file:///var/lib/sandkasten/snapshots`. No percent-encoding: write the path as it is.
    pub url: String,
    /// Settings used for `s3://` URLs only.
    pub s3: S3Options,
    /// How old an unreferenced chunk must be before GC deletes it, so that the fresh chunks of a put in progress
    /// elsewhere (another process on the same store) survive. Default 1 hour; 0 deletes at once (tests).
    pub gc_grace: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: "file:///var/lib/sandkasten/snapshots".to_owned(),
            s3: S3Options::default(),
            gc_grace: Duration::from_secs(3600),
        }
    }
}

/// S3 settings. Each one left `None` is taken from the usual AWS environment variables (`AWS_ENDPOINT_URL`,
/// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, …), then object_store's defaults
/// (region `us-east-1`, AWS itself, instance credentials).
#[derive(Clone, Default)]
pub struct S3Options {
    /// Endpoint of an S3-compatible service, e.g. `https://minio.internal:9000`; requests are path-style then.
    pub endpoint: Option<String>,
    /// Region name.
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key (never printed by `Debug`).
    pub secret_access_key: Option<String>,
    /// Allow `http://` endpoints. Only for a server on loopback (tests): keys and snapshots travel in the clear.
    pub allow_http: bool,
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "<redacted>"))
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// Opens the object store the URL names, rooted at its directory or bucket prefix.
pub(crate) fn open_object_store(config: &StoreConfig) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let url = config.url.as_str();
    let invalid = |reason| StoreError::InvalidUrl { url: url.to_owned(), reason };
    if let Some(dir) = url.strip_prefix("file://") {
        if !dir.starts_with('/') {
            return Err(invalid("a file url needs an absolute path (three slashes)"));
        }
        let dir = PathBuf::from(dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| StoreError::CreateDirectory { path: dir.clone(), source })?;
        let local = LocalFileSystem::new_with_prefix(&dir).map_err(|source| open_failed(url, source))?;
        return Ok(Arc::new(local));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("an s3 url needs a bucket name"));
        }
        let s3 = s3_builder(bucket, &config.s3).build().map_err(|source| open_failed(url, source))?;
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            return Ok(Arc::new(s3));
        }
        let prefix =
            Path::parse(prefix).map_err(|_| invalid("the prefix after the bucket is not a valid object path"))?;
        return Ok(Arc::new(PrefixStore::new(s3, prefix)));
    }
    Err(invalid("the scheme is neither file:// nor s3://"))
}

/// The directory of a local (`file://`) store, `None` for S3.
pub(crate) fn local_directory(config: &StoreConfig) -> Option<PathBuf> {
    config.url.strip_prefix("file://").filter(|dir| dir.starts_with('/')).map(PathBuf::from)
}

/// The environment's AWS settings, overridden by the configured ones.
fn s3_builder(bucket: &str, options: &S3Options) -> AmazonS3Builder {
    // reqwest is built without a crypto provider of its own (see the workspace Cargo.toml): use ring, as the rest of
    // the workspace does. Installing fails harmlessly when the process already chose one.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket).with_allow_http(options.allow_http);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = &options.region {
        builder = builder.with_region(region);
    }
    if let Some(key) = &options.access_key_id {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = &options.secret_access_key {
        builder = builder.with_secret_access_key(secret);
    }
    builder
}

fn open_failed(url: &str, source: object_store::Error) -> StoreError {
    StoreError::Open { url: url.to_owned(), source }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn config(url: &str) -> StoreConfig {
        StoreConfig { url: url.to_owned(), ..StoreConfig::default() }
    }

    #[test]
    fn a_local_store_directory_is_created_private() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("a/snapshots");
        open_object_store(&config(&format!("file://{}", dir.display()))).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn unusable_urls_say_what_to_write() {
        for url in ["file://relative/dir", "s3://", "s3:///prefix", "gs://bucket", "/var/lib/x"] {
            let error = open_object_store(&config(url)).err().unwrap();
            assert!(matches!(error, StoreError::InvalidUrl { .. }), "{url}: {error}");
            assert!(error.to_string().contains("file:///absolute/dir or s3://bucket/prefix"), "{error}");
        }
    }

    #[test]
    fn the_secret_key_is_not_printed() {
        let options = S3Options { secret_access_key: Some("hunter2".to_owned()), ..S3Options::default() };
        assert!(!format!("{options:?}").contains("hunter2"));
    }
}
