//! Pruning the template store: of each template name, the newest `keep` versions stay (by their records' `created`,
//! as a pull picks the newest) and older ones are deleted, then one garbage collection of the store removes the
//! chunks no version references any more — those of the deleted versions and of pushes cut off before their commit —
//! once they are past the store's grace period (`[snapshots] gc_grace_s`), so a push in progress on another host
//! keeps its chunks. Versions whose record does not check (damaged, or of a kind this sandkasten does not run) are
//! left alone: they are never pulled and may be a newer sandkasten's.

use std::collections::BTreeMap;

use sandkasten_template::TemplateRecord;

use super::{ShareError, TemplateStore};

/// What a prune did.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    /// The versions deleted, by name and newest first.
    pub deleted: Vec<PrunedVersion>,
    /// The versions that stay.
    pub kept: usize,
    /// Chunks the collection deleted.
    pub chunks_deleted: usize,
    /// Their stored bytes.
    pub bytes_deleted: u64,
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
    /// not empty), then collects the chunks nothing references.
    pub async fn prune(&self, keep: usize, names: &[String]) -> Result<PruneReport, ShareError> {
        let mut by_name: BTreeMap<String, Vec<(TemplateRecord, String)>> = BTreeMap::new();
        for (record, manifest) in self.stored_versions(None).await? {
            if names.is_empty() || names.contains(&record.name) {
                by_name.entry(record.name.clone()).or_default().push((record, manifest.snapshot_id));
            }
        }
        let mut report = PruneReport::default();
        for versions in by_name.into_values() {
            for (index, (record, id)) in newest_first(versions).into_iter().enumerate() {
                if index < keep {
                    report.kept += 1;
                    continue;
                }
                match self.store.delete_manifest(&id).await {
                    // Deleted meanwhile (another prune): gone all the same.
                    Ok(()) | Err(sandkasten_snapshot_store::StoreError::NotFound { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
                tracing::info!(template = %record.name, digest = %record.digest, "template version pruned");
                report.deleted.push(PrunedVersion { name: record.name, digest: record.digest });
            }
        }
        let collected = self.store.gc().await?;
        report.chunks_deleted = collected.chunks_deleted;
        report.bytes_deleted = collected.bytes_deleted;
        Ok(report)
    }
}

/// `versions` of one name, newest first: by `created`, then by version id (the one a pull takes first).
fn newest_first(mut versions: Vec<(TemplateRecord, String)>) -> Vec<(TemplateRecord, String)> {
    versions.sort_by(|(a, a_id), (b, b_id)| (b.created, b_id).cmp(&(a.created, a_id)));
    versions
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_newest_first_and_ties_as_a_pull_picks() {
        let version = |created: u64, id: &str| (super::super::tests::record("t", "", created), id.to_owned());
        let sorted = newest_first(vec![version(1, "a"), version(3, "b"), version(3, "c"), version(2, "d")]);
        let ids: Vec<&str> = sorted.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "d", "a"]);
    }
}
