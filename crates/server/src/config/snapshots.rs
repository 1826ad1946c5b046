//! The `[snapshots]` table of the server's config: where snapshots are kept (the snapshot store: a local directory,
//! or an S3-compatible bucket) and how long an unreferenced chunk is kept before GC removes it.

use std::path::Path;
use std::time::Duration;

use sandkasten_snapshot_store::{S3Options, StoreConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};

/// Where snapshots are kept.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// `file:///absolute/dir` or `s3://bucket/prefix`. Default: `file://<the database's directory>/snapshots`.
    #[serde(default)]
    pub store: Option<String>,
    /// An S3-compatible endpoint (`https://host:port`); unset: `AWS_ENDPOINT_URL`, else AWS itself.
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    /// Region; unset: `AWS_REGION`, else `us-east-1`.
    #[serde(default)]
    pub s3_region: Option<String>,
    /// Access key id; unset: `AWS_ACCESS_KEY_ID` (or instance credentials). Written out (`GET /v1/config`) as
    /// `"<redacted>"`.
    #[serde(default, serialize_with = "redacted")]
    pub s3_access_key_id: Option<String>,
    /// Secret access key; unset: `AWS_SECRET_ACCESS_KEY`. Prefer the environment to the config file. Written out
    /// as `"<redacted>"`.
    #[serde(default, serialize_with = "redacted")]
    pub s3_secret_access_key: Option<String>,
    /// Allow an `http://` endpoint (a test server on loopback only: keys and snapshots travel in the clear).
    #[serde(default)]
    pub s3_allow_http: bool,
    /// Seconds an unreferenced chunk is kept before GC removes it (a put in progress elsewhere keeps its fresh
    /// chunks). Default 3600.
    #[serde(default)]
    pub gc_grace_s: Option<u64>,
}

/// Writes a credential as `"<redacted>"` (or nothing when unset): whether it is set shows, never what it is.
fn redacted<S: Serializer>(value: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    value.as_ref().map(|_| "<redacted>").serialize(serializer)
}

/// How long GC spares an unreferenced chunk unless configured.
const DEFAULT_GC_GRACE: Duration = Duration::from_secs(3600);

impl SnapshotsConfig {
    /// The store's settings; `database` places the default local directory.
    pub fn store_config(&self, database: &Path) -> StoreConfig {
        let url = self.store.clone().unwrap_or_else(|| {
            let dir = database.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
            format!("file://{}", dir.join("snapshots").display())
        });
        StoreConfig {
            url,
            s3: S3Options {
                endpoint: self.s3_endpoint.clone(),
                region: self.s3_region.clone(),
                access_key_id: self.s3_access_key_id.clone(),
                secret_access_key: self.s3_secret_access_key.clone(),
                allow_http: self.s3_allow_http,
            },
            gc_grace: self.gc_grace_s.map_or(DEFAULT_GC_GRACE, Duration::from_secs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_store_is_a_directory_next_to_the_database() {
        let config = SnapshotsConfig::default().store_config(Path::new("/var/lib/sandkasten/sandkasten.db"));
        assert_eq!(config.url, "file:///var/lib/sandkasten/snapshots");
        assert_eq!(config.gc_grace, DEFAULT_GC_GRACE);
        let configured = SnapshotsConfig { store: Some("s3://b/p".into()), gc_grace_s: Some(0), ..Default::default() };
        let config = configured.store_config(Path::new("/x/y.db"));
        assert_eq!((config.url.as_str(), config.gc_grace), ("s3://b/p", Duration::ZERO));
    }
}
