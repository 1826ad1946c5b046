//! Host id ranges per sandbox: each process-tier sandbox's user namespace maps its ids 0..65 536 to a host range of
//! its own (slot n: `host_id_base + n × 65 536`), so the kernel's per-user quotas — pipe buffer pages, inotify
//! instances and watches, pending signals, keys — are per sandbox: one sandbox cannot use up its neighbours' share.
//!
//! A slot is held by an exclusive `flock` on `<state_dir>/id-ranges/<n>` for the sandbox's whole life. Separate
//! processes (CLI runs, a server's spawner) therefore never hand out the same range, and when a holder dies the
//! kernel drops its locks: a crash needs no reconcile step for ranges (its sandboxes' processes die with it or are
//! removed by `gc`, which works from the sandbox records, where the range is written too; a range a record still
//! names is never handed out, so processes that outlived a crashed owner never share ids with a new sandbox). A
//! range whose sandbox could not be removed is kept held (`IdRange::keep`) until its holder exits.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{FlockOperation, flock};
use sandkasten_jail::namespaces::MAPPED_ID_COUNT;

use crate::error::RuntimeError;

/// Most ranges (so sandboxes running at once) one host hands out.
pub const MAX_RANGES: u32 = 4096;

/// Where the next search starts in this process: slots are reused last, so a range just released (whose processes
/// the kernel may still be tearing down) is not the next one handed out.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One sandbox's host id range, held until dropped.
#[derive(Debug)]
pub(crate) struct IdRange {
    base: u32,
    lock: Option<File>,
}

/// The directory of slot lock files.
fn directory(state_dir: &Path) -> PathBuf {
    state_dir.join("id-ranges")
}

/// How many slots fit above `host_id_base` (capped at `MAX_RANGES`).
fn slot_count(host_id_base: u32) -> u32 {
    ((u32::MAX - host_id_base) / MAPPED_ID_COUNT).min(MAX_RANGES)
}

impl IdRange {
    /// Claims a free range above `host_id_base`, never one a sandbox record still names (its sandbox may have
    /// outlived a crashed owner until `gc` removes it); fails when every one is held.
    pub(crate) fn claim(state_dir: &Path, records_dir: &Path, host_id_base: u32) -> Result<IdRange, RuntimeError> {
        let dir = directory(state_dir);
        fs::create_dir_all(&dir).map_err(|e| RuntimeError::sys_owned(format!("creating {}", dir.display()), e))?;
        let count = slot_count(host_id_base);
        let recorded: std::collections::HashSet<u32> = crate::records::RecordStore::new(records_dir.to_owned())
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|record| record.ok()?.id_base)
            .collect();
        let start = NEXT.load(Ordering::Relaxed);
        for offset in 0..count {
            let slot = (start + offset) % count;
            if recorded.contains(&(host_id_base + slot * MAPPED_ID_COUNT)) {
                continue;
            }
            let path = dir.join(slot.to_string());
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| RuntimeError::sys_owned(format!("opening {}", path.display()), e))?;
            if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                NEXT.store(slot + 1, Ordering::Relaxed);
                return Ok(IdRange { base: host_id_base + slot * MAPPED_ID_COUNT, lock: Some(file) });
            }
        }
        Err(RuntimeError::InvalidInput(format!(
            "all {count} host id ranges are in use by running sandboxes; wait for one to end"
        )))
    }

    /// The first host id of the range (the sandbox's root).
    pub(crate) fn base(&self) -> u32 {
        self.base
    }

    /// Keeps the range held until this process exits (its sandbox could not be removed completely).
    pub(crate) fn keep(&mut self) {
        std::mem::forget(self.lock.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_distinct_while_held_and_reusable_once_released() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let base = u32::MAX - 3 * MAPPED_ID_COUNT;
        let records = dir.path().join("records");
        let claim = || IdRange::claim(dir.path(), &records, base);
        let (a, b, c) = (claim(), claim(), claim());
        let mut bases: Vec<u32> = [&a, &b, &c].iter().filter_map(|r| r.as_ref().ok().map(IdRange::base)).collect();
        bases.sort_unstable();
        assert_eq!(bases, [base, base + MAPPED_ID_COUNT, base + 2 * MAPPED_ID_COUNT]);
        assert!(claim().is_err(), "three slots fit above this base");
        drop(b);
        assert!(claim().is_ok(), "a released range is free again");
        let mut kept = claim().unwrap_or_else(|e| panic!("{e}"));
        kept.keep();
        drop(kept);
        drop(a);
        let again = claim();
        assert!(again.is_ok() && claim().is_err(), "a kept range stays held");
    }

    #[test]
    fn a_range_a_record_names_is_not_handed_out() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let records = dir.path().join("records");
        let base = u32::MAX - 2 * MAPPED_ID_COUNT;
        let mut left = crate::records::SandboxRecord::owned_by_me("sb-left", "process", "sandkasten");
        left.id_base = Some(base);
        crate::records::RecordStore::new(records.clone()).write(&left).unwrap_or_else(|e| panic!("{e}"));
        let claimed = IdRange::claim(dir.path(), &records, base).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(claimed.base(), base + MAPPED_ID_COUNT, "the recorded range is skipped");
        assert!(IdRange::claim(dir.path(), &records, base).is_err());
    }
}
