//! The `[secrets]` table of the server's config: where the key that seals secret values at rest comes from (see
//! `seal`). A file (`key_file`) or an environment variable (`key_env`); with neither, the file
//! `<database>.secrets-key`, created at the first start. Previous keys (`previous_key_files`, or after commas in the
//! variable) only open values: each start re-seals what they sealed under the current key, so one start after a
//! rotation is enough before they can go.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::problem::Found;

/// Where the secrets key comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretsConfig {
    /// File holding the key: 32 bytes as 64 hex characters or base64, mode 0600 or stricter (a file group or others
    /// may read is refused). Default none.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Environment variable holding the key instead (same formats); previous keys may follow it, separated by commas.
    /// Default none.
    #[serde(default)]
    pub key_env: Option<String>,
    /// Files holding previous keys (same rules as `key_file`): values they sealed are re-sealed under the current key
    /// at start. Default none.
    #[serde(default)]
    pub previous_key_files: Vec<PathBuf>,
}

impl SecretsConfig {
    /// Records what is wrong with these settings (the keys themselves are read at start, by `seal::key_source`).
    pub(crate) fn check(&self, found: &mut Found) {
        found.check("secrets.key_env", self.problem());
    }

    fn problem(&self) -> Option<String> {
        if self.key_file.is_some() && self.key_env.is_some() {
            return Some("set key_file or key_env, not both".into());
        }
        if let Some(name) = &self.key_env
            && (name.is_empty() || name.contains(['=', '\0']))
        {
            return Some(format!(
                "{name:?} is not an environment variable name; name one, e.g. \"SANDKASTEN_SECRETS_KEY\""
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_comes_from_one_place_and_previous_files_are_a_list() -> Result<(), toml::de::Error> {
        let config: SecretsConfig = toml::from_str("key_file = \"/k\"\nprevious_key_files = [\"/old-1\", \"/old-2\"]")?;
        assert_eq!(config.key_file, Some(PathBuf::from("/k")));
        assert_eq!(config.previous_key_files.len(), 2);
        assert_eq!(config.problem(), None);
        assert_eq!(toml::from_str::<SecretsConfig>("")?, SecretsConfig::default());
        let both: SecretsConfig = toml::from_str("key_file = \"/k\"\nkey_env = \"K\"")?;
        assert!(both.problem().is_some_and(|p| p.contains("not both")));
        let bad: SecretsConfig = toml::from_str("key_env = \"A=B\"")?;
        assert!(bad.problem().is_some_and(|p| p.contains("SANDKASTEN_SECRETS_KEY")));
        assert!(toml::from_str::<SecretsConfig>("key = \"00\"").is_err(), "a key is never inline");
        Ok(())
    }
}
