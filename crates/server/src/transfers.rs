//! The snapshot transfers in progress — a snapshot being saved into the store, a sandbox being restored from one —
//! with how many bytes each has moved, so that `GET /v1/snapshots/{id}` can show them (the CLI draws its progress
//! bars from it while its own request runs). Held in memory only; a transfer disappears when its guard drops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use utoipa::ToSchema;

/// Which way a transfer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferDirection {
    /// The snapshot is being saved into the store.
    Saving,
    /// A new sandbox is being made from the snapshot.
    Restoring,
}

/// A transfer as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct TransferProgress {
    /// Saving or restoring.
    pub direction: TransferDirection,
    /// Bytes moved so far (uncompressed).
    pub bytes_done: u64,
    /// Bytes it will move, when known: a restore knows them from the manifest, a save of files from the sandbox's
    /// disk use (an estimate: the archive adds headers), a save of memory once the image is written.
    pub bytes_total: Option<u64>,
}

/// One transfer's counters.
#[derive(Debug)]
pub(crate) struct Counter {
    direction: TransferDirection,
    done: AtomicU64,
    /// 0 while unknown.
    total: AtomicU64,
}

impl Counter {
    /// Counts `bytes` more moved.
    pub(crate) fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Sets the bytes the transfer will move.
    pub(crate) fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    fn progress(&self) -> TransferProgress {
        let total = self.total.load(Ordering::Relaxed);
        TransferProgress {
            direction: self.direction,
            bytes_done: self.done.load(Ordering::Relaxed),
            bytes_total: (total > 0).then_some(total),
        }
    }
}

type Table = Mutex<HashMap<String, Vec<Arc<Counter>>>>;

/// Every transfer in progress, by snapshot id.
#[derive(Debug, Default)]
pub(crate) struct Transfers {
    table: Arc<Table>,
}

impl Transfers {
    /// Starts counting a transfer of snapshot `snapshot_id`; it is shown until the returned guard drops.
    pub(crate) fn begin(&self, snapshot_id: &str, direction: TransferDirection) -> TransferGuard {
        let counter = Arc::new(Counter { direction, done: AtomicU64::new(0), total: AtomicU64::new(0) });
        if let Ok(mut table) = self.table.lock() {
            table.entry(snapshot_id.to_owned()).or_default().push(Arc::clone(&counter));
        }
        TransferGuard { table: Arc::clone(&self.table), snapshot_id: snapshot_id.to_owned(), counter }
    }

    /// The transfers of `snapshot_id` in progress, oldest first.
    pub(crate) fn of(&self, snapshot_id: &str) -> Vec<TransferProgress> {
        let Ok(table) = self.table.lock() else { return Vec::new() };
        table.get(snapshot_id).map(|counters| counters.iter().map(|c| c.progress()).collect()).unwrap_or_default()
    }
}

/// A transfer being counted; dropping it ends it.
#[derive(Debug)]
pub(crate) struct TransferGuard {
    table: Arc<Table>,
    snapshot_id: String,
    counter: Arc<Counter>,
}

impl TransferGuard {
    /// Its counters (shared with the streams that move the bytes).
    pub(crate) fn counter(&self) -> Arc<Counter> {
        Arc::clone(&self.counter)
    }
}

impl Drop for TransferGuard {
    fn drop(&mut self) {
        let Ok(mut table) = self.table.lock() else { return };
        if let Some(counters) = table.get_mut(&self.snapshot_id) {
            counters.retain(|counter| !Arc::ptr_eq(counter, &self.counter));
            if counters.is_empty() {
                table.remove(&self.snapshot_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_are_shown_while_their_guard_lives() {
        let transfers = Transfers::default();
        let saving = transfers.begin("sn-1", TransferDirection::Saving);
        saving.counter().add(10);
        let restoring = transfers.begin("sn-1", TransferDirection::Restoring);
        restoring.counter().set_total(100);
        restoring.counter().add(40);
        assert_eq!(
            transfers.of("sn-1"),
            [
                TransferProgress { direction: TransferDirection::Saving, bytes_done: 10, bytes_total: None },
                TransferProgress { direction: TransferDirection::Restoring, bytes_done: 40, bytes_total: Some(100) },
            ]
        );
        drop(saving);
        assert_eq!(transfers.of("sn-1").len(), 1);
        drop(restoring);
        assert!(transfers.of("sn-1").is_empty());
        assert!(transfers.table.lock().map(|t| t.is_empty()).unwrap_or(false), "no entry is left behind");
    }
}
