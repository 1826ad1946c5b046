//! Garbage collection of what a crashed owner left behind: for every record whose owner is dead, kill and remove the
//! sandbox's cgroup, then the record; cgroups under the parent that no record describes are removed too.

use std::collections::BTreeSet;

use sandkasten_cgroups::Hierarchy;

use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::records::RecordStore;

/// What a collection did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Sandboxes whose leftovers were removed.
    pub removed: Vec<String>,
    /// Record files that could not be parsed (left in place, named here).
    pub unreadable: Vec<String>,
    /// Sandboxes still owned by a live process (left alone).
    pub live: usize,
}

/// Removes the leftovers of every sandbox whose owner is gone.
pub fn collect(config: &RuntimeConfig, hierarchy: &Hierarchy) -> Result<GcReport, RuntimeError> {
    let store = RecordStore::new(config.records_dir());
    // Cgroups are listed before records: a cgroup's record is written before the cgroup is created, so every cgroup
    // listed here that belongs to a live sandbox has its record in the listing below.
    let cgroups = hierarchy.list(&config.cgroup_parent)?;
    let gvisor_candidates = crate::backend::gvisor::leftover_candidates(config);
    let microvm_candidates = crate::backend::microvm::leftover_candidates(config);
    let mut report = GcReport::default();
    let mut described = BTreeSet::new();
    let mut live = BTreeSet::new();
    for entry in store.list()? {
        let record = match entry {
            Ok(record) => record,
            Err(path) => {
                report.unreadable.push(path.display().to_string());
                continue;
            }
        };
        described.insert(record.id.clone());
        if record.owner_alive() {
            report.live += 1;
            live.insert(record.id.clone());
            continue;
        }
        remove_cgroup(hierarchy, &record.cgroup_parent, &record.id)?;
        store.remove(&record.id)?;
        report.removed.push(record.id);
    }
    // A cgroup is created only after its record, and its record is removed only after it: a cgroup without a record
    // belongs to nobody.
    for name in cgroups {
        if described.contains(&name) {
            continue;
        }
        if remove_cgroup(hierarchy, &config.cgroup_parent, &name)? {
            report.removed.push(name);
        }
    }
    // gVisor sandboxes also leave runsc state and a bundle; their processes died with their cgroups above.
    for id in crate::backend::gvisor::remove_leftovers(config, gvisor_candidates, &|id| live.contains(id)) {
        if !report.removed.contains(&id) {
            report.removed.push(id);
        }
    }
    // microVM sandboxes leave their directory (disk, logs); their VMMs died with their cgroups above.
    for id in crate::backend::microvm::remove_leftovers(config, microvm_candidates, &|id| live.contains(id)) {
        if !report.removed.contains(&id) {
            report.removed.push(id);
        }
    }
    // Like the per-run cleanup: the parent goes once nothing is under it (ENOTEMPTY otherwise, which is fine).
    let _ = hierarchy.remove_parent(&config.cgroup_parent);
    Ok(report)
}

/// Kills and removes a leftover cgroup. Another `gc` (every `run` starts one when it sees stale records) may be
/// removing the same cgroup at the same moment: a cgroup that is gone by the time an error shows up counts as removed.
/// Returns whether this call found it.
fn remove_cgroup(hierarchy: &Hierarchy, parent: &str, name: &str) -> Result<bool, RuntimeError> {
    let mut attempts = 0;
    loop {
        let Some(cgroup) = hierarchy.open(parent, name)? else { return Ok(attempts > 0) };
        match cgroup.remove() {
            Ok(()) => return Ok(true),
            Err(_) if attempts < 3 => attempts += 1,
            Err(error) => return Err(error.into()),
        }
    }
}

/// True when some record's owner is dead (cheap: one directory read and a stat per record).
pub fn has_stale_records(config: &RuntimeConfig) -> bool {
    RecordStore::new(config.records_dir())
        .list()
        .map(|records| records.iter().any(|r| r.as_ref().is_ok_and(|record| !record.owner_alive())))
        .unwrap_or(false)
}
