//! `GET /v1/config`: an admin tenant reads the effective config (quotas, pools with their defaults filled in, scan
//! policies, egress, stores, tiers); any other tenant is refused (403) and a request without a key too (401); and no
//! API key or S3 credential appears anywhere in the raw body. And `docs/config.schema.json` is the schema the config
//! types generate.

use std::path::PathBuf;

use axum::body::Body;
use sandkasten_server::PoolConfig;
use sandkasten_types::Limits;

use crate::harness::{Harness, KEY_A, KEY_B, tenant, test_config};

pub(crate) const KEY_OPS: &str = "key-of-tenant-ops-config-1";
const REGENERATE: &str =
    "SANDKASTEN_UPDATE_CONFIG_SCHEMA=1 cargo test -p sandkasten-server --test api committed_config_schema";
const S3_KEY_ID: &str = "AKIA-config-test-key-id";
const S3_SECRET: &str = "s3-secret-of-the-config-test";

/// Tenants alpha and bravo, admin tenant ops (its own scan policy), a pool, allowed CIDRs, S3 credentials.
pub(crate) fn admin_harness() -> Harness {
    let mut config = test_config();
    let mut ops = tenant("ops", KEY_OPS, 1, 1 << 30);
    ops.admin = true;
    ops.scan = Some(sandkasten_scan::ScanPolicy::from_toml_str("mode = \"enforce\"").unwrap());
    config.tenants.push(ops);
    config.pools = vec![PoolConfig { min: 1, max: 2, ..toml::from_str("").unwrap() }];
    config.egress.allow_cidrs = vec!["10.200.1.0/24".into()];
    config.snapshots.s3_access_key_id = Some(S3_KEY_ID.into());
    config.snapshots.s3_secret_access_key = Some(S3_SECRET.into());
    config.secrets.key_file = Some("/etc/sandkasten/secrets.key".into());
    Harness::with_config(config)
}

#[tokio::test]
async fn an_admin_sees_the_effective_config_without_any_secret() {
    let h = admin_harness();
    let reply = h.get("/v1/config", KEY_OPS).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let raw = reply.text();
    for secret in [KEY_A, KEY_B, KEY_OPS, S3_KEY_ID, S3_SECRET] {
        assert!(!raw.contains(secret), "{secret} appears in {raw}");
    }
    let body = reply.json();
    let config = &body["config"];
    let tenants = config["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 3);
    assert_eq!(tenants[0]["name"], "alpha");
    assert_eq!(tenants[0]["max_sandboxes"], 3);
    assert_eq!(tenants[0]["api_keys"], serde_json::json!(["<redacted>"]));
    assert_eq!(tenants[0]["scan"]["mode"], "off", "a tenant without its own policy shows the server's");
    assert_eq!(tenants[2]["scan"]["mode"], "enforce");
    assert_eq!(tenants[2]["admin"], true);
    assert_eq!(config["pools"][0]["name"], "pool-1");
    assert_eq!(config["pools"][0]["isolation"], "process");
    assert_eq!(config["pools"][0]["limits"]["memory_bytes"], Limits::default().memory_bytes);
    assert_eq!(config["egress"]["allow_cidrs"], serde_json::json!(["10.200.1.0/24"]));
    assert_eq!(config["snapshots"]["s3_secret_access_key"], "<redacted>");
    assert_eq!(config["snapshots"]["s3_access_key_id"], "<redacted>");
    assert!(config["snapshots"]["store"].as_str().is_some_and(|url| url.starts_with("file://")), "{body}");
    assert_eq!(config["secrets"]["key_file"], "/etc/sandkasten/secrets.key");
    assert!(config["max_pids"].as_u64().is_some_and(|pids| pids > 0), "{body}");
    assert_eq!(config["retention"]["days"], 7);
    assert_eq!(config["metrics"]["require_auth"], false);
    assert_eq!(body["default_limits"]["timeout_ms"], Limits::default().timeout_ms);
    let tiers = body["tiers"].as_array().unwrap();
    assert_eq!(tiers[0]["tier"], "process");
    assert_eq!(tiers[0]["available"], true);
    let auto = tiers.iter().find(|tier| tier["tier"] == "auto").unwrap();
    assert_eq!(auto["available"], false);
    assert!(auto["reason"].as_str().is_some_and(|reason| !reason.is_empty()), "{body}");
}

#[tokio::test]
async fn only_admin_tenants_may_read_the_config() {
    let h = admin_harness();
    let message = h.get("/v1/config", KEY_A).await.assert_error(403, "forbidden");
    assert!(message.contains("only a tenant with admin = true"), "{message}");
    let reply = h.call("GET", "/v1/config", None, Body::empty()).await;
    reply.assert_error(401, "unauthorized");
    assert!(!reply.text().contains("max_sandboxes"));
}

#[test]
fn committed_config_schema_matches_the_types() {
    let mut generated = serde_json::to_string_pretty(&sandkasten_server::config::json_schema()).unwrap();
    generated.push('\n');
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.schema.json");
    if std::env::var_os("SANDKASTEN_UPDATE_CONFIG_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the config types; regenerate it with:\n    {REGENERATE}\nand commit the result",
        path.display()
    );
}
