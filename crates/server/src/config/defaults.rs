//! The `[defaults]` table of the server's config: what a request that does not say gets. Today only the isolation
//! tier (`[defaults] isolation = "gvisor"`).

use sandkasten_types::Tier;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Defaults for requests that leave a setting out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// The isolation tier of a sandbox whose create (`POST /v1/sandboxes`, `POST /v1/run`, the E2B facade's create)
    /// names none, and of a warm pool without its own `isolation`: `"process"` (the default) or `"gvisor"`.
    #[serde(default)]
    pub isolation: Tier,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_defaults_to_process_and_parses_by_name() -> Result<(), toml::de::Error> {
        assert_eq!(toml::from_str::<Defaults>("")?.isolation, Tier::Process);
        assert_eq!(toml::from_str::<Defaults>("isolation = \"gvisor\"")?.isolation, Tier::Gvisor);
        let error = toml::from_str::<Defaults>("isolation = \"gvsior\"").map(|_| ()).err();
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("gvisor") && message.contains("process"), "{message}");
        assert!(toml::from_str::<Defaults>("tier = \"gvisor\"").is_err());
        Ok(())
    }
}
