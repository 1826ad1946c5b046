//! Retention: what the database keeps of ended things is bounded. Once an hour (and at start) the sweeper removes
//! sandboxes that ended longer ago than `[retention] days` (their commands and egress events with them), the oldest
//! ended sandboxes beyond `[retention] max_ended_sandboxes`, and commands and egress events older than the retention
//! of sandboxes that still run; then it gives the freed pages back to the filesystem (incremental vacuum). Within
//! retention everything stays queryable (`GET /v1/sandboxes/{id}`, its audit).

use rusqlite::{Connection, params};

use crate::store::{Store, StoreError};

/// What one prune removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pruned {
    /// Ended sandboxes (with their commands and egress events).
    pub sandboxes: usize,
    /// Ended commands of sandboxes that are kept.
    pub commands: usize,
    /// Egress events of sandboxes that are kept.
    pub events: usize,
}

/// Pages given back per prune at most (a large backlog is returned over several prunes).
const VACUUM_PAGES: u32 = 10_000;

impl Store {
    /// Removes what ended before `cutoff_ms` and ended sandboxes beyond the newest `max_ended`.
    pub async fn prune(&self, cutoff_ms: i64, max_ended: u64) -> Result<Pruned, StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let mut sandboxes = tx.execute(
                "DELETE FROM sandboxes WHERE state != 'running' AND ended_ms IS NOT NULL AND ended_ms < ?1",
                params![cutoff_ms],
            )?;
            sandboxes += tx.execute(
                "DELETE FROM sandboxes WHERE id IN (SELECT id FROM sandboxes WHERE state != 'running' \
                 ORDER BY ended_ms DESC, rowid DESC LIMIT -1 OFFSET ?1)",
                params![i64::try_from(max_ended).unwrap_or(i64::MAX)],
            )?;
            let commands =
                tx.execute("DELETE FROM commands WHERE ended_ms IS NOT NULL AND ended_ms < ?1", params![cutoff_ms])?;
            let events = tx.execute("DELETE FROM egress_events WHERE time_ms < ?1", params![cutoff_ms])?;
            tx.commit()?;
            give_back_pages(conn)?;
            Ok(Pruned { sandboxes, commands, events })
        })
        .await
    }
}

/// Returns freed pages to the filesystem where the database keeps them (`auto_vacuum = INCREMENTAL`).
fn give_back_pages(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES});"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sandkasten_types::{SandboxSpec, Tier};

    use super::*;
    use crate::store::{CommandRecord, Quota, SandboxRecord, SandboxState};

    const QUOTA: Quota = Quota {
        max_sandboxes: 100,
        max_memory_bytes: u64::MAX,
        max_pids: u64::MAX,
        max_output_bytes: 1,
        max_snapshot_bytes: 1,
    };

    fn record(id: &str) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            tenant: "t".into(),
            state: SandboxState::Running,
            spec: SandboxSpec { isolation: Some(Tier::Process), ..SandboxSpec::default() },
            isolation: Default::default(),
            metadata: BTreeMap::new(),
            created_ms: 1,
            expires_ms: i64::MAX,
            ended_ms: None,
            end_reason: None,
            paused_ms: None,
            pause_snapshot: None,
            lifecycle: Default::default(),
        }
    }

    async fn ended(store: &Store, id: &str, at_ms: i64) -> Result<(), StoreError> {
        assert_eq!(store.admit_sandbox(record(id), QUOTA).await?, Ok(()));
        assert!(store.end_sandbox(id, SandboxState::Destroyed, "deleted", at_ms).await?);
        Ok(())
    }

    #[tokio::test]
    async fn prune_removes_what_ended_before_the_cutoff_and_beyond_the_row_cap_and_keeps_the_rest()
    -> Result<(), StoreError> {
        let store = Store::open_in_memory()?;
        ended(&store, "old", 100).await?;
        ended(&store, "recent-1", 2_000).await?;
        ended(&store, "recent-2", 3_000).await?;
        ended(&store, "recent-3", 4_000).await?;
        assert_eq!(store.admit_sandbox(record("running"), QUOTA).await?, Ok(()));
        let command = |id: &str, sandbox: &str, started_ms: i64| CommandRecord {
            id: id.into(),
            sandbox_id: sandbox.into(),
            tenant: "t".into(),
            argv: vec!["true".into()],
            started_ms,
        };
        store.start_command(command("cmd-old", "old", 50)).await?;
        store.start_command(command("cmd-running-old", "running", 60)).await?;
        store.finish_command("cmd-running-old", None, 70).await?;
        store.start_command(command("cmd-running-new", "running", 5_000)).await?;
        store.finish_command("cmd-running-new", None, 5_001).await?;

        // Retention 1000 ms at 1000: "old" goes; the row cap of 2 ended sandboxes takes the oldest remaining too.
        let pruned = store.prune(1_000, 2).await?;
        assert_eq!(pruned, Pruned { sandboxes: 2, commands: 1, events: 0 }, "{pruned:?}");
        for gone in ["old", "recent-1"] {
            assert!(store.sandbox("t", gone).await?.is_none(), "{gone} was kept");
        }
        for kept in ["recent-2", "recent-3", "running"] {
            assert!(store.sandbox("t", kept).await?.is_some(), "{kept} was pruned");
        }
        assert_eq!(
            store.command_count("running").await?,
            1,
            "the old command of a running sandbox goes, the new stays"
        );
        assert_eq!(store.command_count("old").await?, 0, "a pruned sandbox's commands go with it");
        assert_eq!(store.prune(1_000, 2).await?, Pruned::default(), "a second prune finds nothing");
        Ok(())
    }
}
