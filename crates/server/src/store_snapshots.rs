//! Snapshots in the database: one row per snapshot, `saving` from before its first chunk is stored until its manifest
//! is written, then `ready`. The bytes (chunks and manifest) are the snapshot store's; the row says whose it is, what
//! sandbox it came from (its spec, to create the copy alike) and what it costs the tenant (`stored_bytes`, counted
//! against `max_snapshot_bytes`). At a start, rows still `saving` were cut off by a crash: the reconcile removes them
//! with whatever the store holds of them.

use rusqlite::{OptionalExtension, params};
use sandkasten_types::SandboxSpec;

use crate::store::{Quota, QuotaExceeded, Store, StoreError, to_i64};

/// Where a snapshot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    /// Being written to the store; not usable yet.
    Saving,
    /// Its manifest is written: it can be restored.
    Ready,
}

impl SnapshotState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Saving => "saving",
            SnapshotState::Ready => "ready",
        }
    }
}

/// One snapshot as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRecord {
    /// `sn-` + 16 hex digits.
    pub id: String,
    /// Owning tenant.
    pub tenant: String,
    /// The caller's name for it.
    pub name: Option<String>,
    /// The sandbox it was taken of.
    pub source_sandbox: String,
    /// Whether it holds memory (processes) as well as files.
    pub memory: bool,
    /// The source sandbox's spec (a sandbox made from the snapshot starts alike unless told otherwise).
    pub spec: SandboxSpec,
    /// The directories saved, absolute, inside the sandbox.
    pub dirs: Vec<String>,
    /// Saving or ready.
    pub state: SnapshotState,
    /// Bytes of the saved files (the archive), uncompressed.
    pub size_bytes: u64,
    /// Bytes its chunks take in the store, compressed (shared chunks counted in full): what the tenant is charged.
    pub stored_bytes: u64,
    /// When it was taken, ms since the Unix epoch.
    pub created_ms: i64,
    /// It holds the files of its source sandbox while that is paused to the filesystem: not the tenant's to list,
    /// restore or delete (the resume or the sandbox's delete removes it); charged like any other.
    pub for_pause: bool,
}

const COLUMNS: &str = "id, tenant, name, source_sandbox, memory, spec_json, dirs_json, state, size_bytes, \
     stored_bytes, created_ms, for_pause";

fn from_row(row: &rusqlite::Row<'_>) -> Result<SnapshotRecord, StoreError> {
    let spec_json: String = row.get(5)?;
    let dirs_json: String = row.get(6)?;
    let state: String = row.get(7)?;
    Ok(SnapshotRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        name: row.get(2)?,
        source_sandbox: row.get(3)?,
        memory: row.get::<_, i64>(4)? != 0,
        spec: serde_json::from_str(&spec_json)?,
        dirs: serde_json::from_str(&dirs_json)?,
        state: if state == "ready" { SnapshotState::Ready } else { SnapshotState::Saving },
        size_bytes: row.get::<_, i64>(8)?.max(0) as u64,
        stored_bytes: row.get::<_, i64>(9)?.max(0) as u64,
        created_ms: row.get(10)?,
        for_pause: row.get::<_, i64>(11)? != 0,
    })
}

