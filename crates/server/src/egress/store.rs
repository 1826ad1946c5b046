//! What egress keeps in the database: the tenants' secrets (their values sealed, see `seal`), the audit of every
//! connection attempt, and a running sandbox's network policy (part of its spec).

use rusqlite::{OptionalExtension, params};
use sandkasten_types::NetworkPolicy;
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// Audit events kept per sandbox; older ones are deleted as new ones arrive.
pub const KEPT_EVENTS: u32 = 10_000;

/// A secret's caller metadata (E2B's `metadata`): string keys and values, bounded by `crate::secret_rules`.
pub type SecretMetadata = std::collections::BTreeMap<String, String>;

/// A tenant's secret as the proxy takes it: the value and the host patterns it may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSecret {
    /// Name (also the environment variable that holds its placeholder inside a sandbox).
    pub name: String,
    /// The real value; never sent to a sandbox, never returned by the API.
    pub value: String,
    /// Host patterns (`api.example.com`, `*.example.com`, optional `:port`) the value may be sent to; empty for a
    /// secret made through E2B's API, which goes only where a header rule puts it.
    pub hosts: Vec<String>,
    /// When it was last written, unix milliseconds.
    pub updated_ms: i64,
}

/// A tenant's secret as listed and answered: everything but the value (listing never opens a sealed value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretInfo {
    /// Its id, `sec_` + 16 hex digits (E2B's `secretID`); never changes.
    pub id: String,
    /// Name.
    pub name: String,
    /// Host patterns the value may be sent to (empty: only where a header rule puts it).
    pub hosts: Vec<String>,
    /// Caller metadata.
    pub metadata: SecretMetadata,
    /// 1 for a new secret, one more with every write of its value.
    pub version: i64,
    /// When it was created, unix milliseconds.
    pub created_ms: i64,
    /// When it was last written, unix milliseconds.
    pub updated_ms: i64,
}

/// What a secret write may do when a secret of that name exists, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretWriteMode {
    /// Only a new secret (E2B's create: an existing name is a conflict).
    Create,
    /// Only an existing secret (E2B's update: a missing one is not found).
    Update,
    /// Either (the native `PUT /v1/secrets/{name}`).
    CreateOrReplace,
}

/// A secret write: the value, and what else changes (`None`: kept, or empty for a new secret).
#[derive(Debug, Clone)]
pub struct SecretWrite {
    /// The secret's name.
    pub name: String,
    /// Its new value.
    pub value: String,
    /// New host patterns, if they change.
    pub hosts: Option<Vec<String>>,
    /// New metadata, if it changes.
    pub metadata: Option<SecretMetadata>,
    /// When, unix milliseconds.
    pub now_ms: i64,
    /// Most secrets the tenant may hold (a create beyond it is refused).
    pub max_secrets: usize,
}

/// What a secret write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretWritten {
    /// A new secret.
    Created(SecretInfo),
    /// An existing secret, its version counted up.
    Replaced(SecretInfo),
    /// Nothing: `Create` of a name that exists.
    Exists,
    /// Nothing: `Update` of a name that does not.
    Missing,
    /// Nothing: the tenant holds `max_secrets` already.
    TooMany,
}

const SECRET_INFO_COLUMNS: &str = "secret_id, name, hosts_json, metadata_json, version, created_ms, updated_ms";

fn secret_info(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, String, String, i64, i64, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?))
}

fn parse_info(raw: (String, String, String, String, i64, i64, i64)) -> Result<SecretInfo, StoreError> {
    let (id, name, hosts, metadata, version, created_ms, updated_ms) = raw;
    Ok(SecretInfo {
        id,
        name,
        hosts: serde_json::from_str(&hosts)?,
        metadata: serde_json::from_str(&metadata)?,
        version,
        created_ms,
        updated_ms,
    })
}

