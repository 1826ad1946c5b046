//! The sealed rows in the database (`sealed_secrets`): migration 7 seals the plaintext rows of older databases
//! ([`seal_plaintext`]); every open re-seals what previous keys sealed and checks that every value opens
//! ([`reseal`]); when either rewrote rows, [`scrub`] leaves no old copy in the files: the WAL is checkpointed and
//! truncated, and freed pages are given back (with `secure_delete` on, the store's setting, deleted content is
//! zeroed first).

use std::collections::BTreeMap;

use rusqlite::{Connection, Transaction, params};

use super::{KeyId, SealError, SealKeys, key_id_of};

/// Why sealed rows could not be read or written (the store and the migrations report it as their own error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RowsError {
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A value could not be sealed or opened.
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// Migration 7's step, in its transaction: every row of the plaintext `secrets` table is sealed under the current key
/// into `sealed_secrets`, then `secrets` is dropped. Returns how many rows were sealed.
pub(crate) fn seal_plaintext(tx: &Transaction<'_>, keys: &SealKeys) -> Result<usize, RowsError> {
    let rows = {
        let mut statement = tx.prepare("SELECT tenant, name, value, hosts_json, updated_ms FROM secrets")?;
        let rows = statement.query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, String>(2)?, row.get(3)?, row.get(4)?))
        })?;
        rows.collect::<Result<Vec<(String, String, String, String, i64)>, _>>()?
    };
    let mut insert = tx.prepare(
        "INSERT INTO sealed_secrets (tenant, name, sealed, hosts_json, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (tenant, name, value, hosts, updated_ms) in &rows {
        insert.execute(params![tenant, name, keys.seal(tenant, name, value)?, hosts, updated_ms])?;
    }
    tx.execute_batch("DROP TABLE secrets;")?;
    if !rows.is_empty() {
        tracing::info!(secrets = rows.len(), key = %keys.current_id(), "plaintext secrets sealed");
    }
    Ok(rows.len())
}

/// Re-seals under the current key every value a previous key sealed, in one transaction, after checking that every
/// value opens; returns how many were re-sealed. Values sealed with keys the server does not have stop it before
/// anything changes.
pub(crate) fn reseal(conn: &mut Connection, keys: &SealKeys) -> Result<usize, RowsError> {
    let tx = conn.transaction()?;
    let rows = {
        let mut statement = tx.prepare("SELECT tenant, name, sealed FROM sealed_secrets ORDER BY tenant, name")?;
        let rows =
            statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get(2)?)))?;
        rows.collect::<Result<Vec<(String, String, Vec<u8>)>, _>>()?
    };
    let mut missing = BTreeMap::<KeyId, usize>::new();
    for (tenant, name, sealed) in &rows {
        let key_id =
            key_id_of(sealed).ok_or_else(|| SealError::Malformed { tenant: tenant.clone(), name: name.clone() })?;
        if !keys.knows(key_id) {
            *missing.entry(key_id).or_default() += 1;
        }
    }
    if !missing.is_empty() {
        return Err(RowsError::Seal(SealError::MissingKeys {
            count: missing.values().sum(),
            keys: missing.iter().map(|(id, count)| format!("key {id} sealed {count}")).collect::<Vec<_>>().join(", "),
            current: keys.current_id(),
        }));
    }
    let mut resealed = 0;
    {
        let mut update = tx.prepare("UPDATE sealed_secrets SET sealed = ?3 WHERE tenant = ?1 AND name = ?2")?;
        for (tenant, name, sealed) in &rows {
            let value = keys.open(tenant, name, sealed)?;
            if !keys.is_current(sealed) {
                update.execute(params![tenant, name, keys.seal(tenant, name, &value)?])?;
                resealed += 1;
            }
        }
    }
    tx.commit()?;
    if resealed > 0 {
        tracing::info!(secrets = resealed, key = %keys.current_id(), "secrets re-sealed under the current key");
    }
    Ok(resealed)
}

