//! `[mcp]`: how much the MCP endpoint (`/mcp`) lets each tenant hold: open sessions, and how long an idle session
//! lives before it ends (killing the sandboxes it created).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;

/// The MCP endpoint's bounds (`[mcp]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// MCP sessions one tenant may have open at once; one more `initialize` is refused with 429. Default 16.
    pub max_sessions_per_tenant: usize,
    /// Seconds without a request after which a session ends (and its sandboxes, unless created with
    /// `persist: true`, are killed). Default 600.
    pub idle_timeout_s: u64,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig { max_sessions_per_tenant: 16, idle_timeout_s: 600 }
    }
}

impl McpConfig {
    /// Records what is wrong with these values.
    pub(crate) fn check(&self, found: &mut Found) {
        if !(1..=10_000).contains(&self.max_sessions_per_tenant) {
            let got = self.max_sessions_per_tenant;
            found.add("mcp.max_sessions_per_tenant", format!("must be 1 to 10000, got {got}"));
        }
        if !(1..=86_400).contains(&self.idle_timeout_s) {
            found.add("mcp.idle_timeout_s", format!("must be 1 to 86400, got {}", self.idle_timeout_s));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, ServerConfig};

    #[test]
    fn mcp_bounds_parse_and_out_of_range_ones_are_refused_naming_the_key() -> Result<(), ConfigError> {
        let config = ServerConfig::from_toml_str("[mcp]\nmax_sessions_per_tenant = 3\n")?;
        assert_eq!((config.mcp.max_sessions_per_tenant, config.mcp.idle_timeout_s), (3, 600));
        for text in ["[mcp]\nidle_timeout_s = 0\n", "[mcp]\nmax_sessions_per_tenant = 0\n"] {
            let config = ServerConfig { insecure_no_auth: true, ..ServerConfig::from_toml_str(text)? };
            let error = config.validate().err();
            let paths: Vec<&str> = error.iter().flat_map(|e| e.problems()).map(|p| p.path.as_str()).collect();
            let key = text.lines().nth(1).and_then(|line| line.split(' ').next()).unwrap_or_default();
            assert_eq!(paths, [format!("mcp.{key}")], "{text:?}");
        }
        Ok(())
    }
}