/// One audited connection attempt, as stored and as served by `GET /v1/sandboxes/{id}/egress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EgressEvent {
    /// When the attempt started, unix milliseconds.
    pub time_ms: i64,
    /// `connect` (an HTTP CONNECT tunnel) or `http` (a plain HTTP request forwarded by the proxy).
    pub scheme: String,
    /// The host asked for, canonical (lowercase, no trailing dot; IP literals in standard form).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address the proxy resolved and checked (and connected to, when allowed).
    pub resolved: Option<String>,
    /// `allowed`, `refused` (by the policy or the address check, or a blind tunnel closed at its opening: a TLS
    /// ClientHello for another host, `sni_mismatch: ...` in `rule`) or `failed` (allowed, but the name did not
    /// resolve or the host did not answer).
    pub decision: String,
    /// The rule that decided, in words.
    pub rule: String,
    /// Bytes sent from the sandbox to the host.
    pub bytes_up: u64,
    /// Bytes sent from the host to the sandbox.
    pub bytes_down: u64,
    /// An allowed connection's number: its record is written when it opens and replaced when it ends (refused, when
    /// a blind tunnel is closed at its opening).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<u64>,
    /// True while the allowed connection is still open (its bytes are not counted yet).
    #[serde(default)]
    pub open: bool,
}