/// Leaves no copy of rewritten rows in the database's files: gives every free page back, then copies the WAL into the
/// database and truncates it to nothing.
pub(crate) fn scrub(conn: &Connection) -> Result<(), RowsError> {
    conn.execute_batch("PRAGMA incremental_vacuum;")?;
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))?;
    if busy != 0 {
        tracing::warn!(
            "the WAL could not be truncated (another connection reads the database): old pages remain in it"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use base64::Engine;
    use rusqlite::OptionalExtension;

    use super::*;
    use crate::egress::store::{SecretWrite, SecretWriteMode};
    use crate::seal::{KEY_BYTES, SealKey};
    use crate::store::{Store, StoreError};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn keys(current: u8, previous: &[u8]) -> Result<SealKeys, SealError> {
        let key = |byte: u8| SealKey::from_bytes(&[byte; KEY_BYTES]);
        Ok(SealKeys::new(key(current)?, previous.iter().map(|b| key(*b)).collect::<Result<_, _>>()?))
    }

    fn secret(name: &str, value: &str) -> SecretWrite {
        SecretWrite {
            name: name.into(),
            value: value.into(),
            hosts: Some(vec!["allowed.test".into()]),
            metadata: None,
            now_ms: 1,
            max_secrets: 10,
        }
    }

    /// The database file and its `-wal` and `-shm` files (those that exist).
    fn database_files(database: &Path) -> Vec<PathBuf> {
        ["", "-wal", "-shm"]
            .iter()
            .map(|suffix| PathBuf::from(format!("{}{suffix}", database.display())))
            .filter(|path| path.exists())
            .collect()
    }

    /// Where `value` (as is, in hex or in base64) is in the database's files.
    fn found_in_files(database: &Path, value: &str) -> Result<Vec<String>, std::io::Error> {
        let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
        let base64 = base64::engine::general_purpose::STANDARD.encode(value);
        let mut found = Vec::new();
        for path in database_files(database) {
            let bytes = std::fs::read(&path)?;
            for form in [value, &hex, &base64] {
                if bytes.windows(form.len()).any(|window| window == form.as_bytes()) {
                    found.push(format!("{} in {}", form, path.display()));
                }
            }
        }
        Ok(found)
    }

    /// A database of schema 6 (plaintext secrets) as a crashed server left it: values written, one replaced and
    /// one deleted, the WAL never checkpointed.
    fn plaintext_database(database: &Path, auto_vacuum: &str, values: &[String]) -> TestResult {
        let conn = Connection::open(database)?;
        conn.execute_batch(&format!("PRAGMA auto_vacuum = {auto_vacuum}; PRAGMA journal_mode = WAL;"))?;
        crate::migrations::schema_at(&conn, 6)?;
        for (index, value) in values.iter().enumerate() {
            conn.execute(
                "INSERT INTO secrets VALUES ('t1', ?1, ?2, '[\"allowed.test\"]', 1)",
                params![format!("S{index}"), value],
            )?;
        }
        conn.execute("UPDATE secrets SET value = 'replacement-value' WHERE name = 'S1'", [])?;
        conn.execute("DELETE FROM secrets WHERE name = 'S2'", [])?;
        // The server dies: nothing checkpoints the WAL or removes it.
        std::mem::forget(conn);
        Ok(())
    }

    #[tokio::test]
    async fn the_first_start_leaves_no_plaintext_of_old_rows_in_the_database_files() -> TestResult {
        for auto_vacuum in ["NONE", "INCREMENTAL"] {
            let dir = tempfile::tempdir()?;
            let database = dir.path().join("sandkasten.db");
            let values: Vec<String> =
                (0..3).map(|n| format!("plain-{n}-{}", crate::ids::random_hex(12).unwrap_or_default())).collect();
            plaintext_database(&database, auto_vacuum, &values)?;
            for value in &values {
                assert!(!found_in_files(&database, value)?.is_empty(), "positive control: {value} not in the files");
            }
            let store = Store::open(&database, keys(1, &[])?)?;
            let zeroes: i64 = store.call(|c| Ok(c.query_row("PRAGMA secure_delete", [], |r| r.get(0))?)).await?;
            assert_eq!(zeroes, 1, "deleted content is not zeroed");
            for value in values.iter().chain([&"replacement-value".to_owned()]) {
                let found = found_in_files(&database, value)?;
                assert!(found.is_empty(), "auto_vacuum {auto_vacuum}: plaintext left after sealing: {found:?}");
            }
            let opened = store.secrets("t1").await?;
            let opened: Vec<_> = opened.iter().map(|s| (s.name.as_str(), s.value.as_str())).collect();
            assert_eq!(opened, [("S0", values[0].as_str()), ("S1", "replacement-value")]);
            drop(store);
            for value in values.iter().chain([&"replacement-value".to_owned()]) {
                assert!(found_in_files(&database, value)?.is_empty(), "plaintext after close");
            }
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_sealed_value_moved_to_another_tenants_or_names_row_does_not_open() -> TestResult {
        let dir = tempfile::tempdir()?;
        let database = dir.path().join("sandkasten.db");
        let store = Store::open(&database, keys(1, &[])?)?;
        store.write_secret("t1", secret("TOKEN", "value-of-t1"), SecretWriteMode::CreateOrReplace).await?;
        store.write_secret("t2", secret("TOKEN", "value-of-t2"), SecretWriteMode::CreateOrReplace).await?;
        let raw = Connection::open(&database)?;
        // Tenant t2 takes t1's sealed value over its own row; t1 copies it under another name.
        raw.execute_batch(
            "UPDATE sealed_secrets SET sealed = (SELECT sealed FROM sealed_secrets WHERE tenant = 't1')
             WHERE tenant = 't2';
             INSERT INTO sealed_secrets (tenant, name, sealed, hosts_json, updated_ms, secret_id)
             SELECT tenant, 'OTHER', sealed, hosts_json, updated_ms, 'sec_other' FROM sealed_secrets
             WHERE tenant = 't1';",
        )?;
        let moved = store.secrets("t2").await.map(|_| ()).err();
        assert!(matches!(moved, Some(StoreError::Seal(SealError::Forged { .. }))), "{moved:?}");
        let renamed = store.secrets("t1").await.map(|_| ()).err();
        assert!(matches!(&renamed, Some(StoreError::Seal(SealError::Forged { name, .. })) if name == "OTHER"));
        raw.execute("DELETE FROM sealed_secrets WHERE name = 'OTHER'", [])?;
        assert_eq!(store.secrets("t1").await?[0].value, "value-of-t1", "the original row still opens");
        drop(store);
        // The next start refuses the altered database rather than serve it.
        let reopened = Store::open(&database, keys(1, &[])?).map(|_| ()).err().map(|e| e.to_string());
        let message = reopened.unwrap_or_default();
        assert!(message.contains("\"t2\"") && message.contains("altered or belongs to another row"), "{message}");
        assert!(!message.contains("value-of"), "{message}");
        Ok(())
    }

    fn key_id_in_row(database: &Path) -> Result<Option<KeyId>, rusqlite::Error> {
        let sealed: Option<Vec<u8>> =
            Connection::open(database)?.query_row("SELECT sealed FROM sealed_secrets", [], |r| r.get(0)).optional()?;
        Ok(sealed.as_deref().and_then(key_id_of))
    }

    #[tokio::test]
    async fn a_start_with_a_previous_key_reseals_under_the_current_one_and_an_unknown_key_stops_it() -> TestResult {
        let dir = tempfile::tempdir()?;
        let database = dir.path().join("sandkasten.db");
        let (a, b, c) = (keys(1, &[])?.current_id(), keys(2, &[])?.current_id(), keys(3, &[])?.current_id());
        Store::open(&database, keys(1, &[])?)?
            .write_secret("t1", secret("TOKEN", "rotated-value"), SecretWriteMode::CreateOrReplace)
            .await?;
        assert_eq!(key_id_in_row(&database)?, Some(a));
        // Key C alone knows nothing: refused, naming the count and the key needed, and nothing changes.
        let message = Store::open(&database, keys(3, &[])?).map(|_| ()).err().map(|e| e.to_string());
        let message = message.unwrap_or_default();
        assert!(message.starts_with("1 secret value(s) are sealed with keys"), "{message}");
        assert!(message.contains(&format!("key {a} sealed 1")) && message.contains(&c.to_string()), "{message}");
        assert_eq!(key_id_in_row(&database)?, Some(a), "a refused start changed the row");
        // B with A as previous: re-sealed under B.
        let store = Store::open(&database, keys(2, &[1])?)?;
        assert_eq!(key_id_in_row(&database)?, Some(b));
        assert_eq!(store.secrets("t1").await?[0].value, "rotated-value");
        drop(store);
        // Now A alone cannot open the database, and B alone can.
        let message = Store::open(&database, keys(1, &[])?).map(|_| ()).err().map(|e| e.to_string());
        assert!(message.unwrap_or_default().contains(&format!("key {b} sealed 1")));
        assert_eq!(Store::open(&database, keys(2, &[])?)?.secrets("t1").await?[0].value, "rotated-value");
        Ok(())
    }
}
