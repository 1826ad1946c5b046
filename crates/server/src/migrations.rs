//! The database schema as an ordered list of migrations; `PRAGMA user_version` is the number applied so far.
//! Migrations are append-only: never edit one that has shipped, add the next.

use rusqlite::Connection;

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
];

/// The schema version this build writes.
pub(crate) const CURRENT_VERSION: u32 = MIGRATIONS.len() as u32;

/// Applies the missing migrations, each in its own transaction together with its version bump.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), MigrationError> {
    let found: u32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > CURRENT_VERSION {
        return Err(MigrationError::NewerSchema { found, known: CURRENT_VERSION });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = index + 1;
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
        tracing::info!(version, "database migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_apply_once_and_refuse_a_newer_schema() -> Result<(), MigrationError> {
        let mut conn = Connection::open_in_memory()?;
        migrate(&mut conn)?;
        migrate(&mut conn)?;
        let version: u32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        assert_eq!(version, CURRENT_VERSION);
        conn.pragma_update(None, "user_version", CURRENT_VERSION + 1)?;
        assert!(matches!(migrate(&mut conn), Err(MigrationError::NewerSchema { .. })));
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
        migrate(&mut conn)?;
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
        migrate(&mut conn)?;
        let tier: String = conn.query_row("SELECT isolation FROM sandboxes WHERE id = 'sb-1'", [], |row| row.get(0))?;
        assert_eq!(tier, "process");
        Ok(())
    }
}
