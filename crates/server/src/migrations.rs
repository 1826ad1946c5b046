//! The database schema as an ordered list of migrations; `PRAGMA user_version` is the number applied so far.
//! Migrations are append-only: never edit one that has shipped, add the next.

use rusqlite::{Connection, Transaction};

use crate::seal::rows::RowsError;
use crate::seal::{SealError, SealKeys};

/// Why the schema could not be brought up to date (the store reports it as a `StoreError`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrationError {
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database was written by a newer sandkasten.
    #[error("database schema version {found} is newer than this build's {known}: upgrade sandkasten")]
    NewerSchema {
        /// Version found in the file.
        found: u32,
        /// Newest version this build knows.
        known: u32,
    },
    /// A migration's step could not seal a value.
    #[error(transparent)]
    Seal(#[from] SealError),
}

impl From<RowsError> for MigrationError {
    fn from(error: RowsError) -> Self {
        match error {
            RowsError::Sqlite(error) => MigrationError::Sqlite(error),
            RowsError::Seal(error) => MigrationError::Seal(error),
        }
    }
}

/// Each entry moves the schema from version `index` to `index + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: sandboxes and the commands run in them.
    "CREATE TABLE sandboxes (
        id            TEXT PRIMARY KEY,
        tenant        TEXT NOT NULL,
        state         TEXT NOT NULL CHECK (state IN ('running', 'destroyed', 'lost', 'expired')),
        spec_json     TEXT NOT NULL,
        metadata_json TEXT NOT NULL,
        memory_bytes  INTEGER NOT NULL,
        created_ms    INTEGER NOT NULL,
        expires_ms    INTEGER NOT NULL,
        ended_ms      INTEGER,
        end_reason    TEXT
    ) STRICT;
    CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, state);
    CREATE INDEX sandboxes_running_by_expiry ON sandboxes (expires_ms) WHERE state = 'running';
    CREATE TABLE commands (
        id          TEXT PRIMARY KEY,
        sandbox_id  TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
        tenant      TEXT NOT NULL,
        argv_json   TEXT NOT NULL,
        started_ms  INTEGER NOT NULL,
        ended_ms    INTEGER,
        exit_code   INTEGER,
        signal      INTEGER,
        timed_out   INTEGER
    ) STRICT;
    CREATE INDEX commands_by_sandbox ON commands (sandbox_id);",
    // 2: the tenants of the config (quotas are read from the config; this says which tenants exist and since when),
    // and why a command ended ('exited', 'timeout', 'unknown', or 'lost' when found running at startup).
    "CREATE TABLE tenants (
        name             TEXT PRIMARY KEY,
        created_ms       INTEGER NOT NULL,
        last_seen_ms     INTEGER NOT NULL,
        max_sandboxes    INTEGER NOT NULL,
        max_memory_bytes INTEGER NOT NULL
    ) STRICT;
    ALTER TABLE commands ADD COLUMN end_reason TEXT;
    CREATE INDEX commands_running ON commands (started_ms) WHERE ended_ms IS NULL;",
    // 3: egress: the tenants' secrets (the value only ever leaves toward `hosts`, through the proxy) and the audit of
    // every connection attempt a sandbox made through the proxy.
    "CREATE TABLE secrets (
        tenant      TEXT NOT NULL,
        name        TEXT NOT NULL,
        value       TEXT NOT NULL,
        hosts_json  TEXT NOT NULL,
        updated_ms  INTEGER NOT NULL,
        PRIMARY KEY (tenant, name)
    ) STRICT;
    CREATE TABLE egress_events (
        seq         INTEGER PRIMARY KEY,
        sandbox_id  TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
        tenant      TEXT NOT NULL,
        time_ms     INTEGER NOT NULL,
        event_json  TEXT NOT NULL
    ) STRICT;
    CREATE INDEX egress_events_by_sandbox ON egress_events (sandbox_id, seq);",
    // 4: an allowed connection is recorded when it opens and that row is replaced when it ends: its number.
    "ALTER TABLE egress_events ADD COLUMN connection_id INTEGER;
    CREATE INDEX egress_events_by_connection ON egress_events (sandbox_id, connection_id)
        WHERE connection_id IS NOT NULL;",
    // 5: each sandbox's isolation tier ('process', 'gvisor', ...); every sandbox before tiers ran on 'process'.
    "ALTER TABLE sandboxes ADD COLUMN isolation TEXT NOT NULL DEFAULT 'process';",
    // 6: the pids quota (each sandbox's pids limit, the tenants' sum).
    "ALTER TABLE sandboxes ADD COLUMN pids INTEGER NOT NULL DEFAULT 0;
    UPDATE sandboxes SET pids = COALESCE(json_extract(spec_json, '$.limits.pids'), 0);
    ALTER TABLE tenants ADD COLUMN max_pids INTEGER NOT NULL DEFAULT 8192;",
    // 7: the output quota (command output the server holds for a tenant's sandboxes at once).
    "ALTER TABLE tenants ADD COLUMN max_output_bytes INTEGER NOT NULL DEFAULT 268435456;",
    // 8: secret values are sealed (see `seal`): this table replaces `secrets`, whose rows its code step seals into it
    // before dropping `secrets` (see CODE_STEPS).
    "CREATE TABLE sealed_secrets (
        tenant      TEXT NOT NULL,
        name        TEXT NOT NULL,
        sealed      BLOB NOT NULL,
        hosts_json  TEXT NOT NULL,
        updated_ms  INTEGER NOT NULL,
        PRIMARY KEY (tenant, name)
    ) STRICT;",
    // 9: paused sandboxes (`paused_ms`: since when, while paused; the state stays 'running') and each sandbox's
    // lifecycle (auto_pause, auto_resume).
    "ALTER TABLE sandboxes ADD COLUMN paused_ms INTEGER;
    ALTER TABLE sandboxes ADD COLUMN lifecycle_json TEXT NOT NULL DEFAULT '{}';",
    // 10: snapshots (their chunks and manifest live in the snapshot store; a row is 'saving' until the manifest is
    // written, then 'ready') and the stored-bytes quota.
    "CREATE TABLE snapshots (
        id              TEXT PRIMARY KEY,
        tenant          TEXT NOT NULL,
        name            TEXT,
        source_sandbox  TEXT NOT NULL,
        memory          INTEGER NOT NULL,
        spec_json       TEXT NOT NULL,
        dirs_json       TEXT NOT NULL,
        state           TEXT NOT NULL,
        size_bytes      INTEGER NOT NULL DEFAULT 0,
        stored_bytes    INTEGER NOT NULL DEFAULT 0,
        created_ms      INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX snapshots_by_tenant ON snapshots (tenant, created_ms);
    ALTER TABLE tenants ADD COLUMN max_snapshot_bytes INTEGER NOT NULL DEFAULT 10737418240;",
    // 11: filesystem pauses: a snapshot `for_pause` holds the files of its source sandbox while that is paused with
    // `pause_mode` filesystem (not listed, not restorable by the tenant; deleted by the resume or the delete).
    "ALTER TABLE snapshots ADD COLUMN for_pause INTEGER NOT NULL DEFAULT 0;",
    // 12: the tier's reason and a microVM's acceleration (`sandkasten_types::Isolation` as JSON; '' before).
    "ALTER TABLE sandboxes ADD COLUMN isolation_json TEXT NOT NULL DEFAULT '';",
    // 13: what E2B's secrets API shows of a secret (never its value): an id (`sec_` + 16 hex digits), a version
    // counted up by every write of the value, caller metadata (a JSON object of strings) and the creation time.
    "ALTER TABLE sealed_secrets ADD COLUMN secret_id TEXT;
    ALTER TABLE sealed_secrets ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE sealed_secrets ADD COLUMN metadata_json TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE sealed_secrets ADD COLUMN created_ms INTEGER NOT NULL DEFAULT 0;
    UPDATE sealed_secrets SET secret_id = 'sec_' || lower(hex(randomblob(8))), created_ms = updated_ms;
    CREATE UNIQUE INDEX sealed_secrets_by_id ON sealed_secrets (secret_id);",
];

