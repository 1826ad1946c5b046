//! The config file's JSON schema, derived from the config types themselves (schemars: doc comments become
//! descriptions, serde defaults become `default`). Committed as `docs/config.schema.json` for editors; the config
//! check (`file`) walks the same schema, so the file's shape has one source: the types.

use crate::config::server::ServerConfig;

/// The JSON schema (draft 2020-12) of the server's config file.
pub fn json_schema() -> serde_json::Value {
    schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<ServerConfig>()
        .to_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_describes_every_table_with_defaults_and_refuses_unknown_keys() {
        let schema = json_schema();
        let properties = &schema["properties"];
        for key in ["listen", "tenants", "pools", "egress", "scan", "snapshots", "secrets", "gvisor", "mcp"] {
            assert!(properties.get(key).is_some(), "{key} missing from {schema:#}");
        }
        assert_eq!(properties["listen"]["default"], "127.0.0.1:8080");
        assert_eq!(schema["additionalProperties"], false);
        assert!(schema["$defs"]["TenantConfig"]["properties"]["max_memory_bytes"]["description"].is_string());
    }
}