impl Store {
    /// Writes a secret as `write.mode` allows, its value sealed for its row; a new one gets an id (version 1), an
    /// existing one keeps its id and counts its version up.
    pub async fn write_secret(
        &self,
        tenant: &str,
        write: SecretWrite,
        mode: SecretWriteMode,
    ) -> Result<SecretWritten, StoreError> {
        let sealed = self.seal_keys().seal(tenant, &write.name, &write.value)?;
        let tenant = tenant.to_owned();
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let existing = tx
                .query_row(
                    &format!("SELECT {SECRET_INFO_COLUMNS} FROM sealed_secrets WHERE tenant = ?1 AND name = ?2"),
                    params![tenant, write.name],
                    secret_info,
                )
                .optional()?
                .map(parse_info)
                .transpose()?;
            let written = match (existing, mode) {
                (Some(_), SecretWriteMode::Create) => return Ok(SecretWritten::Exists),
                (None, SecretWriteMode::Update) => return Ok(SecretWritten::Missing),
                (Some(old), _) => {
                    let info = SecretInfo {
                        hosts: write.hosts.unwrap_or(old.hosts),
                        metadata: write.metadata.unwrap_or(old.metadata),
                        version: old.version.saturating_add(1),
                        updated_ms: write.now_ms,
                        ..old
                    };
                    tx.execute(
                        "UPDATE sealed_secrets SET sealed = ?3, hosts_json = ?4, metadata_json = ?5, version = ?6,
                         updated_ms = ?7 WHERE tenant = ?1 AND name = ?2",
                        params![
                            tenant,
                            info.name,
                            sealed,
                            serde_json::to_string(&info.hosts)?,
                            serde_json::to_string(&info.metadata)?,
                            info.version,
                            info.updated_ms
                        ],
                    )?;
                    SecretWritten::Replaced(info)
                }
                (None, _) => {
                    let held: i64 =
                        tx.query_row("SELECT COUNT(*) FROM sealed_secrets WHERE tenant = ?1", params![tenant], |r| {
                            r.get(0)
                        })?;
                    if usize::try_from(held).unwrap_or(usize::MAX) >= write.max_secrets {
                        return Ok(SecretWritten::TooMany);
                    }
                    let mut info = SecretInfo {
                        id: String::new(),
                        name: write.name,
                        hosts: write.hosts.unwrap_or_default(),
                        metadata: write.metadata.unwrap_or_default(),
                        version: 1,
                        created_ms: write.now_ms,
                        updated_ms: write.now_ms,
                    };
                    // The id: an identifier, not a credential (SQLite's randomness is enough).
                    info.id = tx.query_row(
                        "INSERT INTO sealed_secrets (tenant, name, sealed, hosts_json, updated_ms, secret_id, version,
                         metadata_json, created_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5, 'sec_' || lower(hex(randomblob(8))), 1, ?6, ?5)
                         RETURNING secret_id",
                        params![
                            tenant,
                            info.name,
                            sealed,
                            serde_json::to_string(&info.hosts)?,
                            info.updated_ms,
                            serde_json::to_string(&info.metadata)?
                        ],
                        |row| row.get(0),
                    )?;
                    SecretWritten::Created(info)
                }
            };
            tx.commit()?;
            Ok(written)
        })
        .await
    }

    /// The tenant's secret whose id or name is `key` (a name as given, else lowercased: E2B's names are stored so).
    pub async fn secret_info(&self, tenant: &str, key: &str) -> Result<Option<SecretInfo>, StoreError> {
        let (tenant, key) = (tenant.to_owned(), key.to_owned());
        self.call(move |conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {SECRET_INFO_COLUMNS} FROM sealed_secrets WHERE tenant = ?1 AND (secret_id = ?2 OR name = ?2
                 OR name = ?3) ORDER BY name = ?2 DESC LIMIT 1"
            ))?;
            let lower = key.to_ascii_lowercase();
            statement.query_row(params![tenant, key, lower], secret_info).optional()?.map(parse_info).transpose()
        })
        .await
    }

    /// The tenant's secrets with their values opened, by name (for the egress proxy, which substitutes them).
    pub async fn secrets(&self, tenant: &str) -> Result<Vec<StoredSecret>, StoreError> {
        let owner = tenant.to_owned();
        let rows = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT name, sealed, hosts_json, updated_ms FROM sealed_secrets WHERE tenant = ?1 ORDER BY name",
                )?;
                let rows = statement.query_map(params![owner], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, Vec<u8>>(1)?, row.get::<_, String>(2)?, row.get(3)?))
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        rows.into_iter()
            .map(|(name, sealed, hosts, updated_ms)| {
                let value = self.seal_keys().open(tenant, &name, &sealed)?;
                Ok(StoredSecret { name, value, hosts: serde_json::from_str(&hosts)?, updated_ms })
            })
            .collect()
    }

    /// The tenant's secrets without their values, by name.
    pub async fn secret_list(&self, tenant: &str) -> Result<Vec<SecretInfo>, StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {SECRET_INFO_COLUMNS} FROM sealed_secrets WHERE tenant = ?1 ORDER BY name"
            ))?;
            let rows = statement.query_map(params![tenant], secret_info)?;
            rows.map(|row| parse_info(row?)).collect()
        })
        .await
    }

    /// Deletes a secret; false when there was none.
    pub async fn delete_secret(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.call(move |conn| {
            Ok(conn.execute("DELETE FROM sealed_secrets WHERE tenant = ?1 AND name = ?2", params![tenant, name])? == 1)
        })
        .await
    }

    /// Appends audit events (`(sandbox, tenant, event)`) in one transaction, keeping only the newest
    /// [`KEPT_EVENTS`] per sandbox (a sandbox can make refused attempts as fast as it likes). Events of a sandbox the
    /// database does not know (its failed creation was rolled back) are dropped.
    pub async fn append_egress_events(&self, events: Vec<(String, String, EgressEvent)>) -> Result<(), StoreError> {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO egress_events (sandbox_id, tenant, time_ms, event_json)
                     SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1)",
                )?;
                let mut close = tx.prepare_cached(
                    "UPDATE egress_events SET event_json = ?3 WHERE sandbox_id = ?1 AND connection_id = ?2",
                )?;
                let mut insert_connection = tx.prepare_cached(
                    "INSERT INTO egress_events (sandbox_id, tenant, time_ms, event_json, connection_id)
                     SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1)",
                )?;
                let mut prune = tx.prepare_cached(
                    "DELETE FROM egress_events WHERE sandbox_id = ?1 AND seq <= (SELECT seq FROM egress_events
                     WHERE sandbox_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
                )?;
                let mut touched = std::collections::BTreeSet::new();
                for (sandbox, tenant, event) in events {
                    let json = serde_json::to_string(&event)?;
                    match event.connection.map(|n| i64::try_from(n).unwrap_or(i64::MAX)) {
                        // The end of a connection replaces its opening record (or stands alone if that was lost).
                        Some(connection) if !event.open => {
                            if close.execute(params![sandbox, connection, json])? == 0 {
                                insert_connection.execute(params![sandbox, tenant, event.time_ms, json, connection])?;
                            }
                        }
                        Some(connection) => {
                            insert_connection.execute(params![sandbox, tenant, event.time_ms, json, connection])?;
                        }
                        None => {
                            insert.execute(params![sandbox, tenant, event.time_ms, json])?;
                        }
                    }
                    touched.insert(sandbox);
                }
                for sandbox in touched {
                    prune.execute(params![sandbox, KEPT_EVENTS])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The newest `limit` audit events of a sandbox, oldest first.
    pub async fn egress_events(&self, sandbox_id: &str, limit: u32) -> Result<Vec<EgressEvent>, StoreError> {
        let sandbox_id = sandbox_id.to_owned();
        self.call(move |conn| {
            let mut statement = conn.prepare_cached(
                "SELECT event_json FROM (SELECT seq, event_json FROM egress_events WHERE sandbox_id = ?1
                 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
            )?;
            let rows = statement.query_map(params![sandbox_id, limit], |row| row.get::<_, String>(0))?;
            rows.map(|row| Ok(serde_json::from_str(&row?)?)).collect()
        })
        .await
    }

    /// Replaces the network policy in a running sandbox's stored spec; false when it is not running (or not the
    /// tenant's).
    pub async fn set_network_policy(&self, tenant: &str, id: &str, policy: NetworkPolicy) -> Result<bool, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let spec: Option<String> = tx
                .query_row(
                    "SELECT spec_json FROM sandboxes WHERE id = ?1 AND tenant = ?2 AND state = 'running'",
                    params![id, tenant],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(spec) = spec else { return Ok(false) };
            let mut spec: sandkasten_types::SandboxSpec = serde_json::from_str(&spec)?;
            spec.network = policy;
            tx.execute(
                "UPDATE sandboxes SET spec_json = ?2 WHERE id = ?1",
                params![id, serde_json::to_string(&spec)?],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::store::{SandboxRecord, SandboxState};

    fn event(n: i64) -> EgressEvent {
        EgressEvent {
            time_ms: n,
            scheme: "http".into(),
            host: "a.example".into(),
            port: 80,
            resolved: None,
            decision: "refused".into(),
            rule: "not in the allowlist".into(),
            bytes_up: 0,
            bytes_down: 0,
            connection: None,
            open: false,
        }
    }

    /// An in-memory store holding one running sandbox `id` of tenant `t`.
    async fn store_with_sandbox(id: &str) -> Store {
        let store = Store::open_in_memory().unwrap();
        let record = SandboxRecord {
            id: id.into(),
            tenant: "t".into(),
            state: SandboxState::Running,
            spec: Default::default(),
            isolation: Default::default(),
            metadata: Default::default(),
            created_ms: 1,
            expires_ms: 2,
            ended_ms: None,
            end_reason: None,
            paused_ms: None,
            pause_snapshot: None,
            lifecycle: Default::default(),
        };
        let quota = crate::store::Quota {
            max_sandboxes: 10,
            max_memory_bytes: u64::MAX,
            max_pids: u64::MAX,
            max_output_bytes: 1,
            max_snapshot_bytes: 1,
        };
        store.admit_sandbox(record, quota).await.unwrap().unwrap();
        store
    }

    #[tokio::test]
    async fn audit_keeps_the_newest_events_per_sandbox_and_drops_unknown_sandboxes() {
        let store = store_with_sandbox("sb-0000000000000001").await;
        let total = i64::from(KEPT_EVENTS) + 5;
        let batch = (0..total).map(|n| ("sb-0000000000000001".to_owned(), "t".to_owned(), event(n))).collect();
        store.append_egress_events(batch).await.unwrap();
        let unknown = vec![("sb-00000000000000ff".to_owned(), "t".to_owned(), event(0))];
        store.append_egress_events(unknown).await.unwrap();
        let kept = store.egress_events("sb-0000000000000001", KEPT_EVENTS + 100).await.unwrap();
        assert_eq!(kept.len(), KEPT_EVENTS as usize);
        assert_eq!(kept[0].time_ms, 5, "the oldest were pruned");
        assert_eq!(kept.last().unwrap().time_ms, total - 1);
        assert!(store.egress_events("sb-00000000000000ff", 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_connection_is_one_row_open_first_then_closed_with_its_bytes() {
        let store = store_with_sandbox("sb-0000000000000002").await;
        let sandbox = || ("sb-0000000000000002".to_owned(), "t".to_owned());
        let opened = EgressEvent { decision: "allowed".into(), connection: Some(7), open: true, ..event(1) };
        store.append_egress_events(vec![(sandbox().0, sandbox().1, opened.clone())]).await.unwrap();
        let open = store.egress_events("sb-0000000000000002", 10).await.unwrap();
        assert_eq!(open, vec![opened.clone()], "visible while open");
        let closed = EgressEvent { open: false, bytes_up: 10, bytes_down: 20, ..opened };
        let refused = event(2);
        let batch = vec![(sandbox().0, sandbox().1, closed.clone()), (sandbox().0, sandbox().1, refused.clone())];
        store.append_egress_events(batch).await.unwrap();
        assert_eq!(store.egress_events("sb-0000000000000002", 10).await.unwrap(), vec![closed, refused]);
    }

    #[tokio::test]
    async fn secrets_are_per_tenant_and_replaced_in_place() {
        let store = Store::open_in_memory().unwrap();
        let secret = |value: &str| SecretWrite {
            name: "TOKEN".into(),
            value: value.into(),
            hosts: Some(vec!["a.example".into()]),
            metadata: None,
            now_ms: 1,
            max_secrets: 10,
        };
        let first = store.write_secret("t1", secret("one"), SecretWriteMode::CreateOrReplace).await.unwrap();
        let SecretWritten::Created(created) = first else { panic!("{first:?}") };
        assert_eq!((created.version, created.id.len()), (1, 20));
        let again = store.write_secret("t1", secret("two"), SecretWriteMode::CreateOrReplace).await.unwrap();
        let SecretWritten::Replaced(replaced) = again else { panic!("{again:?}") };
        assert_eq!((replaced.id.as_str(), replaced.version), (created.id.as_str(), 2), "same id, next version");
        assert_eq!(replaced.hosts, vec!["a.example".to_owned()]);
        assert_eq!(store.secrets("t1").await.unwrap()[0].value, "two");
        assert!(store.secrets("t2").await.unwrap().is_empty());
        assert_eq!(store.secret_info("t1", &created.id).await.unwrap().map(|i| i.name), Some("TOKEN".into()));
        assert!(store.secret_info("t2", &created.id).await.unwrap().is_none(), "another tenant's id");
        assert!(!store.delete_secret("t2", "TOKEN").await.unwrap());
        assert!(store.delete_secret("t1", "TOKEN").await.unwrap());
        assert!(store.secrets("t1").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn creates_updates_and_the_count_bound_are_what_the_mode_allows() {
        let store = Store::open_in_memory().unwrap();
        let write = |name: &str, max_secrets: usize| SecretWrite {
            name: name.into(),
            value: "v".into(),
            hosts: None,
            metadata: Some(SecretMetadata::from([("k".to_owned(), "v".to_owned())])),
            now_ms: 5,
            max_secrets,
        };
        let update = store.write_secret("t", write("a", 2), SecretWriteMode::Update).await.unwrap();
        assert_eq!(update, SecretWritten::Missing);
        assert!(matches!(store.write_secret("t", write("a", 2), SecretWriteMode::Create).await.unwrap(),
            SecretWritten::Created(SecretInfo { ref hosts, .. }) if hosts.is_empty()));
        assert_eq!(
            store.write_secret("t", write("a", 2), SecretWriteMode::Create).await.unwrap(),
            SecretWritten::Exists
        );
        store.write_secret("t", write("b", 2), SecretWriteMode::Create).await.unwrap();
        assert_eq!(
            store.write_secret("t", write("c", 2), SecretWriteMode::Create).await.unwrap(),
            SecretWritten::TooMany
        );
        assert!(
            matches!(
                store.write_secret("t", write("a", 2), SecretWriteMode::Update).await.unwrap(),
                SecretWritten::Replaced(SecretInfo { version: 2, .. })
            ),
            "an update is no new secret"
        );
        assert!(
            matches!(
                store.write_secret("other", write("c", 2), SecretWriteMode::Create).await.unwrap(),
                SecretWritten::Created(_)
            ),
            "the bound is per tenant"
        );
        let listed = store.secret_list("t").await.unwrap();
        assert_eq!(listed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(listed[0].metadata.get("k").map(String::as_str), Some("v"));
    }
}