/// A migration's part that SQL cannot do; returns how many rows it rewrote.
type CodeStep = fn(&Transaction<'_>, &SealKeys) -> Result<usize, RowsError>;

/// Code run after the SQL of the migration to a version, in its transaction: `(version, step)`.
const CODE_STEPS: &[(usize, CodeStep)] = &[(8, crate::seal::rows::seal_plaintext)];

/// The schema version this build writes.
pub(crate) const CURRENT_VERSION: u32 = MIGRATIONS.len() as u32;

/// Applies the missing migrations, each in its own transaction together with its version bump (and its code step,
/// which seals with `keys`); returns how many rows code steps rewrote.
pub(crate) fn migrate(conn: &mut Connection, keys: &SealKeys) -> Result<usize, MigrationError> {
    let found: u32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > CURRENT_VERSION {
        return Err(MigrationError::NewerSchema { found, known: CURRENT_VERSION });
    }
    let mut rewritten = 0;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = index + 1;
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        for (_, step) in CODE_STEPS.iter().filter(|(at, _)| *at == version) {
            rewritten += step(&tx, keys)?;
        }
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
        tracing::info!(version, "database migrated");
    }
    Ok(rewritten)
}

/// A database as the build that wrote schema `version` left it (tests of later migrations).
#[cfg(test)]
pub(crate) fn schema_at(conn: &Connection, version: usize) -> Result<(), MigrationError> {
    for (index, sql) in MIGRATIONS[..version].iter().enumerate() {
        conn.execute_batch(sql)?;
        conn.pragma_update(None, "user_version", index + 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Result<SealKeys, MigrationError> {
        Ok(SealKeys::new(crate::seal::SealKey::from_bytes(&[7; crate::seal::KEY_BYTES])?, Vec::new()))
    }

    #[test]
    fn migrations_apply_once_and_refuse_a_newer_schema() -> Result<(), MigrationError> {
        let mut conn = Connection::open_in_memory()?;
        migrate(&mut conn, &keys()?)?;
        migrate(&mut conn, &keys()?)?;
        let version: u32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        assert_eq!(version, CURRENT_VERSION);
        conn.pragma_update(None, "user_version", CURRENT_VERSION + 1)?;
        assert!(matches!(migrate(&mut conn, &keys()?), Err(MigrationError::NewerSchema { .. })));
        Ok(())
    }

    #[test]
    fn version_1_databases_keep_their_rows_and_gain_tenants_and_command_end_reasons() -> Result<(), MigrationError> {
        let mut conn = Connection::open_in_memory()?;
        conn.execute_batch(MIGRATIONS[0])?;
        conn.pragma_update(None, "user_version", 1)?;
        conn.execute_batch(
            "INSERT INTO sandboxes VALUES ('sb-1', 't', 'running', '{}', '{}', 1, 1, 2, NULL, NULL);
             INSERT INTO commands (id, sandbox_id, tenant, argv_json, started_ms) VALUES ('cmd-1', 'sb-1', 't', '[]', 1);",
        )?;
        migrate(&mut conn, &keys()?)?;
        let reason: Option<String> =
            conn.query_row("SELECT end_reason FROM commands WHERE id = 'cmd-1'", [], |row| row.get(0))?;
        assert_eq!(reason, None);
        let tenants: i64 = conn.query_row("SELECT COUNT(*) FROM tenants", [], |row| row.get(0))?;
        assert_eq!(tenants, 0);
        Ok(())
    }

    #[test]
    fn sandboxes_from_before_tiers_are_process_sandboxes() -> Result<(), MigrationError> {
        let mut conn = Connection::open_in_memory()?;
        for (index, sql) in MIGRATIONS[..4].iter().enumerate() {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", index + 1)?;
        }
        conn.execute_batch("INSERT INTO sandboxes VALUES ('sb-1', 't', 'running', '{}', '{}', 1, 1, 2, NULL, NULL);")?;
        migrate(&mut conn, &keys()?)?;
        let tier: String = conn.query_row("SELECT isolation FROM sandboxes WHERE id = 'sb-1'", [], |row| row.get(0))?;
        assert_eq!(tier, "process");
        Ok(())
    }

    #[test]
    fn plaintext_secrets_of_version_6_databases_are_sealed_and_the_plaintext_table_is_gone()
    -> Result<(), MigrationError> {
        let mut conn = Connection::open_in_memory()?;
        schema_at(&conn, 6)?;
        conn.execute_batch(
            "INSERT INTO secrets VALUES ('t1', 'TOKEN', 'plain-value-of-t1', '[\"a.example\"]', 5);
             INSERT INTO secrets VALUES ('t2', 'TOKEN', 'plain-value-of-t2', '[\"b.example\"]', 6);",
        )?;
        let keys = keys()?;
        assert_eq!(migrate(&mut conn, &keys)?, 2);
        let tables: i64 =
            conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE name = 'secrets'", [], |row| row.get(0))?;
        assert_eq!(tables, 0, "the plaintext table is still there");
        let rows = conn
            .prepare("SELECT tenant, name, sealed, hosts_json, updated_ms FROM sealed_secrets ORDER BY tenant")?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)))?
            .collect::<Result<Vec<(String, String, Vec<u8>, String, i64)>, _>>()?;
        assert_eq!(rows.len(), 2);
        for (tenant, name, sealed, hosts, updated_ms) in &rows {
            let plain = format!("plain-value-of-{tenant}");
            assert!(!sealed.windows(plain.len()).any(|w| w == plain.as_bytes()), "{tenant}'s value is in the clear");
            assert!(keys.is_current(sealed));
            assert_eq!(keys.open(tenant, name, sealed)?, plain);
            assert!(hosts.contains(".example") && *updated_ms > 0);
        }
        assert_eq!(migrate(&mut conn, &keys)?, 0, "a second start seals nothing");
        Ok(())
    }

    #[test]
    fn the_sealing_step_runs_after_the_migration_that_creates_the_sealed_table() {
        // Guards a merge that renumbers migrations: the step must follow the SQL that creates its target.
        for (version, _) in CODE_STEPS {
            assert!(MIGRATIONS[version - 1].contains("CREATE TABLE sealed_secrets"), "code step at {version}");
        }
    }
}
