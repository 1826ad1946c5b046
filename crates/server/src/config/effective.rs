//! The effective config: what the server applies once every setting a file left to the server is filled in (pool
//! names and tiers, each tenant's scan policy, the pids cap, the snapshot store), as `GET /v1/config` shows it to
//! admin tenants. Secrets stay out by the types' own serialization: API keys and S3 credentials are written as
//! `"<redacted>"`; the secrets key is never in the config at all (only where it comes from).

use crate::config::server::ServerConfig;

impl ServerConfig {
    /// This config with the server's choices filled in; `host_max_pids` is what this host allows one sandbox.
    pub fn effective(&self, host_max_pids: u64) -> ServerConfig {
        let mut effective = self.clone();
        effective.max_pids = Some(self.max_pids.map_or(host_max_pids, |configured| configured.min(host_max_pids)));
        for (index, pool) in effective.pools.iter_mut().enumerate() {
            pool.name = Some(pool.name_at(index));
            pool.isolation = Some(pool.tier(self.defaults.isolation));
        }
        for tenant in &mut effective.tenants {
            tenant.scan.get_or_insert_with(|| self.scan.clone());
        }
        let store = self.snapshots.store_config(&self.database);
        effective.snapshots.store = Some(store.url);
        effective.snapshots.gc_grace_s = Some(store.gc_grace.as_secs());
        effective
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_filled_in_and_secrets_are_written_redacted() -> Result<(), Box<dyn std::error::Error>> {
        let mut config = ServerConfig::from_toml_str(
            "[[pools]]\n[[tenants]]\nname = \"acme\"\n[snapshots]\ns3_secret_access_key = \"s3-secret-value\"\n",
        )?;
        config.add_env_keys("acme:0123456789abcdef-secret")?;
        let effective = config.effective(4096);
        assert_eq!(effective.max_pids, Some(4096));
        assert_eq!(effective.pools[0].name.as_deref(), Some("pool-1"));
        assert_eq!(effective.tenants[0].scan, Some(config.scan.clone()));
        let json = serde_json::to_string(&effective)?;
        assert!(!json.contains("0123456789abcdef-secret") && !json.contains("s3-secret-value"), "{json}");
        assert!(json.contains(r#""api_keys":["<redacted>"]"#), "{json}");
        assert!(json.contains(r#""s3_secret_access_key":"<redacted>""#), "{json}");
        Ok(())
    }
}
