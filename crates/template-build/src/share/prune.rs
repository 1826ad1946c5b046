//! Pruning the template store: of each template name, the newest `keep` versions stay (by their records' `created`,
//! as a pull picks the newest) and older ones are deleted, then one garbage collection of the store removes the
//! chunks no version references any more — those of the deleted versions and of pushes cut off before their commit —
//! once they are past the store's grace period (`[snapshots] gc_grace_s`). A push in progress on another host keeps
//! its chunks: those it uploads are young, and one it finds stored but older than half the grace period (maybe a
//! chunk only a version pruned here referenced) it writes again. Versions whose record does not check (damaged, or of a kind this sandkasten does not run) are
//! left alone: they are never pulled and may be a newer sandkasten's.

use std::collections::BTreeMap;

use sandkasten_template::TemplateRecord;

use super::{ShareError, TemplateStore, newest_first};

/// What a prune did.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    /// The versions deleted, by name and newest first.
    pub deleted: Vec<PrunedVersion>,
    /// The versions that stay.
    pub kept: usize,
    /// The versions whose deletion failed, and why.
    pub failed: Vec<PruneFailure>,
    /// Chunks the collection deleted.
    pub chunks_deleted: usize,
    /// Their stored bytes.
    pub bytes_deleted: u64,
    /// Why the collection failed, if it did (the deletions before it stand).
    pub collection_failed: Option<String>,
}

/// A version a prune could not delete.
#[derive(Debug, PartialEq, Eq, serde::Serialize)]
pub struct PruneFailure {
    /// The template's name.
    pub name: String,
    /// The version's digest.
    pub digest: String,
    /// What the store said.
    pub error: String,
}

/// A version a prune deleted.
#[derive(Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrunedVersion {
    /// The template's name.
    pub name: String,
    /// The version's digest.
    pub digest: String,
}

impl TemplateStore {
    /// Deletes all but the newest `keep` versions of each template in the store (of the templates `names`, when
    /// not empty), then collects the chunks nothing references. A deletion or the collection that fails is in the
    /// report (the rest goes on); only listing the store fails the prune.
    pub async fn prune(&self, keep: usize, names: &[String]) -> Result<PruneReport, ShareError> {
        let mut by_name: BTreeMap<String, Vec<(TemplateRecord, String)>> = BTreeMap::new();
        for (record, manifest) in self.stored_versions(None).await? {
            if names.is_empty() || names.contains(&record.name) {
                by_name.entry(record.name.clone()).or_default().push((record, manifest.snapshot_id));
            }
        }
        let mut report = PruneReport::default();
        for mut versions in by_name.into_values() {
            newest_first(&mut versions);
            for (index, (record, id)) in versions.into_iter().enumerate() {
                if index < keep {
                    report.kept += 1;
                    continue;
                }
                match self.store.delete_manifest(&id).await {
                    // Deleted meanwhile (another prune): gone all the same.
                    Ok(()) | Err(sandkasten_snapshot_store::StoreError::NotFound { .. }) => {
                        tracing::info!(template = %record.name, digest = %record.digest, "template version pruned");
                        report.deleted.push(PrunedVersion { name: record.name, digest: record.digest });
                    }
                    Err(error) => report.failed.push(PruneFailure {
                        name: record.name,
                        digest: record.digest,
                        error: error.to_string(),
                    }),
                }
            }
        }
        match self.store.gc().await {
            Ok(collected) => {
                report.chunks_deleted = collected.chunks_deleted;
                report.bytes_deleted = collected.bytes_deleted;
            }
            Err(error) => report.collection_failed = Some(error.to_string()),
        }
        Ok(report)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_report_says_what_was_deleted_and_what_failed() {
        let report = PruneReport {
            deleted: vec![PrunedVersion { name: "t".into(), digest: "sha256:aa".into() }],
            failed: vec![PruneFailure { name: "t".into(), digest: "sha256:bb".into(), error: "denied".into() }],
            collection_failed: Some("a damaged manifest".into()),
            ..PruneReport::default()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["deleted"][0]["digest"], "sha256:aa");
        assert_eq!(json["failed"][0]["error"], "denied");
        assert_eq!(json["collection_failed"], "a damaged manifest");
    }
}
