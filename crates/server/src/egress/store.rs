//! What egress keeps in the database: the tenants' secrets (their values sealed, see `seal`), the audit of every
//! connection attempt, and a running sandbox's network policy (part of its spec).

use rusqlite::{OptionalExtension, params};
use sandkasten_types::NetworkPolicy;
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// Audit events kept per sandbox; older ones are deleted as new ones arrive.
pub const KEPT_EVENTS: u32 = 10_000;

/// A tenant's secret as stored: the value and the host patterns it may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSecret {
    /// Name (also the environment variable that holds its placeholder inside a sandbox).
    pub name: String,
    /// The real value; never sent to a sandbox, never returned by the API.
    pub value: String,
    /// Host patterns (`api.example.com`, `*.example.com`, optional `:port`) the value may be sent to.
    pub hosts: Vec<String>,
    /// When it was last written, unix milliseconds.
    pub updated_ms: i64,
}

/// A tenant's secret as listed: everything but the value (listing never opens a sealed value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretInfo {
    /// Name.
    pub name: String,
    /// Host patterns the value may be sent to.
    pub hosts: Vec<String>,
    /// When it was last written, unix milliseconds.
    pub updated_ms: i64,
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
    /// Creates or replaces a secret, its value sealed for its row; true when it was new.
    pub async fn put_secret(&self, tenant: &str, secret: StoredSecret) -> Result<bool, StoreError> {
        let sealed = self.seal_keys().seal(tenant, &secret.name, &secret.value)?;
        let tenant = tenant.to_owned();
        self.call(move |conn| {
            let hosts = serde_json::to_string(&secret.hosts)?;
            let existed: Option<i64> = conn
                .query_row(
                    "SELECT 1 FROM sealed_secrets WHERE tenant = ?1 AND name = ?2",
                    params![tenant, secret.name],
                    |r| r.get(0),
                )
                .optional()?;
            conn.execute(
                "INSERT INTO sealed_secrets (tenant, name, sealed, hosts_json, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (tenant, name) DO UPDATE SET sealed = ?3, hosts_json = ?4, updated_ms = ?5",
                params![tenant, secret.name, sealed, hosts, secret.updated_ms],
            )?;
            Ok(existed.is_none())
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
            let mut statement = conn.prepare_cached(
                "SELECT name, hosts_json, updated_ms FROM sealed_secrets WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = statement.query_map(params![tenant], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get(2)?))
            })?;
            rows.map(|row| {
                let (name, hosts, updated_ms) = row?;
                Ok(SecretInfo { name, hosts: serde_json::from_str(&hosts)?, updated_ms })
            })
            .collect()
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
        let secret = |value: &str| StoredSecret {
            name: "TOKEN".into(),
            value: value.into(),
            hosts: vec!["a.example".into()],
            updated_ms: 1,
        };
        assert!(store.put_secret("t1", secret("one")).await.unwrap());
        assert!(!store.put_secret("t1", secret("two")).await.unwrap());
        assert_eq!(store.secrets("t1").await.unwrap()[0].value, "two");
        assert!(store.secrets("t2").await.unwrap().is_empty());
        assert!(!store.delete_secret("t2", "TOKEN").await.unwrap());
        assert!(store.delete_secret("t1", "TOKEN").await.unwrap());
        assert!(store.secrets("t1").await.unwrap().is_empty());
    }
}
