//! Paused sandboxes in the database: a paused sandbox stays `running` (it is still the runtime's) with `paused_ms`
//! set. It does not count against the tenant's running quota and its timeout clock stands still: a resume moves
//! `expires_ms` on by the time it was paused, after checking that the quota has room for it again.

use rusqlite::{OptionalExtension, params};

use crate::store::{Quota, QuotaExceeded, Store, StoreError, room_for};

impl Store {
    /// Marks a running sandbox paused at `now_ms`; false when it is not running (or paused already).
    pub async fn pause_sandbox(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            let changed = conn.execute(
                "UPDATE sandboxes SET paused_ms = ?2 WHERE id = ?1 AND state = 'running' AND paused_ms IS NULL",
                params![id, now_ms],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    /// Undoes `pause_sandbox` when a resume failed (the sandbox is paused in the database but not in the runtime).
    pub async fn unpause_sandbox(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.call(move |conn| {
            conn.execute("UPDATE sandboxes SET paused_ms = NULL WHERE id = ?1 AND state = 'running'", params![id])?;
            Ok(())
        })
        .await
    }

    /// Marks the tenant's paused sandbox running again at `now_ms` if `quota` has room for it (as a create would
    /// be admitted), moving its expiry on by the pause; one paused at (or after) its timeout, as `auto_pause` does,
    /// gets `renewal_ms` from now. `Ok(Ok(false))`: it was not paused.
    pub async fn resume_sandbox(
        &self,
        tenant: &str,
        id: &str,
        quota: Quota,
        (now_ms, renewal_ms): (i64, i64),
    ) -> Result<Result<bool, QuotaExceeded>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let asked: Option<(i64, i64)> = tx
                .query_row(
                    "SELECT memory_bytes, pids FROM sandboxes \
                     WHERE id = ?1 AND tenant = ?2 AND state = 'running' AND paused_ms IS NOT NULL",
                    params![id, tenant],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let Some((asked, asked_pids)) = asked else { return Ok(Ok(false)) };
            let asked = (asked.max(0) as u64, asked_pids.max(0) as u64);
            if let Err(exceeded) = room_for(&tx, &tenant, asked, quota)? {
                return Ok(Err(exceeded));
            }
            tx.execute(
                "UPDATE sandboxes SET expires_ms = CASE WHEN expires_ms > paused_ms \
                 THEN expires_ms + MAX(?2 - paused_ms, 0) ELSE ?2 + ?3 END, paused_ms = NULL WHERE id = ?1",
                params![id, now_ms, renewal_ms],
            )?;
            tx.commit()?;
            Ok(Ok(true))
        })
        .await
    }
}