impl Store {
    /// Records a new snapshot as `saving`, if the tenant's snapshots leave room under `quota` (they take less than
    /// `max_snapshot_bytes`; its own size is not known yet and is checked by `finish_snapshot`).
    pub async fn begin_snapshot(
        &self,
        record: SnapshotRecord,
        quota: Quota,
    ) -> Result<Result<(), QuotaExceeded>, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let used = stored_bytes(&tx, &record.tenant)?;
            if used >= quota.max_snapshot_bytes {
                return Ok(Err(QuotaExceeded::SnapshotBytes { used, asked: 0, limit: quota.max_snapshot_bytes }));
            }
            tx.execute(
                &format!(
                    "INSERT INTO snapshots ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'saving', 0, 0, ?8, ?9)"
                ),
                params![
                    record.id,
                    record.tenant,
                    record.name,
                    record.source_sandbox,
                    i64::from(record.memory),
                    serde_json::to_string(&record.spec)?,
                    serde_json::to_string(&record.dirs)?,
                    record.created_ms,
                    i64::from(record.for_pause)
                ],
            )?;
            tx.commit()?;
            Ok(Ok(()))
        })
        .await
    }

    /// Marks a saving snapshot ready with its sizes if the tenant's snapshots, it included, stay within `quota`;
    /// otherwise leaves it `saving` (the caller removes it) and says by how much it is over.
    pub async fn finish_snapshot(
        &self,
        id: &str,
        (size_bytes, stored): (u64, u64),
        quota: Quota,
    ) -> Result<Result<(), QuotaExceeded>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let tenant: Option<String> =
                tx.query_row("SELECT tenant FROM snapshots WHERE id = ?1", params![id], |row| row.get(0)).optional()?;
            let Some(tenant) = tenant else { return Ok(Ok(())) };
            let used = stored_bytes(&tx, &tenant)?;
            if used.saturating_add(stored) > quota.max_snapshot_bytes {
                return Ok(Err(QuotaExceeded::SnapshotBytes { used, asked: stored, limit: quota.max_snapshot_bytes }));
            }
            tx.execute(
                "UPDATE snapshots SET state = 'ready', size_bytes = ?2, stored_bytes = ?3 WHERE id = ?1",
                params![id, to_i64(size_bytes), to_i64(stored)],
            )?;
            tx.commit()?;
            Ok(Ok(()))
        })
        .await
    }

    /// Removes a snapshot's row; false when there was none.
    pub async fn forget_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| Ok(conn.execute("DELETE FROM snapshots WHERE id = ?1", params![id])? == 1)).await
    }

    /// The tenant's snapshot `id`, in any state (never a pause snapshot: those are not the tenant's to use).
    pub async fn snapshot(&self, tenant: &str, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |conn| {
            let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1 AND tenant = ?2 AND for_pause = 0");
            let mut statement = conn.prepare_cached(&sql)?;
            let mut rows = statement.query(params![id, tenant])?;
            rows.next()?.map(from_row).transpose()
        })
        .await
    }

    /// The pause snapshot `id` (one holding a paused sandbox's files), in any state.
    pub async fn pause_snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1 AND for_pause = 1");
            let mut statement = conn.prepare_cached(&sql)?;
            let mut rows = statement.query(params![id])?;
            rows.next()?.map(from_row).transpose()
        })
        .await
    }

    /// Pause snapshots whose sandbox is no longer paused (it was resumed, or it ended, and a crash kept the
    /// snapshot from being deleted): ids, to delete.
    pub async fn orphaned_pause_snapshots(&self) -> Result<Vec<String>, StoreError> {
        self.call(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT id FROM snapshots s WHERE s.for_pause = 1 AND s.state = 'ready' AND NOT EXISTS \
                 (SELECT 1 FROM sandboxes b WHERE b.id = s.source_sandbox AND b.state = 'running' \
                 AND b.paused_ms IS NOT NULL)",
            )?;
            let rows = statement.query_map([], |row| row.get(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// The tenant's snapshots, oldest first (pause snapshots are not listed).
    pub async fn snapshots(&self, tenant: &str) -> Result<Vec<SnapshotRecord>, StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM snapshots WHERE tenant = ?1 AND for_pause = 0 ORDER BY created_ms, rowid"
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let mut rows = statement.query(params![tenant])?;
            let mut records = Vec::new();
            while let Some(row) = rows.next()? {
                records.push(from_row(row)?);
            }
            Ok(records)
        })
        .await
    }

    /// The template layers the sandboxes of memory snapshots read: their restore mounts those very layers again (a
    /// files snapshot is restored onto its template as built when it is restored; a paused sandbox's row names its
    /// own).
    pub async fn snapshot_layers(&self) -> Result<Vec<std::path::PathBuf>, StoreError> {
        self.call(|conn| {
            let mut statement = conn.prepare_cached("SELECT spec_json FROM snapshots WHERE memory != 0")?;
            let mut rows = statement.query([])?;
            let mut layers = Vec::new();
            while let Some(row) = rows.next()? {
                let spec: sandkasten_types::SandboxSpec = serde_json::from_str(&row.get::<_, String>(0)?)?;
                layers.extend(spec.layers.layers);
            }
            Ok(layers)
        })
        .await
    }

    /// Every snapshot's id and state (the reconcile with the store at start).
    pub async fn all_snapshots(&self) -> Result<Vec<(String, SnapshotState)>, StoreError> {
        self.call(|conn| {
            let mut statement = conn.prepare_cached("SELECT id, state FROM snapshots")?;
            let rows = statement.query_map([], |row| {
                let state: String = row.get(1)?;
                Ok((row.get(0)?, if state == "ready" { SnapshotState::Ready } else { SnapshotState::Saving }))
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// Bytes the tenant's snapshots take in the store.
fn stored_bytes(conn: &rusqlite::Connection, tenant: &str) -> Result<u64, StoreError> {
    let used: i64 = conn.query_row(
        "SELECT COALESCE(SUM(stored_bytes), 0) FROM snapshots WHERE tenant = ?1",
        params![tenant],
        |row| row.get(0),
    )?;
    Ok(used.max(0) as u64)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn quota(max_snapshot_bytes: u64) -> Quota {
        Quota { max_sandboxes: 1, max_memory_bytes: 1, max_pids: 1, max_output_bytes: 1, max_snapshot_bytes }
    }

    fn record(id: &str, tenant: &str) -> SnapshotRecord {
        SnapshotRecord {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            name: Some("before the fix".to_owned()),
            source_sandbox: "sb-0000000000000001".to_owned(),
            memory: false,
            spec: SandboxSpec::default(),
            dirs: vec!["/workspace".to_owned()],
            state: SnapshotState::Saving,
            size_bytes: 0,
            stored_bytes: 0,
            created_ms: 5,
            for_pause: false,
        }
    }

    #[tokio::test]
    async fn the_layers_of_memory_snapshots_are_held_and_those_of_files_snapshots_not() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        let with_layer = |id: &str, memory: bool, layer: &str| {
            let mut snapshot = record(id, "t1");
            snapshot.memory = memory;
            snapshot.spec.layers.layers = vec![layer.into()];
            snapshot
        };
        store.begin_snapshot(with_layer("sn-memory", true, "/cache/layers/aa"), quota(100)).await?.expect("room");
        store.begin_snapshot(with_layer("sn-files", false, "/cache/layers/bb"), quota(100)).await?.expect("room");
        assert_eq!(store.snapshot_layers().await?, vec![std::path::PathBuf::from("/cache/layers/aa")]);
        Ok(())
    }

    #[tokio::test]
    async fn a_snapshot_is_saving_until_finished_and_the_quota_counts_stored_bytes() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        store.begin_snapshot(record("sn-1", "t1"), quota(100)).await?.expect("room");
        assert_eq!(store.snapshot("t1", "sn-1").await?.map(|r| r.state), Some(SnapshotState::Saving));
        assert_eq!(store.snapshot("t2", "sn-1").await?, None, "another tenant's snapshot is not found");
        store.finish_snapshot("sn-1", (500, 60), quota(100)).await?.expect("60 of 100");
        let ready = store.snapshot("t1", "sn-1").await?.expect("row");
        assert_eq!((ready.state, ready.size_bytes, ready.stored_bytes), (SnapshotState::Ready, 500, 60));
        assert_eq!(ready.name.as_deref(), Some("before the fix"));
        store.begin_snapshot(record("sn-2", "t1"), quota(100)).await?.expect("60 < 100");
        let over = store.finish_snapshot("sn-2", (500, 41), quota(100)).await?;
        assert_eq!(over, Err(QuotaExceeded::SnapshotBytes { used: 60, asked: 41, limit: 100 }));
        assert!(store.forget_snapshot("sn-2").await?);
        store.begin_snapshot(record("sn-3", "t1"), quota(60)).await?.expect_err("60 of 60 used: no room");
        assert_eq!(store.snapshots("t1").await?.len(), 1);
        assert_eq!(store.all_snapshots().await?, vec![("sn-1".to_owned(), SnapshotState::Ready)]);
        Ok(())
    }

    #[tokio::test]
    async fn a_pause_snapshot_is_charged_but_not_the_tenants_to_see() -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        let paused = SnapshotRecord { for_pause: true, ..record("sn-p", "t1") };
        store.begin_snapshot(paused, quota(100)).await?.expect("room");
        store.finish_snapshot("sn-p", (500, 70), quota(100)).await?.expect("70 of 100");
        assert_eq!(store.snapshot("t1", "sn-p").await?, None, "not the tenant's to restore or delete");
        assert!(store.snapshots("t1").await?.is_empty(), "not listed");
        assert_eq!(store.pause_snapshot("sn-p").await?.map(|r| r.stored_bytes), Some(70));
        assert_eq!(store.pause_snapshot("sn-1").await?, None);
        store.begin_snapshot(record("sn-1", "t1"), quota(100)).await?.expect("70 < 100");
        let over = store.finish_snapshot("sn-1", (500, 31), quota(100)).await?;
        assert_eq!(over, Err(QuotaExceeded::SnapshotBytes { used: 70, asked: 31, limit: 100 }), "it is charged");
        // Its sandbox does not exist (is not paused): an orphan.
        assert_eq!(store.orphaned_pause_snapshots().await?, vec!["sn-p".to_owned()]);
        Ok(())
    }
}
